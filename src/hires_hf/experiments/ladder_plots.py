"""The ladder's figures, drawn from its summary (`ladder_report.summarize`): the loss against compute with each
arm's fitted law, the gaps to each rung's baseline with their intervals, the rate brackets, the training traces
behind each best and the noise floor. Kept apart from the report's numbers so that the statistics read without
matplotlib in the way.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from ..eval.scaling import ARTICLE_MULTIPLIER
from ..plotting import ARM_COLOURS, Curve, draw_loss_vs_flops, pyplot, save_figure
from .ladder import Ladder


def plot(summary: dict[str, Any], path: Path) -> Path:
    """Best loss per arm against compute (points), the fitted laws (lines); right: the best runs' curves."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    arms = sorted({name for rung in summary["rungs"] for name in rung["arms"]})
    laws = (summary.get("fit") or {}).get("laws", {})
    fitted = (summary.get("fit") or {}).get("rungs", {})
    colours = plt.get_cmap("tab10")
    for i, name in enumerate(arms):
        colour = ARM_COLOURS.get(name, colours(i % 10))
        points = [(r["flops"], r["arms"][name]["loss"]) for r in summary["rungs"] if name in r["arms"]]
        left.plot(*zip(*points, strict=True), "o", color=colour, label=name)
        if name in laws:  # drawn over the rungs it is fitted through
            flops = [r["flops"] for r in summary["rungs"] if r["shape"] in fitted[name]]
            grid = [min(flops) * (max(flops) / min(flops)) ** (t / 20) for t in range(21)]
            law = laws[name]
            left.plot(grid, [law["A"] * c ** -law["alpha"] for c in grid], color=colour, linewidth=1)
    draw_loss_vs_flops(left, [], "best loss per rung, with L = A C^-alpha fits")
    left.legend(fontsize=8)
    curves = [
        Curve(f"{rung['shape']} {name}", cell["curve"], ARM_COLOURS.get(name, colours(arms.index(name) % 10)))
        for rung in summary["rungs"]
        for name, cell in rung["arms"].items()
    ]
    draw_loss_vs_flops(right, curves, "each arm's best run along training")
    right.legend(fontsize=6, ncol=2)
    return save_figure(figure, path)


def plot_gaps(summary: dict[str, Any], path: Path) -> Path:
    """The verdict as a picture: each arm's gap to its rung's baseline with the table's 95% interval (open markers:
    read in pairs of the same seed), each fitted HiRes arm's trend (dashed), and what the article's 1.30x is worth
    at each compute (dotted; below zero is ahead), so that a reader sees at once whether a gap is told from none
    and from the claim."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8, 5))
    fit_result = summary.get("fit") or {}
    arms = sorted({name for rung in summary["rungs"] for name in rung["arms"]})
    colours = plt.get_cmap("tab10")
    for i, name in enumerate(arms):
        colour = ARM_COLOURS.get(name, colours(i % 10))
        offset = 1.04 ** (i - (len(arms) - 1) / 2)  # side by side at each rung
        _draw_gaps(axis, summary, name, colour, offset)
        trend = fit_result.get("multipliers", {}).get(name)
        if trend:
            own = [r for r in summary["rungs"] if r["shape"] in fit_result["rungs"][name]]
            x = [math.log10(r["flops"]) for r in own]
            y = [r["arms"][name]["loss"] - r["arms"][r["baseline"]]["loss"] for r in own]
            centre, level = statistics.fmean(x), statistics.fmean(y)
            ends = [min(x), max(x)]
            line = [level + trend["gap_per_decade"] * (e - centre) for e in ends]
            axis.plot([10**e for e in ends], line, "--", color=colour, linewidth=1)
    law = fit_result.get("laws", {}).get("baseline")
    if law:
        grid = [r["flops"] for r in summary["rungs"] if r["baseline"]]
        worth = [law["A"] * c ** -law["alpha"] - law["A"] * (ARTICLE_MULTIPLIER * c) ** -law["alpha"] for c in grid]
        axis.plot(grid, [-w for w in worth], ":", color="black", label=f"the article's {ARTICLE_MULTIPLIER:.2f}x")
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xlabel("counted training FLOPs a run")
    axis.set_ylabel("gap to the rung's baseline (nats; below zero: ahead)")
    axis.set_title("gaps with 95% intervals (open: paired by seed); dashed: each HiRes arm's trend")
    axis.legend(fontsize=8)
    return save_figure(figure, path)


def _draw_gaps(axis: Any, summary: dict[str, Any], name: str, colour: Any, offset: float) -> None:
    """One arm's gaps at every rung where it is not the baseline: filled, the seed means'; open, just right of them,
    the same gaps read in pairs of the same seed."""
    rows = [
        (r["flops"], r["arms"][name]["loss"] - r["arms"][r["baseline"]]["loss"], r["gap_interval"].get(name, 0.0))
        for r in summary["rungs"]
        if r["baseline"] and name in r["arms"] and name != r["baseline"]
    ]
    if rows:
        flops, gaps, widths = zip(*rows, strict=True)
        axis.errorbar([f * offset for f in flops], gaps, yerr=widths, fmt="o", capsize=3, color=colour, label=name)
    pairs = [(r["flops"], r["paired"][name]) for r in summary["rungs"] if name in r.get("paired", {})]
    if pairs:
        flops, paired = zip(*pairs, strict=True)
        axis.errorbar(
            [f * offset * 1.015 for f in flops],
            [p["gap"] for p in paired],
            yerr=[p["half_width"] for p in paired],
            fmt="o",
            markerfacecolor="white",
            capsize=2,
            color=colour,
            alpha=0.7,
        )


# How far above a rung's lowest loss the rate figure reaches; a diverged run above it sits on the edge, marked ^.
RATE_PLOT_SPAN = 0.6


def plot_rates(summary: dict[str, Any], path: Path) -> Path:
    """Final loss against peak rate, one panel a rung: where each arm's best sits in its bracket (seed 0, dots)
    and how far the other seeds at the best rate land from it (rings)."""
    plt = pyplot()
    rungs = [rung for rung in summary["rungs"] if rung["arms"]]
    figure, axes = plt.subplots(1, len(rungs), figsize=(6.4 * len(rungs), 4.6), squeeze=False)
    colours = plt.get_cmap("tab10")
    for axis, rung in zip(axes[0], rungs, strict=True):
        losses = [x for cell in rung["arms"].values() for x in [*cell["grid"].values(), *cell["seed_losses"]]]
        low, top = min(losses), min(max(losses), min(losses) + RATE_PLOT_SPAN)
        for i, (name, cell) in enumerate(sorted(rung["arms"].items())):
            colour = ARM_COLOURS.get(name, colours(i % 10))
            grid = sorted((float(lr), loss) for lr, loss in cell["grid"].items())
            rates = [lr for lr, _ in grid]
            axis.plot(rates, [min(loss, top) for _, loss in grid], "o-", color=colour, label=name)
            for lr, loss in grid:
                if loss > top:
                    axis.plot(lr, top, "^", color=colour, markersize=9)
                    axis.annotate(f"{loss:.2f}", (lr, top), textcoords="offset points", xytext=(-30, -4), fontsize=7)
            others = cell["seed_losses"][1:]
            axis.scatter([cell["best_lr"]] * len(others), others, s=40, facecolors="none", edgecolors=colour)
        axis.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (nats)")
        ticks = sorted({float(lr) for cell in rung["arms"].values() for lr in cell["grid"]})
        axis.set_xticks(ticks, [f"{lr:.3g}" for lr in ticks])
        axis.minorticks_off()
        axis.set_ylim(low - 0.02, top + 0.03)
        axis.set_title(
            f"{rung['shape']}, {rung['flops']:.3g} FLOPs a run: seed 0 (dots), more seeds (rings)", fontsize=9
        )
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    return save_figure(figure, path)


def running_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value with the `window` - 1 before it (fewer at the start): per-batch noise smoothed."""
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(values))]


