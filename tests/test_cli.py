"""Every script's command line is one style, bincode_gpt.settings.config_parser (issue 16): `python X.py --help` works
for each (a tool: `python -m tools.X --help` from the repository root, or `python tools/X.py --help`), and the three scripts that came to
that style last (prepare_data, compare, scaling) read a command line into the values they read before it,
--quick's and --gpu's included."""

import io
import os
import signal
import subprocess
import sys

import pytest

import prepare_data
from bincode_gpt import exits
from tools import compare, scaling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's
SCRIPTS = ["model.py", "prepare_data.py", "sample.py", "train.py", "tools/bench.py", "tools/code_figure.py",
           "tools/compare.py", "tools/convert.py", "tools/gpu_check.py", "tools/lines.py", "tools/paper_point.py",
           "tools/quantize_quality.py", "tools/quickstart.py", "tools/scaling.py", "tools/share.py"]
LIBRARIES = {"bincode_gpt/checkpoint.py": "python sample.py --ckpt FILE", "bincode_gpt/exits.py": "python -m tools.NAME --help",
             "bincode_gpt/quantize.py": "python -m tools.quantize_quality --ckpt X --data_dir 'D D'",
             "bincode_gpt/tokenizer.py": "python prepare_data.py --help"}


def test_every_script_has_help():
    files = [os.path.join(folder, f) for folder in ("", "tools") for f in sorted(os.listdir(os.path.join(ROOT, folder)))]
    scripts = [f for f in files if f.endswith(".py") and 'if __name__ == "__main__":' in open(os.path.join(ROOT, f)).read()
               and f not in LIBRARIES]
    assert scripts == SCRIPTS
    # a tool runs as `python -m tools.X` (as documented) and as `python tools/X.py`
    commands = [[s] for s in scripts] + [["-m", s[:-3].replace(os.sep, ".")] for s in scripts if os.sep in s]
    runs = {" ".join(c): subprocess.Popen([sys.executable, *c, "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True) for c in commands}
    for c, p in runs.items():
        out, err = p.communicate(timeout=120)
        assert (p.returncode, err) == (0, ""), c
        name = os.path.basename(c.split()[-1]).replace("tools.", "") + (".py" if c.startswith("-m") else "")
        usage = (f"usage: {name} [-h]", f"usage: python {c} [-h]")  # -m: Python 3.14 names the module
        assert out.startswith(usage) and "show this help message and exit" in out, c


def test_a_library_run_as_a_script_says_what_to_run_instead():
    """Issue 35: `python quantize.py --ckpt X --data_dir D` (its old quality command) once exited 0 having done nothing."""
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
                 "except KeyboardInterrupt:\n    raise ImportError(\"PyCapsule_Import could not import module 'datetime'\")\n",
    # one raised in a callback (an import lock's, in the wild): Python says it ignored it, and the imports go on
    "ignored": "import os, signal, weakref\nclass A:\n    pass\na = A()\n"
               "r = weakref.ref(a, lambda _: [os.kill(os.getpid(), signal.SIGINT)] + [i for i in range(10**6)])\ndel a\n",
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


# the values each command line gave before the common style (argparse, DEFAULTS dicts, --quick/--gpu presets)
PREPARE = dict(inputs=["a.txt"], out="o", encoding="gpt2", vocab_size=None, reserve_zero=True, reserve_ones=True, val_fraction=0.1,
               shard_tokens=100_000_000, text_field="text", mix=None, max_tokens=None, seed=0, doc_chars=0, workers=None,
               overwrite=False)


@pytest.mark.parametrize("argv, values", [
    (["a.txt", "--out", "o"], {}),
    (["shakespeare"], dict(inputs=["shakespeare"], out=os.path.join("data", "shakespeare"), vocab_size=512)),
    (["notes/", "more.jsonl", "--out", "data/mine", "--vocab_size", "8e3"],
     dict(inputs=["notes/", "more.jsonl"], out="data/mine", vocab_size=8000)),
    (["--overwrite", "--no-reserve_zero", "--no-reserve_ones", "a.txt", "b.txt", "--out", "o", "--mix", "0.7", "--max_tokens", "1e9",
      "--seed", "3", "--workers", "1", "--shard_tokens", "1e6", "--val_fraction", "0.05", "--text_field", "body",
      "--encoding", "cl100k_base"],
     dict(inputs=["a.txt", "b.txt"], overwrite=True, reserve_zero=False, reserve_ones=False, mix=[0.7], max_tokens=10**9, seed=3, workers=1,
          shard_tokens=10**6, val_fraction=0.05, text_field="body", encoding="cl100k_base")),
])
def test_prepare_data_reads_its_command_lines_as_before(argv, values):
    assert vars(prepare_data.parse_config(argv)) == {**PREPARE, **values}


COMPARE = dict(corpus=["shakespeare"], data=None, encoding="gpt2", vocab_size=8192, reserve_zero=True, reserve_ones=True, out="runs/compare",
               variants="learned,binary,affine", quick=False, preset="small", n_layer=4, n_head=4, n_embd=128,
               block_size=128, batch_size=16, steps=600, lr=2e-3, seeds=3, evals=10, eval_batches=8, device="auto",
               compile=False, code_width=0)


@pytest.mark.parametrize("argv, values", [
    ([], {}),
    (["--quick"], dict(quick=True, steps=60, seeds=2, evals=3)),
    (["--quick", "--steps", "100", "--corpus", "a.txt", "b/", "--no-reserve_zero", "--compile", "--out", "o"],
     dict(quick=True, steps=100, seeds=2, evals=3, corpus=["a.txt", "b/"], reserve_zero=False, compile=True, out="o")),
    (["--preset", "tiny", "--n_embd", "768", "--steps", "5000", "--device", "cuda", "--data", "d", "--lr", "1e-3"],
     dict(preset="tiny", n_embd=768, steps=5000, device="cuda", data="d", lr=1e-3)),
])
def test_compare_reads_its_command_lines_as_before(argv, values):
    assert vars(compare.parse_config(argv)) == {**COMPARE, **values}


SCALING = dict(corpus=["shakespeare"], data=None, encoding="gpt2", vocab_size=8192, reserve_zero=True, reserve_ones=True, out="runs/scaling",
               quick=False, gpu=False, sizes="2x48,3x80,4x128,6x192", affine_sizes="2x48,4x128", ablation="4x128",
               long_factor=3, long_seeds=1, steps=400, seeds=2, evals=8, n_head=4, block_size=128, batch_size=16, lr=2e-3,
               eval_batches=8, jobs=1, device="auto", compile=False, contrast=None)
QUICK = dict(quick=True, out="runs/scaling-quick", sizes="1x16,1x32,2x48,2x64", affine_sizes="1x16,2x48", ablation="2x64",
             long_factor=3, long_seeds=2, steps=30, evals=3, block_size=64, batch_size=8, eval_batches=4)
GPU = dict(gpu=True, out="runs/scaling-gpu", sizes="12x768", affine_sizes="", ablation="none", long_factor=1, steps=1500,
           seeds=2, evals=10, n_head=12, block_size=1024, batch_size=32, lr=1e-3, eval_batches=20)


@pytest.mark.parametrize("argv, values", [
    ([], {}),
    (["--quick"], QUICK),
    (["--gpu"], GPU),
    (["--gpu", "--affine_sizes", "2x48", "--out", "o", "--jobs", "2", "--no-reserve_zero", "--data", "data/fineweb"],
     {**GPU, "affine_sizes": "2x48", "out": "o", "jobs": 2, "reserve_zero": False, "data": "data/fineweb"}),
    (["--quick", "--ablation", "none", "--long_factor", "1", "--seeds", "3"],
     {**QUICK, "ablation": "none", "long_factor": 1, "seeds": 3}),
])
def test_scaling_reads_its_command_lines_as_before(argv, values):
    assert vars(scaling.parse_config(argv)) == {**SCALING, **values}


def test_help_names_each_preset_value(capsys):
    with pytest.raises(SystemExit) as e:
        scaling.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0
    assert "--steps STEPS training steps of each run (default 400; --quick: 30; --gpu: 1500)" in text
    assert "--affine_sizes AFFINE_SIZES sizes that also train the affine input (default 2x48,4x128; --quick: 1x16,2x48; --gpu: '')" in text
