"""The compute ladder and the run store under it: what a researcher resuming a days-long ladder relies on.

Every stage is a plan over stored runs: brackets are extended until the best rate is inside, every arm gets a
second seed at its best rate below the top, the top rung starts from the rate carried over and seeds the vanillas
and the best HiRes, a stopped ladder trains nothing twice, a dead worker's claim is taken over, and a changed
default can never reuse a stored cell.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from hires_hf import configuration_hires
from hires_hf.experiments import harness
from hires_hf.experiments import ladder as ladder_module
from hires_hf.experiments.harness import Arm, Budget, Run, RunStore, Shape, plan_run, tidy_rate
from hires_hf.experiments.ladder import (
    MOST_SEEDS,
    SQRT2,
    LadderSettings,
    claim,
    ladder_arms,
    open_ladder,
    record_corpus,
    recorded_data,
    run_stages,
    top_grid,
)
from hires_hf.experiments.ladder_report import (
    budget,
    budget_table,
    gap_trend,
    gap_trend_half_width,
    kernels,
    rate_tables,
    share_to_reach,
    summarize,
    write_report,
)
from hires_hf.experiments.runs import keyed_as, stored_versions
from hires_hf.experiments.seed_noise import pooled, welch_half_width
from hires_hf.training.bf16_emulation import EMULATED, NATIVE

# Each arm's (made-up) best rate and best loss: final loss is a parabola in log2(rate) around it.
OPTIMA = {
    "control": (8e-3, 3.0),
    "plain-twin": (2e-3, 3.1),
    "hires": (1.6e-2, 3.05),
    "D=4d": (8e-3, 3.2),
    "k=2": (4e-3, 3.02),
}


@pytest.fixture(scope="module")
def smoke_settings() -> LadderSettings:
    return LadderSettings.smoke()


@pytest.fixture
def fake_ladder(tmp_path, monkeypatch, smoke_settings):
    """A smoke ladder whose runs are not trained: `execute` stores a run with the parabola's loss."""
    ladder = open_ladder(smoke_settings, tmp_path, progress=False)
    trained = []
    seed_effect = {"nats": 0.001}  # what one seed step adds to the loss: a test raises it (or one arm's) for noise

    def fake_execute(plan, data, device="cpu", store=None, keep=None, **hooks):
        best_lr, best_loss = OPTIMA[plan.arm.name]
        lr, seed = plan.settings.learning_rate, plan.settings.seed
        size = plan.budget.flops / 1e9
        distance = math.log2(lr) - math.log2(best_lr)
        per_seed = seed_effect.get(plan.arm.name, seed_effect["nats"])
        loss = best_loss - 0.1 * math.log(size) + 0.05 * distance**2 + per_seed * seed
        run = Run(plan.arm.name, lr, seed, plan.settings.steps, 1.0, loss, [(plan.budget.flops, loss)], 1.0, 1.0, False)
        run.key, run.spec = plan.key, plan.spec
        store.put(run)
        trained.append(plan)
        return run

    monkeypatch.setattr(ladder_module, "execute", fake_execute)
    ladder.seed_effect = seed_effect
    return ladder, trained


def test_every_stage_brackets_carries_over_and_seeds_the_arms_that_matter(fake_ladder):
    ladder, trained = fake_ladder
    run_stages(ladder, ["grid", "top"], progress=False, log=lambda line: None)
    rungs = ladder.rungs
    for rung in rungs[:-1]:  # every arm's grid at the smaller rungs holds its best rate with a worse one either side
        for arm in ladder.settings.arms:
            rates = sorted(p.settings.learning_rate for p in trained if p.shape == rung.shape and p.arm.name == arm)
            best = OPTIMA[arm][0]
            assert any(math.isclose(r, best) for r in rates), (arm, rates)
            assert rates[0] < best < rates[-1], (arm, rates)
        seeded = {(p.arm.name, p.settings.learning_rate) for p in trained if p.shape == rung.shape and p.settings.seed}
        assert seeded == {(arm, OPTIMA[arm][0]) for arm in ladder.settings.arms}  # a second seed at each best
    top = [p for p in trained if p.shape == rungs[-1].shape]
    for arm in ladder.settings.arms:
        best = OPTIMA[arm][0]  # the top starts at the carried-over rate and x sqrt(2) either side
        rates = {p.settings.learning_rate for p in top if p.arm.name == arm and p.settings.seed == 0}
        assert set(top_grid(best)) <= rates
        steps = [math.log(r / best) / math.log(SQRT2) for r in rates]
        assert all(abs(step - round(step)) < 1e-3 for step in steps), rates  # on the sqrt(2) grid
    seeded = {(p.arm.name, p.settings.learning_rate) for p in top if p.settings.seed == 1}
    vanillas = {("control", OPTIMA["control"][0]), ("plain-twin", OPTIMA["plain-twin"][0])}
    assert seeded == vanillas | {("hires", OPTIMA["hires"][0])}  # either vanilla can be the top's baseline


def test_more_seeds_where_runs_are_cheap_are_trained_at_every_best_and_all_reported(fake_ladder):
    """`--seeds 3` (a GPU's noisier runs): three seeds at each arm's best rate below the top, and at the top for
    both vanillas and the best HiRes; the report's means and spreads are over all of them."""
    ladder, _ = fake_ladder
    ladder.settings = replace(ladder.settings, rung_seeds=3, top_seeds=3)
    run_stages(ladder, ["grid", "top"], progress=False, log=lambda line: None)
    summary = summarize(ladder)
    for rung in summary["rungs"][:-1]:
        assert {name: cell["seeds"] for name, cell in rung["arms"].items()} == dict.fromkeys(ladder.settings.arms, 3)
    top = summary["rungs"][-1]["arms"]
    assert {name: cell["seeds"] for name, cell in top.items()} == {"control": 3, "plain-twin": 3, "hires": 3}
    assert top["hires"]["seed_spread"] == pytest.approx(2 * ladder.seed_effect["nats"])


def test_the_top_rung_can_be_given_more_seeds_than_the_rungs_below(fake_ladder, capsys):
    """`--top-seeds`: the verdict is the top rung's gap, and on a GPU whose seeds spread 0.03-0.08 nats it wants more
    seeds than the rungs below need to carry a rate over."""
    from hires_hf.cli import main

    ladder, _ = fake_ladder
    folder = str(ladder.store.folder.parent)
    ask = ["ladder", "--smoke", "--quiet", "--out", folder, "--stages", "grid", "top", "--seeds", "2"]
    assert main([*ask, "--top-seeds", "4"]) == 0
    ladder.store.refresh()
    rungs = summarize(ladder)["rungs"]
    assert {cell["seeds"] for rung in rungs[:-1] for cell in rung["arms"].values()} == {2}
    assert {name: cell["seeds"] for name, cell in rungs[-1]["arms"].items()} == dict.fromkeys(
        ["control", "plain-twin", "hires"], 4
    )
    assert main([*ask, "--top-seeds", "0"]) == 2
    assert "--top-seeds 0" in capsys.readouterr().err


def test_a_ladder_trains_and_reports_the_arms_it_is_given(fake_ladder, capsys):
    """`--arms`: a variant (another block size, say) joins the ladder as an arm of its own, with its own brackets,
    and the report shows it; a list that cannot give a verdict is refused in one line, nothing trained."""
    from hires_hf.cli import main
    from hires_hf.commands.ladder import worker_command

    ladder, trained = fake_ladder
    folder = str(ladder.store.folder.parent)
    ask = ["ladder", "--smoke", "--quiet", "--out", folder, "--stages", "grid"]
    assert main([*ask, "--arms", "control", "hires", "k=2"]) == 0
    assert {p.arm.name for p in trained} == {"control", "hires", "k=2"}
    k2 = sorted(p.settings.learning_rate for p in trained if p.arm.name == "k=2" and p.shape == ladder.rungs[0].shape)
    assert k2[0] < OPTIMA["k=2"][0] < k2[-1]  # bracketed on its own
    ladder.store.refresh()
    ladder.settings = replace(ladder.settings, arms=("control", "hires", "k=2"))
    assert "k=2" in summarize(ladder)["rungs"][0]["arms"]
    count = len(trained)
    for arms, named in (
        (["control", "k=7"], "k=7"),
        (["hires", "k=2"], "vanilla"),
        (["control", "hires", "hires"], "twice"),
    ):
        assert main([*ask, "--arms", *arms]) == 2
        error = capsys.readouterr().err.strip()
        assert named in error and len(error.splitlines()) == 1
    assert len(trained) == count
    args = argparse.Namespace(
        stages=["grid"],
        out=Path(folder),
        smoke=True,
        device=None,
        precision=None,
        compile=None,
        arms=["control", "k=2"],
        seeds=None,
        top_seeds=None,
        checkpoint_minutes=None,
    )
    command = worker_command(args, 1, math.inf)  # each of --workers' processes trains the same arms
    assert command[command.index("--arms") + 1 :][:2] == ["control", "k=2"]


