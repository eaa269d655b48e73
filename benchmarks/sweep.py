"""The HiRes design sweep: which HiRes (if any) beats the strongest simple vanilla at matched counted FLOPs?

One factor at a time around the shipped default, each arm over its own learning-rate grid (x2 steps, extended
until its best rate is bracketed), every arm at the same counted training FLOPs, on the same batches, with the
package's one recipe (`hires_hf.experiments.harness`). The baseline is the control: the Llama twin with HiRes's
embedding scale. Stages, each resumable (a run already in the results is never trained again) and shardable over
worker processes (`--worker i/n`, one thread each by default):

    python -m benchmarks.sweep grid  --worker 0/2 & python -m benchmarks.sweep grid --worker 1/2   # the factors
    python -m benchmarks.sweep combo --worker 0/2 & ...   # the best two factors combined, own grid
    python -m benchmarks.sweep refine --worker 0/2 & ...  # x sqrt(2) around the control's and the 2 best HiRes' best
    python -m benchmarks.sweep seeds --worker 0/2 & ...   # seed 1 for every cell within 0.1 nats of the winner
    python -m benchmarks.sweep long  --worker 0/2 & ...   # the best HiRes and the control at 4x the length
    python -m benchmarks.sweep peers --worker 0/2 & ...   # mHC-4 and Block AttnRes, own grids
    python -m benchmarks.sweep report                     # table + loss-vs-FLOPs plots

`--shape 96x12` runs the second shape (3 blocks of 4) with its own arm list; `--smoke` is seconds (tests).
Writes benchmarks/results/sweep/<shape>/ (runs-*.jsonl, sweep.md, sweep.json, *.png).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import LlamaConfig

from hires_hf.experiments.harness import (
    CONTROL,
    DEFAULT_RATES,
    HIRES,
    PLAIN,
    Arm,
    Budget,
    Data,
    Run,
    Shape,
    bracket_status,
    execute,
    loss_at_flops,
    plan_budget,
    plan_run,
    prepare_data,
    sweep_rates,
)
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import Curve, draw_loss_vs_flops, pyplot, save_figure
from hires_hf.tables import markdown_table

RESULTS = Path(__file__).resolve().parent / "results" / "sweep"
GRID = DEFAULT_RATES
NEAR_WINNER = 0.1  # nats: cells this close to the winner get a second seed
LONG = 4  # the length check trains this many times the budget
GAP_POINTS = (1 / 8, 1 / 4, 1 / 2, 1)  # where along the long runs the gap is read
LONG_SEEDS = (0,)  # one seed: the gap is read along each run, early against late


@dataclass(frozen=True)
class Setup:
    """One sweep: its shape, data and budget (the control's `control_steps` steps of `batch_size` blocks)."""

    shape: Shape
    context: int = 128
    batch_size: int = 16
    control_steps: int = 120
    corpus: str = "stdlib"
    max_chars: int = 12_000_000
    eval_blocks: int = 64
    evaluations: int = 8

    @classmethod
    def smoke(cls) -> Setup:
        shape = Shape(hidden_size=32, num_hidden_layers=4, layers_per_block=2, head_dim=16, vocab_size=300)
        return cls(shape, context=32, batch_size=4, control_steps=6, max_chars=150_000, eval_blocks=4, evaluations=2)


def factor_arms(shape: Shape) -> list[Arm]:
    """The control, the shipped default and one factor changed at a time (most telling first); the plain twin."""
    ks = [k for k in (2, 8, 6, 3) if k != shape.layers_per_block and shape.num_hidden_layers % k == 0][:2]
    return [
        Arm("control", CONTROL),
        Arm("hires"),
        Arm("D=d", fields={"residual_ratio": 1.0}),
        Arm("D=4d", fields={"residual_ratio": 4.0}),
        *(Arm(f"k={k}", fields={"layers_per_block": k}) for k in ks),
        Arm("delta-write", fields={"write_mode": "delta"}),
        Arm("identity-init", fields={"projection_init": "identity"}),
        Arm("fan-in-init", fields={"projection_init": "fan_in"}),
        Arm("skip-scale-2", fields={"skip_scale": 2.0}),
        Arm("write-mult-x0.5", fields={"write_multiplier": 0.5 * 128 / shape.hidden_size}),
        Arm("embed-mult-x0.5", fields={"embedding_multiplier": 25.0}),
        Arm("plain-twin", PLAIN),
    ]


# ---------------------------------------------------------------------------------------------------- peers
@dataclass(frozen=True)
class PeerArm(Arm):
    """A residual-widening peer (benchmarks/peers.py) around the twin's Llama layers, with the control's
    embedding scale; counted FLOPs are the twin's plus the peer's own."""

    def _llama(self, shape: Shape, data: Data) -> LlamaConfig:
        return Arm("twin", PLAIN).config(shape, data)

    def flops_per_token(self, shape: Shape, data: Data) -> float:
        from benchmarks.peers import attnres_extra_flops_per_token, mhc_extra_flops_per_token

        llama = self._llama(shape, data)
        extra = mhc_extra_flops_per_token(llama) if self.name == "mHC-4" else attnres_extra_flops_per_token(llama)
        return Arm("twin", PLAIN).flops_per_token(shape, data) + 3.0 * extra

    def model(self, shape: Shape, data: Data) -> torch.nn.Module:
        from benchmarks.peers import BlockAttnResForCausalLM, MHCForCausalLM

        llama = self._llama(shape, data)
        model = MHCForCausalLM(llama, streams=4) if self.name == "mHC-4" else BlockAttnResForCausalLM(llama)
        model.apply(_normal_init(llama.initializer_range))
        scale = 1.0 / llama.initializer_range  # the control's embedding scale
        model.embed_tokens.register_forward_hook(lambda module, inputs, output: output * scale)
        return model


def _normal_init(std: float):
    def init(module: torch.nn.Module) -> None:
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)

    return init


