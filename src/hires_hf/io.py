"""Files written whole or not at all: a reader (or a crash half-way) never sees half a results file.

Each writer goes through a temporary file in the target's own folder (same filesystem), then `os.replace`,
which is atomic on POSIX and Windows. The file ends up with ordinary permissions (0644), not mkstemp's 0600,
because results and shipped data are meant to be read by others.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through a temporary sibling and a rename; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(
    path: str | os.PathLike,
    payload: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> Path:
    """`payload` as JSON (plus a final newline) at `path`, written atomically; `default` serialises the rest."""
    text = json.dumps(payload, indent=indent, sort_keys=sort_keys, default=default, ensure_ascii=False)
    return write_text_atomic(path, text + "\n")


__all__ = ["write_json_atomic", "write_text_atomic"]
