"""Fixtures shared by the test files that train small models. This file sits at the root so that pytest puts
the root on the import path of every test, tests/ included (`import model` works there as here)."""

import os
from pathlib import Path

import pytest
import torch

from prepare_data import prepare

SHAKESPEARE = Path(__file__).resolve().parent.parent / "shared" / "data" / "tinyshakespeare.txt"

# the repository's scripts (a `__main__` guard), and the libraries whose guard says what to run instead
SCRIPTS = ["model.py", "prepare_data.py", "sample.py", "train.py", "tools/bench.py", "tools/code_figure.py",
           "tools/compare.py", "tools/convert.py", "tools/gpu_check.py", "tools/lines.py", "tools/paper_point.py",
           "tools/quantize_quality.py", "tools/quickstart.py", "tools/scaling.py", "tools/share.py"]
LIBRARIES = {"bincode_gpt/checkpoint.py": "python sample.py --ckpt FILE", "bincode_gpt/exits.py": "python -m tools.NAME --help",
             "bincode_gpt/quantize.py": "python -m tools.quantize_quality --ckpt X --data_dir 'D D'",
             "bincode_gpt/tokenizer.py": "python prepare_data.py --help"}


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Token shards of ~20k characters of English at vocab 512 (K = 9), prepared once per session:
    tiny Shakespeare where it lies offline beside the checkout, else generated sentences."""
    folder = tmp_path_factory.mktemp("tiny_corpus")
    text = folder / "text.txt"
    if SHAKESPEARE.is_file():
        text.write_text(SHAKESPEARE.read_text()[:20_000])
    else:
        lines = (f"line {i}: the quick brown fox {i % 7} jumps over {i % 11} dogs" for i in range(500))
        text.write_text("\n".join(lines))
    prepare([str(text)], str(folder / "data"), vocab_size=512, workers=1, progress=False)
    return str(folder / "data")


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Each test compiles from scratch: torch.compile allows a function 8 compiles a process (its recompile
    limit), and the suite compiles GPT.forward for more models and cache sizes than that; one sample.py run
    compiles it once per size class."""
    yield
    torch._dynamo.reset()


def pytest_configure(config):
    """Under pytest-xdist (the -n of pytest.ini) each worker takes its share of the cores: N workers each running
    torch on every core would fight over them."""
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))))
