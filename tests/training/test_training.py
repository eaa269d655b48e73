"""Training: data and tokenizer, the Trainer wiring (loss falls, resume, DDP / FSDP2), the demo, CLI errors."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.utils import logging as transformers_logging

from hires_hf import HiResConfig
from hires_hf.cli import main as cli_main
from hires_hf.training import (
    PackedDataset,
    TrainSettings,
    build_tokenizer,
    encode_documents,
    load_default_corpus,
    load_text_files,
    pack,
    special_token_ids,
    train_model,
)

BLOCK = 32
VOCAB = 300
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    residual_size=64,
    moe_intermediate_size=32,
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread on a shared CPU (two threads spin-wait on each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus():
    return load_default_corpus(max_chars=150_000)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return build_tokenizer(corpus.train, vocab_size=VOCAB, sample_chars=60_000)


@pytest.fixture(scope="module")
def data(corpus, tokenizer):
    eos = tokenizer.eos_token_id
    train = PackedDataset(pack(encode_documents(tokenizer, corpus.train), BLOCK, eos))
    evaluation = PackedDataset(pack(encode_documents(tokenizer, corpus.validation), BLOCK, eos)[:16])
    return train, evaluation


def small_config(tokenizer, preset: str = "tiny") -> HiResConfig:
    return HiResConfig.from_preset(preset, **SMALL, **special_token_ids(tokenizer))


# ------------------------------------------------------------------------------------------ data, tokenizer
def test_default_corpus_split_is_deterministic_and_by_file(corpus):
    again = load_default_corpus(max_chars=150_000)
    assert again == corpus
    assert corpus.train and corpus.validation
    assert not set(corpus.train) & set(corpus.validation)  # a file is on one side only


def test_pack_separates_documents_and_drops_the_tail():
    blocks = pack([[1, 2, 3], [4, 5], [6]], block_size=3, separator_id=0)
    assert blocks.tolist() == [[1, 2, 3], [0, 4, 5], [0, 6, 0]]
    assert pack([[1, 2, 3, 4]], block_size=3, separator_id=None).tolist() == [[1, 2, 3]]


def test_byte_level_tokenizer_has_no_unknowns_and_round_trips(tokenizer):
    text = "def f(x):\n    return x ** 2  # ünïcødé ✓ 数学"
    assert len(tokenizer) == VOCAB
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_local_jsonl_and_text_files_split_deterministically(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": f"document {i} " * 20}) for i in range(40)))
    (tmp_path / "b.txt").write_text("plain text file " * 50)
    first = load_text_files([tmp_path])
    assert first == load_text_files([tmp_path])
    assert len(first.train) + len(first.validation) == 41 and first.validation


# ------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"], ids=["dense", "moe"])
def test_short_run_lowers_validation_loss(preset, tokenizer, data, tmp_path):
    train, evaluation = data
    settings = TrainSettings(max_steps=30, batch_size=8, learning_rate=3e-3, eval_steps=15, progress=False)
    result = train_model(small_config(tokenizer, preset), tokenizer, train, evaluation, settings, output_dir=tmp_path)
    first_eval = next(row["eval_loss"] for row in result.history if "eval_loss" in row)
    assert result.final_eval_loss < first_eval - 0.3
    assert result.tokens_seen == 30 * 8 * BLOCK
    assert result.flops == pytest.approx(result.tokens_seen * result.flops_per_token)
    logged = {key for row in result.history for key in row}
    assert ({"aux_loss", "z_loss"} <= logged) == (preset == "tiny-moe")  # router losses logged on their own
    reloaded = AutoModelForCausalLM.from_pretrained(result.model_dir)
    assert type(reloaded).__name__ == "HiResForCausalLM"
    saved_tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    assert saved_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert saved_tokenizer.model_max_length == reloaded.config.max_position_embeddings  # not "no limit" (1e30)


def test_a_mistyped_setting_is_refused_not_ignored(tokenizer, data, tmp_path):
    """Keyword arguments override TrainSettings fields (the older call style); a name that is no field fails."""
    train, evaluation = data
    with pytest.raises(TypeError, match="learning_rat"):
        train_model(
            small_config(tokenizer), tokenizer, train, evaluation, TrainSettings(max_steps=1), output_dir=tmp_path,
            learning_rat=1e-2,
        )  # fmt: skip
    assert not (tmp_path / "train_result.json").exists()


class InterruptAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_resume_reproduces_the_uninterrupted_run(tokenizer, data, tmp_path):
    train, evaluation = data
    settings = TrainSettings(
        max_steps=12, batch_size=4, learning_rate=3e-3, eval_steps=6, logging_steps=1, save_steps=4, progress=False
    )
    config = small_config(tokenizer)
    full = train_model(config, tokenizer, train, evaluation, settings, output_dir=tmp_path / "full")
    part = tmp_path / "part"
    train_model(config, tokenizer, train, evaluation, settings, output_dir=part, callbacks=[InterruptAt(4)])
    resumed = train_model(config, tokenizer, train, evaluation, replace(settings, resume=True), output_dir=part)

    def losses(result):
        return {row["step"]: row["loss"] for row in result.history if "loss" in row}

    after = losses(resumed)
    assert sorted(after) == list(range(5, 13))
    assert after == pytest.approx({step: losses(full)[step] for step in after}, abs=1e-5)
    assert resumed.final_eval_loss == pytest.approx(full.final_eval_loss, abs=1e-5)


WORKER = """
import json, os, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor
from hires_hf import HiResConfig
from hires_hf.training import PackedDataset, TrainSettings, load_tokenizer, train_model

