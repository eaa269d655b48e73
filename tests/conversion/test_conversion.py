"""`hires-hf convert`: vanilla checkpoints of each family become HiRes models that compute the same function."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hires_hf.cli import main
from hires_hf.conversion import convert
from hires_hf.errors import HiResUserError

VOCAB = 128
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=10000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
)

# id -> (model class, config), each with the options that make its family what it is.
FAMILIES = {
    "llama-biases-llama3-rope": (
        LlamaForCausalLM,
        LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3_ROPE),
    ),
    "llama-tied": (LlamaForCausalLM, LlamaConfig(**SHAPE, tie_word_embeddings=True)),
    # The window (4096) never binds within the 256-token context: the function is that of full attention.
    "mistral": (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=4096)),
    "qwen2-qkv-bias": (Qwen2ForCausalLM, Qwen2Config(**SHAPE)),
    "qwen3-per-head-qk-norm": (Qwen3ForCausalLM, Qwen3Config(**SHAPE, head_dim=16)),
    "olmoe": (
        OlmoeForCausalLM,
        OlmoeConfig(**{**SHAPE, "intermediate_size": 16}, num_experts=4, num_experts_per_tok=2, clip_qkv=4.0),
    ),
}


def perturb(model: torch.nn.Module) -> None:
    """Move every parameter off its init (norm gains off 1, biases off 0) so no tensor can be silently skipped."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.3 * torch.randn_like(param))
            else:
                param.add_(0.05 * torch.randn_like(param))


def make_source(folder: Path, family: str, **overrides) -> Path:
    model_class, config = FAMILIES[family]
    config = type(config).from_dict({**config.to_dict(), **overrides})
    model = model_class(config)
    perturb(model)
    model.save_pretrained(folder)
    return folder


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what building the source printed
    code = main(["convert", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def llama_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    return make_source(tmp_path_factory.mktemp("src") / "llama", "llama-biases-llama3-rope")


# ---------------------------------------------------------------------------------------------- exact
@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f == "olmoe" else f for f in FAMILIES])
def test_exact_conversion_computes_the_source_function(tmp_path: Path, family: str) -> None:
    residual_size = 48  # D > d: the zero-padded embedding columns must stay inert (D = d: the tied test)
    source = make_source(tmp_path / "src", family)
    report = convert(source, tmp_path / "hires", residual_size=residual_size, layers_per_block=2, exact=True)
    assert report.max_abs_logit_diff < 1e-4

    vanilla = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    hires = AutoModelForCausalLM.from_pretrained(tmp_path / "hires", dtype=torch.float32).eval()
    assert type(hires).__name__ == "HiResForCausalLM"
    assert (hires.config.residual_size, hires.config.num_blocks) == (residual_size, 2)
    ids = torch.randint(3, VOCAB, (2, 24))
    with torch.no_grad():
        diff = (vanilla(ids).logits - hires(ids).logits).abs().max().item()
    assert diff < 1e-4

    prompt = ids[:1, :6]
    greedy = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(vanilla.generate(prompt, **greedy), hires.generate(prompt, **greedy))


def test_tied_source_stays_tied_only_where_widths_match(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", "llama-tied")
    convert(source, tmp_path / "same", residual_size=32, layers_per_block=2, exact=True)
    convert(source, tmp_path / "wide", residual_size=48, layers_per_block=4, exact=True)

    same = AutoModelForCausalLM.from_pretrained(tmp_path / "same")
    assert same.config.tie_word_embeddings
    assert same.lm_head.weight.data_ptr() == same.model.embed_tokens.weight.data_ptr()

    wide = AutoModelForCausalLM.from_pretrained(tmp_path / "wide")
    assert not wide.config.tie_word_embeddings
    embedding = wide.model.embed_tokens.weight  # (V, D): vanilla embedding, then zero columns
    torch.testing.assert_close(wide.lm_head.weight, embedding[:, :32])
    assert not embedding[:, 32:].any()


# ---------------------------------------------------------------------------------------------- warm start
@pytest.mark.parametrize("family", ["llama-biases-llama3-rope", "olmoe"])
def test_warm_start_conversion_loads_and_trains(tmp_path: Path, family: str) -> None:
    source = make_source(tmp_path / "src", family)
    report = convert(source, tmp_path / "hires", residual_size=48, layers_per_block=2)
    assert report.tolerance is None and report.hires_loss is not None  # reported, not enforced

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hires", dtype=torch.float32)
    assert model.config.outer_norm and model.config.write_mode == "output"
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)  # only gradients move weights
    ids = torch.randint(3, VOCAB, (2, 16))  # one fixed batch: a model that trains fits it
    losses = []
    for _ in range(6):
        loss = model(ids, labels=ids).loss
        loss.backward()
        if not losses:  # the new projections are in the graph, not dead weight
            assert model.model.blocks[0].write_proj.weight.grad.abs().sum() > 0
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(math.isfinite(value) for value in losses)
    assert losses[-1] < losses[0] - 0.5, losses


