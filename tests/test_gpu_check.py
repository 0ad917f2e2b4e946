"""tools/gpu_check.py: its CPU dry run (the same steps as on a GPU, through the scripts' real command lines, at tiny
sizes, offline, on its own text); a failing step is a FAIL row and exit status 1; its pieces that only a GPU would
reach: the batch search, the tolerant log comparison, the child process runner, the missing tiktoken cache."""

import json
import os
import sys

import pytest
import tiktoken.load
import torch

from model import get_config
from tools import gpu_check
from tools.gpu_check import Done


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the subprocesses' tiny models run fastest on one thread


def rows(report):
    """{check: (result, note)} of the markdown table."""
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in report.splitlines() if line.startswith("| ")]
    return {c[0]: (c[1], c[-1]) for c in cells[1:]}


def test_the_dry_run_passes_every_step_offline_on_its_own_text(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BCGPT_CORPUS_CACHE", raising=False)  # no corpus: the check writes its own text
    work = tmp_path / "work"
    code = gpu_check.main(["--device", "cpu", "--work", str(work), "--out", str(tmp_path / "table.md"),
                           "--steps", "6", "--sample_tokens", "8",
                           "--no-sample_compile"])  # sample.py --compile: tests/test_sample.py
    report = (tmp_path / "table.md").read_text()
    assert code == 0 and capsys.readouterr().out == report
    got = rows(report)
    assert list(got) == ["train (quick start)", "SIGTERM, then --resume", "--init_from", "paper preset, largest batch",
                         "torchrun, 2 processes, grad_accum 2", "torchrun: SIGTERM, then --resume",
                         "sample.py, eager", "sample.py, compiled", "sample.py, CUDA graphs"]
    assert got.pop("sample.py, compiled") == ("skipped", "skipped (--no-sample_compile)")
    assert got.pop("sample.py, CUDA graphs") == ("skipped", "skipped: CUDA only (sample.py refuses --cuda_graphs here)")
    assert all(result == "ok" for result, _ in got.values()), report
    for name in ("SIGTERM, then --resume", "torchrun: SIGTERM, then --resume"):  # stopped at 3 or a step after it
        assert got[name][1].startswith("stopped at step ") and "(ckpt.pt holds it)" in got[name][1], report
        assert got[name][1].endswith("resumed to 6: log bit-identical")
    first, last = [float(w) for w in got["--init_from"][1].replace(",", "").split() if w[0].isdigit()]
    assert first == last
    assert got["paper preset, largest batch"][1].startswith(
        "dry run, tiny preset (2 x 32, context 32, V 512, eager float32): batch 64 of 64 first tried; ")
    assert got["torchrun, 2 processes, grad_accum 2"][1] == "gloo, 6 steps, world size 2"
    start = json.loads((work / "torchrun" / "log.jsonl").read_text().splitlines()[0])
    assert start["train_config"]["grad_accum"] == 2 and start["world_size"] == 2
    # its own text, the same every time, prepared at vocab 512; --work is kept
    assert (work / "text.txt").read_text() == gpu_check.english(gpu_check.TEXT_CHARS)
    assert json.loads((work / "data" / "meta.json").read_text())["vocab_size"] == 512
    assert (work / "reference" / "ckpt.pt").is_file()


def test_a_failing_step_is_a_fail_row_and_exit_1(tiny_data, monkeypatch, capsys):
    script = gpu_check.command
    monkeypatch.setattr(gpu_check, "command", lambda name, *args: script(name, *args, "--lr=-1"))
    code = gpu_check.main(["--device", "cpu", "--data_dir", tiny_data, "--steps", "2"])
    got = rows(capsys.readouterr().out)
    assert code == 1 and got == {"train (quick start)": (
        "**FAIL**", "exit 1: error: lr must be a finite number >= 0, got -1.0")}


def test_a_missing_tiktoken_cache_stops_at_once_and_says_how_to_fill_one(tmp_path, monkeypatch):
    def offline(url):
        raise ConnectionError(f"no network for {url}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    with pytest.raises(ValueError) as e:
        gpu_check.main(["--device", "cpu", "--work", str(tmp_path / "work")])
    assert str(e.value) == (
        "tiktoken's gpt2 encoding could not be read (ConnectionError: no network for "
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe): "
        f"TIKTOKEN_CACHE_DIR={tmp_path / 'empty'} holds no copy and its files cannot be downloaded here. On a machine "
        "with internet run `TIKTOKEN_CACHE_DIR=/path/tiktoken-cache python -c \"import tiktoken; "
        "tiktoken.get_encoding('gpt2')\"`, copy that folder here and set TIKTOKEN_CACHE_DIR to it")
    assert not (tmp_path / "work").exists()  # stopped before anything ran


def test_a_child_writing_a_lot_to_stderr_never_blocks():
    """A child writes 1 MiB to stderr (a pipe holds 64 KiB) before the step line that stop_after waits for: run()
    drains stderr meanwhile, sees the line, signals it, and gets every byte of both."""
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
             "sys.stderr.write('e' * 2**20); sys.stderr.flush()\n"
             "print('step 1/2', flush=True)\n"
             "time.sleep(60)\n")
    done = gpu_check.run([sys.executable, "-c", child], stop_after=1, timeout=30)
    assert (done.code, done.out, done.err) == (0, "step 1/2\n", "e" * 2**20) and done.wall < 30
    assert [line for _, line in done.lines] == ["step 1/2\n"]


