"""The ladder's report: what its stored runs say, as a table, fits, a multiplier with its CI, plots and JSON.

Per rung and arm: the best rate (seed 0 over the bracketing grid), its bracket status, the loss there (the mean
over seeds where there are several) and the seed spread (max - min). The baseline at a rung is the better of the
control and the plain twin there. Per arm, `L(C) = A * C^-alpha` is fitted to its best losses over the rungs
(`hires_hf.eval.scaling`); the multiplier of the best HiRes over the baseline is read at the top rung's compute,
with a residual-bootstrap CI. The noise floor is the spread of the control's seeds against run length. Each
rung's rate grids are a table and a figure (`rates.png`), so that every bracket can be checked by eye, and the
training loss of the runs behind each best, step by step where they kept it, a figure (`traces.png`); the
figures are drawn by `ladder_plots`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import HiResUserError
from ..eval.scaling import ARTICLE_MULTIPLIER, Multiplier, Point, PowerLaw, analyse
from ..io import write_json_atomic, write_text_atomic
from ..tables import markdown_table
from ..training.bf16_emulation import EMULATED, NATIVE
from ..training.checkpoint import read_progress
from .harness import HIRES, Run, RunPlan, bracket_status
from .ladder import (
    FLOOR_NATS,
    MOST_SEEDS,
    SQRT2,
    STAGES,
    Ladder,
    LadderSettings,
    _rates_around,
    ladder_arms,
    open_runs,
    precision_rate,
    top_contenders,
)
from .ladder_plots import plot, plot_floor, plot_gaps, plot_rates, plot_traces
from .seed_noise import (
    Noise,
    paired_differences,
    pooled,
    weighted_means_half_width,
    welch_half_width,
    without_stalls,
)
from .stalls import baseline_at

COMMANDS = {  # how each device's ladder is run, and what one worker of its budget is
    "cpu": (
        "hires-hf ladder --workers 2   # two single-threaded workers share the 2 cores (all stages, resumable)",
        "hires-hf ladder --report",
    ),
    "cuda": (
        "PHASES=ladder OUT=runs/gpu scripts/gpu_session.sh   # six workers share one H200, from the committed runs on",
        "hires-hf ladder --device cuda --report   # on the GPU machine (its runs' data is that machine's corpus)",
        "hires-hf ladder --device cuda --seeds 3 --top-seeds 6 --report --from-record --out "
        "benchmarks/results/ladder_gpu   # here",
    ),
}
WORKER = {
    "cpu": "a worker is one core, two share the machine",
    "cuda": "a worker is one process, several share the GPU",
}


# The test a gap the size of the article's claim needs: two-sided at 95% confidence, with 80% power
Z_CONFIDENCE, Z_POWER = 1.96, 0.84
VANILLAS = ("control", "plain-twin")  # the better of the two at a rung is its baseline
ALL_ARMS = "all arms"  # the noise pooled over every cell: an arm without several seeds falls back on it
BELOW_OPEN = "rung below open"  # an arm's grid here is centred once its bracket at the rung below closes


def rung_cells(ladder: Ladder, index: int) -> dict[str, dict[str, Any]]:
    """Per arm at rung `index`: best rate, bracket, loss (mean over seeds at the best rate), seeds and spread. An arm
    whose grid here waits on the rung below (a better rate found there re-centres it) shows the runs it has, marked
    `BELOW_OPEN`, so that they are neither hidden nor fitted."""
    cells = {}
    rung = ladder.rungs[index]
    tried = sorted({run.lr for run in ladder.store.runs()})
    for arm in ladder.arms:
        grid = ladder.grid(arm, index)
        runs = ladder.stored(arm, rung, tried if grid is None else _rates_around(*grid))
        if not runs:
            continue
        best = min(runs.values(), key=lambda r: r.final_loss)
        seeds = ladder.seed_runs(arm, index, best.lr)
        losses = [r.final_loss for r in seeds]
        cells[arm.name] = {
            "best_lr": best.lr,
            "bracket": BELOW_OPEN if grid is None else bracket_status({lr: r.final_loss for lr, r in runs.items()}),
            "loss": statistics.fmean(losses),
            "seeds": len(losses),
            "seed_losses": losses,
            "seed_ids": [r.seed for r in seeds],
            "keys": [r.key for r in seeds],
            "seed_spread": max(losses) - min(losses) if len(losses) > 1 else None,
            "tokens": best.tokens,
            "grid": {f"{lr:.4g}": r.final_loss for lr, r in sorted(runs.items())},
            "curve": best.curve,
        }
    return cells


def share_to_reach(curve: list[tuple[float, float]], loss: float, flops: float) -> float | None:
    """The share of `flops` at which a run's validation curve first reaches `loss` (linear between evaluations),
    None if it never does. Read off a run whose rate has not yet annealed, it overstates what a finished run of
    that length would need, so the share bounds from above what an arm that ends at `loss` is worth."""
    before: tuple[float, float] | None = None
    for spent, value in curve:
        if value <= loss:
            if before is None:
                return spent / flops
            x0, y0 = before
            return (x0 + (y0 - loss) / (y0 - value) * (spent - x0)) / flops
        before = (spent, value)
    return None


def floor_points(ladder: Ladder) -> dict[str, Any]:
    """The control's seeds at each floor length: their losses, spread, and the shortest length under FLOOR_NATS."""
    s = ladder.settings
    rung = ladder.rungs[s.floor_rung]
    control = ladder_arms(["control"])[0]
    per_token = control.flops_per_token(rung.shape, ladder.data)
    grid = ladder.stored(control, rung, _rates_around(s.rates, 2.0), 0, s.floor_grid_tokens * per_token)
    if not grid:
        return {}
    lr = min(grid.values(), key=lambda r: r.final_loss).lr
    lengths = []
    for tokens in s.floor_tokens:
        plans = [ladder.plan(control, rung, lr, seed, tokens * per_token) for seed in range(s.floor_seeds)]
        runs = [ladder.store.get(plan.key) for plan in plans]
        losses = [r.final_loss for r in runs if r is not None]
        spread = max(losses) - min(losses) if len(losses) == s.floor_seeds else None
        lengths.append({"tokens": tokens, "losses": losses, "spread": spread})
    under = [p["tokens"] for p in lengths if p["spread"] is not None and p["spread"] <= FLOOR_NATS]
    return {
        "shape": rung.name,
        "lr": lr,
        "bracket": bracket_status({r.lr: r.final_loss for r in grid.values()}),
        "lengths": lengths,
        "floor_tokens": min(under) if under else None,
        "floor_nats": FLOOR_NATS,
    }


