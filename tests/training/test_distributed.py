"""HiRes under transformers' native distributed engine (`from_pretrained(..., distributed_config=...)`).

Every mode runs for real: two gloo processes on CPU (tests/training/distributed_worker.py, one torchrun launch for all
cases), dense (`tiny`) and MoE (`tiny-moe`), against the single-process model. Tolerances:
- logits: max |diff| <= 1e-5 (measured: 0 under FSDP2 / HSDP / EP, ~2e-7 under TP, whose all-reduces sum in
  another order);
- one AdamW step (lr 1e-3): loss within 1e-6; all but 1 in 10^4 updated weights within 2e-6, and every one within
  one step (lr). Adam's first step is lr * g / (|g| + eps): where a gradient element is as small as eps (1e-8),
  the summation order, which two processes change, moves that element's step by a fraction of lr (measured: under
  TP 7 of 321K-585K weights beyond 1e-6, the largest 2.9e-5; under FSDP2 and EP none beyond 1e-6).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig
from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES, replace_layer_number_by_wildcard

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf.cli import main as cli_main
from tests.training.distributed_worker import BATCH_ROWS, LEARNING_RATE, MODES, one_step, rank_batch

WORKER = Path(__file__).with_name("distributed_worker.py")
PRESETS = ["tiny", "tiny-moe"]
DENSE_AND_MOE_MODES = ("tp", "tp-sharded-projections", "fsdp", "hsdp")
FORWARD_CASES = [f"{mode}:{preset}" for mode in DENSE_AND_MOE_MODES for preset in PRESETS] + ["fsdp-ep:tiny-moe"]
STEP_CASES = [f"{mode}-step:{preset}" for mode in ("tp", "fsdp") for preset in PRESETS]
STEP_CASES += ["fsdp-ep-step:tiny-moe", "tp-sharded-projections-step:tiny"]
REFUSED_CASES = ["pp:tiny", "pp:tiny-moe", "fsdp-ep:tiny"]
LOGITS_ATOL = 1e-5
LOSS_ATOL = 1e-6
WEIGHTS_ATOL = 2e-6
OUTLIERS_ALLOWED = 1e-4  # share of weights that may differ by more than WEIGHTS_ATOL (gradients at Adam's eps)


# ------------------------------------------------------------------------------------------ plans (one process)
def model_names(config: HiResConfig) -> set[str]:
    """What transformers matches plan rules against: module and parameter names with layer numbers as `*`."""
    model = HiResForCausalLM(config).model
    names = [name for name, _ in model.named_modules()] + [name for name, _ in model.named_parameters()]
    return {replace_layer_number_by_wildcard(name) for name in names}


@pytest.mark.parametrize(
    "overrides", [{}, {"qk_norm": "per_head"}, {"qk_norm": "full"}], ids=["plain", "per-head-qk-norm", "full-qk-norm"]
)
@pytest.mark.parametrize("preset", PRESETS)
def test_each_variant_gets_a_plan_whose_rules_all_match(preset: str, overrides: dict) -> None:
    """No rule names a module the variant lacks (transformers warns on every load otherwise), all styles exist."""
    config = HiResConfig.from_preset(preset, **overrides)
    names = model_names(config)
    for plan in (config.base_model_tp_plan, config.base_model_ep_plan, config.base_model_fsdp_plan):
        assert set(plan) - names == set()
    for plan in (config.base_model_tp_plan, config.base_model_ep_plan):
        assert set(plan.values()) <= set(ALL_PARALLEL_STYLES)
    assert bool(config.base_model_ep_plan) == config.is_moe


def test_full_qk_norm_keeps_q_and_k_whole_on_every_rank() -> None:
    """OLMoE's norm spans all heads: q/k/v are gathered after the split, o_proj splits its replicated input."""
    plan = HiResConfig.from_preset("tiny-moe").base_model_tp_plan
    attention = {key.rsplit(".", 1)[1]: style for key, style in plan.items() if ".self_attn." in key}
    assert attention == {
        "q_proj": "colwise_gather_output",
        "k_proj": "colwise_gather_output",
        "v_proj": "colwise_gather_output",
        "o_proj": "rowwise_split_input",
    }


