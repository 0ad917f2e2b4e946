"""
The few helpers every script shares, one of each: atomic file writes, device choice, a command line
generated from a dataclass, and a `main` wrapper that turns the project's expected errors into one line.
It is a library: the commands are train.py, sample.py, prepare_data.py and the tools.
"""

import argparse
import contextlib
import dataclasses
import errno
import os
import re
import select
import signal
import stat
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
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            raise disk_full(path, e.errno) from None
        raise


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """A write that a full disk (or quota) stopped: errno, and strerror "the disk is full: ..." for callers that
    add their own context; printed, the whole message (disk_full)."""

    def __str__(self):
        return self.message


def disk_full(path, code=errno.ENOSPC):
    """The DiskFull of a write to `path`: it says the disk is full, and which file survives (atomic_open
    leaves the previous `path` as it was)."""
    kept = f"the previous {os.path.basename(path)} is as it was" if os.path.exists(path) else "nothing was replaced"
    e = DiskFull(code, f"the disk is full: {os.strerror(code)}")
    e.message = f"{path}: not written: {e.strerror}; {kept}"
    return e


def file_problem(path):
    """Why `path` is not a regular file that can be opened (None when it is one): missing, a symlink loop, a
    broken symlink, a folder, a device or FIFO. "No such file" is said only of a path that is not there."""
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
    return f"{link}{'a folder' if stat.S_ISDIR(mode) else 'a device, FIFO or socket'}, not a regular file"


def atomic_write(path, data):
    """Write bytes or str to `path` atomically (see atomic_open)."""
    text = {} if isinstance(data, bytes) else {"encoding": "utf-8"}
    with atomic_open(path, "w" if text else "wb", **text) as f:
        f.write(data)


@contextlib.contextmanager
def staged(folder, last=()):
    """Write several files into `folder` all or none. The block writes them into the staging folder it is
    given (inside `folder`, so that moving them is a rename, which needs no disk space); when it ends they
    are moved into `folder` (move_in), replacing files of those names (the names in `last` last: the one a
    reader opens first); if it raises (a full disk, Ctrl-C) or a move fails, they are removed and `folder` is
    as it was."""
    stage = os.path.join(folder, f".staging{os.getpid()}")
    try:
        os.mkdir(stage)
        yield stage
        names = sorted(os.listdir(stage), key=lambda f: (f in last, last.index(f) if f in last else 0, f))
        move_in(stage, folder, names)
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise OSError(e.errno, f"{folder}: not written: the disk is full ({os.strerror(e.errno)}); nothing of this "
                               "run is left there, and what it held is as it was") from None
    finally:
        if os.path.isdir(stage):
            for f in os.listdir(stage):  # this run's files alone (the folder is this process's), not the replaced
                if not f.startswith(REPLACED):  # ones an undo that failed could not move back
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(stage, f))
            with contextlib.suppress(OSError):
                os.rmdir(stage)


REPLACED = ".was."  # a file move_in replaces, kept in the staging folder until all are in


