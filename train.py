"""
Train the binary-code GPT of model.py on token shards written by prepare_data.py.

    python train.py --preset=small --data_dir=data/shakespeare                         # one CPU or GPU
    torchrun --standalone --nproc_per_node=8 train.py --preset=paper --data_dir=data/paper  # DDP
    python train.py --preset=small --data_dir=data/shakespeare --resume                # continue out/ckpt.pt

Design choices, up front:
- Every setting is a field of one dataclass, TrainConfig; the command line is generated from its fields
  (--name=value; bools as --flag, --no-flag or --flag=true/false; optional fields take "none").
  `train(cfg) -> summary` and `main(argv)` are importable.
- Model shape, lowest to highest precedence: the preset, the checkpoint's model_config (--resume or
  --init_from), explicit overrides (--n_layer=...). vocab_size comes from the data's meta.json unless a
  checkpoint or --vocab_size says otherwise; every shard's largest token id is checked once at load.
- Data: each split is cut into windows of block_size+1 tokens at stride block_size (never across a
  shard boundary). Training reads an endless stream of windows: epoch e is a permutation of all of
  them drawn from (seed, e). A step takes the G = batch_size*grad_accum*world_size stream positions
  [p, p+G); rank r's micro-step m takes the batch_size positions from p + (r*grad_accum + m)*batch_size.
  So ranks read disjoint windows, a global batch is the same however it is split into processes and
  micro-steps, and a checkpoint only needs p (= step*G while the batch size is unchanged).
  Validation uses the same eval_steps*batch_size*world_size windows, spread evenly over the val
  split, at every evaluation; the loss is averaged over ranks.
- Determinism: a checkpoint holds weights, AdamW state, stream position and every RNG state (torch,
  CUDA, python, numpy; one set per rank), so on a CPU a run stopped and resumed logs the same losses,
  bit for bit, as one never stopped. The LR schedule depends on lr_decay_steps (default max_steps),
  not on where a run stops.
- Checkpoints (out_dir/ckpt.pt latest, out_dir/best.pt best val loss) are plain-typed dicts built by
  model.checkpoint_dict from the unwrapped, uncompiled module, written to a temp file, then os.replace.
- A non-finite loss or gradient norm stops the run before the optimizer step, without saving, so the
  last checkpoint stays the last good state. SIGINT/SIGTERM finish the current step, save and exit 0;
  under DDP the stop flag is all-reduced with the loss, so every rank stops at the same step.
- Precision: bf16 autocast on CUDA, plain float32 elsewhere. Optional torch.compile. Gradient
  accumulation skips DDP's all-reduce (no_sync) on all but the last micro-step.
"""

import argparse
import json
import math
import os
import random
import signal
import sys
import threading
import time
import typing
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig, checkpoint_dict, get_config, load_weights, read_checkpoint
from prepare_data import ShardError, load_meta, read_shard

MODEL_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "input", "layout", "affine_seed",
                "pad_token_id", "rope_base", "bias", "dropout")
