"""
How a script ends: the project's expected errors as one line, Ctrl-C as exit 130 (during the imports too),
a signal mid-run as a finished step and a save (GracefulStop), a closed stdout as no error, a torchrun rank's
exit at once. Every signal handler the project sets is set here: `kill` as Ctrl-C (stop_as_ctrl_c), and a
pool's workers leaving both to their parent (held_for_workers, leave_signals_to_parent).

A script imports this module first: its import makes a Ctrl-C during the slow imports after it (torch's take
seconds) end the script with one line and exit 130, as run_main ends one, not with a traceback
(quiet_interrupt). It does so only where the program is one of this repository's scripts (at the root, or a
tool): imported under a test runner or by another program, it leaves Ctrl-C as it was. So nothing here
imports torch.
"""

import contextlib
import os
import re
import select
import signal
import sys
import threading


def one_line(text, limit=200):
    """An exception's text as one plain line: no newlines, no terminal colour codes, at most limit chars
    (torch's unpickling errors span lines and carry ANSI codes)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(text).split()))[:limit]


def say(line):
    """Write `line` to stderr in one write: the ranks of a torchrun run share one stderr, whose Python layer
    passes each write straight to the file (print writes the text and its newline apart), so two ranks'
    lines printed at once would run together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


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
        say("interrupted")
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
        say(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    finally:
        if outlive_stdout:
            sys.stdout, sys.stderr = saved


def quiet_interrupt():
    """Called as a script starts (this module's import, at the end below): a Ctrl-C during the script's
    imports (torch's take seconds) ends it as run_main ends one, one line and exit 130, not a traceback.
    The first SIGINT is noted, not raised, and run_main answers it once the imports are done: a
    KeyboardInterrupt raised inside an import can be lost, or worse (numpy's C import turns it into an
    ImportError of its own; one in an import lock's callback is "ignored" and the imports go on; one inside
    torch's C++ start-up aborts the process with a C++ stack). A second SIGINT raises at once. An
    interactive session (python -i) keeps Python's own handling, and so does a handler someone else set."""
    interactive = sys.flags.interactive or hasattr(sys, "ps1")
    if interactive or getattr(sys.excepthook, "quiet", False):
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        with contextlib.suppress(ValueError):  # not the main thread: no handler can be set
            signal.signal(signal.SIGINT, _note_interrupt)
    hook, unraisable = sys.excepthook, sys.unraisablehook

    def excepthook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt) or _interrupted:  # whatever ends the imports after a Ctrl-C
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                say("interrupted")
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
                say("note: stdout was closed by its reader; the run goes on, its log and checkpoints are the record")

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self.stream, name)


class GracefulStop:
    """SIGINT/SIGTERM set a flag that the training loop checks after each step: it saves and exits 0.
    A second SIGINT raises KeyboardInterrupt at once (exit 130); a checkpoint being written then is
    dropped and the previous one stays. Under DDP the loop all-reduces the flag with the loss, so
    every rank stops at the same step. torchrun itself re-raises a signal sent to it and exits 1
    even when every rank saved and exited 0: to stop a DDP run cleanly, signal the ranks (pkill
    -TERM -P <torchrun pid>), and torchrun exits 0."""

    def __enter__(self):
        self.requested = False
        self.old = {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        first = not self.requested
        self.requested = True
        say(f"\n{signal.Signals(signum).name}: finishing this step, saving, then exiting")
        if first and under_torchrun() and os.environ.get("RANK") == "0":
            say(TORCHRUN_KILLS)

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


def stop_as_ctrl_c():
    """`kill` (SIGTERM) stops the script as Ctrl-C does: a KeyboardInterrupt, which run_main ends
    with "interrupted" and exit 130 (prepare_data.py: its pool ends, the old data stays)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


STOPS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def held_for_workers():
    """Ctrl-C and SIGTERM held (blocked) while a pool's workers fork: one that lands then is swallowed
    by Python's fork hooks. The pool's threads keep them blocked, so they reach the main thread."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def leave_signals_to_parent():
    """A pool's worker process, as it starts: Ctrl-C, which reaches the whole process group, is the
    parent's to answer (it stops the pool, or the queue), and SIGTERM (the pool's terminate()) ends
    the worker quietly. A run trained in the worker still stops with a save: GracefulStop sets its
    own handlers while it trains. Both are unblocked, as a worker forked under held_for_workers
    inherits them blocked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


# torchrun forwards a signal it gets to its ranks and SIGKILLs those still running
# --shutdown_timeout seconds later
TORCHRUN_KILLS = ("torchrun SIGKILLs the ranks --shutdown_timeout seconds after it forwards a "
                  "signal (default 30): a step and save that take longer are lost, the last "
                  "ckpt.pt kept; on slow storage start torchrun with --shutdown_timeout=600 "
                  "(docs/usage.md)")


def under_torchrun():
    """Whether torchrun started this process (torch.distributed.is_torchelastic_launched's test)."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def exit_process(code):
    """Exit with `code`. A torchrun rank leaves at once, its files already written and closed: torch's
    own clean-up at interpreter exit sometimes aborts a finished rank (SIGABRT, about one run in ten
    with gloo), which would turn a run that succeeded into a failed one."""
    if under_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = getattr(sys.modules.get("__main__"), "__file__", None)  # None under python -c or -i

if PROGRAM and os.path.dirname(os.path.abspath(PROGRAM)) in (ROOT, os.path.join(ROOT, "tools")):
    quiet_interrupt()  # a script of this repository imports this module first


if __name__ == "__main__":
    sys.exit(not_a_command("bincode_gpt/exits.py", "run train.py, sample.py or prepare_data.py (each with --help), "
                                                    "or a tool: python -m tools.NAME --help"))