def test_a_stopped_ladder_trains_nothing_twice(fake_ladder):
    ladder, trained = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    count = len(trained)
    run_stages(ladder, ["grid", "top"], progress=False, log=lambda line: None)  # resumed with one more stage
    assert len({p.key for p in trained}) == len(trained)  # no key trained twice
    assert len(trained) > count


def test_a_run_another_worker_finished_since_the_plan_was_read_is_not_trained_again(fake_ladder, monkeypatch):
    """Between reading the open runs and claiming one, another worker may finish that run and release its claim:
    the claim is free again, and only the store can tell it is done (six workers on one GPU trained a run twice)."""
    ladder, trained = fake_ladder
    real_open_runs = ladder_module.open_runs
    raced = {}

    def stale_open_runs(ladder_, stages):
        plans = real_open_runs(ladder_, stages)
        if not raced and plans:  # the other worker, with its own store on the same folder, ends the first run now
            first = plans[0]
            raced["key"] = first.key
            ladder_module.execute(first, ladder_.data, store=RunStore(ladder_.store.folder))
        return plans

    monkeypatch.setattr(ladder_module, "open_runs", stale_open_runs)
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    assert [plan.key for plan in trained].count(raced["key"]) == 1  # the other worker's, and no second
    assert len({plan.key for plan in trained}) == len(trained)
    assert not list((ladder.store.folder / "claims").iterdir())  # the claim taken and found done was let go


def test_a_worker_on_a_held_machine_starts_no_run_after_its_time(fake_ladder, monkeypatch):
    """On a machine held for a fixed time, a worker finishes the run in hand and then stops claiming: the runs it
    did not start stay open for the next worker instead of being lost half-trained."""
    from hires_hf.experiments.ladder import open_runs

    ladder, trained = fake_ladder
    clock = {"now": 0.0}
    monkeypatch.setattr(
        ladder_module,
        "time",
        SimpleNamespace(
            time=lambda: clock["now"],
            sleep=time.sleep,
            perf_counter=time.perf_counter,
            strftime=time.strftime,
            localtime=time.localtime,
        ),
    )
    execute = ladder_module.execute

    def slow_execute(*args, **kwargs):
        clock["now"] += 60.0  # each run takes a minute
        return execute(*args, **kwargs)

    monkeypatch.setattr(ladder_module, "execute", slow_execute)
    first = run_stages(ladder, ["grid"], progress=False, log=lambda line: None, claim_until=90.0)
    assert len(first) == 2  # started at 0 s and 60 s; at 120 s its time was up
    assert open_runs(ladder, ["grid"])  # the rest is left for the next worker
    rest = run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    assert not open_runs(ladder, ["grid"]) and len({p.key for p in trained}) == len(first) + len(rest)


def test_a_run_already_begun_is_finished_before_any_new_run_starts(fake_ladder):
    """On cores where one run spans several sessions, a worker that started new runs first would leave every run
    half done: a planned run with a stored checkpoint is claimed before any run in plan order."""
    from hires_hf.experiments.ladder import open_runs

    ladder, _ = fake_ladder
    planned = open_runs(ladder, ["grid"])
    begun = planned[-1]
    checkpoint = ladder.store.checkpoint(begun.key)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_bytes(b"")
    reordered = open_runs(ladder, ["grid"])
    assert reordered[0].key == begun.key
    assert [p.key for p in reordered[1:]] == [p.key for p in planned[:-1]]  # the rest keeps its plan order


def _floor_lengths_trained(ladder, trained) -> list[float]:
    s, control = ladder.settings, Arm("control", "control")
    rung = ladder.rungs[s.floor_rung]
    per_token = control.flops_per_token(rung.shape, ladder.data)
    grid = {p.settings.learning_rate for p in trained if math.isclose(p.budget.flops, s.floor_grid_tokens * per_token)}
    assert min(grid) < OPTIMA["control"][0] < max(grid)  # bracketed at the floor's grid length
    lengths = []
    for tokens in s.floor_tokens:
        plans = [ladder.plan(control, rung, OPTIMA["control"][0], seed, tokens * per_token) for seed in range(3)]
        stored = [ladder.store.get(plan.key) is not None for plan in plans]
        if any(stored):
            assert stored == [seed < s.floor_seeds for seed in range(3)], tokens  # every seed, at the best rate
            lengths.append(tokens)
    return lengths


def test_the_floor_stage_stops_at_the_first_length_under_the_floor(fake_ladder):
    ladder, trained = fake_ladder  # seeds 0.001 nats apart: the shortest length is already under FLOOR_NATS
    run_stages(ladder, ["floor"], progress=False, log=lambda line: None)
    assert _floor_lengths_trained(ladder, trained) == [ladder.settings.floor_tokens[0]]


def test_a_noisy_floor_seeds_every_length(fake_ladder):
    ladder, trained = fake_ladder
    ladder.seed_effect["nats"] = 0.05  # spread 0.05 at every length: none reaches the floor
    run_stages(ladder, ["floor"], progress=False, log=lambda line: None)
    assert _floor_lengths_trained(ladder, trained) == list(ladder.settings.floor_tokens)
    assert summarize(ladder)["floor"]["floor_tokens"] is None


def test_each_rung_grid_is_centred_on_the_best_rate_of_the_rung_below(fake_ladder):
    ladder, trained = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    middle = ladder.rungs[1].shape
    for arm in ladder.settings.arms:
        best = OPTIMA[arm][0]
        rates = sorted(
            p.settings.learning_rate for p in trained if p.shape == middle and p.arm.name == arm and not p.settings.seed
        )
        assert rates == pytest.approx([best / 2, best, best * 2]), (arm, rates)  # bracketed in three runs


def test_a_rung_cut_short_already_compares_every_arm_at_its_carried_over_rate(fake_ladder):
    """One worker, one run at a time: at each rung every arm's first run is at the centre of its grid (at the
    second rung the best rate of the first) before any arm gets a second one."""
    ladder, trained = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    arms = list(ladder.settings.arms)
    centres = [{arm: ladder.settings.rates[1] for arm in arms}, {arm: OPTIMA[arm][0] for arm in arms}]
    for rung, centre in zip(ladder.rungs[:-1], centres, strict=True):
        first = [p for p in trained if p.shape == rung.shape][: len(arms)]
        assert sorted(p.arm.name for p in first) == sorted(arms)
        for plan in first:
            assert plan.settings.learning_rate == pytest.approx(centre[plan.arm.name]), plan.arm.name


def test_the_precision_stage_pairs_bf16_and_fp32_seeds_for_both_arms_each_at_a_rate_it_trains_at(fake_ladder):
    ladder, trained = fake_ladder
    ladder.settings = replace(ladder.settings, precision_rates=(("hires", 1e-3),))
    run_stages(ladder, ["floor", "precision"], progress=False, log=lambda line: None)
    s = ladder.settings
    summary = summarize(ladder)
    rates = {"control": summary["floor"]["lr"], "hires": 1e-3}  # HiRes where the settings say
    pairs = {(p.arm.name, p.settings.precision, p.settings.seed, p.settings.learning_rate) for p in trained}
    for arm in ("control", "hires"):
        for precision in ("bf16", "fp32"):
            assert {(arm, precision, seed, rates[arm]) for seed in range(s.precision_seeds)} <= pairs
    summary = summary["precision"]["arms"]
    assert {name: cell["lr"] for name, cell in summary.items()} == rates
    assert summary["hires"]["difference"] == pytest.approx(0.0)  # the made-up losses ignore the precision
    assert summary["control"]["spread"] == pytest.approx(0.001 * (s.precision_seeds - 1))


def test_a_dead_workers_claim_is_taken_over(tmp_path):
    store = RunStore(tmp_path)
    assert claim(store, "abc") and not claim(store, "abc")  # held by this live process (for another worker)
    (tmp_path / "claims" / "abc").write_text("999999999")  # a pid that does not run
    assert claim(store, "abc")
    assert int((tmp_path / "claims" / "abc").read_text().split()[0]) == os.getpid()
    (tmp_path / "claims" / "abc").write_text(f"{os.getpid()} another-boot")  # a live pid, but from before a reboot
    assert claim(store, "abc")
    (tmp_path / "claims" / "abc").write_text("")  # an empty claim (written by no process this code runs)
    assert claim(store, "abc")
    assert [path.name for path in (tmp_path / "claims").iterdir()] == ["abc"]  # nothing staged is left behind


