"""
The folder prepare_data.py writes: one writer at a time (files.writer_lock), only its own files
replaced or removed (told by their content: a meta.json its readers accept, shards that start with
the shard magic), the new files staged in OUT/.partial until all are written (files.staged).
"""

import contextlib
import json
import os
import re
from pathlib import Path

from bincode_gpt.files import DISK_FULL, Stage, staged, writer_lock
from bincode_gpt.shards import is_meta, MAGIC

SHARD_NAME = re.compile(r"(train|val)_\d+\.bin")
# prepare_data.py's new files until all are written; a run killed outright leaves it to the next
STAGE = Stage(name=".partial",
              mark=".prepare_data",
              mark_text="staging folder of prepare_data.py: removed when its run ends\n",
              files=rf"{SHARD_NAME.pattern}|meta\.json")


def check_prepared(out: str | Path, overwrite: bool) -> list[str]:
    """The names of a previous run's files in `out`, meta.json first, when --overwrite may replace
    them; a ValueError when `out` is '', holds files of these names that prepare_data.py did not
    write, or holds prepared data and `overwrite` is False."""
    if not os.fspath(out):
        raise ValueError("the output folder is '' (empty): name one, e.g. --out data/mine")
    out = Path(out)
    meta = out / "meta.json"
    old = []
    for p in [meta, *sorted(p for p in out.glob("*") if SHARD_NAME.fullmatch(p.name))]:
        try:
            ours = written_here(p)
        except (FileNotFoundError, NotADirectoryError):
            continue  # none, or `out` is a file (writer_lock says so)
        if not ours:
            what = "a meta.json of prepared data" if p == meta else "a token shard"
            raise ValueError(f"{p} is not {what} (prepare_data.py did not write it): it is left "
                             "alone; choose another --out")
        old.append(p.name)
    if old and not overwrite:
        raise ValueError(f"{out}: already holds prepared data ({old[0]}); pass --overwrite to "
                         "replace it")
    return old


def written_here(path: Path) -> bool:
    """Whether a file is prepare_data.py's: a meta.json that readers accept, a shard with the shard
    magic."""
    try:
        with open(path, "rb") as f:
            if path.name != "meta.json":
                return f.read(len(MAGIC)) == MAGIC
            return is_meta(json.loads(f.read()))
    except (FileNotFoundError, NotADirectoryError):
        raise  # none, or removed meanwhile by a run ending in another process
    except (OSError, ValueError, RecursionError):  # a folder, unreadable, not JSON
        return False


def remove_left_stage(out: Path) -> None:
    """Remove the staging folder a killed run left in `out`; a ValueError naming the folder or the
    files when it is not prepare_data.py's (no mark, or files it did not write), which stays."""
    path = out / STAGE.name
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        with contextlib.suppress(FileNotFoundError):  # an empty one holds nothing to lose
            path.rmdir()
        return
    if not (path / STAGE.mark).is_file():
        raise ValueError(f"{path} exists and prepare_data.py did not make it (it has no "
                         f"{STAGE.mark} mark): it is left alone; move it away or choose another "
                         "--out")
    theirs = sorted(p.name for p in path.iterdir() if not STAGE.ours(p.name) or not p.is_file())
    if theirs:
        raise ValueError(f"{path} holds files prepare_data.py did not write "
                         f"({', '.join(theirs[:3])}): they are left alone; move them away or "
                         "choose another --out")
    for p in path.iterdir():
        p.unlink()
    path.rmdir()


@contextlib.contextmanager
def staged_data(out: str | Path, overwrite: bool):
    """Make this process `out`'s one writer, and yield the folder (a Path) that the block writes
    its shards and meta.json into; when the block ends they replace the prepared data in `out`, all
    of them or none, meta.json last. A bad input, a full disk, Ctrl-C or SIGTERM leaves `out` as it
    was; a full disk is an OSError that says so."""
    out = Path(out)
    with writer_lock(out):  # a second run into `out` is refused meanwhile
        old = check_prepared(out, overwrite)
        remove_left_stage(out)
        try:
            with staged(out, last=("meta.json",), remove=old, stage=STAGE) as path:
                yield Path(path)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            kept = "the prepared data there is as it was" if old else "nothing was written there"
            raise OSError(f"{out}: not prepared: the disk is full ({os.strerror(e.errno)}); "
                          f"{kept}") from None
