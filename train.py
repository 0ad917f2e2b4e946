"""
Train the binary-code GPT of model.py on token shards written by prepare_data.py.

    python prepare_data.py shakespeare && python train.py  # the mini model, one CPU or GPU
    python train.py --resume                               # continue out/ckpt.pt, bit for bit
    torchrun --standalone --nproc_per_node=8 train.py --preset=paper --vocab_size=65536 \
        --data_dir=data/paper --batch_size=16 --grad_accum=4 --compile --max_steps=2000 \
        --warmup_steps=100 --lr=6e-4 --min_lr=6e-5 --eval_interval=250 --eval_steps=20 \
        --save_interval=250                                # GPUs: DDP, GPU-sized settings

Every setting is a field of TrainConfig (`python train.py --help`); `train(cfg)` and `main(argv)`
are importable. It reads as a run goes; what a reader may skip (checks, signals, out_dir's lock,
the log) is one call away in bincode_gpt/.
"""

# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import GracefulStop, exit_process, run_main

import math
import os
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import clip_grad_norm_

from bincode_gpt import devices, ranks, run_dir
from bincode_gpt.divergence import Divergence
from bincode_gpt.run_dir import Log, Start, rng_state
from bincode_gpt.settings import config_parser, parse_settings, setting
from model import GPT, PRESETS, GPTConfig, constant_input_ids


# ---------------------------------------------------------- settings
def shape_setting(name, default="the checkpoint's, else the preset's"):
    """An override of model.GPTConfig's field `name`: None keeps the checkpoint's or preset's."""
    return setting(None, f"model.GPTConfig.{name} (default: {default})")


@dataclass
class TrainConfig:
    # data and output
    data_dir: str = setting("data/shakespeare",
                            "folder written by prepare_data.py (meta.json + shards)")
    out_dir: str = setting("out", "where ckpt.pt, best.pt and log.jsonl go "
                                  "(one run at a time: a second is refused)")
    preset: str = setting("mini", f"model preset from model.PRESETS: {' | '.join(PRESETS)}")
    # the model's shape: an override of each model.GPTConfig field (checkpoint.model_config)
    vocab_size: int | None = shape_setting("vocab_size", "the checkpoint's, else the data's")
    block_size: int | None = shape_setting("block_size")
    n_layer: int | None = shape_setting("n_layer")
    n_head: int | None = shape_setting("n_head")
    n_embd: int | None = shape_setting("n_embd")
    input: str | None = shape_setting("input")
    layout: str | None = shape_setting("layout")
    affine_seed: int | None = shape_setting("affine_seed")
    pad_token_id: int | None = shape_setting("pad_token_id")
    code_width: int | None = shape_setting("code_width")
    rope_base: float | None = shape_setting("rope_base")
    bias: bool | None = shape_setting("bias")
    dropout: float | None = shape_setting("dropout", "the checkpoint's or preset's; may change")
    # optimisation (the quick start's defaults, from a timed search: docs/quickstart.md; bigger
    # models want less lr)
    batch_size: int = setting(16, "sequences per micro-step per process")
    grad_accum: int = setting(1, "micro-steps per optimizer step")
    max_steps: int = setting(600, "optimizer steps to train for (in total, counting resumed ones)")
    lr: float = setting(3e-3, "peak learning rate")
    min_lr: float | None = setting(None, "learning rate at the end of the cosine decay "
                                         "(default: lr / 10)")
    warmup_steps: int = setting(20, "linear warmup steps")
    lr_decay_steps: int | None = setting(None, "step where the cosine reaches min_lr "
                                               "(default: max_steps)")
    weight_decay: float = setting(0.1, "AdamW weight decay (matrices only)")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this "
                                    "(0: off; negative or nan is refused)")
    # evaluation, logging, checkpoints
    eval_interval: int = setting(200, "evaluate every this many steps, and at the end (0: never)")
    eval_steps: int = setting(8, "validation batches per process per evaluation")
    log_interval: int = setting(10, "print a log line every this many steps "
                                    "(log.jsonl gets every step)")
    save_interval: int = setting(100, "write ckpt.pt every this many steps "
                                      "(0: only at the end or on a signal)")
    # system
    seed: int = setting(1337, "seed of the model init, the data order and dropout")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N | mps "
                                  "(under torchrun: cuda:LOCAL_RANK)")
    dtype: str = setting("auto", "auto | float32 | bfloat16 (bfloat16: autocast on CUDA or CPU, "
                                 "weights stay float32; auto: bfloat16 on a CUDA GPU that "
                                 "supports it, else float32)")
    compile: bool = setting(False, "torch.compile the model")
    dist_timeout: float = setting(30.0, "minutes a torchrun rank waits in a collective "
                                        "(rank 0 saving) before failing")
    peak_flops: float | None = setting(None, "peak FLOP/s of one device, for MFU "
                                             "(default: a table of GPUs; CPU: none)")
    resume: bool = setting(False, "continue out_dir/ckpt.pt exactly "
                                  "(best.pt holds weights only: --init_from it)")
    overwrite: bool = setting(False, "start afresh in an out_dir that holds an earlier run: its "
                                     "log.jsonl and best.pt are removed at the start, its ckpt.pt "
                                     "replaced at the first save")
    init_from: str | None = setting(None, "start from the weights of this .pt file or folder (its "
                                          "ckpt.pt, else best.pt): fresh optimizer, step 0")

    @property
    def ckpt_path(self):
        """out_dir's latest checkpoint: what --resume continues and every periodic save replaces."""
        return os.path.join(self.out_dir, "ckpt.pt")