def precision_points(ladder: Ladder) -> dict[str, Any]:
    """Per arm: the seeds' final losses in bf16 and in fp32, their means, spreads and the difference bf16 - fp32."""
    floor = floor_points(ladder)
    if not floor:
        return {}
    s = ladder.settings
    rung = ladder.rungs[s.floor_rung]
    per_token = ladder_arms(["control"])[0].flops_per_token(rung.shape, ladder.data)
    arms = {}
    for arm in ladder_arms(["control", "hires"]):
        losses, lr = {}, precision_rate(ladder, arm, floor["lr"])
        for precision in ("bf16", "fp32"):
            plans = [
                ladder.plan(arm, rung, lr, seed, s.precision_tokens * per_token, precision=precision)
                for seed in range(s.precision_seeds)
            ]
            losses[precision] = [r.final_loss for r in map(ladder.store.get, (p.key for p in plans)) if r]
        complete = all(len(v) == s.precision_seeds for v in losses.values())
        arms[arm.name] = {
            "lr": lr,
            **losses,
            "difference": statistics.fmean(losses["bf16"]) - statistics.fmean(losses["fp32"]) if complete else None,
            "spread": max(max(v) - min(v) for v in losses.values()) if complete else None,
        }
    return {"shape": rung.name, "tokens": s.precision_tokens, "arms": arms}


def stage_of(ladder: Ladder, run: Run) -> str:
    """Which stage a stored run belongs to: a rung's FLOPs is the grid (the top rung's: top); below a rung's FLOPs,
    HiRes or a precision other than the ladder's is the precision check, the control in the ladder's is the floor."""
    flops = run.spec["budget"]["flops"]
    rungs = [rung.flops for rung in ladder.rungs]
    for index, rung_flops in enumerate(rungs):
        if math.isclose(flops, rung_flops, rel_tol=1e-9):
            return "top" if index == len(rungs) - 1 and len(rungs) > 1 else "grid"
    if run.spec["recipe"]["precision"] != ladder.precision or run.spec["arm"]["kind"] != "control":
        return "precision"
    return "floor"


def budget(ladder: Ladder) -> dict[str, Any]:
    """Where the compute went: per stage the stored runs, their counted FLOPs and worker-hours (one worker = one
    core), and the runs planned next (only as far as results so far decide: brackets grow as they come in), with
    the hours they should take on each kind of kernels the ladder's runs were computed by (`planned[stage]["hours"]`:
    {kernels: hours}), at the median speed measured on those kernels at their width (else at every width)."""
    spent = {name: {"runs": 0, "flops": 0.0, "hours": 0.0} for name in STAGES}
    speeds: dict[str, dict[int, list[float]]] = {}  # {kernels: {width: counted FLOPs a second}}
    for run in ladder.store.runs():
        cell = spent[stage_of(ladder, run)]
        flops = run.spec["budget"]["flops"]
        cell["runs"] += 1
        cell["flops"] += flops
        cell["hours"] += run.seconds / 3600
        if run.spec["recipe"]["precision"] == ladder.precision and "segments" not in (run.machine or {}):
            by_width = speeds.setdefault(kernels_of(run), {})  # a run two machines trained has no one speed
            by_width.setdefault(run.spec["config"]["hidden_size"], []).append(flops / run.seconds)
    medians = {
        kind: {width: statistics.median(values) for width, values in by_width.items()}
        for kind, by_width in speeds.items()
    }
    overall = {
        kind: statistics.median([v for values in by_width.values() for v in values])
        for kind, by_width in speeds.items()
    }
    planned = {name: {"runs": 0, "flops": 0.0, "hours": dict.fromkeys(speeds, 0.0)} for name in STAGES}
    for name, stage in STAGES.items():
        for plan in stage(ladder):
            if ladder.store.get(plan.key) is None:
                planned[name]["runs"] += 1
                planned[name]["flops"] += plan.budget.flops
                for kind, by_width in medians.items():
                    speed = by_width.get(plan.shape.hidden_size, overall[kind])
                    planned[name]["hours"][kind] += plan.budget.flops / speed / 3600
    return {"spent": spent, "planned": planned}


def kernels_of(run: Run, unrecorded: str = NATIVE) -> str:
    """The kernels a run's bf16 matrix products ran on; `unrecorded` for runs that do not say (fp32 runs, and bf16
    runs stored before runs recorded their machine: the workers then refused to train bf16 without bf16 units)."""
    return (run.machine or {}).get("bf16_kernels", unrecorded)


# Runs stored before runs recorded their machine: the workers then refused to train bf16 without bf16 matrix units.
UNRECORDED = "not recorded (bf16 matrix units: before the emulation existed, workers refused to train without them)"


def kernels(ladder: Ladder) -> dict[str, list[str]]:
    """The keys of the ladder's bf16 runs by the kernels that computed them (`hires_hf.training.bf16_emulation`)."""
    by_kernels: dict[str, list[str]] = {}
    for run in ladder.store.runs():
        if run.spec["recipe"]["precision"] != "bf16":
            continue
        segments = (run.machine or {}).get("segments")  # trained on more than one machine: under each one's kernels
        labels = [s["machine"].get("bf16_kernels", UNRECORDED) for s in segments] if segments else []
        for label in dict.fromkeys(labels or [kernels_of(run, UNRECORDED)]):
            by_kernels.setdefault(label, []).append(run.key)
    return by_kernels