def test_workers_stop_on_a_kill_and_resume_to_train_every_run_once(tmp_path):
    """`--workers 2`: a `kill` (SIGTERM) while runs train stops both workers, each releasing its claim on the way
    out; started again, the data prepared once, they train between them every planned run not stored yet, once."""
    import signal
    import subprocess
    import sys

    from hires_hf.experiments.ladder import open_runs

    command = [sys.executable, "-m", "hires_hf.cli", "ladder", "--smoke", "--stages", "floor", "--workers", "2"]
    command += ["--quiet", "--out", str(tmp_path)]
    env = {**os.environ, "HIRES_HF_CACHE": str(tmp_path)}
    ladder = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    claims = tmp_path / "runs" / "claims"
    deadline = time.monotonic() + 300
    while not (claims.exists() and any(claims.iterdir())):
        assert ladder.poll() is None and time.monotonic() < deadline, "no worker ever claimed a run"
        time.sleep(0.05)
    holders = []  # the workers' pids, from their claims (a claim may go as it is read: its run just ended)
    for path in claims.iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            holders.append(int(path.read_text().split()[0]))
    ladder.send_signal(signal.SIGTERM)
    assert ladder.wait(timeout=60) == 128 + signal.SIGTERM
    assert not list(claims.iterdir())  # every claim released on the way out
    for pid in holders:  # and no worker runs on
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    stored_before = len(list(RunStore(tmp_path / "runs").runs()))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    finished = [line for line in done.stdout.splitlines() if line.startswith("Stages floor complete")]
    assert len(finished) == 2  # one line from each worker
    resumed = open_ladder(LadderSettings.smoke(), tmp_path, tmp_path / "data", progress=False)
    assert not open_runs(resumed, ["floor"])
    trained = sum(int(line.split("(")[1].split()[0]) for line in finished)
    assert stored_before + trained == len(list(resumed.store.runs()))  # every run trained by exactly one worker


def test_a_changed_default_is_a_new_cell_for_hires_and_not_for_the_control(monkeypatch, fake_ladder):
    """The key covers every resolved config field: the write multiplier's base width changes the HiRes key."""
    ladder, _ = fake_ladder
    shape, budget = ladder.rungs[0].shape, Budget(flops=2e9, batch_size=4)
    arms = (Arm("control", "control"), Arm("hires"))

    def keys() -> dict[str, str]:
        return {arm.name: plan_run(arm, 4e-3, shape, ladder.data, budget).key for arm in arms}

    before = keys()
    monkeypatch.setattr(configuration_hires, "WRITE_BASE_WIDTH", 128)
    after = keys()
    assert after["hires"] != before["hires"]
    assert after["control"] == before["control"]  # nothing the control trains with changed


def test_the_key_follows_recipe_data_precision_and_code(fake_ladder, monkeypatch):
    ladder, _ = fake_ladder
    shape, data = ladder.rungs[0].shape, ladder.data
    arm, budget = Arm("hires"), Budget(flops=2e9, batch_size=4)
    base = plan_run(arm, 4e-3, shape, data, budget, precision="fp32", compile="off").key
    assert plan_run(arm, 4e-3, shape, data, budget, precision="fp32", compile="off").key == base
    changed = [
        plan_run(arm, 4e-3, shape, data, budget, seed=1, precision="fp32", compile="off"),
        plan_run(arm, 4e-3, shape, data, budget, precision="bf16", compile="off"),
        plan_run(arm, 4e-3, shape, data, replace(budget, batch_size=2), precision="fp32", compile="off"),
        plan_run(arm, 4e-3, replace(shape, residual_ratio=4.0), data, budget, precision="fp32", compile="off"),
    ]
    assert len({plan.key for plan in changed} | {base}) == 5
    monkeypatch.setattr(harness, "TRAINING_FUNCTIONS", (*harness.TRAINING_FUNCTIONS, Shape.parse))
    assert plan_run(arm, 4e-3, shape, data, budget, precision="fp32", compile="off").key != base


@pytest.mark.parametrize("smoke_settings", [LadderSettings.smoke(precision="bf16")])
def test_the_ladder_is_bf16_on_any_cpu_and_computes_it_with_fp32_kernels_where_bf16_would_be_emulated(
    fake_ladder, monkeypatch, capsys
):
    """Its stored runs are bf16, so they are found (and reported) on a CPU without bf16 matrix units too; a worker
    there says so, trains them with fp32 kernels on bf16 operands, and every run records which kernels made it."""
    from hires_hf.cli import main
    from hires_hf.commands.ladder import EMULATION_NOTE
    from hires_hf.training import bf16_emulation, loop

    ladder, _ = fake_ladder
    run_stages(ladder, ["floor"], progress=False, log=lambda line: None)  # the fake's bf16 runs, native kernels
    native = ladder.store.runs()
    assert native and all(run.machine["bf16_kernels"] == bf16_emulation.NATIVE for run in native)

    monkeypatch.setattr(loop, "bf16_matmul_hardware", lambda device_type: False)
    monkeypatch.setattr(bf16_emulation, "bf16_matmul_hardware", lambda device_type: False)
    plan = plan_run(
        Arm("control", "control"),
        4e-3,
        ladder.rungs[0].shape,
        ladder.data,
        Budget(flops=2e9, batch_size=4),
        precision=LadderSettings().precision,
    )
    assert plan.spec["recipe"]["precision"] == "bf16"

    out = ladder.store.folder.parent / "cpu-without-bf16"
    assert main(["ladder", "--smoke", "--precision", "bf16", "--stages", "floor", "--out", str(out)]) == 0
    assert EMULATION_NOTE in capsys.readouterr().err
    emulated = RunStore(out / "runs").runs()
    assert len(emulated) == len(native)
    assert all(run.machine["bf16_kernels"] == bf16_emulation.EMULATED for run in emulated)
    assert not bf16_emulation.emulating()  # left behind when the worker is done
    reported = summarize(open_ladder(LadderSettings.smoke(precision="bf16"), out, progress=False))["bf16_kernels"]
    assert sorted(reported[bf16_emulation.EMULATED]) == sorted(run.key for run in emulated)


def test_the_report_names_the_baseline_and_the_multiplier(fake_ladder, tmp_path):
    ladder, _ = fake_ladder
    run_stages(ladder, ["floor", "grid", "top"], progress=False, log=lambda line: None)
    summary = summarize(ladder)
    for rung in summary["rungs"]:
        assert rung["baseline"] == "control"  # the better of the two vanillas in the made-up losses
        assert rung["gap"] == pytest.approx(rung["arms"]["hires"]["loss"] - rung["arms"]["control"]["loss"])
    multiplier = summary["fit"]["multiplier"]
    assert multiplier["ci_low"] <= multiplier["value"] <= multiplier["ci_high"]
    assert all(rung["baseline_share"]["hires"] == pytest.approx(1.0) for rung in summary["rungs"])  # one-point curves
    text = write_report(ladder, tmp_path / "report")
    assert "**Multiplier** of hires" in text and (tmp_path / "report" / "summary.json").exists()
    assert (tmp_path / "report" / "ladder.png").stat().st_size > 10_000
    # the gap trend is written with its interval, and the gaps are drawn with theirs
    width = summary["fit"]["gap_per_decade_half_width"]
    assert width > 0 and f"{summary['fit']['gap_per_decade']:+.3f} ± {width:.3f} nats per decade" in text
    assert "![gaps to the baseline](gaps.png)" in text and (tmp_path / "report" / "gaps.png").stat().st_size > 10_000


def ladders_by_seed_noise(ladder, settings: LadderSettings, folder):
    """The fake ladder trained twice through the top rung, with quiet and with noisy seeds: (name, ladder) each."""
    for name, nats in (("quiet", 0.001), ("noisy", 0.03)):
        ladder.seed_effect["nats"] = nats
        here = open_ladder(settings, folder / name, progress=False)
        run_stages(here, ["floor", "grid", "top"], progress=False, log=lambda line: None)
        yield name, here


def test_the_report_says_how_many_seeds_tell_the_articles_claim_from_none_more_where_seeds_are_noisier(
    fake_ladder, smoke_settings, tmp_path
):
    """A floor that length cannot reach leaves seeds as the way to a verdict: the report turns the measured seed
    noise into the seeds a side that tell the article's 1.30x from no gain at the top rung."""
    ladder, _ = fake_ladder
    needs = {}
    for name, here in ladders_by_seed_noise(ladder, smoke_settings, tmp_path):
        article = summarize(here)["fit"]["article"]
        assert article["gap"] > 0 and article["at_flops"] == here.rungs[-1].flops
        needs[name] = article["seeds"]
        assert f"{article['seeds']} seeds a side" in write_report(here, tmp_path / f"{name}-report")
    assert needs["quiet"] == 2 < needs["noisy"]


