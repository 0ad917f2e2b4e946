"""Tests of train.py: learning, bit-exact resume, DDP = gradient accumulation, checkpoints, failures.

Everything runs on the CPU with the 'tiny' preset on a slice of tiny Shakespeare tokenized at vocab 512.
"""

import errno
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import prepare_data
from bincode_gpt import preflight, ranks, run_dir, shards
import train
from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.exits import run_main
from bincode_gpt.files import LOCK_NAME
from bincode_gpt.progress import Log, clock
from bincode_gpt.shards import ShardError, write_shard
from bincode_gpt.tokenizer import get_tokenizer
from bincode_gpt.windows import Split
from model import GPT, canonical_code
from prepare_data import prepare

ROOT = Path(__file__).resolve().parent.parent  # the repository's
CORPUS = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
if (ROOT.parent / "shared" / "tiktoken-cache").is_dir():  # offline GPT-2 BPE files (CI); subprocesses inherit it
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT.parent / "shared" / "tiktoken-cache"))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a busy machine does not oversubscribe it (subprocesses too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    del os.environ["OMP_NUM_THREADS"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("data")
    if CORPUS.is_file():
        text = CORPUS.read_text(encoding="utf-8")[:200_000]
    else:  # a fresh clone without ../shared: any English-like text will do
        rng = np.random.default_rng(0)
        words = "the king shall speak of love and death to thee my lord what is this night".split()
        text = "\n".join(" ".join(rng.choice(words, 12)) for _ in range(8000))
    (tmp / "corpus.txt").write_text(text, encoding="utf-8")
    prepare([str(tmp / "corpus.txt")], str(tmp / "prepared"), vocab_size=512, workers=1, progress=False)
    return tmp / "prepared"


def config(data_dir, out_dir, **kw):
    base = dict(data_dir=str(data_dir), out_dir=str(out_dir), preset="tiny", block_size=32, batch_size=8,
                max_steps=10, lr=3e-3, min_lr=3e-4, warmup_steps=3, eval_interval=5, eval_steps=2,
                log_interval=1000, save_interval=5, device="cpu", seed=7)
    return train.TrainConfig(**{**base, **kw})


def flags(data_dir, out_dir, **kw):
    """config()'s settings as train.py's command line."""
    return [f"--{k}={v}" for k, v in vars(config(data_dir, out_dir, **kw)).items() if v is not None]


def cli(*args):
    """python train.py ARGS -> (exit status, stdout, stderr)."""
    run = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout, run.stderr


def train_log(out_dir, event="train"):
    lines = [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]
    return [e for e in lines if e["event"] == event]


def weights(out_dir, name="ckpt.pt"):
    return torch.load(Path(out_dir) / name, weights_only=True)["model"]


def files(folder):
    """{name: bytes} of every file in folder but the writer lock (files.writer_lock), which holds the pid of
    the last process that took it."""
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file() and p.name != LOCK_NAME}


def copy_data(data_dir, tmp_path):
    return Path(shutil.copytree(data_dir, tmp_path / "data"))


# ----------------------------------------------------------------------------- learning
def test_validation_loss_goes_down(data_dir, tmp_path):
    s = train.train(config(data_dir, tmp_path, max_steps=40, eval_interval=20, eval_steps=4))
    evals = train_log(tmp_path, "eval")
    assert [e["step"] for e in evals] == [0, 20, 40]
    assert evals[0]["val_loss"] > 6.0  # ~ln 512 at init
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.7
    assert s["steps"] == 40 and s["tokens"] == 40 * 8 * 32
    assert s["final_val_loss"] == evals[-1]["val_loss"] == s["best_val_loss"]
    assert (tmp_path / "best.pt").is_file() and (tmp_path / "ckpt.pt").is_file()


def test_losses_are_also_per_byte_of_the_text(data_dir, tmp_path, capsys):
    """Nats per byte = nats per token x the split's tokens / its UTF-8 bytes (meta.json): comparable across V."""
    train.train(config(data_dir, tmp_path, max_steps=4, eval_interval=4, log_interval=2))
    splits = json.loads((Path(data_dir) / "meta.json").read_text())["splits"]
    val, tr = (splits[k]["tokens"] / splits[k]["bytes"] for k in ("val", "train"))
    out = capsys.readouterr().out
    for e in train_log(tmp_path, "eval"):
        assert e["val_loss_per_byte"] == pytest.approx(e["val_loss"] * val, rel=1e-12)
        assert f"step {e['step']}: val loss {e['val_loss']:.4f}, {e['val_loss'] * val:.4f} nats/byte" in out
    last = train_log(tmp_path)[-1]
    assert f"step 4/4 | loss {last['loss']:.4f}, {last['loss'] * tr:.4f} nats/byte |" in out


def test_the_eta_and_tokens_per_s_leave_out_the_warm_up_step(capsys):
    log = Log(train.TrainConfig(max_steps=200, eval_interval=50, log_interval=10), True, 1, 32, 1.0, None)
    log.eval_s = 4.0  # the last evaluation's time
    for step, dt in enumerate([9.0] + [0.5] * 9, start=1):  # a slow first step (warm-up), then 0.5 s a step
        log.step(SimpleNamespace(step=step, position=step), 1.0, None, 1e-3, dt, False)
    # 190 steps at 0.5 s, and the evaluations at 50, 100, 150 and 200 at 4 s each: 111 s; the tokens/s of
    # the 9 steady steps (16 x 32 tokens in 0.5 s), the warm-up left out of it and of the run's summary
    assert capsys.readouterr().out.endswith("| 1,024 tok/s | eta 0h01m51s\n")
    assert log.tokens_per_s() == 1024
    assert Log(train.TrainConfig(max_steps=210, eval_interval=50), True, 1, 32, 1.0, None).eta(200, [1.0]) == 10
    assert clock(3 * 3600 + 62.7) == "3h01m02s"


LOG_30_STEPS = Path(__file__).resolve().parent / "data" / "log_30_steps.json"
WALL_CLOCK = ("dt", "tokens_per_s", "mfu", "wall_s")  # the fields of log.jsonl that vary from run to run


@pytest.fixture(scope="module")
def sentences(tmp_path_factory):
    """Token shards of generated sentences at vocab 512: the same text wherever the checkout lies (tiny_data
    and data_dir read Shakespeare where they find it beside the checkout), so a logged run can be compared."""
    folder = tmp_path_factory.mktemp("sentences")
    lines = (f"line {i}: the quick brown fox {i % 7} jumps over {i % 11} dogs" for i in range(500))
    (folder / "text.txt").write_text("\n".join(lines))
    prepare([str(folder / "text.txt")], str(folder / "data"), vocab_size=512, workers=1, progress=False)
    return folder / "data"


def steady_log(out_dir, data_dir):
    """log.jsonl's entries less their wall-clock fields, the run's folders named by placeholders."""
    folders = {str(out_dir): "<out_dir>", str(data_dir): "<data_dir>"}

    def steady(value):
        if isinstance(value, dict):
            return {k: steady(v) for k, v in value.items() if k not in WALL_CLOCK}
        return folders.get(value, value) if isinstance(value, str) else value
    return [steady(json.loads(line)) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]


def agreeing(got, want, rel=1e-5):
    """got, its floats that agree with want's to `rel` replaced by want's: `agreeing(got, want) == want` compares
    the rest exactly and shows where they differ."""
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: agreeing(v, want.get(k), rel) for k, v in got.items()}
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [agreeing(g, w, rel) for g, w in zip(got, want)]
    if isinstance(got, float) and isinstance(want, float) and math.isclose(got, want, rel_tol=rel):
        return want
    return got


