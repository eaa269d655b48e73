"""hires_hf.io: files and folders appear whole or not at all, readable by others; an unwritable folder fails early."""

import stat
from pathlib import Path

import pytest

from hires_hf.errors import HiResUserError
from hires_hf.io import ensure_writable, staged_folder, write_json_atomic, write_text_atomic


def _siblings(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


@pytest.mark.parametrize("existing", [None, "folder", "empty-folder", "file"], ids=str)
def test_staged_folder_becomes_the_path_and_replaces_what_was_there(tmp_path: Path, existing: str | None) -> None:
    target = tmp_path / "model"
    if existing == "folder":
        target.mkdir()
        (target / "old.bin").write_text("old")
    elif existing == "empty-folder":
        target.mkdir()
    elif existing == "file":
        target.write_text("a file in the way")
    with staged_folder(target) as staging:
        assert staging.parent == tmp_path and staging != target
        (staging / "config.json").write_text("{}")
        if existing:  # nothing is visible at the target until the body is done
            assert not (target / "config.json").exists()
    assert _siblings(target) == ["config.json"]  # the old contents are gone with the old folder
    assert _siblings(tmp_path) == ["model"]  # no staging or replaced folder left behind
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # readable by others, not mkdtemp's 0700


def test_staged_folder_leaves_the_path_as_it_was_when_the_body_fails(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights.bin").write_text("the good ones")
    with pytest.raises(RuntimeError, match="half-way"), staged_folder(target) as staging:
        (staging / "weights.bin").write_text("half")
        raise RuntimeError("crashed half-way")
    assert (target / "weights.bin").read_text() == "the good ones"
    assert _siblings(tmp_path) == ["model"]


def test_staged_folder_makes_missing_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "hub"
    with staged_folder(target) as staging:
        (staging / "README.md").write_text("card")
    assert (target / "README.md").read_text() == "card"


def test_atomic_writes_leave_no_temporary_file_and_ordinary_permissions(tmp_path: Path) -> None:
    json_path = write_json_atomic(tmp_path / "out" / "result.json", {"loss": 3.5})
    text_path = write_text_atomic(tmp_path / "out" / "table.md", "| a |\n")
    assert json_path.read_text() == '{\n  "loss": 3.5\n}\n' and text_path.read_text() == "| a |\n"
    assert _siblings(tmp_path / "out") == ["result.json", "table.md"]
    assert stat.S_IMODE(json_path.stat().st_mode) == 0o644


def test_ensure_writable_makes_the_folder_or_names_it_in_one_line(tmp_path: Path) -> None:
    ensure_writable(tmp_path / "runs" / "train")
    assert _siblings(tmp_path / "runs" / "train") == []  # the write probe is gone
    (tmp_path / "blocked").write_text("a file where the folder should be")
    with pytest.raises(HiResUserError, match=r"Cannot write to output directory .*blocked.*; choose another\."):
        ensure_writable(tmp_path / "blocked" / "out")
