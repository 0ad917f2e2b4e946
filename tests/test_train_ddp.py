"""Tests of train.py under torchrun (gloo on the CPU): two processes equal gradient accumulation, every rank
waits for rank 0's writes, two nodes equal one, a RANK set without torchrun."""

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import train
from bincode_gpt import ranks, run_dir, shards
from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.shards import Split
from model import GPT
# the run's helpers, and its autouse fixture one_thread (one thread a process)
from test_train import config, flags, one_thread, ROOT, train_log, weights  # noqa: F401 (one_thread)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through /proc")
def test_two_gloo_processes_stopped_by_sigterm_equal_gradient_accumulation(data_dir, tmp_path):
    common = dict(batch_size=4, eval_interval=1, save_interval=0, warmup_steps=2, lr_decay_steps=6, log_interval=1)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(ROOT / "train.py"),
                             *flags(data_dir, tmp_path / "two", grad_accum=1, max_steps=1000, **common)],
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
    run = SimpleNamespace(model=model, start=SimpleNamespace(val_split=val), cfg=cfg, rank=0, world=1,
                          device=torch.device("cpu"), autocast=train.nullcontext())  # what train.evaluate reads
    assert train.evaluate(run) == pytest.approx(v2, abs=1e-6)


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
    init, barrier, save, scan = (train.dist.init_process_group, train.dist.barrier, run_dir.atomic_torch_save,
                                 Split.check_window_starts)
    monkeypatch.setattr(train.dist, "init_process_group", lambda *a, **kw: groups.append(kw) or init(*a, **kw))
    monkeypatch.setattr(train.dist, "barrier", lambda *a, **kw: events.append("barrier") or barrier(*a, **kw))
    monkeypatch.setattr(run_dir, "atomic_torch_save", lambda obj, path: events.append(os.path.basename(path))
                        or save(obj, path))
    monkeypatch.setattr(Split, "check_window_starts", lambda *a: events.append("scan") or scan(*a))

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


def test_rank_without_torchrun(data_dir, tmp_path):
    """Some cluster shells set RANK alone: one process, said once; a WORLD_SIZE > 1 without torchrun is refused."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    run = subprocess.run([sys.executable, str(ROOT / "train.py"), *flags(data_dir, tmp_path / "a", max_steps=1)],
                         env={**env, "RANK": "3"}, capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stderr) == (0, "note: the environment sets RANK=3 but not LOCAL_RANK, WORLD_SIZE: "
                                               "not a torchrun launch, so this is one process\n")
    assert "1 process(es) on cpu" in run.stdout
    run = subprocess.run([sys.executable, str(ROOT / "train.py"), *flags(data_dir, tmp_path / "b", max_steps=1)],
                         env={**env, "RANK": "3", "WORLD_SIZE": "4"}, capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout, run.stderr) == (1, "", "error: the environment sets WORLD_SIZE=4 but not "
                                                               "LOCAL_RANK: start multi-process runs with torchrun\n")


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
                                *flags(data_dir, tmp_path / "one", **common)],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    for node in nodes:
        assert node.wait(timeout=300) == 0, node.stderr.read()[-3000:]
    losses = [[e["loss"] for e in train_log(tmp_path / d)] for d in ("nodes", "one")]
    assert losses[0] == losses[1] and len(losses[0]) == 3
    assert train_log(tmp_path / "nodes", "start")[0]["world_size"] == 2
