"""
Train the binary-code GPT of model.py on token shards written by prepare_data.py.

    python prepare_data.py shakespeare && python train.py    # the mini model on tiny Shakespeare: one CPU or GPU
    python train.py --resume                                  # continue out/ckpt.pt (bit for bit on a CPU)
    torchrun --standalone --nproc_per_node=8 train.py --preset=paper --vocab_size=65536 --data_dir=data/paper \
        --batch_size=16 --grad_accum=4 --compile --max_steps=2000 --warmup_steps=100 --lr=6e-4 --min_lr=6e-5 \
        --eval_interval=250 --eval_steps=20 --save_interval=250                # GPUs: DDP, GPU-sized settings

Every setting is a field of TrainConfig (`python train.py --help`); `train(cfg)` and `main(argv)` are importable.
It reads as a run goes (settings, data, model and optimizer, the loop, evaluation, saving); its safety is a call away:
launch.py (processes), preflight.py (checks), run_dir.py (out_dir, exact resume), stopping.py (signals, divergence).
"""

from bincode_gpt.cli import config_parser, parse_settings, quiet_interrupt, run_main, setting, with_overrides
from bincode_gpt.devices import peak_flops
quiet_interrupt(__name__)  # before the slow imports: a Ctrl-C during them is one line, exit 130

import json
import math
import os
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bincode_gpt.checkpoint import atomic_torch_save, checkpoint_dict, load_weights, rng_state
from bincode_gpt.launch import data_parallel, on_rank0, set_precision, start_processes, wait_for_all
from bincode_gpt.preflight import check_settings, check_window_starts, checked_model_config, resolve_settings
from bincode_gpt.run_dir import claim_out_dir, data_fingerprint, kept_checkpoints, open_outputs, read_start, restore
from bincode_gpt.shards import load_meta
from bincode_gpt.stopping import GracefulStop, check_state, check_step, check_val_loss, mean_loss_and_stop
from bincode_gpt.tokenizer import tiktoken_entry
from bincode_gpt.windows import Split
from model import GPT, PRESETS, GPTConfig


# ----------------------------------------------------------------------------- settings
@dataclass
class TrainConfig:
    # data and output
    data_dir: str = setting("data/shakespeare", "folder written by prepare_data.py (meta.json + shards)")
    out_dir: str = setting("out", "where ckpt.pt, best.pt and log.jsonl go (one run at a time: a second is refused)")
    preset: str = setting("mini", f"model preset from model.PRESETS: {' | '.join(PRESETS)}")
    # optimisation (defaults: the quick start's, from a timed search, docs/quickstart.md; bigger models want less lr)
    batch_size: int = setting(16, "sequences per micro-step per process")
    grad_accum: int = setting(1, "micro-steps per optimizer step")
    max_steps: int = setting(600, "optimizer steps to train for (in total, counting resumed ones)")
    lr: float = setting(3e-3, "peak learning rate")
    min_lr: float | None = setting(None, "learning rate at the end of the cosine decay (default: lr / 10)")
    warmup_steps: int = setting(20, "linear warmup steps")
    lr_decay_steps: int | None = setting(None, "step where the cosine reaches min_lr (default: max_steps)")
    weight_decay: float = setting(0.1, "AdamW weight decay (matrices only)")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (0: off; negative or nan is refused)")
    # evaluation, logging, checkpoints
    eval_interval: int = setting(200, "evaluate every this many steps, and at the end (0: never)")
    eval_steps: int = setting(8, "validation batches per process per evaluation")
    log_interval: int = setting(10, "print a log line every this many steps (log.jsonl gets every step)")
    save_interval: int = setting(100, "write ckpt.pt every this many steps (0: only at the end or on a signal)")
    # system
    seed: int = setting(1337, "seed of the model init, the data order and dropout")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N | mps (under torchrun: cuda:LOCAL_RANK)")
    dtype: str = setting("auto", "auto | float32 | bfloat16 (bfloat16: autocast on CUDA or CPU, weights stay float32; "
                                 "auto: bfloat16 on a CUDA GPU that supports it, else float32)")
    compile: bool = setting(False, "torch.compile the model")
    dist_timeout: float = setting(30.0, "minutes a torchrun rank waits in a collective (rank 0 saving) before failing")
    peak_flops: float | None = setting(None, "peak FLOP/s of one device, for MFU (default: a table of GPUs; CPU: none)")
    resume: bool = setting(False, "continue out_dir/ckpt.pt exactly (best.pt holds weights only: --init_from it)")
    overwrite: bool = setting(False, "start afresh in an out_dir that holds an earlier run: its log.jsonl and best.pt "
                                     "are removed at the start, its ckpt.pt replaced at the first save")
    init_from: str | None = setting(None, "start from this checkpoint's weights (fine-tuning): fresh optimizer, step 0")

    @property
    def ckpt_path(self):
        """out_dir's latest checkpoint: what --resume continues and every periodic save replaces."""
        return os.path.join(self.out_dir, "ckpt.pt")


