"""Files and folders written whole or not at all: a reader (or a crash half-way) never sees half of one.

Each writer goes through a temporary sibling in the target's own folder (same filesystem), then a rename, which
is atomic on POSIX and Windows. Files end up with ordinary permissions (0644) and folders 0755, not mkstemp's
0600 / 0700, because results, models and shipped data are meant to be read by others.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import HiResUserError


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


@contextmanager
def staged_folder(path: str | os.PathLike) -> Iterator[Path]:
    """A fresh temporary folder next to `path` to write into, which becomes `path` only if the body succeeds.

    On success whatever stood at `path` (a folder or a file) is swapped out and deleted; on failure the temporary
    folder vanishes and `path` is left as it was. Checking whether `path` may be replaced is the caller's job.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        os.chmod(staging, 0o755)
        yield staging
        _swap_in(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it became `path`


def _swap_in(staging: Path, path: Path) -> None:
    """Rename `staging` to `path`, moving an existing `path` aside first and deleting it once replaced."""
    if not os.path.lexists(path):
        staging.rename(path)
        return
    old = path.with_name(f".{path.name}.replaced-{uuid.uuid4().hex[:8]}")
    path.rename(old)
    try:
        staging.rename(path)
    except BaseException:
        old.rename(path)  # put the original back: the caller sees the error and an unchanged `path`
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old)
    else:
        old.unlink()


def ensure_writable(folder: str | os.PathLike) -> None:
    """Fail before any long work (training, conversion) if results could not be written to `folder`."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise HiResUserError(
            f"Cannot write to output directory {folder} ({error.strerror}); choose another."
        ) from error


__all__ = ["ensure_writable", "staged_folder", "write_json_atomic", "write_text_atomic"]