def test_a_30_step_run_logs_the_stored_trajectory(sentences, tmp_path):
    """30 steps with pinned flags log what tests/data/log_30_steps.json holds, entry for entry: settings, losses,
    learning rates, gradient norms, evaluations and the summary. Floats agree to 1e-5 relative (another CPU's
    kernels may round differently); any change to the data order, the schedule, the init or the step is far more."""
    train.train(config(sentences, tmp_path, max_steps=30, eval_interval=10, log_interval=10, save_interval=15))
    got, want = steady_log(tmp_path, sentences), json.loads(LOG_30_STEPS.read_text())
    assert [e["event"] for e in got] == ["start", "eval"] + (["train"] * 10 + ["eval"]) * 3 + ["end"]
    assert agreeing(got, want) == want
    assert want[-1]["final_val_loss"] < want[1]["val_loss"] - 0.5  # the stored run did learn


# ----------------------------------------------------------------------------- resume
def test_resume_is_bit_exact_with_dropout(data_dir, tmp_path):
    K, N = 12, 5
    full, part = tmp_path / "full", tmp_path / "part"
    train.train(config(data_dir, full, max_steps=K, dropout=0.1, grad_accum=2))
    # stop at N (the LR schedule still ends at K), then resume to K
    train.train(config(data_dir, part, max_steps=N, lr_decay_steps=K, dropout=0.1, grad_accum=2))
    train.train(config(data_dir, part, max_steps=K, dropout=0.1, grad_accum=2, resume=True))
    a, b = train_log(full), train_log(part)
    assert [e["step"] for e in b] == list(range(1, K + 1))
    assert [e["loss"] for e in a] == [e["loss"] for e in b]  # exact, every step (those after N included)
    wa, wb = weights(full), weights(part)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # dropout really was on: the same run without it logs other losses
    train.train(config(data_dir, tmp_path / "nodrop", max_steps=2, grad_accum=2))
    assert train_log(tmp_path / "nodrop")[1]["loss"] != a[1]["loss"]


def test_sigint_finishes_the_step_saves_and_resumes(data_dir, tmp_path):
    args = [f"--data_dir={data_dir}", f"--out_dir={tmp_path}", "--preset=tiny", "--device=cpu", "--batch_size=8",
            "--max_steps=100000", "--eval_interval=0", "--save_interval=0", "--log_interval=1", "--warmup_steps=3"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=os.environ)
    for line in proc.stdout:  # wait for a few steps
        if line.startswith("step 3/"):
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "SIGINT" in err
    steps = [e["step"] for e in train_log(tmp_path)]
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == steps[-1] >= 3 and steps == list(range(1, steps[-1] + 1))
    assert train_log(tmp_path, "end")[0]["interrupted"] is True


# ----------------------------------------------------------------------------- data indexing and DDP
def test_ranks_and_micro_steps_read_disjoint_windows():
    B, A, W, n = 4, 3, 2, 50
    for step in range(5):  # crosses epoch boundaries (G = 24 > n / 2)
        p = step * B * A * W
        starts = {(r, m): train.micro_batch_start(p, r, m, B, A) for r in range(W) for m in range(A)}
        positions = sorted(s + i for s in starts.values() for i in range(B))
        assert positions == list(range(p, p + B * A * W))  # the step's positions, each exactly once
        # one process with 2A micro-steps reads the same positions as W=2 processes with A each
        assert sorted(train.micro_batch_start(p, 0, m, B, A * W) + i for m in range(A * W) for i in range(B)) == positions
    # windows: each epoch is a permutation of all n windows, another one per epoch, same for the same seed
    e0, e1 = train.training_order(0, n, n, seed=1), train.training_order(n, n, n, seed=1)
    assert sorted(e0) == sorted(e1) == list(range(n)) and not np.array_equal(e0, e1)
    assert np.array_equal(train.training_order(10, 60, n, 1), np.concatenate([e0, e1])[10:70])
    rank0 = train.training_order(train.micro_batch_start(0, 0, 0, B, 1), B, n, 1)
    rank1 = train.training_order(train.micro_batch_start(0, 1, 0, B, 1), B, n, 1)
    assert not set(rank0) & set(rank1)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through /proc")
def test_two_gloo_processes_stopped_by_sigterm_equal_gradient_accumulation(data_dir, tmp_path):
    common = dict(batch_size=4, eval_interval=1, save_interval=0, warmup_steps=2, lr_decay_steps=6, log_interval=1)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(ROOT / "train.py"), *flags(data_dir, tmp_path / "two", grad_accum=1, max_steps=1000, **common)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step 4/"):
            break
    # SIGTERM to the ranks, not to torchrun: torchrun exits 1 on a signal of its own (see train.py)
    for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
        os.kill(int(pid), signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert err.count("SIGTERM: finishing this step, saving, then exiting") == 2
    ckpt = torch.load(tmp_path / "two" / "ckpt.pt", weights_only=True)
    steps = ckpt["step"]  # every rank stopped after the same step, and saved it
    assert [e["step"] for e in train_log(tmp_path / "two")] == list(range(1, steps + 1)) and 4 <= steps < 1000
    assert train_log(tmp_path / "two", "end")[0]["interrupted"] is True
    # one process with grad_accum=2 takes the same steps
    train.train(config(data_dir, tmp_path / "one", grad_accum=2, max_steps=steps, **common))
    w1, w2 = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=0, msg=k)
    l1, l2 = train_log(tmp_path / "one"), train_log(tmp_path / "two")
    assert np.allclose([e["loss"] for e in l1], [e["loss"] for e in l2], atol=1e-5)
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2 and ckpt["data"]["position"] == steps * 8
    assert not torch.equal(ckpt["rng"][0]["torch"], ckpt["rng"][1]["torch"])  # each rank its own dropout stream
    # validation: each rank takes its share of the fixed windows, and the mean is over all of them
    v2 = train_log(tmp_path / "two", "eval")[-1]["val_loss"]
    model, _ = load_checkpoint(str(tmp_path / "two" / "ckpt.pt"))
    meta = shards.load_meta(data_dir)
    val = Split(str(data_dir), meta, "val", 32, 512)
    cfg = config(data_dir, tmp_path, batch_size=4, eval_steps=4)  # 1 process, the same 16 windows
    run = SimpleNamespace(model=model, val_split=val, cfg=cfg, rank=0, world=1, device=torch.device("cpu"),
                          autocast=train.nullcontext())  # the parts of a train.Run that evaluate reads
    assert train.evaluate(run) == pytest.approx(v2, abs=1e-6)


# ----------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("compiled", [False, True])
def test_checkpoint_is_plain_and_reloads(data_dir, tmp_path, monkeypatch, compiled):
    made = []

    class Spy(GPT):  # keep hold of the model train() trains
        def __init__(self, c):
            super().__init__(c)
            made.append(self)

    monkeypatch.setattr(train, "GPT", Spy)
    if compiled:  # the eager backend wraps the model (OptimizedModule, _orig_mod.) without a C++ build
        real = torch.compile
        monkeypatch.setattr(train.torch, "compile", lambda m: real(m, backend="eager"))
    s = train.train(config(data_dir, tmp_path, max_steps=4, eval_interval=4, compile=compiled))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert {"model", "model_config", "tokenizer", "optimizer", "step", "rng", "data", "train_config",
            "best_val_loss", "val_loss"} <= ckpt.keys()
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert ckpt["tokenizer"] == {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512, "reserve_zero": True,
                                 "reserve_ones": True}
    assert ckpt["step"] == 4 and ckpt["train_config"]["max_steps"] == 4 and ckpt["model_config"]["n_embd"] == 32
    assert set(ckpt["rng"][0]) == {"torch", "cuda", "python", "numpy"}
    model, _ = load_checkpoint(str(tmp_path / "ckpt.pt"))
    trained = made[-1].eval()
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.eval()(x)[0], trained(x)[0])
    assert s["final_val_loss"] == ckpt["val_loss"] == ckpt["best_val_loss"]
    best, _ = load_checkpoint(str(tmp_path / "best.pt"))
    assert torch.equal(best(x)[0], trained(x)[0])


