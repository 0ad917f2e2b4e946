"""Fixtures shared by several test files: data to train small models on, a prepared folder to replace or
interrupt (and the helpers `words` and `snapshot` that make and compare one), a tiny model over GPT-2's
vocabulary, GPT-2's tokenizer. This file sits at the root so that pytest puts the root on the import path of
every test, tests/ included (`import model` works there as here)."""

import os
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

from bincode_gpt.checkpoint import checkpoint_dict
from bincode_gpt.files import LOCK_NAME
from bincode_gpt.tokenizer import get_tokenizer
from model import GPT, get_config
from prepare_data import prepare

SHAKESPEARE = Path(__file__).resolve().parent.parent / "shared" / "data" / "tinyshakespeare.txt"

# the repository's scripts (a `__main__` guard), and the libraries whose guard says what to run instead
SCRIPTS = ["model.py", "prepare_data.py", "sample.py", "train.py", "tools/bench.py", "tools/code_figure.py",
           "tools/compare.py", "tools/convert.py", "tools/gpu_check.py", "tools/lines.py", "tools/paper_point.py",
           "tools/quantize_quality.py", "tools/quickstart.py", "tools/scaling.py", "tools/share.py"]
LIBRARIES = {"bincode_gpt/checkpoint.py": "python sample.py --ckpt FILE",
             "bincode_gpt/exits.py": "python -m tools.NAME --help",
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


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Token shards of 200k characters at vocab 512, prepared once per test file: tiny Shakespeare where it lies
    offline beside the checkout, else English-like words."""
    tmp = tmp_path_factory.mktemp("data")
    if SHAKESPEARE.is_file():
        text = SHAKESPEARE.read_text(encoding="utf-8")[:200_000]
    else:  # a fresh clone without ../shared: any English-like text will do
        rng = np.random.default_rng(0)
        words = "the king shall speak of love and death to thee my lord what is this night".split()
        text = "\n".join(" ".join(rng.choice(words, 12)) for _ in range(8000))
    (tmp / "corpus.txt").write_text(text, encoding="utf-8")
    prepare([str(tmp / "corpus.txt")], str(tmp / "prepared"), vocab_size=512, workers=1, progress=False)
    return tmp / "prepared"


def words(n, seed=0, vocab=("the", "king", "queen", "café", "naïve", "over", "hill", "42", "—", "a")):
    """Generated text for tests where the real corpus isn't essential."""
    rng = np.random.default_rng(seed)
    lines = (" ".join(rng.choice(vocab, 8)) + rng.choice([".", ",", "", "  "]) for _ in range(n))
    return "\n".join(lines) + "\n"


def snapshot(folder):
    """{name: bytes} of a folder's files, but the writer lock's, which holds the pid of the last writer."""
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.name != LOCK_NAME}


@pytest.fixture
def prepared(tmp_path):
    """A folder holding prepared data (several shards), and its bytes."""
    (tmp_path / "old.txt").write_text(words(400))
    prepare([str(tmp_path / "old.txt")], tmp_path / "out", shard_tokens=1000, workers=1, progress=False)
    return tmp_path / "out", snapshot(tmp_path / "out")


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A tiny binary-code model over GPT-2's full tiktoken vocabulary (padded to 50,304), its checkpoint's folder
    and the encoding."""
    torch.manual_seed(0)
    model = GPT(get_config("tiny", vocab_size=50304)).eval()
    folder = tmp_path_factory.mktemp("native")
    codec = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": None}
    torch.save(checkpoint_dict(model, codec), folder / "ckpt.pt")
    return model, str(folder), tiktoken.get_encoding("gpt2")


@pytest.fixture(scope="module")
def gpt2():
    return get_tokenizer("gpt2")


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
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
    torch.set_num_threads(max(1, torch.get_num_threads() // workers))