def test_plans_stay_out_of_the_saved_config(tmp_path: Path) -> None:
    """The plans are derived, never stored: a saved config.json holds none, a reloaded config derives them again."""
    config = HiResConfig.from_preset("tiny-moe")
    assert not [key for key in config.to_dict() if "plan" in key]
    config.save_pretrained(tmp_path)
    assert HiResConfig.from_pretrained(tmp_path).base_model_tp_plan == config.base_model_tp_plan


def test_pipeline_parallelism_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as error:
        HiResForCausalLM.prepare_distribute_model(DistributedConfig(pp_size=2))
    message = str(error.value)
    assert "\n" not in message and "pp_size=2" in message
    assert all(mode in message for mode in ("tp_plan", "fsdp_size", "dp_replicate_size", "ep_size"))


# ------------------------------------------------------------------------------------------ two processes
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor], str]:
    """Saved tiny models, the single-process references, and one torchrun launch running every case."""
    root = tmp_path_factory.mktemp("distributed")
    models, out = root / "models", root / "out"
    out.mkdir()
    input_ids = torch.randint(0, 512, (BATCH_ROWS, 16), generator=torch.Generator().manual_seed(0))
    references: dict[str, torch.Tensor] = {}
    for preset in PRESETS:
        torch.manual_seed(0)
        HiResForCausalLM(HiResConfig.from_preset(preset)).save_pretrained(models / preset)
        model = AutoModelForCausalLM.from_pretrained(models / preset)
        with torch.no_grad():
            references[preset] = model(input_ids=input_ids).logits
        references[f"{preset}-loss"] = one_step(model, input_ids)
        references[f"{preset}-params"] = {name: value.detach() for name, value in model.state_dict().items()}
    torch.save(input_ids, models / "batch.pt")

    # warnings on: a plan rule that matches nothing is a transformers warning on rank 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "warning"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
    command += [str(_free_port()), str(WORKER), str(models), str(out)]
    command += FORWARD_CASES + STEP_CASES + REFUSED_CASES
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return out, references, run.stderr


