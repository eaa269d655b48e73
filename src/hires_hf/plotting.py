"""Figures without a display: the one place that selects matplotlib's file-only backend (Agg).

Every figure this package and its benchmarks draw is written to a PNG, never shown; `pyplot()` hands out
`matplotlib.pyplot` with Agg selected, so that no headless machine (CI, a GPU box, a shared CPU) needs a display.
matplotlib is imported only when a figure is drawn: importing a module that can plot stays cheap.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# One colour an architecture, in every figure: the baseline black, HiRes red, the plain twin grey.
ARM_COLOURS = {
    "control": "black",
    "hires": "tab:red",
    "plain-twin": "tab:gray",
    "D=4d": "tab:blue",  # the fallback (tab10 by position) gave it hires's red
    "qk-norm": "tab:purple",
    "k=6": "tab:green",  # the block-size arms: the colour cycle would repeat hires's red by the fourth line
    "k=2": "tab:orange",
    "no-outer-norm": "tab:brown",
}


def pyplot() -> ModuleType:
    """`matplotlib.pyplot`, with the Agg backend selected (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class Curve:
    """One line of a loss-vs-FLOPs figure: (counted training FLOPs, validation loss) points and how to draw them."""

    label: str | None
    points: Sequence[tuple[float, float]]
    colour: str | None = None
    dashed: bool = False
    marker: str | None = None
    width: float = 1.5


def draw_loss_vs_flops(axis: Any, curves: Sequence[Curve], title: str | None = None) -> None:
    """The package's one loss-vs-compute axes: log FLOPs, loss in nats, a legend; the step-0 point left out."""
    for curve in curves:
        points = [(f, loss) for f, loss in curve.points if f > 0]
        if not points:
            continue
        flops, losses = zip(*points, strict=True)
        axis.plot(
            flops,
            losses,
            label=curve.label,
            color=curve.colour or ARM_COLOURS.get(curve.label or ""),
            linestyle="--" if curve.dashed else "-",
            marker=curve.marker,
            markersize=4,
            linewidth=curve.width,
        )
    axis.set(xscale="log", xlabel="counted training FLOPs", ylabel="validation loss (nats)")
    if title:
        axis.set_title(title, fontsize=9, wrap=True)
    axis.grid(alpha=0.3)
    if any(curve.label for curve in curves):
        axis.legend(fontsize=7)


def save_figure(figure: Any, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Write `figure` as a PNG through a temporary sibling and a rename, then close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(handle)
    try:
        figure.tight_layout()
        figure.savefig(temporary, dpi=dpi)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    finally:
        pyplot().close(figure)
    return path


__all__ = ["ARM_COLOURS", "Curve", "draw_loss_vs_flops", "pyplot", "save_figure"]