def test_init_from_fine_tunes_from_weights(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path / "a", max_steps=4))
    s = train.train(config(data_dir, tmp_path / "b", max_steps=2, init_from=str(tmp_path / "a" / "ckpt.pt"),
                           eval_interval=100))
    assert s["steps"] == 2  # a fresh run (step 0) from the old weights: its first val loss is theirs
    assert s["first_val_loss"] == pytest.approx(train_log(tmp_path / "a", "eval")[-1]["val_loss"], abs=0)


def test_best_pt_holds_the_weights_only_and_a_resume_reads_ckpt_pt(data_dir, tmp_path):
    """best.pt: the weights of the best evaluation and that evaluation, no optimizer, data position or RNG state
    (under half of ckpt.pt's bytes even at this size), for --init_from; a --resume finds no training state in it
    and says where to go instead."""
    run = tmp_path / "run"
    s = train.train(config(data_dir, run, max_steps=4, eval_interval=2, save_interval=0))
    best, ckpt = (torch.load(run / name, weights_only=True) for name in ("best.pt", "ckpt.pt"))
    assert sorted(best) == ["model", "model_config", "saved_as", "step", "tokenizer", "train_config", "val_loss"]
    evals = train_log(run, "eval")
    assert best["saved_as"] == "best.pt" and best["val_loss"] == s["best_val_loss"] == min(e["val_loss"] for e in evals)
    assert best["step"] == next(e["step"] for e in evals if e["val_loss"] == s["best_val_loss"]) > 0
    assert (run / "best.pt").stat().st_size < 0.5 * (run / "ckpt.pt").stat().st_size
    assert best["tokenizer"] == ckpt["tokenizer"] and best["model_config"] == ckpt["model_config"]
    tuned = train.train(config(data_dir, tmp_path / "tuned", max_steps=1, eval_interval=100,
                               init_from=str(run / "best.pt")))
    assert tuned["first_val_loss"] == best["val_loss"]  # the same fixed validation windows, the same weights
    (run / "ckpt.pt").rename(tmp_path / "ckpt.pt")
    with pytest.raises(FileNotFoundError) as e:
        train.train(config(data_dir, run, max_steps=6, resume=True))
    assert str(e.value) == (f"{run / 'ckpt.pt'}: no checkpoint there to resume; {run / 'best.pt'} holds weights only "
                            "(no optimizer, data position or RNG state): start a run from them with --init_from "
                            f"{run / 'best.pt'}")
    shutil.copy(run / "best.pt", run / "ckpt.pt")  # best.pt where --resume reads
    with pytest.raises(ValueError) as e:
        train.train(config(data_dir, run, max_steps=6, resume=True))
    assert str(e.value) == (f"{run / 'ckpt.pt'} is a best.pt (step {best['step']}'s weights, no optimizer, data "
                            "position or RNG state): --resume continues out_dir/ckpt.pt; start a run from these "
                            f"weights with --init_from {run / 'ckpt.pt'}")
    assert [e["event"] for e in map(json.loads, (run / "log.jsonl").read_text().splitlines())][-1] == "end"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_rank_waits_for_rank_0s_writes_under_the_timeout(data_dir, tmp_path, monkeypatch):
    """Under torchrun (one gloo process here: RANK, LOCAL_RANK and WORLD_SIZE set) the process group's collectives
    wait --dist_timeout minutes; each piece of rank 0's work alone (the window scan, every checkpoint write) is
    followed by a barrier; DDP broadcasts no buffers, and training leaves them exactly as built."""
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
                     ).items():
        monkeypatch.setenv(k, v)
    events, groups, made = [], [], []
    init, barrier, save, scan = (train.dist.init_process_group, train.dist.barrier, train.atomic_torch_save,
                                 train.preflight.check_window_starts)
    monkeypatch.setattr(train.dist, "init_process_group", lambda *a, **kw: groups.append(kw) or init(*a, **kw))
    monkeypatch.setattr(train.dist, "barrier", lambda *a, **kw: events.append("barrier") or barrier(*a, **kw))
    monkeypatch.setattr(train, "atomic_torch_save", lambda obj, path: events.append(os.path.basename(path))
                        or save(obj, path))
    monkeypatch.setattr(train.preflight, "check_window_starts", lambda *a: events.append("scan") or scan(*a))

    class DDP(ranks.DDP):
        def __init__(self, *args, **kw):
            made.append(self)
            super().__init__(*args, **kw)

    monkeypatch.setattr(ranks, "DDP", DDP)
    train.train(config(data_dir, tmp_path, max_steps=4, eval_interval=2, save_interval=2, input="affine",
                       dist_timeout=7.0))
    assert [g["timeout"] for g in groups] == [timedelta(minutes=7)] and not train.dist.is_initialized()
    writes = [e for e in events if e.endswith(".pt")]
    assert {"best.pt", "ckpt.pt"} <= set(writes)
    assert events == ["scan", "barrier"] + [e for w in writes for e in (w, "barrier")]
    assert getattr(made[0], "forward_sync_buffers", getattr(made[0], "broadcast_buffers", None)) is False
    model = made[0].module
    built = dict(GPT(model.config).named_buffers())
    assert built.keys() == {"rope_cos", "rope_sin", "embed.A", "embed.b", "embed.lift"}
    assert all(torch.equal(b, built[n]) for n, b in model.named_buffers())


# ----------------------------------------------------------------------------- failures
def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    good = tmp_path / "good"  # the state after step 4 of the same run, for comparison
    train.train(config(data_dir, good, max_steps=4, lr_decay_steps=10, save_interval=4))
    forward, calls = train.GPT.forward, []

    def poisoned(self, idx, targets=None, cache=None):
        logits, loss = forward(self, idx, targets, cache)
        if self.training:
            calls.append(1)
            if len(calls) > 5:  # the 6th training forward: step 6
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(train.GPT, "forward", poisoned)
    bad = tmp_path / "bad"
    args = [f"--data_dir={data_dir}", f"--out_dir={bad}", "--preset=tiny", "--block_size=32", "--batch_size=8",
            "--max_steps=10", "--lr=3e-3", "--min_lr=3e-4", "--warmup_steps=3", "--eval_interval=5",
            "--eval_steps=2", "--save_interval=4", "--device=cpu", "--seed=7", "--lr_decay_steps=10"]
    assert run_main(train.main, args) == 1
    err = capsys.readouterr().err
    assert "non-finite loss (nan) at step 6" in err and str(bad / "ckpt.pt") in err and "(step 4)" in err
    assert torch.load(bad / "ckpt.pt", weights_only=True)["step"] == 4
    # ckpt.pt holds the state after step 4 exactly: equal to a clean 4-step run with the same schedule
    wg, wb = weights(good), weights(bad)
    assert all(torch.equal(wg[k], wb[k]) for k in wg)
    assert train_log(bad, "diverged")[0]["step"] == 6