def test_a_child_past_its_timeout_is_stopped_and_says_so():
    done = gpu_check.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert done.code == -15 and done.err == "\n(stopped after 1 s)" and done.wall < 30


def test_the_paper_row_tries_smaller_batches_while_one_runs_out_of_memory():
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB"
    tries = []

    def attempt(batch):
        tries.append(batch)
        return Done(1, "", oom, 1.0) if batch > 16 else Done(0, "step 1/3\n", "", 1.0)

    batch, done, failed = gpu_check.largest_batch_that_runs(attempt, 64)
    assert (batch, done.code, failed, tries) == (16, 0, [64, 32], [64, 32, 16])
    other = gpu_check.largest_batch_that_runs(lambda b: Done(1, "", "ValueError: something else", 1.0), 32)
    assert (other[0], other[2]) == (32, [])  # another failure stops the search: the row reports it


def test_the_first_batch_tried_is_the_largest_the_estimate_fits():
    paper = get_config("paper", vocab_size=65536)
    sizes = {b: gpu_check.estimated_bytes(paper, b) for b in gpu_check.BATCHES}
    assert all(sizes[a] > sizes[b] for a, b in zip(gpu_check.BATCHES, gpu_check.BATCHES[1:]))
    assert gpu_check.first_batch(paper, sizes[16]) == 16
    assert gpu_check.first_batch(paper, sizes[16] - 1) == 8
    assert gpu_check.first_batch(paper, 0) == 1
    assert gpu_check.first_batch(paper, sizes[64] * 2) == 64


