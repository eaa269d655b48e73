"""Training text: the embedded default corpus, local text / jsonl files, and packing into fixed-length blocks.

The default corpus is the Python standard library's source, found on the running machine: real text written
by many people, present wherever Python is, so that training and the demo need no download. It is split into
train and validation *by file*, by a hash of each file's path, so the split is the same on every run and a
module never leaks half into each side.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from packaging.utils import canonicalize_name
from torch.utils.data import Dataset

from ..errors import HiResUserError
from ..stdlib_corpus import is_held_out, read_utf8, stdlib_root, stdlib_sources

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")


@dataclass(frozen=True)
class Corpus:
    """Documents (one string each) for training and for validation."""

    train: list[str]
    validation: list[str]

    @property
    def num_chars(self) -> int:
        return sum(map(len, self.train)) + sum(map(len, self.validation))


def _hash_fraction(key: str) -> float:
    """A number in [0, 1) fixed by `key` alone: the same split on every machine and every run."""
    digest = hashlib.sha1(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _name_order(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8")).hexdigest()


def _split(named_docs: Iterable[tuple[str, str]], validation_fraction: float, max_chars: int | None) -> Corpus:
    """Split (name, text) pairs by the hash of the name, until `max_chars` (callers pass them in hash order)."""
    train, validation, total = [], [], 0
    for name, text in named_docs:
        if max_chars is not None and total >= max_chars:
            break
        (validation if _hash_fraction("split:" + name) < validation_fraction else train).append(text)
        total += len(text)
    if not train and validation:  # so few documents that the hash sent them all to validation: pool them first
        train, validation = validation, []
    if not validation and train:
        return _hold_out(Corpus(train, validation), validation_fraction)
    return Corpus(train, validation)


def load_default_corpus(validation_fraction: float = 0.05, max_chars: int | None = None) -> Corpus:
    """The stdlib's `.py` files (site-packages and the evaluation tasks' held-out files left out), split train /
    validation by file.

    `max_chars` bounds the total text read (files taken in a fixed pseudo-random order, so a small corpus still
    mixes many modules); the split of any given file does not depend on it.
    """
    root = stdlib_root()
    sources = {name: path for name, path in stdlib_sources(root).items() if not is_held_out(name)}
    if not sources:
        raise HiResUserError(f"No Python sources found under {root}; pass --data FILE instead of the default corpus.")
    named = _read_in_mixed_order(sources)
    return _ensure_both(_split(named, validation_fraction, max_chars), f"the standard library at {root}")


def load_python_sources(validation_fraction: float = 0.01, max_chars: int | None = None) -> Corpus:
    """Every `.py` file the running interpreter can see: the stdlib (minus the evaluation tasks' held-out files)
    and its site-packages, split train / validation by file. ~10^8 tokens on a machine with torch installed:
    enough that a GPU ladder's largest rung need not repeat data.
    """
    sources = {name: path for name, path in stdlib_sources(stdlib_root()).items() if not is_held_out(name)}
    for root in _site_roots():
        for path in root.rglob("*.py"):
            relative = path.relative_to(root)
            if not _machine_specific(relative):
                sources.setdefault(f"site:{relative.as_posix()}", path)
    named = _read_in_mixed_order(sources)
    return _ensure_both(_split(named, validation_fraction, max_chars), "this interpreter's Python sources")


def _machine_specific(relative: Path) -> bool:
    """Files of site-packages that are not a package's released source: an editable install's finder (it names
    the checkout's folder) and this package itself (it changes with every commit). Either would make the corpus,
    hence every stored run's key, depend on where and at which commit it was prepared."""
    return relative.name.startswith("__editable__") or relative.parts[0] == "hires_hf"


def python_sources_environment() -> dict[str, Any]:
    """What decides the "python" corpus besides this package's code: the Python version and {distribution: version}
    of every package in the interpreter's site-packages. Two machines that agree on it read the same sources."""
    roots = [str(root) for root in _site_roots()]
    packages = {}
    for dist in metadata.distributions(path=roots):
        name = dist.metadata["Name"]
        if name and canonicalize_name(name) != "hires-hf":
            packages[canonicalize_name(name)] = dist.version
    return {"python": platform.python_version(), "packages": dict(sorted(packages.items()))}


def _read_in_mixed_order(sources: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(name, text) of every readable, non-empty file, read lazily in a fixed order mixing all modules."""
    for name in sorted(sources, key=_name_order):
        text = read_utf8(sources[name])
        if text and text.strip():
            yield name, text


def _site_roots() -> list[Path]:
    """The interpreter's site-packages folders (purelib / platlib), each once."""
    paths = sysconfig.get_paths()
    roots = {Path(paths[key]).resolve() for key in ("purelib", "platlib") if Path(paths[key]).is_dir()}
    return sorted(roots)


def _documents_of(path: Path, text_field: str = "text") -> list[str]:
    """A text file is one document; a jsonl file holds one document per line in its `text_field`."""
    if path.suffix == ".jsonl":
        docs = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise HiResUserError(f"{path}:{number} is not valid JSON ({error}).") from error
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise HiResUserError(
                    f"{path}:{number} has no string {text_field!r} field; each line must be {{{text_field!r}: ...}}."
                )
            docs.append(record[text_field])
        return docs
    try:
        return [path.read_text(encoding="utf-8")]
    except UnicodeDecodeError as error:
        raise HiResUserError(f"{path} is not UTF-8 text ({error}).") from error


def _expand(paths: Sequence[str | Path]) -> list[Path]:
    """Files as given, folders as the text / jsonl files inside them (sorted, recursive)."""
    files = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (*TEXT_SUFFIXES, ".jsonl"))
            if not found:
                raise HiResUserError(f"{path} holds no .txt/.md/.py/.rst/.jsonl files; point --data at text.")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise HiResUserError(f"Data path {path} does not exist; pass existing text or jsonl files.")
    return files


def load_text_files(
    paths: Sequence[str | Path],
    validation_paths: Sequence[str | Path] | None = None,
    validation_fraction: float = 0.05,
    max_chars: int | None = None,
    text_field: str = "text",
) -> Corpus:
    """Local text / jsonl files (or folders of them).

    With `validation_paths`, those are the validation set; otherwise documents are split by a hash of
    (file, index), deterministically, as the default corpus is.
    """
    docs = [(f"{path}#{i}", doc) for path in _expand(paths) for i, doc in enumerate(_documents_of(path, text_field))]
    docs = [(name, doc) for name, doc in docs if doc.strip()]
    if not docs:
        raise HiResUserError(f"The data in {', '.join(map(str, paths))} is empty; give files that contain text.")
    if validation_paths:
        validation = [d for path in _expand(validation_paths) for d in _documents_of(path, text_field) if d.strip()]
        corpus = Corpus([doc for _, doc in docs], validation)
    else:
        corpus = _split(sorted(docs, key=lambda item: _name_order(item[0])), validation_fraction, max_chars)
    return _ensure_both(corpus, ", ".join(map(str, paths)))


def load_hub_dataset(
    name: str,
    config_name: str | None = None,
    text_field: str = "text",
    validation_fraction: float = 0.05,
    max_chars: int | None = None,
) -> Corpus:
    """A `datasets` dataset (needs the `datasets` package and, unless cached, the network).

    Its "validation" split is used when it has one; otherwise documents are split by hash of their index.
    """
    try:
        import datasets
    except ImportError as error:
        raise HiResUserError("--dataset needs the `datasets` package: pip install datasets.") from error
    try:
        splits = datasets.load_dataset(name, config_name)
    except Exception as error:  # offline, unknown name, missing config: all user-fixable, all one line
        raise HiResUserError(f"Cannot load dataset {name!r} ({type(error).__name__}: {error}).") from error
    if "train" not in splits or text_field not in splits["train"].column_names:
        raise HiResUserError(f"Dataset {name!r} needs a 'train' split with a {text_field!r} column (--text-field).")

    def texts(split: str) -> list[str]:
        docs, total = [], 0
        for text in splits[split][text_field]:
            if max_chars is not None and total >= max_chars:
                break
            if text and text.strip():
                docs.append(text)
                total += len(text)
        return docs

    if "validation" in splits:
        return _ensure_both(Corpus(texts("train"), texts("validation")), name)
    named = [(f"{name}#{i}", doc) for i, doc in enumerate(texts("train"))]
    return _ensure_both(_split(named, validation_fraction, None), name)


def _hold_out(corpus: Corpus, fraction: float) -> Corpus:
    """Too few documents for the hash to pick a validation one: hold out the last document, or for a single
    document its end (at a line break)."""
    *rest, last = corpus.train
    if rest:
        return Corpus(rest, [last])
    cut = last.rfind("\n", 0, int(len(last) * (1 - fraction)))
    return corpus if cut <= 0 else Corpus([last[:cut]], [last[cut + 1 :]])


def _ensure_both(corpus: Corpus, where: str) -> Corpus:
    if not corpus.train or not corpus.validation:
        side = "training" if not corpus.train else "validation"
        raise HiResUserError(
            f"No {side} text from {where}; give more documents, a --validation-data file, or more --max-chars."
        )
    return corpus


def pack(token_lists: Iterable[Sequence[int]], block_size: int, separator_id: int | None) -> torch.Tensor:
    """Concatenate tokenised documents (separated by `separator_id`) and cut into full blocks.

    Returns (num_blocks, block_size) int64; the tail that does not fill a block is dropped.
    """
    stream: list[int] = []
    for ids in token_lists:
        stream.extend(ids)
        if separator_id is not None:
            stream.append(separator_id)
    num_blocks = len(stream) // block_size
    return torch.tensor(stream[: num_blocks * block_size], dtype=torch.long).view(num_blocks, block_size)


class PackedDataset(Dataset):
    """Fixed-length blocks for causal LM training: labels are the inputs (the model shifts them)."""

    def __init__(self, blocks: torch.Tensor) -> None:
        if blocks.ndim != 2 or blocks.shape[0] == 0:
            raise HiResUserError(
                "Not enough text to fill one block; give more data or a smaller --block-size "
                f"(got {tuple(blocks.shape)} blocks x tokens)."
            )
        self.blocks = blocks

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.blocks[index]
        return {"input_ids": ids, "labels": ids}

    @property
    def block_size(self) -> int:
        return self.blocks.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.blocks.numel()


__all__ = [
    "Corpus",
    "PackedDataset",
    "load_default_corpus",
    "load_hub_dataset",
    "load_python_sources",
    "load_text_files",
    "pack",
    "python_sources_environment",
]