def test_each_gap_carries_an_interval_that_narrows_with_seeds_and_widens_with_their_noise(
    fake_ladder, smoke_settings, tmp_path
):
    """A gap of 0.03 nats reads as HiRes ahead or behind only where the seeds' noise allows it: each arm's gap to the
    baseline carries a 95% interval in the table and in summary.json, none for the baseline itself."""
    ladder, _ = fake_ladder
    widths = {}
    for name, here in ladders_by_seed_noise(ladder, smoke_settings, tmp_path):
        rung = summarize(here)["rungs"][0]
        intervals = rung["gap_interval"]
        assert rung["baseline"] not in intervals and set(intervals) == set(rung["arms"]) - {rung["baseline"]}
        hires = rung["best_hires"]
        widths[name] = intervals[hires]
        row = next(
            line
            for line in write_report(here, tmp_path / f"{name}-report").splitlines()
            if line.startswith(f"| {rung['shape']} |") and f"| {hires} |" in line
        )
        assert f"| {intervals[hires]:.3f} |" in row
    second = here.store.get(rung["arms"][hires]["keys"][1])
    next(here.store.folder.glob(f"*-{second.key}.json")).unlink()  # HiRes down to one seed there
    here.store.refresh()
    assert summarize(here)["rungs"][0]["gap_interval"][hires] > widths["noisy"]  # fewer seeds, a wider interval
    assert widths["quiet"] < widths["noisy"]


def test_noise_the_batch_order_brings_to_every_arm_cancels_when_gaps_are_read_in_pairs(
    fake_ladder, smoke_settings, tmp_path
):
    """Every arm trains on the same batches for a seed. Where a seed moves every arm alike, each arm's run read
    against the baseline's same seed has no noise left, while the unpaired interval stays as wide as the seeds
    scatter; where an arm's scatter is its own, pairing cannot remove it."""
    ladder, _ = fake_ladder
    ladder.seed_effect["nats"] = 0.03  # the same shift a seed for every arm
    shared = open_ladder(smoke_settings, tmp_path / "shared", progress=False)
    run_stages(shared, ["floor", "grid", "top"], progress=False, log=lambda line: None)
    summary = summarize(shared)
    rung = summary["rungs"][0]
    hires = rung["best_hires"]
    paired = rung["paired"][hires]
    assert paired["pairs"] >= 2 and paired["half_width"] == pytest.approx(0.0, abs=1e-9)
    assert rung["gap_interval"][hires] > 0.02
    assert summary["fit"]["multipliers"][hires]["paired_trend"]["half_width"] == pytest.approx(0.0, abs=1e-9)
    text = write_report(shared, tmp_path / "shared-report")
    assert "**Paired by seed.**" in text and f"| {rung['shape']} | {hires} | {paired['pairs']} |" in text

    ladder.seed_effect[hires] = 0.08  # HiRes's own scatter on top: the pairs keep it
    own = open_ladder(smoke_settings, tmp_path / "own", progress=False)
    run_stages(own, ["floor", "grid", "top"], progress=False, log=lambda line: None)
    assert summarize(own)["rungs"][0]["paired"][hires]["half_width"] > 0.02


def test_an_arm_is_fitted_only_through_rungs_where_its_rate_is_bracketed(fake_ladder):
    """A rung half done (an arm at one rate that stalled, say) would read a rate's failure as the architecture's
    scaling: that arm's point waits until its rate is bracketed, and the other arms keep their fit meanwhile."""
    ladder, _ = fake_ladder
    ladder.settings = replace(ladder.settings, arms=("control", "plain-twin", "hires", "D=4d"))
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    before = summarize(ladder)["fit"]
    assert set(before["multipliers"]) == {"hires", "D=4d"}  # both rungs below the top bracketed
    rung = ladder.rungs[1]
    hires = [
        r for r in ladder.store.runs() if r.arm == "hires" and r.seed == 0 and r.spec["budget"]["flops"] == rung.flops
    ]
    for run in sorted(hires, key=lambda run: run.lr)[:-1]:  # only its highest rate is left: an edge, not a bracket
        next(ladder.store.folder.glob(f"*-{run.key}.json")).unlink()
    ladder.store.refresh()
    after = summarize(ladder)["fit"]
    assert after["held_out"] == ["hires"] and set(after["multipliers"]) == {"D=4d"}
    assert after["multipliers"]["D=4d"]["value"] == pytest.approx(before["multipliers"]["D=4d"]["value"])
    assert after["laws"]["baseline"] == before["laws"]["baseline"]


def test_an_arm_added_mid_way_is_shown_but_does_not_take_the_other_arms_fit_with_it(fake_ladder, tmp_path):
    """`--arms` adds a variant after the ladder has run: until its rate is bracketed at two rungs it has no law, and
    the rungs it has not reached (or not bracketed) still fit the arms that have."""
    from hires_hf.experiments.ladder import cell_plan, train_cell

    ladder, _ = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    before = summarize(ladder)["fit"]
    ladder.settings = replace(ladder.settings, arms=(*ladder.settings.arms, "k=2"))
    rung = ladder.rungs[0]
    for lr in (2e-3, 4e-3):  # the low edge and its best: not yet a bracket
        train_cell(ladder, cell_plan(ladder, "k=2", rung.name, lr), progress=False)

    summary = summarize(ladder)
    assert summary["rungs"][0]["arms"]["k=2"]["bracket"] != "bracketed"
    after = summary["fit"]
    assert after["held_out"] == ["k=2"] and "k=2" not in after["laws"]
    assert after["multiplier"]["value"] == pytest.approx(before["multiplier"]["value"])
    report = write_report(ladder, tmp_path / "report")
    assert "Not fitted (its rate bracketed at fewer than two rungs" in report
    assert f"--arms {' '.join(ladder.settings.arms)}" in report  # the report says how to rebuild it as it is


def test_the_report_shows_each_rungs_rate_grid_its_seeds_and_their_training_loss(fake_ladder, tmp_path):
    """A reader checks a bracket by its losses (every rate an arm ran, the best marked, its other seeds beside it)
    and a run between its evaluations by its training loss, where the run kept a trace."""
    ladder, _ = fake_ladder
    ladder.seed_effect["nats"] = 0.02
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    text = write_report(ladder, tmp_path / "report")
    cell = summarize(ladder)["rungs"][0]["arms"]["control"]
    row = next(line for line in text.splitlines() if line.startswith("| control |"))  # the first rung's grid
    assert all(f"{loss:.4f}" in row for loss in cell["grid"].values()) and len(cell["grid"]) >= 3
    best, second = cell["seed_losses"]
    assert f"**{best:.4f}** / {second:.4f}" in row and second == pytest.approx(best + 0.02)
    assert (tmp_path / "report" / "rates.png").stat().st_size > 10_000
    assert "traces.png" not in text  # no run kept a trace (none checkpointed)

    keys = cell["keys"]  # both seeds of the control's best rate, as a checkpointed run leaves them
    for key in keys:
        trace = {"key": key, "first_step": 1, "loss": [8.0 / (1 + step / 10) for step in range(200)]}
        (ladder.store.folder / "traces").mkdir(exist_ok=True)
        (ladder.store.folder / "traces" / f"{key}.json").write_text(json.dumps(trace))
    assert summarize(ladder)["traced"] == keys
    assert "traces.png" in write_report(ladder, tmp_path / "report")
    assert (tmp_path / "report" / "traces.png").stat().st_size > 10_000


def test_a_corpus_too_small_for_the_longest_run_is_refused_before_training(fake_ladder):
    """No rung may repeat data: a worker on a machine with too few sources stops and says how much is missing."""
    from hires_hf.errors import HiResUserError
    from hires_hf.experiments.ladder import check_enough_data

    ladder, trained = fake_ladder
    check_enough_data(ladder)  # the smoke ladder's corpus holds its longest run
    tokens = len(ladder.data.train) * ladder.data.context
    per_token = Arm("control", "control").flops_per_token(Shape.parse("64x4", vocab_size=300), ladder.data)
    ladder.settings = replace(ladder.settings, rungs=(*ladder.settings.rungs, ("64x4", 2 * tokens * per_token)))
    with pytest.raises(HiResUserError, match=r"at 64x4\) needs .*M: its runs would repeat data"):
        check_enough_data(ladder)
    ladder.settings = replace(LadderSettings.smoke(), floor_tokens=(4e3, 2 * tokens))  # the floor's seeds, too
    with pytest.raises(HiResUserError, match=r"noise floor's longest seeds"):
        check_enough_data(ladder)
    assert not trained


def test_a_gpu_ladders_report_says_how_it_was_run(fake_ladder, tmp_path):
    """A GPU ladder's runs are keyed apart from the CPU's, and its report gives the GPU's commands, not the CPU's."""
    import torch

    ladder, _ = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    cpu_keys = {run.key for run in ladder.store.runs()}
    ladder.device, ladder._plans = torch.device("cuda"), {}
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    assert {run.key for run in ladder.store.runs()} > cpu_keys  # nothing of the CPU's reused
    text = write_report(ladder, tmp_path / "report")
    assert "scripts/gpu_session.sh" in text and "--workers 2" not in text
    assert "several share the GPU" in text and summarize(ladder)["device"] == "cuda"