torch.set_num_threads(1)
data, out, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
blocks = load_file(data / "blocks.safetensors")
settings = TrainSettings(
    max_steps=10, batch_size=8 // world, learning_rate=3e-3, eval_steps=10,
    fsdp_size=world if mode == "fsdp" else None, progress=False,
)
result = train_model(
    HiResConfig.from_json_file(data / "config.json"), load_tokenizer(data / "tokenizer"),
    PackedDataset(blocks["train"]), PackedDataset(blocks["eval"]), settings, output_dir=out,
)
state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().contiguous()
         for k, v in result.model.state_dict().items()}
save_file(state, out / f"params-rank{rank}.safetensors")
(out / f"loss-rank{rank}.json").write_text(json.dumps(result.final_eval_loss))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one(mode, tokenizer, data, tmp_path):
    """Two gloo ranks splitting each batch reach the single-process loss and hold identical parameters."""
    train, evaluation = data
    config = small_config(tokenizer)
    folder = tmp_path / "data"
    tokenizer.save_pretrained(folder / "tokenizer")
    config.to_json_file(folder / "config.json")
    save_file({"train": train.blocks[:400].contiguous(), "eval": evaluation.blocks}, folder / "blocks.safetensors")
    (tmp_path / "worker.py").write_text(WORKER)
    settings = TrainSettings(
        max_steps=10, batch_size=8, learning_rate=3e-3, eval_steps=10, progress=False, save_model=False
    )
    single = train_model(
        config, tokenizer, PackedDataset(train.blocks[:400]), evaluation, settings, output_dir=tmp_path / "single"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
    command += [str(_free_port()), str(tmp_path / "worker.py"), str(folder), str(tmp_path / mode), mode]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]

    rank0, rank1 = (load_file(tmp_path / mode / f"params-rank{r}.safetensors") for r in (0, 1))
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    for rank in (0, 1):
        loss = json.loads((tmp_path / mode / f"loss-rank{rank}.json").read_text())
        assert loss == pytest.approx(single.final_eval_loss, abs=2e-3)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / mode / "model")  # a plain folder, FSDP2 or not
    assert (tmp_path / mode / "model" / "modeling_hires.py").is_file()
    torch.testing.assert_close(saved.state_dict()["lm_head.weight"], rank0["lm_head.weight"])