def expect_error(cfg, match, exc=(ValueError, OSError)):
    with pytest.raises(exc) as info:
        train.train(cfg)
    assert match in str(info.value), str(info.value)
    return str(info.value)


def test_bad_data_dirs_name_the_file(data_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    expect_error(config(empty, tmp_path / "o"), str(empty))  # no meta.json
    assert "meta.json" in expect_error(config(tmp_path / "nowhere", tmp_path / "o"), "nowhere")
    # meta.json listing no shards / no val shards / a missing shard
    d = copy_data(data_dir, tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    for splits, what in [({"train": {"shards": []}, "val": {"shards": []}}, "malformed"),
                         ({**meta["splits"], "val": {"shards": [], "tokens": 0}}, "no val shards"),
                         ({**meta["splits"], "val": {"shards": ["val_000009.bin"], "tokens": 1}}, "val_000009.bin")]:
        (d / "meta.json").write_text(json.dumps({**meta, "splits": splits}))
        expect_error(config(d, tmp_path / "o"), what)
        assert str(d) in expect_error(config(d, tmp_path / "o"), "")


@pytest.mark.parametrize("damage", ["magic", "truncated"])
def test_bad_shards_name_the_file(data_dir, tmp_path, damage):
    d = copy_data(data_dir, tmp_path)
    shard = d / "train_000000.bin"
    raw = shard.read_bytes()
    shard.write_bytes(b"NOTTOKEN" + raw[8:] if damage == "magic" else raw[:-100])
    with pytest.raises(ShardError, match=str(shard)):
        train.train(config(d, tmp_path / "o"))


def test_tokens_beyond_the_vocabulary_name_the_shard(data_dir, tmp_path):
    msg = expect_error(config(data_dir, tmp_path, vocab_size=300), str(data_dir / "train_000000.bin"))
    assert "vocab_size 300" in msg and "meta.json" in msg


def test_checkpoints_of_another_shape_name_the_file(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train.train(config(data_dir, out, max_steps=2))
    ckpt_path = out / "ckpt.pt"
    msg = expect_error(config(data_dir, out, max_steps=4, n_embd=64, resume=True), str(ckpt_path))
    assert "n_embd=32 (asked 64)" in msg
    # weights that do not fit the checkpoint's own model_config
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["model_config"]["n_layer"] = 3
    torch.save(ckpt, tmp_path / "other.pt")
    expect_error(config(data_dir, tmp_path / "ft", init_from=str(tmp_path / "other.pt")), str(tmp_path / "other.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    expect_error(config(data_dir, tmp_path / "ft", init_from=str(tmp_path / "junk.pt")), str(tmp_path / "junk.pt"))
    expect_error(config(data_dir, tmp_path / "fresh", resume=True), str(tmp_path / "fresh" / "ckpt.pt"))
    (tmp_path / "weights_only").mkdir()  # e.g. what convert.py writes: weights, no training state
    torch.save({k: ckpt[k] for k in ("model", "tokenizer")} | {"model_config": torch.load(ckpt_path)["model_config"]},
               tmp_path / "weights_only" / "ckpt.pt")
    assert "--init_from" in expect_error(config(data_dir, tmp_path / "weights_only", resume=True), "no training state")
    assert os.listdir(tmp_path / "weights_only") == ["ckpt.pt"]  # refused before the claim: no lock file written
    # through the command line: a clear one-line error, exit status 1
    assert run_main(train.main, [f"--data_dir={data_dir}", f"--out_dir={out}", "--resume", "--n_layer=5", "--device=cpu"]) == 1
    assert f"error: {ckpt_path}" in capsys.readouterr().err


# ----------------------------------------------------------------------------- nothing lost, nothing silent
def test_a_fresh_run_never_replaces_a_checkpoint(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path, max_steps=5))
    before = files(tmp_path)
    assert {"ckpt.pt", "best.pt", "log.jsonl"} <= before.keys()
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=3))
    assert (rc, out, err) == (1, "", f"error: {tmp_path / 'ckpt.pt'} exists: continue that run with --resume, "
                                     "or start afresh and replace it with --overwrite\n")
    assert files(tmp_path) == before
    train.train(config(data_dir, tmp_path, max_steps=3, overwrite=True))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 3


def test_bad_devices_are_one_error_line(data_dir, tmp_path, capsys):
    assert run_main(train.main, flags(data_dir, tmp_path, device="bogus")) == 1
    assert capsys.readouterr().err == "error: unknown device 'bogus': use auto, cpu, cuda, cuda:N or mps\n"
    if not torch.cuda.is_available():  # a CPU build
        assert run_main(train.main, flags(data_dir, tmp_path, device="cuda")) == 1
        assert capsys.readouterr().err == "error: device 'cuda' asked for, but this PyTorch build sees no CUDA GPU: use --device cpu\n"
    assert not tmp_path.joinpath("ckpt.pt").exists()


@pytest.mark.parametrize("name", ["max_steps", "eval_interval", "save_interval", "warmup_steps"])
def test_negative_counts_are_refused_not_read_as_never(data_dir, tmp_path, capsys, name):
    assert run_main(train.main, flags(data_dir, tmp_path, **{name: -1})) == 1
    assert capsys.readouterr().err == f"error: {name} must be 0 or more, got -1\n"
    assert not tmp_path.joinpath("ckpt.pt").exists()


def test_the_default_data_dir_says_how_to_make_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main(train.main, ["--device=cpu"]) == 1
    assert capsys.readouterr().err == ("error: data/shakespeare: no meta.json; prepare the data first "
                                       "(`python prepare_data.py shakespeare` writes the default, data/shakespeare)\n")


def test_a_diverged_state_is_never_saved(data_dir, tmp_path, capsys):
    # --lr=1e6 --save_interval=1 from scratch: step 1's weights are finite but huge; nothing is written
    fresh = tmp_path / "fresh"
    assert run_main(train.main, flags(data_dir, fresh, lr=1e6, save_interval=1, eval_interval=0)) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: validation diverged: loss \S+ above 2 ln V = 12\.48 at step 1: stopped without saving; "
                        r"the last good checkpoint is untouched: none was written\. Most likely at fault: --lr 1e\+06, "
                        r"during the warmup \(below its peak\): try a lower --lr, or --grad_clip\.\n", err), err
    assert not (fresh / "ckpt.pt").exists() and train_log(fresh, "diverged")[0]["step"] == 1
    # the same on a resumed run: its last checkpoint survives byte for byte and still resumes
    run = tmp_path / "run"
    train.train(config(data_dir, run, max_steps=4, lr_decay_steps=10))
    good = (run / "ckpt.pt").read_bytes()
    # lr 1e10, far past where the first resumed update ruins the weights (1e6 is borderline: on some data
    # step 5 still passes its one-batch validation check and step 6 fails)
    assert run_main(train.main, flags(data_dir, run, max_steps=10, resume=True, lr=1e10, save_interval=1)) == 1
    assert f"at step 5: stopped without saving; the last good checkpoint is untouched: {run / 'ckpt.pt'} (step 4)" in capsys.readouterr().err
    assert (run / "ckpt.pt").read_bytes() == good
    s = train.train(config(data_dir, run, max_steps=6, lr_decay_steps=10, resume=True))
    assert s["steps"] == 6 and s["final_val_loss"] < 6.3


def test_a_divergence_names_the_setting_most_likely_at_fault(data_dir, tmp_path):
    """--weight_decay 1e30 (AdamW's decoupled decay then multiplies each matrix by 1 - lr x wd, about -3e27) once
    suggested a lower --lr: the message names the weight decay, from the run's own settings, and no lr change."""
    rc, out, err = cli(*flags(data_dir, tmp_path, weight_decay=1e30, eval_interval=0))
    assert (rc, err.count("\n")) == (1, 1) and err.startswith("error: ") and "at step 2: stopped without saving" in err
    assert err.endswith("Most likely at fault: --weight_decay 1e+30: AdamW's decoupled decay scales each weight "
                        "matrix by 1 - lr x weight_decay = -3e+27 a step, which zeroes or flips it: use a weight decay "
                        "far below 1 / lr = 333.3 (0.1 is usual).\n"), err
    assert "--lr" not in err and not (tmp_path / "ckpt.pt").exists()


@pytest.mark.parametrize("settings, step, fault", [
    (dict(lr=1e-3, weight_decay=1e30, warmup_steps=3), 2, "--weight_decay 1e+30: "),
    (dict(lr=1.0, weight_decay=10, warmup_steps=3), 2, "--weight_decay 10: "),  # both extreme: the decay's is worse
    (dict(lr=1e6, weight_decay=0.1, warmup_steps=3), 1, "--lr 1e+06, during the warmup (below its peak): "),
    (dict(lr=1e6, weight_decay=0.1, warmup_steps=3), 5, "--lr 1e+06: try"),  # past the warmup, but no moderate lr
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=0), 1, "--warmup_steps 0: the run diverged 1 step(s) after its "
                                                         "warmup reached --lr 0.006: a longer warmup (e.g. "
                                                         "--warmup_steps 100)"),
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=50), 80, "--warmup_steps 50: the run diverged 30 step(s) after"),
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=50), 101, "--lr 0.006: try a lower --lr, or --grad_clip"),
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=50), 20, "--lr 0.006, during the warmup (below its peak): "),
])
def test_the_likely_fault_follows_the_runs_settings(settings, step, fault):
    from bincode_gpt.stopping import likely_fault

    assert likely_fault(SimpleNamespace(**settings), step).startswith(fault)