def test_a_gpu_ladder_trained_on_two_cards_names_each_with_its_runs(fake_ladder, tmp_path):
    """Runs from two GPU models pool their losses; the report's title says which cards trained how many runs, so
    that no timing is read as one card's."""
    import torch

    ladder, _ = fake_ladder
    ladder.device, ladder._plans = torch.device("cuda"), {}
    trained = run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    for index, run in enumerate(trained):
        card = "NVIDIA H200" if index % 3 else "NVIDIA H100 80GB HBM3"
        ladder.store.put(replace(run, machine={**(run.machine or {}), "gpu": card}))
    h100 = sum(1 for index in range(len(trained)) if index % 3 == 0)
    title = write_report(ladder, tmp_path / "report").splitlines()[0]
    assert f"NVIDIA H100 80GB HBM3 ({h100} runs)" in title
    assert f"NVIDIA H200 ({len(trained) - h100} runs)" in title


def test_the_baseline_curve_says_how_much_of_its_budget_an_arm_is_worth_at_most():
    curve = [(0.0, 8.0), (50.0, 4.0), (100.0, 3.0)]
    assert share_to_reach(curve, 3.5, 100.0) == pytest.approx(0.75)  # halfway between the last two evaluations
    assert share_to_reach(curve, 4.0, 100.0) == pytest.approx(0.5)
    assert share_to_reach(curve, 2.9, 100.0) is None  # the arm beat the baseline's final loss: no bound


@pytest.mark.slow
def test_a_real_smoke_ladder_trains_and_reports(tmp_path):
    """Two rungs, two arms, trained for real: every run stored with its spec, the report written."""
    settings = LadderSettings.smoke(
        rungs=(("32x4", 2e9), ("48x4", 4e9)), arms=("control", "hires"), floor_tokens=(4e3,), floor_seeds=2
    )
    ladder = open_ladder(settings, tmp_path, progress=False)
    trained = run_stages(ladder, ["grid", "top"], progress=False, log=lambda line: None)
    assert trained and all(run.spec["recipe"]["learning_rate"] == run.lr for run in trained)
    assert {run.key for run in ladder.store.runs()} == {run.key for run in trained}
    assert not list((tmp_path / "runs" / "checkpoints").glob("*"))  # finished runs leave no checkpoint
    assert "Compute ladder" in write_report(ladder, tmp_path)


def test_the_budget_accounts_every_run_to_the_stage_that_trained_it(fake_ladder):
    ladder, trained = fake_ladder
    ladder.seed_effect["nats"] = 0.05  # a noisy floor: every length trained
    counts = {}
    for stage in ("floor", "precision", "grid"):
        before = len(trained)
        run_stages(ladder, [stage], progress=False, log=lambda line: None)
        counts[stage] = len(trained) - before
    account = summarize(ladder)["budget"]
    assert {stage: account["spent"][stage]["runs"] for stage in counts} == counts
    assert account["spent"]["grid"]["flops"] == pytest.approx(sum(p.budget.flops for p in trained[-counts["grid"] :]))
    assert account["planned"]["grid"]["runs"] == 0 and account["planned"]["top"]["runs"] > 0  # the next wave


def test_the_budget_says_the_hours_next_on_each_kind_of_kernels(fake_ladder):
    """Runs computed by fp32 kernels on a CPU without bf16 units train slower: the next runs' hours are given for
    each kind of kernels the ladder has used, each at that kind's own measured speed."""
    ladder, _ = fake_ladder
    run_stages(ladder, ["floor", "precision", "grid"], progress=False, log=lambda line: None)
    assert list(budget(ladder)["planned"]["top"]["hours"]) == [NATIVE]  # one kind so far: one column
    for run in ladder.store.runs():  # the same runs again, as if trained 4x slower with emulated kernels
        emulated = {**(run.machine or {}), "bf16_kernels": EMULATED}
        ladder.store.put(replace(run, key=f"{run.key}e", seconds=4 * run.seconds, machine=emulated))
    account = budget(ladder)
    hours = account["planned"]["top"]["hours"]
    assert hours[NATIVE] > 0 and hours[EMULATED] == pytest.approx(4 * hours[NATIVE])
    header = budget_table(account, "cpu").splitlines()[2]
    assert "hours next, bf16 units" in header and "hours next, emulated bf16" in header
    # a run begun on one kind and finished on the other is listed under both, and plans no one's speed (a bf16 run:
    # the store lists runs by key, and keys change with the code, so the first run may be one of the fp32 checks)
    run = next(run for run in ladder.store.runs() if run.spec["recipe"]["precision"] == "bf16")
    segments = [{"step": 0, "machine": {"bf16_kernels": NATIVE}}, {"step": 9, "machine": {"bf16_kernels": EMULATED}}]
    mixed = {**run.machine, "bf16_kernels": EMULATED, "segments": segments}
    ladder.store.put(replace(run, key=f"{run.key}m", seconds=100 * run.seconds, machine=mixed))
    assert all(f"{run.key}m" in keys for keys in kernels(ladder).values())
    assert budget(ladder)["planned"]["top"]["hours"] == pytest.approx(hours)


def test_a_hires_variant_behind_by_more_than_the_noise_skips_the_top_rung(fake_ladder):
    ladder, trained = fake_ladder
    ladder.settings = replace(ladder.settings, arms=("control", "plain-twin", "hires", "D=4d"))
    run_stages(ladder, ["grid", "top"], progress=False, log=lambda line: None)
    top = {p.arm.name for p in trained if p.shape == ladder.rungs[-1].shape}
    assert top == {"control", "plain-twin", "hires"}  # D=4d is 0.15 nats behind hires everywhere
    summary = summarize(ladder)
    assert summary["top_pruned"] == {"D=4d": pytest.approx(0.15)}
    assert "D=4d" in summary["rungs"][1]["arms"] and "D=4d" not in summary["rungs"][-1]["arms"]


def test_one_lucky_seed_does_not_keep_a_hires_variant_off_the_top_rung(fake_ladder, tmp_path):
    """Seed 0 picks each arm's rate, but the arms are compared by the mean of their seeds there, as the table has it:
    where hires's second seed falls back level with D=4d at the rung below, D=4d goes to the top rung too, and the
    report gives each HiRes arm's multiplier, not only the one that came out ahead."""
    ladder, trained = fake_ladder
    ladder.settings = replace(ladder.settings, arms=("control", "plain-twin", "hires", "D=4d"))
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    hires = next(arm for arm in ladder.arms if arm.name == "hires")
    below = len(ladder.rungs) - 2
    lucky, *unlucky = ladder.seed_runs(hires, below, OPTIMA["hires"][0])
    assert unlucky, "the grid seeds each arm's best rate"
    for run in unlucky:  # seed 0 alone is 0.15 nats ahead of D=4d; the mean of both is level with it
        ladder.store.put(replace(run, final_loss=lucky.final_loss + 0.3))
    run_stages(ladder, ["top"], progress=False, log=lambda line: None)
    assert "D=4d" in {p.arm.name for p in trained if p.shape == ladder.rungs[-1].shape}
    summary = summarize(ladder)
    assert summary["top_pruned"] == {}
    assert set(summary["fit"]["multipliers"]) == {"hires", "D=4d"}
    other = next(name for name in ("hires", "D=4d") if name != summary["fit"]["best_hires"])
    assert f"The other HiRes arms, each at the top of its fitted rungs: {other} " in write_report(
        ladder, tmp_path / "report"
    )


def test_a_hires_arms_trend_follows_that_arm_where_the_best_hires_changes_from_rung_to_rung():
    """HiRes ahead of D=4d at rung 1 and D=4d ahead by a hair at rung 2: each arm's trend is read from its own gaps,
    not from whichever arm was best at each rung (which would give D=4d a trend from HiRes's rung-1 gap)."""

    def rung(flops, control, hires, d4):
        losses = {"control": control, "hires": hires, "D=4d": d4}
        return {"flops": flops, "baseline": "control", "arms": {name: {"loss": v} for name, v in losses.items()}}

    rungs = [rung(1e14, 2.80, 2.90, 3.00), rung(1e15, 2.50, 2.55, 2.549)]
    assert gap_trend(rungs, "hires") == pytest.approx(-0.05)  # +0.10 to +0.05 over one decade
    assert gap_trend(rungs, "D=4d") == pytest.approx(-0.151)  # +0.20 to +0.049


