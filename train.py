"""
Train the binary-code GPT of model.py on token shards written by prepare_data.py.

    python prepare_data.py shakespeare && python train.py  # the mini model, one CPU or GPU
    python train.py --resume                               # continue out/ckpt.pt, bit for bit
    torchrun --standalone --nproc_per_node=8 train.py --preset=paper --vocab_size=65536 \
        --data_dir=data/paper --batch_size=16 --grad_accum=4 --compile --max_steps=2000 \
        --warmup_steps=100 --lr=6e-4 --min_lr=6e-5 --eval_interval=250 --eval_steps=20 \
        --save_interval=250                                # GPUs: DDP, GPU-sized settings

Every setting is a field of TrainConfig (`python train.py --help`); `train(cfg)` and `main(argv)`
are importable. It reads as a run goes (settings, data, model and optimizer, the loop, evaluation,
saving); its safety is a call away in bincode_gpt/: ranks.py (processes), preflight.py (checks),
run_dir.py (out_dir, its data on resume), stopping.py (signals, divergence), progress.py (the log).
"""

import bincode_gpt.quiet_start  # first: a Ctrl-C while torch loads is one line and exit 130

import math
import os
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bincode_gpt import preflight, ranks, run_dir
from bincode_gpt.checkpoint import atomic_torch_save, checkpoint_dict, load_weights, restore
from bincode_gpt.checkpoint import rng_state
from bincode_gpt.settings import config_parser, parse_settings, setting, with_overrides
from bincode_gpt.exits import exit_process, run_main
from bincode_gpt.devices import peak_flops, set_precision
from bincode_gpt.progress import Log
from bincode_gpt.stopping import GracefulStop, check_state, check_step, check_val_loss
from bincode_gpt.stopping import mean_loss_and_stop
from bincode_gpt.windows import Split
from model import GPT, PRESETS, GPTConfig


# ---------------------------------------------------------- settings
@dataclass
class TrainConfig:
    # data and output
    data_dir: str = setting("data/shakespeare",
                            "folder written by prepare_data.py (meta.json + shards)")
    out_dir: str = setting("out", "where ckpt.pt, best.pt and log.jsonl go "
                                  "(one run at a time: a second is refused)")
    preset: str = setting("mini", f"model preset from model.PRESETS: {' | '.join(PRESETS)}")
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


# --n_layer, --input, ...: an override of each model.GPTConfig field, its default said in its help
DEFAULT = "the checkpoint's, else the preset's"
DEFAULTS = {"vocab_size": "the checkpoint's, else the data's",
            "dropout": "the checkpoint's or preset's; may change"}
TrainConfig = with_overrides(TrainConfig, GPTConfig, "preset", lambda k: f"model.GPTConfig.{k} "
                             f"(default: {DEFAULTS.get(k, DEFAULT)})")


# ---------------------------------------------------------- data
# Each split is cut into windows of block_size+1 tokens at stride block_size, inside each shard
# (windows.Split). Training reads them in an endless order: epoch e is a permutation of all of them
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
    """First position in the training order that `rank` reads in micro-step `micro` of the step
    at `position`."""
    return position + (rank * grad_accum + micro) * batch_size


