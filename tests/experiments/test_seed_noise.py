"""Per-arm seed noise and the Welch interval on a gap (`hires_hf.experiments.seed_noise`)."""

from __future__ import annotations

import math
import statistics

import pytest

from hires_hf.experiments.seed_noise import Noise, paired_differences, pooled, t_quantile, welch_half_width


@pytest.mark.parametrize(("probability", "df", "table"), [(0.975, 1, 12.7062), (0.975, 4, 2.7764), (0.9, 10, 1.3722)])
def test_the_t_quantile_is_the_tables(probability, df, table):
    assert t_quantile(probability, df) == pytest.approx(table, abs=1e-4)


def test_the_t_quantile_falls_to_the_normals_with_many_degrees_of_freedom():
    assert t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)
    assert t_quantile(0.975, 2.5) > t_quantile(0.975, 3) > t_quantile(0.975, 30)


def test_pooling_weights_each_cell_by_its_degrees_of_freedom_and_leaves_out_a_stall():
    steady, scattered = [2.0, 2.01, 2.02], [3.0, 3.1]
    noise = pooled([steady, scattered, [2.5]])  # a lone seed says nothing of the spread
    squares = statistics.variance(steady) * 2 + statistics.variance(scattered)
    assert noise == Noise(sd=pytest.approx(math.sqrt(squares / 3)), df=3)
    assert pooled([[2.0, 2.01, 2.02, 4.0]]) == pooled([[2.0, 2.01, 2.02]])  # 2 nats above the median: a stall
    assert pooled([[2.0], [3.0]]) is None


def test_welchs_interval_is_the_textbook_one_where_the_two_sides_scatter_alike():
    noise = Noise(sd=0.05, df=10**6)
    assert welch_half_width(noise, 4, noise, 4) == pytest.approx(1.96 * 0.05 * math.sqrt(0.5), rel=1e-3)
    few = Noise(sd=0.05, df=2)  # the same noise known from two degrees of freedom a side: t on 4 of them
    assert welch_half_width(few, 4, few, 4) == pytest.approx(2.7764 * 0.05 * math.sqrt(0.5), rel=1e-3)


def test_runs_are_paired_by_their_seed_not_by_their_place_in_a_cell():
    """A cell missing a seed (one trained by hand, say) pairs each run with the baseline's run of the same seed."""
    hires = {0: 2.60, 2: 2.70}
    baseline = {0: 2.58, 1: 2.59, 2: 2.61}
    assert paired_differences(hires, baseline) == pytest.approx([0.02, 0.09])
    assert paired_differences({3: 2.6}, baseline) == []
