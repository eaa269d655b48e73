"""The design sweep (`python -m benchmarks.sweep`): resumable stages, each arm's grid bracketed or flagged, and a
report whose gap column is the arm's mean minus the control's."""

from __future__ import annotations

import json

import pytest

from benchmarks import sweep


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "RESULTS", tmp_path)
    return tmp_path / "smoke"


def test_grid_then_seeds_then_report(results, capsys):
    arms = ["--arms", "control", "hires", "D=d"]
    assert sweep.main(["grid", "--smoke", *arms]) == 0
    rows = sweep.load_runs(results)
    assert {r["arm"] for r in rows} == {"control", "hires", "D=d"}
    for arm in ("control", "hires", "D=d"):
        rates = sorted(r["lr"] for r in rows if r["arm"] == arm)
        assert rates[:3] == list(sweep.GRID) or rates[0] < sweep.GRID[0]  # the grid, extended where needed
    assert sweep.main(["grid", "--smoke", *arms]) == 0  # resumable: nothing is trained twice
    assert len(sweep.load_runs(results)) == len(rows)

    assert sweep.main(["seeds", "--smoke"]) == 0
    seeded = [r for r in sweep.load_runs(results) if r["seed"] == 1]
    assert ("control", sweep.best_by_arm(rows)["control"]["lr"]) in {(r["arm"], r["lr"]) for r in seeded}

    assert sweep.main(["report", "--smoke"]) == 0
    summary = json.loads((results / "sweep.json").read_text())["summary"]
    control = summary["control"]["mean"]
    for item in summary.values():
        assert item["gap"] == pytest.approx(item["mean"] - control)
        assert item["bracket"] in ("bracketed", "high edge", "low edge")
    assert (results / "sweep.png").stat().st_size > 10_000
    assert "| **control** |" in (results / "sweep.md").read_text()


def test_report_without_runs_is_one_line(results, capsys):
    assert sweep.main(["report", "--smoke"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