def test_resume_on_data_of_another_tokenizer_says_so(data_dir, tmp_path, capsys):
    train.train(config(data_dir, tmp_path / "run", max_steps=2))
    d = copy_data(data_dir, tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "encoding": "r50k_base"}))
    ckpt = tmp_path / "run" / "ckpt.pt"
    before = ckpt.read_bytes()
    assert run_main(train.main, flags(d, tmp_path / "run", max_steps=4, resume=True)) == 1
    assert capsys.readouterr().err == (f"error: {ckpt}: trained on gpt2 tokens at vocab_size 512, ids 0 and 511 reserved, but "
                                       f"{d / 'meta.json'} says r50k_base at vocab_size 512, ids 0 and 511 reserved: prepare the data "
                                       "with --encoding gpt2 --vocab_size 512\n")
    assert ckpt.read_bytes() == before
    expect_error(config(d, tmp_path / "ft", init_from=str(ckpt)), "says r50k_base at vocab_size 512")


def test_a_second_run_into_a_busy_out_dir_is_refused(data_dir, tmp_path):
    """Two real processes, one out_dir: the second is refused by name and pid; the first finishes intact."""
    first = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *flags(data_dir, tmp_path, max_steps=100000,
                              eval_interval=0, save_interval=0, log_interval=1)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in first.stdout:
        if line.startswith("step 2/"):
            break
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=3))
    assert (rc, out, err) == (1, "", f"error: {tmp_path} is being written by another process (pid {first.pid}); "
                                     "wait for it to finish or choose another folder\n")
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=3, overwrite=True))  # not even with --overwrite
    assert rc == 1 and err.startswith(f"error: {tmp_path} is being written by another process")
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    steps = [e["step"] for e in train_log(tmp_path)]
    assert len(train_log(tmp_path, "start")) == 1 and steps == list(range(1, steps[-1] + 1))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == steps[-1]


def test_a_save_killed_with_sigkill_leaves_a_temp_file_the_next_run_removes(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path, max_steps=2, eval_interval=0))
    good = (tmp_path / "ckpt.pt").read_bytes()
    (tmp_path / "ckpt.pt.tmp_notes").write_text("the user's file")  # not a temp file of ours: kept
    kill_mid_save = ("import os, signal, sys, torch, train\n"
                     "def save(obj, f):\n    f.write(b'half a checkpoint'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
                     "torch.save = save\nsys.exit(train.main(sys.argv[1:]))\n")
    killed = subprocess.run([sys.executable, "-c", kill_mid_save, *flags(data_dir, tmp_path, max_steps=4, eval_interval=0,
                             resume=True)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    left = sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name)
    assert len(left) == 2 and re.fullmatch(r"ckpt\.pt\.tmp\d+", left[0]) and left[1] == "ckpt.pt.tmp_notes"
    assert (tmp_path / "ckpt.pt").read_bytes() == good
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=4, eval_interval=0, resume=True))
    assert (rc, err) == (0, ""), err
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == ["ckpt.pt.tmp_notes"]
    assert (tmp_path / "ckpt.pt.tmp_notes").read_text() == "the user's file"
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 4


def test_a_fresh_run_keeps_the_log_of_a_run_that_saved_nothing(data_dir, tmp_path):
    assert run_main(train.main, flags(data_dir, tmp_path, lr=1e6, save_interval=1, eval_interval=0)) == 1  # diverges
    log = (tmp_path / "log.jsonl").read_bytes()
    assert b'"diverged"' in log and not (tmp_path / "ckpt.pt").exists()
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=2))
    assert (rc, out, err) == (1, "", f"error: {tmp_path / 'log.jsonl'} holds the log of an earlier run, which saved no "
                                     "checkpoint: keep it by choosing another out_dir, or replace it with --overwrite\n")
    assert (tmp_path / "log.jsonl").read_bytes() == log
    assert cli(*flags(data_dir, tmp_path, max_steps=2, overwrite=True))[0] == 0
    assert not train_log(tmp_path, "diverged") and train_log(tmp_path)[-1]["step"] == 2


def test_an_overwrite_leaves_no_best_pt_of_the_replaced_run(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path, max_steps=5))
    assert (tmp_path / "best.pt").is_file()
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=2, n_layer=1, eval_interval=0, overwrite=True))
    assert (rc, err) == (0, ""), err
    assert sorted(files(tmp_path)) == ["ckpt.pt", "log.jsonl"]
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["model_config"]["n_layer"] == 1


def test_bfloat16_on_a_cpu_trains_in_bfloat16(data_dir, tmp_path):
    """--dtype bfloat16 autocasts on the CPU too: other losses than float32's, all finite."""
    losses = {}
    for dtype in ("float32", "bfloat16"):
        rc, out, err = cli(*flags(data_dir, tmp_path / dtype, max_steps=4, eval_interval=0, dtype=dtype))
        assert (rc, err) == (0, "") and f"1 process(es) on cpu, {dtype} |" in out, err
        losses[dtype] = [e["loss"] for e in train_log(tmp_path / dtype)]
    assert all(map(math.isfinite, losses["bfloat16"])) and len(losses["bfloat16"]) == 4
    assert all(abs(a - b) > 1e-7 for a, b in zip(losses["float32"], losses["bfloat16"]))
    assert max(abs(a - b) for a, b in zip(losses["float32"], losses["bfloat16"])) < 0.05  # the same run, rounded