TRUE_LOSSES = {"control": (2.85, 2.60, 2.40), "plain-twin": (2.91, 2.59, 2.38), "hires": (2.95, 2.62, 2.38)}
RUNG_FLOPS = (1.25e14, 3.5e14, 1e15)


def rungs_of(means: dict[str, list[float]], seeds: dict[str, int]) -> list[dict]:
    """Rungs as the report summarises them, from each arm's loss at each rung; the baseline changes arm after rung 1."""
    return [
        {
            "flops": flops,
            "baseline": "control" if i == 0 else "plain-twin",
            "arms": {arm: {"loss": float(losses[i]), "seeds": seeds[arm]} for arm, losses in means.items()},
        }
        for i, flops in enumerate(RUNG_FLOPS)
    ]


def simulated_rungs(rng, seeds: dict[str, int]) -> tuple[list[dict], dict]:
    """Three rungs of seed means drawn around `TRUE_LOSSES`, each arm scattering by its own noise (HiRes's the most,
    as on the CPU), and each arm's noise pooled from the draws."""
    sds = {"control": 0.03, "plain-twin": 0.01, "hires": 0.09}
    draws = {arm: [rng.normal(loss, sds[arm], seeds[arm]) for loss in losses] for arm, losses in TRUE_LOSSES.items()}
    means = {arm: [cell.mean() for cell in cells] for arm, cells in draws.items()}
    return rungs_of(means, seeds), {arm: pooled([list(cell) for cell in cells]) for arm, cells in draws.items()}


def test_a_gap_trends_interval_covers_the_true_trend_as_often_as_it_says():
    """The README's central number is a trend over three rungs of noisy seed means; its 95% interval must hold the
    true trend in about 95% of ladders, not more (too wide to be of use) nor fewer (a trend read from noise)."""
    import numpy as np

    rng = np.random.default_rng(0)
    seeds = {"control": 3, "plain-twin": 3, "hires": 4}
    true_trend = gap_trend(rungs_of(TRUE_LOSSES, seeds), "hires")
    draws, covered = 2000, 0
    for _ in range(draws):
        rungs, noise = simulated_rungs(rng, seeds)
        covered += abs(gap_trend(rungs, "hires") - true_trend) <= gap_trend_half_width(rungs, "hires", noise)
    assert 0.94 <= covered / draws <= 0.97  # 0.956 here; a normal quantile in place of Student's t: 0.931
    rungs, noise = simulated_rungs(rng, seeds)
    fewer = [{**rung, "arms": {**rung["arms"], "hires": {**rung["arms"]["hires"], "seeds": 1}}} for rung in rungs]
    assert gap_trend_half_width(fewer, "hires", noise) > gap_trend_half_width(rungs, "hires", noise)
    assert gap_trend_half_width(rungs[:1], "hires", noise) is None  # one rung has no trend


def test_a_paired_gaps_interval_covers_the_true_gap_as_often_as_it_says():
    """Seeds that share a batch order move both arms by a common draw, and each arm adds its own: the paired
    interval is narrower than the unpaired one and still holds the true gap in about 95% of ladders."""
    import numpy as np

    from hires_hf.experiments.ladder_report import paired_gaps, paired_noise

    rng = np.random.default_rng(1)
    true_gap, seeds, draws = 0.02, 3, 1000
    covered, narrower = 0, 0
    for _ in range(draws):
        rungs = []
        for base_loss in (2.9, 2.6, 2.4):
            batches = rng.normal(0.0, 0.04, seeds)  # the batch order's share, the same for both arms
            losses = {
                "plain-twin": base_loss + batches + rng.normal(0.0, 0.01, seeds),
                "hires": base_loss + true_gap + batches + rng.normal(0.0, 0.015, seeds),
            }
            cells = {arm: {"seed_losses": list(x), "seed_ids": list(range(seeds))} for arm, x in losses.items()}
            rungs.append({"baseline": "plain-twin", "arms": cells})
        summary = {"rungs": rungs}
        gap = paired_gaps(rungs[-1], paired_noise(summary))["hires"]
        covered += abs(gap["gap"] - true_gap) <= gap["half_width"]
        noise = {arm: pooled([cell["arms"][arm]["seed_losses"] for cell in rungs]) for arm in losses}
        narrower += gap["half_width"] < welch_half_width(noise["hires"], seeds, noise["plain-twin"], seeds)
    assert 0.93 <= covered / draws <= 0.97  # 0.952 here; a normal quantile for Student's t: 0.903
    assert narrower / draws > 0.95


def test_another_environments_python_sources_are_refused_before_they_retire_every_stored_run(
    fake_ladder, tmp_path, monkeypatch
):
    """The "python" corpus is read from site-packages: on a machine where one package has another version the
    ladder's data (hence every run's key) differs, and a worker would silently retrain the whole ladder from
    scratch. The ladder refuses, naming the package and the pins to install."""
    from hires_hf.errors import HiResUserError
    from hires_hf.experiments.ladder import CORPUS_RECORD, check_corpus_environment, record_corpus

    ladder, _ = fake_ladder
    folder = tmp_path / "ladder"
    record_corpus(ladder, folder)  # the first preparation writes the record
    record = json.loads((folder / CORPUS_RECORD).read_text())
    assert record["data"] == ladder.data.spec
    record_corpus(ladder, folder)  # the same data again: accepted

    python = replace(ladder.settings, corpus="python")
    record["data"]["source"] = "python"
    (folder / CORPUS_RECORD).write_text(json.dumps(record))
    check_corpus_environment(python, folder)  # this very interpreter: accepted
    here = ladder_module.python_sources_environment()
    moved = {**here, "packages": {**here["packages"], "numpy": "0.0.1"}}
    monkeypatch.setattr(ladder_module, "python_sources_environment", lambda: moved)
    with pytest.raises(HiResUserError, match=r"numpy 0\.0\.1 here, .* there.*corpus-requirements\.txt") as refused:
        check_corpus_environment(python, folder)
    assert "uninstall" not in str(refused.value)  # nothing here that the runs' machine lacked
    extra = {**here, "packages": {**here["packages"], "a-package-they-lacked": "1.0"}}
    monkeypatch.setattr(ladder_module, "python_sources_environment", lambda: extra)
    with pytest.raises(HiResUserError, match=r"`pip uninstall -y a-package-they-lacked`"):
        check_corpus_environment(python, folder)

    record["data"] = {**ladder.data.spec, "tokens_sha256": "0" * 64}  # same recipe, other tokens
    (folder / CORPUS_RECORD).write_text(json.dumps(record))
    with pytest.raises(HiResUserError, match="its source files changed"):
        record_corpus(ladder, folder)