def _result(out: Path, case: str, rank: int) -> dict:
    return torch.load(out / f"{case}-rank{rank}.pt", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", FORWARD_CASES)
def test_logits_match_the_single_process_model(runs, case: str) -> None:
    out, references, _ = runs
    mode, _, preset = case.partition(":")
    data_parallel = MODES[mode][1]
    for rank in (0, 1):
        logits = _result(out, case, rank)["logits"]
        expected = rank_batch(references[preset], rank, 2, data_parallel)
        torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_tensor_parallelism_splits_the_layers_and_the_embedding_and_replicates_the_projections(runs, preset):
    """The default plan (docs/distributed.md): layers, the V x D embedding and the head split; read / write /
    read-out whole on every rank unless the user's tp_plan override splits them too."""
    out = runs[0]
    split = _result(out, f"tp:{preset}", 0)["split"]
    assert "model.embed_tokens.weight" in split and "lm_head.weight" in split
    assert "model.layers.0.self_attn.q_proj.weight" in split
    assert not [name for name in split if "read_proj" in name or "write_proj" in name or "read_out" in name]
    split = _result(out, f"tp-sharded-projections:{preset}", 0)["split"]
    for name in ("model.blocks.1.read_proj.weight", "model.blocks.1.write_proj.weight", "model.read_out.weight"):
        assert name in split


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_fsdp_gathers_a_layer_at_a_time(runs, preset: str) -> None:
    units = set(_result(runs[0], f"fsdp:{preset}", 0)["fsdp_units"])
    assert {"model.embed_tokens", "model.layers.3", "model.blocks.1", "model.read_out", "lm_head"} <= units


@pytest.mark.slow
@pytest.mark.parametrize("case", STEP_CASES)
def test_one_optimizer_step_matches_the_single_process_step(runs, case: str) -> None:
    """Same loss, same weights after one AdamW step, on both ranks (TP: the whole batch each; FSDP2: half each)."""
    out, references, _ = runs
    preset = case.partition(":")[2]
    expected = references[f"{preset}-params"]
    for rank in (0, 1):
        result = _result(out, case, rank)
        torch.testing.assert_close(result["loss"], references[f"{preset}-loss"], atol=LOSS_ATOL, rtol=0)
        assert result["params"].keys() == expected.keys()
        diffs = torch.cat([(result["params"][name] - value).abs().flatten() for name, value in expected.items()])
        assert diffs.max() <= LEARNING_RATE, f"a weight moved by more than one step: {diffs.max():.2e}"
        outliers = int((diffs > WEIGHTS_ATOL).sum())
        assert outliers <= OUTLIERS_ALLOWED * diffs.numel(), (
            f"{outliers} of {diffs.numel()} weights beyond {WEIGHTS_ATOL:g}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("case", [case for case in REFUSED_CASES if case.startswith("pp:")])
def test_pipeline_parallelism_is_refused_on_every_rank(runs, case: str) -> None:
    out, _, _ = runs
    for rank in (0, 1):
        error = _result(out, case, rank)["error"]
        assert error.startswith("HiRes does not support pipeline parallelism (pp_size=2)") and "\n" not in error


@pytest.mark.slow
def test_expert_parallelism_on_a_dense_model_is_refused(runs) -> None:
    """The dense variant has no expert plan: transformers refuses ep_size > 1 instead of ignoring it."""
    for rank in (0, 1):
        assert "has no `ep_plan`" in _result(runs[0], "fsdp-ep:tiny", rank)["error"]


@pytest.mark.slow
def test_no_plan_rule_matches_nothing(runs) -> None:
    """transformers warns about every rule that names no module; the plans derived per variant have none."""
    stderr = runs[2]
    assert "match nothing" not in stderr and "were not applied" not in stderr


# ------------------------------------------------------------------------------------------ hires-hf train
TRAIN_ARGS = ["--max-steps", "4", "--max-chars", "200000", "--vocab-size", "512", "--block-size", "32"]
TRAIN_ARGS += ["--eval-blocks", "8", "--lr", "3e-3", "--threads", "1", "--seed", "0"]


@pytest.mark.slow
def test_train_with_expert_parallelism_matches_one_process(tmp_path: Path, capsys) -> None:
    """`hires-hf train --fsdp --ep 2` on two processes (MoE experts split, FSDP2 for the rest) reaches the validation
    loss of one process seeing the same global batches, and saves a plain folder."""
    single = tmp_path / "single"
    assert (
        cli_main(["train", "--model", "tiny-moe", *TRAIN_ARGS, "--batch-size", "8", "--output-dir", str(single)]) == 0
    )
    capsys.readouterr()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
    command += [str(_free_port()), "-m", "hires_hf.cli", "train", "--model", "tiny-moe", *TRAIN_ARGS]
    command += ["--batch-size", "4", "--fsdp", "--ep", "2", "--tokenizer", str(single / "tokenizer")]
    command += ["--output-dir", str(tmp_path / "ep")]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]

    def final_loss(folder: Path) -> float:
        return json.loads((folder / "train_result.json").read_text())["final_eval_loss"]

    # the router's balance loss is computed per rank on half the batch: close, not identical, to one process's
    assert final_loss(tmp_path / "ep") == pytest.approx(final_loss(single), abs=2e-4)  # measured 2.4e-5
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ep" / "model")
    assert type(model).__name__ == "HiResForCausalLM" and model.config.num_experts == 8


@pytest.mark.parametrize(
    ("flags", "world", "message"),
    [
        (["--tp", "2"], "1", "--tp 2 must divide the number of processes (1)"),
        (["--tp", "2"], "4", "add --fsdp to shard the 2 tensor-parallel groups with FSDP2"),
        (["--ep", "2"], "2", "--ep 2 needs --fsdp or --tp"),
        (["--fsdp", "--ep", "3"], "2", "Cannot shard with fsdp_size=2, tp_size=None, ep_size=3"),
    ],
    ids=["tp-over-world", "tp-without-fsdp", "ep-alone", "ep-not-dividing"],
)
def test_train_refuses_a_layout_it_cannot_run_in_one_line(flags, world, message, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORLD_SIZE", world)
    assert cli_main(["train", *flags, "--output-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for CPU processes")
def test_train_refuses_tensor_parallelism_on_cpu(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["train", "--tp", "2", "--output-dir", str(tmp_path)]) == 2
    assert "Tensor parallelism in the Trainer needs GPUs" in capsys.readouterr().err
