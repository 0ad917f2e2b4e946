"""bincode_gpt/exits.py, how a script ends: a library run as a script says what to run instead; a Ctrl-C during
the slow imports is one line and exit 130; an error line is one write."""

import io
import os
import signal
import subprocess
import sys

import pytest

from bincode_gpt import exits
from conftest import LIBRARIES, SCRIPTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's


def test_a_library_run_as_a_script_says_what_to_run_instead():
    """Issue 35: `python quantize.py --ckpt X --data_dir D` (its old quality command) once exited 0 having done
    nothing."""
    runs = {f: subprocess.Popen([sys.executable, "-m", f[:-3].replace("/", "."), "--ckpt", "X", "--data_dir", "D D"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for f in LIBRARIES}
    for f, p in runs.items():
        out, err = p.communicate(timeout=120)
        assert (p.returncode, out, err.count("\n")) == (2, "", 1), f
        assert err.startswith(f"{f} is a library, not a command: ") and LIBRARIES[f] in err, err


def as_in_a_terminal():
    """A child's Ctrl-C as in a terminal: a shell's background job (a CI runner's `cmd &`) inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


FAST = {"tools/gpu_check.py", "tools/lines.py"}  # import neither torch nor numpy: no slow import to interrupt
PLAIN = {"model.py"}  # standalone: torch and the standard library only, so Python's own Ctrl-C (a traceback)


# stand-ins for torch and numpy that each get a Ctrl-C (SIGINT) as they are imported, and meet the second as such
# an import can:
STAND_INS = {
    "raised": "raise KeyboardInterrupt\n",
    # a KeyboardInterrupt turned into an ImportError of the module's own, as numpy's C import does (PyCapsule_Import)
    "swallowed": "import os, signal\ntry:\n    os.kill(os.getpid(), signal.SIGINT)\n    [i for i in range(10**6)]\n"
                 "except KeyboardInterrupt:\n"
                 "    raise ImportError(\"PyCapsule_Import could not import module 'datetime'\")\n",
    # one raised in a callback (an import lock's, in the wild): Python says it ignored it, and the imports go on
    "ignored": "import os, signal, weakref\nclass A:\n    pass\na = A()\n"
               "r = weakref.ref(a, lambda _: [os.kill(os.getpid(), signal.SIGINT)] + [i for i in range(10**6)])\n"
               "del a\n",
}


@pytest.mark.parametrize("stand_in", STAND_INS)
def test_ctrl_c_during_the_imports_is_one_line_and_exit_130(tmp_path, stand_in):
    """Ctrl-C twice in the slow imports (two stand-ins), whatever an import does with it: one line, exit 130."""
    for name in ("torch", "numpy"):
        (tmp_path / f"{name}.py").write_text(STAND_INS[stand_in])
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    commands = [[s] for s in SCRIPTS if s not in FAST | PLAIN] + [["-m", "tools.convert"]]
    runs = {" ".join(c): subprocess.Popen([sys.executable, *c, "--help"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal)
            for c in commands}
    for c, p in runs.items():
        out, err = p.communicate(timeout=120)
        assert (p.returncode, out, err) == (130, "", "interrupted\n"), c


def test_one_ctrl_c_during_the_imports_is_answered_when_they_end(tmp_path):
    """The first Ctrl-C is noted, not raised inside the import it lands in (torch's C++ start-up aborts on one, numpy's
    loses it): the import ends (the stand-in numpy imports the real one, then leaves a mark), and run_main answers."""
    (tmp_path / "numpy.py").write_text("import os, signal, sys\nos.kill(os.getpid(), signal.SIGINT)\n"
                                       "del sys.modules['numpy']\nsys.path.remove(os.path.dirname(__file__))\n"
                                       "import numpy\nopen(__file__ + '.done', 'w').close()\n")
    r = subprocess.run([sys.executable, "prepare_data.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120, preexec_fn=as_in_a_terminal)
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "interrupted\n") and (tmp_path / "numpy.py.done").exists()


class Recorder(io.RawIOBase):
    """A file that keeps each write it is given, as the operating system would get them."""

    def __init__(self):
        self.writes = []

    def writable(self):
        return True

    def write(self, data):
        self.writes.append(bytes(data))
        return len(data)


@pytest.mark.parametrize("outlive_stdout", [False, True])
def test_an_error_line_is_one_write_so_two_ranks_lines_never_run_together(monkeypatch, outlive_stdout):
    """Python's stderr passes each write straight to the file, and print writes a line's text and its newline apart:
    two torchrun ranks failing at once printed `error: X` `error: X` `\n` `\n` (a CI run saw it). run_main's line is one
    write, as long as the pipe's atomic limit (4 KiB), whatever stream train.py's run puts in front (outlive_stdout)."""
    recorder = Recorder()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(recorder, write_through=True))

    def main(argv):
        raise ValueError("lr must be a finite number >= 0, got -1.0")

    assert exits.run_main(main, [], outlive_stdout=outlive_stdout) == 1
    assert recorder.writes == [b"error: lr must be a finite number >= 0, got -1.0\n"]


SIGNALS_CHILD = """import os, signal, sys, time
from bincode_gpt import exits
def main(argv):
    with exits.held_for_workers():  # a pool's fork: both blocked, then as they were
        assert exits.STOPS <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
        signal.pthread_sigmask(signal.SIG_BLOCK, exits.STOPS)  # a worker forked now inherits them blocked
        exits.leave_signals_to_parent()
        assert not exits.STOPS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert not exits.STOPS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (signal.SIG_IGN, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C is the parent's to answer
    exits.stop_as_ctrl_c()
    print("SIGINT left to the parent", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # `kill` as Ctrl-C: KeyboardInterrupt, run_main's exit 130
    time.sleep(30)
sys.exit(exits.run_main(main))
"""


def test_a_pool_worker_leaves_signals_to_its_parent_and_kill_stops_a_script_as_ctrl_c():
    """exits.py holds every signal handler the project sets: a pool's fork holds Ctrl-C and SIGTERM (workers.py), a
    worker ignores Ctrl-C and unblocks both (workers.py, tools/scaling.py), `kill` as Ctrl-C (prepare_data.py)."""
    r = subprocess.run([sys.executable, "-c", SIGNALS_CHILD], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (130, "SIGINT left to the parent\n", "interrupted\n")
