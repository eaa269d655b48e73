"""Prepared data: a corpus, one byte-level BPE trained on its training split, packed blocks, a validation slice.

The one data path of every measurement (compare, the sweep, the ladder, the demo, `hires-hf train`'s packing):
documents are tokenised, joined with eos and cut into blocks of `context` tokens; the validation split keeps
its first `eval_blocks` blocks. `Data.spec` says what made the blocks and ends in a fingerprint of the tokens
themselves, so a run record names its data exactly; with `cache_dir`, prepared blocks are stored under that
fingerprint's recipe and a second preparation of the same data is a file read.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from ..errors import HiResUserError
from ..io import staged_folder
from .data import Corpus, load_default_corpus, load_python_sources, load_text_files, pack
from .tokenizer import build_tokenizer, encode_documents, load_tokenizer, save_tokenizer, special_token_ids


@dataclass
class Data:
    """Packed train / validation blocks of one corpus under one tokenizer, and the recipe that made them."""

    train: torch.Tensor
    validation: torch.Tensor
    tokenizer: PreTrainedTokenizerBase
    unigram_loss: float
    source: str
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def special(self) -> dict[str, int | None]:
        return special_token_ids(self.tokenizer)

    @property
    def context(self) -> int:
        return self.train.shape[1]

    @cached_property
    def spec(self) -> dict[str, Any]:
        """What a run record stores about its data: the recipe, the sizes and a hash of every token (computed
        once: the blocks are not to be changed after preparation)."""
        digest = hashlib.sha256()
        for blocks in (self.train, self.validation):
            digest.update(blocks.to(torch.int32).numpy().tobytes())
        sizes = {"train_blocks": len(self.train), "validation_blocks": len(self.validation), "context": self.context}
        return {**self.recipe, **sizes, "tokens_sha256": digest.hexdigest()}


def load_corpus(source: str | Path | Sequence[str | Path], max_chars: int | None, validation_fraction: float) -> Corpus:
    """ "stdlib" (embedded sample), "python" (this machine's Python sources), or files / folders of text / jsonl."""
    if source == "stdlib":
        return load_default_corpus(validation_fraction=validation_fraction, max_chars=max_chars)
    if source == "python":
        return load_python_sources(validation_fraction=validation_fraction, max_chars=max_chars)
    paths = [source] if isinstance(source, str | Path) else list(source)
    return load_text_files(paths, validation_fraction=validation_fraction, max_chars=max_chars)


def prepare_data(
    source: str | Path | Sequence[str | Path],
    vocab_size: int,
    context: int,
    max_chars: int | None = 12_000_000,
    validation_fraction: float = 0.01,
    eval_blocks: int = 64,
    progress: bool = True,
    cache_dir: Path | None = None,
) -> Data:
    """One corpus, one tokenizer trained on its training split, packed blocks, a fixed validation slice."""
    label = source if isinstance(source, str | Path) else [str(s) for s in source]
    recipe = {
        "source": str(label) if isinstance(label, Path) else label,
        "vocab_size": vocab_size,
        "max_chars": max_chars,
        "validation_fraction": validation_fraction,
        "eval_blocks": eval_blocks,
        "tokenizer_sample_chars": 2_000_000,
    }
    cached = _cache_folder(cache_dir, recipe, context)
    if cached is not None and (cached / "blocks.safetensors").exists():
        blocks = load_file(str(cached / "blocks.safetensors"))
        train, validation = blocks["train"].long(), blocks["validation"].long()
        tokenizer = load_tokenizer(cached)
    else:
        corpus = load_corpus(source, max_chars, validation_fraction)
        tokenizer = build_tokenizer(corpus.train, vocab_size=vocab_size, sample_chars=recipe["tokenizer_sample_chars"])
        train, validation = pack_splits(corpus, tokenizer, context, eval_blocks, progress)
    if len(train) == 0 or len(validation) == 0:
        raise HiResUserError(
            f"Too little text in {source}: {len(train)} training and {len(validation)} validation blocks of "
            f"{context} tokens; give more text or a shorter --context."
        )
    if cached is not None and not (cached / "blocks.safetensors").exists():
        _store(cached, train, validation, tokenizer)
    return Data(train, validation, tokenizer, unigram_loss(train, validation), str(label), recipe)


def _cache_folder(cache_dir: Path | None, recipe: dict[str, Any], context: int) -> Path | None:
    """Where blocks of this recipe live: named by a hash of the recipe (local files are named, not hashed: a
    cache is only for sources that do not change under it, such as the corpora this package reads)."""
    if cache_dir is None:
        return None
    name = hashlib.sha256(json.dumps({**recipe, "context": context}, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / name


def _store(folder: Path, train: torch.Tensor, validation: torch.Tensor, tokenizer: PreTrainedTokenizerBase) -> None:
    """Blocks (int32: any vocabulary this package trains) and the tokenizer, through a temporary sibling folder."""
    with staged_folder(folder) as staging:
        blocks = {"train": train.to(torch.int32), "validation": validation.to(torch.int32)}
        save_file(blocks, staging / "blocks.safetensors")
        save_tokenizer(tokenizer, staging, model_max_length=None)


def pack_splits(
    corpus: Corpus, tokenizer: PreTrainedTokenizerBase, context: int, eval_blocks: int | None, progress: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) blocks of `context` tokens, documents separated by eos; validation cut to its first
    `eval_blocks` (None: all). The one packing rule: `hires-hf train` uses it with its own corpus and tokenizer."""
    eos = tokenizer.eos_token_id
    train = pack(encode_documents(tokenizer, corpus.train, progress=progress), context, eos)
    validation = pack(encode_documents(tokenizer, corpus.validation, progress=progress), context, eos)
    return train, validation[:eval_blocks]


def unigram_loss(train: torch.Tensor, validation: torch.Tensor) -> float:
    """Cross-entropy (nats/token) of the validation tokens under the training tokens' add-one unigram
    distribution: what a model that ignores its input reaches (the plateau a stalled run sits on)."""
    counts = Counter(train.flatten().tolist())
    vocab = max(int(train.max()), int(validation.max())) + 1
    total = sum(counts.values()) + vocab
    targets = validation[:, 1:].flatten().tolist()  # the model is scored from the second token on
    return -sum(math.log((counts.get(t, 0) + 1) / total) for t in targets) / len(targets)


def probe_ids(
    folder: Path, config: Any, text_path: str | None = None, seq_len: int = 128, batch: int = 8
) -> torch.Tensor:
    """(rows, seq_len) token ids to probe a model folder with: `batch` rows of the text file (default: held-out
    stdlib sources) through the folder's tokenizer; seeded random ids when the folder has no tokenizer."""
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, config.vocab_size, (batch, seq_len), generator=generator)
    tokenizer = load_tokenizer(folder)
    if text_path is not None:
        text = Path(text_path).read_text(encoding="utf-8", errors="replace")
    else:
        text = "\n".join(load_default_corpus(max_chars=2_000_000).validation)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][: batch * seq_len]
    if len(ids) < seq_len:
        raise HiResUserError(f"The probe text has {len(ids)} tokens; give at least --seq-len={seq_len}.")
    rows = len(ids) // seq_len
    return torch.tensor(ids[: rows * seq_len]).view(rows, seq_len)


__all__ = ["Data", "load_corpus", "pack_splits", "prepare_data", "probe_ids", "unigram_loss"]