# --n_layer, --input, ...: an override of each model.GPTConfig field, by default the checkpoint's, else the preset's
DEFAULTS = {"vocab_size": "the checkpoint's, else the data's", "dropout": "the checkpoint's or preset's; may change"}
TrainConfig = with_overrides(TrainConfig, GPTConfig, "preset", lambda k: f"model.GPTConfig.{k} (default: "
                             + DEFAULTS.get(k, "the checkpoint's, else the preset's") + ")")


# ----------------------------------------------------------------------------- data
# Each split is cut into windows of block_size+1 tokens at stride block_size, inside each shard (windows.Split).
# Training reads them in an endless order: epoch e is a permutation of all of them drawn from (seed, e). A step takes
# the N = batch_size*grad_accum*world_size positions [p, p+N) of that order, each rank and micro-step its own
# batch_size of them: ranks read disjoint windows, a global batch is the same however it is split into processes
# and micro-steps, and a checkpoint only needs p (= step*N while the batch size is unchanged).
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
    """First position in the training order that `rank` reads in micro-step `micro` of the step at `position`."""
    return position + (rank * grad_accum + micro) * batch_size


# ----------------------------------------------------------------------------- model and optimizer
def set_up(cfg, rank, world, device, distributed, out_lock):
    """Check the settings, read the data and the checkpoint to start from, build model and optimizer -> Run, State."""
    # settings, data, and the checkpoint to start from: read only, so a refusal writes nothing
    check_settings(resolve_settings(cfg))  # min_lr's default follows lr; a value the run cannot use is refused
    dtype = set_precision(cfg, device)  # float32, or bfloat16 autocast; TF32 matmuls on CUDA
    meta = load_meta(cfg.data_dir)  # ShardError naming what is missing or malformed
    source, ckpt, ckpt_stamp = read_start(cfg)  # --resume's ckpt.pt or --init_from's file (or None), and its stamp
    mcfg = checked_model_config(cfg, meta, ckpt, source, rank, world, device)  # tokenizer, shape, memory
    train_split = Split(cfg.data_dir, meta, "train", mcfg.block_size, mcfg.vocab_size)
    val_split = Split(cfg.data_dir, meta, "val", mcfg.block_size, mcfg.vocab_size)
    claim_out_dir(cfg, out_lock if rank == 0 else None, ckpt_stamp)  # rank 0 holds out_dir's lock until the run ends

    torch.manual_seed(cfg.seed + rank)  # rank 0's init is every rank's (DDP broadcasts it); dropout differs
    raw_model = GPT(mcfg).to(device)
    if ckpt is not None:
        load_weights(raw_model, ckpt["model"], source)
    on_rank0(rank, distributed, device, check_window_starts, train_split, meta, raw_model, cfg.data_dir)  # a warning
    optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), device.type)
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if distributed:
        model = data_parallel(model, device)  # DDP, with no broadcast of the constant buffers every step
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    flops = raw_model.flops_per_token(mcfg.block_size)
    log = Log(cfg, rank == 0, world, mcfg.block_size, flops, cfg.peak_flops or peak_flops(device))
    run = Run(cfg, rank, world, device, distributed, model, raw_model, optimizer, train_split, val_split, autocast,
              tiktoken_entry(meta), data_fingerprint(cfg.data_dir), log)
    state = State()
    if cfg.resume:
        restore(run, state, ckpt, source)  # optimizer, step, data position, RNG: exactly where it stopped
    log.start(run, state, dtype)  # opens log.jsonl (rank 0), prints what is trained, records the start
    return run, state