def test_resumed_logs_are_compared_bit_for_bit_on_a_cpu_and_within_the_stated_tolerance_on_cuda():
    ref = {("train", 1): dict(step=1, loss=2.0, lr=1e-3, grad_norm=1.0, tokens=64),
           ("eval", 1): dict(step=1, val_loss=3.0, best_val_loss=3.0)}
    noisy = {("train", 1): dict(step=1, loss=2.004, lr=1e-3, grad_norm=1.0, tokens=64),
             ("eval", 1): dict(step=1, val_loss=3.0, best_val_loss=3.0)}
    assert gpu_check.differences(ref, ref, 0) == ([], 0.0)
    assert gpu_check.differences(ref, noisy, 0) == ([("train", 1)], pytest.approx(2e-3))
    assert gpu_check.differences(ref, noisy, gpu_check.RESUME_RTOL) == ([], pytest.approx(2e-3))
    far = {**noisy, ("train", 1): {**noisy[("train", 1)], "loss": 2.1}}
    assert gpu_check.differences(ref, far, gpu_check.RESUME_RTOL)[0] == [("train", 1)]
    other_lr = {**ref, ("train", 1): {**ref[("train", 1)], "lr": 1.0001e-3}}  # exact even on CUDA
    assert gpu_check.differences(ref, other_lr, gpu_check.RESUME_RTOL)[0] == [("train", 1)]
    assert gpu_check.differences(ref, {("train", 1): ref[("train", 1)]}, gpu_check.RESUME_RTOL)[0] == [("eval", 1)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is the GPU here")
def test_auto_without_a_gpu_says_how_to_dry_run():
    with pytest.raises(ValueError, match="--device cpu runs the same steps"):
        gpu_check.main([])


def test_a_check_that_fails_itself_is_a_fail_row_and_the_others_go_on():
    def broken(log):
        return [gpu_check.Row("x", True, note=log["missing"])]

    assert gpu_check.rows_of("torchrun", broken, {}) == [
        gpu_check.Row("torchrun", False, note="gpu_check itself failed: KeyError: 'missing'")]
    assert gpu_check.rows_of("torchrun", broken, {"missing": "here"}) == [gpu_check.Row("x", True, note="here")]


def test_the_paper_row_on_cuda_compares_the_peak_with_the_estimate_and_times_the_stop(tmp_path, monkeypatch):
    """check_paper as on a 141 GB GPU (an H200), its train.py runs stood in: batches above 16 run out of memory; batch 16
    logs 3 steps, writes a 2 GB ckpt.pt 12.5 s after its last step line, and peaks at `peak` bytes."""
    paper = get_config("paper", vocab_size=65536)
    estimate = gpu_check.estimated_bytes(paper, 16)
    monkeypatch.setattr("bincode_gpt.memory.available_memory", lambda device: 140 * 2**30)

    def stand_in(peak):
        def run(cmd, timeout):
            flags = dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)
            assert (flags["preset"], flags["vocab_size"], flags["dtype"], "--compile" in cmd) == (
                "paper", "65536", "bfloat16", False)
            if int(flags["batch_size"]) > 16:
                return Done(1, "", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB", 9.0)
            os.makedirs(flags["out_dir"])
            entries = [dict(event="train", step=s, tokens_per_s=1000.0 * s, mfu=0.1 * s) for s in (1, 2, 3)]
            (tmp_path / flags["out_dir"] / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
            with open(os.path.join(flags["out_dir"], "ckpt.pt"), "wb") as f:
                f.truncate(2 * 10**9)  # sparse: 2 GB on paper
            lines = [(10.0, "step 3/3 | loss 11.0\n"), (22.5, "done: step 3, ...\n")]
            return Done(0, "".join(l for _, l in lines), f"gpu_check peak cuda {peak}\n", 30.0, lines)
        return run

    first = gpu_check.first_batch(paper, 140 * 2**30)
    assert first > 16  # so a larger batch is tried first, and runs out of memory
    tried = ", ".join(str(b) for b in gpu_check.BATCHES if 16 < b <= first)
    stop = "; the stop path after the last step (one-batch check, RNG states, fsync'd 2.00 GB ckpt.pt) 12.5 s"
    for peak, ok in ((estimate, True), (estimate + 1, False)):
        monkeypatch.setattr(gpu_check, "run", stand_in(peak))
        work = tmp_path / f"peak{peak}"
        row = gpu_check.check_paper(gpu_check.CheckConfig(steps=100, compile=True), True, "data", str(work))
        below = "" if ok else " (below the peak: cannot warn before an OOM)"
        assert row == gpu_check.Row(
            "paper preset, largest batch", ok, tokens_per_s=2500.0, mfu=0.25, peak=f"{peak / 2**30:.2f} GiB",
            wall_s=30.0, note=f"32 x 1024, context 1024, V 65,536, eager bfloat16: batch 16 of {first} first tried ({tried} ran out of "
            f"memory); peak {peak / 2**30:.1f} GiB against preflight's estimate {estimate / 2**30:.1f} GiB{below}{stop}")


def test_one_gpu_skips_the_torchrun_rows_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    got = gpu_check.check_torchrun(gpu_check.CheckConfig(steps=100), True, "data", "work")
    why = ("skipped: one GPU, and NCCL refuses two ranks on one GPU (train.py uses NCCL for CUDA tensors; gloo on "
           "CUDA is not a train.py option)")
    assert got == [gpu_check.Row("torchrun, 2 processes, grad_accum 2", None, note=why),
                   gpu_check.Row("torchrun: SIGTERM, then --resume", None, note=why)]