def in_flight(ladder: Ladder, rungs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each planned run with a stored checkpoint: where it stands (step, last evaluation, training hours, read from
    the checkpoint's header) and, at a rung, the rung's baseline at the same share of its budget (every run
    evaluates at the same shares, so the two line up): an early read of a run that spans sessions, not a result."""
    rows = []
    planned = open_runs(ladder, list(STAGES))
    for plan in planned + hand_seeded(ladder, rungs, {plan.key for plan in planned}):
        path = ladder.store.checkpoint(plan.key)
        if not path.exists():
            continue
        progress = read_progress(path)
        row: dict[str, Any] = {
            "shape": plan.shape.name,
            "arm": plan.arm.name,
            "lr": plan.settings.learning_rate,
            "seed": plan.settings.seed,
            "steps": plan.settings.steps,
            "key": plan.key,
            "step": None,
            "last_eval": None,
            "baseline_then": None,
            "hours": None,
        }
        if progress is not None:
            step, loss = progress["curve"][-1] if progress["curve"] else (0, None)
            row.update(step=progress["step"], last_eval=[step, loss], hours=progress["seconds"] / 3600)
            rung = next((r for r in rungs if r["shape"] == plan.shape.name and r["flops"] == plan.budget.flops), None)
            if rung is not None and rung["baseline"] is not None:
                baseline = rung["arms"][rung["baseline"]]["curve"]
                shares = [(spent / plan.budget.flops, value) for spent, value in baseline]
                row["baseline_then"] = baseline_at(shares, step / plan.settings.steps)
        rows.append(row)
    return rows


# How far from a cell's best rate a run begun by hand is looked for, in x sqrt(2) steps (the top rung's spacing).
HAND_RATE_STEPS = 4


def hand_seeded(ladder: Ladder, rungs: list[dict[str, Any]], planned: set[str]) -> list[RunPlan]:
    """Runs begun by hand (`--cell ARM RUNG RATE --cell-seed N`) beyond the runs the plan holds, at or within four
    sqrt(2) steps of each cell's best rate (a bracket run by hand where the planner's grid has not reached yet): not
    stored yet, with a checkpoint, so that the report shows every run a machine is training."""
    plans, arms = [], {arm.name: arm for arm in ladder.arms}
    for index, rung in enumerate(rungs):
        for name, cell in rung["arms"].items():
            for rate in _rates_around([cell["best_lr"]], SQRT2, HAND_RATE_STEPS):
                for seed in range(MOST_SEEDS):
                    plan = ladder.plan(arms[name], ladder.rungs[index], rate, seed)
                    begun = ladder.store.checkpoint(plan.key).exists() and ladder.store.get(plan.key) is None
                    if begun and plan.key not in planned:
                        plans.append(plan)
    return plans


def gpu_runs(ladder: Ladder) -> dict[str, int]:
    """How many runs each GPU model trained: their losses pool, their timings do not."""
    cards = Counter(gpu for run in ladder.store.runs() if (gpu := (run.machine or {}).get("gpu")))
    return dict(sorted(cards.items()))


def summarize(ladder: Ladder) -> dict[str, Any]:
    """Everything `summary.json` holds: rungs, per-arm cells, baselines, fits, the multiplier and the floor."""
    rungs = ladder.rungs
    summary: dict[str, Any] = {
        "rungs": [],
        "floor": floor_points(ladder),
        "precision": precision_points(ladder),
        "budget": budget(ladder),
        "bf16_kernels": kernels(ladder),
        "device": ladder.device.type,
        "gpus": gpu_runs(ladder),
        "arms": list(ladder.settings.arms),
        "commands": commands(ladder),
    }
    for index, rung in enumerate(rungs):
        cells = rung_cells(ladder, index)
        vanillas = {name: cells[name]["loss"] for name in VANILLAS if name in cells}
        baseline = min(vanillas, key=vanillas.__getitem__) if vanillas else None
        hires = {name: c["loss"] for name, c in cells.items() if ladder_arms([name])[0].kind == HIRES}
        best_hires = min(hires, key=hires.__getitem__) if hires else None
        gap = cells[best_hires]["loss"] - cells[baseline]["loss"] if baseline and best_hires else None
        reference = cells[baseline]["curve"] if baseline else []
        others = {name: c["loss"] for name, c in cells.items() if name != baseline}
        shares = {name: share_to_reach(reference, loss, rung.flops) for name, loss in others.items()}
        summary["rungs"].append(
            {
                "shape": rung.name,
                "flops": rung.flops,
                "tokens": {name: c["tokens"] for name, c in cells.items()},
                "arms": cells,
                "baseline": baseline,
                "best_hires": best_hires,
                "gap": gap,
                "baseline_share": shares,
            }
        )
    noise = seed_noise(summary)
    summary["noise"] = {name: {"sd": n.sd, "df": n.df} for name, n in noise.items()}
    paired = paired_noise(summary)
    summary["paired_noise"] = {name: {"sd": n.sd, "df": n.df} for name, n in paired.items()}
    for rung in summary["rungs"]:
        rung["gap_interval"] = gap_intervals(rung, noise)
        rung["paired"] = paired_gaps(rung, paired)
    summary["in_flight"] = in_flight(ladder, summary["rungs"])
    summary["stalled"] = [
        {"arm": run.arm, "lr": run.lr, "seed": run.seed, "loss": run.final_loss, "key": run.key, **run.stalled}
        for run in ladder.store.runs()
        if run.stalled is not None
    ]
    keys = [key for rung in summary["rungs"] for cell in rung["arms"].values() for key in cell["keys"]]
    summary["traced"] = [key for key in keys if ladder.store.trace(key) is not None]
    contenders = top_contenders(ladder)
    summary["top_pruned"] = contenders[1] if contenders else {}
    summary["fit"] = fit(summary, noise, paired)
    return summary


def commands(ladder: Ladder) -> list[str]:
    """How this device's ladder is run, with the arms named where they are not the default ones, so that the
    committed report can be rebuilt as it is."""
    lines = list(COMMANDS.get(ladder.device.type, ()))
    if tuple(ladder.settings.arms) != LadderSettings.arms:
        lines.append(f"# each hires-hf ladder command above with --arms {' '.join(ladder.settings.arms)}")
    return lines


def gap_intervals(rung: dict[str, Any], noise: dict[str, Noise]) -> dict[str, float]:
    """Per arm but the baseline, the half-width of a 95% interval on its gap to the baseline: the difference of two
    seed means, each side with its own arm's seed noise (Welch), so that a gap inside it is not read as a
    difference."""
    baseline = rung["baseline"]
    if not baseline or noise_of(noise, baseline) is None:
        return {}
    base = rung["arms"][baseline]["seeds"]
    return {
        name: welch_half_width(noise_of(noise, name), cell["seeds"], noise_of(noise, baseline), base)
        for name, cell in rung["arms"].items()
        if name != baseline
    }


def noise_of(noise: dict[str, Noise], name: str) -> Noise | None:
    """An arm's own seed noise, or the all-arms pool where it has no cell with several seeds yet."""
    return noise.get(name, noise.get(ALL_ARMS))


def baseline_settled(rung: dict[str, Any]) -> bool:
    """Whether a rung's baseline can be fitted: every vanilla there has its rate bracketed, since the better of the
    two is only known to be the better once both are."""
    vanillas = [rung["arms"][name] for name in VANILLAS if name in rung["arms"]]
    return bool(vanillas) and all(cell["bracket"] == "bracketed" for cell in vanillas)


def fitted_rungs(summary: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per arm ("baseline" too), the rungs its law is fitted through: those where the baseline and the arm's own rate
    are bracketed, and only arms with two such rungs. A fit through an unbracketed run (HiRes at a rate that
    stalled, say) would read a rate's failure as the architecture's scaling; holding out that arm's point alone,
    not the rung, keeps an arm added mid-way from taking the others' fit with it."""
    rungs = [rung for rung in summary["rungs"] if rung["baseline"] and baseline_settled(rung)]
    arms: dict[str, list[dict[str, Any]]] = {"baseline": rungs}
    for name in dict.fromkeys(name for rung in rungs for name in rung["arms"]):
        arms[name] = [rung for rung in rungs if rung["arms"].get(name, {}).get("bracket") == "bracketed"]
    return {name: own for name, own in arms.items() if len(own) >= 2}


def _loss(rung: dict[str, Any], name: str) -> float:
    """An arm's loss at a rung; "baseline": the better vanilla's."""
    return rung["arms"][rung["baseline"] if name == "baseline" else name]["loss"]


def fit(
    summary: dict[str, Any], noise: dict[str, Noise], paired: dict[str, Noise] | None = None
) -> dict[str, Any] | None:
    """Power laws per arm over its fitted rungs (`fitted_rungs`) and each HiRes arm's FLOPs multiplier over the
    baseline at the top of its own rungs (no arm's law is extrapolated); the headline is the best HiRes arm at the
    highest rung any reaches. `noise` is each arm's seed noise of one run (`seed_noise`), the bootstrap's least
    noise for that arm's points (the baseline's: the two vanillas' pooled, since it is one or the other from rung to
    rung); `paired`, each arm's noise paired with the baseline by seed (`paired_noise`), for its paired trend."""
    rungs = fitted_rungs(summary)
    variants = [name for name in rungs if name != "baseline" and ladder_arms([name])[0].kind == HIRES]
    if "baseline" not in rungs or not variants:
        return None
    points = [Point(name, 1, rung["flops"], _loss(rung, name)) for name, own in rungs.items() for rung in own]
    floors = {name: n.sd for name in ["baseline", *variants] if (n := noise_of(noise, name)) is not None}
    laws = analyse(points, baseline="baseline", bootstrap=0)
    multipliers = {}
    for name in variants:
        own = rungs[name]
        shared = {rung["flops"] for rung in own}
        chosen = [p for p in points if p.arch == name or (p.arch == "baseline" and p.flops in shared)]
        report = analyse(chosen, baseline="baseline", at_compute=own[-1]["flops"], bootstrap=2000, noise=floors)
        multipliers[name] = {
            **_multiplier_record(report.multipliers[0]),
            "gap_per_decade": gap_trend(own, name),
            "gap_per_decade_half_width": gap_trend_half_width(own, name, noise),
            "paired_trend": paired_trend(own, name, paired or {}),
        }
    top = max(rungs[name][-1]["flops"] for name in variants)
    rung = next(r for r in summary["rungs"] if r["flops"] == top)
    hires = min((name for name in variants if rungs[name][-1] is rung), key=lambda name: _loss(rung, name))
    arms = {name for r in summary["rungs"] for name in r["arms"]}
    return {
        "laws": {arch: {"A": f.law.A, "alpha": f.law.alpha, "points": len(f.runs)} for arch, f in laws.fits.items()},
        "rungs": {name: [r["shape"] for r in own] for name, own in rungs.items()},
        "held_out": sorted(arms - set(rungs)),
        "best_hires": hires,
        "multiplier": multipliers[hires],
        "multipliers": multipliers,
        "gap_per_decade": multipliers[hires]["gap_per_decade"],
        "gap_per_decade_half_width": multipliers[hires]["gap_per_decade_half_width"],
        "seed_sd": None if ALL_ARMS not in noise else noise[ALL_ARMS].sd,
        "noise": floors,
        "article": article_test(laws.fits["baseline"].law, summary["rungs"][-1]["flops"], floors, hires, paired),
    }


def _multiplier_record(multiplier: Multiplier) -> dict[str, float]:
    """One arm's multiplier over the baseline, as `summary.json` holds it."""
    return {
        "value": multiplier.value,
        "ci_low": multiplier.ci_low,
        "ci_high": multiplier.ci_high,
        "confidence": multiplier.confidence,
        "at_flops": multiplier.at_compute,
    }


def article_test(
    baseline: PowerLaw, flops: float, noise: dict[str, float], hires: str, paired: dict[str, Noise] | None = None
) -> dict[str, Any] | None:
    """What the article's 1.30x is worth in nats at the top rung (the baseline's law at `flops` against its law at
    1.30x those FLOPs), and the seeds a side whose means tell that gap from none, given the seed noise of the
    baseline and of the best HiRes arm `hires`; with `paired`, also the pairs of seeds that tell it when each
    HiRes seed is read against the baseline's same seed."""
    if "baseline" not in noise or hires not in noise:
        return None
    gap = float(baseline.loss(flops) - baseline.loss(ARTICLE_MULTIPLIER * flops))
    seeds = seeds_to_tell(gap, noise[hires], noise["baseline"])
    pairs = seeds_to_tell(gap, paired[hires].sd, 0.0) if paired and hires in paired else None
    return {"multiplier": ARTICLE_MULTIPLIER, "at_flops": flops, "gap": gap, "seeds": seeds, "pairs": pairs}


def seeds_to_tell(gap: float, sd: float, other_sd: float) -> int:
    """Seeds a side for the difference of two seed means to tell a `gap` from none (95% two-sided, 80% power), when
    one side's runs carry `sd` nats of seed noise and the other's `other_sd`; two at the least, for a spread to be
    measured at all."""
    return max(2, math.ceil((Z_CONFIDENCE + Z_POWER) ** 2 * (sd**2 + other_sd**2) / gap**2))


def seed_noise(summary: dict[str, Any]) -> dict[str, Noise]:
    """Each arm's seed noise of one run's final loss, pooled over its cells with several seeds (the control's with
    the noise floor's longest complete length, control seeds too); "baseline": the two vanillas' pooled, which the
    fit's baseline is drawn from; `ALL_ARMS`: every cell. These are the bootstrap's least noise per point, so that
    three points that happen to fall on a line do not make the multiplier look certain. Stalled seeds are left
    out (`without_stalls`)."""
    groups: dict[str, list[list[float]]] = {}
    for rung in summary["rungs"]:
        for name, cell in rung["arms"].items():
            groups.setdefault(name, []).append(cell["seed_losses"])
    complete = [p["losses"] for p in summary["floor"].get("lengths", []) if p["spread"] is not None]
    groups.setdefault("control", []).extend(complete[-1:])
    pools = {name: pooled(cells) for name, cells in groups.items()}
    pools["baseline"] = pooled(cell for name in VANILLAS for cell in groups.get(name, []))
    pools[ALL_ARMS] = pooled(cell for cells in groups.values() for cell in cells)
    return {name: noise for name, noise in pools.items() if noise is not None}


def gap_trend(rungs: list[dict[str, Any]], name: str) -> float | None:
    """How `name`'s gap to each rung's baseline moves per decade of compute (nats; negative: closing), through the
    rungs that have it: one arm's own gaps, since the best HiRes arm can differ from rung to rung."""
    own = [r for r in rungs if name in r["arms"]]
    weights = trend_weights([r["flops"] for r in own])
    if weights is None:
        return None
    return sum(w * (r["arms"][name]["loss"] - r["arms"][r["baseline"]]["loss"]) for w, r in zip(weights, own))


def gap_trend_half_width(rungs: list[dict[str, Any]], name: str, noise: dict[str, Noise]) -> float | None:
    """Half-width of the 95% interval on `gap_trend` from the seeds' noise alone: the trend is a least-squares slope,
    a weighted sum of the rungs' gaps, each a difference of two seed means, so it is a weighted sum of seed means,
    each with its arm's own noise (`weighted_means_half_width`). None with fewer than two rungs, or without a noise
    figure for an arm. The rates' choice is not in it: a rate chosen by seed 0 is a bias, not noise."""
    own = [r for r in rungs if name in r["arms"]]
    weights = trend_weights([r["flops"] for r in own])
    if weights is None:
        return None
    terms = []
    for rung, weight in zip(own, weights):
        for arm, sign in ((name, 1.0), (rung["baseline"], -1.0)):
            arm_noise = noise_of(noise, arm)
            if arm_noise is None:
                return None
            terms.append((arm, sign * weight, arm_noise, rung["arms"][arm].get("seeds", 1)))
    return weighted_means_half_width(terms)


def trend_weights(flops: list[float]) -> list[float] | None:
    """The least-squares slope per decade of compute as a weighted sum of one value a rung: its weights (None with
    fewer than two distinct rungs). A trend's value and its interval both come from them."""
    decades = [math.log10(f) for f in flops]
    if len(decades) < 2:
        return None
    centre = statistics.fmean(decades)
    spread = sum((x - centre) ** 2 for x in decades)
    return [(x - centre) / spread for x in decades] if spread else None


def seeds_by_id(cell: dict[str, Any]) -> dict[int, float]:
    """A cell's final losses by seed (cells stored before seeds were recorded hold seeds 0, 1, ... in order)."""
    ids = cell.get("seed_ids", range(len(cell["seed_losses"])))
    return dict(zip(ids, cell["seed_losses"]))


def paired_noise(summary: dict[str, Any]) -> dict[str, Noise]:
    """Per arm, the seed noise of its paired difference to each rung's baseline (the same seed: the same batches in
    the same order), pooled over the rungs. Where the batch order moves both arms alike it cancels in the pair, and
    this is smaller than the two arms' own noises together; where an arm's scatter is its own, it is not."""
    groups: dict[str, list[list[float]]] = {}
    for rung in summary["rungs"]:
        base = rung["baseline"]
        for name, cell in rung["arms"].items() if base else ():
            if name != base:
                pairs = paired_differences(seeds_by_id(cell), seeds_by_id(rung["arms"][base]))
                groups.setdefault(name, []).append(pairs)
    return {name: noise for name, cells in groups.items() if (noise := pooled(cells)) is not None}


def paired_gaps(rung: dict[str, Any], noise: dict[str, Noise]) -> dict[str, dict[str, float]]:
    """Per arm but the baseline, its mean paired difference to the baseline over the seeds both have (a stalled pair
    left out), their number, and the half-width of its 95% interval from the arm's paired noise."""
    base = rung["baseline"]
    gaps = {}
    for name, cell in rung["arms"].items() if base else ():
        if name == base or name not in noise:
            continue
        differences = paired_differences(seeds_by_id(cell), seeds_by_id(rung["arms"][base]))
        kept = without_stalls(differences) if differences else []
        if not kept:
            continue
        width = weighted_means_half_width([(name, 1.0, noise[name], len(kept))])
        gaps[name] = {"gap": statistics.fmean(kept), "pairs": len(kept), "half_width": width}
    return gaps


def paired_trend(rungs: list[dict[str, Any]], name: str, noise: dict[str, Noise]) -> dict[str, float] | None:
    """`name`'s trend read from its paired gaps, with its 95% interval from the paired noise; None where fewer than
    two rungs have a paired gap."""
    own = [r for r in rungs if name in r.get("paired", {})]
    weights = trend_weights([r["flops"] for r in own])
    if weights is None or name not in noise:
        return None
    gaps = [r["paired"][name] for r in own]
    terms = [(name, w, noise[name], gap["pairs"]) for w, gap in zip(weights, gaps)]
    return {
        "per_decade": sum(w * gap["gap"] for w, gap in zip(weights, gaps)),
        "half_width": weighted_means_half_width(terms),
    }


def table(summary: dict[str, Any]) -> str:
    rows = []
    for rung in summary["rungs"]:
        for name, cell in rung["arms"].items():
            spread = "" if cell["seed_spread"] is None else f"{cell['seed_spread']:.3f}"
            mark = " (baseline)" if name == rung["baseline"] else ""
            gap = cell["loss"] - rung["arms"][rung["baseline"]]["loss"] if rung["baseline"] else float("nan")
            share = rung["baseline_share"].get(name)
            reach = "" if name == rung["baseline"] else "not in its budget" if share is None else f"{share:.2f}"
            interval = rung["gap_interval"].get(name)
            rows.append(
                (
                    rung["shape"],
                    f"{rung['flops']:.3g}",
                    name + mark,
                    f"{cell['tokens'] / 1e6:.1f}M",
                    f"{cell['best_lr']:.3g}",
                    cell["bracket"],
                    f"{cell['loss']:.4f}",
                    f"{gap:+.4f}",
                    "" if interval is None else f"{interval:.3f}",
                    reach,
                    f"{cell['seeds']}",
                    spread,
                )
            )
    headers = ["rung", "FLOPs/run", "arm", "tokens", "best lr", "bracket", "loss", "vs baseline", "±95%"]
    headers += ["baseline reaches it", "seeds", "spread"]
    note = (
        "*±95%*: half-width of a 95% interval on the gap, from the seeds on each side and each arm's own seed noise"
        " of one run (Welch, Student-t; the noise line below); a gap inside it is not a difference. *Baseline"
        " reaches it*: the share of its budget at which the baseline's best run first reaches the arm's final loss,"
        " an upper bound on the arm's worth in the baseline's compute (that run's rate had not annealed yet)."
    )
    return "\n".join([*markdown_table(headers, rows, "lrlrrlrrrrrr"), "", note])


def paired_table(summary: dict[str, Any]) -> list[str]:
    """Each arm's gap read seed by seed against the baseline's same seed, beside the table's unpaired gap, and each
    fitted HiRes arm's trend read the same way, as markdown lines; none before any rung has a pair."""
    rows = [
        (
            rung["shape"],
            name,
            str(gap["pairs"]),
            f"{gap['gap']:+.4f} ± {gap['half_width']:.3f}",
            f"{rung['arms'][name]['loss'] - rung['arms'][rung['baseline']]['loss']:+.4f} ± "
            f"{rung['gap_interval'][name]:.3f}",
        )
        for rung in summary["rungs"]
        for name, gap in rung.get("paired", {}).items()
    ]
    if not rows:
        return []
    noise = "; ".join(f"{name} {n['sd']:.4f} ({n['df']} df)" for name, n in summary["paired_noise"].items())
    trends = {
        name: m["paired_trend"]
        for name, m in ((summary.get("fit") or {}).get("multipliers") or {}).items()
        if m.get("paired_trend")
    }
    trend = "; ".join(f"{name} {t['per_decade']:+.3f} ± {t['half_width']:.3f}" for name, t in trends.items())
    return [
        "**Paired by seed.** A seed fixes the batches and their order for every arm, so each arm's run can be read"
        " against the baseline's run of the same seed: the part of the noise the batch order brings to both cancels."
        f" Noise of one pair: {noise}.",
        "",
        *markdown_table(["rung", "arm", "pairs", "paired gap ±95%", "unpaired gap ±95%"], rows, "llrrr"),
        "",
        *([f"Trends read from the paired gaps, nats a decade: {trend}.", ""] if trend else []),
    ]


def held_out_note(summary: dict[str, Any]) -> str | None:
    """The gap read from the seeds that did not choose the rate. Seed 0 picks each arm's best rate, so it is the
    luckiest draw there and a cell's mean leans low, more where more rates tie; its other seeds are free of that."""
    cells = [cell for rung in summary["rungs"] for cell in rung["arms"].values() if cell["seeds"] > 1]
    if not cells:
        return None
    lowest = sum(cell["seed_losses"][0] == min(cell["seed_losses"]) for cell in cells)
    gaps = []
    for rung in summary["rungs"]:
        others = {name: cell["seed_losses"][1:] for name, cell in rung["arms"].items() if cell["seeds"] > 1}
        held_out = {name: statistics.fmean(without_stalls(losses)) for name, losses in others.items()}
        arms = [name for name in held_out if name not in VANILLAS]  # every HiRes arm: the best was chosen by seed 0
        if rung["baseline"] in held_out and arms:
            each = ", ".join(f"{name} {held_out[name] - held_out[rung['baseline']]:+.4f}" for name in arms)
            gaps.append(f"{rung['shape']} against {rung['baseline']}: {each}")
    return (
        f"**Free of the rate choice:** seed 0 chose each arm's best rate and is the lowest seed of its cell in {lowest}"
        f" of {len(cells)} cells with several, so a cell's mean leans low. The gap from the other seeds' means (a"
        " stall left out): " + ("; ".join(gaps) if gaps else "no rung has them for both arms yet") + "."
    )


def _grid_entry(cell: dict[str, Any], column: str) -> str:
    """One arm's loss in the rate table's `column` (a rate as printed): blank off its grid, bold at its best, then
    its other seeds."""
    grid = {rate_label(float(rate)): (float(rate), loss) for rate, loss in cell["grid"].items()}
    if column not in grid:
        return ""
    lr, loss = grid[column]
    if not math.isclose(lr, cell["best_lr"], rel_tol=1e-6):
        return f"{loss:.4f}"
    return f"**{loss:.4f}**" + "".join(f" / {seed_loss:.4f}" for seed_loss in cell["seed_losses"][1:])


def rate_label(lr: float) -> str:
    """A rate as the tables print it. Rates reached by different routes (0.01131 / sqrt(2) = 0.007997 and 0.008)
    print alike and so share a column."""
    return f"{lr:.3g}"


def rate_tables(summary: dict[str, Any]) -> list[str]:
    """Per rung, every arm's final loss at each rate of its grid (seed 0), its best in bold followed by the other
    seeds' losses there: the brackets behind the main table, as markdown lines."""
    lines = []
    for rung in summary["rungs"]:
        if not rung["arms"]:
            continue
        rates = sorted({float(lr) for cell in rung["arms"].values() for lr in cell["grid"]})
        columns = list(dict.fromkeys(rate_label(lr) for lr in rates))
        rows = [(name, *(_grid_entry(cell, column) for column in columns)) for name, cell in rung["arms"].items()]
        lines += [
            f"**Rate grid at {rung['shape']}** (final loss at each peak rate, seed 0; the best in bold, then the other "
            "seeds' losses at that rate):",
            "",
            *markdown_table(["arm", *columns], rows, "l" + "r" * len(columns)),
            "",
        ]
    return lines


# The budget table's name for each kind of kernels, where the ladder has runs on more than one.
KERNEL_COLUMNS = {NATIVE: "hours next, bf16 units", EMULATED: "hours next, emulated bf16"}


def budget_table(account: dict[str, Any], device: str) -> str:
    kinds = list(next(iter(account["planned"].values()))["hours"]) if account["planned"] else []
    rows = [
        (
            name,
            str(spent["runs"]),
            f"{spent['flops']:.3g}",
            f"{spent['hours']:.1f}",
            str(account["planned"][name]["runs"]),
            f"{account['planned'][name]['flops']:.3g}",
            *(f"{account['planned'][name]['hours'][kind]:.1f}" for kind in kinds),
        )
        for name, spent in account["spent"].items()
    ]
    hours = sum(cell["hours"] for cell in account["spent"].values())
    columns = [KERNEL_COLUMNS.get(kind, kind) for kind in kinds] if len(kinds) > 1 else ["hours next"] * len(kinds)
    headers = ["stage", "runs done", "FLOPs done", "worker-hours", "runs next", "FLOPs next", *columns]
    intro = (
        f"**Budget** ({hours:.1f} worker-hours so far; {WORKER.get(device, 'one worker')}). Next = the runs"
        " planned as far as results so far decide, their hours at the speed measured at their width"
        + (" on each kind of kernels the ladder's runs have used:" if len(kinds) > 1 else ":")
    )
    return "\n".join([intro, "", *markdown_table(headers, rows, "lrrrrr" + "r" * len(kinds))])


def _unreached(lengths: list[dict[str, Any]]) -> str:
    if all(p["spread"] is not None for p in lengths):
        return f"not reached by {lengths[-1]['tokens'] / 1e6:g}M tokens, the longest length measured."
    return "not reached yet."


def _cards(gpus: dict[str, int] | list[str]) -> str:
    """The title's device: one card by name, or each card with how many runs it trained (their losses pool, their
    timings do not)."""
    if len(gpus) == 1:
        return f" on one {next(iter(gpus))}"
    if isinstance(gpus, dict) and gpus:
        return " on one GPU at a time: " + ", ".join(f"{name} ({count} runs)" for name, count in gpus.items())
    return " on GPUs" if gpus else ""


def markdown(summary: dict[str, Any]) -> str:
    title = "# Compute ladder" + _cards(summary.get("gpus") or {})
    lines = [title, "", "Commands:", "", "```", *summary["commands"], "```", ""]
    floor = summary["floor"]
    if floor:
        lengths = ", ".join(
            f"{p['tokens'] / 1e6:g}M: " + ("-" if p["spread"] is None else f"{p['spread']:.3f}")
            for p in floor["lengths"]
        )
        reached = floor["floor_tokens"]
        lines += [
            f"**Noise floor** ({floor['shape']}, control at lr {floor['lr']:.3g}, {floor['bracket']}; spread of 3 "
            f"seeds by training tokens): {lengths}. Shortest length at or under {floor['floor_nats']} nats: "
            + (f"{reached / 1e6:g}M tokens." if reached else _unreached(floor["lengths"])),
            "",
            "![noise floor](noise_floor.png)",
            "",
        ]
    precision = summary["precision"]
    if precision:
        rows = [
            (
                name,
                f"{cell['lr']:.3g}",
                " ".join(f"{x:.4f}" for x in cell["bf16"]),
                " ".join(f"{x:.4f}" for x in cell["fp32"]),
                "-" if cell["difference"] is None else f"{cell['difference']:+.4f}",
                "-" if cell["spread"] is None else f"{cell['spread']:.4f}",
            )
            for name, cell in precision["arms"].items()
        ]
        lines += [
            f"**bf16 against fp32** ({precision['shape']}, {precision['tokens'] / 1e6:g}M tokens, each arm at a rate "
            "it trains at; the difference of the seed means against the larger seed spread):",
            "",
            *markdown_table(["arm", "lr", "bf16 seeds", "fp32 seeds", "bf16 - fp32", "seed spread"], rows, "lrllrr"),
            "",
        ]
    lines += [table(summary), ""]
    lines += paired_table(summary)
    held_out = held_out_note(summary)
    if held_out:
        lines += [held_out, ""]
    if any(rung["arms"] for rung in summary["rungs"]):
        lines += [*rate_tables(summary), "![final loss against rate](rates.png)", ""]
    if summary["traced"]:
        lines += [
            "Training loss step by step (every seed at each arm's best rate, as far as each run's last checkpoint):",
            "",
            "![training loss along the best runs](traces.png)",
            "",
        ]
    lines += in_flight_table(summary["in_flight"])
    for row in summary["stalled"]:
        lines += [
            f"Ended as stalled (`hires_hf.experiments.stalls`): {row['arm']} at lr {row['lr']:.3g}, "
            f"seed {row['seed']}: {row['loss']:.4f} at step {row['step']:,} of {row['of']:,}, where the rung's "
            f"baseline was at {row['baseline']:.4f}; its loss is an upper bound.",
            "",
        ]
    for name, gap in summary["top_pruned"].items():
        lines += [f"Not at the top rung: {name}, {gap:.3f} nats behind the best HiRes at the rung below.", ""]
    lines += ["![ladder](ladder.png)", ""]
    if any(rung["baseline"] for rung in summary["rungs"]):
        lines += ["Each arm's gap to its rung's baseline (95% intervals from the seeds), with the trends:", ""]
        lines += ["![gaps to the baseline](gaps.png)", ""]
    lines += [budget_table(summary["budget"], summary["device"]), ""]
    if len(summary.get("bf16_kernels", {})) > 1:
        counts = "; ".join(f"{len(keys)} on {label}" for label, keys in summary["bf16_kernels"].items())
        lines += [f"bf16 runs by the kernels that computed them (`summary.json` lists their keys): {counts}.", ""]
    result = summary.get("fit")
    if result and result["multiplier"]:
        m = result["multiplier"]
        lines.append(
            f"**Multiplier** of {result['best_hires']} over the baseline at {m['at_flops']:.3g} FLOPs: "
            f"{m['value']:.3f} ({m['confidence']:.0%} CI {m['ci_low']:.3f}-{m['ci_high']:.3f}, bootstrap with at least "
            f"each arm's seed noise of one run a point); gap trend {trend_text(result['multiplier'])} nats per decade "
            "of compute (95% interval from the seeds' noise)."
        )
        others = {name: m for name, m in result.get("multipliers", {}).items() if name != result["best_hires"]}
        if others:
            each = "; ".join(
                f"{name} {m['value']:.3f} ({m['ci_low']:.3f}-{m['ci_high']:.3f})"
                + ("" if m["at_flops"] == result["multiplier"]["at_flops"] else f" at {m['at_flops']:.3g} FLOPs")
                + f", {trend_text(m)} a decade"
                for name, m in others.items()
            )
            lines[-1] += f" The other HiRes arms, each at the top of its fitted rungs: {each}."
        if result.get("held_out"):
            lines[-1] += (
                f" Not fitted (its rate bracketed at fewer than two rungs with a bracketed baseline): "
                f"{', '.join(result['held_out'])}."
            )
        if result.get("article"):
            a = result["article"]
            lines += [
                "",
                f"**Seeds the verdict needs:** the article's {a['multiplier']:.2f}x is worth {a['gap']:.3f} nats at "
                f"{a['at_flops']:.3g} FLOPs (the baseline's fit). With {result['noise'][result['best_hires']]:.4f} "
                f"nats of seed noise a run for {result['best_hires']} and {result['noise']['baseline']:.4f} for the "
                f"baseline, {a['seeds']} seeds a side tell that gap from none (95% two-sided, 80% power)."
                + (
                    ""
                    if a.get("pairs") is None
                    else f" Read in pairs of the same seed ({summary['paired_noise'][result['best_hires']]['sd']:.4f} "
                    f"nats of noise a pair): {a['pairs']} pairs."
                ),
            ]
    else:
        lines.append("The fit needs two rungs where the baseline and a HiRes arm have their rates bracketed.")
    if summary.get("noise"):
        lines += ["", noise_line(summary["noise"])]
    return "\n".join(lines) + "\n"


def trend_text(multiplier: dict[str, Any]) -> str:
    """An arm's gap trend with its interval, as the report writes it ("-0.066 ± 0.115")."""
    width = multiplier.get("gap_per_decade_half_width")
    return f"{multiplier['gap_per_decade']:+.3f}" + ("" if width is None else f" ± {width:.3f}")


def noise_line(noise: dict[str, dict[str, float]]) -> str:
    """Each arm's seed noise of one run, as the gap intervals and the bootstrap use it."""
    arms = "; ".join(
        f"{name} {n['sd']:.4f} ({n['df']} df)" for name, n in noise.items() if name not in ("baseline", ALL_ARMS)
    )
    pools = [
        f"{label} {noise[name]['sd']:.4f}"
        for name, label in (("baseline", "the vanillas together"), (ALL_ARMS, "every cell pooled"))
        if name in noise
    ]
    return (
        f"**Seed noise of one run** (standard deviation of the final loss, pooled over each arm's cells with several"
        f" seeds, a stalled seed left out): {arms}; {', '.join(pools)}. Each arm's own figure sets its gap intervals"
        " and its points' least noise in the multiplier's bootstrap, so that an arm whose seeds scatter more gets"
        " the wider interval."
    )


def in_flight_table(rows: list[dict[str, Any]]) -> list[str]:
    """The runs under way (a stop leaves them as checkpoints), as markdown lines; none when nothing is."""
    if not rows:
        return []

    def cell(row: dict[str, Any]) -> tuple[str, ...]:
        step, loss = row["last_eval"] or (None, None)
        then = row["baseline_then"]
        return (
            row["shape"],
            row["arm"],
            f"{row['lr']:.3g}",
            str(row["seed"]),
            "unreadable" if row["step"] is None else f"{row['step']:,} of {row['steps']:,}",
            "-" if loss is None else f"{loss:.4f} at {step / row['steps']:.0%}",
            "-" if then is None else f"{then:.4f}",
            "-" if row["hours"] is None else f"{row['hours']:.2f}",
        )

    header = ["rung", "arm", "lr", "seed", "step", "last evaluation", "baseline then", "hours"]
    return [
        "**In flight** (runs with a checkpoint; *baseline then*: the rung's baseline at the same share of its budget):",
        "",
        *markdown_table(header, [cell(row) for row in rows], "lllrrrrr"),
        "",
    ]


def write_report(ladder: Ladder, folder: Path) -> str:
    """summary.json, ladder.md and the figures under `folder`; returns the markdown."""
    summary = summarize(ladder)
    if not any(rung["arms"] for rung in summary["rungs"]) and not (
        summary["floor"] or summary["in_flight"] or summary["stalled"]
    ):
        raise HiResUserError(f"No ladder runs under {folder}: run `hires-hf ladder` first.")
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "summary.json", summary, default=str)
    if summary["floor"]:
        tokens = [t for rung in summary["rungs"] for t in rung["tokens"].values()]
        plot_floor(summary["floor"], folder / "noise_floor.png", min(tokens, default=None))
    if any(rung["arms"] for rung in summary["rungs"]):
        plot(summary, folder / "ladder.png")
        plot_rates(summary, folder / "rates.png")
        plot_gaps(summary, folder / "gaps.png")
    if summary["traced"]:
        plot_traces(ladder, summary, folder / "traces.png")
    text = markdown(summary)
    write_text_atomic(folder / "ladder.md", text)
    return text


__all__ = ["share_to_reach", "summarize", "write_report"]