# ----------------------------------------------------------------------------- the training loop
def loop(run, state):
    """Evaluate, save, step and log until max_steps or a signal -> (last training loss, stopped by a signal)."""
    cfg, model, raw_model, optimizer, device = run.cfg, run.model, run.raw_model, run.optimizer, run.device
    loss, stopping = None, False
    with GracefulStop() as stop:  # SIGINT/SIGTERM: finish this step, save, exit 0
        while True:
            # ------------------------------------------------------------- evaluate, save, or stop (after step)
            if (cfg.eval_interval > 0 and (state.step % cfg.eval_interval == 0 or state.step >= cfg.max_steps)
                    and state.step != state.eval_step):
                val_loss = evaluate(run)
                check_val_loss(run, state, val_loss)  # a diverged state stops the run, unsaved
                improved = state.best_val is None or val_loss < state.best_val
                state.val_loss, state.eval_step = val_loss, state.step
                state.first_val = val_loss if state.first_val is None else state.first_val
                state.best_val = val_loss if improved else state.best_val
                run.log.evaluation(state, improved)
                if improved and state.step > 0:
                    save(run, state, "best.pt")  # its weights only: a resume continues ckpt.pt
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


# ----------------------------------------------------------------------------- the run's parts and counters
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
        """N, the training windows one optimizer step reads: batch_size a micro-step, grad_accum of them, every rank."""
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


# ----------------------------------------------------------------------------- evaluation
def eval_windows(n, total):
    """The fixed validation windows: `total` of them spread evenly over the n windows of the split."""
    return (np.arange(total) * n) // total


@torch.no_grad()
def evaluate(run, steps=None):
    """Mean loss over the fixed validation windows (the same ones at every evaluation, each rank its share,
    averaged over ranks); `steps` < eval_steps takes the first batches of each share."""
    cfg, steps = run.cfg, steps or run.cfg.eval_steps
    model = run.model.module if isinstance(run.model, DDP) else run.model  # no backward follows: nothing for DDP
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


# ----------------------------------------------------------------------------- saving
def save(run, state, name):
    """Write out_dir/name only of a good state; every rank takes part and waits for rank 0's write. ckpt.pt (the
    latest) is what --resume continues bit for bit: weights, AdamW state, the position in the training order and
    every rank's RNG states. best.pt (the best val loss) holds the weights and their evaluation only, a third of
    the bytes: for sampling, converting or --init_from."""
    check_state(run, state, lambda: evaluate(run, steps=1))  # stopping.py: a bad state is never saved
    rngs = [rng_state(run.device)] * run.world  # for ckpt.pt, each rank's own:
    if name == "ckpt.pt" and run.distributed:
        dist.all_gather_object(rngs, rng_state(run.device))
    state.saved_step = state.step if name == "ckpt.pt" else state.saved_step
    if run.rank == 0:
        write_checkpoint(run, state, name, rngs)
    wait_for_all(run.distributed, run.device)  # on purpose, under --dist_timeout: rank 0 alone writes


