"""HiRes drops into the tools people already use: pipeline, PEFT, TRL, torch.compile, big-model loading,
the Trainer's classification path and vLLM's transformers backend (checked statically here; served by vLLM in
tests/test_vllm.py). Everything runs on CPU with tiny models and a tokenizer trained in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from ecosystem_helpers import (
    VOCAB_SIZE,
    build_tokenizer,
    plan_key_matches,
    save_tiny_model,
    stdlib_texts,
    tiny_config,
    unmatched_plan_keys,
)
from torch import nn
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    pipeline,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

import hires_hf  # noqa: F401  (registers the Auto classes)
from hires_hf import HiResConfig, HiResForCausalLM, HiResForSequenceClassification, HiResModel
from hires_hf.modeling_hires import HiResPreTrainedModel

PRESETS = ["tiny", "tiny-moe"]
PROMPT = "def parse(self, text):"
# Equal weights, different buffers: CPU matmul kernels may round the last bit differently with the memory
# address (seen on the first MoE forward of a loaded copy), so "equal" means equal to a few float32 ulps.
SAME_WEIGHTS = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerFast) -> Path:
    """A saved dense tiny HiRes folder, with tokenizer and remote code, as a user would get it from the Hub."""
    torch.manual_seed(0)
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", "tiny", tokenizer)


def token_ids(batch: int = 2, seq_len: int = 16) -> torch.Tensor:
    return torch.randint(3, VOCAB_SIZE, (batch, seq_len))  # ids 0-2 are the special tokens


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def train_args(output_dir: Path, **overrides: object) -> dict:
    """TrainingArguments for a few quiet CPU steps."""
    return dict(
        output_dir=str(output_dir),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        **overrides,
    )


def logged_losses(trainer: Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


# ---------------------------------------------------------------------------------------------- pipeline


def test_pipeline_generates_from_saved_folder(folder: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """`pipeline("text-generation", model=DIR)` loads a HiRes folder and decodes what `generate` decodes."""
    generator = pipeline("text-generation", model=str(folder))
    text = generator(PROMPT, max_new_tokens=8, do_sample=False)[0]["generated_text"]

    model = HiResForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert isinstance(generator.model, HiResForCausalLM)
    assert text == tokenizer.decode(expected[0], skip_special_tokens=True)


REMOTE_PIPELINE = textwrap.dedent(
    """
    import json, sys
    sys.modules["hires_hf"] = None  # this process cannot import the package: only the folder's own code loads
    from transformers import pipeline

    generator = pipeline("text-generation", model=sys.argv[1], trust_remote_code=True)
    text = generator(sys.argv[2], max_new_tokens=8, do_sample=False)[0]["generated_text"]
    print(json.dumps({"module": type(generator.model).__module__, "text": text}))
    """
)


@pytest.mark.slow
def test_pipeline_with_remote_code_without_the_package(folder: Path, tmp_path: Path) -> None:
    """The folder alone (auto_map + copied modeling files) runs in a pipeline where hires_hf is not importable."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    run = subprocess.run(
        [sys.executable, "-c", REMOTE_PIPELINE, str(folder), PROMPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    remote = json.loads(run.stdout.strip().splitlines()[-1])
    local = pipeline("text-generation", model=str(folder))(PROMPT, max_new_tokens=8, do_sample=False)
    assert remote["module"].startswith("transformers_modules.")
    assert remote["text"] == local[0]["generated_text"]


# ---------------------------------------------------------------------------------------------- PEFT

LORA_CASES = {
    "q_v": dict(target_modules=["q_proj", "v_proj"]),
    "all-linear": dict(target_modules="all-linear"),
    "moe-all-linear+experts": dict(
        target_modules="all-linear", target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    ),
}


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] if case.startswith("moe") else []) for case in LORA_CASES]
)
def test_lora_trains_saves_reloads_and_merges(case: str, tmp_path: Path) -> None:
    """Train a LoRA adapter a few steps, reload it on a fresh base, merge: the three give the same logits."""
    from peft import LoraConfig, PeftModel, get_peft_model

    preset = "tiny-moe" if case.startswith("moe") else "tiny"
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    HiResForCausalLM(tiny_config(preset)).save_pretrained(base_dir)
    model = get_peft_model(HiResForCausalLM.from_pretrained(base_dir), LoraConfig(r=4, **LORA_CASES[case]))
    ids = token_ids()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(4):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval().save_pretrained(adapter_dir)
    trained = logits(model, ids)

    reloaded = PeftModel.from_pretrained(HiResForCausalLM.from_pretrained(base_dir), adapter_dir).eval()
    merged = reloaded.merge_and_unload()
    torch.testing.assert_close(logits(reloaded, ids), trained, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(merged, ids), trained, rtol=1e-5, atol=1e-5)
    assert type(merged) is HiResForCausalLM
    assert not (logits(HiResForCausalLM.from_pretrained(base_dir), ids) - trained).abs().max() < 1e-4


