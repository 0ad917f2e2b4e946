"""Tests of train.py's run and its log: learning, the pinned 30-step trajectory, the data order, checkpoints,
the settings on the command line. Refusals are in test_train_settings.py, resume in test_resume.py, torchrun in
test_train_ddp.py; the package's parts of a run in test_run_dir.py, test_divergence.py, test_shards.py.

Everything runs on the CPU with the 'tiny' preset on a slice of tiny Shakespeare tokenized at vocab 512.
"""

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

import conftest
import train
from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.files import LOCK_NAME
from model import GPT, GPTConfig
from prepare_data import prepare

ROOT = Path(__file__).resolve().parent.parent  # the repository's
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


# test_run_dir.py imports the data_dir fixture (conftest.py's) from here
data_dir = conftest.data_dir


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


# ----------------------------------------------------------------------------- learning, and what the log says
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


# ----------------------------------------------------------------------------- the data order
def test_ranks_and_micro_steps_read_disjoint_windows():
    B, A, W, n = 4, 3, 2, 50
    for step in range(5):  # crosses epoch boundaries (G = 24 > n / 2)
        p = step * B * A * W
        starts = {(r, m): train.micro_batch_start(p, r, m, B, A) for r in range(W) for m in range(A)}
        positions = sorted(s + i for s in starts.values() for i in range(B))
        assert positions == list(range(p, p + B * A * W))  # the step's positions, each exactly once
        # one process with 2A micro-steps reads the same positions as W=2 processes with A each
        assert sorted(train.micro_batch_start(p, 0, m, B, A * W) + i
                      for m in range(A * W) for i in range(B)) == positions
    # windows: each epoch is a permutation of all n windows, another one per epoch, same for the same seed
    e0, e1 = train.training_order(0, n, n, seed=1), train.training_order(n, n, n, seed=1)
    assert sorted(e0) == sorted(e1) == list(range(n)) and not np.array_equal(e0, e1)
    assert np.array_equal(train.training_order(10, 60, n, 1), np.concatenate([e0, e1])[10:70])
    rank0 = train.training_order(train.micro_batch_start(0, 0, 0, B, 1), B, n, 1)
    rank1 = train.training_order(train.micro_batch_start(0, 1, 0, B, 1), B, n, 1)
    assert not set(rank0) & set(rank1)


# ----------------------------------------------------------------------------- checkpoints, devices, stdout
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


def test_init_from_weights_saved_through_wrappers(data_dir, tmp_path, capsys):
    train.train(config(data_dir, tmp_path / "a", max_steps=4))
    ckpt = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)
    model = {f"_orig_mod.module.{k}": t for k, t in ckpt["model"].items()}  # torch.compile(DDP(model))'s
    torch.save({"model": model, "model_config": ckpt["model_config"], "tokenizer": ckpt["tokenizer"]},
               tmp_path / "wrapped.pt")
    capsys.readouterr()
    s = train.train(config(data_dir, tmp_path / "b", max_steps=2, init_from=str(tmp_path / "wrapped.pt"),
                           eval_interval=100))
    assert s["first_val_loss"] == pytest.approx(train_log(tmp_path / "a", "eval")[-1]["val_loss"], abs=0)
    note = (f"note: {tmp_path / 'wrapped.pt'}: its weights were saved from a wrapped model (torch.compile, DDP): "
            "read without their '_orig_mod.' and 'module.' prefixes\n")
    assert capsys.readouterr().err.count(note) == 1


BEFORE_THE_OPTIMIZER = """
import runpy, sys
from model import GPT
build = GPT.configure_optimizers
def configure_optimizers(*args, **kwargs):  # train.py's set-up has built the model and checked the start
    print("dynamo before the optimizer:", sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
    return build(*args, **kwargs)
GPT.configure_optimizers = configure_optimizers
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_init_from_without_compile_never_imports_dynamo(data_dir, tmp_path):
    """train.py --init_from (its weights checked against a model built on the meta device) imports no
    torch._dynamo (~0.8 s of modules) until it builds its optimizer when --compile is off: torch.optim's
    constructor imports it (add_param_group is wrapped in torch._disable_dynamo), and nothing before."""
    train.train(config(data_dir, tmp_path / "a", max_steps=1, eval_interval=100))
    args = flags(data_dir, tmp_path / "b", max_steps=1, eval_interval=100, init_from=str(tmp_path / "a" / "ckpt.pt"))
    run = subprocess.run([sys.executable, "-c", BEFORE_THE_OPTIMIZER, str(ROOT / "train.py"), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "dynamo before the optimizer: []\n" in run.stdout


def expect_error(cfg, match, exc=(ValueError, OSError)):
    with pytest.raises(exc) as info:
        train.train(cfg)
    assert match in str(info.value), str(info.value)
    return str(info.value)


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


def test_a_reader_that_leaves_does_not_stop_training(data_dir, tmp_path):
    """python train.py ... | head -n 2: the run goes on without its stdout, saves every checkpoint and ends."""
    argv = flags(data_dir, tmp_path, max_steps=40, save_interval=20, eval_interval=20, log_interval=1)
    p = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *argv],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("2 layers x 32") and p.stdout.readline().startswith("step 0: val loss")
    p.stdout.close()  # head has read its two lines
    err = p.stderr.read()
    assert p.wait(timeout=300) == 0
    assert err == "note: stdout was closed by its reader; the run goes on, its log and checkpoints are the record\n"
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 40
    assert [e["step"] for e in train_log(tmp_path)] == list(range(1, 41))
    assert train_log(tmp_path, "end")[0]["steps"] == 40


# ----------------------------------------------------------------------------- settings
def test_lr_schedule():
    cfg = train.TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    lrs = [train.lr_at(s, cfg) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55) and lrs[110] == lrs[119] == 0.1
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))


def test_min_lr_follows_lr(data_dir, tmp_path):
    """--lr alone: min_lr follows it (lr / 10), no contradiction with a fixed default."""
    train.train(config(data_dir, tmp_path, max_steps=1, eval_interval=0, lr=5e-5, min_lr=None))
    assert train_log(tmp_path, "start")[0]["train_config"]["min_lr"] == 5e-6


def test_every_model_field_has_an_override():
    """TrainConfig names an override of each model.GPTConfig field, of its type or None (the checkpoint's, else
    the preset's), so that the two cannot drift apart."""
    ours = {f.name: f for f in fields(train.TrainConfig)}
    for f in fields(GPTConfig):
        assert f.name in ours, f.name
        assert ours[f.name].default is None and ours[f.name].type == (f.type | None), f.name
        assert ours[f.name].metadata["help"].startswith(f"model.GPTConfig.{f.name} (default: ")


# ----------------------------------------------------------------------------- memory
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
