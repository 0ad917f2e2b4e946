"""
Files that are never half written, and folders with one writer: atomic writes (a temp file renamed
over the old), several files moved in all or none, the writer lock of an output folder, and what is
wrong with a path.
"""

import contextlib
import errno
import os
import re
import stat
from dataclasses import dataclass


@contextlib.contextmanager
def atomic_open(path, mode="wb", **kwargs):
    """Open a temp file beside `path`; on success fsync it and rename it over `path`. Readers see
    the old file or the whole new one, never half of one: a crash, Ctrl-C or full disk mid-write
    leaves the old file byte for byte (the temp file is removed)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the rename must not land before the data
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            raise disk_full(path, e.errno) from None
        raise


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """A write that a full disk (or quota) stopped: errno, and strerror "the disk is full: ..." for
    callers that add their own context; printed, the whole message (disk_full)."""

    def __str__(self):
        return self.message


def disk_full(path, code=errno.ENOSPC):
    """The DiskFull of a write to `path`: it says the disk is full, and which file survives
    (atomic_open leaves the previous `path` as it was)."""
    kept = "nothing was replaced"
    if os.path.exists(path):
        kept = f"the previous {os.path.basename(path)} is as it was"
    e = DiskFull(code, f"the disk is full: {os.strerror(code)}")
    e.message = f"{path}: not written: {e.strerror}; {kept}"
    return e


def file_problem(path):
    """Why `path` is not a regular file that can be opened (None when it is one): missing, a symlink
    loop, a broken symlink, a folder, a device or FIFO. "No such file" is said only of a path that
    is not there."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop (it resolves to itself)"
        if e.errno == errno.ENOENT and os.path.islink(path):
            return f"a broken symlink (to {os.readlink(path)}, which does not exist)"
        return "no such file" if e.errno == errno.ENOENT else f"cannot be read ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    link = f"a symlink to {os.path.realpath(path)}, " if os.path.islink(path) else ""
    kind = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
    return f"{link}{kind}, not a regular file"