def test_resume_on_other_data_is_refused(data_dir, tmp_path):
    d = copy_data(data_dir, tmp_path)
    run = tmp_path / "run"
    train.train(config(d, run, max_steps=2))
    before = files(run)
    (tmp_path / "other.txt").write_text("another corpus entirely, prepared into the same folder\n" * 400)
    assert run_main(prepare_data.main, [str(tmp_path / "other.txt"), "--out", str(d), "--overwrite", "--vocab_size", "512",
                                        "--workers", "1"]) == 0
    saved = torch.load(run / "ckpt.pt", weights_only=True)["data"]["fingerprint"]
    rc, out, err = cli(*flags(d, run, max_steps=4, resume=True))
    assert (rc, out) == (1, "")
    assert re.fullmatch(rf"error: {re.escape(str(run / 'ckpt.pt'))} was reading other data than {re.escape(str(d))} now "
                        rf"holds \(fingerprint {saved}, now [0-9a-f]{{16}}: meta.json or the shards changed\): its saved "
                        r"position would index other windows. Resume on the data it was reading, or start from its "
                        r"weights with --init_from\n", err), err
    assert files(run) == before
    # a checkpoint written before fingerprints still resumes, and says it cannot check
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    del ckpt["data"]["fingerprint"]
    torch.save(ckpt, run / "ckpt.pt")
    rc, out, err = cli(*flags(data_dir, run, max_steps=3, resume=True))
    assert (rc, err) == (0, f"note: {run / 'ckpt.pt'} predates data fingerprints: cannot check that {data_dir} holds "
                            "the data it was reading\n")


def test_resume_beside_the_same_text_prepared_elsewhere_continues(data_dir, tmp_path):
    """The data is its content, not the path its text was read from: a run resumes on the same text prepared again
    from another path (to the same steps and weights as an unbroken run), and a checkpoint whose fingerprint
    hashed meta.json's paths too (before) still resumes where it was made."""
    whole = train.train(config(data_dir, tmp_path / "whole", max_steps=6))
    train.train(config(data_dir, tmp_path / "run", max_steps=3))
    text = shutil.copy(data_dir.parent / "corpus.txt", tmp_path / "moved.txt")
    prepare([str(text)], str(tmp_path / "again"), vocab_size=512, workers=1, progress=False)
    assert json.loads((tmp_path / "again" / "meta.json").read_text())["inputs"] == [str(text)]
    resumed = train.train(config(tmp_path / "again", tmp_path / "run", max_steps=6, resume=True))
    assert resumed["final_val_loss"] == whole["final_val_loss"]
    a, b = (torch.load(tmp_path / r / "ckpt.pt", weights_only=True)["model"] for r in ("whole", "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    ckpt["data"]["fingerprint"] = run_dir.data_fingerprint(str(tmp_path / "again"), legacy=True)
    torch.save(ckpt, tmp_path / "run" / "ckpt.pt")
    assert train.train(config(tmp_path / "again", tmp_path / "run", max_steps=7, resume=True))["steps"] == 7


def test_fine_tuning_a_tokenizer_json_model_on_tiktoken_data_is_refused(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path / "run", max_steps=1, eval_interval=0))
    release = tmp_path / "release"
    release.mkdir()
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    torch.save({"model": ckpt["model"], "model_config": ckpt["model_config"],
                "tokenizer": {"kind": "hf", "file": "tokenizer.json"}}, release / "ckpt.pt")
    rc, out, err = cli(*flags(data_dir, tmp_path / "ft", init_from=release / "ckpt.pt"))
    assert (rc, out) == (1, "")
    assert err == (f"error: {release / 'ckpt.pt'}: its tokenizer is a tokenizer.json ('tokenizer.json'), but "
                   f"{data_dir / 'meta.json'} says the data was made with tiktoken's gpt2: the same ids would mean other "
                   "text. prepare_data.py writes tiktoken data only, so this model cannot be trained on it here\n")
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize("argv, message", [
    (["--grad_clip=nan"], "grad_clip must be a finite number >= 0 (0: no clipping), got nan"),
    (["--grad_clip=-1"], "grad_clip must be a finite number >= 0 (0: no clipping), got -1.0"),
    (["--lr=inf"], "lr must be a finite number >= 0, got inf"),
    (["--lr=1e39"], "lr must be a finite number >= 0, got 1e+39"),  # past float32, which AdamW's update uses
    (["--beta2=1"], "beta2 must be in [0, 1), got 1.0"),
    (["--min_lr=1e-2"], "min_lr 0.01 is above lr 0.003: the cosine decays from lr down to min_lr"),
    (["--resume", "--init_from=x.pt"], "--resume continues out_dir's ckpt.pt and --init_from starts afresh from another "
                                       "checkpoint's weights: pass one of them"),
    (["--init_from="], "--init_from is '' (empty): name a file"),
    (["--seed=-1"], "seed must be in [0, 2**63), got -1"),  # failed mid-run: numpy's order takes no negative seed
    (["--rope_base=0"], "preset 'tiny' with vocab_size 512 (from {meta} unless --vocab_size): rope_base must be a number "
                        "> 1 (the rotary base, 10000 in most models), got 0.0"),
    (["--rope_base=-5"], "preset 'tiny' with vocab_size 512 (from {meta} unless --vocab_size): rope_base must be a number "
                         "> 1 (the rotary base, 10000 in most models), got -5.0"),
])
def test_settings_that_cannot_work_are_refused_not_turned_off(data_dir, tmp_path, capsys, argv, message):
    assert run_main(train.main, flags(data_dir, tmp_path / "out") + argv) == 1
    assert capsys.readouterr().err == f"error: {message.format(meta=data_dir / 'meta.json')}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, counts, advice", [
    ("--n_layer=1000000000", "12,288,000,016,384 parameters", "train a smaller model"),
    ("--batch_size=1000000000", "logits of 1,000,000,000 x 32 tokens", r"--batch_size [\d]+ fits \(--grad_accum keeps "
                                                                       r"the tokens a step\)")])
