"""A stalled ladder run ends early and is stored as it stands; a live run is not touched by the watch."""

from __future__ import annotations

import pytest

from hires_hf.experiments import ladder as ladder_module
from hires_hf.experiments.harness import RunStore
from hires_hf.experiments.ladder import LadderSettings, ladder_arms, open_ladder
from hires_hf.experiments.ladder_report import write_report
from hires_hf.experiments.stalls import STALL_NATS, stalled


def test_a_run_is_stalled_only_past_a_quarter_far_above_the_baseline_and_not_improving():
    flat = [(100, 4.85), (200, 4.84)]
    assert stalled(flat, steps=800, baseline=3.30)
    assert not stalled(flat, steps=1000, baseline=3.30)  # 20% of its budget: too early to tell
    assert not stalled([(100, 4.95), (200, 4.84)], steps=800, baseline=3.30)  # still falling
    assert not stalled(flat, steps=800, baseline=4.84 - STALL_NATS + 0.01)  # within reach of the baseline
    assert not stalled(flat[1:], steps=800, baseline=3.30)  # one evaluation says nothing about progress


@pytest.fixture
def smoke(tmp_path):
    settings = LadderSettings.smoke(evaluations=4)
    ladder = open_ladder(settings, tmp_path / "ladder", progress=False)
    return ladder, ladder_arms(["control"])[0], ladder.rungs[0]


def test_a_stuck_run_ends_at_its_first_flat_evaluation_and_is_stored_as_stalled(smoke, monkeypatch):
    ladder, control, rung = smoke
    plan = ladder.plan(control, rung, 1e-9)  # a rate too small to move the loss: flat from the start
    baseline = [(share, 0.0) for share in (0.25, 0.5, 0.75, 1.0)]
    monkeypatch.setattr(ladder_module, "baseline_curve", lambda ladder, plan: baseline)
    run = ladder_module._train(ladder, plan, progress=False)
    steps = plan.settings.steps
    assert run.stalled == {"step": round(steps / 2), "of": steps, "baseline": 0.0}  # flat at 25% -> 50%: ended
    assert run.final_loss == run.curve[-1][1] and len(run.curve) == 2
    stored = RunStore(ladder.store.folder).get(plan.key)
    assert stored is not None and stored.stalled == run.stalled  # the ladder will not train it again
    assert not ladder.store.checkpoint(plan.key).exists()
    assert "Ended as stalled" in write_report(ladder, ladder.store.folder.parent / "report")


def test_the_watch_leaves_a_live_run_exactly_as_it_would_have_trained(smoke, tmp_path, monkeypatch):
    """The watch evaluates at the loop's own evaluation steps: a forward pass that draws no random numbers, so a
    run that goes on ends with the very loss it ends with unwatched."""
    ladder, control, rung = smoke
    plan = ladder.plan(control, rung, 4e-3)
    far_above = [(share, 100.0) for share in (0.25, 0.5, 0.75, 1.0)]
    monkeypatch.setattr(ladder_module, "baseline_curve", lambda ladder, plan: far_above)
    watched = ladder_module._train(ladder, plan, progress=False)
    monkeypatch.setattr(ladder_module, "baseline_curve", lambda ladder, plan: [])
    ladder.store = RunStore(tmp_path / "unwatched" / "runs")
    unwatched = ladder_module._train(ladder, plan, progress=False)
    assert watched.stalled is None and watched.steps == plan.settings.steps
    assert watched.final_loss == unwatched.final_loss