# dense bf16 peak FLOP/s of one device, matched against torch.cuda.get_device_name (longest name first)
PEAK_FLOPS = {"B200": 2250e12, "H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def opt(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    # data and output
    data_dir: str = opt("data/shakespeare", "folder written by prepare_data.py (meta.json + shards)")
    out_dir: str = opt("out", "where ckpt.pt, best.pt and log.jsonl go")
    preset: str = opt("small", "model preset from model.PRESETS: paper | small | tiny")
    # model overrides: None keeps the checkpoint's value (resume/init_from), else the preset's;
    # vocab_size None takes the data's meta.json
    vocab_size: int | None = opt(None, "model vocabulary (default: meta.json's)")
    block_size: int | None = opt(None, "context length (training sequence length)")
    n_layer: int | None = opt(None, "decoder blocks")
    n_head: int | None = opt(None, "attention heads")
    n_embd: int | None = opt(None, "model width")
    input: str | None = opt(None, "input interface: binary | affine | learned")
    layout: str | None = opt(None, "how K code bits fill n_embd dims: tile | interleave")
    affine_seed: int | None = opt(None, "seed of the affine recoding's A and b")
    pad_token_id: int | None = opt(None, "token whose binary code row is all zeros")
    rope_base: float | None = opt(None, "rotary base")
    bias: bool | None = opt(None, "biases in Linear and LayerNorm")
    dropout: float | None = opt(None, "dropout probability (may differ from a checkpoint's)")
    # optimisation
    batch_size: int = opt(16, "sequences per micro-step per process")
    grad_accum: int = opt(1, "micro-steps per optimizer step")
    max_steps: int = opt(2000, "optimizer steps to train for (in total, counting resumed ones)")
    lr: float = opt(6e-4, "peak learning rate")
    min_lr: float = opt(6e-5, "learning rate at the end of the cosine decay")
    warmup_steps: int = opt(100, "linear warmup steps")
    lr_decay_steps: int | None = opt(None, "step where the cosine reaches min_lr (default: max_steps)")
    weight_decay: float = opt(0.1, "AdamW weight decay (matrices only)")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.95, "AdamW beta2")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)")
    # evaluation, logging, checkpoints
    eval_interval: int = opt(250, "evaluate every this many steps, and at the end (0: never)")
    eval_steps: int = opt(20, "validation batches per process per evaluation")
    log_interval: int = opt(10, "print a log line every this many steps (log.jsonl gets every step)")
    save_interval: int = opt(250, "write ckpt.pt every this many steps (0: only at the end or on a signal)")
    # system
    seed: int = opt(1337, "seed of the model init, the data order and dropout")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N | mps (under torchrun: cuda:LOCAL_RANK)")
    dtype: str = opt("auto", "auto | float32 | bfloat16 (bf16 autocast on CUDA; auto: bf16 where supported)")
    compile: bool = opt(False, "torch.compile the model")
    peak_flops: float | None = opt(None, "peak FLOP/s of one device for MFU (default: a table of GPUs; none on CPU)")
    resume: bool = opt(False, "continue from out_dir/ckpt.pt (model, optimizer, step, data position, RNG)")
    init_from: str | None = opt(None, "start from this checkpoint's weights (fine-tuning): fresh optimizer, step 0")


# ----------------------------------------------------------------------------- command line
def parse_bool(s):
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def parse_int(s):
    x = float(s)  # accepts 5000 and 5e3
    if not x.is_integer():
        raise ValueError(s)
    return int(x)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        kinds = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        kind = {int: parse_int, bool: parse_bool}.get(kinds[0], kinds[0])
        if type(None) in typing.get_args(hints[f.name]):  # optional: "none" means unset
            kind = (lambda k: lambda s: None if s.lower() in ("none", "null") else k(s))(kind)
            kind.__name__ = kinds[0].__name__
        help = f.metadata["help"]
        if kinds[0] is bool:
            p.add_argument(f"--{f.name}", nargs="?", const=True, type=kind, default=f.default, metavar="BOOL",
                           help=f"{help}; --no-{f.name} turns it off")
            p.add_argument(f"--no-{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
        else:
            p.add_argument(f"--{f.name}", type=kind, default=f.default, help=help)
    return p


def parse_config(argv=None) -> TrainConfig:
    return TrainConfig(**vars(build_parser().parse_args(argv)))


# ----------------------------------------------------------------------------- data
class Split:
    """The windows of block_size+1 tokens of one split, at stride block_size, inside each shard."""

    def __init__(self, folder, meta, split, block_size, vocab_size):
        names = meta["splits"].get(split, {}).get("shards", [])
        if not names:
            raise ShardError(f"{os.path.join(folder, 'meta.json')}: no {split} shards listed")
        self.block = block_size
        self.paths = [os.path.join(folder, n) for n in names]
        self.shards = [read_shard(path) for path in self.paths]  # ShardError names a bad file
        for path, tokens in zip(self.paths, self.shards):
            top = int(tokens.max()) if len(tokens) else -1  # one pass over the data, once
            if top >= vocab_size:
                raise ValueError(f"{path}: holds token id {top}, beyond the model's vocab_size {vocab_size} "
                                 f"({os.path.join(folder, 'meta.json')} says vocab_size {meta['vocab_size']})")
        counts = [max(0, (len(t) - 1) // block_size) for t in self.shards]
        self.starts = np.cumsum([0] + counts)  # index of each shard's first window
        self.n = int(self.starts[-1])
        if self.n == 0:
            raise ShardError(f"{folder}: the {split} split has no shard of block_size+1 = {block_size + 1} tokens")

    def batch(self, windows, device):
        """(B,) window ids -> inputs, targets: two (B, block_size) int64 tensors on device."""
        shard = np.searchsorted(self.starts, windows, side="right") - 1
        offset = (windows - self.starts[shard]) * self.block
        rows = np.stack([self.shards[s][o : o + self.block + 1] for s, o in zip(shard, offset)]).astype(np.int64)
        x, y = torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)


@lru_cache(maxsize=2)
def epoch_order(seed, epoch, n):
    return np.random.default_rng([seed, epoch]).permutation(n)


def stream_windows(position, count, n, seed):
    """Window ids at positions [position, position+count) of the endless training stream."""
    pos = np.arange(position, position + count)
    out = np.empty(count, dtype=np.int64)
    for epoch in np.unique(pos // n):
        here = pos // n == epoch
        out[here] = epoch_order(seed, int(epoch), n)[pos[here] % n]
    return out


def micro_batch_start(position, rank, micro, batch_size, grad_accum):
    """First stream position read by `rank` in micro-step `micro` of the step starting at `position`."""
    return position + (rank * grad_accum + micro) * batch_size


def eval_windows(n, total):
    """The fixed validation windows: `total` of them spread evenly over the n windows of the split."""
    return (np.arange(total) * n) // total


@torch.no_grad()
def evaluate(model, val, cfg, rank, world, device, autocast):
    model.eval()
    ids = eval_windows(val.n, cfg.eval_steps * cfg.batch_size * world)
    total = torch.zeros((), device=device)
    for k in range(cfg.eval_steps):
        start = (rank * cfg.eval_steps + k) * cfg.batch_size
        x, y = val.batch(ids[start : start + cfg.batch_size], device)
        with autocast:
            total += model(x, y)[1].float()
    model.train()
    if world > 1:
        dist.all_reduce(total)
    return total.item() / (cfg.eval_steps * world)


# ----------------------------------------------------------------------------- helpers
def lr_at(step, cfg):
    """Linear warmup to lr, then cosine decay to min_lr at lr_decay_steps (default max_steps)."""
    decay = cfg.lr_decay_steps or cfg.max_steps
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= decay:
        return cfg.min_lr
    ratio = (step - cfg.warmup_steps) / max(1, decay - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


def rng_state(device):
    """Every RNG this process uses, as plain types (tensors and lists) that weights_only loading accepts."""
    py, np_state = random.getstate(), np.random.get_state()
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]}


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))


