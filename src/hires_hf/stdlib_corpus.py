"""The embedded corpus: the running Python's standard-library sources, and which of them evaluation keeps.

Every machine with Python has these files (real text, written by many people), so training and the offline
evaluation tasks need no network. One file in ten is held out for the evaluation tasks, chosen by a hash of its
path (not its content, so the split is the same across Python versions); training never reads those files.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str) -> bool:
    """Whether a stdlib file (path relative to the stdlib root, '/'-separated) belongs to the evaluation split."""
    return zlib.crc32(relative_path.encode()) % 10 == 0


def stdlib_sources(root: Path | None = None) -> dict[str, Path]:
    """Every `.py` file of the stdlib (third-party site-packages left out), by '/'-separated relative path."""
    root = root or stdlib_root()
    sources = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if "site-packages" not in relative.parts:
            sources[relative.as_posix()] = path
    return sources


def read_utf8(path: Path) -> str | None:
    """The file's text, or None for the few stdlib files that are deliberately in other encodings."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


__all__ = ["is_held_out", "read_utf8", "stdlib_root", "stdlib_sources"]
