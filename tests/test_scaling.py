"""scaling.py: the sweep end to end on tiny sizes (runs, resume, table, plot), and the trend fit on
synthetic numbers with a known answer."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools import scaling

V = 512


@pytest.fixture
def data(tiny_data):
    return tiny_data


def sweep(data, out, sizes="1x16,1x32"):
    return scaling.main(["--data", data, "--out", str(out), "--sizes", sizes, "--affine_sizes", "1x16",
                         "--ablation", "1x32", "--long_factor", "2", "--long_seeds", "2", "--steps", "3",
                         "--evals", "1", "--seeds", "2", "--n_head", "2", "--block_size", "16", "--batch_size", "2",
                         "--eval_batches", "1", "--device", "cpu"])


def test_sweep_end_to_end_and_resume(data, tmp_path):
    rows, result = sweep(data, tmp_path, sizes="1x16")  # a first, partial sweep: one size
    first = os.path.getmtime(tmp_path / "1x16" / "binary-seed1" / "final.json")
    rows, result = sweep(data, tmp_path)  # the whole sweep reuses the finished runs
    assert os.path.getmtime(tmp_path / "1x16" / "binary-seed1" / "final.json") == first

    # every point: the size axis (learned, binary), affine at 1x16, the ablation, the long run
    ablation = scaling.ablation_depth(1, 32, SimpleNamespace(n_head=2, block_size=16), V)
    assert ablation == 2  # learned 1x32 adds 512 x 32 = 16,384; a 32-wide layer has 12,352: 1 layer short, 2 closest
    points = {(r["point"], r["input"]): r for r in rows}
    assert set(points) == {("1x16", "learned"), ("1x16", "binary"), ("1x16", "affine"), ("1x32", "learned"),
                           ("1x32", "binary"), ("2x32", "binary"), ("1x16-long", "learned"), ("1x16-long", "binary")}
    for d in (16, 32):
        assert points[f"1x{d}", "learned"]["trainable"] - points[f"1x{d}", "binary"]["trainable"] == V * d
    assert all(r["seeds"] == 2 for r in rows)
    assert points["1x16", "learned"]["gap_nats"] is None
    assert (tmp_path / "1x16-long" / "binary-seed0" / "ckpt.pt").exists()

    # the gap is binary - learned of the same seed, read from the runs' final.json
    loss = lambda p, v, s: json.loads((tmp_path / p / f"{v}-seed{s}" / "final.json").read_text())["val_loss"]  # noqa: E731
    gaps = [loss("1x32", "binary", s) - loss("1x32", "learned", s) for s in (0, 1)]
    assert points["1x32", "binary"]["gap_nats"][0] == pytest.approx(sum(gaps) / 2)
    assert [p["gaps"] for p in result["axis"]][1] == pytest.approx(gaps)
    assert result["ablation"]["binary"] == "2x32" and result["ablation"]["learned"] == "1x32"
    deeper_gaps = [loss("2x32", "binary", s) - loss("1x32", "learned", s) for s in (0, 1)]
    assert result["ablation"]["gaps"] == pytest.approx(deeper_gaps)
    long = result["long"]["curve"]  # evaluated at steps 0, 3, 6: tokens = step x 2 x 16
    assert [p[0] for p in long] == [0, 96, 192] and result["long"]["short"][-1][0] == 96

    report = (tmp_path / "results.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| size"))
    assert len(header.strip("|").split("|")) == 10 and report.count("\n| 1x16 |") == 3
    assert "Seed spread:" in report and ("Fit (mean gap per size)" in report or "Fit: none" in report)
    assert json.loads((tmp_path / "results.json").read_text())["analysis"]["seed_spread"] == result["seed_spread"]
    if _has_matplotlib():
        assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a rerun into the same --out with other settings is refused before any training, naming the difference
    before = files(tmp_path)
    r = cli("--data", data, "--out", tmp_path, "--sizes", "1x16,1x32", "--affine_sizes", "1x16", "--ablation", "1x32",
            "--long_factor", "2", "--long_seeds", "2", "--steps", "5", "--evals", "1", "--seeds", "2", "--n_head", "2",
            "--block_size", "16", "--batch_size", "2", "--eval_batches", "1", "--device", "cpu")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"error: {tmp_path / '1x16' / 'learned-seed0'} was trained with max_steps=3, "
                        "eval_interval=3, but this command asks for max_steps=5, eval_interval=5: its results would "
                        "be reported under settings it never used; use another --out (or remove that folder to train "
                        "it again)\n")
    assert files(tmp_path) == before


def test_power_law_fit_recovers_a_known_trend():
    sizes = [1e5, 4e5, 1.6e6, 6.4e6]
    exact = [(n, [2.0 * n ** -0.3]) for n in sizes]
    t = scaling.trend(exact, threshold=0.01)
    assert t["c"] == pytest.approx(2.0) and t["alpha"] == pytest.approx(0.3)
    assert t["crossing"] == pytest.approx((2.0 / 0.01) ** (1 / 0.3))  # 2 N^-0.3 = 0.01
    assert t["alpha_range"] == pytest.approx((0.3, 0.3))  # one seed: every resample is the data itself
    assert t["r2"] == pytest.approx(1.0)  # the data lie on the law

    noisy = [(n, [g[0] * 0.8, g[0] * 1.2]) for n, g in exact]  # seeds around the law, mean on it
    t = scaling.trend(noisy, threshold=0.01)
    assert t["alpha"] == pytest.approx(0.3) and t["alpha_range"][0] < 0.3 < t["alpha_range"][1]
    assert t["crossing_range"][0] < t["crossing"] < t["crossing_range"][1]


def test_fit_refuses_what_a_power_law_cannot_describe():
    assert scaling.trend([(1e5, [0.1]), (1e6, [-0.01])], threshold=0.01) is None  # a negative mean gap
    assert scaling.trend([(1e5, [0.1]), (1e5, [0.2])], threshold=0.01) is None  # one size only
    assert scaling.crossing(1.0, -0.1, 0.01) == math.inf  # a growing gap never reaches the spread


def test_bad_arguments_are_one_line_errors(data, tmp_path):
    with pytest.raises(ValueError, match="sizes must look like 2x48"):
        sweep(data, tmp_path, sizes="two by 48")
    with pytest.raises(ValueError, match=r"^--sizes must look like 2x48,4x128 \(n_layer x n_embd, positive integers\), "
                                         r"got '0x48,2x64'$"):
        sweep(data, tmp_path, sizes="0x48,2x64")
    with pytest.raises(ValueError, match=r"^--affine_sizes must look like 2x48,4x128 \(n_layer x n_embd, "
                                         r"positive integers\), got '2x'$"):
        scaling.main(["--affine_sizes", "2x", "--data", data, "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--quick and --gpu"):
        scaling.main(["--quick", "--gpu", "--data", data, "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--seeds must be at least 1"):
        scaling.main(["--seeds", "0", "--data", data, "--out", str(tmp_path)])


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tools.scaling", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob("*")
            if p.is_file() and p.name != ".writer.lock"}


@pytest.mark.parametrize("flag, value, message", [
    ("--sizes", "", "--sizes must look like 2x48,4x128 (n_layer x n_embd, positive integers), got ''"),
    ("--sizes", "2x48x3", "--sizes must look like 2x48,4x128 (n_layer x n_embd, positive integers), got '2x48x3'"),
    ("--ablation", "2x48,4x128", "--ablation takes one size (e.g. 4x128) or none, got '2x48,4x128'"),
    ("--out", "", "the output folder is '' (empty): name a folder"),
])
def test_malformed_values_are_one_error_line(data, tmp_path, flag, value, message):
    args = {"--out": str(tmp_path / "out"), flag: value}
    r = cli("--data", data, "--steps", "1", *[x for kv in args.items() for x in kv])
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: {message}\n")
    assert os.listdir(tmp_path) == []


def test_a_second_sweep_into_one_out_is_refused_while_the_first_runs(data, tmp_path):
    """Two real processes: the second is refused while the first (paused with SIGSTOP mid-training) holds --out."""
    args = [sys.executable, "-m", "tools.scaling", "--data", data, "--out", str(tmp_path), "--sizes", "1x16",
            "--affine_sizes", "", "--ablation", "none", "--long_factor", "1", "--steps", "3", "--evals", "1",
            "--seeds", "1", "--n_head", "2", "--block_size", "16", "--batch_size", "2", "--eval_batches", "1",
            "--device", "cpu"]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        log = tmp_path / "1x16" / "learned-seed0" / "log.jsonl"
        while not log.exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert first.poll() is None, first.communicate()
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert (second.returncode, second.stdout, second.stderr) == (
            1, "", f"error: {tmp_path} is being written by another process (pid {first.pid}); wait for it to finish or "
                   "choose another folder\n")
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert "| 1x16 | binary | 1 |" in (tmp_path / "results.md").read_text()


def study(folder, per_nat, losses):
    """A finished study's results.json: losses {(point, variant, seed): val loss}, one bits/byte-per-nat factor."""
    runs, rows = {}, []
    for (point, variant, seed), loss in losses.items():
        runs.setdefault(point, []).append({"variant": variant, "seed": seed, "val_loss": loss})
    for point, rs in runs.items():
        for v in {r["variant"] for r in rs}:
            mean = sum(r["val_loss"] for r in rs if r["variant"] == v) / sum(r["variant"] == v for r in rs)
            rows.append({"point": point, "input": v, "val_loss": [mean, 0.0], "bits_per_byte": [mean * per_nat, 0.0]})
    os.makedirs(folder)
    (Path(folder) / "results.json").write_text(json.dumps({"rows": rows, "runs": runs}))


