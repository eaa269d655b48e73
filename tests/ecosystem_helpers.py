"""Offline fixtures for the ecosystem tests: a byte-level BPE tokenizer, stdlib text, tiny saved models.

Nothing here downloads: the tokenizer is trained in-process on the standard library's own sources.
"""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hires_hf import HiResConfig, HiResForCausalLM

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2: the tiny preset's bos=1, eos=2
VOCAB_SIZE = 384


def stdlib_texts(max_files: int = 40, max_chars: int = 2000) -> list[str]:
    """The opening of a few stdlib modules (sorted, so the same on every run): real text written by many people."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:max_files]
    return [text[:max_chars] for path in files if (text := path.read_text(encoding="utf-8", errors="ignore"))]


def build_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A byte-level BPE with pad/bos/eos, trained on stdlib text; small enough for the tiny presets."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib_texts(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", model_max_length=512
    )


def tiny_config(preset: str = "tiny", **overrides: object) -> HiResConfig:
    """A tiny preset sized to the test tokenizer, with a pad token so batches can be padded."""
    return HiResConfig.from_preset(preset, vocab_size=VOCAB_SIZE, pad_token_id=0, **overrides)


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