def model_config(cfg, meta, ckpt, path):
    """The preset, then the checkpoint's config, then explicit overrides; a clash with a checkpoint is an error."""
    asked = {k: getattr(cfg, k) for k in MODEL_FIELDS if getattr(cfg, k) is not None}
    if ckpt is None:
        try:
            return get_config(cfg.preset, **{"vocab_size": meta["vocab_size"], **asked})
        except ValueError as e:  # e.g. the paper preset's pad_token_id 57344 with a smaller vocabulary
            raise ValueError(f"preset {cfg.preset!r} with vocab_size {asked.get('vocab_size', meta['vocab_size'])} "
                             f"(from {os.path.join(cfg.data_dir, 'meta.json')} unless --vocab_size): {e}") from None
    theirs = ckpt["model_config"]
    clash = [f"{k}={theirs.get(k)!r} (asked {v!r})" for k, v in asked.items() if k != "dropout" and theirs.get(k) != v]
    if clash:
        raise ValueError(f"{path}: the checkpoint has another shape than this run asks for: {', '.join(clash)}")
    try:
        return replace(GPTConfig(**theirs), **asked)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad model_config in checkpoint: {e}") from None


class GracefulStop:
    """SIGINT/SIGTERM set a flag that the loop checks after each step; a second SIGINT stops at once."""

    def __enter__(self):
        self.requested, self.old = False, {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{signal.Signals(signum).name}: finishing this step, saving, then exiting", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


def peak_flops(cfg, device):
    if cfg.peak_flops:
        return cfg.peak_flops
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in sorted(PEAK_FLOPS.items(), key=lambda kv: -len(kv[0])) if k in name), None)
    return None


def pick_device(name, local_rank, distributed):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and distributed:
        name = f"cuda:{local_rank}"
    return torch.device(name)


# ----------------------------------------------------------------------------- training
def train(cfg: TrainConfig) -> dict:
    """Train as cfg says; returns a summary (steps, tokens, first/final/best val loss, ...)."""
    distributed = "RANK" in os.environ  # launched by torchrun
    rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if distributed else (0, 0, 1)
    device = pick_device(cfg.device, local_rank, distributed)
    if distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return _train(cfg, rank, world, device, distributed)
    finally:
        if distributed:
            dist.destroy_process_group()


