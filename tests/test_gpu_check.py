"""tools/gpu_check.py: its CPU dry run (the same steps as on a GPU, through the scripts' real command lines, at tiny
sizes, offline, on its own text), each row written to --out as it ends; a dry run killed midway, its compiled quick
start failing, keeps the rows that ended, and its work folder is refused to a second run; a failing step is a FAIL
row and exit status 1; its pieces that only a GPU would reach: the batch search, the CUDA-graph count, the tolerant
log comparison, the child process runner, the time limit, the missing tiktoken cache."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tiktoken.load
import torch

from model import get_config
from tools import gpu_check
from tools.gpu_check import Done

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's
ROW_FILES = ["01-environment.md", "02-paper-preset-token-ids-made-here.md", "04-paper-preset-largest-batch.md",
             "05-train-quick-start.md", "06-sample.py-eager.md", "09-SIGTERM-then-resume.md", "10-init_from.md",
             "11-torchrun-2-processes-grad_accum-2.md", "12-torchrun-SIGTERM-then-resume.md"]
MADE_IDS = ("tiny preset (2 x 32, context 32, V 512), eager float32, token ids made here: 5 steps at batch 64 of 64 "
            "first tried")


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the subprocesses' tiny models run fastest on one thread
    monkeypatch.delenv("OUT", raising=False)  # where it is set (a GPU node), the check's default --out


def rows(report):
    """{check: (result, note)} of the markdown table."""
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in report.splitlines() if line.startswith("| ")]
    return {c[0]: (c[1], c[-1]) for c in cells[1:]}


def row_lines(report):
    """The table's rows, as lines."""
    return [line for line in report.splitlines() if line.startswith("| ")][1:]