# ---------------------------------------------------------- model and optimizer
def set_up(cfg, out_lock, *, rank, world, device, dtype, distributed):
    """Read and check what the run starts from, claim out_dir, build model and optimizer -> Run,
    State. Everything before the claim only reads: a refusal writes nothing."""
    # the settings, the data, the checkpoint to start from, the model's shape, memory
    start = preflight.read_start(cfg, rank=rank, world=world, device=device, dtype=dtype)
    mcfg = start.model_config
    train_split = Split(cfg.data_dir, start.meta, "train", mcfg.block_size, mcfg.vocab_size)
    val_split = Split(cfg.data_dir, start.meta, "val", mcfg.block_size, mcfg.vocab_size)
    fingerprint = run_dir.data_fingerprint(cfg.data_dir)  # what a saved data position indexes
    if cfg.resume:
        run_dir.check_same_data(start.ckpt, start.source, cfg.data_dir, fingerprint, rank=rank)
    run_dir.claim_out_dir(cfg, out_lock if rank == 0 else None, start.stamp)  # rank 0, to the end

    # rank 0's init is every rank's (DDP broadcasts it); dropout draws differ per rank
    torch.manual_seed(cfg.seed + rank)
    raw_model = GPT(mcfg).to(device)
    betas = (cfg.beta1, cfg.beta2)
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.lr, betas, device.type)
    flops = raw_model.flops_per_token(mcfg.block_size)
    state = State()
    if start.ckpt is not None:  # its weights, copied into the parameters the optimizer holds
        load_weights(raw_model, start.ckpt["model"], start.source, copy=True)
    if cfg.resume:  # where the checkpoint stopped: optimizer, step, data position, RNG
        restore(state, start.ckpt, start.source, optimizer=optimizer, rank=rank, world=world,
                device=device)
    if rank == 0:  # a warning, printed once; the other ranks wait for it
        preflight.check_window_starts(train_split, start.meta, raw_model, cfg.data_dir)
    ranks.wait_for_all(distributed, device)
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if distributed:
        model = ranks.data_parallel(model, device, compiled=cfg.compile)  # DDP
    autocast = nullcontext()
    if dtype == "bfloat16":
        autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    log = Log(cfg=cfg, master=rank == 0, world=world, block_size=mcfg.block_size, flops=flops,
              peak=cfg.peak_flops or peak_flops(device, dtype))
    run = Run(cfg=cfg, rank=rank, world=world, device=device, distributed=distributed,
              model=model, raw_model=raw_model, optimizer=optimizer,
              train_split=train_split, val_split=val_split, autocast=autocast,
              tokenizer=start.tokenizer, fingerprint=fingerprint, log=log)
    log.start(run, state, dtype)  # opens log.jsonl (rank 0), says what is trained
    return run, state


# ---------------------------------------------------------- the training loop
def loop(run, state):
    """Evaluate, save, step and log until max_steps or a signal -> (last training loss, stopped
    by a signal)."""
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
                check_val_loss(run, state, val_loss)  # a diverged state stops the run, unsaved
                improved = state.best_val is None or val_loss < state.best_val
                state.val_loss = val_loss
                state.eval_step = state.step
                if state.first_val is None:
                    state.first_val = val_loss
                if improved:
                    state.best_val = val_loss
                run.log.evaluation(state, improved)
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
                ids = training_order(start, cfg.batch_size, run.train_split.n, cfg.seed)
                x, y = run.train_split.batch(ids, run.device)
                last_micro = micro == cfg.grad_accum - 1
                # DDP all-reduces in backward: on the last micro-step only, once all are summed
                with model.no_sync() if run.distributed and not last_micro else nullcontext():
                    with run.autocast:
                        loss = model(x, y)[1]  # the logits are not kept: backward needs none
                    (loss / cfg.grad_accum).backward()
                loss_sum += loss.detach().float()
            # the mean over ranks, and whether any rank was asked to stop
            loss, stopping = mean_loss_and_stop(run, loss_sum / cfg.grad_accum, stop.requested)
            norm = None  # the global gradient norm before clipping
            if cfg.grad_clip > 0:
                params = run.raw_model.parameters()
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip).item()
            check_step(run, state, loss, norm)  # a bad loss or gradient stops the run unapplied
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            state.step += 1
            state.position += run.windows_per_step

            # ---------------------------------------- log
            run.log.step(state, loss, norm, lr, time.time() - t0, stopping)
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


def train(cfg: TrainConfig) -> dict:
    """Train as cfg says; returns a summary (steps, tokens, first/final/best val loss, ...)."""
    rank, world, device, distributed = ranks.start_processes(cfg)
    try:
        dtype = set_precision(cfg.dtype, device)  # float32 or bfloat16 autocast; TF32 on CUDA
        t_start = time.time()
        with ExitStack() as out_lock:  # out_dir's writer lock (rank 0), released when the run ends
            run, state = set_up(cfg, out_lock, rank=rank, world=world, device=device, dtype=dtype,
                                distributed=distributed)
            try:
                loss, stopping = loop(run, state)
                tokens = state.position * run.raw_model.config.block_size
                interrupted = stopping and state.step < cfg.max_steps
                summary = {"steps": state.step, "tokens": tokens, "first_val_loss": state.first_val,
                           "final_val_loss": state.val_loss, "best_val_loss": state.best_val,
                           "final_train_loss": loss, "interrupted": interrupted,
                           "wall_s": time.time() - t_start, "tokens_per_s": run.log.tokens_per_s(),
                           "out_dir": cfg.out_dir}
                run.log.record(event="end", **summary)
            finally:
                run.log.close()
        if rank == 0:
            print(f"done: step {state.step}, {summary['tokens']:,} tokens, "
                  f"val loss {state.val_loss}, best {state.best_val}; "
                  f"{summary['wall_s']:.0f}s; checkpoint {run.cfg.ckpt_path}")
        return summary
    finally:
        if distributed:
            dist.destroy_process_group()


