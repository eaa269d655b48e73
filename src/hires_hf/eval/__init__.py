"""Evaluation: lm-eval-harness on HiRes folders with offline stdlib tasks, sliding-window perplexity, and
scaling-law fits that turn a ladder of runs into HiRes's FLOPs-efficiency multiplier over the control.

lm-eval (the `eval` extra) is imported only by `harness` functions that run it.
"""

from .perplexity import Perplexity, sliding_window_perplexity
from .scaling import Point, PowerLaw, analyse, efficiency_multiplier, fit_power_law, read_runs

__all__ = [
    "Perplexity",
    "Point",
    "PowerLaw",
    "analyse",
    "efficiency_multiplier",
    "fit_power_law",
    "read_runs",
    "sliding_window_perplexity",
]
