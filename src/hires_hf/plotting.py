"""Figures without a display: the one place that selects matplotlib's file-only backend (Agg).

Every figure this package and its benchmarks draw is written to a PNG, never shown; `pyplot()` hands out
`matplotlib.pyplot` with Agg selected, so that no headless machine (CI, a GPU box, a shared CPU) needs a display.
matplotlib is imported only when a figure is drawn: importing a module that can plot stays cheap.
"""

from __future__ import annotations

from types import ModuleType


def pyplot() -> ModuleType:
    """`matplotlib.pyplot`, with the Agg backend selected (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


__all__ = ["pyplot"]
