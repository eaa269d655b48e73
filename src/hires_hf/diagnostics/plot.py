"""PNG figures of diagnostics: a training run's rows over steps, or one model's probe per block."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..plotting import pyplot
from .probes import COLLAPSED_ENTROPY

plt = pyplot()  # a leaf module that only draws: selecting the file-only backend on import is its job
from matplotlib.ticker import MaxNLocator  # noqa: E402  (after the backend is chosen)

# What a healthy model looks like on these probes (docs/stability.md): a stream that carries its tokens has a
# small shared fraction (~0.1; 1 means every token carries the same vector), and a block adds to the stream
# rather than replacing it (write / stream below ~1).
HEALTHY_SHARED, HEALTHY_WRITE = 0.5, 1.0


def _series(rows: Sequence[dict[str, Any]], key: str) -> dict[int, list[float]]:
    """Per block (or layer) index, the value of `key` at each row."""
    series: dict[int, list[float]] = {}
    for row in rows:
        for index, unit in enumerate(row["units"]):
            series.setdefault(index, []).append(unit.get(key, float("nan")))
    return series


def _groups(rows: Sequence[dict[str, Any]], key: str) -> dict[str, list[float]]:
    names: list[str] = []
    for row in rows:
        names += [name for name in row.get(key, {}) if name not in names]
    return {name: [row.get(key, {}).get(name, float("nan")) for row in rows] for name in names}


def plot_run(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Panels over training steps: stream shared fraction per block, write/stream ratio per block, attention entropy
    per layer (above); update-to-weight ratio and gradient norm per parameter group, and the loss where the rows
    have one (below)."""
    steps = [row["step"] for row in rows]
    fig, axes = plt.subplots(2, 3, figsize=(17, 8))
    unit = rows[0].get("kind", "block")
    panels = [
        (axes[0, 0], _series(rows, "stream_shared"), f"shared fraction of the stream entering each {unit}", False),
        (axes[0, 1], _series(rows, "write_to_stream"), "RMS(write) / RMS(stream) per block", True),
        (axes[1, 0], _groups(rows, "update_ratio"), "update / weight per step, by group", True),
        (axes[1, 1], _groups(rows, "grad_norm"), "gradient norm, by group", True),
    ]
    for ax, series, label, log in panels:
        for name, values in series.items():
            ax.plot(steps[: len(values)], values, label=str(name))
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        if log and any(value > 0 for values in series.values() for value in values):
            ax.set_yscale("log")
        if series:
            ax.legend(fontsize=7, ncol=2)
    axes[0, 0].plot(steps, [row["final_shared"] for row in rows], "k--", label="final hidden")
    axes[0, 0].legend(fontsize=7, ncol=2)
    axes[0, 0].set_ylim(-0.02, 1.02)
    _healthy(axes[0, 0], HEALTHY_SHARED, "healthy below (1 = every token the same)")
    _healthy(axes[0, 1], HEALTHY_WRITE, "healthy below (a block adds, not replaces)")
    _entropy_panel(axes[0, 2], [row for row in rows if row.get("attention_entropy")])
    _loss_panel(axes[1, 2], [(row["step"], row["loss"]) for row in rows if "loss" in row])
    return _save(fig, title or "HiRes training diagnostics", path)


def _loss_panel(ax: plt.Axes, points: Sequence[tuple[int, float]]) -> None:
    """The loss at the probed steps, where the caller recorded one (`after_step(model, step, loss=...)`)."""
    if not points:
        ax.axis("off")
        return
    ax.plot(*zip(*points, strict=True), color="black")
    ax.set_title("loss (as recorded with the probes)", fontsize=10)
    ax.set_xlabel("step")


def _entropy_panel(ax: plt.Axes, rows: Sequence[dict[str, Any]]) -> None:
    """Each layer's attention entropy over the steps that probed it, with the line below which all have collapsed."""
    steps = [row["step"] for row in rows]
    layers = list(zip(*(row["attention_entropy"] for row in rows), strict=False))  # one series per layer
    for layer, values in enumerate(layers):  # first layer dark, last light
        label = f"layer {layer}" if layer in (0, len(layers) - 1) else None
        ax.plot(steps, values, color=plt.cm.viridis(layer / max(len(layers) - 1, 1)), label=label)
    ax.set_title("attention entropy / uniform, per layer", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.05)
    _collapsed(ax)


def plot_probe(probe: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """One model: per block, the stream's RMS and shared fraction and the write/stream ratio; attention entropy."""
    units = probe["units"]
    index = list(range(len(units)))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].bar(index, [u["stream_shared"] for u in units])
    axes[0].set_title("shared fraction of the stream entering each block", fontsize=10)
    axes[0].set_ylim(0, 1)
    axes[1].bar(index, [u.get("write_to_stream", float("nan")) for u in units])
    axes[1].set_title("RMS(write) / RMS(stream)", fontsize=10)
    entropy = probe.get("attention_entropy", [])
    axes[2].plot(range(len(entropy)), entropy, marker="o")
    axes[2].set_title("attention entropy / uniform, per layer", fontsize=10)
    axes[2].set_ylim(0, 1.05)
    _healthy(axes[0], HEALTHY_SHARED, "healthy below (1 = every token the same)")
    _healthy(axes[1], HEALTHY_WRITE, "healthy below (a block adds, not replaces)")
    _collapsed(axes[2])
    for ax in axes[:2]:
        ax.set_xlabel("block")
    axes[2].set_xlabel("layer")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # blocks and layers are whole numbers
    return _save(fig, title, path)


def _healthy(ax: plt.Axes, value: float, label: str) -> None:
    """A dashed line at the edge of healthy values, with a legend entry saying which side is healthy."""
    ax.axhline(value, color="green", linestyle=":", linewidth=1, label=label)
    ax.legend(fontsize=7)


def _collapsed(ax: plt.Axes) -> None:
    """The entropy below which, in every layer, the attention has collapsed (`attention_collapsed`)."""
    ax.axhline(COLLAPSED_ENTROPY, color="red", linestyle=":", linewidth=1, label="collapsed if every layer is below")
    ax.legend(fontsize=7)


def _save(fig: plt.Figure, title: str, path: str | Path) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["plot_probe", "plot_run"]
