"""How much one run's final loss moves with its seed, per arm, and the intervals that noise puts on a gap.

One pooled seed noise for every arm was the ladder's first model. The CPU ladder's cells refute it: HiRes's seeds
(a late induction-head transition on some of them) scatter ~0.09 nats, the vanillas' ~0.01-0.03, a variance ratio
near 20 on 6 and 10 degrees of freedom. A pooled figure then makes a HiRes gap look surer than it is and a gap
between the two vanillas look less sure. So each arm gets its own noise, pooled over its cells (the rungs differ
in loss, not, we assume, in how an arm's seeds scatter), with the degrees of freedom that came with it, and a gap's
interval is Welch's: each side's own noise and a Student-t quantile for the few seeds behind it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .stalls import STALL_NATS


@dataclass(frozen=True)
class Noise:
    """The seed standard deviation of one run's final loss, and the degrees of freedom it was estimated with."""

    sd: float
    df: int


def without_stalls(losses: list[float]) -> list[float]:
    """A cell's seed losses less those more than `STALL_NATS` above the cell's median: a stalled seed is a failure
    of its rate, shown in its cell, not seed noise (one stalled control on one H200 made the pooled noise 0.55
    nats and the multiplier's interval 0-19,000)."""
    median = statistics.median(losses)
    return [loss for loss in losses if loss - median <= STALL_NATS]


def paired_differences(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """`a` minus `b` for every seed both have, seed by seed. A ladder seed fixes the batches and their order for
    every arm, so the part of each run's noise that the batch order brings to both cancels in the difference."""
    return [a[seed] - b[seed] for seed in sorted(a.keys() & b.keys())]


def pooled(groups: Iterable[list[float]]) -> Noise | None:
    """The pooled standard deviation of several groups of seed losses (each about its own mean, stalls left out),
    weighted by their degrees of freedom; None when no group has two losses."""
    kept = [g for g in map(without_stalls, groups) if len(g) > 1]
    if not kept:
        return None
    df = sum(len(g) - 1 for g in kept)
    squares = sum(statistics.variance(g) * (len(g) - 1) for g in kept)
    return Noise(sd=math.sqrt(squares / df), df=df)


def t_quantile(probability: float, df: float) -> float:
    """The Student-t quantile (e.g. 0.975 for a two-sided 95% interval) at real-valued `df`, by bisection on the
    t density's integral: numpy only, so that the report needs no scipy."""
    if not 0.5 <= probability < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0.5 <= probability < 1 and df > 0; got {probability}, {df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def upper_half(x: float) -> float:  # the integral of the density from 0 to x
        grid = np.linspace(0.0, x, 4001)
        density = np.exp(log_norm - (df + 1) / 2 * np.log1p(grid**2 / df))
        return float(np.trapezoid(density, grid))

    low, high = 0.0, 1.0
    while 0.5 + upper_half(high) < probability:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if 0.5 + upper_half(middle) < probability else (low, middle)
    return (low + high) / 2


def welch_half_width(a: Noise, seeds_a: int, b: Noise, seeds_b: int, confidence: float = 0.95) -> float:
    """Half-width of the `confidence` interval on the difference of two seed means, `seeds_a` runs with noise `a`
    against `seeds_b` with noise `b`: Welch's standard error, with the Welch-Satterthwaite degrees of freedom
    built from each noise's own (they come from the arm's pooled cells, not from these seeds alone)."""
    return weighted_means_half_width([("a", 1.0, a, seeds_a), ("b", -1.0, b, seeds_b)], confidence)


def weighted_means_half_width(terms: Iterable[tuple[str, float, Noise, int]], confidence: float = 0.95) -> float:
    """Half-width of the `confidence` interval on a weighted sum of seed means, each term (source, weight, noise,
    seeds): a gap is two terms, a gap's trend over rungs is two a rung. Terms of one source share one noise estimate,
    so they are added before the Welch-Satterthwaite degrees of freedom are counted (one estimate is one chi-square,
    however many means it scales)."""
    sources: dict[str, tuple[Noise, float]] = {}
    for source, weight, noise, seeds in terms:
        _, share = sources.get(source, (noise, 0.0))
        sources[source] = (noise, share + weight**2 / seeds)
    parts = [(noise.sd**2 * share, noise.df) for noise, share in sources.values()]
    variance = sum(part for part, _ in parts)
    if variance == 0:
        return 0.0
    df = variance**2 / sum(part**2 / df for part, df in parts if part)
    return t_quantile(0.5 + confidence / 2, df) * math.sqrt(variance)