def write_checkpoint(run, state, name, rngs):
    """checkpoint_dict of the unwrapped module, atomically: a crash, Ctrl-C or full disk mid-write keeps the old."""
    cfg, path, n = run.cfg, os.path.join(run.cfg.out_dir, name), run.train_split.n
    data = {"position": state.position, "global_batch": run.windows_per_step, "windows": n,
            "epoch": state.position // n, "seed": cfg.seed, "fingerprint": run.data_id}
    resumable = dict(optimizer=run.optimizer.state_dict(), rng=rngs, data=data, best_val_loss=state.best_val,
                     eval_step=state.eval_step, world_size=run.world)
    ckpt = checkpoint_dict(run.raw_model, run.tokenizer, step=state.step, train_config=asdict(cfg),
                           val_loss=state.val_loss if state.eval_step == state.step else None,
                           **(resumable if name == "ckpt.pt" else {"saved_as": name}))
    try:
        atomic_torch_save(ckpt, path)
    except OSError as e:  # e.g. a full disk: atomic_open left the previous files as they were
        raise OSError(f"{path}: not written ({e.strerror or e}); {kept_checkpoints(cfg)}") from None


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
    window_start: int = 0  # the steps since the last printed line
    mark: float = field(default_factory=time.time)  # when the last step (or the set-up) ended
    eval_s: float = 0.0  # the last evaluation's time, for the ETA
    per_byte: tuple = (None, None)  # train and val tokens per byte of text, where the data knows its bytes

    @property
    def tokens_per_step(self):
        return self.cfg.batch_size * self.cfg.grad_accum * self.world * self.block_size

    def start(self, run, state, dtype):
        """Open log.jsonl (rank 0: an --overwrite removes the replaced run's best.pt), say what is trained, on
        what, from which step, and record the start."""
        cfg, mcfg = self.cfg, run.raw_model.config
        if self.master:
            self.file = open_outputs(cfg)
            n = run.raw_model.num_params()
            print(f"{mcfg.n_layer} layers x {mcfg.n_embd}, input={mcfg.input}, vocab {mcfg.vocab_size}: "
                  f"{n['trainable']:,} trainable, {n['frozen']:,} frozen values | {self.world} process(es) on "
                  f"{run.device}, {dtype} | {self.tokens_per_step:,} tokens/step, {run.train_split.n:,} train "
                  f"windows/epoch | {'resuming at' if cfg.resume else 'starting at'} step {state.step}")
        self.record(event="start", step=state.step, world_size=self.world, device=str(run.device),
                    train_config=asdict(cfg), model_config=asdict(mcfg))
        self.per_byte, self.mark = (run.train_split.tokens_per_byte, run.val_split.tokens_per_byte), time.time()

    def record(self, **entry):
        if self.file:
            self.file.write(json.dumps(entry) + "\n")  # a whole line or none (run_dir.LineLog)

    def close(self):
        if self.file:
            self.file.close()

    def evaluation(self, state, improved):
        self.eval_s = time.time() - self.mark
        per_byte = state.val_loss * self.per_byte[1] if self.per_byte[1] else None
        self.record(event="eval", step=state.step, val_loss=state.val_loss, best_val_loss=state.best_val,
                    val_loss_per_byte=per_byte)
        if self.master:
            print(f"step {state.step}: val loss {state.val_loss:.4f}{nats_per_byte(per_byte)}"
                  f"{' (best)' if improved else ''}")

    def step(self, state, loss, norm, lr, dt, stopping):
        cfg, tokens = self.cfg, self.tokens_per_step
        mfu = self.flops * tokens / dt / (self.peak * self.world) if self.peak else None
        self.record(event="train", step=state.step, loss=loss, lr=lr, grad_norm=norm, dt=dt, tokens_per_s=tokens / dt,
                    mfu=mfu, tokens=state.position * self.block_size)
        self.step_times.append(dt)
        self.mark = time.time()
        if self.master and (state.step % cfg.log_interval == 0 or state.step == cfg.max_steps or stopping):
            window = self.step_times[self.window_start :]  # tokens/s over these steps' time
            tok_s = len(window) * tokens / sum(window)
            steady = window[1:] if self.window_start == 0 and len(window) > 1 else window  # not the warm-up step
            self.window_start = len(self.step_times)
            mfu_s = f" | mfu {100 * self.flops * tok_s / (self.peak * self.world):.1f}%" if self.peak else ""
            per_byte = nats_per_byte(loss * self.per_byte[0] if self.per_byte[0] else None)
            print(f"step {state.step}/{cfg.max_steps} | loss {loss:.4f}{per_byte} | lr {lr:.2e} | {tok_s:,.0f} "
                  f"tok/s{mfu_s} | eta {clock(self.eta(state.step, steady))}", flush=True)

    def eta(self, step, steady):
        """Seconds left: the steps to go at these steps' pace, and the evaluations to go at the last one's time."""
        cfg, evals = self.cfg, 0
        if cfg.eval_interval > 0:  # at each multiple of eval_interval after this step, and at max_steps
            evals = cfg.max_steps // cfg.eval_interval - step // cfg.eval_interval
            evals += cfg.max_steps % cfg.eval_interval > 0
        return (cfg.max_steps - step) * sum(steady) / len(steady) + evals * self.eval_s

    def tokens_per_s(self):
        """Over all steps' time (not evaluations or saves)."""
        return self.tokens_per_step * len(self.step_times) / sum(self.step_times) if self.step_times else None


def nats_per_byte(x):
    return f", {x:.4f} nats/byte" if x is not None else ""


def clock(seconds):
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m{int(seconds % 60):02d}s"


# ----------------------------------------------------------------------------- command line
def parse_config(argv=None) -> TrainConfig:
    return parse_settings(config_parser(TrainConfig, __doc__.strip().split("\n\n")[0]), argv)


def main(argv=None) -> int:
    train(parse_config(argv))
    return 0


if __name__ == "__main__":
    code = run_main(main, outlive_stdout=True)  # a closed stdout (`| head`) does not stop a run: log.jsonl records it
    if dist.is_torchelastic_launched():  # a torchrun rank, its files written and closed: torch 2.13's teardown at exit
        sys.stdout.flush()  # sometimes aborts (SIGABRT, ~1 run in 10 with gloo), so leave without it
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
