"""Test-wide settings: offline, deterministic, quiet; tiny configs only (real sizes live in benchmarks/)."""

import os

# Forced, not defaulted: a developer's exported HF_HUB_OFFLINE=0 must not let a test reach for the Hub.
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Tiny models: one thread per process beats two spinning threads (torchrun tests start two processes).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