def lora_targets(model: nn.Module) -> set[str]:
    """Leaf names (q_proj, read_proj, ...) of the modules PEFT wrapped with LoRA."""
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}


@pytest.mark.parametrize("preset", PRESETS)
def test_all_linear_targets_hires_projections_but_not_the_head(preset: str) -> None:
    """Documented decision: "all-linear" adapts read/write/read-out projections too; the LM head never.

    PEFT picks every nn.Linear except the output embedding, so HiRes's D<->d projections are targets; MoE
    experts and routers are parameters, not nn.Linear, and need `target_parameters` (test above)."""
    from peft import LoraConfig, get_peft_model

    layer_linears = {"q_proj", "k_proj", "v_proj", "o_proj"} | (
        set() if preset == "tiny-moe" else {"gate_proj", "up_proj", "down_proj"}
    )
    hires_linears = {"read_proj", "write_proj", "read_out"}

    model = get_peft_model(HiResForCausalLM(tiny_config(preset)), LoraConfig(r=2, target_modules="all-linear"))
    assert lora_targets(model) == layer_linears | hires_linears

    only_layers = LoraConfig(r=2, target_modules="all-linear", exclude_modules=sorted(hires_linears))
    model = get_peft_model(HiResForCausalLM(tiny_config(preset)), only_layers)
    assert lora_targets(model) == layer_linears


