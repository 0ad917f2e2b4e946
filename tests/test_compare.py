"""Smoke test of compare.py: a tiny comparison end to end, its table, its verdict and its plot."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prepare_data import prepare
from tools import compare

ROOT = Path(__file__).resolve().parent.parent  # the repository's
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
    done = subprocess.run([sys.executable, "-m", "tools.compare", "--out", str(tmp_path / "out"), *args], cwd=ROOT,
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
    assert set(record) == {"diverged", "data"} and "at step" in record["diverged"]
    mtime = os.path.getmtime(tmp_path / "binary-seed0" / "final.json")
    compare.main(args)  # read back, not trained again
    assert os.path.getmtime(tmp_path / "binary-seed0" / "final.json") == mtime
    report = (tmp_path / "results.md").read_text()
    assert "diverged, left out: binary seed 0: " in report


# -------------------------------------------------------------- reused runs match their settings; one writer (issue 18)
TINY = ["--preset", "tiny", "--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "32",
        "--batch_size", "4", "--evals", "2", "--eval_batches", "2", "--seeds", "1", "--device", "cpu"]


def cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "tools.compare", *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob("*")
            if p.is_file() and p.name != ".writer.lock"}


def test_a_rerun_with_other_settings_or_data_is_refused_not_mixed_in(data, tmp_path):
    out = tmp_path / "out"
    compare.main(["--data", data, "--out", str(out), "--variants", "learned", "--steps", "4", *TINY])
    before = files(out)
    p = cli("--data", data, "--out", out, "--variants", "learned", "--steps", "8", "--lr", "1e-3", *TINY)
    stdout, stderr = p.communicate(timeout=300)
    assert (p.returncode, stdout) == (1, "")
    assert stderr == (f"error: {out / 'learned-seed0'} was trained with max_steps=4, lr=0.002, min_lr=0.0002, "
                      "eval_interval=2, save_interval=1, but this command asks for max_steps=8, lr=0.001, "
                      "min_lr=0.0001, eval_interval=4, save_interval=2: its results would be reported under settings "
                      "it never used; use another --out (or remove that folder to train it again)\n")
    moved = tmp_path / "data"  # the same settings on data re-prepared in place: refused too
    shutil.copytree(data, moved)
    run = out / "learned-seed0"
    (run / "log.jsonl").write_text((run / "log.jsonl").read_text().replace(json.dumps(data), json.dumps(str(moved))))
    meta = json.loads((moved / "meta.json").read_text())
    (moved / "meta.json").write_text(json.dumps({**meta, "seed": 1}))
    before = files(out)
    p = cli("--data", moved, "--out", out, "--variants", "learned", "--steps", "4", *TINY)
    stdout, stderr = p.communicate(timeout=300)
    assert (p.returncode, stderr) == (1, f"error: {run} was trained on other data than {moved} holds now "
                                         "(its meta.json changed since): use another --out (or remove that folder "
                                         "to train it again)\n")
    assert files(out) == before


def test_runs_moved_beside_their_data_prepared_again_read_back(data, tmp_path):
    """A folder of runs unpacked elsewhere (docs/runs' archives), its data prepared again from the same text at
    another path: the runs are read back (nothing trained), since the data is compared by content, not path."""
    out = tmp_path / "out"
    compare.main(["--data", data, "--out", str(out), "--variants", "learned", "--steps", "4", *TINY])
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out, elsewhere / "out")
    text = shutil.copy(Path(data).parent / "text.txt", tmp_path / "text.txt")
    prepare([str(text)], str(elsewhere / "data"), vocab_size=512, workers=1, progress=False)
    assert json.loads((elsewhere / "data" / "meta.json").read_text())["inputs"] == [str(text)]  # another path
    run = elsewhere / "out" / "learned-seed0"
    before = files(run)
    compare.main(["--data", str(elsewhere / "data"), "--out", str(elsewhere / "out"), "--variants", "learned",
                  "--steps", "4", *TINY])
    assert files(run) == before  # read back, not trained again
    # a final.json written before (the hash of meta.json's bytes, paths and all) still reads back where it was made
    final = json.loads((out / "learned-seed0" / "final.json").read_text())
    legacy = {**final, "data": compare.data_hash(data, legacy=True)}
    (out / "learned-seed0" / "final.json").write_text(json.dumps(legacy))
    before = files(out / "learned-seed0")
    compare.main(["--data", data, "--out", str(out), "--variants", "learned", "--steps", "4", *TINY])
    assert files(out / "learned-seed0") == before


def test_a_variant_named_twice_is_refused(data, tmp_path):
    p = cli("--data", data, "--out", tmp_path / "out", "--variants", "binary,binary,learned", "--steps", "4", *TINY)
    assert p.communicate(timeout=300) == ("", "error: --variants names binary more than once: name each input once\n")
    assert p.returncode == 1 and not (tmp_path / "out").exists()


def test_a_second_comparison_into_one_out_is_refused_while_the_first_runs(data, tmp_path):
    """Two real processes: the second is refused while the first (paused with SIGSTOP mid-training) holds --out;
    the first then finishes and reports."""
    out = tmp_path / "out"
    args = ["--data", data, "--out", out, "--variants", "learned", "--steps", "4", *TINY]
    first = cli(*args)
    try:
        deadline = time.time() + 120
        while not (out / "learned-seed0" / "log.jsonl").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert first.poll() is None, first.communicate()
        first.send_signal(signal.SIGSTOP)
        second = cli(*args)
        assert second.communicate(timeout=300) == ("", f"error: {out} is being written by another process "
                                                       f"(pid {first.pid}); wait for it to finish or choose "
                                                       "another folder\n")
        assert second.returncode == 1
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert "| learned | 1 |" in (out / "results.md").read_text()


def test_a_users_results_file_in_out_is_refused_and_kept(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.md").write_text("my own notes\n")
    p = cli("--data", data, "--out", out, "--variants", "learned", "--steps", "4", *TINY)
    assert p.communicate(timeout=300) == ("", f"error: {out} holds results.md, not written by this study "
                                              "(no results.json of its own beside them): they are left alone; "
                                              "choose another --out\n")
    assert p.returncode == 1 and files(out) == {"results.md": b"my own notes\n"}


def test_corpus_is_prepared_with_reserve_zero_as_asked_and_reused_only_so(tmp_path):
    """--corpus is prepared into <out>/data with id 0 given to NUL (prepare_data.py's default) or, under
    --no-reserve_zero, with the encoding's own ids; data prepared one way is not reused under the other."""
    (tmp_path / "a.txt").write_text("It is a truth universally acknowledged, that a single man in possession of a good "
                                    "fortune, must be in want of a wife.\n" * 20)
    args = ["--corpus", str(tmp_path / "a.txt"), "--vocab_size", "512", "--out"]
    own = compare.prepared(compare.parse_config([*args, str(tmp_path / "own"), "--no-reserve_zero"]))
    reserved = compare.prepared(compare.parse_config([*args, str(tmp_path / "reserved")]))
    assert (own["reserve_zero"], reserved["reserve_zero"]) == (False, True)
    with pytest.raises(ValueError) as e:
        compare.prepared(compare.parse_config([*args, str(tmp_path / "own")]))
    own_data = tmp_path / "own" / "data"
    assert str(e.value) == (f"{own_data} was prepared with reserve_zero=False, but this command asks for "
                            f"reserve_zero=True: use another --out (or remove {own_data} to prepare it again)")
