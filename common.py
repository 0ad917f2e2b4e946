"""
The few helpers every script shares, one of each: atomic file writes, device choice, a command line
generated from a dataclass, and a `main` wrapper that turns the project's expected errors into one line.
"""

import argparse
import contextlib
import errno
import os
import re
import sys
import typing
from dataclasses import MISSING, field, fields


# ----------------------------------------------------------------------------- files
@contextlib.contextmanager
def atomic_open(path, mode="wb", **kwargs):
    """Open a temp file beside `path`; on success fsync it and rename it over `path`. Readers see the
    old file or the whole new one, never half of one: a crash, Ctrl-C or full disk mid-write leaves
    the old file byte for byte (the temp file is removed)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the rename must not land before the data
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_torch_save(obj, path):
    """torch.save to `path` atomically; torch reports a failed write (a full disk) as a RuntimeError,
    turned here into the OSError it is."""
    import torch

    try:
        with atomic_open(path) as f:
            torch.save(obj, f)
    except RuntimeError as e:  # errno EIO, so callers that add their own context can use .strerror
        raise OSError(errno.EIO, f"write failed ({one_line(e)})", str(path)) from None


def atomic_write(path, data):
    """Write bytes or str to `path` atomically (see atomic_open)."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
        f.write(data)


LOCK_NAME = ".writer.lock"


@contextlib.contextmanager
def writer_lock(folder, outputs=()):
    """Make this process the one writer of `folder` while the block runs: an exclusive flock on
    `folder`/.writer.lock, which the kernel releases when the process ends, even when it is killed with
    -9, so a lock never outlives its writer. A second writer gets a ValueError naming the holder's pid.
    Once locked, removes the temp files a killed writer left (atomic_open's `<name>.tmp<pid>`, that pid
    no longer running) of the file names in `outputs`: only names the caller writes, never a user's.
    A process that holds `folder` already may enter again (a no-op)."""
    import fcntl

    if not os.fspath(folder):
        raise ValueError("the output folder is '' (empty): name a folder")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder} is a file, not a folder: name a folder to write into")
    key = os.path.realpath(folder)
    if key in _held:  # this process holds it already (a study that prepares its data into its own folder)
        yield
        return
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
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
    finally:
        _held.discard(key)
        os.close(fd)  # closing the descriptor releases the lock


_held = set()  # the folders this process holds: a second open of the lock file would conflict with its own


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


# ----------------------------------------------------------------------------- devices
def pick_device(name="auto"):
    """'auto' -> cuda, then mps, then cpu. An explicit name must be usable here, or ValueError says why."""
    import torch  # here, not at the top: prepare_data.py needs no torch, and importing it takes seconds

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this PyTorch build sees no CUDA GPU: use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are visible")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {name!r} asked for, but MPS is not available here: use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {name!r}: use auto, cpu, cuda, cuda:N or mps")
    return device


# ----------------------------------------------------------------------------- command lines
def parse_int(s):
    """'5000' or '5e3' -> 5000; '2.5' is an error."""
    try:
        x = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if not x.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}")
    return int(x)


def parse_bool(s):
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def setting(default, help):
    """A dataclass field with its --help text, for config_parser."""
    return field(default=default, metadata={"help": help})


def config_parser(cls, description):
    """An argparse parser with one --name option per field of dataclass `cls` (help from the field's
    metadata["help"]). Bools take --flag, --no-flag or --flag=true/false; an optional field
    (`int | None`) takes "none" to mean unset."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        args = typing.get_args(hints[f.name])
        kind = next((t for t in args if t is not type(None)), hints[f.name])
        parse = {int: parse_int, bool: parse_bool}.get(kind, kind)
        if type(None) in args:
            parse = _or_none(parse)
        default = f.default if f.default is not MISSING else f.default_factory()
        help = f.metadata.get("help", "")
        if kind is bool:
            p.add_argument(f"--{f.name}", nargs="?", const=True, type=parse, default=default, metavar="BOOL",
                           help=f"{help}; --no-{f.name} turns it off")
            p.add_argument(f"--no-{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
        else:
            p.add_argument(f"--{f.name}", type=parse, default=default, help=help)
    return p


def _or_none(parse):
    def parse_optional(s):
        return None if s.lower() in ("none", "null") else parse(s)

    parse_optional.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in its errors
    return parse_optional


# ----------------------------------------------------------------------------- errors
def one_line(text, limit=200):
    """An exception's text as one plain line: no newlines, no terminal colour codes, at most limit chars
    (torch's unpickling errors span lines and carry ANSI codes)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(text).split()))[:limit]


def run_main(main, argv=None):
    """Run a script's main(argv) and return its exit code (0 unless main returns an int). The project's expected errors (bad input, missing or
    corrupt files, a full disk, a diverged run: ValueError, OSError, FloatingPointError) print one
    `error:` line and exit 1; Ctrl-C exits 130 quietly. Anything else is a bug and keeps its traceback.
    Set TRACEBACK=1 (or true, yes, on) to see the traceback of an expected error too."""
    try:
        result = main(argv)
        return result if isinstance(result, int) else 0
    except (ValueError, OSError, FloatingPointError) as e:
        if os.environ.get("TRACEBACK", "").lower() in ("1", "true", "yes", "on"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
