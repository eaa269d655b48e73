"""Offline fixtures for the ecosystem tests: a byte-level BPE tokenizer, stdlib text, tiny saved models.

Nothing here downloads: the tokenizer is trained in-process on the standard library's own sources.
"""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf.training import build_tokenizer as train_bpe

VOCAB_SIZE = 384


def stdlib_texts(max_files: int = 40, max_chars: int = 2000) -> list[str]:
    """The opening of a few stdlib modules (sorted, so the same on every run): real text written by many people."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:max_files]
    return [text[:max_chars] for path in files if (text := path.read_text(encoding="utf-8", errors="ignore"))]


def build_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """The package's byte-level BPE (ids 0 `<|pad|>`, 1 `<|endoftext|>`), trained on stdlib text."""
    tokenizer = train_bpe(stdlib_texts(), vocab_size=vocab_size)
    tokenizer.model_max_length = 512
    return tokenizer


def tiny_config(preset: str = "tiny", **overrides: object) -> HiResConfig:
    """A tiny preset sized to the test tokenizer, with a pad token so batches can be padded."""
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1, **overrides}
    return HiResConfig.from_preset(preset, vocab_size=VOCAB_SIZE, **ids)


def save_tiny_model(folder: Path, preset: str, tokenizer: PreTrainedTokenizerFast, **save_kwargs: object) -> Path:
    """Save a freshly initialised tiny HiRes model (and the tokenizer) the way a user would publish it."""
    HiResForCausalLM(tiny_config(preset)).eval().save_pretrained(folder, **save_kwargs)
    tokenizer.save_pretrained(folder)
    return folder


def plan_key_pattern(key: str) -> re.Pattern[str]:
    """A parallel-plan key as a regex over qualified names: `*` stands for one module index."""
    return re.compile(r"\.".join(r"\d+" if part == "*" else re.escape(part) for part in key.split(".")))


def plan_key_matches(key: str, name: str) -> bool:
    return plan_key_pattern(key).fullmatch(name) is not None


def unmatched_plan_keys(plan: Iterable[str], names: Iterable[str]) -> list[str]:
    """Plan keys that name no module or parameter in `names` (a typo there silently disables sharding)."""
    names = list(names)
    return [key for key in plan if not any(plan_key_matches(key, name) for name in names)]