PEERS = (PeerArm("mHC-4", "peer"), PeerArm("BlockAttnRes", "peer"))


# ---------------------------------------------------------------------------------------------------- results
def folder(setup: Setup, smoke: bool) -> Path:
    return RESULTS / ("smoke" if smoke else setup.shape.name)


def load_runs(where: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(where.glob("runs-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


class Recorder:
    """Appends each finished run to this worker's jsonl; a run is reused only under the key of its full spec
    (`hires_hf.experiments.runs`), so rows from before a change of default, shape rule or code are history that
    the stages read but never pass off as done."""

    def __init__(self, where: Path, worker: int) -> None:
        where.mkdir(parents=True, exist_ok=True)
        self.path = where / f"runs-w{worker}.jsonl"
        self.rows = load_runs(where)
        self.done = {row["key"]: row for row in self.rows if row.get("key")}

    def add(self, row: dict[str, Any]) -> None:
        self.done[row["key"]] = row
        self.rows.append(row)
        with self.path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


def trainer(setup: Setup, data: Data, recorder: Recorder, arm: Arm, seed: int = 0, length: int = 1, bar=None):
    """A function lr -> Run for one arm, reusing recorded runs; `length` multiplies the budget."""
    budget = Budget(flops=length * control_flops(setup, data), batch_size=setup.batch_size)

    def train(lr: float) -> Run:
        plan = plan_run(arm, lr, setup.shape, data, budget, seed, evaluations=setup.evaluations)
        found = recorder.done.get(plan.key)
        if found is not None:
            return Run.from_json(found)
        if bar is not None:
            bar.set_postfix_str(f"{arm.name} lr={lr:g} seed={seed} x{length}")
        run = execute(plan, data)
        recorder.add({**run.to_json(), "length": length, "fields": arm.fields, "kind": arm.kind})
        if bar is not None:
            bar.update(1)
        return run

    return train


def control_flops(setup: Setup, data: Data) -> float:
    """The sweep's budget: `control_steps` steps of the control (the harness's planner)."""
    return plan_budget(Arm("control", CONTROL), setup.shape, data, setup.batch_size, steps=setup.control_steps).flops


# ---------------------------------------------------------------------------------------------------- stages
def best_by_arm(rows: list[dict[str, Any]], length: int = 1) -> dict[str, dict[str, Any]]:
    """Each arm's best seed-0 run at `length` (with its bracket status)."""
    out = {}
    for arm, group in itertools.groupby(
        sorted((r for r in rows if r["seed"] == 0 and r.get("length", 1) == length), key=lambda r: r["arm"]),
        key=lambda r: r["arm"],
    ):
        group = list(group)
        best = min(group, key=lambda r: r["final_loss"])
        out[arm] = {**best, "bracket": bracket_status({r["lr"]: r["final_loss"] for r in group})}
    return out


def combined_arm(rows: list[dict[str, Any]], arms: list[Arm]) -> Arm | None:
    """The best two HiRes factors (other than the default) whose fields do not clash, combined."""
    best = best_by_arm(rows)
    default = best.get("hires", {}).get("final_loss", math.inf)
    factors = sorted(
        (a for a in arms if a.kind == HIRES and a.fields and a.name in best and best[a.name]["final_loss"] < default),
        key=lambda a: best[a.name]["final_loss"],
    )
    for first, second in itertools.combinations(factors, 2):
        if not set(first.fields) & set(second.fields):
            return Arm(f"{first.name}+{second.name}", fields={**first.fields, **second.fields})
    return None


def refine_rates(rows: list[dict[str, Any]], count: int = 2) -> dict[str, list[float]]:
    """x sqrt(2) either side of the best rate of the control and of the `count` best HiRes arms: a x2 grid can
    miss an optimum between its points by more than the gaps being measured."""
    best = best_by_arm(rows)
    hires = sorted((a for a, b in best.items() if b["kind"] == HIRES), key=lambda a: best[a]["final_loss"])[:count]
    return {arm: [best[arm]["lr"] / math.sqrt(2), best[arm]["lr"] * math.sqrt(2)] for arm in ["control", *hires]}


def seed_cells(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """(arm, lr) cells that get a second seed: every seed-0 cell within NEAR_WINNER of the best one, and the best
    cell of the control, of the shipped default and of the two best HiRes arms (the verdict and the choice of
    default compare those, whatever their distance)."""
    first = [r for r in rows if r["seed"] == 0 and r.get("length", 1) == 1 and r["kind"] != "peer"]
    winner = min(r["final_loss"] for r in first)
    cells = [(r["arm"], r["lr"]) for r in first if r["final_loss"] <= winner + NEAR_WINNER]
    best = best_by_arm(rows)
    hires = sorted((a for a, b in best.items() if b["kind"] == HIRES), key=lambda a: best[a]["final_loss"])[:2]
    cells += [(arm, best[arm]["lr"]) for arm in ["control", "hires", *hires] if arm in best]
    return sorted(set(cells))


def best_hires(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best HiRes arm with D > d: lowest mean over the seeds of its best rate."""
    means = {}
    for arm, best in best_by_arm(rows).items():
        if best["kind"] != HIRES or best["fields"].get("residual_ratio", 2.0) <= 1.0:
            continue
        losses = [r["final_loss"] for r in rows if (r["arm"], r["lr"], r.get("length", 1)) == (arm, best["lr"], 1)]
        means[arm] = (sum(losses) / len(losses), best)
    return min(means.values(), key=lambda item: item[0])[1]


def run_stage(
    stage: str,
    setup: Setup,
    data: Data,
    where: Path,
    worker: int,
    workers: int,
    only: Sequence[str] = (),
    seed: int | None = None,
) -> None:
    """Train this worker's share of the stage's jobs; `only` limits the grid and the seeds to the arms it names,
    `seed` is the seed the seeds stage adds (default 1) or the long stage runs (default LONG_SEEDS)."""
    recorder = Recorder(where, worker)
    rows = list(recorder.rows)
    arms = {arm.name: arm for arm in [*factor_arms(setup.shape), *PEERS]}
    jobs: list[tuple[Arm, list[float], int, int, bool]] = []  # arm, rates, seed, length, extend
    if stage == "grid":
        jobs = [(arm, list(GRID), 0, 1, True) for arm in factor_arms(setup.shape) if not only or arm.name in only]
    elif stage == "peers":
        jobs = [(arm, list(GRID), 0, 1, True) for arm in PEERS]
    elif stage == "combo":
        combo = combined_arm(rows, list(arms.values()))
        jobs = [(combo, list(GRID), 0, 1, True)] if combo else []
    elif stage == "refine":
        jobs = [(_arm_of(name, rows, arms), rates, 0, 1, False) for name, rates in refine_rates(rows).items()]
    elif stage == "seeds":
        cells = [(name, lr) for name, lr in seed_cells(rows) if not only or name in only]
        jobs = [(_arm_of(name, rows, arms), [lr], seed or 1, 1, False) for name, lr in cells]
    elif stage == "long":
        hires, control = best_hires(rows), best_by_arm(rows)["control"]
        pairs = [(r, s) for s in (LONG_SEEDS if seed is None else (seed,)) for r in (hires, control)]
        jobs = [(_arm_of(r["arm"], rows, arms), [r["lr"]], seed, LONG, False) for r, seed in pairs]
    mine = jobs[worker::workers]
    total = sum(len(rates) for _, rates, _, _, _ in mine)
    with tqdm(total=total, desc=f"{stage} {worker}/{workers}", unit="run", dynamic_ncols=True) as bar:
        for arm, rates, seed, length, extend in mine:
            train = trainer(setup, data, recorder, arm, seed, length, bar)
            if extend:
                sweep_rates(train, rates)
                bar.total = max(bar.total, bar.n + 1)
            else:
                for lr in rates:
                    train(lr)


def _arm_of(name: str, rows: list[dict[str, Any]], arms: dict[str, Arm]) -> Arm:
    if name in arms:
        return arms[name]
    row = next(r for r in rows if r["arm"] == name)
    return Arm(name, row["kind"], row["fields"])


# ---------------------------------------------------------------------------------------------------- report
def mean_best_rate(rows: list[dict[str, Any]], arm: str, seed0_best: float) -> float:
    """The arm's rate with the lowest mean over seeds among the rates run on more than one seed (a lucky seed 0 at
    one rate must not pick it); the seed-0 best where no rate has a second seed."""
    by_rate: dict[float, list[float]] = {}
    for r in rows:
        if r["arm"] == arm and r.get("length", 1) == 1:
            by_rate.setdefault(r["lr"], []).append(r["final_loss"])
    seeded = {lr: losses for lr, losses in by_rate.items() if len(losses) > 1}
    return min(seeded, key=lambda lr: sum(seeded[lr]) / len(seeded[lr])) if seeded else seed0_best


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: best rate (by the mean over seeds where a rate has several), bracket, seed losses at that rate,
    mean, gap to the control's mean."""
    best = best_by_arm(rows)
    summary = {}
    for arm, b in best.items():
        lr = mean_best_rate(rows, arm, b["lr"])
        seeds = sorted(
            (r for r in rows if (r["arm"], r["lr"], r.get("length", 1)) == (arm, lr, 1)), key=lambda r: r["seed"]
        )
        losses = [r["final_loss"] for r in seeds]
        summary[arm] = {
            "kind": b["kind"],
            "fields": b["fields"],
            "lr": lr,
            "bracket": b["bracket"],
            "rates": sorted(r["lr"] for r in rows if r["arm"] == arm and r["seed"] == 0 and r.get("length", 1) == 1),
            "losses": losses,
            "mean": sum(losses) / len(losses),
            "half_range": (max(losses) - min(losses)) / 2,
            "flops_per_token": b["flops_per_token"],
            "steps": b["steps"],
            "tokens_per_second": b["tokens_per_second"],
        }
    control = summary.get("control")
    for item in summary.values():
        item["gap"] = item["mean"] - control["mean"] if control else math.nan
    return summary


def gap_over_training(rows: list[dict[str, Any]], arm: str, length: int = 1) -> list[tuple[float, float]]:
    """(FLOPs, arm minus control) along training, at the arm's and the control's best rates, per seed mean."""
    best = best_by_arm(rows, length) if length == 1 else best_by_arm(rows)

    def runs_of(name: str) -> list[Run]:
        return [
            Run.from_json(r)
            for r in rows
            if r["arm"] == name and r["lr"] == best[name]["lr"] and r.get("length", 1) == length
        ]

    mine, control = runs_of(arm), runs_of("control")
    if not mine or not control:
        return []
    flops = [f for f, _ in mine[0].curve if f > 0]
    mean = lambda runs, f: sum(loss_at_flops(r, f) for r in runs) / len(runs)  # noqa: E731
    return [(f, mean(mine, f) - mean(control, f)) for f in flops]


def report(setup: Setup, where: Path, command: str) -> str:
    rows = load_runs(where)
    summary = summarize(rows)
    order = sorted(summary, key=lambda a: summary[a]["mean"])
    seconds = sum(r["seconds"] for r in rows)
    lines = [
        f"# HiRes design sweep at {setup.shape.name} (d={setup.shape.hidden_size}, L={setup.shape.num_hidden_layers})",
        "",
        f"Every arm trains for the control's counted FLOPs of {setup.control_steps} steps of {setup.batch_size} x "
        f"{setup.context} tokens ({setup.control_steps * setup.batch_size * setup.context / 1e6:.2f}M control tokens;"
        f" an arm that costs more per token takes fewer steps), corpus `{setup.corpus}`,"
        f" vocab {setup.shape.vocab_size},"
        f" one recipe (AdamW 0.9/0.95, wd 0.1, transformers' cosine_with_min_lr: warmup 5%, floor 10%, clip 1.0)."
        f" Learning rates: a x2 grid from {', '.join(f'{lr:g}' for lr in GRID)}, extended until each arm's best is"
        f" bracketed, then x sqrt(2) either side of the best of the control and the two best HiRes arms (`refine`)."
        f" Final validation loss at the best rate (by the mean over seeds where a rate ran several); seeds at that"
        f" rate (a second seed for the control, the shipped"
        f" default, the two best HiRes arms and every cell within {NEAR_WINNER} of the winner); gap = arm mean -"
        f" control mean (negative: the arm wins); steps and FLOPs/token per arm (counted, training)."
        f" {len(rows)} runs, {seconds / 3600:.1f} process-hours of training, two single-threaded processes on"
        f" 2 cores.",
        "",
        f"Commands: `{command}` (see the module docstring of `benchmarks/sweep.py` for the stages).",
        "",
    ]
    rows_out = []
    for arm in order:
        s = summary[arm]
        seeds = " / ".join(f"{loss:.3f}" for loss in s["losses"])
        fields = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in s["fields"].items())
        rows_out.append(
            [
                f"**{arm}**" if arm == "control" else arm,
                fields or ("(baseline)" if arm == "control" else ""),
                f"{s['lr']:.3g}",
                s["bracket"] + ("" if s["bracket"] == "bracketed" else " ⚠"),
                ", ".join(f"{lr:.3g}" for lr in s["rates"]),
                seeds,
                f"{s['mean']:.3f}",
                f"{s['gap']:+.3f}",
                s["steps"],
                f"{s['flops_per_token'] / 1e6:.2f}M",
            ]
        )
    lines += markdown_table(
        [
            "arm",
            "changed",
            "best lr",
            "bracket",
            "rates tried",
            "loss by seed (0 / 1 / 2)",
            "mean",
            "gap",
            "steps",
            "FLOPs/tok",
        ],
        rows_out,
    )
    long_rows = [r for r in rows if r.get("length", 1) == LONG]
    if long_rows:
        lines += ["", f"## Length check: {LONG}x the budget at each arm's best rate", ""]
        out = []
        for arm in sorted({r["arm"] for r in long_rows}):
            runs = [r for r in long_rows if r["arm"] == arm]
            losses = [r["final_loss"] for r in sorted(runs, key=lambda r: r["seed"])]
            gap_1x = summary.get(arm, {}).get("gap", math.nan)
            gaps = gap_over_training(rows, arm, LONG) if arm != "control" else []
            out.append(
                [
                    arm,
                    f"{runs[0]['lr']:.3g}",
                    " / ".join(f"{loss:.3f}" for loss in losses),
                    f"{sum(losses) / len(losses):.3f}",
                    f"{gap_1x:+.3f}",
                    " → ".join(f"{gaps[round(f * len(gaps)) - 1][1]:+.3f}" for f in GAP_POINTS) if gaps else "",
                ]
            )
        header = ["arm", "lr", f"loss at {LONG}x", "mean", "gap at 1x", f"gap at 1/8 → 1/4 → 1/2 → all of {LONG}x"]
        lines += markdown_table(header, out)
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], where: Path, title: str) -> None:
    plt = pyplot()
    summary = summarize(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    colours = plt.get_cmap("tab20")
    for i, arm in enumerate(sorted(summary, key=lambda a: summary[a]["mean"])):
        s = summary[arm]
        run = next(
            Run.from_json(r) for r in rows if (r["arm"], r["lr"], r["seed"], r.get("length", 1)) == (arm, s["lr"], 0, 1)
        )
        style = {"color": "black", "linewidth": 2.5} if arm == "control" else {"color": colours(i % 20)}
        draw_loss_vs_flops(
            left, [Curve(f"{arm} ({s['lr']:.3g})", run.curve, style["color"], width=2.5 if arm == "control" else 1.5)]
        )
        grid = sorted(
            (r["lr"], r["final_loss"]) for r in rows if r["arm"] == arm and r["seed"] == 0 and r.get("length", 1) == 1
        )
        right.plot(*zip(*grid), marker="o", label=arm, **style)
    left.set_title(f"{title}: best rate per arm")
    left.set_ylim(top=min(7.0, left.get_ylim()[1]))
    right.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss", title="learning-rate grids")
    right.set_ylim(top=min(6.5, right.get_ylim()[1]))
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    save_figure(fig, where / "sweep.png")
    long_arms = sorted({r["arm"] for r in rows if r.get("length", 1) == LONG})
    if long_arms:
        fig, axis = plt.subplots(figsize=(7, 5))
        curves = [
            Curve(f"{arm} seed {r['seed']}", r["curve"], "black" if arm == "control" else "tab:red", r["seed"] > 0)
            for arm in long_arms
            for r in rows
            if r["arm"] == arm and r.get("length", 1) == LONG
        ]
        draw_loss_vs_flops(axis, curves, f"{title}: {LONG}x the budget")
        save_figure(fig, where / "sweep_long.png")


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("grid", "combo", "refine", "seeds", "long", "peers", "report"))
    parser.add_argument("--shape", default="128x16", help="WIDTHxLAYERS (k=4, D=2d)")
    parser.add_argument("--head-dim", type=int, default=64, help="dims per attention head (default 64)")
    parser.add_argument("--arms", nargs="+", default=(), help="grid, seeds: only these arms (default: all)")
    parser.add_argument("--seed", type=int, help="seeds: the seed to add (default 1); long: the seed (default 0)")
    parser.add_argument("--worker", default="0/1", help="i/n: this process trains every n-th job from the i-th")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run of the stage (tests)")
    args = parser.parse_args(argv)
    setup = Setup.smoke() if args.smoke else Setup(Shape.parse(args.shape, head_dim=args.head_dim))
    where = folder(setup, args.smoke)
    command = (
        f"python -m benchmarks.sweep {{grid,combo,refine,seeds,long,peers}} --shape {setup.shape.name} --worker i/2"
    )
    if args.stage == "report":
        rows = load_runs(where)
        if not rows:
            print(f"No runs under {where}: run a stage first (python -m benchmarks.sweep grid).", file=sys.stderr)
            return 2
        text = report(setup, where, command)
        write_text_atomic(where / "sweep.md", text)
        write_json_atomic(where / "sweep.json", {"setup": repr(setup), "summary": summarize(rows)})
        plot(rows, where, setup.shape.name)
        print(text)
        return 0
    worker, workers = (int(part) for part in args.worker.split("/"))
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = prepare_data(
        setup.corpus, setup.shape.vocab_size, setup.context, setup.max_chars, eval_blocks=setup.eval_blocks
    )
    run_stage(args.stage, setup, data, where, worker, workers, args.arms, args.seed)
    print(f"{args.stage} {worker}/{workers} done in {(time.perf_counter() - start) / 60:.1f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
