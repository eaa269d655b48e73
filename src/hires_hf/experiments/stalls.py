"""Ending a ladder run that has stalled, so that a dead rate does not cost a worker hours.

A HiRes run at too high a rate can sit on a plateau far above every other run of its rung (PostNorm's sensitivity to
the rate; on the first corpus HiRes at its rung-1 best rate stalled at rung 2: 4.85 nats a quarter of the way in,
where the control was at 3.30). Its final loss would only say "worse than the best", which its plateau already says.

`StallWatch` is an `after_update` hook of the training loop: at the loop's own evaluation steps it evaluates the
model as the loop is about to (the same state, so the same loss; a forward pass, no random numbers drawn, so the run
is unchanged when it goes on) and ends the run (`Stalled`) when, from a quarter of its budget on, it is more than
`STALL_NATS` above the rung's baseline at the same share of its budget and has not improved since its last
evaluation. The ladder stores such a run under its key as it stands, marked `stalled`: its last evaluation is its
loss, an upper bound that is all a bracket needs from it. Nothing in the loop changes, so no stored run's key does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..training import loop
from .harness import Data, Run, RunPlan
from .runs import git_commit

STALL_NATS = 0.5  # above the baseline at the same share: several times any gap between live arms the ladder has seen
STALL_FROM = 0.25  # the earliest share of its budget at which a run may be called stalled
IMPROVING_NATS = 0.01  # a fall smaller than this between two evaluations is no progress


class Stalled(Exception):
    """Raised out of the training loop by `StallWatch`; carries the run's evaluations as (step, loss)."""

    def __init__(self, curve: list[tuple[int, float]], baseline: float) -> None:
        step, loss = curve[-1]
        super().__init__(f"stalled at step {step}: {loss:.4f}, the baseline {baseline:.4f} at that share")
        self.curve = curve
        self.baseline = baseline


class StallWatch:
    """After each optimizer step: at the loop's evaluation steps, evaluate and raise `Stalled` if the run is stuck.

    `baseline` is the rung's baseline run's curve as (share of its budget, loss); `history` the (step, loss)
    evaluations of this run before a resume (from its checkpoint)."""

    def __init__(
        self,
        plan: RunPlan,
        data: Data,
        baseline: Sequence[tuple[float, float]],
        history: Sequence[tuple[int, float]] = (),
        evaluate: Callable[[nn.Module, torch.Tensor, int, str], float] = loop.evaluate,
    ) -> None:
        self.settings = plan.settings
        self.blocks = data.validation
        self.baseline = list(baseline)
        self.curve = [(int(step), float(loss)) for step, loss in history]
        self.evaluate = evaluate
        self.at = loop._evaluation_steps(plan.settings)

    def __call__(self, model: nn.Module, step: int) -> None:
        if step + 1 not in self.at or not self.baseline:
            return
        blocks = self.blocks.to(next(model.parameters()).device)
        s = self.settings
        self.curve.append((step + 1, self.evaluate(model, blocks, s.eval_batch_size, s.precision)))
        baseline = baseline_at(self.baseline, (step + 1) / s.steps)
        if baseline is not None and stalled(self.curve, s.steps, baseline):
            raise Stalled(self.curve, baseline)


def stalled(curve: Sequence[tuple[int, float]], steps: int, baseline: float) -> bool:
    """Whether a run whose evaluations are `curve` is stuck: past `STALL_FROM` of its `steps`, more than `STALL_NATS`
    above `baseline` (the baseline's loss at the same share) and not improving since its previous evaluation."""
    if len(curve) < 2:
        return False
    (_, before), (step, now) = curve[-2], curve[-1]
    return step / steps >= STALL_FROM and now - baseline > STALL_NATS and before - now < IMPROVING_NATS


def baseline_at(curve: Sequence[tuple[float, float]], share: float, tolerance: float = 0.02) -> float | None:
    """A run's loss at `share` of its budget, from its `curve` of (share, loss): its evaluation nearest to `share`
    if within `tolerance` (every ladder run evaluates at the same shares, up to rounding to whole steps), else None."""
    near = min(curve, key=lambda point: abs(point[0] - share), default=None)
    return near[1] if near is not None and abs(near[0] - share) <= tolerance else None


def stalled_run(plan: RunPlan, data: Data, stall: Stalled, seconds: float) -> Run:
    """The record of a run ended by `Stalled`: its evaluations so far, its last one as its loss, marked `stalled`."""
    flops_per_token = plan.arm.flops_per_token(plan.shape, data)
    tokens_per_step = plan.settings.batch_size * data.context
    curve = [(step * tokens_per_step * flops_per_token, loss) for step, loss in stall.curve]
    steps = stall.curve[-1][0]
    return Run(
        plan.arm.name,
        plan.settings.learning_rate,
        plan.settings.seed,
        steps,
        flops_per_token,
        stall.curve[-1][1],
        curve,
        seconds,
        steps * tokens_per_step / seconds if seconds > 0 else 0.0,
        False,
        key=plan.key,
        spec=plan.spec,
        commit=git_commit(),
        stalled={"step": steps, "of": plan.settings.steps, "baseline": stall.baseline},
    )


__all__ = ["STALL_NATS", "StallWatch", "Stalled", "baseline_at", "stalled", "stalled_run"]
