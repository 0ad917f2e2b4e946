"""tools/paper_point.py: the statistics (t interval, verdicts, line fit) and the per-source validation."""

import math

import numpy as np
import pytest
import torch

import prepare_data
from bincode_gpt.checkpoint import atomic_torch_save, checkpoint_dict
from bincode_gpt.shards import load_meta
from model import GPT, get_config
from tools import compare, paper_point as pp


@pytest.mark.parametrize("df, want", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423)])
def test_t_quantile_matches_the_tables(df, want):
    assert pp.t_quantile(0.975, df) == pytest.approx(want, abs=2e-4)


def test_interval_is_the_t_interval_of_the_mean():
    ci = pp.interval([0.1, 0.2, 0.3])
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert (ci["n"], ci["mean"], ci["sd"]) == (3, pytest.approx(0.2), pytest.approx(0.1))
    assert (ci["lo"], ci["hi"]) == (pytest.approx(0.2 - half, abs=1e-5), pytest.approx(0.2 + half, abs=1e-5))
    assert pp.interval([0.3]) is None  # one seed: no interval, and no verdict from it
    assert pp.verdicts(None)["sign"].startswith("no interval")


@pytest.mark.parametrize("lo, hi, sign, paper", [
    (0.01, 0.03, "worse (CI above 0)", "inside ±4.8%"),
    (-0.03, -0.01, "better (CI below 0)", "inside ±4.8%"),
    (-0.01, 0.03, "CI includes 0", "inside ±4.8%"),
    (0.02, 0.08, "worse (CI above 0)", "straddles ±4.8%"),
    (0.06, 0.09, "worse (CI above 0)", "outside ±4.8%"),
    (-0.2, -0.06, "better (CI below 0)", "outside ±4.8%")])
def test_verdicts_come_from_the_interval(lo, hi, sign, paper):
    assert pp.verdicts({"lo": lo, "hi": hi}) == {"sign": sign, "paper": paper}


def test_line_fit_and_its_interval():
    b, at, lo, hi = pp.line_fit([0, 0, 1, 1], [0.9, 1.1, 2.9, 3.1], at=2.0)
    half = 4.302653 * math.sqrt(0.04 / 2) * math.sqrt(1 / 4 + 1.5 ** 2 / 1)
    assert (b, at) == (pytest.approx(2.0), pytest.approx(5.0))
    assert (lo, hi) == (pytest.approx(5 - half, abs=1e-4), pytest.approx(5 + half, abs=1e-4))
    assert pp.line_fit([1, 1, 1], [0.1, 0.2, 0.3], at=2.0) is None  # one size: no line


def words(n, seed):
    rng = np.random.default_rng(seed)
    return "".join(" ".join(rng.choice(["the", "king", "hill", "42", "naïve"], 8)) + "\n" for _ in range(n))


def test_per_source_windows_add_up_to_the_split_and_one_source_gives_the_whole_split_loss(tmp_path):
    """Three sources: each source's val documents, recomputed, add up to the prepared split (bytes, tokens);
    one source: its windows are the split's, so its loss is compare.full_val_loss's."""
    books = []
    for i, name in enumerate(("a", "b", "c")):
        books.append(tmp_path / f"{name}.txt")
        books[-1].write_text(words(400 * (i + 1), seed=i))
    args = pp.parse_config(["--quick", "--corpus", *map(str, books), "--out", str(tmp_path / "runs"), "--doc_chars", "1000"])
    data, meta = pp.data_of(args)
    windows = pp.source_windows(meta)  # raises when they do not add up
    assert set(windows) == {"a", "b", "c"} and all(w["documents"] >= 1 for w in windows.values())
    assert sum(w["all_bytes"] for w in windows.values()) == sum(len(b.read_bytes()) for b in books)

    one = tmp_path / "one"
    prepare_data.prepare([str(books[2])], one, vocab_size=257, doc_chars=2000, workers=1, progress=False)
    torch.manual_seed(0)
    model = GPT(get_config("tiny", vocab_size=257, block_size=16))
    (tmp_path / "run").mkdir()
    atomic_torch_save(checkpoint_dict(model, {"encoding": "gpt2"}), tmp_path / "run" / "ckpt.pt")
    mine = pp.source_losses(str(tmp_path / "run"), pp.source_windows(load_meta(one)), batch_size=8)
    whole = compare.full_val_loss(str(tmp_path / "run"), str(one), load_meta(one), 8, torch.device("cpu"))
    assert mine["c"][0] == pytest.approx(whole, abs=1e-6)
