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


def test_a_run_resumed_on_another_machine_records_which_machine_trained_which_steps(tmp_path, monkeypatch):
    """A run that spans sessions may be finished on another processor (other kernels, another speed): its record
    says which machine trained which steps, and a run one machine trained from start to end says nothing more."""
    import torch

    from hires_hf.experiments import runs
    from hires_hf.experiments.runs import Run, RunStore
    from hires_hf.training.checkpoint import save_checkpoint

    store = RunStore(tmp_path)
    spec = {"device": "cpu", "recipe": {"precision": "bf16"}}
    first = {"cpu": "AMD EPYC", "bf16_kernels": "native"}
    second = {"cpu": "Intel Xeon", "bf16_kernels": "emulated"}
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def session(key: str, on: dict, stop_at: int | None) -> None:
        """One session's share of a run: it (re)starts on machine `on` and checkpoints at `stop_at`, if given."""
        monkeypatch.setattr(runs, "machine", lambda spec: on)
        store.started(key, spec)
        if stop_at is not None:
            progress = {"step": stop_at, "curve": [], "train_losses": [], "seconds": 1.0}
            save_checkpoint(store.checkpoint(key), model, optimizer, scheduler, progress)

    def finish(key: str) -> dict:
        store.put(Run("control", 1e-3, 0, 100, 1.0, 3.0, [(1.0, 3.0)], 1.0, 1.0, False, key=key, spec=spec))
        return store.get(key).machine

    session("spans", first, stop_at=40)
    session("spans", first, stop_at=70)  # resumed where it trained before: still one segment
    session("spans", second, stop_at=None)
    record = finish("spans")
    assert record["segments"] == [{"step": 0, "machine": first}, {"step": 70, "machine": second}]
    assert record["cpu"] == "Intel Xeon"  # the machine that finished it, as before
    assert not store.checkpoint("spans").exists() and store.segments("spans") == []

    session("one", first, stop_at=40)
    session("one", first, stop_at=None)
    assert "segments" not in finish("one")