# ---------------------------------------------------------- data
# Each split is cut into windows of block_size+1 tokens at stride block_size, inside each shard
# (shards.Split). Training reads them in an endless order: epoch e is a permutation of all of them
# drawn from (seed, e). A step takes the N = batch_size*grad_accum*world_size positions [p, p+N) of
# that order, each rank and micro-step its own batch_size of them: ranks read disjoint windows, a
# global batch is the same however it is split into processes and micro-steps, and a checkpoint only
# needs p (= step*N while the batch size is unchanged).
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
    """The first position `rank` reads in micro-step `micro` of the step at `position`."""
    return position + (rank * grad_accum + micro) * batch_size


# ---------------------------------------------------------- the run's parts and counters
@dataclass
class Run:
    """The parts of one training run that set_up builds and the loop, evaluation and saving use."""
    cfg: TrainConfig
    rank: int
    world: int
    device: torch.device
    distributed: bool  # launched by torchrun
    model: torch.nn.Module  # what forward is called on: raw_model, compiled and/or DDP-wrapped
    raw_model: GPT  # the plain module: checkpoints, clipping, the optimizer's parameters
    optimizer: torch.optim.Optimizer
    start: Start  # the data (its splits, tokenizer, fingerprint) and the checkpoint it started from
    autocast: object  # bfloat16 autocast, or nullcontext: float32
    windows_per_step: int  # N: batch_size a micro-step, grad_accum of them, every rank
    log: Log
    divergence: Divergence  # the checks that stop a diverged run unsaved


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


# ---------------------------------------------------------- set-up: model, optimizer, resume, log
def set_up(cfg, start: Start, *, rank, world, device, dtype, autocast, distributed):
    """Build model and optimizer, continue the checkpoint, open the log -> Run, State."""
    torch.manual_seed(cfg.seed + rank)  # init: rank 0's (DDP broadcasts it); dropout: per rank
    raw_model = GPT(start.config).to(device)
    betas = (cfg.beta1, cfg.beta2)
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.lr, betas, device.type)
    state = State()
    if start.ckpt is not None:  # its weights, copied into the parameters the optimizer holds
        raw_model.load_state_dict(start.ckpt["model"])  # they fit: checkpoint.check_weights
    if cfg.resume:  # where the checkpoint stopped: optimizer and RNG, step, data position
        state = State(**run_dir.restore(start.ckpt, start.source, optimizer=optimizer, rank=rank,
                                        world=world, device=device))
    if rank == 0:  # a warning, printed once; the other ranks wait for it
        start.train_split.check_window_starts(constant_input_ids(raw_model), start.config.input)
    ranks.wait_for_all(distributed, device)
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if distributed:
        model = ranks.data_parallel(model, device, compiled=cfg.compile)  # DDP
    windows = cfg.batch_size * cfg.grad_accum * world
    log = Log(out_dir=cfg.out_dir, master=rank == 0, world=world,
              tokens_per_step=windows * start.config.block_size, max_steps=cfg.max_steps,
              log_interval=cfg.log_interval, eval_interval=cfg.eval_interval,
              flops=raw_model.flops_per_token(start.config.block_size),
              peak=cfg.peak_flops,  # None: the device's, if known (devices.PEAK_FLOPS)
              per_byte=(start.train_split.tokens_per_byte, start.val_split.tokens_per_byte))
    divergence = Divergence(vocab_size=start.config.vocab_size, lr=cfg.lr,
                            weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps,
                            ckpt_path=cfg.ckpt_path, log=log)
    run = Run(cfg=cfg, rank=rank, world=world, device=device, distributed=distributed, model=model,
              raw_model=raw_model, optimizer=optimizer, start=start, autocast=autocast,
              windows_per_step=windows, log=log, divergence=divergence)
    log.start(config=start.config, params=raw_model.num_params(), device=device, dtype=dtype,
              windows=start.train_split.n, step=state.step, resume=cfg.resume,
              overwrite=cfg.overwrite, train_config=asdict(cfg))  # opens log.jsonl (rank 0)
    return run, state