def move_in(stage, folder, names, remove=()):
    """Move the files `names` of `stage` into `folder` in that order (the last: the file a reader opens first),
    replacing files of those names, and remove the files `remove` of `folder`: all of it, or none. The files it
    replaces or removes go into `stage` first, the reader's first file first (so the folder stops looking complete
    at once), and come back if a move fails (a full disk, Ctrl-C): removals, and renames to names that were there,
    need no disk space."""
    old = [f for f in dict.fromkeys([*reversed(names), *remove]) if os.path.lexists(os.path.join(folder, f))]
    out, moved = [], []
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
    `folder`/.writer.lock, which the kernel releases when the process ends, even when it is killed with
    -9, so a lock never outlives its writer. A second writer gets a ValueError naming the holder's pid.
    Once locked, removes the temp files a killed writer left (atomic_open's `<name>.tmp<pid>`, that pid
    no longer running) of the file names in `outputs`: only names the caller writes, never a user's.
    A process that holds `folder` already may enter again (a no-op). A folder it made is removed again
    if the block raises and the folder holds nothing but the lock."""
    import fcntl

    if not os.fspath(folder):
        raise ValueError("the output folder is '' (empty): name a folder")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder} is a file, not a folder: name a folder to write into")
    key = os.path.realpath(folder)
    if key in _held:  # this process holds it already (a study that prepares its data into its own folder)
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
        if failed and made and os.listdir(folder) == [LOCK_NAME]:  # a failed first write leaves no folder behind
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, LOCK_NAME))
                os.rmdir(folder)
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
# dense (no 2:4 sparsity) bf16 tensor-core peak FLOP/s of one device, from the vendor's datasheet, by the exact name
# torch.cuda.get_device_name returns: a name not here gets no MFU (--peak_flops gives one), never a neighbour's
# figure ("NVIDIA L40" is not an L4, "NVIDIA RTX A1000" not an A100, an H100 PCIe not an SXM one)
PEAK_FLOPS = {
    "NVIDIA B200": 2250e12,
    "NVIDIA H200": 989e12,  # SXM
    "NVIDIA H200 NVL": 835e12,
    "NVIDIA GH200 480GB": 989e12,
    "NVIDIA H100 80GB HBM3": 989e12,  # SXM5
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H800": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA A800-SXM4-80GB": 312e12,
    "NVIDIA A10": 125e12,
    "NVIDIA A40": 149.7e12,
    "NVIDIA L40S": 362e12,
    "NVIDIA L40": 181e12,
    "NVIDIA L4": 121e12,
    "NVIDIA RTX A6000": 154.8e12,
    "NVIDIA RTX 6000 Ada Generation": 364.2e12,
}


def peak_flops(device):
    """Peak FLOP/s of one device, for MFU: PEAK_FLOPS's entry for this GPU's exact name, else None (no CPU figure)."""
    import torch

    if device.type == "cuda":
        return PEAK_FLOPS.get(torch.cuda.get_device_name(device))
    return None


def has_bf16(device):
    """Whether `device` is a CUDA GPU with bfloat16 tensor cores (compute capability 8.0 on: Ampere and later),
    where --dtype auto picks bfloat16. torch.cuda.is_bf16_supported() also counts emulation: a V100 or T4 would
    then pick a bfloat16 slower than its float32."""
    import torch

    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


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


def available_memory(device):
    """Bytes that new tensors on `device` can take now (CUDA: free GPU memory; CPU: Linux's MemAvailable),
    or None where that cannot be told (MPS, a CPU without /proc/meminfo): then nothing is refused on it."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return None
    return None


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


def setting(default=MISSING, help="", **argument):
    """A dataclass field with its --help text, for config_parser. Other keywords go to argparse's
    add_argument: choices=[...], nargs=..., type=... (instead of the annotation's); positional=True
    makes it a positional argument. A list default is copied for each instance."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **argument})
    return field(default=default, metadata={"help": help, **argument})


def preset_setting(default, help="", **presets):
    """A setting whose value a preset switch can change: `steps: int = preset_setting(600, "...", quick=60)`
    is 600, or 60 under --quick, unless the command line names --steps. The field is None after parsing
    when not given ("the preset's value"); resolve_presets fills it in. --help shows the default and
    each preset's value."""
    values = "".join(f"; --{name}: {_shown(value)}" for name, value in presets.items())
    return setting(None, f"{help} (default {_shown(default)}{values})".lstrip(), presets={None: default, **presets})


def _shown(value):
    return repr(value) if value == "" else value  # an empty value is seen as ''



def resolve_presets(cfg, *switches):
    """Fill each preset_setting of `cfg` left unset with the value of the preset whose bool switch (a
    field named in `switches`, e.g. "quick") is on, else its default. Two switches on at once is a
    ValueError: they are two different studies."""
    on = [name for name in switches if getattr(cfg, name)]
    if len(on) > 1:
        raise ValueError(f"{' and '.join('--' + name for name in on)} are two different studies: choose one")
    for f in fields(cfg):
        if "presets" in f.metadata and getattr(cfg, f.name) is None:
            values = f.metadata["presets"]
            setattr(cfg, f.name, values.get(on[0] if on else None, values[None]))
    return cfg


def with_overrides(cls, source, after, help):
    """Dataclass `cls` with an optional override of each field of dataclass `source` inserted after field `after`:
    `name: T | None = None` with --help text help(name), so `source` stays the one home of those settings."""
    new = [(f.name, f.type | None, setting(None, help(f.name))) for f in fields(source)]
    own = [(f.name, f.type, f) for f in fields(cls)]
    at = [f.name for f in fields(cls)].index(after) + 1
    namespace = {k: v for k, v in vars(cls).items() if isinstance(v, property)}
    out = dataclasses.make_dataclass(cls.__name__, own[:at] + new + own[at:], namespace=namespace)
    out.__module__, out.__qualname__, out.__doc__ = cls.__module__, cls.__qualname__, cls.__doc__
    return out


def config_parser(cls, description, epilog=None):
    """An argparse parser for dataclass `cls`: one --name option per field, help from setting().

    - Types come from the annotations: an int also takes 5e3; an optional field (`int | None`) takes
      "none" to mean unset.
    - Bools take --flag, --no-flag or --flag=true/false. In a parser with positional arguments a bool
      is only --flag / --no-flag, so it never takes the positional after it as its value.
    - setting(help=..., positional=True): a positional argument (`python -m tools.convert hf2native SRC OUT`);
      with no default it is required. Other add_argument keywords (choices=[...], nargs=...) pass
      through.
    - `cls` may be a dict {command: dataclass} for a script with subcommands: one subparser each, its
      help the dataclass's docstring; parse_settings returns the chosen command's dataclass.
    - preset_setting(default, help, quick=...): a value that a preset switch (a bool field such as
      --quick) changes; resolve_presets(cfg, "quick") fills it in after parse_settings.
    --help shows each default unless the help text already speaks of it. parse_settings(parser, argv)
    gives the filled dataclass.
    """
    p = argparse.ArgumentParser(description=description, epilog=epilog, formatter_class=_HelpFormatter)
    p.settings = cls
    if isinstance(cls, dict):
        sub = p.add_subparsers(dest="command", required=True)
        for name, command in cls.items():
            doc = command.__doc__.strip()
            _add_fields(sub.add_parser(name, help=doc, description=doc, formatter_class=_HelpFormatter), command)
    else:
        _add_fields(p, cls)
    return p


def parse_settings(parser, argv=None):
    """argv -> the dataclass that config_parser made `parser` from, filled in (with subcommands: the
    chosen command's dataclass)."""
    args = vars(parser.parse_args(argv))
    cls = parser.settings
    return cls[args.pop("command")](**args) if isinstance(cls, dict) else cls(**args)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default in --help, unless its help already speaks of it; description and epilog
    as written."""

    def _get_help_string(self, action):
        return action.help if "default" in (action.help or "") else super()._get_help_string(action)


def _add_fields(p, cls):
    hints = typing.get_type_hints(cls)
    switches = any(f.metadata.get("positional") for f in fields(cls))  # bools as --flag / --no-flag only
    for f in fields(cls):
        args = typing.get_args(hints[f.name])
        kind = next((t for t in args if t is not type(None)), hints[f.name])
        parse = _parser_of(kind)
        if type(None) in args:
            parse = _or_none(parse)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        extra = {k: v for k, v in f.metadata.items() if k not in ("help", "positional", "presets")}
        parse = extra.pop("type", parse)
        help = f.metadata.get("help", "")
        if f.metadata.get("positional"):
            given = {} if default is MISSING else {"default": default}
            p.add_argument(f.name, type=parse, help=help, **given, **extra)
        elif kind is bool:
            how = (dict(action="store_const", const=True) if switches
                   else dict(nargs="?", const=True, type=parse, metavar="BOOL"))
            off = f"; --no-{f.name} turns it off" if default is not False else ""
            p.add_argument(f"--{f.name}", default=default, help=help + off, **how)
            p.add_argument(f"--no-{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
        else:
            p.add_argument(f"--{f.name}", type=parse, default=default, help=help, **extra)


def _parser_of(kind):
    return {int: parse_int, bool: parse_bool}.get(kind, kind)


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


def run_main(main, argv=None, outlive_stdout=False):
    """Run a script's main(argv) and return its exit code (0 unless main returns an int). The project's expected
    errors (bad input, missing or corrupt files, a full disk, a diverged run: ValueError, OSError,
    FloatingPointError) print one `error:` line and exit 1; Ctrl-C exits 130 quietly. Anything else is a bug and
    keeps its traceback. Set TRACEBACK=1 (or true, yes, on) to see the traceback of an expected error too.
    A reader of stdout that has had enough (`| head`) is no error: the script ends quietly with exit 0, or,
    with outlive_stdout (a training run: its files are the record), goes on without it (OutlivingStream)."""
    if signal.getsignal(signal.SIGINT) is _note_interrupt:  # a script's imports are over: Ctrl-C raises again
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _interrupted:  # and one came during them (quiet_interrupt)
        print("interrupted", file=sys.stderr)
        return 130
    if outlive_stdout:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = OutlivingStream(sys.stdout, "stdout"), OutlivingStream(sys.stderr, "stderr")
    try:
        result = main(argv)
        sys.stdout.flush()  # buffered output meets a closed pipe here, not at exit
        return result if isinstance(result, int) else 0
    except (ValueError, OSError, FloatingPointError) as e:
        if isinstance(e, BrokenPipeError) and reader_gone(sys.stdout):
            silence(sys.stdout)
            return 0
        if os.environ.get("TRACEBACK", "").lower() in ("1", "true", "yes", "on"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if outlive_stdout:
            sys.stdout, sys.stderr = saved


def quiet_interrupt(name):
    """A script's first call, quiet_interrupt(__name__) (imported as a library, name is not "__main__", and it
    does nothing): a Ctrl-C during the script's imports (torch's take seconds) ends it as run_main ends one, one
    line and exit 130, not a traceback. The first SIGINT is noted, not raised, and run_main answers it once the
    imports are done: a KeyboardInterrupt raised inside an import can be lost, or worse (numpy's C import turns
    it into an ImportError of its own; one in an import lock's callback is "ignored" and the imports go on; one
    inside torch's C++ start-up aborts the process with a C++ stack). A second SIGINT raises at once. An
    interactive session (python -i) keeps Python's own handling, and so does a handler someone else set."""
    interactive = sys.flags.interactive or hasattr(sys, "ps1")
    if name != "__main__" or interactive or getattr(sys.excepthook, "quiet", False):
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        with contextlib.suppress(ValueError):  # not the main thread: no handler can be set
            signal.signal(signal.SIGINT, _note_interrupt)
    hook, unraisable = sys.excepthook, sys.unraisablehook

    def excepthook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt) or _interrupted:  # whatever ends the imports after a Ctrl-C
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                print("interrupted", file=sys.stderr, flush=True)
            os._exit(130)  # else Python ends itself by SIGINT, after the traceback
        hook(kind, value, tb)

    def unraisablehook(u):  # a second Ctrl-C in a callback: no "Exception ignored" report, run_main answers the first
        if not issubclass(u.exc_type, KeyboardInterrupt):
            unraisable(u)

    excepthook.quiet = True
    sys.excepthook, sys.unraisablehook = excepthook, unraisablehook


