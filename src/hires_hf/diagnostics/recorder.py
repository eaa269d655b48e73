"""Diagnostics during training: a recorder any loop can call, and the same as a Trainer callback.

Every `every` steps the recorder keeps, for one step, each parameter group's gradient norm (after backward)
and update-to-weight ratio (after the optimizer step), then probes a fixed batch: the wide stream per block,
attention entropy, projection spectra. Rows go to memory and, when a path is given, to a JSON-lines file
(`diagnostics.jsonl`) that `hires-hf inspect RUN_DIR` plots. The first probe that finds the attention collapsed
(`attention_collapsed`) logs a warning with what to change: that run's loss is about to stall.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

from .probes import (
    attention_collapsed,
    attention_entropy,
    collapse_advice,
    group_grad_norms,
    group_update_ratios,
    projection_spectra,
    snapshot,
    stream_probe,
)

DIAGNOSTICS_FILE = "diagnostics.jsonl"
logger = logging.getLogger(__name__)


class DiagnosticsRecorder:
    """Call `before_step(model, step)` between backward and the optimizer step, `after_step(model, step)` after it."""

    def __init__(
        self, probe_ids: torch.Tensor, every: int = 10, path: str | Path | None = None, entropy: bool = True
    ) -> None:
        self.probe_ids = probe_ids
        self.every = every
        self.path = Path(path) if path is not None else None
        self.entropy = entropy
        self.rows: list[dict[str, Any]] = []
        self._before: dict[str, torch.Tensor] | None = None
        self._grads: dict[str, float] = {}
        self._warned = False

    def wants(self, step: int) -> bool:
        return step % self.every == 0

    def before_step(self, model: nn.Module, step: int) -> None:
        if self.wants(step):
            self._grads = group_grad_norms(model.named_parameters())
            self._before = snapshot(model.named_parameters())

    def after_step(self, model: nn.Module, step: int, **extra: float) -> dict[str, Any] | None:
        if self._before is None:
            return None
        row = {"step": step, **extra, **self.probe(model)}
        row["grad_norm"] = self._grads
        row["update_ratio"] = group_update_ratios(self._before, model.named_parameters())
        self._before = None
        self._warn_on_collapse(row)
        self.rows.append(row)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        return row

    def _warn_on_collapse(self, row: dict[str, Any]) -> None:
        """Once a run: a warning at the first probe whose attention has collapsed (the loss stalls after it)."""
        entropy = row.get("attention_entropy", [])
        if not self._warned and attention_collapsed(entropy):
            logger.warning("Step %d: %s.", row["step"], collapse_advice(entropy))
            self._warned = True

    def probe(self, model: nn.Module) -> dict[str, Any]:
        ids = self.probe_ids.to(next(model.parameters()).device)
        row: dict[str, Any] = stream_probe(model, ids)
        row["spectra"] = projection_spectra(model)
        if self.entropy:
            row["attention_entropy"] = attention_entropy(model, ids)
        return row


class DiagnosticsCallback(TrainerCallback):
    """`DiagnosticsRecorder` for the HF Trainer: rows land in `<output_dir>/diagnostics.jsonl`.

    `Trainer(..., callbacks=[DiagnosticsCallback(probe_ids)])`; `probe_ids` is a small (batch, seq) tensor of
    held-out token ids, probed every `every` optimizer steps (the first step included).
    """

    def __init__(self, probe_ids: torch.Tensor, every: int = 50, entropy: bool = True) -> None:
        self.probe_ids = probe_ids
        self.every = every
        self.entropy = entropy
        self.recorder: DiagnosticsRecorder | None = None

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        if state.is_world_process_zero:
            path = Path(args.output_dir) / DIAGNOSTICS_FILE
            self.recorder = DiagnosticsRecorder(self.probe_ids, self.every, path, self.entropy)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs) -> None:
        if self.recorder is not None and model is not None:
            self.recorder.before_step(model, state.global_step)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs) -> None:
        if self.recorder is not None and model is not None:
            self.recorder.after_step(model, state.global_step)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a diagnostics file, in step order."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda row: row["step"])


__all__ = ["DIAGNOSTICS_FILE", "DiagnosticsCallback", "DiagnosticsRecorder", "read_rows"]