def test_a_run_that_cannot_fit_is_refused_before_building(data_dir, tmp_path, capsys, flag, counts, advice):
    """A billion layers built for hours; a billion sequences ended in the OOM killer (exit -9). The refusal names
    the largest micro-batch that fits (memory.largest_batch)."""
    assert run_main(train.main, flags(data_dir, tmp_path) + [flag]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(rf"error: this run needs about [\d,.]+ GiB \(.*{counts}.*\), but [\d,.]+ GiB is free on cpu: "
                        rf"{advice}\n", err), err
    assert not tmp_path.joinpath("ckpt.pt").exists()


def test_a_grad_clip_of_nan_is_refused_on_the_command_line(data_dir, tmp_path):
    assert cli(*flags(data_dir, tmp_path, grad_clip="nan")) == (
        1, "", "error: grad_clip must be a finite number >= 0 (0: no clipping), got nan\n")


def test_rank_without_torchrun(data_dir, tmp_path):
    """Some cluster shells set RANK alone: one process, said once; a WORLD_SIZE > 1 without torchrun is refused."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    run = subprocess.run([sys.executable, str(ROOT / "train.py"), *flags(data_dir, tmp_path / "a", max_steps=1)],
                         env={**env, "RANK": "3"}, capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stderr) == (0, "note: the environment sets RANK=3 but not LOCAL_RANK, WORLD_SIZE: not a "
                                               "torchrun launch, so this is one process\n")
    assert "1 process(es) on cpu" in run.stdout
    run = subprocess.run([sys.executable, str(ROOT / "train.py"), *flags(data_dir, tmp_path / "b", max_steps=1)],
                         env={**env, "RANK": "3", "WORLD_SIZE": "4"}, capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout, run.stderr) == (1, "", "error: the environment sets WORLD_SIZE=4 but not LOCAL_RANK: "
                                                               "start multi-process runs with torchrun\n")


@pytest.mark.parametrize("damage, message", [
    (lambda c: c["data"].pop("position"), "cannot resume: 'data' has no whole-number 'position' >= 0 (a checkpoint of "
                                          "another program or version?); start from its weights with --init_from"),
    (lambda c: c.update(rng={"torch": 1}), "cannot resume: 'rng' is not a list of RNG states (torch, cuda, python, numpy) "
                                          "per process (a checkpoint of another program or version?); start from its "
                                          "weights with --init_from"),
    (lambda c: c.update(step="4"), "cannot resume: 'step' is not a whole number >= 0 (a checkpoint of another program or "
                                   "version?); start from its weights with --init_from"),
    (lambda c: c.update(model_config=list(c["model_config"].values())),
     "its 'model_config' entry is not a dict of GPTConfig fields (a list)"),
    (lambda c: c.update(tokenizer=["gpt2"]), "unknown tokenizer entry ['gpt2']"),
    (lambda c: c["rng"][0].update(numpy=[1, 2]), "its RNG state of rank 0 is unreadable (not enough values to unpack "
                                                  "(expected 5, got 2))"),
])
def test_a_checkpoint_of_another_shape_is_one_line_naming_the_entry(data_dir, tmp_path, capsys, damage, message):
    train.train(config(data_dir, tmp_path, max_steps=1, eval_interval=0))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    damage(ckpt)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    capsys.readouterr()
    assert run_main(train.main, flags(data_dir, tmp_path, max_steps=2, resume=True)) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'ckpt.pt'}: {message}\n"


@pytest.mark.parametrize("fault", ["second Ctrl-C", "full disk"])
def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, capsys, fault):
    train.train(config(data_dir, tmp_path, max_steps=4, eval_interval=100))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "log.jsonl"}

    def save_and_fail(obj, f):
        f.write(b"the first half of a checkpoint")
        if fault == "full disk":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.kill(os.getpid(), signal.SIGINT)  # stop after this step ...
        os.kill(os.getpid(), signal.SIGINT)  # ... no, now: KeyboardInterrupt mid-write

    monkeypatch.setattr(train.torch, "save", save_and_fail)
    rc = run_main(train.main, flags(data_dir, tmp_path, max_steps=8, eval_interval=100, resume=True))
    err = capsys.readouterr().err
    if fault == "full disk":
        assert (rc, err) == (1, f"error: {tmp_path / 'ckpt.pt'}: not written (the disk is full: No space left on device); "
                                f"kept as they were: {tmp_path / 'ckpt.pt'}, {tmp_path / 'best.pt'}\n")
    else:
        assert rc == 130 and err.endswith("SIGINT: finishing this step, saving, then exiting\ninterrupted\n"), err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "log.jsonl"} == before  # no temp file left
    monkeypatch.undo()
    assert train.train(config(data_dir, tmp_path, max_steps=6, eval_interval=100, resume=True))["steps"] == 6


def test_a_reader_that_leaves_does_not_stop_training(data_dir, tmp_path):
    """python train.py ... | head -n 2: the run goes on without its stdout, saves every checkpoint and ends."""
    p = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *flags(data_dir, tmp_path, max_steps=40, save_interval=20,
                                                                         eval_interval=20, log_interval=1)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("2 layers x 32") and p.stdout.readline().startswith("step 0: val loss")
    p.stdout.close()  # head has read its two lines
    err = p.stderr.read()
    assert p.wait(timeout=300) == 0
    assert err == "note: stdout was closed by its reader; the run goes on, its log and checkpoints are the record\n"
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 40
    assert [e["step"] for e in train_log(tmp_path)] == list(range(1, 41)) and train_log(tmp_path, "end")[0]["steps"] == 40


def test_init_from_a_nan_checkpoint_names_the_tensor(data_dir, tmp_path, capsys):
    train.train(config(data_dir, tmp_path / "a", max_steps=2))
    ckpt = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)
    ckpt["model"]["blocks.1.mlp.fc.weight"][3, 4] = float("nan")
    torch.save(ckpt, tmp_path / "nan.pt")
    assert run_main(train.main, flags(data_dir, tmp_path / "b", init_from=tmp_path / "nan.pt")) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'nan.pt'} holds NaN or inf values in blocks.1.mlp.fc.weight: "
                                       "refusing to train from a diverged or corrupt checkpoint\n")
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="torchrun on Linux")
def test_two_nodes_of_one_process_equal_one_node_of_two(data_dir, tmp_path):
    """docs/usage.md's two-node launch (c10d rendezvous), both 'nodes' on localhost over gloo: the same losses,
    bit for bit, as --standalone with two processes on one node."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    common = dict(batch_size=4, max_steps=3, eval_interval=0, save_interval=0, log_interval=1)
    run = [sys.executable, "-m", "torch.distributed.run"]
    nodes = [subprocess.Popen(run + ["--nnodes=2", "--nproc_per_node=1", f"--node_rank={r}", "--rdzv_backend=c10d",
                                     f"--rdzv_endpoint=localhost:{port}", "--rdzv_id=two-nodes", str(ROOT / "train.py"),
                                     *flags(data_dir, tmp_path / "nodes", **common)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    one = subprocess.run(run + ["--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
                                *flags(data_dir, tmp_path / "one", **common)], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    for node in nodes:
        assert node.wait(timeout=300) == 0, node.stderr.read()[-3000:]
    losses = [[e["loss"] for e in train_log(tmp_path / d)] for d in ("nodes", "one")]
    assert losses[0] == losses[1] and len(losses[0]) == 3
    assert train_log(tmp_path / "nodes", "start")[0]["world_size"] == 2


# ----------------------------------------------------------------------------- command line
def test_command_line(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    for f in train.TrainConfig.__dataclass_fields__:
        assert f"--{f}" in help_text
    cfg = train.parse_config(["--compile", "--no-resume", "--bias=false", "--dropout=0.1", "--max_steps=5e3",
                              "--pad_token_id=none", "--peak_flops=1e12", "--init_from=x.pt"])
    assert cfg == replace(train.TrainConfig(), compile=True, resume=False, bias=False, dropout=0.1, max_steps=5000,
                          peak_flops=1e12, init_from="x.pt")
    assert train.parse_config(["--compile=false", "--resume=true"]).resume is True
    with pytest.raises(SystemExit):
        train.parse_config(["--compile=maybe"])


def test_lr_schedule():
    cfg = train.TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    lrs = [train.lr_at(s, cfg) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55) and lrs[110] == lrs[119] == 0.1
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    cfg = train.TrainConfig(lr=5e-5)  # --lr alone: min_lr follows it (lr / 10), no contradiction with a fixed default
    preflight.resolve_settings(cfg)
    assert cfg.min_lr == 5e-6


def test_preset_that_does_not_fit_the_data_says_why(data_dir, tmp_path):
    # the paper preset's <pad> id 57344 does not exist in a 512-token vocabulary taken from meta.json
    msg = expect_error(config(data_dir, tmp_path, preset="paper", block_size=None), "pad_token_id 57344")
    assert str(data_dir / "meta.json") in msg


def test_no_pad_row_on_a_token_the_data_can_produce(data_dir, tmp_path, monkeypatch, capsys):
    """An all-zeros <pad> row on an id the data's tokenizer produces would feed that token in as a constant
    vector (the rule above model.BinaryCodeInput). A tiktoken vocabulary has no <pad>, so a preset's <pad>
    (the paper preset's 57344, the released tokenizer's) is dropped with a note, an explicit one is refused,
    and one past the data's ids (a model vocabulary larger than the data's) stays."""
    meta = json.loads((data_dir / "meta.json").read_text())
    paper = config(data_dir, tmp_path, preset="paper", block_size=None)
    assert preflight.model_config(paper, {**meta, "vocab_size": 65536}, None, "x").pad_token_id is None
    assert preflight.model_config(replace(paper, vocab_size=65536), meta, None, "x").pad_token_id == 57344  # past id 511
    expect_error(config(data_dir, tmp_path, pad_token_id=5), "--pad_token_id 5 is a token of the data's tokenizer")
    monkeypatch.setitem(train.PRESETS, "tiny", {**train.PRESETS["tiny"], "pad_token_id": 5})
    train.train(config(data_dir, tmp_path, max_steps=1, eval_interval=1))
    assert "preset tiny's pad_token_id 5 (the released tokenizer's <pad>) is a token of this data's tokenizer" in capsys.readouterr().out
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["model_config"]["pad_token_id"] is None
    assert torch.equal(ckpt["model"]["embed.weight"], canonical_code(512))


@pytest.mark.parametrize("reserve_zero", [False, True])
def test_deep_binary_model_on_windows_that_start_with_the_formerly_zero_coded_token(tmp_path, reserve_zero):
    """GPT-2's id 0 is "!": its code is all zeros, a window that starts with it keeps a zero residual
    stream in a bias-free model, and a deep binary model diverges on it (docs/zero-code.md). With id 0
    reserved for the NUL byte (prepare_data.py's default), "!" has a nonzero code and the same training
    stays finite. Every window here starts with "!"; 32 layers x 32, lr 2e-3, train.py's own loop."""
    enc = get_tokenizer("gpt2", 512, reserve_zero)
    bang, = enc.encode_ordinary("!")
    assert bang == (188 if reserve_zero else 0)
    T, n = 32, 64
    body = enc.encode_ordinary(("the quick brown fox, jumps over the lazy dog. " * 400).replace("!", "."))
    ids = np.array([t for k in range(n) for t in [bang, *body[k * (T - 1):(k + 1) * (T - 1)]]] + [bang])
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        write_shard(data / f"{split}_000000.bin", ids)
    (data / "meta.json").write_text(json.dumps({
        "version": 1, "encoding": "gpt2", "vocab_size": 512, "eot_token": 511, "reserve_zero": reserve_zero,
        "dtype": "uint16", "splits": {s: {"shards": [f"{s}_000000.bin"], "tokens": len(ids)} for s in ("train", "val")}}))
    cfg = config(data, tmp_path / "out", n_layer=32, n_embd=32, n_head=2, block_size=T, batch_size=8, max_steps=20,
                 lr=2e-3, min_lr=2e-4, warmup_steps=2, eval_interval=0, save_interval=0, seed=0, bias=False, input="binary")
    if reserve_zero:
        assert train.train(cfg)["steps"] == 20
        assert all(math.isfinite(e["grad_norm"]) for e in train_log(tmp_path / "out"))
    else:
        with pytest.raises(FloatingPointError, match="non-finite gradient norm"):
            train.train(cfg)


def test_windows_that_start_with_a_constant_input_are_counted_before_the_first_step(tmp_path, capsys):
    """Data prepared before end-of-text left the all-ones code (--no-reserve_ones, many short documents):
    before the first step train.py says how many training windows start with a token a bias-free binary
    model reads as a constant vector, and the command that prepares the data again; that command, run as
    printed, gives data with no such window. A learned input or a model with biases: nothing to say."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"Letter {i}. " + "My dear sister, the ball was long. " * (i % 4)}) + "\n"
                            for i in range(400)))
    data, out = tmp_path / "data", tmp_path / "out"
    assert run_main(prepare_data.main, [str(docs), "--out", str(data), "--vocab_size", "512", "--workers", "1",
                                        "--no-reserve_ones"]) == 0
    tokens = shards.read_shard(data / "train_000000.bin")
    n = (len(tokens) - 1) // 32
    count = int((tokens[: n * 32 : 32] == 511).sum())  # windows of 33 tokens at stride 32 (tiny: block_size 32)
    assert count > 10
    capsys.readouterr()
    assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0)) == 0
    command = f"python prepare_data.py {docs} --out {data} --encoding gpt2 --vocab_size 512 --overwrite"
    assert capsys.readouterr().err == (
        f"warning: {count:,} of {n:,} training windows start with token id 511 (end-of-text), which this model (no "
        "biases, binary input) reads as a constant vector: a deep model diverges on them (docs/zero-code.md); prepare "
        f"the data with the ids that keep text off them: {command}\n")
    for quiet in (dict(input="learned"), dict(bias=True)):
        assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0, overwrite=True, **quiet)) == 0
        assert capsys.readouterr().err == ""
    assert run_main(prepare_data.main, [*command.split()[2:], "--workers", "1"]) == 0
    assert shards.load_meta(data)["eot_token"] == 187
    capsys.readouterr()
    assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0, overwrite=True, input="affine")) == 0
    assert capsys.readouterr().err == ""


def test_the_re_prepare_command_names_the_recorded_source_or_says_it_is_unknown(tmp_path, capsys, monkeypatch):
    """Data prepared from a relative path in another folder (by the real command line there): the command train.py
    prints names the file as meta.json records it, a path from any folder; data whose meta.json records no inputs
    (prepared before it did, from a relative path) gets a command that says its inputs are unknown."""
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"Letter {i}. " + "My dear sister. " * (i % 3)})
                                                 + "\n" for i in range(300)))
    made = subprocess.run([sys.executable, str(ROOT / "prepare_data.py"), "docs.jsonl", "--out", "data", "--vocab_size",
                           "512", "--workers", "1", "--no-reserve_ones"], cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    data, meta_path = tmp_path / "data", tmp_path / "data" / "meta.json"
    assert json.loads(meta_path.read_text())["inputs"] == [str(tmp_path / "docs.jsonl")]
    monkeypatch.chdir(ROOT)
    fix = "prepare the data with the ids that keep text off them: python prepare_data.py"
    for inputs in (str(tmp_path / "docs.jsonl"), "'<INPUTS: unknown, its meta.json does not record them>'"):
        capsys.readouterr()
        assert run_main(train.main, flags(data, tmp_path / "out", max_steps=1, eval_interval=0, overwrite=True)) == 0
        assert f"{fix} {inputs} --out {data} --encoding gpt2 --vocab_size 512 --overwrite\n" in capsys.readouterr().err
        old = {k: v for k, v in json.loads(meta_path.read_text()).items() if k != "inputs"}
        meta_path.write_text(json.dumps({**old, "sources": ["docs.jsonl"]}))


def test_a_training_step_holds_one_logits_sized_buffer_through_backward(data_dir, tmp_path, monkeypatch):
    """Backward keeps one batch x block_size x V buffer (~4 GiB at the paper preset, batch 16): model.CrossEntropy's,
    the logits' own memory turned into their gradient. Forward returns no logits to hold another, and no other
    layer saves one for backward."""
    forward, returned, saved = GPT.forward, [], []

    def tracked(model, idx, targets=None, cache=None):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            logits, loss = forward(model, idx, targets, cache)
        if targets is not None and torch.is_grad_enabled():  # a training step, not a check or the scan
            returned.append(logits)
            saved.append(sizes.count(idx.numel() * model.config.vocab_size))
        return logits, loss

    monkeypatch.setattr(GPT, "forward", tracked)
    train.train(config(data_dir, tmp_path, max_steps=2, grad_accum=2, eval_interval=0, save_interval=0))
    assert returned == [None] * 4 and saved == [1] * 4
