"""The run store keeps what a finished run's record cannot: its training loss step by step."""

from __future__ import annotations

import math
import signal

from hires_hf.experiments.harness import execute
from hires_hf.experiments.ladder import LadderSettings, cell_plan, ladder_arms, open_ladder


def test_a_stored_run_keeps_its_training_loss_step_by_step_and_drops_its_checkpoint(tmp_path):
    """Eight evaluations cannot tell a loss spike from a plateau: a finished run keeps, beside its record, the
    training loss of every step its checkpoints saw."""
    ladder = open_ladder(LadderSettings.smoke(), tmp_path, progress=False)
    plan = ladder.plan(ladder_arms(["control"])[0], ladder.rungs[0], 4e-3)
    assert ladder.store.trace(plan.key) is None
    execute(plan, ladder.data, ladder.device, ladder.store, checkpoint_seconds=0)  # a checkpoint after every step
    trace = ladder.store.trace(plan.key)
    assert [step for step, _ in trace] == list(range(1, plan.settings.steps + 1))
    assert all(math.isfinite(loss) for _, loss in trace) and trace[-1][1] < trace[0][1] - 0.5  # it learned
    assert not ladder.store.checkpoint(plan.key).exists()


def test_a_ladder_of_minutes_long_runs_keeps_their_whole_trace_when_asked_to_checkpoint_often(tmp_path):
    """A GPU's runs end in minutes, before the default checkpoint: `--checkpoint-minutes` keeps their traces."""
    from hires_hf.cli import main

    cell = ["ladder", "--smoke", "--quiet", "--out", str(tmp_path), "--cell", "control", "32x4", "4e-3"]
    assert main([*cell, "--checkpoint-minutes", "1e-9"]) == 0
    ladder = open_ladder(LadderSettings.smoke(), tmp_path, progress=False)
    plan = cell_plan(ladder, "control", "32x4", 4e-3)
    trace = ladder.store.trace(plan.key)
    assert trace is not None and [step for step, _ in trace] == list(range(1, plan.settings.steps + 1))
    assert main([*cell, "--checkpoint-minutes", "0"]) == 2  # refused in one line, nothing trained


def test_the_ladder_command_gives_sigterm_back_to_the_process_that_called_it(tmp_path):
    """While it trains, `kill` exits through the run's claim release; a script that calls `main` keeps its own
    SIGTERM handling once the command returns, and after a refused command too."""
    from hires_hf.cli import main

    def own(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, own)
    try:
        cell = ["ladder", "--smoke", "--quiet", "--out", str(tmp_path), "--cell", "control", "32x4", "4e-3"]
        assert main(cell) == 0
        assert signal.getsignal(signal.SIGTERM) is own
        assert main([*cell[:-1], "fast"]) == 2
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