# ---------------------------------------------------------- the training loop
def loop(run, state):
    """Evaluate, save, step and log until max_steps or a signal -> (last loss, stopped by one)."""
    cfg = run.cfg
    model = run.model
    loss = None
    stopping = False
    with GracefulStop() as stop:  # SIGINT/SIGTERM: finish this step, save, exit 0
        while True:
            # ---------------------------------------- evaluate, save, or stop (after step)
            every = cfg.eval_interval
            eval_due = every > 0 and (state.step % every == 0 or state.step >= cfg.max_steps)
            if eval_due and state.step != state.eval_step:
                val_loss = evaluate(run)
                # a diverged state stops the run, unsaved
                run.divergence.check_val_loss(val_loss, state.step, saved_step=state.saved_step)
                improved = state.best_val is None or val_loss < state.best_val
                state.val_loss = val_loss
                state.eval_step = state.step
                if state.first_val is None:
                    state.first_val = val_loss
                if improved:
                    state.best_val = val_loss
                run.log.evaluation(state.step, val_loss, state.best_val, improved)
                if improved and state.step > 0:
                    save(run, state, "best.pt")  # its weights only: a resume continues ckpt.pt
            done = state.step >= cfg.max_steps or stopping
            due = cfg.save_interval > 0 and state.step % cfg.save_interval == 0 and state.step > 0
            if (done or due) and state.saved_step != state.step:
                save(run, state, "ckpt.pt")
            if done:
                break
            # ---------------------------------------- one optimizer step
            t0 = time.time()
            lr = lr_at(state.step, cfg)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=run.device)
            for micro in range(cfg.grad_accum):
                start = micro_batch_start(state.position, run.rank, micro, cfg.batch_size,
                                          cfg.grad_accum)
                ids = training_order(start, cfg.batch_size, run.start.train_split.n, cfg.seed)
                x, y = run.start.train_split.batch(ids, run.device)
                last_micro = micro == cfg.grad_accum - 1
                # DDP all-reduces in backward: on the last micro-step only, once all are summed
                with model.no_sync() if run.distributed and not last_micro else nullcontext():
                    with run.autocast:
                        loss = model(x, y)[1]  # the logits are not kept: backward needs none
                    (loss / cfg.grad_accum).backward()
                loss_sum += loss.detach().float()
            # one all-reduce: every rank sees the mean loss, and stops when any rank is asked to
            asked = torch.tensor(float(stop.requested), device=run.device)
            flags = torch.stack([loss_sum / cfg.grad_accum, asked])
            if run.distributed:
                dist.all_reduce(flags)
                flags[0] /= run.world
            loss = flags[0].item()
            stopping = flags[1].item() > 0
            norm = None  # the global gradient norm before clipping
            if cfg.grad_clip > 0:
                norm = clip_grad_norm_(run.raw_model.parameters(), cfg.grad_clip).item()
            # a bad loss or gradient stops the run unapplied
            run.divergence.check_step(loss, norm, state.step + 1, saved_step=state.saved_step)
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            state.step += 1
            state.position += run.windows_per_step
            tokens = state.position * run.raw_model.config.block_size
            run.log.step(state.step, loss=loss, norm=norm, lr=lr, dt=time.time() - t0,
                         tokens=tokens, stopping=stopping)
    return loss, stopping


