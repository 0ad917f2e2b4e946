"""Fixtures shared by the test files that train small models. This file sits at the root so that pytest puts
the root on the import path of every test, tests/ included (`import model` works there as here)."""

import os
from pathlib import Path

import pytest
import torch

from prepare_data import prepare

SHAKESPEARE = Path(__file__).resolve().parent.parent / "shared" / "data" / "tinyshakespeare.txt"


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