def plot_traces(ladder: Ladder, summary: dict[str, Any], path: Path) -> Path:
    """Training loss along every seed of each arm's best rate, one panel a rung (a running mean of 1% of the run):
    what the eight evaluations cannot show, a spike or a plateau between two of them."""
    plt = pyplot()
    traced = set(summary["traced"])
    rungs = [rung for rung in summary["rungs"] if any(k in traced for c in rung["arms"].values() for k in c["keys"])]
    figure, axes = plt.subplots(1, len(rungs), figsize=(6.4 * len(rungs), 4.6), squeeze=False)
    colours = plt.get_cmap("tab10")
    for axis, rung in zip(axes[0], rungs, strict=True):
        ends = []
        for i, (name, cell) in enumerate(sorted(rung["arms"].items())):
            for seed, key in enumerate(cell["keys"]):
                trace = ladder.store.trace(key)
                if trace is None:
                    continue
                flops = rung["flops"] / ladder.store.get(key).steps
                smooth = running_mean([loss for _, loss in trace], max(1, len(trace) // 100))
                label = f"{name} {cell['best_lr']:.3g}" + (f" s{seed}" if seed else "")
                colour = ARM_COLOURS.get(name, colours(i % 10))
                axis.plot(
                    [step * flops for step, _ in trace],
                    smooth,
                    color=colour,
                    label=label,
                    linestyle="-" if seed == 0 else "--",
                    linewidth=1,
                )
                ends.append(smooth[len(smooth) // 5])
        axis.set(xlabel="counted training FLOPs", ylabel="training loss (running mean)")
        if ends:
            axis.set_ylim(top=max(ends))
        axis.set_title(f"{rung['shape']}: every seed at each arm's best rate", fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    return save_figure(figure, path)


def plot_floor(floor: dict[str, Any], path: Path, shortest_run: float | None = None) -> Path:
    """Seed spread (max - min of the control's seeds) against training tokens, with the floor line and, where
    known, the shortest run of the ladder's rungs (every verdict run sits to its right)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    points = [(p["tokens"], p["spread"]) for p in floor["lengths"] if p["spread"] is not None]
    if points:
        axis.plot(*zip(*points, strict=True), "o-", color="black", label="control, 3 seeds (max - min)")
    axis.axhline(floor["floor_nats"], color="tab:red", linestyle="--", label=f"{floor['floor_nats']} nats")
    if shortest_run:
        label = f"shortest ladder run ({shortest_run / 1e6:.1f}M tokens)"
        axis.axvline(shortest_run, color="tab:blue", linestyle=":", label=label)
    axis.set(xscale="log", xlabel="training tokens", ylabel="seed spread (nats)")
    axis.set_title(f"noise floor at {floor['shape']} (lr {floor['lr']:.3g}, this corpus)", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return save_figure(figure, path)


__all__ = ["plot", "plot_floor", "plot_gaps", "plot_rates", "plot_traces", "running_mean"]
