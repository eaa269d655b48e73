"""Diagnostics: see inside HiRes training (wide stream per block, spectra, attention entropy, update ratios)."""

from .probes import (
    COLLAPSED_ENTROPY,
    attention_collapsed,
    attention_entropy,
    group_grad_norms,
    group_update_ratios,
    param_group,
    projection_spectra,
    shared_fraction,
    stream_probe,
)
from .recorder import DIAGNOSTICS_FILE, DiagnosticsCallback, DiagnosticsRecorder, read_rows

__all__ = [
    "COLLAPSED_ENTROPY",
    "DIAGNOSTICS_FILE",
    "DiagnosticsCallback",
    "DiagnosticsRecorder",
    "attention_collapsed",
    "attention_entropy",
    "group_grad_norms",
    "group_update_ratios",
    "param_group",
    "projection_spectra",
    "read_rows",
    "shared_fraction",
    "stream_probe",
]