def lr_at(step, cfg):
    """Linear warmup to lr, then cosine decay to min_lr at lr_decay_steps (default max_steps), so
    the schedule does not depend on where a run stops."""
    decay = cfg.lr_decay_steps or cfg.max_steps
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= decay:
        return cfg.min_lr
    ratio = (step - cfg.warmup_steps) / max(1, decay - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


# ---------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(run, steps=None):
    """Mean loss over the fixed validation windows (the same ones at every evaluation, each rank its
    share, averaged over ranks); `steps` < eval_steps takes the first batches of each share."""
    cfg = run.cfg
    steps = steps or cfg.eval_steps
    # no backward follows, so DDP has nothing to do: call the module it wraps
    model = run.model.module if isinstance(run.model, DDP) else run.model
    model.eval()
    count = cfg.eval_steps * cfg.batch_size * run.world  # the fixed windows, spread evenly
    split = run.start.val_split
    ids = (np.arange(count) * split.n) // count
    total = torch.zeros((), device=run.device)
    for k in range(steps):
        start = (run.rank * cfg.eval_steps + k) * cfg.batch_size
        x, y = split.batch(ids[start : start + cfg.batch_size], run.device)
        with run.autocast:
            total += model(x, y)[1].float()
    model.train()
    if run.world > 1:
        dist.all_reduce(total)
    return total.item() / (steps * run.world)


# ---------------------------------------------------------- saving
def save(run, state, name):
    """Write out_dir/name only of a good state; every rank takes part and waits for rank 0's write.
    ckpt.pt (the latest) is what --resume continues bit for bit: weights, AdamW state, the position
    in the training order, every rank's RNG states. best.pt (the best val loss): the weights and
    their evaluation, a third of the bytes, for sampling, converting or --init_from."""
    cfg = run.cfg
    val_loss = state.val_loss if state.eval_step == state.step else None  # this step's, if any
    # a bad state is never saved
    run.divergence.check_state(run.raw_model, val_loss, lambda: evaluate(run, steps=1),
                               step=state.step, saved_step=state.saved_step)
    rngs = [rng_state(run.device)] * run.world  # for ckpt.pt, each rank's own:
    if name == "ckpt.pt" and run.distributed:
        dist.all_gather_object(rngs, rng_state(run.device))
    extra = {"saved_as": name}  # best.pt: weights and their evaluation only
    if name == "ckpt.pt":  # the resume state: what --resume continues from
        state.saved_step = state.step
        extra = run_dir.training_state(optimizer=run.optimizer, rngs=rngs, position=state.position,
                                       windows_per_step=run.windows_per_step,
                                       windows=run.start.train_split.n, seed=cfg.seed,
                                       fingerprint=run.start.fingerprint, best_val=state.best_val,
                                       eval_step=state.eval_step, world=run.world)
    if run.rank == 0:  # the unwrapped module, written whole or not at all
        run_dir.save_checkpoint(run.raw_model, run.start.tokenizer, out_dir=cfg.out_dir, name=name,
                                step=state.step, train_config=asdict(cfg), val_loss=val_loss,
                                **extra)
    ranks.wait_for_all(run.distributed, run.device)  # rank 0 alone writes; the others wait for it


# ---------------------------------------------------------- the run, and the command line
def train(cfg: TrainConfig) -> dict:
    """Train as cfg says; returns a summary (steps, tokens, first/final/best val loss, ...)."""
    cfg = checked(cfg)  # before a process group is joined or anything read
    rank, world, device, distributed = ranks.start_processes(device_name=cfg.device,
                                                             dist_timeout=cfg.dist_timeout)
    try:
        t_start = time.time()
        # the precision: "float32" (TF32 matmuls on CUDA) or "bfloat16" (autocast: the matmuls in
        # bfloat16, the weights and the optimizer in float32), by the one rule of devices.py
        dtype = devices.set_precision(cfg.dtype, device)
        autocast = nullcontext()
        if dtype == "bfloat16":
            autocast = torch.autocast(device.type, dtype=torch.bfloat16)
        # what the run starts from, read and checked before anything is written
        shape = {f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}  # the overrides
        start = run_dir.read_start(cfg.data_dir, out_dir=cfg.out_dir, resume=cfg.resume,
                                   init_from=cfg.init_from, preset=cfg.preset, asked=shape,
                                   batch_size=cfg.batch_size, eval_steps=cfg.eval_steps, rank=rank,
                                   world=world, device=device, dtype=dtype)
        with ExitStack() as out_lock:  # out_dir's writer lock (rank 0), released when the run ends
            run_dir.claim_out_dir(cfg.out_dir, out_lock if rank == 0 else None, stamp=start.stamp,
                                  resume=cfg.resume, overwrite=cfg.overwrite)
            run, state = set_up(cfg, start, rank=rank, world=world, device=device, dtype=dtype,
                                autocast=autocast, distributed=distributed)
            try:
                loss, stopping = loop(run, state)
                summary = {"steps": state.step, "tokens": state.position * start.config.block_size,
                           "first_val_loss": state.first_val, "final_val_loss": state.val_loss,
                           "best_val_loss": state.best_val, "final_train_loss": loss,
                           "interrupted": stopping and state.step < cfg.max_steps,
                           "wall_s": time.time() - t_start, "tokens_per_s": run.log.tokens_per_s(),
                           "out_dir": cfg.out_dir}
                run.log.end(summary)  # records it, says it
            finally:
                run.log.close()
        return summary
    finally:
        if distributed:
            dist.destroy_process_group()


def checked(cfg: TrainConfig) -> TrainConfig:
    """cfg with min_lr's default filled in (lr / 10, so that --lr alone never contradicts it), or a
    ValueError for a setting the run cannot use, never read as 'off' or 'never': TrainConfig's own
    checks, as model.check_config is GPTConfig's."""
    if cfg.min_lr is None:
        cfg = replace(cfg, min_lr=cfg.lr / 10)
    for name in ("batch_size", "grad_accum", "eval_steps", "log_interval"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("max_steps", "eval_interval", "save_interval", "warmup_steps"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be 0 or more, got {getattr(cfg, name)}")
    # finite in float32, where AdamW uses them
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
        if not (0 <= getattr(cfg, name) <= torch.finfo(torch.float32).max):
            off = " (0: no clipping)" if name == "grad_clip" else ""
            raise ValueError(f"{name} must be a finite number >= 0{off}, got {getattr(cfg, name)}")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    # numpy's data order takes no negative seed, torch none past 2**64
    if not 0 <= cfg.seed < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {cfg.seed}")
    if cfg.lr_decay_steps is not None and cfg.lr_decay_steps < 1:
        raise ValueError("lr_decay_steps must be at least 1 (or none: max_steps), got "
                         f"{cfg.lr_decay_steps}")
    peak = cfg.peak_flops
    if peak is not None and not (math.isfinite(peak) and peak > 0):
        raise ValueError(f"peak_flops must be a finite number > 0 (or none), got {peak}")
    if cfg.resume and cfg.overwrite:
        raise ValueError("--resume continues the checkpoint in out_dir and --overwrite replaces "
                         "it: pass one of them")
    if cfg.resume and cfg.init_from is not None:
        raise ValueError("--resume continues out_dir's ckpt.pt and --init_from starts afresh from "
                         "another checkpoint's weights: pass one of them")
    if cfg.min_lr > cfg.lr:
        raise ValueError(f"min_lr {cfg.min_lr:g} is above lr {cfg.lr:g}: the cosine decays from lr "
                         "down to min_lr")
    for name, what in (("out_dir", "folder"), ("init_from", "file")):  # --data_dir: load_meta's
        if getattr(cfg, name) == "":
            raise ValueError(f"--{name} is '' (empty): name a {what}")
    return cfg


def parse_config(argv=None) -> TrainConfig:
    return parse_settings(config_parser(TrainConfig, __doc__.strip().split("\n\n")[0]), argv)


def main(argv=None) -> int:
    train(parse_config(argv))
    return 0


if __name__ == "__main__":
    # a closed stdout (`| head`) does not stop a run: log.jsonl records it
    exit_process(run_main(main, outlive_stdout=True))
