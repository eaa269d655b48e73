"""Resumable training state in one safetensors file: a run stopped at any point resumes to the same result.

The file holds the model's weights, the optimizer's state, the random-number state and, in its metadata, the
position in the run (step, curve, timings) and the scheduler's counters. It is written through a temporary
sibling and a rename, so a run killed while saving still finds the previous checkpoint whole; nothing is ever
unpickled.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

MODEL, OPTIMIZER, RNG = "model.", "optimizer.", "rng."


def save_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    progress: dict[str, Any],
) -> None:
    """Everything needed to continue the run at `progress["step"]`, written atomically to `path`."""
    tensors = {MODEL + name: value.detach().cpu().clone().contiguous() for name, value in model.state_dict().items()}
    state = optimizer.state_dict()
    for index, values in state["state"].items():
        for name, value in values.items():
            tensors[f"{OPTIMIZER}{index}.{name}"] = torch.as_tensor(value).detach().cpu().clone().contiguous()
    tensors[RNG + "cpu"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for device, value in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"{RNG}cuda.{device}"] = value
    scheduler_state = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    metadata = {
        "progress": json.dumps(progress),
        "param_groups": json.dumps(state["param_groups"]),
        "scheduler": json.dumps(scheduler_state),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        save_file(tensors, temporary, metadata=metadata)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and random state from `path`; returns the saved progress."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    device = next(model.parameters()).device
    model.load_state_dict({k[len(MODEL) :]: v for k, v in tensors.items() if k.startswith(MODEL)})
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith(OPTIMIZER):
            index, name = key[len(OPTIMIZER) :].split(".", 1)
            per_param.setdefault(int(index), {})[name] = value if name == "step" else value.to(device)
    optimizer.load_state_dict({"state": per_param, "param_groups": json.loads(metadata["param_groups"])})
    scheduler_state = json.loads(metadata["scheduler"])
    scheduler.load_state_dict({**scheduler.state_dict(), **scheduler_state})
    torch.set_rng_state(tensors[RNG + "cpu"])
    cuda = [tensors[f"{RNG}cuda.{i}"] for i in range(torch.cuda.device_count()) if f"{RNG}cuda.{i}" in tensors]
    if cuda:
        torch.cuda.set_rng_state_all(cuda)
    return json.loads(metadata["progress"])


def read_progress(path: Path) -> dict[str, Any] | None:
    """A checkpoint's saved progress (step, evaluations, training seconds) from its header alone, without reading
    its tensors: where an unfinished run stands. None when the file is missing or unreadable."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return json.loads(handle.metadata()["progress"])
    except (OSError, SafetensorError, KeyError, TypeError, ValueError):
        return None


__all__ = ["load_checkpoint", "read_progress", "save_checkpoint"]