def _train(cfg, rank, world, device, distributed):
    t_start, master = time.time(), rank == 0
    for name in ("batch_size", "grad_accum", "eval_steps", "log_interval"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {cfg.dtype!r}")
    use_amp = device.type == "cuda" and dtype == "bfloat16"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_amp else nullcontext()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    # checkpoint to start from, data, model
    meta = load_meta(cfg.data_dir)  # ShardError naming the folder if meta.json or a shard is missing
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    source = ckpt_path if cfg.resume else cfg.init_from
    ckpt = read_checkpoint(source) if source else None
    mcfg = model_config(cfg, meta, ckpt, source)
    if mcfg.vocab_size != meta["vocab_size"] and master:
        print(f"note: model vocab_size {mcfg.vocab_size} differs from the data's {meta['vocab_size']}")
    train_split = Split(cfg.data_dir, meta, "train", mcfg.block_size, mcfg.vocab_size)
    val_split = Split(cfg.data_dir, meta, "val", mcfg.block_size, mcfg.vocab_size)

    torch.manual_seed(cfg.seed + rank)  # rank 0's init is every rank's (DDP broadcasts it); dropout differs
    raw = GPT(mcfg).to(device)
    if ckpt is not None:
        load_weights(raw, ckpt["model"], source)
    optimizer = raw.configure_optimizers(cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), device.type)
    core = torch.compile(raw) if cfg.compile else raw
    model = DDP(core, device_ids=[device.index] if device.type == "cuda" else None) if distributed else core

    G = cfg.batch_size * cfg.grad_accum * world  # windows per optimizer step
    step = position = 0
    best_val, eval_done_at = None, None
    if cfg.resume:
        if not {"optimizer", "step", "data", "rng"} <= ckpt.keys():
            raise ValueError(f"{source}: holds weights but no training state to resume; start from it with --init_from")
        optimizer.load_state_dict(ckpt["optimizer"])
        step, position, best_val = ckpt["step"], ckpt["data"]["position"], ckpt["best_val_loss"]
        eval_done_at = ckpt.get("eval_step")
        if len(ckpt["rng"]) == world:
            set_rng_state(ckpt["rng"][rank], device)
        elif master:
            print(f"note: {source} was written by {len(ckpt['rng'])} processes, not {world}: RNG streams reseeded")
    saved_at = step if cfg.resume else None
    tokenizer = {"kind": "tiktoken", "encoding": meta["encoding"], "vocab_size": meta["vocab_size"]}
    flops, peak = raw.flops_per_token(mcfg.block_size), peak_flops(cfg, device)

    def save(path, val_loss):
        rngs = [None] * world
        if distributed:
            dist.all_gather_object(rngs, rng_state(device))
        else:
            rngs = [rng_state(device)]
        if not master:
            return
        state = checkpoint_dict(raw, tokenizer, optimizer=optimizer.state_dict(), step=step, rng=rngs,
                                data={"position": position, "global_batch": G, "windows": train_split.n,
                                      "epoch": position // train_split.n, "seed": cfg.seed},
                                train_config=asdict(cfg), best_val_loss=best_val, val_loss=val_loss,
                                eval_step=eval_done_at, world_size=world)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    if master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        if not cfg.resume and os.path.exists(ckpt_path):
            print(f"note: starting afresh; overwriting {ckpt_path}")
        log_file = open(os.path.join(cfg.out_dir, "log.jsonl"), "a" if cfg.resume else "w")
        n = raw.num_params()
        print(f"{mcfg.n_layer} layers x {mcfg.n_embd}, input={mcfg.input}, vocab {mcfg.vocab_size}: "
              f"{n['trainable']:,} trainable, {n['frozen']:,} frozen values | {world} process(es) on {device}, {dtype} | "
              f"{G * mcfg.block_size:,} tokens/step, {train_split.n:,} train windows/epoch | "
              f"{'resuming at' if cfg.resume else 'starting at'} step {step}")

    def record(**entry):
        if master:
            log_file.write(json.dumps(entry) + "\n")
            log_file.flush()

    record(event="start", step=step, world_size=world, device=str(device), train_config=asdict(cfg),
           model_config=asdict(mcfg))
    first_val = last_val = train_loss = None
    stopping = False
    window_t, window_start, step_times = time.time(), 0, []
    try:
        with GracefulStop() as stop:
            while True:
                # evaluate, checkpoint: the state after `step` optimizer steps
                if cfg.eval_interval > 0 and (step % cfg.eval_interval == 0 or step >= cfg.max_steps) and step != eval_done_at:
                    last_val = evaluate(core, val_split, cfg, rank, world, device, autocast)
                    first_val = last_val if first_val is None else first_val
                    eval_done_at = step
                    improved = best_val is None or last_val < best_val
                    best_val = last_val if improved else best_val
                    record(event="eval", step=step, val_loss=last_val, best_val_loss=best_val)
                    if master:
                        print(f"step {step}: val loss {last_val:.4f}{' (best)' if improved else ''}")
                    if improved and step > 0:
                        save(os.path.join(cfg.out_dir, "best.pt"), last_val)
                if step >= cfg.max_steps or stopping:
                    if saved_at != step:
                        save(ckpt_path, last_val if eval_done_at == step else None)
                    break
                if cfg.save_interval > 0 and step % cfg.save_interval == 0 and saved_at != step and step > 0:
                    save(ckpt_path, last_val if eval_done_at == step else None)
                    saved_at = step

                # one optimizer step
                t0 = time.time()
                lr = lr_at(step, cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss_sum = torch.zeros((), device=device)
                for micro in range(cfg.grad_accum):
                    start = micro_batch_start(position, rank, micro, cfg.batch_size, cfg.grad_accum)
                    x, y = train_split.batch(stream_windows(start, cfg.batch_size, train_split.n, cfg.seed), device)
                    last_micro = micro == cfg.grad_accum - 1
                    with model.no_sync() if distributed and not last_micro else nullcontext():
                        with autocast:
                            _, loss = model(x, y)
                        (loss / cfg.grad_accum).backward()
                    loss_sum += loss.detach().float()
                flags = torch.stack([loss_sum / cfg.grad_accum, torch.tensor(float(stop.requested), device=device)])
                if distributed:
                    dist.all_reduce(flags)
                    flags[0] /= world
                train_loss, stopping = flags[0].item(), flags[1].item() > 0
                norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip).item() if cfg.grad_clip > 0 else None
                if not math.isfinite(train_loss) or (norm is not None and not math.isfinite(norm)):
                    record(event="nonfinite", step=step + 1, loss=train_loss, grad_norm=norm)
                    last = f"{ckpt_path} (step {saved_at})" if saved_at is not None else "none was written"
                    raise FloatingPointError(
                        f"non-finite {'loss' if not math.isfinite(train_loss) else 'gradient norm'} "
                        f"({train_loss if not math.isfinite(train_loss) else norm}) at step {step + 1}: stopped without "
                        f"saving; the last good checkpoint is untouched: {last}. Try a lower --lr or --grad_clip.")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step, position = step + 1, position + G

                # log
                dt = time.time() - t0
                tok_s = G * mcfg.block_size / dt
                mfu = flops * tok_s / (peak * world) if peak else None
                record(event="train", step=step, loss=train_loss, lr=lr, grad_norm=norm, dt=dt, tokens_per_s=tok_s,
                       mfu=mfu, tokens=position * mcfg.block_size)
                step_times.append(dt)
                if master and (step % cfg.log_interval == 0 or step == cfg.max_steps or stopping):
                    window = step_times[window_start:]  # tokens/s over these steps' time; the ETA counts evals too
                    tok_s = len(window) * G * mcfg.block_size / sum(window)
                    eta = (cfg.max_steps - step) * (time.time() - window_t) / len(window)
                    window_start, window_t = len(step_times), time.time()
                    mfu_s = f" | mfu {100 * flops * tok_s / (peak * world):.1f}%" if peak else ""
                    print(f"step {step}/{cfg.max_steps} | loss {train_loss:.4f} | lr {lr:.2e} | "
                          f"{tok_s:,.0f} tok/s{mfu_s} | eta {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m{int(eta % 60):02d}s",
                          flush=True)
        summary = {"steps": step, "tokens": position * mcfg.block_size, "first_val_loss": first_val,
                   "final_val_loss": last_val, "best_val_loss": best_val, "final_train_loss": train_loss,
                   "interrupted": stopping and step < cfg.max_steps, "wall_s": time.time() - t_start,
                   "tokens_per_s": G * mcfg.block_size * len(step_times) / sum(step_times) if step_times else None,
                   "out_dir": cfg.out_dir}
        record(event="end", **summary)
    finally:
        if master:
            log_file.close()

    if master:
        print(f"done: step {step}, {summary['tokens']:,} tokens, val loss {last_val}, best {best_val}; "
              f"{summary['wall_s']:.0f}s; checkpoint {ckpt_path}")
    return summary


def main(argv=None) -> int:
    cfg = parse_config(argv)
    try:
        train(cfg)
    except (ValueError, OSError, FloatingPointError) as e:  # ShardError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
