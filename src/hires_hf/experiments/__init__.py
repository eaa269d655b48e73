"""Experiments: the one harness every comparison runs on, and `hires-hf compare` built on it."""

from .harness import (
    CONTROL,
    HIRES,
    PLAIN,
    Arm,
    Budget,
    Data,
    Run,
    Shape,
    baseline_arms,
    best_run,
    bracket_status,
    loss_at_flops,
    prepare_data,
    sweep_rates,
    train_run,
)

__all__ = [
    "CONTROL",
    "HIRES",
    "PLAIN",
    "Arm",
    "Budget",
    "Data",
    "Run",
    "Shape",
    "baseline_arms",
    "best_run",
    "bracket_status",
    "loss_at_flops",
    "prepare_data",
    "sweep_rates",
    "train_run",
]