def test_contrast_pairs_gaps_by_seed_in_bits_per_byte(tmp_path, capsys):
    """Gaps (binary - learned per seed) scaled by each study's own bits/byte per nat: A at 2 bits/byte per nat,
    B at 1. 1x32: A gaps 0.5, 0.7 nats -> 1.0, 1.4 bits/byte; B 0.4, 0.6 -> B - A = -0.7, outside the 0.4
    spread. 2x48: within the spread. 3x80 is only in A (left out); 4x128 has one seed in B; a diverged run
    of A's is left out of its pairing."""
    a, b = tmp_path / "a", tmp_path / "b"
    study(a, 2.0, {("1x32", "learned", 0): 5.0, ("1x32", "binary", 0): 5.5, ("1x32", "learned", 1): 5.1,
                   ("1x32", "binary", 1): 5.8, ("2x48", "learned", 0): 4.0, ("2x48", "binary", 0): 4.3,
                   ("2x48", "learned", 1): 4.1, ("2x48", "binary", 1): 4.5, ("3x80", "learned", 0): 3.0,
                   ("3x80", "binary", 0): 3.2, ("4x128", "learned", 0): 3.0, ("4x128", "binary", 0): 3.1,
                   ("4x128", "learned", 1): 3.0, ("4x128", "binary", 1): 3.2})
    study(b, 1.0, {("1x32", "learned", 0): 6.0, ("1x32", "binary", 0): 6.4, ("1x32", "learned", 1): 6.0,
                   ("1x32", "binary", 1): 6.6, ("2x48", "learned", 0): 5.0, ("2x48", "binary", 0): 5.5,
                   ("2x48", "learned", 1): 5.0, ("2x48", "binary", 1): 5.9, ("4x128", "learned", 0): 4.0,
                   ("4x128", "binary", 0): 4.2})
    results = json.loads((a / "results.json").read_text())
    results["runs"]["2x48"].append({"variant": "binary", "seed": 2, "diverged": "non-finite gradient norm"})
    results["runs"]["2x48"].append({"variant": "learned", "seed": 2, "val_loss": 4.0})
    (a / "results.json").write_text(json.dumps(results))
    assert scaling.main(["--contrast", str(a), str(b)]) is None
    assert capsys.readouterr().out.splitlines()[2:] == [
        "| size | seeds | gap A (bits/byte) | gap B (bits/byte) | B - A | seed spread of the gap | outside it? |",
        "|---|---:|---:|---:|---:|---:|---|",
        "| 1x32 | 2, 2 | 1.2000 | 0.5000 | -0.7000 | 0.4000 | yes |",
        "| 2x48 | 2, 2 | 0.7000 | 0.7000 | +0.0000 | 0.4000 | no |",
        "| 4x128 | 2, 1 | 0.3000 | 0.2000 | -0.1000 | 0.2000 | needs 2 seeds |"]
    with pytest.raises(ValueError, match="trains nothing: drop --sizes, --quick"):
        scaling.main(["--contrast", str(a), str(b), "--sizes", "1x32", "--quick"])
    with pytest.raises(ValueError, match="results.json not found: --contrast reads two finished studies"):
        scaling.main(["--contrast", str(a), str(tmp_path / "none")])