def test_layers_to_transform_picks_layers_by_their_global_index_as_on_llama() -> None:
    """The layers are one flat `model.layers` list, so PEFT's layer selection means what it means on Llama."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], layers_to_transform=[0, 3])
    model = get_peft_model(HiResForCausalLM(tiny_config("tiny")), config)
    adapted = {name.split(".self_attn")[0] for name, _ in model.named_parameters() if "lora_A" in name}
    assert adapted == {"base_model.model.model.layers.0", "base_model.model.model.layers.3"}


# ---------------------------------------------------------------------------------------------- TRL


def sft_run(preset: str, tokenizer: PreTrainedTokenizerFast, output_dir: Path, **sft_overrides: object) -> list[float]:
    """A few SFTTrainer steps over 8 short stdlib texts, repeated so that the loss has something to learn."""
    from trl import SFTConfig, SFTTrainer

    dataset = Dataset.from_list([{"text": text[:200]} for text in stdlib_texts()[:8]])
    args = SFTConfig(
        **train_args(output_dir, max_steps=6, per_device_train_batch_size=4, learning_rate=3e-3),
        max_length=48,
        **sft_overrides,
    )
    model = HiResForCausalLM(tiny_config(preset))
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return logged_losses(trainer)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "overrides"),
    [("tiny", {"router_aux_loss_coef": 0.0}), ("tiny-moe", {})],
    ids=["dense-no-aux", "moe"],
)
def test_sft_trainer_runs(preset: str, overrides: dict, tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    losses = sft_run(preset, tokenizer, tmp_path, **overrides)
    assert len(losses) == 6
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-2:]) < sum(losses[:2])


@pytest.mark.slow
def test_sft_trainer_dense_with_default_arguments(tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    """TRL adds a router aux loss whenever router_aux_loss_coef is non-zero: a dense config must default to 0."""
    assert sft_run("tiny", tokenizer, tmp_path)


# ---------------------------------------------------------------------------------------------- torch.compile


@pytest.mark.slow
def test_compile_fullgraph_dense_matches_eager() -> None:
    """Default backend (inductor), fullgraph: the dense model compiles with no graph break."""
    torch._dynamo.reset()
    model = HiResForCausalLM(tiny_config("tiny", num_hidden_layers=2)).eval()
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):  # the second call reuses the graph on new inputs
        ids = token_ids()
        torch.testing.assert_close(logits(compiled, ids), logits(model, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compile_fullgraph_moe_matches_eager() -> None:
    """MoE compiles fullgraph with the default `grouped_mm` experts (the `eager` experts loop graph-breaks on
    `.tolist()`); aot_eager keeps the test short, inductor was checked by hand (docs/ecosystem.md)."""
    torch._dynamo.reset()
    model = HiResForCausalLM(tiny_config("tiny-moe", num_hidden_layers=2)).eval()
    assert model.config._experts_implementation == "grouped_mm"
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    ids = token_ids()
    torch.testing.assert_close(logits(compiled, ids), logits(model, ids), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- big-model loading


@pytest.mark.parametrize("preset", PRESETS)
def test_device_map_auto_loads_sharded_checkpoint_once(
    preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sharded save -> `from_pretrained(device_map="auto")`: weights land on CPU, equal, and no loaded
    module is initialised first (the model is built on meta and each weight is materialised once, from disk)."""
    model = HiResForCausalLM(tiny_config(preset)).eval()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1

    initialised = []
    original_init = HiResPreTrainedModel._init_weights

    def spy(self: HiResPreTrainedModel, module: nn.Module) -> None:
        if any(True for _ in module.parameters(recurse=False)):
            initialised.append(type(module).__name__)
        original_init(self, module)

    monkeypatch.setattr(HiResPreTrainedModel, "_init_weights", spy)
    loaded = HiResForCausalLM.from_pretrained(tmp_path, device_map="auto").eval()
    assert initialised == []
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
    ids = token_ids()
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), **SAME_WEIGHTS)


@pytest.mark.slow
def test_meta_init_then_dispatch_sharded_checkpoint(tmp_path: Path) -> None:
    """accelerate's empty-weights init + load_checkpoint_and_dispatch, the path big-model users take."""
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch

    config = tiny_config("tiny")
    model = HiResForCausalLM(config).eval()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    with init_empty_weights():
        empty = HiResForCausalLM(config)
    assert {p.device.type for p in empty.parameters()} == {"meta"}
    loaded = load_checkpoint_and_dispatch(
        empty, str(tmp_path), device_map="auto", no_split_module_classes=empty._no_split_modules
    ).eval()
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
    ids = token_ids()
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), **SAME_WEIGHTS)


def test_dtype_auto_keeps_saved_bfloat16(tmp_path: Path) -> None:
    model = HiResForCausalLM(tiny_config("tiny")).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    loaded = HiResForCausalLM.from_pretrained(tmp_path, dtype="auto")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert HiResForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).dtype == torch.float32


# ---------------------------------------------------------------------------------------------- classification