# ---------------------------------------------------------------------------------------------- the folder
def test_folder_is_complete_sharded_and_hub_ready(tmp_path: Path, llama_source: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for item in llama_source.iterdir():
        (source / item.name).write_bytes(item.read_bytes())
    tokenizer = _word_tokenizer()
    tokenizer.save_pretrained(source)

    report = convert(
        source, tmp_path / "hires", residual_size=48, layers_per_block=2, exact=True, max_shard_size="40KB"
    )
    assert report.loss_sample == "a short English sample"  # SRC's tokenizer encoded the check's text
    out = tmp_path / "hires"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "hires"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_hires.HiResForCausalLM"
    assert (out / "modeling_hires.py").is_file() and (out / "configuration_hires.py").is_file()
    assert (out / "generation_config.json").read_text() == (source / "generation_config.json").read_text()
    assert AutoTokenizer.from_pretrained(out)("hello world").input_ids == tokenizer("hello world").input_ids

    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    stored = set()
    for shard in shards:
        with safe_open(out / shard, "pt") as handle:
            stored |= set(handle.keys())
    assert stored == set(index["weight_map"])
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


REMOTE_CODE_LOAD = """
import sys
sys.modules["hires_hf"] = None  # as on a machine without this package
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
torch.save(model(torch.arange(3, 19)[None]).logits, sys.argv[2])
"""


@pytest.mark.slow
def test_converted_folder_loads_as_remote_code_without_the_package(tmp_path: Path, llama_source: Path) -> None:
    convert(llama_source, tmp_path / "hires", residual_size=48, layers_per_block=2, exact=True, check=False)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", REMOTE_CODE_LOAD, str(tmp_path / "hires"), str(tmp_path / "logits.pt")]
    subprocess.run(command, check=True, env=env, capture_output=True)
    remote = torch.load(tmp_path / "logits.pt", weights_only=True)
    local = AutoModelForCausalLM.from_pretrained(tmp_path / "hires")(torch.arange(3, 19)[None]).logits
    torch.testing.assert_close(remote, local, rtol=0, atol=0)


def test_bin_source_is_read_without_unpickling_objects(tmp_path: Path, llama_source: Path) -> None:
    source = tmp_path / "bin"
    source.mkdir()
    (source / "config.json").write_text((llama_source / "config.json").read_text())
    state = AutoModelForCausalLM.from_pretrained(llama_source).state_dict()
    torch.save(state, source / "pytorch_model.bin")
    report = convert(source, tmp_path / "hires", residual_size=48, layers_per_block=2, exact=True)
    assert report.max_abs_logit_diff < 1e-4

    torch.save({**state, "evil": Path("anything")}, source / "pytorch_model.bin")  # a non-tensor object
    assert not (tmp_path / "refused").exists()
    with pytest.raises(HiResUserError, match=r"weights_only=True.*safetensors"):
        convert(source, tmp_path / "refused", residual_size=48, layers_per_block=2, exact=True)
    assert not (tmp_path / "refused").exists()


def test_olmoe_with_fused_3d_experts_converts(tmp_path: Path) -> None:
    """Experts stored as transformers 5 holds them in memory (gate_up_proj (E, 2I, d)) are read as well."""
    source = make_source(tmp_path / "per-expert", "olmoe")
    fused = tmp_path / "fused"
    fused.mkdir()
    (fused / "config.json").write_text((source / "config.json").read_text())
    state = AutoModelForCausalLM.from_pretrained(source).state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file({k: v.contiguous() for k, v in state.items()}, fused / "model.safetensors")
    report = convert(fused, tmp_path / "hires", residual_size=48, layers_per_block=4, exact=True)
    assert report.max_abs_logit_diff < 1e-4


def test_dtype_option_casts_the_weights(tmp_path: Path, llama_source: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "bf16"
    code, stdout, _ = run_cli(
        capsys, llama_source, out, "--residual-size", 48, "--layers-per-block", 2, "--exact", "--dtype", "bfloat16"
    )
    assert code == 0 and ": OK" in stdout  # checked against the source rounded to bfloat16 the same way
    index = json.loads((out / "model.safetensors.index.json").read_text())
    dtypes = {t.dtype for shard in set(index["weight_map"].values()) for t in load_file(out / shard).values()}
    assert dtypes == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_check_says_what_its_losses_are_measured_on(tmp_path: Path, llama_source: Path, capsys) -> None:
    """Without a usable tokenizer the check's losses are on random ids (near ln V, nothing to do with text): the
    summary says so and why, instead of silently swapping the sample."""
    args = ("--residual-size", 48, "--layers-per-block", 2)
    code, stdout, _ = run_cli(capsys, llama_source, tmp_path / "plain", *args)
    assert code == 0 and "loss on random token ids (SRC has no tokenizer)" in stdout

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for item in llama_source.iterdir():
        (damaged / item.name).write_bytes(item.read_bytes())
    (damaged / "tokenizer.json").write_text("{not json")
    code, stdout, _ = run_cli(capsys, damaged, tmp_path / "out", *args)
    assert code == 0 and "loss on random token ids (SRC's tokenizer does not load:" in stdout


def test_check_does_not_swallow_unexpected_errors(tmp_path: Path, llama_source: Path, monkeypatch) -> None:
    """Only the failures a tokenizer folder is expected to produce fall back to random ids; a bug surfaces."""
    source = tmp_path / "src"
    source.mkdir()
    for item in llama_source.iterdir():
        (source / item.name).write_bytes(item.read_bytes())
    _word_tokenizer().save_pretrained(source)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug, not a missing tokenizer")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        convert(source, tmp_path / "out", residual_size=48, layers_per_block=2)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- bad input
def test_unsupported_architecture_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)).save_pretrained(tmp_path / "gpt2")
    code, _, err = run_cli(capsys, tmp_path / "gpt2", tmp_path / "out", "--residual-size", 64, "--layers-per-block", 1)
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "GPT2LMHeadModel" in err and "llama" in err and "olmoe" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("damage", "args", "message"),
    [
        ("truncate", (48, 2), "truncated or corrupt"),
        ("no-config", (48, 2), "no config.json"),
        ("none", (16, 2), "smaller than the source's hidden_size 32"),
        ("none", (48, 3), r"does not divide the source's 4 layers; choose one of \[1, 2, 4\]"),
        ("extra-tensor", (48, 2), "model.layers.0.self_attn.extra.weight .* has no place"),
        ("missing-tensor", (48, 2), "has no tensor for lm_head.weight"),
    ],
    ids=["truncated-safetensors", "missing-config", "D<d", "L%k", "unused-source-tensor", "missing-source-tensor"],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, llama_source: Path, capsys: pytest.CaptureFixture, damage: str, args: tuple, message: str
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for item in llama_source.iterdir():
        (source / item.name).write_bytes(item.read_bytes())
    if damage == "truncate":
        weights = (source / "model.safetensors").read_bytes()
        (source / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    elif damage == "no-config":
        (source / "config.json").unlink()
    elif damage in ("extra-tensor", "missing-tensor"):
        state = load_file(source / "model.safetensors")
        state["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
        if damage == "missing-tensor":
            state = {
                k: v for k, v in state.items() if k not in ("lm_head.weight", "model.layers.0.self_attn.extra.weight")
            }
        save_file(state, source / "model.safetensors", metadata={"format": "pt"})
    residual, k = args
    code, _, err = run_cli(capsys, source, tmp_path / "out", "--residual-size", residual, "--layers-per-block", k)
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_existing_destination_needs_force(tmp_path: Path, llama_source: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = (llama_source, out, "--residual-size", 48, "--layers-per-block", 2, "--exact")
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "already exists" in err and "--force" in err
    assert (out / "keep.txt").read_text() == "mine"

    code, stdout, _ = run_cli(capsys, *args, "--force")
    assert code == 0 and "max |Δ logits|" in stdout
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()


def test_failed_conversion_leaves_no_destination(tmp_path: Path, llama_source: Path, capsys) -> None:
    """A checkpoint whose tensors disagree with its config fails mid-write; neither DST nor a temp folder stays."""
    source = tmp_path / "src"
    source.mkdir()
    for item in llama_source.iterdir():
        (source / item.name).write_bytes(item.read_bytes())
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    code, _, err = run_cli(capsys, source, tmp_path / "out", "--residual-size", 48, "--layers-per-block", 2)
    assert code == 2 and "does not match its config.json" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_sliding_window_in_effect_is_refused_unless_context_is_capped(tmp_path: Path, capsys) -> None:
    source = make_source(tmp_path / "src", "mistral", sliding_window=8)
    args = (source, tmp_path / "out", "--residual-size", 48, "--layers-per-block", 2, "--exact")
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "sliding_window=8" in err and "--max-position-embeddings 8" in err

    code, _, _ = run_cli(capsys, *args, "--max-position-embeddings", 8)
    assert code == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.max_position_embeddings == 8


def test_offline_hub_id_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run_cli(capsys, "no-such-owner/no-such-model", tmp_path / "out", "--residual-size", 64,
                           "--layers-per-block", 2)  # fmt: skip
    assert code == 2 and "could not be fetched" in err and "Traceback" not in err


def _word_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny word-level tokenizer, built offline, to check that tokenizer files travel with the model."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "hello": 4, "world": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
