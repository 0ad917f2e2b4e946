"""files.staged, the one staging mechanism (tools/convert.py, the studies' results and prepare_data.py write
through it): all the files or none, the reader's first file last, the files it replaces or removes back if
anything fails, and a staging folder of a fixed name that removes only its writer's files."""
import os
from pathlib import Path

import pytest

from bincode_gpt.files import REPLACED, Stage, staged

MARKED = Stage(name=".partial", mark=".mine", mark_text="mine\n", files=r"part_\d+|index\.json")


def files(folder):
    return {name: (folder / name).read_text() for name in sorted(os.listdir(folder))}


def test_all_files_go_in_the_last_one_last_and_the_removed_ones_go(tmp_path, monkeypatch):
    (tmp_path / "index.json").write_text("old index")
    (tmp_path / "stale.bin").write_text("old")
    (tmp_path / "notes.txt").write_text("a user's")
    moves = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: moves.append(os.path.basename(b)) or replace(a, b))
    with staged(tmp_path, last=("index.json",), remove=("stale.bin",)) as stage:
        assert os.path.dirname(stage) == str(tmp_path) and os.path.basename(stage) == f".staging{os.getpid()}"
        for name in ("index.json", "b", "a"):
            (Path(stage) / name).write_text(f"new {name}")
    assert files(tmp_path) == {"a": "new a", "b": "new b", "index.json": "new index.json", "notes.txt": "a user's"}
    moved_in = [m for m in moves if not m.startswith(REPLACED)]
    assert moved_in == ["a", "b", "index.json"]  # the reader's first file last


def test_a_failure_in_the_block_leaves_the_folder_as_it_was(tmp_path):
    (tmp_path / "index.json").write_text("old index")
    (tmp_path / "stale.bin").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with staged(tmp_path, last=("index.json",), remove=("stale.bin",)) as stage:
            (Path(stage) / "index.json").write_text("new")
            raise KeyboardInterrupt
    assert files(tmp_path) == {"index.json": "old index", "stale.bin": "old"}


def test_a_full_disk_says_so(tmp_path):
    with pytest.raises(OSError) as e:
        with staged(tmp_path):
            raise OSError(28, "No space left on device")
    assert e.value.errno == 28 and str(e.value) == (
        f"[Errno 28] {tmp_path}: not written: the disk is full (No space left on device); nothing of this run is "
        "left there, and what it held is as it was")
    assert os.listdir(tmp_path) == []


def test_a_marked_stage_keeps_its_mark_out_of_the_folder(tmp_path):
    with staged(tmp_path, last=("index.json",), stage=MARKED) as stage:
        assert stage == os.path.join(tmp_path, ".partial") and files(tmp_path / ".partial") == {".mine": "mine\n"}
        (Path(stage) / "part_0").write_text("0")
        (Path(stage) / "index.json").write_text("{}")
    assert files(tmp_path) == {"index.json": "{}", "part_0": "0"}


def test_a_marked_stage_removes_only_its_writers_files(tmp_path):
    """A file its writer did not write (a name not of its names, a file move_in replaced) outlives the failure, and
    so does the staging folder that holds it."""
    with pytest.raises(ValueError):
        with staged(tmp_path, stage=MARKED) as stage:
            for name in ("part_0", "part_1.tmp123", "notes.txt", REPLACED + "part_0"):
                (Path(stage) / name).write_text(name)
            raise ValueError("a bad input")
    assert files(tmp_path / ".partial") == {"notes.txt": "notes.txt", REPLACED + "part_0": REPLACED + "part_0"}


@pytest.mark.parametrize("name, ours", [(".mine", True), ("part_12", True), ("index.json.tmp77", True),
                                        ("part_x", False), ("index.json.bak", False), (REPLACED + "index.json", False)])
def test_stage_tells_its_writers_files(name, ours):
    assert MARKED.ours(name) is ours


def test_the_default_stage_holds_this_processes_files_alone():
    stage = Stage(f".staging{os.getpid()}")
    assert stage.ours("anything.bin") and stage.ours("ckpt.pt.tmp5") and not stage.ours(REPLACED + "ckpt.pt")