@pytest.mark.slow
def test_sequence_classification_fine_tunes_with_trainer(tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    """Trainer fine-tunes the last-token head; with pad_token_id set, a right-padded batch scores each text as
    it scores alone."""
    rows = [{"text": f"def f{i}(x): return x", "label": 0} for i in range(8)]
    rows += [{"text": f"class Spam{i}(Base):  # a longer class line", "label": 1} for i in range(8)]
    dataset = Dataset.from_list(rows).map(lambda row: tokenizer(row["text"]), remove_columns=["text"])
    model = HiResForSequenceClassification(tiny_config("tiny", num_labels=2))
    args = TrainingArguments(**train_args(tmp_path, max_steps=8, per_device_train_batch_size=8, learning_rate=3e-3))
    collator = DataCollatorWithPadding(tokenizer)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    losses = logged_losses(trainer)
    assert losses[-1] < losses[0]

    model.eval()
    batch = collator([tokenizer(row["text"]) for row in rows])
    assert (batch["input_ids"] == tokenizer.pad_token_id).any()  # the batch really is padded
    with torch.no_grad():
        batched = model(**batch).logits
        alone = torch.cat([model(**tokenizer(row["text"], return_tensors="pt")).logits for row in rows])
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------- vLLM readiness


@pytest.mark.parametrize("preset", PRESETS)
def test_attention_kwargs_reach_a_registered_attention_function(preset: str) -> None:
    """vLLM passes its attention instances as forward kwargs; every layer's attention function must see them."""
    seen: list[tuple[int, object]] = []

    def recording_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
        seen.append((module.layer_idx, kwargs.get("probe")))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("hires_probe", recording_attention)
    AttentionMaskInterface.register("hires_probe", sdpa_mask)
    model = HiResForCausalLM(tiny_config(preset)).eval()
    ids = token_ids()
    expected = logits(model, ids)
    model.set_attn_implementation("hires_probe")
    with torch.no_grad():
        out = model(input_ids=ids, probe="from-forward").logits
    assert seen == [(i, "from-forward") for i in range(model.config.num_hidden_layers)]
    torch.testing.assert_close(out, expected)


def test_attention_backend_chosen_at_load_runs_every_layer(folder: Path) -> None:
    """What `_supports_attention_backend` promises vLLM: load with `attn_implementation=` naming a registered
    function (vLLM registers its paged attention the same way) and every layer's attention runs through it,
    with the model's own result. `is_backend_compatible()` is the flag vLLM reads before it relies on that."""
    calls: list[int] = []

    def backend(module: nn.Module, query, key, value, attention_mask, **kwargs):
        calls.append(module.layer_idx)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("hires_backend_test", backend)
    AttentionMaskInterface.register("hires_backend_test", sdpa_mask)
    model = HiResForCausalLM.from_pretrained(folder, attn_implementation="hires_backend_test").eval()
    assert model.is_backend_compatible()
    ids = token_ids()
    out = logits(model, ids)
    assert calls == list(range(model.config.num_hidden_layers))
    torch.testing.assert_close(out, logits(HiResForCausalLM.from_pretrained(folder).eval(), ids))


def names_of(preset: str) -> set[str]:
    """Qualified names of every module and parameter of the base model (what plan keys are matched against)."""
    model = HiResModel(tiny_config(preset))
    return {name for name, _ in model.named_modules()} | {name for name, _ in model.named_parameters()}


PLANS = ["base_model_tp_plan", "base_model_fsdp_plan", "base_model_ep_plan"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("plan", PLANS)
def test_parallel_plan_keys_name_real_modules(plan: str, preset: str) -> None:
    """Each key of each plan names a module or parameter of the variant it was derived for (dense or MoE)."""
    keys = list(getattr(tiny_config(preset), plan))
    assert keys or (plan == "base_model_ep_plan" and preset == "tiny"), f"{plan} is empty"
    assert unmatched_plan_keys(keys, names_of(preset)) == []


@pytest.mark.parametrize("preset", PRESETS)
def test_tp_plan_covers_every_layer_projection(preset: str) -> None:
    """No attention or MLP projection falls through to 'replicate' for want of a plan key."""
    model = HiResModel(tiny_config(preset))
    projections = [
        name for name, module in model.named_modules() if name.startswith("layers.") and isinstance(module, nn.Linear)
    ]
    assert projections
    plan = tiny_config(preset).base_model_tp_plan
    assert [name for name in projections if not any(plan_key_matches(key, name) for key in plan)] == []


def test_there_is_no_pipeline_plan_to_split_interleaved_blocks_by() -> None:
    """Pipeline stages run in order; HiRes blocks interleave with the layers they run, so no plan is declared (and
    vLLM, inferring one, refuses a base model with two ModuleLists)."""
    model = HiResModel(tiny_config("tiny"))
    assert HiResConfig.base_model_pp_plan is None and not model.supports_pp_plan
    assert [name for name, child in model.named_children() if isinstance(child, nn.ModuleList)] == ["layers", "blocks"]


def test_config_names_the_embedding_width_vllm_reads() -> None:
    config = tiny_config("tiny")
    width = getattr(config, "embedding_size", config.hidden_size)
    assert width == HiResModel(config).embed_tokens.embedding_dim