def test_a_worker_on_a_machine_held_for_a_fixed_time_starts_only_the_runs_it_can_finish(fake_ladder):
    """On a machine held for a session, a run that cannot end before the machine goes back loses its progress: a
    worker skips it, judging its time from the speed stored runs measured on this machine at its width and from how
    far its checkpoint already got; a run at a width not timed yet at the nearest width's speed (the top rung's
    first runs on a GPU would otherwise start with minutes left and be cut off)."""

    from hires_hf.experiments.ladder import expected_seconds

    ladder, trained = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)  # every fake run: 1 s, so 1 s a run
    rung = ladder.rungs[0]
    control = next(r for r in ladder.store.runs() if r.arm == "control" and r.spec["budget"]["flops"] == rung.flops)
    next(ladder.store.folder.glob(f"*-{control.key}.json")).unlink()  # that run is open again
    ladder.store.refresh()
    plan = ladder.plan(ladder_arms_by_name(ladder)["control"], rung, control.lr, control.seed)
    assert expected_seconds(ladder, plan) == pytest.approx(1.0)

    trained.clear()
    assert run_stages(ladder, ["grid"], progress=False, log=lambda line: None, claim_until=time.time() + 0.5) == []
    assert trained == [] and ladder.store.get(plan.key) is None  # it would not have finished: not begun

    steps = plan.settings.steps
    write_checkpoint(ladder, plan, {"step": 3 * steps // 4, "curve": [], "train_losses": [], "seconds": 0.75})
    assert expected_seconds(ladder, plan) == pytest.approx(1 - (3 * steps // 4) / steps)  # what is left of it
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None, claim_until=time.time() + 0.5)
    assert [p.key for p in trained] == [plan.key]  # three quarters done: the rest fits

    top, below = ladder.rungs[-1], ladder.rungs[-2]  # the top's width is not timed yet: the rung below's speed
    assert not any(r.spec["budget"]["flops"] == top.flops for r in ladder.store.runs())
    top_plan = ladder.plan(ladder_arms_by_name(ladder)["control"], top, control.lr, 0)
    assert expected_seconds(ladder, top_plan) == pytest.approx(top.flops / below.flops)

    for run in ladder.store.runs():  # no run has been timed on this machine: every run gets its chance
        ladder.store.put(replace(run, machine={"cpu": "another machine"}))
    assert expected_seconds(ladder, plan) is None


def test_a_worker_says_which_run_it_takes_from_where_and_when_it_should_end(fake_ladder):
    """A worker is silent for the hours a run takes: its log names each run as it takes it, the step a resumed run
    goes on from, and, once runs at that width have been timed on this machine, when it should end."""

    ladder, _ = fake_ladder
    lines: list[str] = []
    run_stages(ladder, ["grid"], progress=False, log=lines.append)
    assert len(lines) == 2 * len(ladder.store.runs())
    starts, results = lines[0::2], lines[1::2]
    assert all(" starting " in line for line in starts) and not any(" starting " in line for line in results)
    assert "expected to end" not in starts[0] and "expected to end" in starts[-1]  # the first run timed the width

    rung = ladder.rungs[0]
    control = next(r for r in ladder.store.runs() if r.arm == "control" and r.spec["budget"]["flops"] == rung.flops)
    next(ladder.store.folder.glob(f"*-{control.key}.json")).unlink()  # that run is open again, half done
    ladder.store.refresh()
    plan = ladder.plan(ladder_arms_by_name(ladder)["control"], rung, control.lr, control.seed)
    half = plan.settings.steps // 2
    write_checkpoint(ladder, plan, {"step": half, "curve": [], "seconds": 0.0})
    lines.clear()
    run_stages(ladder, ["grid"], progress=False, log=lines.append)
    assert f"control lr={control.lr:.3g} seed={control.seed} from step {half:,} " in lines[0]

    lines.clear()
    run_stages(ladder, ["floor", "precision"], progress=False, log=lines.append)
    other = "fp32" if ladder.precision == "bf16" else "bf16"
    assert any(line.endswith(f"seed=0 {other}") for line in (line.split(" (")[0] for line in lines))
    assert all(f" {ladder.precision}" not in line for line in lines)  # the ladder's own precision goes unsaid


def test_the_report_shows_where_each_begun_run_stands(fake_ladder, tmp_path):
    """A run that spans sessions is committed as a checkpoint: the report reads its step, last evaluation and hours
    from the checkpoint's header and sets the rung's baseline beside it at the same share of the budget."""

    ladder, _ = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    rung = ladder.rungs[0]
    hires = min(
        (
            run
            for run in ladder.store.runs()
            if run.arm == "hires" and run.seed == 0 and run.spec["budget"]["flops"] == rung.flops
        ),
        key=lambda run: run.final_loss,
    )
    next(ladder.store.folder.glob(f"*-{hires.key}.json")).unlink()  # hires at its best rate is under way again
    ladder.store.refresh()
    plan = ladder.plan(ladder_arms_by_name(ladder)["hires"], rung, hires.lr)
    steps = plan.settings.steps
    write_checkpoint(
        ladder, plan, {"step": steps, "curve": [[0, 6.0], [steps, 3.5]], "train_losses": [], "seconds": 5400.0}
    )
    other = ladder.plan(ladder_arms_by_name(ladder)["control"], ladder.rungs[-1], 8e-3)
    ladder.store.checkpoint(other.key).write_bytes(b"not a checkpoint")
    control_rate = summarize(ladder)["rungs"][0]["arms"]["control"]["best_lr"]
    by_hand = ladder.plan(ladder_arms_by_name(ladder)["control"], rung, control_rate, seed=MOST_SEEDS - 1)
    write_checkpoint(ladder, by_hand, {"step": 7, "curve": [[0, 6.0]], "train_losses": [], "seconds": 60.0})
    off_grid_rate = tidy_rate(control_rate / math.sqrt(2))  # a bracket begun by hand, off the rung's x2 grid
    off_grid = ladder.plan(ladder_arms_by_name(ladder)["control"], rung, off_grid_rate)
    write_checkpoint(ladder, off_grid, {"step": 3, "curve": [[0, 6.0]], "train_losses": [], "seconds": 30.0})

    summary = summarize(ladder)
    rows = {row["key"]: row for row in summary["in_flight"]}
    row = rows[plan.key]
    assert (row["step"], row["last_eval"], row["hours"]) == (steps, [steps, 3.5], 1.5)
    control = summary["rungs"][0]["arms"]["control"]["seed_losses"][0]  # the baseline's run: its end, at 100%
    assert row["baseline_then"] == pytest.approx(control)
    assert rows[other.key]["step"] is None  # an unreadable checkpoint is listed, without progress
    assert (rows[by_hand.key]["seed"], rows[by_hand.key]["step"]) == (MOST_SEEDS - 1, 7)  # a seed the plan lacks
    assert (rows[off_grid.key]["lr"], rows[off_grid.key]["step"]) == (off_grid_rate, 3)  # a rate the plan lacks
    assert "**In flight**" in write_report(ladder, tmp_path / "report")


def write_checkpoint(ladder, plan, progress: dict) -> None:
    """A checkpoint of `plan` at `progress` (a stand-in model: what the planner and the report read is its header)."""
    import torch

    from hires_hf.training.checkpoint import save_checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    save_checkpoint(ladder.store.checkpoint(plan.key), model, optimizer, scheduler, progress)


def ladder_arms_by_name(ladder) -> dict[str, Arm]:
    return {arm.name: arm for arm in ladder.arms}


def test_an_arm_with_a_first_rung_centre_starts_its_grid_there(fake_ladder):
    """A rate carried over from an earlier ladder saves the runs a far-off grid costs: that arm's first rung starts
    at it, x2 either side, and is still bracketed on this ladder's own losses; the others keep the settings' grid."""
    ladder, trained = fake_ladder
    ladder.settings = replace(ladder.settings, first_rung_centres=(("hires", 1.6e-2),))
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    rung = ladder.rungs[0]

    def rates(arm: str) -> list[float]:
        return sorted(
            p.settings.learning_rate
            for p in trained
            if p.shape == rung.shape and p.arm.name == arm and not p.settings.seed
        )

    assert rates("hires") == [8e-3, 1.6e-2, 3.2e-2]  # its best (1.6e-2) inside at once: three runs
    assert set(ladder.settings.rates) <= set(rates("control"))


def test_a_rate_the_plan_skips_is_trained_once_by_hand_and_shown_in_its_rungs_grid(fake_ladder, capsys):
    """`--cell`: a bracket assumes one minimum, so a researcher checks a rate past it by hand. The run is stored
    under the key the plan would give it (trained once, whoever asks again), and the report's grid shows it."""
    from hires_hf.cli import main

    ladder, trained = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    rung = ladder.rungs[0]
    tried = summarize(ladder)["rungs"][0]["arms"]["hires"]["grid"]
    below = min(float(lr) for lr in tried) / 2  # past the low side of a finished bracket: the plan never asks for it
    assert not any(p.arm.name == "hires" and math.isclose(p.settings.learning_rate, below) for p in trained)
    count = len(trained)

    cell = ["ladder", "--smoke", "--out", str(ladder.store.folder.parent), "--quiet", "--cell", "hires", rung.name]
    assert main([*cell, f"{below:g}"]) == 0
    assert len(trained) == count + 1 and trained[-1].key == ladder.plan(ladder.arms[2], rung, below).key
    assert main([*cell, f"{below:g}"]) == 0 and len(trained) == count + 1  # stored: reported, not trained again
    assert f"{trained[-1].settings.learning_rate:g}" in capsys.readouterr().out
    ladder.store.refresh()
    assert any(math.isclose(float(lr), below) for lr in summarize(ladder)["rungs"][0]["arms"]["hires"]["grid"])

    assert main([*cell[:-1], "99x9", "1e-3"]) == 2  # a rung the ladder has not: one line that lists those it has
    error = capsys.readouterr().err.strip()
    assert "99x9" in error and rung.name in error and len(error.splitlines()) == 1
    assert len(trained) == count + 1


def test_a_resumed_run_shows_its_progress_from_the_step_it_resumes_at(fake_ladder, monkeypatch, capsys):
    """A run resumed from its checkpoint after a stop shows the steps it has, not 0 of N: a bar at 0 with hours to
    go reads as a restart, and a researcher who believes it stops a good run."""
    ladder, _ = fake_ladder
    plan = ladder.plan(ladder.arms[0], ladder.rungs[0], 8e-3)
    saved, steps = plan.settings.steps // 2, plan.settings.steps
    monkeypatch.setattr(ladder_module, "read_progress", lambda path: {"step": saved, "curve": [], "seconds": 1.0})
    ladder_module.train_cell(ladder, plan, progress=True)
    bar = capsys.readouterr().err
    assert f"{saved}/{steps}" in bar and f" 0/{steps}" not in bar


def test_a_stalled_seed_is_shown_but_not_counted_as_seed_noise_in_the_multipliers_interval(fake_ladder):
    """One stalled control seed on one H200 made the fit's seed noise 0.55 nats a point and the multiplier's 95%
    interval 0-19,000: a reader got no interval at all. The stall stays in its cell (its rate's risk), not in the
    noise."""
    ladder, _ = fake_ladder
    ladder.seed_effect["nats"] = 0.01
    run_stages(ladder, ["grid", "top"], progress=False, log=lambda line: None)
    before = summarize(ladder)["fit"]
    key = summarize(ladder)["rungs"][0]["arms"]["control"]["keys"][1]
    stalled = ladder.store.get(key)
    ladder.store.put(replace(stalled, final_loss=stalled.final_loss + 1.5))  # a seed a nat and a half above

    summary = summarize(ladder)
    assert summary["rungs"][0]["arms"]["control"]["seed_spread"] > 1.0  # the cell still shows it
    after = summary["fit"]
    assert after["seed_sd"] == pytest.approx(before["seed_sd"], abs=0.01)
    width = [fit["multiplier"]["ci_high"] / fit["multiplier"]["ci_low"] for fit in (before, after)]
    assert width[1] < 2 * width[0]


def test_an_arm_whose_seeds_scatter_widens_its_own_gap_interval_and_not_the_steady_arms(fake_ladder):
    """On the CPU ladder HiRes's seeds scatter ~0.09 nats and the vanillas' ~0.01-0.03. One pooled noise made the
    twin's 0.06 deficit to the control look like noise and HiRes's gaps look surer than its seeds allow."""
    ladder, _ = fake_ladder
    ladder.settings = replace(ladder.settings, rung_seeds=3, top_seeds=3)
    ladder.seed_effect.update(nats=0.002, hires=0.05)
    run_stages(ladder, ["grid", "top"], progress=False, log=lambda line: None)
    summary = summarize(ladder)
    rung = summary["rungs"][0]
    vanilla = next(name for name in ("control", "plain-twin") if name != rung["baseline"])
    assert rung["gap_interval"][vanilla] < 0.01  # two steady arms are told apart by a few thousandths
    assert rung["gap_interval"]["hires"] > 0.05  # three seeds 0.05 apart a step cannot place HiRes that closely
    noise = summary["fit"]["noise"]
    assert noise["hires"] == pytest.approx(0.05, rel=1e-3) and noise["baseline"] == pytest.approx(0.002, rel=1e-3)


def test_a_rung_whose_grid_waits_on_a_reopened_bracket_below_still_shows_its_runs_but_is_not_fitted(fake_ladder):
    """A better rate found by hand at rung 1 re-opens its bracket, and rung 2's grid is centred on it only once that
    closes. Meanwhile rung 2's HiRes runs are shown (marked), not dropped from the report, and kept out of the fit."""
    from hires_hf.experiments.ladder import cell_plan, train_cell

    ladder, _ = fake_ladder
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    before = summarize(ladder)["rungs"][1]["arms"]["hires"]
    assert before["bracket"] == "bracketed"

    rung = ladder.rungs[0]
    below = min(float(lr) for lr in summarize(ladder)["rungs"][0]["arms"]["hires"]["grid"]) / 2
    run = train_cell(ladder, cell_plan(ladder, "hires", rung.name, below), progress=False)
    ladder.store.put(replace(run, final_loss=run.final_loss - 1.0))  # a second, lower minimum the bracket skipped

    summary = summarize(ladder)
    assert summary["rungs"][0]["arms"]["hires"]["bracket"] == "low edge"
    after = summary["rungs"][1]["arms"]["hires"]
    assert after["bracket"] == "rung below open" and after["grid"] == before["grid"]
    assert summary["fit"] is None  # hires, the only HiRes arm, no longer bracketed at two rungs


def test_the_report_reads_the_gap_from_the_seeds_that_did_not_choose_the_rate(fake_ladder, tmp_path):
    """Seed 0 picks each best rate, so a cell's mean leans low (on one H200 seed 0 was its cell's lowest in 7 of 8).
    The report also gives each HiRes arm's gap at each rung from the other seeds alone, which that choice did not
    touch."""
    ladder, _ = fake_ladder
    ladder.seed_effect["nats"] = 0.01  # every later seed a little worse than seed 0, as a lucky seed 0 would be
    run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
    rung = summarize(ladder)["rungs"][0]
    hires_seed = ladder.store.get(rung["arms"][rung["best_hires"]]["keys"][1])
    ladder.store.put(replace(hires_seed, final_loss=hires_seed.final_loss + 0.1))  # HiRes's second seed, unlucky

    summary = summarize(ladder)
    rung = summary["rungs"][0]
    hires, baseline = (rung["arms"][rung[name]]["seed_losses"][1] for name in ("best_hires", "baseline"))
    text = write_report(ladder, tmp_path / "report")
    note = next(line for line in text.splitlines() if line.startswith("**Free of the rate choice:**"))
    cells = sum(len(r["arms"]) for r in summary["rungs"])
    assert f"in {cells} of {cells} cells" in note
    assert f"{rung['shape']} against {rung['baseline']}: {rung['best_hires']} {hires - baseline:+.4f}" in note
    assert f"{hires - baseline:+.4f}" != f"{rung['gap']:+.4f}"  # not the seed means' gap the table gives


def test_rates_reached_by_different_routes_share_one_column_of_the_rate_table():
    # 0.01131 / sqrt(2) tidies to 0.007997 and 0.005657 * sqrt(2) to 0.008: one rate, one column
    arms = {
        "control": {"grid": {"0.007997": 2.4, "0.01131": 2.435}, "best_lr": 0.007997, "seed_losses": [2.4]},
        "hires": {"grid": {"0.005657": 2.384, "0.008": 2.4365}, "best_lr": 0.005657, "seed_losses": [2.384]},
    }
    lines = rate_tables({"rungs": [{"shape": "128x12", "arms": arms}]})
    header, rows = lines[2], lines[4:6]
    assert header.count("| 0.008 |") == 1
    column = header.split("|").index(" 0.008 ")
    assert [row.split("|")[column].strip() for row in rows] == ["**2.4000**", "2.4365"]


def test_a_folder_trained_on_another_machine_is_reported_from_its_corpus_record(fake_ladder, smoke_settings, tmp_path):
    # a GPU's folder read here: this machine's corpus has other tokens and its torch another version, so only the
    # record and the runs' own versions can key its runs
    ladder, _ = fake_ladder
    there_versions = {"torch": "2.11.0+cu130", "transformers": "5.24.0"}
    with keyed_as(there_versions):
        run_stages(ladder, ["grid"], progress=False, log=lambda line: None)
        there = summarize(ladder)["rungs"]
    record_corpus(ladder, tmp_path)
    here = open_ladder(replace(smoke_settings, max_chars=200_000), tmp_path, progress=False)
    read = replace(here, data=recorded_data(tmp_path, here.data), _plans={})
    assert summarize(read)["rungs"] != there  # this machine's versions key other runs
    assert stored_versions(tmp_path / "runs") == there_versions
    with keyed_as(stored_versions(tmp_path / "runs")):
        assert summarize(replace(read, _plans={}))["rungs"] == there


def test_from_record_is_refused_in_one_line_for_training(tmp_path, capsys):
    from hires_hf.cli import main

    assert main(["ladder", "--smoke", "--quiet", "--from-record", "--out", str(tmp_path / "ladder")]) == 2
    error = capsys.readouterr().err.strip()
    assert "--report" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "ladder").exists()


def test_the_no_outer_norm_arm_removes_the_postnorm_and_nothing_else(fake_ladder):
    """The ablation that asks which part of a block boundary delays a circuit: `outer_norm=False` alone would also
    drop the write norm and reset both multipliers to 1 (the additive stream's defaults), changing four things."""
    import torch

    ladder, _ = fake_ladder
    shape = Shape.parse("64x12", vocab_size=300)
    hires, ablated = (arm.hires_config(shape, ladder.data) for arm in ladder_arms(["hires", "no-outer-norm"]))
    assert hires.outer_norm and not ablated.outer_norm
    kept = ("write_norm", "write_multiplier", "embedding_multiplier", "residual_size", "layers_per_block")
    assert {name: getattr(ablated, name) for name in kept} == {name: getattr(hires, name) for name in kept}
    torch.manual_seed(0)
    model = ladder_arms(["no-outer-norm"])[0].model(shape, ladder.data)
    names = [name for name, _ in model.named_modules()]
    assert not any(name.endswith("outer_norm") for name in names) and any(name.endswith("write_norm") for name in names)
    plans = [ladder.plan(arm, ladder.rungs[0], 4e-3) for arm in ladder_arms(["hires", "no-outer-norm"])]
    assert plans[0].key != plans[1].key  # its own runs, never a shipped HiRes's