_interrupted = False  # a SIGINT came during the imports (quiet_interrupt): run_main answers it


def _note_interrupt(signum, frame):
    global _interrupted
    if _interrupted:  # the second: at once
        raise KeyboardInterrupt
    _interrupted = True


def not_a_command(library, instead):
    """What a library run as a script does: say what to run instead (`instead`), and exit 2, a usage error."""
    print(f"{library} is a library, not a command: {instead}", file=sys.stderr)
    return 2


def reader_gone(stream):
    """Whether `stream` is a pipe whose reader has closed it (poll says POLLERR on the write end)."""
    try:
        poll = select.poll()
        poll.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's capture): not a closed pipe
        return False


def silence(stream):
    """Point `stream`'s file descriptor at /dev/null, so that what is still buffered, and the flush at exit,
    go nowhere instead of raising BrokenPipeError again."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, stream.fileno())
    os.close(null)


class OutlivingStream:
    """stdout or stderr of a run that must not die with its reader: once the reader is gone, a note goes to the
    other stream (if it is still read) and further output is dropped."""

    def __init__(self, stream, name):
        self.stream, self.name = stream, name

    def write(self, text):
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self.gone()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except BrokenPipeError:
            self.gone()

    def gone(self):
        silence(self.stream)
        if self.name == "stdout":
            with contextlib.suppress(OSError, ValueError):
                print("note: stdout was closed by its reader; the run goes on, its log and checkpoints are the record",
                      file=sys.stderr, flush=True)

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self.stream, name)


if __name__ == "__main__":
    sys.exit(not_a_command("common.py", "run train.py, sample.py or prepare_data.py (each with --help), or a tool: "
                                        "python -m tools.NAME --help"))
