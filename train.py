"""
Train the binary-code GPT of model.py on token shards written by prepare_data.py.

    python prepare_data.py shakespeare && python train.py    # the small model on tiny Shakespeare: one CPU or GPU, minutes
    python train.py --resume                                  # continue out/ckpt.pt (bit for bit on a CPU)
    torchrun --standalone --nproc_per_node=8 train.py --preset=paper --vocab_size=65536 --data_dir=data/paper \
        --batch_size=16 --grad_accum=4 --compile --max_steps=2000 --warmup_steps=100 --lr=6e-4 --min_lr=6e-5 \
        --eval_interval=250 --eval_steps=20 --save_interval=250                # GPUs: DDP, GPU-sized settings

Every setting is a field of TrainConfig (`python train.py --help`); `train(cfg)` and `main(argv)` are importable.
The file reads in the order a step runs: settings, data, model and optimizer, the training loop; then what the
loop calls, in the order it first calls it (signals, the divergence rule, saving, the log); then the parts of
set-up (processes, the checks on the settings, data and checkpoint, one writer per out_dir, exact resume), each
labelled section with its rule in its docstrings.
"""

import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import atomic_torch_save, check_buildable, check_finite, checkpoint_dict, load_weights, read_checkpoint, rng_state, set_rng_state
from common import (LOCK_NAME, available_memory, config_parser, one_line, parse_settings, peak_flops, pick_device, run_main,
                    setting, writer_lock)
from model import PRESETS, GPT, GPTConfig, constant_input_ids, get_config, memory_bytes
from prepare_data import ShardError, load_meta, prepare_command, read_shard
from tokenizer import all_ones_id, reserved_note, tiktoken_entry

MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig))  # TrainConfig overrides each; None keeps the preset's
OUTPUTS = ("ckpt.pt", "best.pt", "log.jsonl")  # what a run writes in out_dir, and all it ever replaces or removes there


# ----------------------------------------------------------------------------- settings
@dataclass
class TrainConfig:
    # data and output
    data_dir: str = setting("data/shakespeare", "folder written by prepare_data.py (meta.json + shards)")
    out_dir: str = setting("out", "where ckpt.pt, best.pt and log.jsonl go (one run at a time: a second is refused)")
    preset: str = setting("small", "model preset from model.PRESETS: paper | small | tiny")
    # model overrides: None keeps the checkpoint's value (resume/init_from), else the preset's;
    # vocab_size None takes the data's meta.json
    vocab_size: int | None = setting(None, "model vocabulary (default: meta.json's)")
    block_size: int | None = setting(None, "context length (training sequence length)")
    n_layer: int | None = setting(None, "decoder blocks")
    n_head: int | None = setting(None, "attention heads")
    n_embd: int | None = setting(None, "model width")
    input: str | None = setting(None, "input interface: binary | affine | learned")
    layout: str | None = setting(None, "how K code bits fill n_embd dims: tile | interleave")
    affine_seed: int | None = setting(None, "seed of the affine recoding's A and b")
    pad_token_id: int | None = setting(None, "token whose binary code row is all zeros")
    rope_base: float | None = setting(None, "rotary base")
    bias: bool | None = setting(None, "biases in Linear and LayerNorm")
    dropout: float | None = setting(None, "dropout probability (may differ from a checkpoint's)")
    # optimisation (defaults: the small preset on a CPU in a few minutes; a GPU wants more of everything)
    batch_size: int = setting(8, "sequences per micro-step per process")
    grad_accum: int = setting(1, "micro-steps per optimizer step")
    max_steps: int = setting(200, "optimizer steps to train for (in total, counting resumed ones)")
    lr: float = setting(1e-3, "peak learning rate")
    min_lr: float | None = setting(None, "learning rate at the end of the cosine decay (default: lr / 10)")
    warmup_steps: int = setting(20, "linear warmup steps")
    lr_decay_steps: int | None = setting(None, "step where the cosine reaches min_lr (default: max_steps)")
    weight_decay: float = setting(0.1, "AdamW weight decay (matrices only)")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (0: off; negative or nan is refused)")
    # evaluation, logging, checkpoints
    eval_interval: int = setting(50, "evaluate every this many steps, and at the end (0: never)")
    eval_steps: int = setting(8, "validation batches per process per evaluation")
    log_interval: int = setting(10, "print a log line every this many steps (log.jsonl gets every step)")
    save_interval: int = setting(100, "write ckpt.pt every this many steps (0: only at the end or on a signal)")
    # system
    seed: int = setting(1337, "seed of the model init, the data order and dropout")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N | mps (under torchrun: cuda:LOCAL_RANK)")
    dtype: str = setting("auto", "auto | float32 | bfloat16 (bfloat16: autocast on CUDA or CPU, weights stay float32; "
                                 "auto: bfloat16 on a CUDA GPU that supports it, else float32)")
    compile: bool = setting(False, "torch.compile the model")
    peak_flops: float | None = setting(None, "peak FLOP/s of one device for MFU (default: a table of GPUs; none on CPU)")
    resume: bool = setting(False, "continue from out_dir/ckpt.pt (model, optimizer, step, data position, RNG)")
    overwrite: bool = setting(False, "start afresh in an out_dir that holds an earlier run: its log.jsonl and best.pt "
                                     "are removed at the start, its ckpt.pt replaced at the first save")
    init_from: str | None = setting(None, "start from this checkpoint's weights (fine-tuning): fresh optimizer, step 0")

    @property
    def ckpt_path(self):
        """out_dir's latest checkpoint: what --resume continues and every periodic save replaces."""
        return os.path.join(self.out_dir, "ckpt.pt")


