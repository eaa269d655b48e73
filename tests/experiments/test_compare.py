"""`hires-hf compare` and the experiment harness under it: what a user asking "does HiRes pay on my data?"
relies on — the learning-rate grid brackets each architecture's best, every arm gets the same counted FLOPs,
the saved best models are the trained ones, and bad input is one line with nothing left behind."""

from __future__ import annotations

import json
import math

import pytest
from transformers import AutoModelForCausalLM, LlamaConfig

from hires_hf import HiResConfig
from hires_hf.cli import main
from hires_hf.experiments.compare import ArmResult, verdict
from hires_hf.experiments.harness import (
    CONTROL,
    Arm,
    Budget,
    Run,
    Shape,
    bracket_status,
    pending_rates,
    prepare_data,
    sweep_rates,
)
from hires_hf.training.loop import evaluate


def _fake_run(lr: float, best: float) -> Run:
    """A run whose final loss is a parabola in log-rate with its minimum at `best`."""
    loss = 3.0 + (math.log2(lr) - math.log2(best)) ** 2
    return Run("arm", lr, 0, 1, 1.0, loss, [(1.0, loss)], 0.0, 0.0, False)


@pytest.mark.parametrize(
    ("best", "tried", "status"),
    [
        (4e-3, [2e-3, 4e-3, 8e-3], "bracketed"),
        (2e-2, [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2], "bracketed"),  # extended upwards until the best is inside
        (1e-3, [5e-4, 1e-3, 2e-3, 4e-3], "bracketed"),  # and downwards (8e-3, past 4e-3's worse loss, is spared)
        (1.0, [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2], "high edge"),  # out of reach: flagged, not hidden
    ],
    ids=["inside", "above", "below", "unreachable"],
)
def test_the_grid_extends_until_the_best_rate_is_bracketed(best, tried, status):
    trained: list[float] = []

    def train(lr: float) -> Run:
        trained.append(lr)
        return _fake_run(lr, best)

    runs, found = sweep_rates(train, [2e-3, 4e-3, 8e-3])
    assert sorted(trained) == pytest.approx(tried)
    assert [run.lr for run in runs] == pytest.approx(tried)
    assert found == status == bracket_status({run.lr: run.final_loss for run in runs})


@pytest.mark.parametrize(
    ("losses", "todo"),
    [
        ({1.6e-2: 2.7, 3.2e-2: 4.3}, [8e-3]),  # HiRes past its rate's cliff: not 6.4e-2 but the low edge's extension
        ({3.2e-2: 4.3, 6.4e-2: 3.1}, [0.128]),  # and the other way round: not 1.6e-2
        ({3.2e-2: 4.3}, [1.6e-2, 6.4e-2]),  # one run closes no side: either neighbour may be the best
        ({1.6e-2: 2.8, 6.4e-2: 2.9}, [3.2e-2]),  # the rate between two tried ones may be the best
    ],
)
def test_a_grid_rate_past_a_side_the_tried_rates_already_close_is_not_trained(losses, todo):
    """A ladder's run costs hours: a grid rate that the rate curve's one minimum rules out is spared."""
    assert pending_rates([1.6e-2, 3.2e-2, 6.4e-2], losses, step=2.0) == pytest.approx(todo)


def test_every_arm_gets_the_same_counted_flops_hires_in_fewer_steps():
    data = prepare_data("stdlib", 300, 32, max_chars=100_000, validation_fraction=0.05, eval_blocks=4)
    shape = Shape(hidden_size=32, num_hidden_layers=4, layers_per_block=2, head_dim=16, vocab_size=300)
    arms = [Arm("hires"), Arm("control", CONTROL), Arm("D=4d", fields={"residual_ratio": 4.0})]
    budget = Budget(flops=2e9, batch_size=4)
    spent = {}
    for arm in arms:
        per_step = arm.flops_per_token(shape, data) * budget.batch_size * data.context
        steps = budget.steps(arm.flops_per_token(shape, data), data.context)
        spent[arm.name] = (steps, steps * per_step)
        assert budget.flops - per_step < steps * per_step <= budget.flops  # as many whole steps as fit
    assert spent["control"][0] > spent["hires"][0] > spent["D=4d"][0]
    assert arms[2].config(shape, data).residual_size == 128


def test_a_users_config_keeps_its_fields_and_a_factor_changes_only_its_own():
    config = HiResConfig.from_preset("tiny", write_mode="delta", num_key_value_heads=1)
    shape = Shape.from_config(config)
    special = {"pad_token_id": 0, "bos_token_id": None, "eos_token_id": 0}
    rebuilt = shape.config(special, 64)
    assert (rebuilt.write_mode, rebuilt.num_key_value_heads, rebuilt.residual_size) == ("delta", 1, 128)
    wider = shape.config(special, 64, residual_size=256)
    assert (wider.residual_size, wider.write_mode, wider.hidden_size) == (256, "delta", 64)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "result"
    code = main(["compare", "--model", "tiny", "--smoke", "--seeds", "2", "--quiet", "--out", str(out)])
    assert code == 0
    return out, json.loads((out / "compare.json").read_text())