# ------------------------------------------------------------------------------------------ the demo
# what the demo's log must not show again: nested Trainer evaluation bars (cursor-up codes), lm-eval's bars,
# transformers' loading / saving bars and its too-long-sequence warning on lm-eval's whole documents
DEMO_NOISE = (
    "\x1b[A",
    "Running loglikelihood requests",
    "Tokenizing inputs",
    "Loading weights",
    "Writing model shards",
    "Token indices sequence length",
)


@pytest.mark.slow
def test_demo_smoke_writes_table_plot_and_loadable_models(tmp_path, capfd, caplog):
    caplog.set_level(logging.WARNING)
    transformers_logger, verbosity = logging.getLogger("transformers"), transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()  # as a user's shell has it (conftest keeps only errors)
    transformers_logger.addHandler(caplog.handler)  # transformers' records do not reach the root logger
    try:
        assert cli_main(["demo", "--smoke", "--output-dir", str(tmp_path)]) == 0
    finally:
        transformers_logger.removeHandler(caplog.handler)
        transformers_logging.set_verbosity(verbosity)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("lm_eval")] == []  # the tables stand out
    printed, log = capfd.readouterr()  # file descriptors: tqdm writes to the real stderr
    messages = "\n".join(record.getMessage() for record in caplog.records)
    assert [noise for noise in DEMO_NOISE if noise in log + printed + messages] == []
    started = re.findall(r"(?<![0-9])0%\|", log)  # every bar draws itself at 0% once
    assert len(started) <= 6  # tokenizing (train, validation), three trainings, the downstream tasks: a few
    table = (tmp_path / "table.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["model", "control", "hires", "plain-twin"] and table in printed  # the baseline first
    assert "HiRes minus control:" in table
    assert (tmp_path / "loss_vs_flops.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((tmp_path / "results.json").read_text())  # the run's summary: what the README quotes
    summary = written["results"]
    assert written["baseline"] == "control" and list(summary) == ["control", "hires", "plain-twin"]
    assert written["hires_minus_control"] == pytest.approx(
        summary["hires"]["final_eval_loss"] - summary["control"]["final_eval_loss"]
    )
    assert set(written["downstream"]) == {"control", "hires", "plain-twin"}  # the downstream tasks' numbers
    assert "stdlib_next_line" in written["downstream"]["hires"]
    control, hires = summary["control"], summary["hires"]
    assert hires["flops_per_token"] > control["flops_per_token"]  # HiRes pays for its read / write projections
    assert summary["plain-twin"]["flops"] == control["flops"]  # the same layers: the same steps
    step_flops = max(hires["flops"] / hires["extra"]["steps"], control["flops"] / control["extra"]["steps"])
    assert abs(hires["flops"] - control["flops"]) <= step_flops  # equal counted FLOPs, to one step
    for name, expected in (
        ("control", "LlamaForCausalLM"),
        ("hires", "HiResForCausalLM"),
        ("plain-twin", "LlamaForCausalLM"),
    ):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / name / "model")
        assert type(model).__name__ == expected
        assert AutoTokenizer.from_pretrained(tmp_path / name / "model").eos_token == "<|endoftext|>"
        assert f"--- {name} sample ---" in printed
    downstream = (tmp_path / "downstream.md").read_text()  # the offline lm-eval tasks, the three side by side
    header = downstream.splitlines()[0]
    assert "stdlib_next_line" in downstream and all(name in header for name in ("control", "hires", "plain-twin"))


def test_demo_budget_fills_the_minutes_at_the_controls_timed_step(tokenizer, monkeypatch):
    """Three runs of the control's timed steps fill the minutes the reserve leaves; HiRes gets fewer steps."""
    from hires_hf.experiments import demo, harness

    monkeypatch.setattr(harness, "time_train_step", lambda *args, **kwargs: 0.5)  # 0.5 s a control step
    settings = demo.DemoSettings.smoke(smoke_steps=None, budget_minutes=2.0)
    blocks = torch.zeros(64, 32, dtype=torch.long)
    data = harness.Data(blocks, blocks[:4], tokenizer, unigram_loss=1.0, source="blocks")
    arms, shape = demo.demo_arms(), demo.demo_shape("tiny")
    budget = demo.demo_budget(settings, arms, shape, data, spent_seconds=12.0)
    seconds = 2.0 * 60 * (1 - demo.RESERVE) - 12.0
    steps = {arm.name: budget.steps(arm.flops_per_token(shape, data), data.context) for arm in arms}
    assert steps["control"] == steps["plain-twin"] == int(seconds / 3 / 0.5)
    assert steps["hires"] < steps["control"]


def test_demo_budget_in_flops_is_the_same_on_any_machine(tokenizer, monkeypatch):
    """The default budget is counted FLOPs: no clock is read, so the committed numbers reproduce anywhere."""
    from hires_hf.experiments import demo, harness

    def no_clock(*args, **kwargs):
        raise AssertionError("a FLOP budget must not time anything")

    monkeypatch.setattr(harness, "time_train_step", no_clock)
    settings = demo.DemoSettings.smoke(smoke_steps=None)
    blocks = torch.zeros(64, 32, dtype=torch.long)
    data = harness.Data(blocks, blocks[:4], tokenizer, unigram_loss=1.0, source="blocks")
    budget = demo.demo_budget(settings, demo.demo_arms(), demo.demo_shape("tiny"), data, spent_seconds=12.0)
    assert budget.flops == demo.DemoSettings().budget_flops


@pytest.mark.slow
def test_demo_control_folder_is_the_trained_control(tmp_path):
    """The control trains with its embedding scale as a hook, which is not saved: the folder must hold it in its
    weights, so that the reloaded model scores the trained one's validation loss (and the plain twin's does not)."""
    from hires_hf.experiments.demo import DemoSettings, demo_data, run_demo

    settings = DemoSettings.smoke(downstream_limit=0)
    result = run_demo(tmp_path, settings)
    validation = demo_data(settings).validation  # the demo's data path is deterministic: the same blocks

    def reloaded_loss(name: str) -> float:
        model = AutoModelForCausalLM.from_pretrained(tmp_path / name / "model").eval()
        with torch.no_grad():
            return model(input_ids=validation, labels=validation).loss.item()

    assert reloaded_loss("control") == pytest.approx(result.results["control"].final_eval_loss, abs=1e-4)
    assert reloaded_loss("plain-twin") == pytest.approx(result.results["plain-twin"].final_eval_loss, abs=1e-4)
    assert abs(result.results["control"].final_eval_loss - result.results["plain-twin"].final_eval_loss) > 1e-3


# ------------------------------------------------------------------------------------------ CLI errors
def _cli_error(argv: list[str], capsys) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("def add(a, b):\n    return a + b\n" * 200)
    return path


def test_cli_missing_data_path(tmp_path, capsys):
    err = _cli_error(["train", "--data", str(tmp_path / "nope.txt"), "--output-dir", str(tmp_path / "o")], capsys)
    assert "does not exist" in err


def test_cli_empty_data(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("  \n")
    err = _cli_error(["train", "--data", str(tmp_path / "empty.txt"), "--output-dir", str(tmp_path / "o")], capsys)
    assert "empty" in err


def test_cli_unknown_preset(tmp_path, capsys):
    out = tmp_path / "runs" / "x"  # a failed command leaves no folder behind, parents included
    assert "not-a-preset" in _cli_error(["train", "--model", "not-a-preset", "--output-dir", str(out)], capsys)
    assert not (tmp_path / "runs").exists()
    assert "not-a-preset" in _cli_error(["demo", "--preset", "not-a-preset", "--output-dir", str(tmp_path)], capsys)


def test_cli_tokenizer_model_vocab_mismatch(tokenizer, text_file, tmp_path, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    argv = ["train", "--data", str(text_file), "--tokenizer", str(tmp_path / "tok"), "--override", "vocab_size=280"]
    err = _cli_error([*argv, "--output-dir", str(tmp_path / "o")], capsys)
    assert f"{VOCAB} tokens" in err and "vocab_size is 280" in err


def test_cli_unwritable_output_dir(text_file, tmp_path, capsys):
    blocked = text_file / "out"  # under a regular file: no one can create it, root included
    assert "Cannot write" in _cli_error(["train", "--data", str(text_file), "--output-dir", str(blocked)], capsys)
    assert "Cannot write" in _cli_error(["demo", "--smoke", "--output-dir", str(blocked)], capsys)


def test_cli_trains_then_continues_from_its_folder(text_file, tmp_path, capsys):
    config = tmp_path / "config.json"
    HiResConfig.from_preset("tiny", **SMALL).to_json_file(config)
    common = ["--data", str(text_file), "--block-size", str(BLOCK), "--batch-size", "4", "--threads", "1"]
    train_a = ["train", "--model", str(config), *common, "--max-steps", "3", "--diagnostics-every", "2"]
    assert cli_main([*train_a, "--output-dir", str(tmp_path / "a")]) == 0
    first = tmp_path / "a" / "model"
    assert (first / "tokenizer.json").is_file() and "validation loss" in capsys.readouterr().out
    # what `hires-hf inspect` tells the user to do works: the run's diagnostics are found from OUTPUT_DIR
    assert cli_main(["inspect", str(tmp_path / "a")]) == 0
    assert "| step | final shared |" in capsys.readouterr().out
    # The folder's tokenizer truncates where the model's context ends, and carries no loading flags.
    tokenizer_config = json.loads((first / "tokenizer_config.json").read_text())
    context = json.loads((first / "config.json").read_text())["max_position_embeddings"]
    assert tokenizer_config["model_max_length"] == context
    assert AutoTokenizer.from_pretrained(first).model_max_length == context
    assert not {"is_local", "local_files_only"} & set(tokenizer_config)
    again = ["train", "--model", str(first), *common, "--max-steps", "2", "--output-dir", str(tmp_path / "b")]
    assert cli_main(again) == 0

    # It starts where the folder left off: the continued run's step-0 validation loss (before any update) is the
    # saved model's, which the first run measured on the same validation blocks at its last step. A fresh model
    # (the folder ignored) would start near ln(vocab) instead.
    first_run, continued = (_train_result(tmp_path / name) for name in ("a", "b"))
    saved_model_loss = _eval_losses(first_run)[-1]
    assert _eval_losses(continued)[0] == pytest.approx(saved_model_loss, abs=1e-5)
    before, after = (AutoModelForCausalLM.from_pretrained(p) for p in (first, tmp_path / "b" / "model"))
    assert not torch.equal(before.lm_head.weight, after.lm_head.weight)  # and it trained on from there


def _train_result(output_dir: Path) -> dict:
    return json.loads((output_dir / "train_result.json").read_text())


def _eval_losses(result: dict) -> list[float]:
    return [row["eval_loss"] for row in sorted(result["history"], key=lambda r: r["step"]) if "eval_loss" in row]


def test_a_single_document_the_hash_sends_to_validation_still_trains(tmp_path):
    """The split hashes each document's name; a lone document the hash sends to validation must still give
    training text (its head) and validation text (its tail), as one the hash sends to training does."""
    from hires_hf.training.data import _hash_fraction, load_text_files

    names = (tmp_path / f"doc{index}.txt" for index in range(10_000))
    path = next(p for p in names if _hash_fraction(f"split:{p}#0") < 0.05)  # one that lands in validation
    path.write_text("def add(a, b):\n    return a + b\n" * 50)
    corpus = load_text_files([path], validation_fraction=0.05)
    assert corpus.train and corpus.validation
    assert "".join(corpus.train).startswith("def add") and len(corpus.train[0]) > len(corpus.validation[0])