def parse_config(argv=None) -> TrainConfig:
    return parse_settings(config_parser(TrainConfig, __doc__.strip().split("\n\n")[0]), argv)


# ----------------------------------------------------------------------------- data
# Each split is cut into windows of block_size+1 tokens at stride block_size, never across a shard boundary.
# Training reads the windows in an endless order: epoch e is a permutation of all of them drawn from (seed, e).
# A step takes the N = batch_size*grad_accum*world_size positions [p, p+N) of that order, each rank and
# micro-step its own batch_size of them: ranks read disjoint windows, a global batch is the same however it is
# split into processes and micro-steps, and a checkpoint only needs p (= step*N while the batch size is unchanged).
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


def training_order(position, count, n, seed):
    """Window ids at positions [position, position+count) of the endless training order."""
    pos = np.arange(position, position + count)
    out = np.empty(count, dtype=np.int64)
    for epoch in np.unique(pos // n):
        here = pos // n == epoch
        out[here] = epoch_order(seed, int(epoch), n)[pos[here] % n]
    return out


def micro_batch_start(position, rank, micro, batch_size, grad_accum):
    """First position in the training order read by `rank` in micro-step `micro` of the step starting at
    `position`: position + (rank*grad_accum + micro)*batch_size."""
    return position + (rank * grad_accum + micro) * batch_size


def windows_per_step(cfg, world):
    """N, the training windows one optimizer step reads: batch_size per micro-step, grad_accum micro-steps,
    every rank."""
    return cfg.batch_size * cfg.grad_accum * world


def lr_at(step, cfg):
    """Linear warmup to lr, then cosine decay to min_lr at lr_decay_steps (default max_steps), so the
    schedule does not depend on where a run stops."""
    decay = cfg.lr_decay_steps or cfg.max_steps
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= decay:
        return cfg.min_lr
    ratio = (step - cfg.warmup_steps) / max(1, decay - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


def eval_windows(n, total):
    """The fixed validation windows: `total` of them spread evenly over the n windows of the split."""
    return (np.arange(total) * n) // total


@torch.no_grad()
def evaluate(model, val, cfg, rank, world, device, autocast, steps=None):
    """Mean loss over the fixed validation windows (the same ones at every evaluation, each rank its share,
    averaged over ranks); `steps` < eval_steps takes the first batches of each share."""
    steps = steps or cfg.eval_steps
    model = model.module if isinstance(model, DDP) else model  # DDP's forward would sync buffers and await a backward
    model.eval()
    ids = eval_windows(val.n, cfg.eval_steps * cfg.batch_size * world)
    total = torch.zeros((), device=device)
    for k in range(steps):
        start = (rank * cfg.eval_steps + k) * cfg.batch_size
        x, y = val.batch(ids[start : start + cfg.batch_size], device)
        with autocast:
            total += model(x, y)[1].float()
    model.train()
    if world > 1:
        dist.all_reduce(total)
    return total.item() / (steps * world)


# ----------------------------------------------------------------------------- model and optimizer
@dataclass
class Run:
    """The parts of one training run that set_up builds and the loop and its checks use."""
    cfg: TrainConfig
    rank: int
    world: int
    device: torch.device
    distributed: bool  # launched by torchrun
    model: torch.nn.Module  # what forward is called on: raw_model, torch.compile'd and/or DDP-wrapped
    raw_model: GPT  # the plain module: checkpoints, clipping, the optimizer's parameters
    optimizer: torch.optim.Optimizer
    train_split: Split
    val_split: Split
    autocast: object
    tokenizer: dict  # the data's, saved with every checkpoint
    data_id: str  # the data's fingerprint (data_fingerprint), saved with every checkpoint
    log: "Log"

    @property
    def windows_per_step(self):
        return windows_per_step(self.cfg, self.world)


@dataclass
class State:
    """The loop's counters; a checkpoint holds them, so a resumed run continues each."""
    step: int = 0  # optimizer steps taken
    position: int = 0  # position of the next training window in the training order
    val_loss: float | None = None  # of the last evaluation,
    eval_step: int | None = None  # taken at this step
    first_val: float | None = None
    best_val: float | None = None
    saved_step: int | None = None  # of ckpt.pt


def set_up(cfg, rank, world, device, distributed, out_lock):
    """Check the settings, read the data and the checkpoint to start from, build model and optimizer -> Run, State.
    Rank 0 takes out_dir's writer lock into `out_lock`, an ExitStack that train() keeps open until the run ends."""
    # settings
    check_settings(cfg)
    dtype = pick_dtype(cfg, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    # data, and the checkpoint to start from (--resume or --init_from): read only, so a refusal writes nothing
    meta = load_meta(cfg.data_dir)  # ShardError naming what is missing or malformed
    source = cfg.ckpt_path if cfg.resume else cfg.init_from
    ckpt_stamp = file_stamp(source) if cfg.resume else None  # which ckpt.pt this run continues
    ckpt = read_checkpoint(source) if source else None
    if ckpt is not None:
        check_finite(ckpt["model"], source, "train from")  # names the tensor, as sample.py does
        check_tokenizer(ckpt, meta, source, cfg.data_dir)
    mcfg = model_config(cfg, meta, ckpt, source, note=print if rank == 0 else lambda text: None)
    if ckpt is not None:
        check_buildable(mcfg, ckpt["model"], source)  # a model_config of another writer may ask for a billion blocks
    check_training_fits(cfg, mcfg, world, device)  # a billion layers or sequences: refused, not built until OOM
    if mcfg.vocab_size != meta["vocab_size"] and rank == 0:
        print(f"note: model vocab_size {mcfg.vocab_size} differs from the data's {meta['vocab_size']}")
    train_split = Split(cfg.data_dir, meta, "train", mcfg.block_size, mcfg.vocab_size)
    val_split = Split(cfg.data_dir, meta, "val", mcfg.block_size, mcfg.vocab_size)
    claim_out_dir(cfg, out_lock if rank == 0 else None, ckpt_stamp)  # one writer per out_dir; nothing replaced silently

    # model and optimizer
    torch.manual_seed(cfg.seed + rank)  # rank 0's init is every rank's (DDP broadcasts it); dropout differs
    raw_model = GPT(mcfg).to(device)
    if ckpt is not None:
        load_weights(raw_model, ckpt["model"], source)
    if rank == 0:
        check_window_starts(train_split, meta, raw_model, cfg.data_dir)
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), device.type)
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if distributed:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    # precision: bf16 autocast (weights and optimizer stay float32), or plain float32
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    log = Log(cfg, rank == 0, world, mcfg.block_size, raw_model.flops_per_token(mcfg.block_size), cfg.peak_flops or peak_flops(device))
    run = Run(cfg, rank, world, device, distributed, model, raw_model, optimizer, train_split, val_split, autocast,
              tiktoken_entry(meta), data_fingerprint(cfg.data_dir, meta), log)
    state = State()
    if cfg.resume:
        restore(run, state, ckpt, source)
    if rank == 0:
        log.file = open_outputs(cfg)  # log.jsonl; an overwrite removes the replaced run's best.pt
        n = raw_model.num_params()
        print(f"{mcfg.n_layer} layers x {mcfg.n_embd}, input={mcfg.input}, vocab {mcfg.vocab_size}: "
              f"{n['trainable']:,} trainable, {n['frozen']:,} frozen values | {world} process(es) on {device}, {dtype} | "
              f"{log.tokens_per_step:,} tokens/step, {train_split.n:,} train windows/epoch | "
              f"{'resuming at' if cfg.resume else 'starting at'} step {state.step}")
    log.record(event="start", step=state.step, world_size=world, device=str(device), train_config=asdict(cfg),
               model_config=asdict(mcfg))
    return run, state


# ----------------------------------------------------------------------------- the training loop
def train(cfg: TrainConfig) -> dict:
    """Train as cfg says; returns a summary (steps, tokens, first/final/best val loss, ...)."""
    rank, world, device, distributed = start_processes(cfg)
    try:
        t_start = time.time()
        with ExitStack() as out_lock:  # out_dir's writer lock (rank 0), released when the run ends
            run, state = set_up(cfg, rank, world, device, distributed, out_lock)
            try:
                loss, stopping = loop(run, state)
                summary = {"steps": state.step, "tokens": state.position * run.raw_model.config.block_size,
                           "first_val_loss": state.first_val, "final_val_loss": state.val_loss,
                           "best_val_loss": state.best_val, "final_train_loss": loss,
                           "interrupted": stopping and state.step < cfg.max_steps, "wall_s": time.time() - t_start,
                           "tokens_per_s": run.log.tokens_per_s(), "out_dir": cfg.out_dir}
                run.log.record(event="end", **summary)
            finally:
                run.log.close()
        if rank == 0:
            print(f"done: step {state.step}, {summary['tokens']:,} tokens, val loss {state.val_loss}, "
                  f"best {state.best_val}; {summary['wall_s']:.0f}s; checkpoint {run.cfg.ckpt_path}")
        return summary
    finally:
        if distributed:
            dist.destroy_process_group()


def loop(run, state):
    """Evaluate, save, step and log until max_steps or a signal -> (last training loss, stopped by a signal)."""
    cfg, model, raw_model, optimizer, device = run.cfg, run.model, run.raw_model, run.optimizer, run.device
    loss, stopping = None, False
    with GracefulStop() as stop:  # SIGINT/SIGTERM: finish this step, save, exit 0
        while True:
            # ------------------------------------------------------------- evaluate, save, or stop
            # (the state after state.step optimizer steps)
            if (cfg.eval_interval > 0 and (state.step % cfg.eval_interval == 0 or state.step >= cfg.max_steps)
                    and state.step != state.eval_step):
                val_loss = evaluate(model, run.val_split, cfg, run.rank, run.world, device, run.autocast)
                check_val_loss(run, state, val_loss)  # a diverged state stops the run, unsaved
                improved = state.best_val is None or val_loss < state.best_val
                state.val_loss, state.eval_step = val_loss, state.step
                state.first_val = val_loss if state.first_val is None else state.first_val
                state.best_val = val_loss if improved else state.best_val
                run.log.evaluation(state, improved)
                if improved and state.step > 0:
                    save(run, state, "best.pt")  # only of a good state, atomically
            done = state.step >= cfg.max_steps or stopping
            due = cfg.save_interval > 0 and state.step % cfg.save_interval == 0 and state.step > 0
            if (done or due) and state.saved_step != state.step:
                save(run, state, "ckpt.pt")
            if done:
                break

            # ------------------------------------------------------------- one optimizer step
            t0 = time.time()
            lr = lr_at(state.step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in range(cfg.grad_accum):
                start = micro_batch_start(state.position, run.rank, micro, cfg.batch_size, cfg.grad_accum)
                x, y = run.train_split.batch(training_order(start, cfg.batch_size, run.train_split.n, cfg.seed), device)
                last_micro = micro == cfg.grad_accum - 1
                # DDP all-reduces the gradients in backward: only on the last micro-step, once they are summed
                with model.no_sync() if run.distributed and not last_micro else nullcontext():
                    with run.autocast:
                        _, loss = model(x, y)
                    (loss / cfg.grad_accum).backward()
                loss_sum += loss.detach().float()
            loss, stopping = mean_loss_and_stop(run, loss_sum / cfg.grad_accum, stop.requested)  # over ranks
            norm = None  # the global gradient norm before clipping
            if cfg.grad_clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip).item()
            check_step(run, state, loss, norm)  # a bad loss or gradient stops the run before it is applied
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state.step, state.position = state.step + 1, state.position + run.windows_per_step

            # ------------------------------------------------------------- log
            run.log.step(state, loss, norm, lr, time.time() - t0, stopping)
    return loss, stopping


# ----------------------------------------------------------------------------- signals: finish the step, save, exit 0
class GracefulStop:
    """SIGINT/SIGTERM set a flag that the loop checks after each step: it saves and exits 0. A second SIGINT
    raises KeyboardInterrupt at once (exit 130); a checkpoint being written then is dropped and the previous
    one stays. Under DDP the flag is all-reduced with the loss (mean_loss_and_stop), so every rank stops at
    the same step. torchrun itself re-raises a signal sent to it and exits 1 even when every rank saved and
    exited 0: to stop a DDP run cleanly, signal the ranks (pkill -TERM -P <torchrun pid>), and torchrun exits 0."""

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


def mean_loss_and_stop(run, loss, requested):
    """-> (the loss averaged over ranks, whether any rank was signalled), in one all-reduce, so every rank
    sees the same loss and stops at the same step."""
    flags = torch.stack([loss, torch.tensor(float(requested), device=run.device)])
    if run.distributed:
        dist.all_reduce(flags)
        flags[0] /= run.world
    return flags[0].item(), flags[1].item() > 0


# ----------------------------------------------------------------------------- divergence
def why_diverged(loss, norm, vocab_size):
    """Why a state with this loss and gradient norm cannot be trained on, or None. A state is good when its
    loss and gradient norm are finite and the loss is at most 2 ln V: an untrained model scores about ln V,
    a diverged one, finite or not, far more."""
    if not math.isfinite(loss):
        return f"non-finite loss ({loss})"
    if norm is not None and not math.isfinite(norm):
        return f"non-finite gradient norm ({norm})"
    if loss > 2 * math.log(vocab_size):
        return f"diverged: loss {loss:.4g} above 2 ln V = {2 * math.log(vocab_size):.2f}"
    return None


def stop_if_bad(run, state, why, step, **entry):
    """Stop the run (FloatingPointError, exit 1) without saving: the last checkpoint written stays good."""
    if why is None:
        return
    run.log.record(event="diverged", step=step, problem=why, **entry)
    last = f"{run.cfg.ckpt_path} (step {state.saved_step})" if state.saved_step is not None else "none was written"
    raise FloatingPointError(f"{why} at step {step}: stopped without saving; the last good checkpoint is "
                             f"untouched: {last}. Try a lower --lr or --grad_clip.")


def check_step(run, state, loss, norm):
    """A bad training loss or gradient stops the run before the optimizer step applies it."""
    why = why_diverged(loss, norm, run.raw_model.config.vocab_size)
    stop_if_bad(run, state, why, state.step + 1, loss=loss, grad_norm=norm)


def check_val_loss(run, state, loss):
    """A bad validation loss stops the run before it is recorded or saved."""
    why = why_diverged(loss, None, run.raw_model.config.vocab_size)
    stop_if_bad(run, state, why and f"validation {why}", state.step, val_loss=loss)


def check_state(run, state):
    """Stop unless the state about to be saved is good: finite weights, and its validation loss (this
    step's evaluation, else one batch's) passes `why_diverged`. Every rank takes part."""
    finite = torch.stack([p.isfinite().all() for p in run.raw_model.parameters()]).all().item()
    loss = state.val_loss if state.eval_step == state.step else None
    if finite and loss is None:
        loss = evaluate(run.model, run.val_split, run.cfg, run.rank, run.world, run.device, run.autocast, steps=1)
    why = "non-finite weights" if not finite else why_diverged(loss, None, run.raw_model.config.vocab_size)
    stop_if_bad(run, state, why and f"validation {why}", state.step)


# ----------------------------------------------------------------------------- checkpoints: save
def save(run, state, name):
    """Write out_dir/name (ckpt.pt latest, best.pt best val loss) only of a good state; every rank takes part.
    The checkpoint is a plain-typed dict (checkpoint.checkpoint_dict, from the uncompiled, unwrapped module): weights,
    AdamW state, position in the training order and every rank's RNG states, so a resumed run continues bit for
    bit. It is written atomically: a crash, a second Ctrl-C or a full disk mid-write leaves the previous file as it
    was."""
    check_state(run, state)
    rngs = [None] * run.world
    if run.distributed:
        dist.all_gather_object(rngs, rng_state(run.device))
    else:
        rngs = [rng_state(run.device)]
    if name == "ckpt.pt":
        state.saved_step = state.step
    if run.rank != 0:
        return
    cfg, path, n = run.cfg, os.path.join(run.cfg.out_dir, name), run.train_split.n
    ckpt = checkpoint_dict(run.raw_model, run.tokenizer, optimizer=run.optimizer.state_dict(), step=state.step, rng=rngs,
                           data={"position": state.position, "global_batch": run.windows_per_step, "windows": n,
                                 "epoch": state.position // n, "seed": cfg.seed, "fingerprint": run.data_id},
                           train_config=asdict(cfg), best_val_loss=state.best_val,
                           val_loss=state.val_loss if state.eval_step == state.step else None, eval_step=state.eval_step,
                           world_size=run.world)
    try:
        atomic_torch_save(ckpt, path)
    except OSError as e:  # e.g. a full disk: atomic_open left the previous files as they were
        kept = [os.path.join(cfg.out_dir, n) for n in ("ckpt.pt", "best.pt") if os.path.isfile(os.path.join(cfg.out_dir, n))]
        kept = f"kept as they were: {', '.join(kept)}" if kept else "no checkpoint of this run is on disk yet"
        raise OSError(f"{path}: not written ({e.strerror or e}); {kept}") from None


# ----------------------------------------------------------------------------- logging
@dataclass
class Log:
    """log.jsonl gets every event (rank 0 writes it); stdout a line every log_interval steps, with the
    throughput over those steps."""
    cfg: TrainConfig
    master: bool
    world: int
    block_size: int
    flops: float  # per token, for MFU
    peak: float | None  # FLOP/s of one device
    file: object = None  # log.jsonl, rank 0 only
    step_times: list = field(default_factory=list)
    window_start: int = 0  # the steps and time since the last printed line
    window_t: float = field(default_factory=time.time)

    @property
    def tokens_per_step(self):
        return windows_per_step(self.cfg, self.world) * self.block_size

    def record(self, **entry):
        if self.file:
            self.file.write(json.dumps(entry) + "\n")
            self.file.flush()

    def close(self):
        if self.file:
            self.file.close()

    def evaluation(self, state, improved):
        self.record(event="eval", step=state.step, val_loss=state.val_loss, best_val_loss=state.best_val)
        if self.master:
            print(f"step {state.step}: val loss {state.val_loss:.4f}{' (best)' if improved else ''}")

    def step(self, state, loss, norm, lr, dt, stopping):
        cfg, tokens = self.cfg, self.tokens_per_step
        mfu = self.flops * tokens / dt / (self.peak * self.world) if self.peak else None
        self.record(event="train", step=state.step, loss=loss, lr=lr, grad_norm=norm, dt=dt, tokens_per_s=tokens / dt,
                    mfu=mfu, tokens=state.position * self.block_size)
        self.step_times.append(dt)
        if self.master and (state.step % cfg.log_interval == 0 or state.step == cfg.max_steps or stopping):
            window = self.step_times[self.window_start :]  # tokens/s over these steps' time; the ETA counts evals too
            tok_s = len(window) * tokens / sum(window)
            eta = (cfg.max_steps - state.step) * (time.time() - self.window_t) / len(window)
            self.window_start, self.window_t = len(self.step_times), time.time()
            mfu_s = f" | mfu {100 * self.flops * tok_s / (self.peak * self.world):.1f}%" if self.peak else ""
            print(f"step {state.step}/{cfg.max_steps} | loss {loss:.4f} | lr {lr:.2e} | {tok_s:,.0f} tok/s{mfu_s} | "
                  f"eta {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m{int(eta % 60):02d}s", flush=True)

    def tokens_per_s(self):
        """Over all steps' time (not evaluations or saves)."""
        return self.tokens_per_step * len(self.step_times) / sum(self.step_times) if self.step_times else None


# ----------------------------------------------------------------------------- set-up's parts: processes and precision
def start_processes(cfg):
    """-> rank, world size, device, distributed. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; each rank
    gets one GPU (cuda:LOCAL_RANK unless --device names one) and joins the process group."""
    rank, local_rank, world, distributed = launch()
    device = pick_device(cfg.device)
    if distributed and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # one GPU per rank
    if distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device, distributed


def launch():
    """-> rank, local rank, world size, distributed, from the environment. A torchrun launch sets all three
    of RANK, LOCAL_RANK and WORLD_SIZE; some cluster shells set RANK alone: with WORLD_SIZE unset or 1 that
    is one process (said on stderr), with WORLD_SIZE > 1 an error (start the processes with torchrun)."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: os.environ[k] for k in names if k in os.environ}
    values = {}
    for k, v in env.items():
        if not (v.strip().isdigit() and (k != "WORLD_SIZE" or int(v) >= 1)):
            raise ValueError(f"the environment sets {k}={v!r}: expected a whole number (torchrun sets it)")
        values[k] = int(v)
    if len(env) == 3:
        if values["RANK"] >= values["WORLD_SIZE"]:
            raise ValueError(f"the environment sets RANK={values['RANK']} but WORLD_SIZE={values['WORLD_SIZE']}")
        return values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"], True
    if env:
        unset = ", ".join(k for k in names if k not in env)
        if values.get("WORLD_SIZE", 1) > 1:
            raise ValueError(f"the environment sets WORLD_SIZE={values['WORLD_SIZE']} but not {unset}: start "
                             "multi-process runs with torchrun")
        print(f"note: the environment sets {', '.join(f'{k}={v}' for k, v in env.items())} but not {unset}: "
              "not a torchrun launch, so this is one process", file=sys.stderr)
    return 0, 0, 1, False


def pick_dtype(cfg, device):
    """--dtype auto: bfloat16 on a CUDA GPU that supports it, else float32. bfloat16 is autocast on CUDA and
    CPU; elsewhere (MPS) it is refused rather than run in float32 under its name."""
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {cfg.dtype!r}")
    if dtype == "bfloat16" and device.type not in ("cuda", "cpu"):
        raise ValueError(f"--dtype bfloat16 runs on CUDA and CPU here, not on {device.type}: use --dtype float32")
    return dtype


# ----------------------------------------------------------------------------- checks on the settings
def check_settings(cfg):
    """Counts and rates in range: a value the run cannot use is refused, never read as 'off' or 'never'."""
    if cfg.min_lr is None:
        cfg.min_lr = cfg.lr / 10  # so that --lr alone never contradicts a fixed min_lr
    for name in ("batch_size", "grad_accum", "eval_steps", "log_interval"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("max_steps", "eval_interval", "save_interval", "warmup_steps"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be 0 or more, got {getattr(cfg, name)}")
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):  # finite in float32, where AdamW uses them
        if not (0 <= getattr(cfg, name) <= torch.finfo(torch.float32).max):
            raise ValueError(f"{name} must be a finite number >= 0{' (0: no clipping)' if name == 'grad_clip' else ''}, "
                             f"got {getattr(cfg, name)}")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    if not 0 <= cfg.seed < 2**63:  # numpy's data order takes no negative seed, torch none past 2**64
        raise ValueError(f"seed must be in [0, 2**63), got {cfg.seed}")
    if cfg.lr_decay_steps is not None and cfg.lr_decay_steps < 1:
        raise ValueError(f"lr_decay_steps must be at least 1 (or none: max_steps), got {cfg.lr_decay_steps}")
    if cfg.peak_flops is not None and not (math.isfinite(cfg.peak_flops) and cfg.peak_flops > 0):
        raise ValueError(f"peak_flops must be a finite number > 0 (or none), got {cfg.peak_flops}")
    if cfg.resume and cfg.overwrite:
        raise ValueError("--resume continues the checkpoint in out_dir and --overwrite replaces it: pass one of them")
    if cfg.resume and cfg.init_from is not None:
        raise ValueError("--resume continues out_dir's ckpt.pt and --init_from starts afresh from another checkpoint's "
                         "weights: pass one of them")
    if cfg.min_lr > cfg.lr:
        raise ValueError(f"min_lr {cfg.min_lr:g} is above lr {cfg.lr:g}: the cosine decays from lr down to min_lr")
    for name in ("out_dir", "init_from"):  # --data_dir: prepare_data.load_meta
        if getattr(cfg, name) == "":
            raise ValueError(f"--{name} is '' (empty): name a {'file' if name == 'init_from' else 'folder'}")


def check_training_fits(cfg, mcfg, world, device):
    """Refuse a model or batch that cannot fit, before building it, with the numbers: a lower bound of what
    training holds (weights, gradients and AdamW's two moments, 16 bytes a parameter, counting only the
    blocks' 12 n_embd^2 and the head; a micro-batch's logits at 2 bytes or more; what GPT builds besides
    its weights) against the device's free memory, and the validation windows' ids against the CPU's."""
    params = mcfg.n_layer * 12 * mcfg.n_embd**2 + mcfg.vocab_size * mcfg.n_embd
    need = 16 * params + 2 * cfg.batch_size * mcfg.block_size * mcfg.vocab_size + memory_bytes(mcfg)
    free = available_memory(device)
    if free is not None and need > free:
        raise ValueError(f"this run needs at least {need / 2**30:,.1f} GiB ({params:,} parameters with their gradients "
                         f"and AdamW state, and logits of {cfg.batch_size:,} x {mcfg.block_size:,} tokens over "
                         f"{mcfg.vocab_size:,}), but {free / 2**30:,.1f} GiB is free on {device}: train a smaller model "
                         "or batch")
    ids, free = 8 * cfg.eval_steps * cfg.batch_size * world, available_memory(torch.device("cpu"))
    if free is not None and ids > free:
        raise ValueError(f"eval_steps {cfg.eval_steps:,} x batch_size {cfg.batch_size:,} x {world} process(es) validation "
                         f"windows need {ids / 2**30:,.1f} GiB for their ids alone, but {free / 2**30:,.1f} GiB is free: "
                         "evaluate fewer batches")


def check_tokenizer(ckpt, meta, source, data_dir):
    """A token id means what the checkpoint's tokenizer says: the data must come from the same one. Data
    prepared here is tiktoken's, so a converted release (its tokenizer a tokenizer.json) is refused."""
    theirs, meta_path = ckpt.get("tokenizer"), os.path.join(data_dir, "meta.json")
    if theirs is None:
        print(f"note: {source} names no tokenizer: its token ids are taken to mean what {meta_path} says", file=sys.stderr)
        return
    if not isinstance(theirs, dict) or theirs.get("kind") not in ("tiktoken", "hf"):
        raise ValueError(f"{source}: unknown tokenizer entry {one_line(repr(theirs), 80)}")
    if theirs["kind"] == "hf":
        raise ValueError(f"{source}: its tokenizer is a tokenizer.json ({one_line(repr(theirs.get('file')), 80)}), but "
                         f"{meta_path} says the data was made with tiktoken's {meta['encoding']}: the same ids would "
                         "mean other text. prepare_data.py writes tiktoken data only, so this model cannot be trained "
                         "on it here")
    theirs, ours = tiktoken_entry(theirs), tiktoken_entry(meta)  # an old entry's missing keys: the ids it had
    if theirs != ours:
        flags = f"--encoding {theirs['encoding']} --vocab_size {theirs['vocab_size']}" + "".join(  # a reservation that
            f" --no-{k}" for k in ("reserve_zero", "reserve_ones") if not theirs[k] and tiktoken_entry({**theirs, k: True})[k])  # moves something
        raise ValueError(f"{source}: trained on {theirs['encoding']} tokens at vocab_size {theirs['vocab_size']}"
                         f"{reserved_note(theirs)}, but {os.path.join(data_dir, 'meta.json')} "
                         f"says {ours['encoding']} at vocab_size {ours['vocab_size']}{reserved_note(ours)}: "
                         f"prepare the data with {flags}")


def check_window_starts(split, meta, model, data_dir):
    """Warn, before the first step, when a bias-free binary or affine model would read training windows
    that start with a token it reads as a constant vector (model.constant_input_ids): a deep model
    diverges on a step that holds one (docs/zero-code.md). A warning, not a refusal: shallow models train
    on such data, and data prepared before the tokenizer kept text off the constant codes must still
    train and resume as it did. Names the count and, where the tokenizer's ids are the cause, the
    command that prepares the data again with the ids that keep text off them."""
    constant = constant_input_ids(model)
    if not constant:
        return
    firsts = np.concatenate([t[: n * split.block : split.block] for t, n in zip(split.shards, np.diff(split.starts))])
    hit = np.isin(firsts, constant)
    if not hit.any():
        return
    found = np.unique(firsts[hit]).tolist()
    entry = tiktoken_entry(meta)
    reserved = {0: entry["reserve_zero"], all_ones_id(meta["vocab_size"]): entry["reserve_ones"]}
    if all(reserved.get(i) is False for i in found):  # text sits there only because the data predates a default
        shard = len(split.shards[0]) if len(split.shards) > 1 else None
        fix = f"; prepare the data with the ids that keep text off them: {prepare_command(meta, data_dir, shard)}"
    else:
        fix = ("; the model's input puts them there (its pad_token_id row, or an affine A and b drawn before "
               "the affine input kept its constant codes on ids 0 and 2^K - 1)")
    names = [f"{i} (end-of-text)" if i == meta.get("eot_token") else str(i) for i in found]
    print(f"warning: {int(hit.sum()):,} of {split.n:,} training windows start with token id "
          f"{', '.join(names)}, which this model (no biases, {model.config.input} input) reads as a "
          f"constant vector: a deep model diverges on them (docs/zero-code.md){fix}", file=sys.stderr)


def model_config(cfg, meta, ckpt, path, note=print):
    """The model's shape, lowest to highest precedence: the preset (vocab_size from the data's meta.json),
    the checkpoint's model_config (--resume or --init_from), explicit overrides (--n_layer=...). An
    override that clashes with a checkpoint is an error (dropout may differ)."""
    asked = {k: getattr(cfg, k) for k in MODEL_FIELDS if getattr(cfg, k) is not None}
    if ckpt is None:
        # The rule above model.BinaryCodeInput: an all-zeros <pad> row must be an id text cannot produce. A
        # tiktoken vocabulary has no <pad>: every id below the data's vocab_size is a token or end-of-text.
        pad = asked.get("pad_token_id", PRESETS.get(cfg.preset, {}).get("pad_token_id"))
        if pad is not None and 0 <= pad < meta["vocab_size"]:
            if "pad_token_id" in asked:
                raise ValueError(f"--pad_token_id {pad} is a token of the data's tokenizer ({meta['encoding']}, "
                                 f"{meta['vocab_size']:,} ids): its code row would be all zeros, so that token would "
                                 "enter the model as a constant vector (docs/zero-code.md); leave --pad_token_id unset")
            note(f"note: preset {cfg.preset}'s pad_token_id {pad} (the released tokenizer's <pad>) is a token of "
                 "this data's tokenizer: every id keeps its own code (pad_token_id none)")
            asked["pad_token_id"] = None
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


# ----------------------------------------------------------------------------- out_dir: one writer, nothing lost
def claim_out_dir(cfg, out_lock, ckpt_stamp):
    """Make rank 0 (`out_lock`: train()'s ExitStack) out_dir's one writer until the run ends: common.writer_lock
    refuses a second run into it, even one started in the same second, and removes the temp files of a
    writer killed mid-save. What out_dir holds is checked (check_out_dir) under the lock; a folder no run
    has locked yet is checked before it too, so a refusal leaves a user's folder exactly as it was. A
    resumed run read ckpt.pt before the lock (`ckpt_stamp`: its file_stamp): another run may have saved it since."""
    if not os.path.exists(os.path.join(cfg.out_dir, LOCK_NAME)):
        check_out_dir(cfg)
    if out_lock is not None:
        out_lock.enter_context(writer_lock(cfg.out_dir, outputs=OUTPUTS))
        check_out_dir(cfg)
        if ckpt_stamp is not None and file_stamp(cfg.ckpt_path) != ckpt_stamp:
            raise ValueError(f"{cfg.ckpt_path} was replaced by another run while this one started: resume again")


def file_stamp(path):
    """Which file is at `path` now (a save replaces it with a new one), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def check_out_dir(cfg):
    """A fresh run refuses an out_dir that holds an earlier run's files: its checkpoints, or the log of a
    run that saved none (one that diverged, or was killed before its first save). --resume continues
    that run, --overwrite replaces it."""
    if cfg.resume or cfg.overwrite:
        return
    for name in OUTPUTS:
        path = os.path.join(cfg.out_dir, name)
        if os.path.exists(path) and name == "log.jsonl":
            raise ValueError(f"{path} holds the log of an earlier run, which saved no checkpoint: keep it by choosing "
                             "another out_dir, or replace it with --overwrite")
        if os.path.exists(path):
            raise ValueError(f"{path} exists: continue that run with --resume, or start afresh and replace it with --overwrite")


def open_outputs(cfg):
    """-> log.jsonl, open for this run (rank 0, under the lock): appended to by --resume, else new. An
    --overwrite also removes the replaced run's best.pt now, so the new ckpt.pt never sits beside the best
    checkpoint of another run (its ckpt.pt stays until the first save replaces it)."""
    best = os.path.join(cfg.out_dir, "best.pt")
    if cfg.overwrite and os.path.isfile(best):
        os.remove(best)
    return open(os.path.join(cfg.out_dir, "log.jsonl"), "a" if cfg.resume else "w")


# ----------------------------------------------------------------------------- resume: exactly where the checkpoint stopped
def restore(run, state, ckpt, source):
    """Continue where the checkpoint stopped: optimizer, step, data position, evaluations, RNG streams (each
    rank its own, when the number of processes is the same)."""
    if not {"optimizer", "step", "data", "rng"} <= ckpt.keys():
        raise ValueError(f"{source}: holds weights but no training state to resume; start from it with --init_from")
    check_training_state(ckpt, source)
    check_same_data(run, ckpt, source)  # the saved data position indexes the data it was reading
    try:
        run.optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
        raise ValueError(f"{source}: its optimizer state does not fit this model ({one_line(e, 120)})") from None
    state.step, state.position, state.best_val = ckpt["step"], ckpt["data"]["position"], ckpt.get("best_val_loss")
    state.eval_step, state.val_loss, state.saved_step = ckpt.get("eval_step"), ckpt.get("val_loss"), ckpt["step"]
    if len(ckpt["rng"]) == run.world:
        try:
            set_rng_state(ckpt["rng"][run.rank], run.device)
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            raise ValueError(f"{source}: its RNG state of rank {run.rank} is unreadable ({one_line(e, 120)})") from None
    elif run.rank == 0:
        print(f"note: {source} was written by {len(ckpt['rng'])} processes, not {run.world}: RNG streams reseeded")


def check_training_state(ckpt, source):
    """The entries restore reads, with the types it reads them as: a checkpoint of another writer or an
    older version is one error naming the odd entry, not a KeyError later."""
    data, rng, optimizer = ckpt["data"], ckpt["rng"], ckpt["optimizer"]
    number_or_none = (int, float, type(None))
    odd = [what for what, ok in (
        ("'step' is not a whole number >= 0", type(ckpt["step"]) is int and ckpt["step"] >= 0),
        ("'data' has no whole-number 'position' >= 0",
         isinstance(data, dict) and type(data.get("position")) is int and data["position"] >= 0),
        ("'optimizer' is not an optimizer state dict", isinstance(optimizer, dict) and {"state", "param_groups"} <= optimizer.keys()),
        ("'rng' is not a list of RNG states (torch, cuda, python, numpy) per process", isinstance(rng, list) and rng and all(
            isinstance(r, dict) and {"torch", "cuda", "python", "numpy"} <= r.keys() for r in rng)),
        ("'eval_step' is not a whole number", type(ckpt.get("eval_step")) in (int, type(None))),
        ("'val_loss' or 'best_val_loss' is not a number",
         isinstance(ckpt.get("val_loss"), number_or_none) and isinstance(ckpt.get("best_val_loss"), number_or_none)),
    ) if not ok]
    if odd:
        raise ValueError(f"{source}: cannot resume: {odd[0]} (a checkpoint of another program or version?); "
                         "start from its weights with --init_from")


def data_fingerprint(folder, meta):
    """A short hash of meta.json's bytes and every shard's name and size: what a checkpoint's data position
    indexes. Preparing the folder again (other text, other settings) changes it."""
    h = hashlib.sha256(open(os.path.join(folder, "meta.json"), "rb").read())
    for split in sorted(meta["splits"]):
        for name in meta["splits"][split]["shards"]:
            h.update(f"\n{split}/{name}:{os.path.getsize(os.path.join(folder, name))}".encode())
    return h.hexdigest()[:16]


def check_same_data(run, ckpt, source):
    """--resume reads on at the saved position in the training order, which means the same windows only in the
    same data: other data (the folder prepared again, or another one) is refused. A checkpoint older than the
    fingerprint cannot be checked: said once."""
    saved = ckpt["data"].get("fingerprint")
    if saved is None and run.rank == 0:
        print(f"note: {source} predates data fingerprints: cannot check that {run.cfg.data_dir} holds the data it was "
              "reading", file=sys.stderr)
    elif saved is not None and saved != run.data_id:
        raise ValueError(f"{source} was reading other data than {run.cfg.data_dir} now holds (fingerprint {saved}, now "
                         f"{run.data_id}: meta.json or the shards changed): its saved position would index other windows. "
                         "Resume on the data it was reading, or start from its weights with --init_from")


# ----------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    train(parse_config(argv))
    return 0


if __name__ == "__main__":
    code = run_main(main, outlive_stdout=True)  # a closed stdout (`| head`) does not stop a run: log.jsonl is its record
    if dist.is_torchelastic_launched():  # a torchrun rank, its files written and closed: torch 2.13's teardown at exit
        sys.stdout.flush()  # sometimes aborts (SIGABRT, ~1 run in 10 with gloo), so leave without it
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
