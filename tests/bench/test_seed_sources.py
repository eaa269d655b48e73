"""Weights' seed against batches' seed (`benchmarks/seed_sources.py`): a crossed run is the ladder's run with one
seed swapped, and the report splits a spread into the two."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import seed_sources
from hires_hf.commands.ladder import cache_dir
from hires_hf.experiments.ladder import LadderSettings, cell_plan, open_ladder, train_cell

CELL = ("hires", "32x4", 1e-2)
SMOKE = ["--smoke", "--quiet", "--arm", "hires", "--rung", "32x4", "--lr", "1e-2"]


def test_crossed_runs_swap_one_seed_of_the_ladders_run_and_the_report_splits_the_spread(tmp_path):
    ladder_dir, out = tmp_path / "ladder", tmp_path / "out"
    ladder = open_ladder(LadderSettings.smoke(), ladder_dir, cache_dir(), progress=False)
    own = [train_cell(ladder, cell_plan(ladder, *CELL, seed), progress=False) for seed in (0, 1)]
    common = [*SMOKE, "--ladder-dir", str(ladder_dir), "--out-dir", str(out)]
    assert seed_sources.main([*common, "--pairs", "0:0", "1:0", "0:1"]) == 0
    cases = {(c["init_seed"], c["order_seed"]): c for c in json.loads((out / "seed_sources.json").read_text())["cases"]}
    assert set(cases) == {(0, 0), (1, 0), (0, 1), (1, 1)}
    assert cases[1, 1].get("from_ladder") and not cases[0, 0].get("from_ladder")  # (0, 0) was trained here
    assert cases[0, 0]["final_loss"] == own[0].final_loss  # the same seeds train the ladder's run, step for step
    assert cases[1, 1]["final_loss"] == own[1].final_loss
    assert cases[1, 0]["final_loss"] != cases[0, 0]["final_loss"]  # the weights' seed is used...
    assert cases[0, 1]["final_loss"] != cases[0, 0]["final_loss"]  # ...and the batches' seed, separately
    (effect,) = json.loads((out / "seed_sources.json").read_text())["effects"]
    spread = cases[1, 1]["final_loss"] - cases[0, 0]["final_loss"]
    assert math.isclose(effect["init"] + effect["order"], spread, abs_tol=1e-9)  # the two parts make the whole
    assert (out / "seed_sources.png").stat().st_size > 0
    assert f"{cases[1, 0]['final_loss']:.3f}" in (out / "seed_sources.md").read_text()

    stored = out / "cases" / f"{seed_sources.case_name(*CELL, 1, 0)}.json"
    before = stored.stat().st_mtime_ns
    assert seed_sources.main([*common, "--pairs", "1:0"]) == 0  # a stored case is not trained again
    assert stored.stat().st_mtime_ns == before


def test_a_case_whose_ladder_run_changed_is_not_read(tmp_path):
    ladder_dir, out = tmp_path / "ladder", tmp_path / "out"
    common = [*SMOKE, "--ladder-dir", str(ladder_dir), "--out-dir", str(out)]
    assert seed_sources.main([*common, "--pairs", "1:0"]) == 0
    stored = next((out / "cases").glob("*.json"))
    stored.write_text(json.dumps({**json.loads(stored.read_text()), "ladder_key": "0" * 16}))
    assert seed_sources.main([*common, "--report"]) == 1  # nothing current to report


@pytest.mark.parametrize(
    ("depends_on", "expected"),
    [("init", {"init": 0.3, "order": 0.0, "both": 0.0}), ("order", {"init": 0.0, "order": 0.3, "both": 0.0})],
)
def test_the_effects_name_the_seed_that_moves_the_loss(depends_on, expected):
    cases = [
        {"arm": "hires", "rung": "64x12", "lr": 8e-3, "init_seed": i, "order_seed": j}
        | {"final_loss": 2.0 + 0.3 * (i if depends_on == "init" else j)}
        for i in (0, 1)
        for j in (0, 1)
    ]
    (effect,) = seed_sources.effects(cases)
    assert {key: round(effect[key], 9) for key in expected} == expected


def test_a_pair_that_is_not_two_seeds_is_refused_in_one_line(capsys):
    for pair in ("1", "1:x", "1:2:3"):
        with pytest.raises(SystemExit) as stop:
            seed_sources.main(["--smoke", "--pairs", pair])
        assert stop.value.code == 2
        assert "WEIGHTS_SEED:BATCHES_SEED" in capsys.readouterr().err