def test_the_dry_run_passes_every_step_offline_on_its_own_text(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BCGPT_CORPUS_CACHE", raising=False)  # no corpus: the check writes its own text
    work, out = tmp_path / "work", tmp_path / "out"
    code = gpu_check.main(["--device", "cpu", "--work", str(work), "--out", str(out), "--steps", "6",
                           "--sample_tokens", "8", "--no-sample_compile"])  # sample.py --compile: tests/test_sample.py
    report = (out / gpu_check.TABLE).read_text()
    assert code == 0 and capsys.readouterr().out == report
    assert report.startswith("GPU check on cpu (") and "MFU: none on a CPU (no datasheet peak)" in report
    got = rows(report)
    assert list(got) == ["environment", *[name for name, *_ in gpu_check.ROWS]] == [
        "environment", "paper preset, token ids made here", "mini model compiled, token ids made here",
        "paper preset, largest batch", "train (quick start)", "sample.py, eager", "sample.py, compiled",
        "sample.py, CUDA graphs", "SIGTERM, then --resume", "--init_from", "torchrun, 2 processes, grad_accum 2",
        "torchrun: SIGTERM, then --resume"]
    assert got.pop("sample.py, compiled") == ("skipped", "skipped (--no-sample_compile)")
    assert got.pop("mini model compiled, token ids made here") == (
        "skipped", "skipped: --compile is off (on by default on CUDA only)")
    assert got["paper preset, token ids made here"][1] == MADE_IDS
    assert got["environment"][1].startswith(f"torch {torch.__version__}, CUDA none, card none (a CPU dry run), "
                                            "compute mode n/a; C++ compiler ")
    assert got.pop("sample.py, CUDA graphs") == (
        "skipped", "n/a on a CPU: CUDA graphs record GPU kernels (sample.py refuses --cuda_graphs here)")
    assert all(result == "ok" for result, _ in got.values()), report
    assert got["train (quick start)"][1] == "6 steps, float32"
    assert got["sample.py, eager"][1] == "8 greedy tokens"
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
    # each row that ran has its own file, its place in the table in its name: the heading and its row, as in the table
    assert sorted(os.listdir(out)) == ROW_FILES + [gpu_check.TABLE]
    heading, table = report.split("\n")[0], row_lines(report)
    for name in ROW_FILES:
        text = (out / name).read_text()
        assert text.split("\n")[0] == heading and row_lines(text) == [table[int(name[:2]) - 1]]
    assert report.splitlines()[-1].startswith("done in ")
    # its own text, the same every time, prepared at vocab 512; --work is kept
    assert (work / "text.txt").read_text() == gpu_check.english(gpu_check.TEXT_CHARS)
    assert json.loads((work / "data" / "meta.json").read_text())["vocab_size"] == 512
    assert (work / "reference" / "ckpt.pt").is_file()


def test_a_killed_dry_run_keeps_the_rows_that_ended_and_a_failed_compile_hides_no_row(tmp_path):
    """The dry run as a job runs it, `python -m tools.gpu_check`, with no tiktoken cache set and no network (GPT-2's
    files come from tools/tiktoken-cache), its compiled quick start failing as where no C++ compiler is found
    (CXX=false; a fresh inductor cache, so that no earlier compile is reused). Killed, with every process it
    started, once the eager sampling row has its file: each row that ended is in --out, in its own file and in the
    table; the paper row and eager sampling ran and passed. A second run in its work folder is refused at once."""
    work, out = tmp_path / "work", tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    nowhere = "http://127.0.0.1:9"  # a closed port: any download fails at once
    env.update(TMPDIR=str(tmp_path), HTTPS_PROXY=nowhere, HTTP_PROXY=nowhere, https_proxy=nowhere, http_proxy=nowhere,
               NO_PROXY="", no_proxy="", CXX="false", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    check = [sys.executable, "-m", "tools.gpu_check", "--device", "cpu", "--work", str(work)]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(check + ["--compile", "--out", str(out), "--steps", "6", "--sample_tokens", "8",
                                         "--no-sample_compile"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
        try:
            until = time.monotonic() + 300
            while not (out / "06-sample.py-eager.md").exists() and proc.poll() is None and time.monotonic() < until:
                time.sleep(0.2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()  # killed, not ended
    compiled_mini = "03-mini-model-compiled-token-ids-made-here.md"  # compiled: fails as the quick start does
    # a SIGKILL may land inside the table's atomic write (a temporary file, then a rename): the table stays whole
    files = [f for f in os.listdir(out) if not f.startswith(gpu_check.TABLE + ".tmp")]
    assert sorted(files) == sorted(ROW_FILES[:2] + [compiled_mini] + ROW_FILES[2:5] + [gpu_check.TABLE])
    report = (out / gpu_check.TABLE).read_text()
    got, table = rows(report), row_lines(report)
    assert report.splitlines()[-1].startswith("running: ") and len(got) < len(gpu_check.ROWS) + 1
    assert got["paper preset, largest batch"][0] == "ok" and got["sample.py, eager"] == ("ok", "8 greedy tokens")
    result, note = got["train (quick start)"]
    assert result == "**FAIL**" and note.startswith("compiled: exit 1: torch._inductor.exc.InductorError: ")
    assert "C++ compiler" in note and note.endswith("; eager instead: ok, the rows below start from it and train eager")
    assert got["mini model compiled, token ids made here"][0] == "**FAIL**"
    for name in ROW_FILES[:5]:
        assert row_lines((out / name).read_text()) == [table[int(name[:2]) - 1]]
    failure = (out / ROW_FILES[3]).read_text()
    assert "The command that failed, and its last stderr lines:\n\n```\n$ python " in failure
    ran, said = failure.split("```")[1].strip("\n").split("\n", 1)
    assert ran.startswith(f"$ python {ROOT}/train.py --data_dir={work}/data ") and ran.endswith(" --compile")
    assert "InvalidCxxCompiler" in said
    # the same --work again: one line, exit 1, and the folder as the killed run left it
    before = sorted((p, p.stat().st_mtime_ns) for p in work.rglob("*"))
    again = subprocess.run(check, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert (again.returncode, again.stdout) == (1, "") and again.stderr == (
        f"error: --work {work} is not empty (an earlier check's runs?): name a new or empty folder, each check "
        "starts afresh\n")
    assert sorted((p, p.stat().st_mtime_ns) for p in work.rglob("*")) == before


@pytest.mark.parametrize("missing,flags", [("tiktoken", []), ("numpy", ["--compile"])])
def test_a_box_lacking_a_module_or_a_compiler_still_leaves_its_table(tmp_path, missing, flags):
    """The lent GPU box may lack tiktoken or numpy, or a compiler: `python -m tools.gpu_check` then still writes its
    table, the environment first, the torch-only rows run, and every other row skipped naming what it lacked. A
    stub package first on PYTHONPATH makes the module fail to import, in the check and in each process it starts;
    with --compile, a PATH without c++, g++ or clang++ leaves no compiler for torch.compile's CPU kernels."""
    (tmp_path / "stubs" / missing).mkdir(parents=True)
    (tmp_path / "stubs" / missing / "__init__.py").write_text(
        f'raise ModuleNotFoundError("No module named {missing!r}", name={missing!r})\n')
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env.update(PYTHONPATH=str(tmp_path / "stubs"), OMP_NUM_THREADS="1")
    if flags:
        (tmp_path / "bin").mkdir()
        env["PATH"] = str(tmp_path / "bin")  # no compiler on it (the check's processes start from sys.executable)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--device", "cpu", "--out", str(out), *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    report = (out / gpu_check.TABLE).read_text()
    assert (done.returncode, done.stdout) == (0, report), done.stderr
    got = rows(report)
    assert list(got) == ["environment", *[name for name, *_ in gpu_check.ROWS]]
    lacked = f"{missing} (it does not import: ModuleNotFoundError: No module named '{missing}')"
    environment = got.pop("environment")
    assert environment[0] == "ok" and lacked in environment[1]
    assert got.pop("paper preset, token ids made here") == ("ok", MADE_IDS)
    no_compiler = "a C++ compiler (none of c++, g++, clang++ on PATH)"
    assert ("C++ compiler none on PATH" in environment[1]) == bool(flags)
    assert got.pop("mini model compiled, token ids made here") == ("skipped", f"skipped: needs {no_compiler}" if flags
                                                                   else "skipped: --compile is off (on by default on "
                                                                        "CUDA only)")
    for name, needs in ((name, needs) for name, _, _, needs in gpu_check.ROWS if name in got):
        said = "; ".join([lacked] + [no_compiler] * (bool(flags) and gpu_check.COMPILER in needs))
        assert got[name] == ("skipped", f"skipped: needs {said}"), name
    assert sorted(os.listdir(out)) == ROW_FILES[:2] + [gpu_check.TABLE]


def test_an_out_folder_that_holds_an_earlier_table_is_refused_before_any_work(tmp_path):
    (tmp_path / gpu_check.TABLE).write_text("an earlier check's table\n")
    with pytest.raises(ValueError) as e:
        gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--work", str(tmp_path / "work")])
    assert str(e.value) == f"--out {tmp_path} holds an earlier check's gpu_check.md: name a new or empty folder"
    assert os.listdir(tmp_path) == [gpu_check.TABLE] and (tmp_path / gpu_check.TABLE).read_text() == (
        "an earlier check's table\n")


def test_a_failing_step_is_a_fail_row_and_exit_1(tiny_data, monkeypatch, capsys):
    """Every training process fails at its settings: each row that trains fails with the line that says why, and
    the rows that would start from its checkpoint say they have none."""
    script, launcher = gpu_check.command, gpu_check.torchrun
    monkeypatch.setattr(gpu_check, "command", lambda name, *args: script(name, *args, "--lr=-1"))
    monkeypatch.setattr(gpu_check, "torchrun", lambda n, *args: launcher(n, *args, "--lr=-1"))
    code = gpu_check.main(["--device", "cpu", "--data_dir", tiny_data, "--steps", "2"])
    got = rows(capsys.readouterr().out)
    lr = ("**FAIL**", "exit 1: error: lr must be a finite number >= 0, got -1.0")
    no_reference = ("skipped", gpu_check.NO_REFERENCE)
    assert got.pop("environment")[0] == got.pop("paper preset, token ids made here")[0] == "ok"  # torch's alone
    assert code == 1 and got == {
        "mini model compiled, token ids made here": ("skipped", "skipped: --compile is off (on by default on CUDA "
                                                                "only)"),
        "paper preset, largest batch": ("**FAIL**", f"batch 64: {lr[1]}"), "train (quick start)": lr,
        "sample.py, eager": no_reference, "sample.py, compiled": no_reference,
        "sample.py, CUDA graphs": ("skipped", "n/a on a CPU: CUDA graphs record GPU kernels (sample.py refuses "
                                              "--cuda_graphs here)"),
        "SIGTERM, then --resume": no_reference, "--init_from": no_reference,
        "torchrun, 2 processes, grad_accum 2": lr,  # a rank's line, not torchrun's ChildFailedError after it
        "torchrun: SIGTERM, then --resume": ("skipped", "skipped: no finished torchrun run to compare with (its row "
                                                        "says why)")}


def test_a_run_out_of_time_skips_the_rows_it_cannot_start(tiny_data, capsys):
    code = gpu_check.main(["--device", "cpu", "--data_dir", tiny_data, "--time_limit", "1"])
    got = rows(capsys.readouterr().out)
    assert got.pop("environment")[0] == "ok"
    assert code == 0 and got == {name: ("skipped", "skipped: out of time (--time_limit 1 s)")
                                 for name, *_ in gpu_check.ROWS}
    one_gpu = sum(seconds for name, seconds, *_ in gpu_check.ROWS if not name.startswith("torchrun"))
    assert one_gpu + gpu_check.PREPARE_S <= 550 < gpu_check.CheckConfig().time_limit < 600  # under a 600 s job


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
        f"TIKTOKEN_CACHE_DIR={tmp_path / 'empty'} (unset it: the check then reads gpt2's from tools/tiktoken-cache) "
        "holds no copy and its files cannot be downloaded here. On a machine with internet run "
        "`TIKTOKEN_CACHE_DIR=/path/tiktoken-cache python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\"`, copy "
        "that folder here and set TIKTOKEN_CACHE_DIR to it")
    assert not (tmp_path / "work").exists()  # stopped before anything ran


def test_the_shipped_tiktoken_files_are_gpt2s(monkeypatch):
    """tools/tiktoken-cache holds what tiktoken caches for GPT-2 (it checks each file's pinned SHA-256), and
    nothing is downloaded."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", gpu_check.TIKTOKEN_CACHE)
    monkeypatch.setattr(tiktoken.load, "read_file", lambda url: pytest.fail(f"downloaded {url}"))
    from bincode_gpt.tokenizer import encoding_parts

    assert len(encoding_parts("gpt2")["mergeable_ranks"]) == 50256
    assert sorted(os.listdir(gpu_check.TIKTOKEN_CACHE)) == [
        "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6", "6d1cbeee0f20b3d9449abfede4726ed8212e3aee", "README.md"]


def test_a_child_writing_a_lot_to_stderr_never_blocks():
    """A child writes 1 MiB to stderr (a pipe holds 64 KiB) before the step line that stop_after waits for: run()
    drains stderr meanwhile, sees the line, signals it, and gets every byte of both."""
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
             "sys.stderr.write('e' * 2**20); sys.stderr.flush()\n"
             "print('step 1/2', flush=True)\n"
             "time.sleep(60)\n")
    done = gpu_check.run([sys.executable, "-c", child], stop_after=1, timeout=30)
    assert (done.code, done.out, done.err, done.late) == (0, "step 1/2\n", "e" * 2**20, False) and done.wall < 30
    assert [line for _, line in done.lines] == ["step 1/2\n"]


def test_a_child_past_its_timeout_is_stopped_and_fails_however_it_exits(monkeypatch):
    """train.py saves and exits 0 on SIGTERM: stopped for time, it still failed (its row's steps are not all run).
    One that ignores SIGTERM gets SIGKILL GRACE seconds later."""
    monkeypatch.setattr(gpu_check, "GRACE", 1)
    child = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\ntime.sleep(60)\n"
    done = gpu_check.run([sys.executable, "-c", child], timeout=1)
    assert (done.code, done.late, done.failed) == (0, True, True) and done.wall < 30
    assert gpu_check.why(done).startswith("stopped after ") and gpu_check.why(done).endswith(
        " s: its row's share of the time ran out")
    stuck = gpu_check.run([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                                 "time.sleep(60)\n"], timeout=1)
    assert (stuck.code, stuck.late) == (-signal.SIGKILL, True) and 2 <= stuck.wall < 10


def test_why_a_process_failed_is_its_error_line_not_a_hint_after_it():
    err = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n    raise exc.InvalidCxxCompiler\n"
           "torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler\n\n"
           "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\ngpu_check peak rss 1000\n")
    assert gpu_check.why(Done(1, "", err, 1.0)) == (
        "exit 1: torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler")
    ranks = ("error: lr must be a finite number >= 0, got -1.0\nTraceback (most recent call last):\n"
             "torch.distributed.DistNetworkError: Connection reset by peer\n"
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")  # rank 0's, rank 1's, torchrun's
    assert gpu_check.why(Done(1, "", ranks, 1.0)) == "exit 1: error: lr must be a finite number >= 0, got -1.0"
    assert gpu_check.why(Done(2, "", "something odd\ngpu_check peak rss 1000\n", 1.0)) == "exit 2: something odd"
    assert gpu_check.why(Done(-9, "", "", 1.0)) == "exit -9: no message"


def test_the_paper_row_steps_down_on_any_cuda_fault_in_its_first_steps():
    illegal = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    tries = []

    def attempt(batch):
        tries.append(batch)
        if batch == 16:
            return Done(1, "step 1/3\n", illegal, 1.0)
        if batch == 8:
            return Done(1, "", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB", 1.0)
        return Done(0, "step 1/3\nstep 2/3\nstep 3/3\n", "", 1.0)

    batch, done, faulted = gpu_check.largest_batch_that_runs(attempt, 16)
    assert (batch, done.code, faulted, tries) == (4, 0, [16, 8], [16, 8, 4])
    other = gpu_check.largest_batch_that_runs(lambda b: Done(1, "", "ValueError: something else", 1.0), 16)
    assert (other[0], other[2]) == (16, [])  # another failure stops the search: the row reports it
    saving = gpu_check.largest_batch_that_runs(lambda b: Done(1, "step 3/3\n", illegal, 1.0), 16)
    assert (saving[0], saving[2]) == (16, [])  # after its last step (saving) a fault is no batch's


def test_the_first_batch_tried_is_the_largest_the_estimate_fits_below_2_31_logits():
    paper = get_config("paper", vocab_size=65536)
    assert gpu_check.runnable(paper) == [16, 8, 4, 2, 1]  # 32 x 1,024 x 65,536 = 2^31 logits
    sizes = {b: gpu_check.estimated_bytes(paper, b) for b in gpu_check.BATCHES}
    assert all(sizes[a] > sizes[b] for a, b in zip(gpu_check.BATCHES, gpu_check.BATCHES[1:]))
    assert gpu_check.first_batch(paper, sizes[16]) == 16
    assert gpu_check.first_batch(paper, sizes[16] - 1) == 8
    assert gpu_check.first_batch(paper, 0) == 1
    assert gpu_check.first_batch(paper, sizes[64] * 2) == 16
    assert gpu_check.first_batch(get_config("tiny", block_size=32), 2**40) == 64


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
    def broken(ctx, name, until):
        return gpu_check.Row(name, True, note=ctx["missing"])

    assert gpu_check.row_of(broken, {}, "torchrun", 0) == gpu_check.Row(
        "torchrun", False, note="gpu_check itself failed: KeyError: 'missing'")
    assert gpu_check.row_of(broken, {"missing": "here"}, "x", 0) == gpu_check.Row("x", True, note="here")


def context(tmp_path, cuda=True, steps=100):
    """A Context as on a GPU, its reference run finished (a ckpt.pt at --steps)."""
    ref = tmp_path / "reference"
    ref.mkdir(parents=True)
    torch.save({"step": steps}, ref / "ckpt.pt")
    return gpu_check.Context(gpu_check.CheckConfig(steps=steps, compile=True), cuda, "data", str(tmp_path),
                             dtype="bfloat16" if cuda else "float32")


def test_the_cuda_graphs_row_counts_the_graphs_recorded_and_says_why_none_were(tmp_path, monkeypatch):
    """sample.py --compile --cuda_graphs, stood in: CHILD's count of the graphs replayed is the row's; none is a FAIL,
    with the reason inductor logged (TORCH_LOGS=cudagraphs, asked for by the row)."""
    ctx = context(tmp_path)
    ctx.texts["eager"] = "The old king"
    said = {}

    def stand_in(err):
        def run(cmd, timeout, env=None):
            said.update(env=env, cmd=cmd)
            return Done(0, "The old king", f"{err}gpu_check peak cuda {2**30}\n", 20.0)
        return run

    counted = "gpu_check cuda_graphs 3 replays 64\n"
    monkeypatch.setattr(gpu_check, "run", stand_in(counted))
    row = gpu_check.check_sample(ctx, "sample.py, CUDA graphs", time.monotonic() + 75)
    assert said["env"]["TORCH_LOGS"] == "cudagraphs" and said["cmd"][-2:] == ["--compile", "--cuda_graphs"]
    assert row == gpu_check.Row("sample.py, CUDA graphs", True, peak="1.00 GiB", wall_s=20.0,
                                note="64 greedy tokens, the eager text; 3 CUDA graphs recorded, replayed 64 times")
    skipped = "skipping cudagraphs due to mutated inputs (1 instances)\ngpu_check cuda_graphs 0 replays 0\n"
    monkeypatch.setattr(gpu_check, "run", stand_in(skipped))
    row = gpu_check.check_sample(ctx, "sample.py, CUDA graphs", time.monotonic() + 75)
    assert (row.ok, row.note) == (False, "64 greedy tokens, the eager text; no CUDA graph recorded: inductor skipped "
                                         "them (mutated inputs (1 instances))")
    assert gpu_check.check_sample(context(tmp_path / "cpu", cuda=False), "sample.py, CUDA graphs", 0).ok is None


def test_the_paper_row_on_cuda_compares_the_peak_with_the_estimate_and_times_the_stop(tmp_path, monkeypatch):
    """check_paper as on a 141 GB GPU (an H200), its train.py runs stood in: batch 16 (the largest below 2^31 logits)
    faults with an illegal memory access in its first step; batch 8 logs 3 steps, writes a 2 GB ckpt.pt 12.5 s after
    its last step line, and peaks at `peak` bytes."""
    paper = get_config("paper", vocab_size=65536)
    estimate = gpu_check.estimated_bytes(paper, 8)
    monkeypatch.setattr("bincode_gpt.memory.available_memory", lambda device: 140 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")

    def stand_in(peak):
        def run(cmd, timeout):
            flags = dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)
            assert (flags["preset"], flags["vocab_size"], flags["dtype"], "--compile" in cmd) == (
                "paper", "65536", "bfloat16", False)
            if int(flags["batch_size"]) > 8:
                return Done(1, "step 1/3\n", "torch.AcceleratorError: CUDA error: an illegal memory access", 9.0)
            os.makedirs(flags["out_dir"])
            entries = [dict(event="train", step=s, tokens_per_s=1000.0 * s, mfu=0.1 * s) for s in (1, 2, 3)]
            (tmp_path / flags["out_dir"] / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
            with open(os.path.join(flags["out_dir"], "ckpt.pt"), "wb") as f:
                f.truncate(2 * 10**9)  # sparse: 2 GB on paper
            lines = [(10.0, "step 3/3 | loss 11.0\n"), (22.5, "done: step 3, ...\n")]
            return Done(0, "".join(l for _, l in lines), f"gpu_check peak cuda {peak}\n", 30.0, lines)
        return run

    stop = "; the stop path after the last step (one-batch check, RNG states, fsync'd 2.00 GB ckpt.pt) 12.5 s"
    mfu = "MFU against the NVIDIA H200's bfloat16 datasheet peak, 989 TFLOP/s (bincode_gpt/devices.py)"
    for peak, ok in ((estimate, True), (estimate + 1, False)):
        monkeypatch.setattr(gpu_check, "run", stand_in(peak))
        ctx = gpu_check.Context(gpu_check.CheckConfig(steps=100, compile=True), True, "data", str(tmp_path / f"{peak}"),
                                dtype="bfloat16")
        row = gpu_check.check_paper(ctx, "paper", time.monotonic() + 100)
        below = "" if ok else " (below the peak: cannot warn before an OOM)"
        assert row == gpu_check.Row(
            "paper", ok, tokens_per_s=2500.0, mfu=0.25, peak=f"{peak / 2**30:.2f} GiB", wall_s=30.0,
            note=f"32 x 1024, context 1024, V 65,536, eager bfloat16: batch 8 of 16 first tried (16 faulted); 64, 32 "
            f"not tried (2^31 logits or more overflow cross_entropy); peak {peak / 2**30:.1f} GiB and 2,500 tokens/s "
            f"beside the memory check's estimate {estimate / 2**30:.1f} GiB{below}; {mfu}{stop}")


def test_the_paper_row_keeps_its_speed_when_a_later_step_of_it_fails(tmp_path, monkeypatch):
    """Its train.py run stood in: 3 steps logged, then the save fails (a full disk): a FAIL row with its tokens/s."""
    monkeypatch.setattr("bincode_gpt.memory.available_memory", lambda device: 140 * 2**30)

    def run(cmd, timeout):
        out_dir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--out_dir="))
        os.makedirs(out_dir)
        entries = [dict(event="train", step=s, tokens_per_s=1000.0 * s, mfu=0.1 * s) for s in (1, 2, 3)]
        (tmp_path / out_dir / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
        return Done(1, "step 3/3 | loss 11.0\n", "error: ckpt.pt: not saved: the disk is full\n", 30.0, cmd=cmd)

    monkeypatch.setattr(gpu_check, "run", run)
    ctx = gpu_check.Context(gpu_check.CheckConfig(steps=100, compile=True), True, "data", str(tmp_path),
                            "bfloat16")
    row = gpu_check.check_paper(ctx, "paper", time.monotonic() + 100)
    assert (row.ok, row.tokens_per_s, row.mfu) == (False, 2500.0, 0.25)
    assert row.note.endswith(": exit 1: error: ckpt.pt: not saved: the disk is full")


def test_one_gpu_skips_the_torchrun_rows_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ctx = context(tmp_path)
    why = ("skipped: one GPU, and NCCL refuses two ranks on one GPU (train.py uses NCCL for CUDA tensors; gloo on "
           "CUDA is not a train.py option)")
    for name, _, check_fn, _ in gpu_check.ROWS[-2:]:
        assert check_fn(ctx, name, 0) == gpu_check.Row(name, None, note=why)


@pytest.mark.parametrize("flags, scale", [([], 5), (["--time_scale", "1"], 1), (["--time_scale", "2.5"], 2.5)])
def test_a_dry_run_gives_each_row_its_share_times_the_time_scale(tiny_data, monkeypatch, flags, scale):
    """A CPU dry run (a loaded CI machine) gets 5 times each row's share unless --time_scale says otherwise."""
    shares = {}

    def record(ctx, name, until):
        shares[name] = until - time.monotonic()
        return gpu_check.Row(name, True)

    monkeypatch.setattr(gpu_check, "ROWS", tuple((name, s, record, needs) for name, s, _, needs in gpu_check.ROWS[:3]))
    assert gpu_check.main(["--device", "cpu", "--data_dir", tiny_data, "--time_limit", "1000"] + flags) == 0
    assert list(shares) == [name for name, *_ in gpu_check.ROWS]
    for name, seconds, *_ in gpu_check.ROWS:
        assert seconds * scale - 2 < shares[name] <= seconds * scale
