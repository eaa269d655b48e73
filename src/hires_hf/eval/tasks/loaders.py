"""Dataset loaders the task YAMLs name with `!function`: they read the jsonl files next to this module.

lm-eval imports this file by path, so it imports nothing of hires_hf; reading relative to `__file__` makes the
tasks work from any working directory, installed or not, and never touches the datasets cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets

_HERE = Path(__file__).resolve().parent


def _load(file_name: str) -> datasets.DatasetDict:
    with open(_HERE / file_name, encoding="utf-8") as file:
        rows = [json.loads(line) for line in file if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def next_line(**_: object) -> datasets.DatasetDict:
    """The multiple-choice 'which line comes next' docs (context, choices, label)."""
    return _load("stdlib_next_line.jsonl")


def perplexity(**_: object) -> datasets.DatasetDict:
    """The perplexity docs (text)."""
    return _load("stdlib_perplexity.jsonl")
