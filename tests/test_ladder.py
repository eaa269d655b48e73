"""The scaling ladder (`hires-hf ladder`) and the benchmarks' quality half built on it.

A smoke ladder must produce a RUNS file that `hires-hf scaling` reads and fits, with each size's HiRes / twin
pair at equal counted FLOPs; bad input must fail as one line before any training.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import hires_hf.cli as cli
from hires_hf.errors import HiResUserError
from hires_hf.eval.scaling import analyse, read_runs
from hires_hf.training.ladder import (
    LadderSettings,
    best_rates,
    budget_of,
    budgets,
    build_rungs,
    make_rung,
    plan_jobs,
    run_ladder,
    time_scale,
)


def hires_hf(argv: list[str]) -> int:
    """`hires-hf ARGV` in this process."""
    return cli.main(argv)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> Path:
    """A smoke ladder (2 sizes x 2 archs x 2 seeds) through the real command line."""
    out = tmp_path_factory.mktemp("ladder") / "runs.jsonl"
    threads = torch.get_num_threads()
    code = hires_hf(["ladder", "--smoke", "--seeds", "2", "--quiet", "--out", str(out)])
    assert torch.get_num_threads() == threads  # the ladder's one thread does not leak into the caller
    assert code == 0
    return out


@pytest.mark.slow
def test_smoke_ladder_writes_runs_that_scaling_fits(smoke_runs):
    runs = read_runs(smoke_runs)
    assert {(run.arch, len({r.flops for r in runs if r.arch == run.arch})) for run in runs} == {
        ("hires", 2),
        ("vanilla", 2),
    }
    report = analyse(runs, bootstrap=20)
    assert set(report.fits) == {"hires", "vanilla"}
    (multiplier,) = report.multipliers
    assert multiplier.value > 0 and multiplier.ci_low <= multiplier.ci_high


@pytest.mark.slow
def test_each_pair_spends_the_same_counted_flops(smoke_runs):
    import json

    records = [json.loads(line) for line in smoke_runs.read_text().splitlines()]
    assert len(records) == 2 * 2 * 2
    pairs: dict[tuple[str, int], dict[str, dict]] = {}
    for record in records:
        pairs.setdefault((record["size"], record["seed"]), {})[record["arch"]] = record
    for pair in pairs.values():
        hires, vanilla = pair["hires"], pair["vanilla"]
        assert hires["budget_flops"] == vanilla["budget_flops"]
        for record in (hires, vanilla):  # the budget, to within one optimizer step
            step = record["flops_per_token"] * record["batch_size"] * record["block_size"]
            assert record["budget_flops"] - step < record["flops"] <= record["budget_flops"]
        assert hires["flops_per_token"] > vanilla["flops_per_token"]
        assert hires["tokens"] < vanilla["tokens"]  # HiRes pays for its projections with tokens
        assert hires["curve"][-1][1] == pytest.approx(hires["loss"])
    sizes = sorted({r["size"] for r in records}, key=lambda s: pairs[s, 0]["vanilla"]["flops_per_token"])
    assert pairs[sizes[0], 0]["vanilla"]["budget_flops"] < pairs[sizes[1], 0]["vanilla"]["budget_flops"]


def test_each_architecture_trains_at_its_own_learning_rate(tmp_path):
    out = tmp_path / "runs.jsonl"
    assert hires_hf(["ladder", "--smoke", "--quiet", "--lr", "3e-3", "--hires-lr", "1e-3", "--out", str(out)]) == 0
    import json

    rates = {(r["arch"], r["learning_rate"]) for r in map(json.loads, out.read_text().splitlines())}
    assert rates == {("hires", 1e-3), ("vanilla", 3e-3)}


@pytest.mark.slow
def test_the_baseline_is_the_control_and_plain_twin_adds_a_second_row(smoke_runs, tmp_path):
    out = tmp_path / "runs.jsonl"
    assert hires_hf(["ladder", "--smoke", "--seeds", "2", "--quiet", "--plain-twin", "--out", str(out)]) == 0

    def by_run(path: Path) -> dict:
        return {(r["arch"], r["size"], r["seed"]): r for r in map(json.loads, path.read_text().splitlines())}

    default, with_plain = by_run(smoke_runs), by_run(out)
    assert with_plain.keys() == default.keys() | {("plain-twin", size, seed) for _, size, seed in default}
    for key, run in default.items():  # the same runs: same seed, batches and loss
        assert with_plain[key]["loss"] == pytest.approx(run["loss"], rel=1e-6)
        # the baseline's embeddings enter 1/initializer_range = 50x larger (the control); HiRes has no hook
        assert run["twin_embedding_multiplier"] == (pytest.approx(50.0) if key[0] == "vanilla" else None)
    for (arch, size, seed), run in with_plain.items():
        if arch == "plain-twin":  # transformers' twin as it ships: same layers and FLOPs, trains differently
            control = default["vanilla", size, seed]
            assert run["twin_embedding_multiplier"] is None and run["flops"] == control["flops"]
            assert run["loss"] != control["loss"]  # 3 smoke steps: different, if only a little
    from benchmarks.ladder_summary import summary  # the RESULTS section says what the baseline is

    text = summary(out, "control", "cmd")
    assert "`vanilla` is the control: the Llama twin with its embeddings multiplied by 50" in text
    assert "`plain-twin` is transformers' twin as it ships" in text


def test_ladder_and_compare_build_the_same_config_for_the_same_shape():
    """One shape rule: "DxL" gives the config `hires-hf compare --model DxL` trains (SwiGLU rounding included)."""
    from hires_hf.experiments.compare import load_hires_config

    settings = LadderSettings(layers_per_block=4, head_dim=64, width_factor=2, vocab_size=4096, block_size=1024)
    for spec in ("128x16", "192x8", "320x8"):
        ladder, compare = make_rung(spec, settings, None).hires, load_hires_config(spec)
        assert ladder.to_dict() == compare.to_dict(), spec
    assert make_rung("192x8", settings, None).hires.intermediate_size == 512  # ~8d/3 rounded up to a multiple of 8


def test_sweep_runs_shorter_than_the_floor_are_refused_in_one_line(monkeypatch):
    """A sweep chooses rates only from runs of at least MIN_STEPS steps (the GPU ladder's sweep once ran 26): a
    timed ladder that leaves fewer refuses before training."""
    from hires_hf.training import ladder

    monkeypatch.setattr(ladder, "time_train_step", lambda *args: 1.0)  # 1 s a step: 10 minutes buy a few steps
    settings = LadderSettings(sizes=("32x2", "64x4"), seeds=1, budget_minutes=10)
    rungs = build_rungs(settings)
    with pytest.raises(HiResUserError, match=f"at least {ladder.MIN_STEPS} needed: a sweep chooses rates") as error:
        ladder.plan_scale(rungs, plan_jobs(rungs, settings), settings, torch.device("cpu"), spent=0.0, progress=False)
    assert "\n" not in str(error.value) and ladder.MIN_STEPS >= 80


def test_timed_budget_fits_the_wall_clock():
    """The planned runs' predicted seconds add up to the budget left after the reserve and overheads."""
    from hires_hf.training import ladder

    settings = LadderSettings(sizes=("32x2", "64x4"), seeds=2, budget_minutes=10, lr_sweep=())
    rungs = build_rungs(settings)
    jobs = plan_jobs(rungs, settings)
    timings = {(rung.name, arch): 0.01 * rung.flops_per_token[arch] / 1e5 for rung in rungs for arch in ladder.ARCHS}
    scale = time_scale(jobs, settings, timings, spent=30.0)
    tokens_per_step = settings.batch_size * settings.block_size
    predicted = sum(
        budget_of(job.rung, scale)
        / (job.rung.flops_per_token[job.arch] * tokens_per_step)
        * timings[job.rung.name, job.arch]
        for job in jobs
    )
    expected = settings.budget_minutes * 60 * (1 - ladder.RESERVE) - 30.0 - len(jobs) * ladder.RUN_OVERHEAD_SECONDS
    assert len(jobs) == len(rungs) * 2 * settings.seeds
    assert predicted == pytest.approx(expected)
    low, high = budgets(rungs, scale)
    ratio = rungs[1].flops_per_token["vanilla"] / rungs[0].flops_per_token["vanilla"]
    assert high / low == pytest.approx(ratio**2)  # tokens grow in proportion to the model's cost


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "64x4"], "at least 2 sizes"),
        (["--sizes", "32x4", "64x3"], "do not split into blocks"),
        (["--sizes", "40x4", "64x4"], "multiple of 16"),
        (["--sizes", "huge", "64x4"], "expected DxL"),
        (["--sizes", "64x4", "64x4"], "each size once"),
        (["--seeds", "0"], "--seeds"),
        (["--budget-minutes", "0"], "--budget-minutes"),
        (["--width-factor", "0"], "--width-factor"),
        (["--hires-lr", "0"], "--hires-lr"),
    ],
    ids=[
        "one-size",
        "L-not-multiple-of-k",
        "width-not-heads",
        "unparseable",
        "duplicate",
        "seeds",
        "budget",
        "width",
        "hires-lr",
    ],
)
def test_bad_input_is_one_line(argv, message, capsys, tmp_path):
    code = hires_hf(["ladder", "--quiet", "--out", str(tmp_path / "runs.jsonl"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "runs.jsonl").exists()


@pytest.mark.slow
def test_too_small_a_budget_says_how_to_fix_it(tmp_path):
    settings = replace(LadderSettings.smoke(), smoke_steps=None, budget_minutes=0.01)
    with pytest.raises(HiResUserError, match="raise the budget"):
        run_ladder(settings, tmp_path / "runs.jsonl", progress=False)


@pytest.mark.slow
def test_quality_half_renders_a_section_from_runs(smoke_runs, tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import cli as bench_cli
    from benchmarks import quality, report

    # The smoke ladder's records with losses planted on two exact power laws: HiRes reaches at C the loss
    # vanilla reaches at 2C, so the section must report a multiplier of 2 (CI 2-2: no noise to resample).
    records = [json.loads(line) for line in smoke_runs.read_text().splitlines()]
    for record in records:
        record["loss"] = 10.0 * (record["flops"] * (2.0 if record["arch"] == "hires" else 1.0)) ** -0.1
    planted = tmp_path / "planted.jsonl"
    planted.write_text("".join(json.dumps(record) + "\n" for record in records))
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    args = parser.parse_args(["--only", "quality", "--quality-runs", str(planted), "--quiet"])
    results = tmp_path / "results"
    quality.run(args, results)
    text = (results / "quality.md").read_text()
    assert text.startswith("## Quality half")
    assert "FLOPs-efficiency multiplier of hires over vanilla at C=" in text
    assert "2.000x (95% CI 2.000-2.000)" in text, text
    for name in (quality.CURVES_PNG, quality.FIT_PNG):
        assert f"](results/{name})" in text
        assert (results / name).read_bytes()[:4] == b"\x89PNG"
    assert "## Quality half" in report.write_results(tmp_path).read_text()


# ---------------------------------------------------------------------------------------------------- GPU preset
@pytest.fixture(scope="module")
def gpu_smoke_runs(tmp_path_factory) -> Path:
    """The GPU preset's protocol at smoke size on the CPU: sweep, width rule, MoE point, rule check."""
    out = tmp_path_factory.mktemp("gpu-ladder") / "runs.jsonl"
    assert hires_hf(["ladder", "--preset", "gpu", "--smoke", "--quiet", "--out", str(out)]) == 0
    return out


def test_gpu_preset_plans_sweep_then_ladder_then_moe_and_rule_check():
    settings = LadderSettings.gpu()
    rungs = build_rungs(settings)
    widths = [rung.hires.hidden_size for rung in rungs]
    assert widths == sorted(widths) and len(set(widths)) == len(widths) >= 4
    assert all(rung.hires.head_dim == 64 and rung.hires.layers_per_block == 4 for rung in rungs)
    non_embedding = [rung.hires.num_hidden_layers * 12 * rung.hires.hidden_size**2 for rung in rungs]
    assert 4e6 < non_embedding[0] and non_embedding[-1] < 1.5e8  # ~5M to ~100M non-embedding parameters
    assert non_embedding[-1] / non_embedding[0] > 10  # a ladder wide enough to fit an exponent on
    moe = make_rung(settings.moe_size, settings, None, moe=True)
    jobs = plan_jobs(rungs, settings, moe)
    roles = [job.role for job in jobs]
    # first the learning-rate sweep (both archs, every rate), last the check of the carried rate (x2 and /2 for
    # both archs), one MoE pair
    sweeps = 2 * len(settings.lr_sweep)
    assert roles[:sweeps] == ["sweep"] * sweeps and roles[-4:] == ["rate-check"] * 4 and roles.count("moe") == 2
    names = [rung.name for rung in rungs]
    assert {job.rung.name for job in jobs if job.role == "sweep"} == {names[0]}  # swept at the smallest rung
    # every rung at seed 0 (the smallest through its sweep's winner), the two smallest at a second seed too
    trained = {(job.rung.name, job.seed) for job in jobs if job.role == "ladder"} | {(names[0], 0)}
    assert trained == {(name, 0) for name in names} | {(name, 1) for name in names[:2]}
    assert moe.vanilla.model_type == "olmoe" and moe.hires.num_experts > 0


def test_gpu_smoke_ladder_carries_the_best_bracketed_rate_up_unchanged_and_fits(gpu_smoke_runs):
    records = [json.loads(line) for line in gpu_smoke_runs.read_text().splitlines()]
    best = best_rates(records)
    assert set(best) == {"hires", "vanilla"}
    for arch in best:  # each sweep extended past its grid (1e-3, 3e-3) until bracketed, or says where it stopped
        swept = sorted(r["learning_rate"] for r in records if r["role"] == "sweep" and r["arch"] == arch)
        statuses = {r["bracket"] for r in records if r["role"] == "sweep" and r["arch"] == arch}
        assert len(statuses) == 1 and len(swept) >= 2
        if statuses == {"bracketed"}:
            assert swept[0] < best[arch] < swept[-1]
        else:
            assert len(swept) == 2 + 3  # the grid and every extension the harness allows
    for record in records:
        if record["role"] in ("ladder", "moe"):  # no 1/width rule on top of the write multiplier's own
            assert record["learning_rate"] == best[record["arch"]]
        if record["role"] == "rate-check":
            assert record["learning_rate"] in (pytest.approx(best[record["arch"]] * 2), best[record["arch"]] / 2)
    fitted = {(r["size"], r["arch"]) for r in records if r["fit"]}
    assert fitted == {(size, arch) for size in ("16x2", "32x2") for arch in ("hires", "vanilla")}
    runs = read_runs(gpu_smoke_runs)  # sweep losers, the rule check and the MoE point stay out of the fit
    assert len(runs) == 4
    assert len(analyse(runs, bootstrap=10).multipliers) == 1
    moe = [r for r in records if r["role"] == "moe"]
    assert {r["model_type"] for r in moe} == {"hires", "olmoe"} and all(math.isfinite(r["loss"]) for r in moe)


def test_a_failing_run_is_recorded_and_the_ladder_goes_on(tmp_path, monkeypatch):
    from hires_hf.training import ladder

    real = ladder.train_one

    def flaky(job, *args, **kwargs):
        if job.arch == "hires" and job.rung.name == "32x2":
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(job, *args, **kwargs)

    monkeypatch.setattr(ladder, "train_one", flaky)
    records = run_ladder(LadderSettings.smoke(), tmp_path / "runs.jsonl", progress=False)
    failed = [r for r in records if "error" in r]
    assert len(records) == 4 and len(failed) == 1 and "out of memory" in failed[0]["error"]
    assert len(read_runs(tmp_path / "runs.jsonl")) == 3  # the failed run is kept but never fitted
