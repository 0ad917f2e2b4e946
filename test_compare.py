"""Smoke test of compare.py: a tiny comparison end to end, its table, its verdict and its plot."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import compare

ROOT = Path(__file__).resolve().parent
COLUMNS = ["input", "seeds", "trainable params", "input-interface params", "frozen stored values", "val loss",
           "perplexity", "bits/byte", "tokens/s"]


@pytest.fixture
def data(tiny_data):
    return tiny_data


def run(data, out, variants="learned,binary", seeds=1):
    return compare.main(["--data", data, "--out", str(out), "--variants", variants,
                         "--preset", "tiny", "--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "32",
                         "--batch_size", "4", "--steps", "4", "--evals", "2", "--eval_batches", "2",
                         "--seeds", str(seeds), "--device", "cpu"])


def test_tiny_comparison(data, tmp_path, capsys):
    rows = run(data, tmp_path)
    assert [r["input"] for r in rows] == ["learned", "binary"]
    learned, binary = rows
    assert binary["trainable"] + 512 * 32 == learned["trainable"]  # the table: V x n_embd
    assert (learned["input_params"], binary["input_params"]) == (512 * 32, 0)
    assert (learned["frozen"], binary["frozen"]) == (0, 512 * 9)  # K = 9 bits for V = 512
    for r in rows:
        loss, ppl, bpb = r["val_loss"][0], r["perplexity"][0], r["bits_per_byte"][0]
        assert r["seeds"] == 1 and 0 < loss < math.log(512) + 1
        assert ppl == pytest.approx(math.exp(loss)) and bpb > 0
        assert r["val_loss"][1] == 0.0 and r["tokens_per_s"][0] > 0

    report = (tmp_path / "results.md").read_text()
    header, divider, *lines = [l for l in report.splitlines() if l.startswith("|")]
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    assert len(lines) == 2 and all(l.count("|") == len(COLUMNS) + 1 for l in lines)
    assert "no verdict: a seed-to-seed spread needs at least two seeds" in report
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["input"] == "learned"
    if _has_matplotlib():
        assert (tmp_path / "val_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| binary | 1 |" in capsys.readouterr().out


def test_finished_runs_are_kept_and_a_verdict_needs_two_seeds(data, tmp_path):
    first = run(data, tmp_path, seeds=2)
    mtime = os.path.getmtime(tmp_path / "binary-seed0" / "final.json")
    again = run(data, tmp_path, seeds=2)  # nothing retrained: same numbers, files untouched
    assert again == first and os.path.getmtime(tmp_path / "binary-seed0" / "final.json") == mtime
    report = (tmp_path / "results.md").read_text()
    assert "binary vs learned: mean perplexity" in report
    assert ("INSIDE" in report) != ("OUTSIDE" in report)


def test_unknown_variant_is_refused(data, tmp_path):
    with pytest.raises(ValueError, match="unknown input"):
        run(data, tmp_path, variants="binary,onehot")


@pytest.mark.parametrize("args, message", [
    (["--seeds", "0"], "error: --seeds must be at least 1, got 0"),
    (["--corpus", "no/such/corpus.txt"], "no/such/corpus.txt"),
])
def test_bad_command_lines_end_in_one_error_line(tmp_path, args, message):
    done = subprocess.run([sys.executable, "compare.py", "--out", str(tmp_path / "out"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_diverged_run_is_reported_and_not_retried(data, tmp_path):
    args = ["--data", data, "--out", str(tmp_path), "--variants", "learned,binary", "--preset", "tiny",
            "--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "4",
            "--steps", "6", "--evals", "2", "--eval_batches", "2", "--seeds", "1", "--device", "cpu", "--lr", "1e6"]
    compare.main(args)
    record = json.loads((tmp_path / "binary-seed0" / "final.json").read_text())
    assert set(record) == {"diverged"} and "at step" in record["diverged"]
    mtime = os.path.getmtime(tmp_path / "binary-seed0" / "final.json")
    compare.main(args)  # read back, not trained again
    assert os.path.getmtime(tmp_path / "binary-seed0" / "final.json") == mtime
    report = (tmp_path / "results.md").read_text()
    assert "diverged, left out: binary seed 0: " in report
