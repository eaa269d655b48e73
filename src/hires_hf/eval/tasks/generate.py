"""Regenerate the offline tasks' data from the Python standard library's own sources.

Every machine with Python has the stdlib sources, so the tasks need no network. Only held-out files are used
(`is_held_out`: a stable hash of the path, one file in ten), so that a model trained on the rest of the stdlib
is evaluated on code it has not seen. The output depends only on the seed and on the Python version's sources.

    python -m hires_hf.eval.tasks.generate            # rewrites the jsonl files next to this module
    python -m hires_hf.eval.tasks.generate --out DIR  # or somewhere else
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import re
from pathlib import Path

from ...io import write_json_atomic, write_text_atomic
from ...stdlib_corpus import is_held_out, read_utf8, stdlib_sources

TASKS_DIR = Path(__file__).resolve().parent
NEXT_LINE_FILE = "stdlib_next_line.jsonl"
PERPLEXITY_FILE = "stdlib_perplexity.jsonl"
MANIFEST_FILE = "manifest.json"  # which Python's stdlib the shipped data came from, and its checksums

_NAME = re.compile(r"[A-Za-z_]\w{2,}")  # identifiers of 3+ characters
_SKIPPED_PARTS = {"site-packages", "test", "tests", "idle_test", "encodings", "__pycache__"}


def held_out_sources(stdlib_dir: Path | None = None) -> dict[str, list[str]]:
    """The held-out stdlib files as {relative path: lines without trailing whitespace}, in sorted order."""
    sources = {}
    for relative, path in stdlib_sources(stdlib_dir).items():
        if _SKIPPED_PARTS.intersection(relative.split("/")) or not is_held_out(relative):
            continue
        text = read_utf8(path)
        if text is not None:
            sources[relative] = [line.rstrip() for line in text.splitlines()]
    return sources


def next_line_docs(
    sources: dict[str, list[str]], n_docs: int = 500, context_lines: int = 8, seed: int = 0
) -> list[dict]:
    """Multiple choice: after `context_lines` lines of a file, which of 4 lines comes next?

    The wrong choices are lines of similar length from *other* files, so a model that has learnt how Python
    continues (indentation, names already in scope, syntax) beats the 25% of chance. The true line always reuses
    a name from the context, so the context, not luck, decides the answer (as LAMBADA filters for context).
    """
    rng = random.Random(seed)
    names = list(sources)
    lines_by_length: dict[int, list[tuple[str, str]]] = {}  # stripped length // 8 -> [(file, line)]
    for name, lines in sources.items():
        for line in lines:
            if len(line.strip()) >= 12:
                lines_by_length.setdefault(len(line.strip()) // 8, []).append((name, line))

    docs: list[dict] = []
    seen: set[str] = set()
    while len(docs) < n_docs:
        name = rng.choice(names)
        lines = sources[name]
        if len(lines) <= context_lines:
            continue
        i = rng.randrange(context_lines, len(lines))
        answer = lines[i]
        context = lines[i - context_lines : i]
        # An answer must be informative and unambiguous: long enough, not a repeat of a line in the file.
        if len(answer.strip()) < 12 or lines.count(answer) > 1:
            continue
        if not set(_NAME.findall(answer)) & set(_NAME.findall("\n".join(context))):
            continue
        pool = [line for other, line in lines_by_length.get(len(answer.strip()) // 8, []) if other != name]
        in_file = set(lines)
        distractors: list[str] = []
        while len(distractors) < 3 and pool:
            line = rng.choice(pool)
            if line not in in_file and line not in distractors:
                distractors.append(line)
        key = f"{name}:{i}"
        if len(distractors) < 3 or key in seen:
            continue
        seen.add(key)
        choices = [answer, *distractors]
        rng.shuffle(choices)
        docs.append(
            {"source": key, "context": "\n".join(context) + "\n", "choices": choices, "label": choices.index(answer)}
        )
    return docs


def perplexity_docs(sources: dict[str, list[str]], n_docs: int = 64, chars: int = 1200, seed: int = 1) -> list[dict]:
    """Perplexity: `n_docs` chunks of whole lines (about `chars` characters each) from the held-out files."""
    rng = random.Random(seed)
    names = [name for name, lines in sources.items() if sum(len(line) + 1 for line in lines) > 2 * chars]
    docs: list[dict] = []
    seen: set[str] = set()
    while len(docs) < n_docs:
        name = rng.choice(names)
        lines = sources[name]
        start = rng.randrange(len(lines))
        chunk: list[str] = []
        for line in lines[start:]:
            if sum(len(kept) + 1 for kept in chunk) >= chars:
                break
            chunk.append(line)
        text = "\n".join(chunk).strip("\n")
        key = f"{name}:{start}"
        if len(text) < chars // 2 or key in seen:
            continue
        seen.add(key)
        docs.append({"source": key, "text": text + "\n"})
    return docs


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def generate(out_dir: Path = TASKS_DIR, stdlib_dir: Path | None = None) -> dict[str, int]:
    """Write both tasks' jsonl files into `out_dir`; returns the number of docs in each."""
    sources = held_out_sources(stdlib_dir)
    files = {NEXT_LINE_FILE: _jsonl(next_line_docs(sources)), PERPLEXITY_FILE: _jsonl(perplexity_docs(sources))}
    for name, text in files.items():
        write_text_atomic(Path(out_dir) / name, text)
    manifest = {
        "python": platform.python_version(),
        "held_out_files": len(sources),
        "files": {
            name: {"docs": text.count("\n"), "sha256": hashlib.sha256(text.encode()).hexdigest()}
            for name, text in files.items()
        },
    }
    write_json_atomic(Path(out_dir) / MANIFEST_FILE, manifest)
    return {name: text.count("\n") for name, text in files.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description="Regenerate the offline stdlib tasks' data.")
    parser.add_argument("--out", type=Path, default=TASKS_DIR, help="folder for the jsonl files")
    parser.add_argument("--stdlib", type=Path, default=None, help="stdlib folder (default: this Python's)")
    args = parser.parse_args()
    for name, count in generate(args.out, args.stdlib).items():
        print(f"{args.out / name}: {count} docs")


if __name__ == "__main__":
    main()