def file_stamp(path):
    """Which file is at `path` now (a save replaces it with a new one), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def atomic_write(path, data):
    """Write bytes or str to `path` atomically (see atomic_open)."""
    text = {} if isinstance(data, bytes) else {"encoding": "utf-8"}
    with atomic_open(path, "w" if text else "wb", **text) as f:
        f.write(data)


REPLACED = ".was."  # a file move_in replaces, kept in the staging folder until all are in


@dataclass(frozen=True)
class Stage:
    """A staging folder: its name inside the output folder, and what in it its writer wrote. By
    default `.staging<pid>`, this process's alone. A writer that is its folder's one writer
    (writer_lock) may give it a fixed name and a mark (a file written in it first, never moved in):
    a run killed outright (-9) leaves it behind, and the writer's next run can tell it is its own
    (the mark, and every file of the names `files`, a regular expression) before removing it."""
    name: str
    mark: str | None = None
    mark_text: str = ""
    files: str = ".+"

    def ours(self, name: str) -> bool:
        """Whether the file `name` in this staging folder is one its writer wrote (its temp files
        too; not a file move_in replaced, which goes back if a move fails)."""
        if name.startswith(REPLACED):
            return False
        written = re.fullmatch(rf"(?:{self.files})(?:\.tmp\d+)?", name) is not None
        return written or name == self.mark


@contextlib.contextmanager
def staged(folder, last=(), remove=(), stage=None):
    """Write several files into `folder` all or none. The block writes them into the staging folder
    it is given (inside `folder`, so that moving them is a rename, which needs no disk space); when
    it ends they are moved into `folder` (move_in), replacing files of those names (the names in
    `last` last: the one a reader opens first), and the files `remove` of `folder` are removed; if
    it raises (a full disk, Ctrl-C) or a move fails, they are removed and `folder` is as it was.
    `stage`: the Stage to use (the caller has removed one a killed run left), else .staging<pid>."""
    stage = stage or Stage(f".staging{os.getpid()}")
    path = os.path.join(folder, stage.name)
    try:
        os.mkdir(path)
        if stage.mark:
            with open(os.path.join(path, stage.mark), "w", encoding="utf-8") as f:
                f.write(stage.mark_text)
        yield path
        order = {f: i for i, f in enumerate(last, 1)}  # the names in `last` last, in that order
        names = sorted((f for f in os.listdir(path) if f != stage.mark),
                       key=lambda f: (order.get(f, 0), f))
        move_in(path, folder, names, remove)
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise OSError(e.errno, f"{folder}: not written: the disk is full ({os.strerror(e.errno)}); "
                               "nothing of this run is left there, and what it held is as it "
                               "was") from None
    finally:
        if os.path.isdir(path):
            for f in os.listdir(path):  # this run's files alone, not the replaced ones an undo
                if stage.ours(f):  # that failed could not move back
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(path, f))
            with contextlib.suppress(OSError):
                os.rmdir(path)


def move_in(stage, folder, names, remove=()):
    """Move the files `names` of `stage` into `folder` in that order (the last: the file a reader
    opens first), replacing files of those names, and remove the files `remove` of `folder`: all of
    it, or none. The files it replaces or removes go into `stage` first, the reader's first file
    first (so the folder stops looking complete at once), and come back if a move fails (a full
    disk, Ctrl-C): removals, and renames to names that were there, need no disk space."""
    old = [f for f in dict.fromkeys([*reversed(names), *remove])
           if os.path.lexists(os.path.join(folder, f))]
    out = []  # the files moved aside into `stage`
    moved = []  # the files moved into `folder`
    try:
        for f in old:
            os.replace(os.path.join(folder, f), os.path.join(stage, REPLACED + f))
            out.append(f)
        for f in names:
            os.replace(os.path.join(stage, f), os.path.join(folder, f))
            moved.append(f)
    except BaseException:
        for f in reversed(moved):
            os.remove(os.path.join(folder, f))
        for f in reversed(out):
            os.replace(os.path.join(stage, REPLACED + f), os.path.join(folder, f))
        raise
    for f in out:
        os.remove(os.path.join(stage, REPLACED + f))


LOCK_NAME = ".writer.lock"


@contextlib.contextmanager
def writer_lock(folder, outputs=()):
    """Make this process the one writer of `folder` while the block runs: an exclusive flock on
    `folder`/.writer.lock, which the kernel releases when the process ends, even when it is killed
    with -9, so a lock never outlives its writer. A second writer gets a ValueError naming the
    holder's pid. Once locked, removes the temp files a killed writer left (atomic_open's
    `<name>.tmp<pid>`, that pid no longer running) of the file names in `outputs`: only names the
    caller writes, never a user's. A process that holds `folder` already may enter again (a no-op).
    A folder it made is removed again if the block raises and the folder holds nothing but the
    lock."""
    import fcntl

    if not os.fspath(folder):
        raise ValueError("the output folder is '' (empty): name a folder")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder} is a file, not a folder: name a folder to write into")
    key = os.path.realpath(folder)
    # this process holds it already (a study that prepares its data into its own folder)
    if key in _held:
        yield
        return
    made = not os.path.lexists(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if made:  # a folder made, its lock file not: none left behind
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        if e.errno in DISK_FULL:
            raise disk_full(folder, e.errno) from None
        raise
    failed = True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ValueError(f"{folder} is being written by another process (pid {holder}); "
                             "wait for it to finish or choose another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        for name in os.listdir(folder):
            m = re.fullmatch(r"(.+)\.tmp(\d+)", name)
            if m and m.group(1) in outputs and not _pid_alive(int(m.group(2))):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, name))
        _held.add(key)
        yield
        failed = False
    finally:
        _held.discard(key)
        # a failed first write leaves no folder behind
        if failed and made and os.listdir(folder) == [LOCK_NAME]:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, LOCK_NAME))
                os.rmdir(folder)
        os.close(fd)  # closing the descriptor releases the lock


# the folders this process holds: a second open of the lock file would conflict with its own
_held = set()


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