# ---------------------------------------------------------- the run's parts and counters
@dataclass
class Run:
    """The parts of one training run that set_up builds and the loop and its checks use."""
    cfg: TrainConfig
    rank: int
    world: int
    device: torch.device
    distributed: bool  # launched by torchrun
    model: torch.nn.Module  # what forward is called on: raw_model, compiled and/or DDP-wrapped
    raw_model: GPT  # the plain module: checkpoints, clipping, the optimizer's parameters
    optimizer: torch.optim.Optimizer
    train_split: Split
    val_split: Split
    autocast: object
    tokenizer: dict  # the data's, saved with every checkpoint
    fingerprint: str  # the data's (run_dir.data_fingerprint), saved with every checkpoint
    log: "Log"

    @property
    def windows_per_step(self):
        """N, the training windows one optimizer step reads: batch_size a micro-step, grad_accum
        of them, every rank."""
        return self.cfg.batch_size * self.cfg.grad_accum * self.world


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


# ---------------------------------------------------------- evaluation
def eval_windows(n, total):
    """The fixed validation windows: `total` of them spread evenly over the split's n windows."""
    return (np.arange(total) * n) // total


@torch.no_grad()
def evaluate(run, steps=None):
    """Mean loss over the fixed validation windows (the same ones at every evaluation, each rank its
    share, averaged over ranks); `steps` < eval_steps takes the first batches of each share."""
    cfg = run.cfg
    steps = steps or cfg.eval_steps
    # no backward follows, so DDP has nothing to do: call the module it wraps
    model = run.model.module if isinstance(run.model, DDP) else run.model
    model.eval()
    ids = eval_windows(run.val_split.n, cfg.eval_steps * cfg.batch_size * run.world)
    total = torch.zeros((), device=run.device)
    for k in range(steps):
        start = (run.rank * cfg.eval_steps + k) * cfg.batch_size
        x, y = run.val_split.batch(ids[start : start + cfg.batch_size], run.device)
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
    in the training order and every rank's RNG states. best.pt (the best val loss) holds the weights
    and their evaluation only, a third of the bytes: for sampling, converting or --init_from."""
    check_state(run, state, lambda: evaluate(run, steps=1))  # a bad state is never saved
    rngs = [rng_state(run.device)] * run.world  # for ckpt.pt, each rank's own:
    if name == "ckpt.pt" and run.distributed:
        dist.all_gather_object(rngs, rng_state(run.device))
    if name == "ckpt.pt":
        state.saved_step = state.step
    if run.rank == 0:
        write_checkpoint(run, state, name, rngs)
    ranks.wait_for_all(run.distributed, run.device)  # rank 0 alone writes; the others wait for it


def write_checkpoint(run, state, name, rngs):
    """checkpoint_dict of the unwrapped module, atomically: a crash, Ctrl-C or full disk mid-write
    keeps the old file."""
    cfg = run.cfg
    path = os.path.join(cfg.out_dir, name)
    n = run.train_split.n
    data = {"position": state.position, "global_batch": run.windows_per_step, "windows": n,
            "epoch": state.position // n, "seed": cfg.seed, "fingerprint": run.fingerprint}
    extra = {"saved_as": name}  # best.pt: weights and their evaluation only
    if name == "ckpt.pt":
        extra = dict(optimizer=run.optimizer.state_dict(), rng=rngs, data=data,
                     best_val_loss=state.best_val, eval_step=state.eval_step, world_size=run.world)
    val_loss = state.val_loss if state.eval_step == state.step else None
    ckpt = checkpoint_dict(run.raw_model, run.tokenizer, step=state.step, train_config=asdict(cfg),
                           val_loss=val_loss, **extra)
    try:
        atomic_torch_save(ckpt, path)
    except OSError as e:  # e.g. a full disk: atomic_open left the previous files as they were
        kept = run_dir.kept_checkpoints(cfg)
        raise OSError(f"{path}: not written ({e.strerror or e}); {kept}") from None


# ---------------------------------------------------------- command line
def parse_config(argv=None) -> TrainConfig:
    return parse_settings(config_parser(TrainConfig, __doc__.strip().split("\n\n")[0]), argv)


def main(argv=None) -> int:
    train(parse_config(argv))
    return 0


if __name__ == "__main__":
    # a closed stdout (`| head`) does not stop a run: log.jsonl records it
    exit_process(run_main(main, outlive_stdout=True))
