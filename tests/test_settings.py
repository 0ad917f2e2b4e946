"""bincode_gpt/settings.py: every script's command line is one style, config_parser (issue 16): `python X.py --help`
works for each (a tool: `python -m tools.X --help` from the repository root, or `python tools/X.py --help`), and the
three scripts that came to that style last (prepare_data, compare, scaling) read a command line into the values they
read before it, --quick's and --gpu's included."""

import os
import subprocess
import sys

import pytest

import prepare_data
from conftest import LIBRARIES, SCRIPTS
from tools import compare, scaling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's


def test_every_script_has_help():
    files = [os.path.join(folder, f) for folder in ("", "tools")
             for f in sorted(os.listdir(os.path.join(ROOT, folder)))]
    scripts = [f for f in files
               if f.endswith(".py") and 'if __name__ == "__main__":' in open(os.path.join(ROOT, f)).read()
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


# the values each command line gave before the common style (argparse, DEFAULTS dicts, --quick/--gpu presets)
PREPARE = dict(inputs=["a.txt"], out="o", encoding="gpt2", vocab_size=None, reserve_zero=True, reserve_ones=True,
               val_fraction=0.1, shard_tokens=100_000_000, text_field="text", mix=None, max_tokens=None, seed=0,
               doc_chars=0, workers=None, overwrite=False)


@pytest.mark.parametrize("argv, values", [
    (["a.txt", "--out", "o"], {}),
    (["shakespeare"], dict(inputs=["shakespeare"], out=os.path.join("data", "shakespeare"), vocab_size=512)),
    (["notes/", "more.jsonl", "--out", "data/mine", "--vocab_size", "8e3"],
     dict(inputs=["notes/", "more.jsonl"], out="data/mine", vocab_size=8000)),
    (["--overwrite", "--no-reserve_zero", "--no-reserve_ones", "a.txt", "b.txt", "--out", "o", "--mix", "0.7",
      "--max_tokens", "1e9", "--seed", "3", "--workers", "1", "--shard_tokens", "1e6", "--val_fraction", "0.05",
      "--text_field", "body", "--encoding", "cl100k_base"],
     dict(inputs=["a.txt", "b.txt"], overwrite=True, reserve_zero=False, reserve_ones=False, mix=[0.7],
          max_tokens=10**9, seed=3, workers=1, shard_tokens=10**6, val_fraction=0.05, text_field="body",
          encoding="cl100k_base")),
])
def test_prepare_data_reads_its_command_lines_as_before(argv, values):
    assert vars(prepare_data.parse_config(argv)) == {**PREPARE, **values}


COMPARE = dict(corpus=["shakespeare"], data=None, encoding="gpt2", vocab_size=8192, reserve_zero=True,
               reserve_ones=True, out="runs/compare", variants="learned,binary,affine", quick=False, preset="small",
               n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16, steps=600, lr=2e-3, seeds=3, evals=10,
               eval_batches=8, device="auto", compile=False, code_width=0)


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


SCALING = dict(corpus=["shakespeare"], data=None, encoding="gpt2", vocab_size=8192, reserve_zero=True,
               reserve_ones=True, out="runs/scaling", quick=False, gpu=False, sizes="2x48,3x80,4x128,6x192",
               affine_sizes="2x48,4x128", ablation="4x128", long_factor=3, long_seeds=1, steps=400, seeds=2, evals=8,
               n_head=4, block_size=128, batch_size=16, lr=2e-3, eval_batches=8, jobs=1, device="auto",
               compile=False, contrast=None)
QUICK = dict(quick=True, out="runs/scaling-quick", sizes="1x16,1x32,2x48,2x64", affine_sizes="1x16,2x48",
             ablation="2x64", long_factor=3, long_seeds=2, steps=30, evals=3, block_size=64, batch_size=8,
             eval_batches=4)
GPU = dict(gpu=True, out="runs/scaling-gpu", sizes="12x768", affine_sizes="", ablation="none", long_factor=1,
           steps=1500, seeds=2, evals=10, n_head=12, block_size=1024, batch_size=32, lr=1e-3, eval_batches=20)


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
    assert ("--affine_sizes AFFINE_SIZES sizes that also train the affine input "
            "(default 2x48,4x128; --quick: 1x16,2x48; --gpu: '')") in text