def test_compare_writes_a_verdict_every_run_a_plot_and_the_best_models(compared, capsys):
    out, summary = compared
    assert {"hires", "control"} == set(summary["arms"])
    for name, arm in summary["arms"].items():
        runs = [r for r in summary["runs"] if r["arm"] == name]
        assert {r["lr"] for r in runs if r["seed"] == 0} >= {2e-3, 4e-3}
        assert sorted(r["seed"] for r in runs if r["lr"] == arm["best_lr"]) == [0, 1]
        best = min((r for r in runs if r["seed"] == 0), key=lambda r: r["final_loss"])
        assert arm["best_lr"] == best["lr"]
    verdict = summary["verdict"]
    assert verdict["gap"] == pytest.approx(
        summary["arms"]["hires"]["mean_loss"] - summary["arms"]["control"]["mean_loss"]
    )
    assert (out / "loss_vs_flops.png").stat().st_size > 10_000
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "control", "hires", "loss_vs_flops.png"]


def test_the_saved_best_models_are_the_trained_ones_control_scale_included(compared):
    out, summary = compared
    data = prepare_data("stdlib", 512, 32, max_chars=200_000, eval_blocks=4)
    for name in ("hires", "control"):
        model = AutoModelForCausalLM.from_pretrained(out / name)
        best = next(
            r
            for r in summary["runs"]
            if r["arm"] == name and r["seed"] == 0 and r["lr"] == summary["arms"][name]["best_lr"]
        )
        assert evaluate(model, data.validation, 16) == pytest.approx(best["final_loss"], abs=1e-4)


def test_compare_on_a_users_jsonl(tmp_path, capsys):
    rows = [{"text": f"def f{i}(x):\n    return x * {i} + {i % 7}\n" * 20} for i in range(300)]
    data = tmp_path / "mine.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows))
    assert main(["compare", "--data", str(data), "--model", "tiny", "--smoke", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "| hires |" in printed and "| control |" in printed
    assert any(word in printed.splitlines()[-1] for word in ("HiRes ends", "beats", "trails", "within seed noise"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "no/such/file.jsonl"], "no/such/file.jsonl"),
        (["--budget-flops", "1"], "less than one step"),
        (["--model", "LLAMA"], "not HiRes"),
        (["--model", "no-such-preset"], "neither a preset"),
    ],
    ids=["no-data", "budget-too-small", "not-hires", "unknown-model"],
)
def test_bad_input_is_one_line_and_leaves_nothing(args, message, tmp_path, capsys):
    llama = tmp_path / "llama"
    LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2).save_pretrained(llama)
    args = [str(llama) if a == "LLAMA" else a for a in args]
    out = tmp_path / "out"
    assert main(["compare", "--model", "tiny", "--smoke", "--quiet", "--out", str(out), *args]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not out.exists()
    assert not list(tmp_path.glob(".compare-*"))


def _arm(name: str, losses: list[float]) -> ArmResult:
    runs = [
        Run(name, 1e-3, seed, 10, 1.0, loss, [(1.0, loss + 1), (2.0, loss)], 0.0, 0.0, False)
        for seed, loss in enumerate(losses)
    ]
    return ArmResult(name, runs, "bracketed")


@pytest.mark.parametrize(
    ("hires", "control", "winner"),
    [
        ([3.00, 3.02], [3.20, 3.22], "hires"),
        ([3.30, 3.32], [3.00, 3.04], "control"),
        ([3.00, 3.20], [3.05, 3.25], None),  # the gap is inside the seeds' spread
        ([3.00], [3.50], None),  # one seed: no spread to judge by
    ],
    ids=["hires-wins", "control-wins", "noise", "one-seed"],
)
def test_a_winner_is_named_only_beyond_the_seed_spread(hires, control, winner):
    found = verdict({"hires": _arm("hires", hires), "control": _arm("control", control)})
    assert found["winner"] == winner
    assert found["gap"] == pytest.approx(sum(hires) / len(hires) - sum(control) / len(control))


def test_a_budget_under_the_noise_floor_gets_one_warning_line_with_the_minimum():
    from hires_hf.experiments.compare import NoiseFloor, floor_warning

    floor = NoiseFloor(shape="96x12", tokens=8e6, nats=0.02, spread=0.015, reached=True)
    line = floor_warning(1e6, floor)
    assert line is not None and "\n" not in line
    assert "8e+06 tokens" in line and "96x12" in line and "Python sources" in line
    assert floor_warning(8e6, floor) is None and floor_warning(1e6, None) is None
    unreached = floor_warning(1e6, NoiseFloor("96x12", 4e6, 0.02, 0.05, reached=False))
    assert "still 0.050 nats apart at 4M tokens" in unreached


def test_the_warning_quotes_the_floor_the_ladder_last_measured():
    """`compare` warns with the floor of the ladder's committed report, not an older corpus's."""
    from pathlib import Path

    from hires_hf.experiments.compare import NOISE_FLOOR

    floor = json.loads((Path(__file__).parents[2] / "benchmarks/results/ladder/summary.json").read_text())["floor"]
    measured = [length for length in floor["lengths"] if length["spread"] is not None]
    reached = floor["floor_tokens"] is not None
    assert NOISE_FLOOR.shape == floor["shape"] and NOISE_FLOOR.nats == floor["floor_nats"]
    assert NOISE_FLOOR.reached == reached
    if reached:
        assert NOISE_FLOOR.tokens == floor["floor_tokens"]
    else:
        assert NOISE_FLOOR.tokens == measured[-1]["tokens"]
        assert NOISE_FLOOR.spread == pytest.approx(measured[-1]["spread"], abs=5e-4)
