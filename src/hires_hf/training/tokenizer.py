"""Tokenizers for training: a byte-level BPE trained locally (no download), or an existing one.

Byte-level BPE covers any UTF-8 text with no unknown token, so a tokenizer trained on a sample of the corpus
still encodes all of it. The tokenizer is saved next to the model so that the folder is self-contained.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedConfig, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..errors import HiResUserError
from ..io import write_json_atomic

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
BYTE_ALPHABET = 256


def build_tokenizer(
    texts: Sequence[str], vocab_size: int = 512, sample_chars: int = 2_000_000, seed: int = 0
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of `vocab_size` entries (specials included) on a sample of `texts`.

    Training on a sample of ~`sample_chars` characters keeps this to a few seconds; the merges it finds are
    those of the frequent strings, which a sample already shows. Ids 0 and 1 are `<|pad|>` and `<|endoftext|>`.
    """
    specials = [PAD_TOKEN, EOS_TOKEN]
    if vocab_size < BYTE_ALPHABET + len(specials):
        raise HiResUserError(
            f"A byte-level BPE needs vocab_size >= {BYTE_ALPHABET + len(specials)} (256 bytes + 2 special tokens);"
            f" got {vocab_size}."
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_sample(texts, sample_chars, seed), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )


def _sample(texts: Sequence[str], sample_chars: int, seed: int) -> list[str]:
    """Documents in a seeded random order until `sample_chars`: many files, not the first few."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    sample, total = [], 0
    for index in order:
        if total >= sample_chars:
            break
        sample.append(texts[index][: sample_chars - total])
        total += len(sample[-1])
    return sample


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """An existing tokenizer folder (for instance a trained model's), offline."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as error:
        raise HiResUserError(
            f"Cannot load a tokenizer from {path} ({error}); pass a folder with tokenizer.json."
        ) from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# Loading options transformers 5 keeps in a loaded tokenizer's init kwargs and writes back on save_pretrained.
LOADING_FLAGS = ("is_local", "local_files_only")


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: str | Path, model_max_length: int | None) -> None:
    """Save `tokenizer` as a model folder's own: `model_max_length` is the model's context, no loading flags.

    A tokenizer built in memory says `model_max_length: 1e30` (no limit), so pipelines and lm-eval never truncate
    to what the model can attend over; one loaded with `from_pretrained` and saved again carries `is_local` /
    `local_files_only`, which would then apply to whoever loads the folder. The caller's object is left as is;
    `model_max_length=None` (a model without a context length) keeps the tokenizer's own.
    """
    tokenizer.save_pretrained(folder)
    path = Path(folder) / "tokenizer_config.json"
    fields = json.loads(path.read_text(encoding="utf-8"))
    for flag in LOADING_FLAGS:
        fields.pop(flag, None)
    if model_max_length is not None:
        fields["model_max_length"] = int(model_max_length)
    write_json_atomic(path, fields, sort_keys=True)  # the layout save_pretrained writes


def check_vocab(tokenizer: PreTrainedTokenizerBase, config: PreTrainedConfig) -> None:
    """A token id at or above `vocab_size` would index past the embedding: refuse the pair up front."""
    if len(tokenizer) > config.vocab_size:
        raise HiResUserError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}; "
            f"use a model with vocab_size >= {len(tokenizer)} (e.g. --override vocab_size={len(tokenizer)}) "
            "or a tokenizer trained with --vocab-size <= the model's."
        )


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    """Config fields that must name the tokenizer's own special tokens (generation stops on eos)."""
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def encode_documents(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], desc: str = "tokenize", progress: bool = True
) -> list[list[int]]:
    """Token ids of each document, no special tokens (packing adds the separators)."""
    ids: list[list[int]] = []
    chunk = 64
    chunks = tqdm(
        range(0, len(texts), chunk), desc=desc, unit="docs", unit_scale=chunk, leave=False, disable=not progress
    )
    for start in chunks:
        ids.extend(tokenizer(list(texts[start : start + chunk]), add_special_tokens=False)["input_ids"])
    return ids


__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "build_tokenizer",
    "check_vocab",
    "encode_documents",
    "load_tokenizer",
    "save_tokenizer",
    "special_token_ids",
]
