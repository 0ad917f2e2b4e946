"""
The run folder (out_dir) and all a training run keeps there, with rank 0 its one writer: its lock (a
fresh run refuses a folder that holds an earlier run's files), log.jsonl and the progress lines
(Log), the checkpoints written whole, and what ckpt.pt holds beyond the weights so that --resume
continues exactly (the optimizer's state, every rank's RNG streams: restore, rng_state).
"""

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from bincode_gpt.checkpoint import atomic_torch_save, check_weights, checkpoint_dict, model_config, read_checkpoint
from bincode_gpt.devices import peak_flops
from bincode_gpt.exits import one_line, say
from bincode_gpt.files import DISK_FULL, LOCK_NAME, file_stamp, writer_lock
from bincode_gpt.memory import check_training_fits
from bincode_gpt.shards import Split, data_fingerprint, load_meta
from bincode_gpt.tokenizer import check_tokenizer, tiktoken_entry
from model import GPT, GPTConfig

# what a run writes in out_dir, and all it ever replaces or removes there
OUTPUTS = ("ckpt.pt", "best.pt", "log.jsonl")


class Start(NamedTuple):
    """What a run starts from, read and checked by read_start."""
    meta: dict  # the data's meta.json
    source: str | None  # the checkpoint: --resume's out_dir/ckpt.pt, --init_from's file, or None
    ckpt: dict | None  # that checkpoint, read
    stamp: tuple | None  # which file --resume read (files.file_stamp): claim_out_dir checks it
    tokenizer: dict  # the data's tokenizer entry, saved with every checkpoint
    fingerprint: str  # the data's (shards.data_fingerprint): what a saved data position indexes
    config: GPTConfig  # the model's shape (checkpoint.model_config)
    train_split: Split  # the windows training reads
    val_split: Split  # the windows evaluation reads


def read_start(data_dir, *, out_dir, resume, init_from, preset, asked, batch_size, eval_steps, rank, world, device,
               dtype) -> Start:
    """What a run starts from, read and checked in the order a run meets it, before anything is written -> Start:
    the data's meta.json; the checkpoint (--resume: out_dir's ckpt.pt and its training state, check_resumable;
    --init_from: its file) and its tokenizer against the data's; the model's shape (checkpoint.model_config: the
    `preset`, the checkpoint's, the overrides `asked`) and the checkpoint's weights against it; training's memory;
    the splits; on --resume, the data against the data the checkpoint was reading (check_same_data)."""
    meta = load_meta(data_dir)  # a ShardError names what is missing or malformed
    fingerprint = data_fingerprint(data_dir)
    source = os.path.join(out_dir, "ckpt.pt") if resume else init_from
    stamp = file_stamp(source) if resume else None
    best = os.path.join(out_dir, "best.pt")
    if resume and stamp is None and os.path.isfile(best):
        raise FileNotFoundError(f"{source}: no checkpoint there to resume; {best} holds weights only (no optimizer, "
                                f"data position or RNG state): start a run from them with --init_from {best}")
    ckpt = read_checkpoint(source) if source else None
    if resume:
        check_resumable(ckpt, source)  # its training state, with the types restore reads
    if ckpt is not None:
        check_tokenizer(ckpt, meta, source, data_dir)
    tokenizer = tiktoken_entry(meta)
    note = print if rank == 0 else lambda text: None
    config = model_config(preset, asked, meta=meta, meta_path=os.path.join(data_dir, "meta.json"), ckpt=ckpt,
                          source=source, note=note)
    if ckpt is not None:
        check_weights(config, ckpt["model"], source, "train from")
    # refused with the numbers, not built until OOM
    check_training_fits(config, batch_size=batch_size, eval_steps=eval_steps, world=world, device=device,
                        dtype=dtype)
    if config.vocab_size != meta["vocab_size"]:
        note(f"note: model vocab_size {config.vocab_size} differs from the data's {meta['vocab_size']}")
    train_split, val_split = [Split(data_dir, meta, name, config.block_size, config.vocab_size)
                              for name in ("train", "val")]
    if resume:
        check_same_data(ckpt, source, data_dir, fingerprint, rank=rank)
    return Start(meta=meta, source=source, ckpt=ckpt, stamp=stamp, tokenizer=tokenizer,
                 fingerprint=fingerprint, config=config, train_split=train_split, val_split=val_split)


def claim_out_dir(out_dir, lock, *, stamp, resume, overwrite):
    """Make rank 0 (`lock`: train()'s ExitStack; None on the other ranks) out_dir's one writer until
    the run ends: files.writer_lock refuses a second run into it, even one started in the same
    second, and removes the temp files of a writer killed mid-save. What out_dir holds is checked
    (check_out_dir) under the lock; a folder no run has locked yet is checked before it too, so a
    refusal leaves a user's folder exactly as it was. A resumed run read ckpt.pt before the lock
    (`stamp`: its files.file_stamp): another run may have saved it since."""
    if not os.path.exists(os.path.join(out_dir, LOCK_NAME)):
        check_out_dir(out_dir, resume=resume, overwrite=overwrite)
    if lock is not None:
        lock.enter_context(writer_lock(out_dir, outputs=OUTPUTS))
        ckpt_path = os.path.join(out_dir, "ckpt.pt")
        if stamp is not None and file_stamp(ckpt_path) != stamp:
            raise ValueError(f"{ckpt_path} was replaced by another run while this one started: "
                             "resume again")
        check_out_dir(out_dir, resume=resume, overwrite=overwrite)


def check_out_dir(out_dir, *, resume, overwrite):
    """A fresh run refuses an out_dir that holds an earlier run's files: its checkpoints, or the log
    of a run that saved none (one that diverged, or was killed before its first save). --resume
    continues that run, --overwrite replaces it."""
    if resume or overwrite:
        return
    for name in OUTPUTS:
        path = os.path.join(out_dir, name)
        if os.path.exists(path) and name == "log.jsonl":
            raise ValueError(f"{path} holds the log of an earlier run, which saved no checkpoint: "
                             "keep it by choosing another out_dir, or replace it with --overwrite")
        if os.path.exists(path):
            raise ValueError(f"{path} exists: continue that run with --resume, or start afresh and "
                             "replace it with --overwrite")


def remove_replaced_best(out_dir):
    """An --overwrite removes the replaced run's best.pt as the new run starts (rank 0, under the
    lock), so its ckpt.pt never sits beside the best checkpoint of another run (the old ckpt.pt
    stays until the first save replaces it)."""
    best = os.path.join(out_dir, "best.pt")
    if os.path.isfile(best):
        os.remove(best)


def save_checkpoint(model: GPT, tokenizer, *, out_dir, name, **entries):
    """Write out_dir/name: checkpoint.checkpoint_dict's plain-typed dict of the model, its tokenizer
    and the run's `entries`, atomically (checkpoint.atomic_torch_save): a crash, Ctrl-C or full disk
    mid-write keeps the old file, and a failed write says what the folder still holds."""
    path = os.path.join(out_dir, name)
    try:
        atomic_torch_save(checkpoint_dict(model, tokenizer, **entries), path)
    except OSError as e:  # e.g. a full disk: atomic_open left the previous files as they were
        kept = kept_checkpoints(out_dir)
        raise OSError(f"{path}: not written ({e.strerror or e}); {kept}") from None


def kept_checkpoints(out_dir):
    """What a run stopped by a failed write leaves to resume from, for its message."""
    paths = [os.path.join(out_dir, name) for name in ("ckpt.pt", "best.pt")]
    kept = [path for path in paths if os.path.isfile(path)]
    if not kept:
        return "no checkpoint of this run is on disk yet"
    return f"kept as they were: {', '.join(kept)}"


@dataclass
class Log:
    """log.jsonl gets every event (rank 0 writes it, `master`); stdout a line every log_interval
    steps, with the throughput over those steps."""
    out_dir: str
    master: bool
    world: int
    tokens_per_step: int  # of one optimizer step, every rank
    max_steps: int
    log_interval: int
    eval_interval: int
    flops: float  # per token, for MFU
    peak: float | None  # FLOP/s of one device, for MFU (None: device_peak looks it up)
    per_byte: tuple = (None, None)  # train and val tokens per byte of text, where the data says
    fd: int | None = None  # log.jsonl, rank 0 only
    step_times: list = field(default_factory=list)
    window_start: int = 0  # the steps since the last printed line
    mark: float = field(default_factory=time.time)  # when the last step (or the set-up) ended
    eval_s: float = 0.0  # the last evaluation's time, for the ETA
    device: torch.device | None = None  # start()'s
    dtype: str | None = None  # start()'s

    @cached_property
    def device_peak(self):
        """FLOP/s of one device, for MFU: `peak`, else the table's figure for start()'s device and
        dtype (devices.peak_flops), else None: no MFU."""
        if self.peak or self.device is None:
            return self.peak
        return peak_flops(self.device, self.dtype)

    @property
    def path(self):
        return os.path.join(self.out_dir, "log.jsonl")

    def start(self, *, config: GPTConfig, params, device, dtype, windows, step, resume, overwrite,
              train_config):
        """Open log.jsonl (rank 0, under the lock: appended to by --resume, else new; an --overwrite
        removes the replaced run's best.pt), say what is trained (`config`: the GPTConfig, `params`:
        its num_params()), on what, from which step, and record the start."""
        self.device, self.dtype = torch.device(device), dtype
        if self.master:
            if overwrite:
                remove_replaced_best(self.out_dir)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if resume else os.O_TRUNC)
            self.fd = os.open(self.path, flags, 0o644)
            starting = "resuming at" if resume else "starting at"
            print(f"{config.n_layer} layers x {config.n_embd}, input={config.input}, "
                  f"vocab {config.vocab_size}: {params['trainable']:,} trainable, "
                  f"{params['frozen']:,} frozen values | {self.world} process(es) on {device}, "
                  f"{dtype} | {self.tokens_per_step:,} tokens/step, "
                  f"{windows:,} train windows/epoch | {starting} step {step}")
        self.record(event="start", step=step, world_size=self.world, device=str(device),
                    train_config=train_config, model_config=asdict(config))
        self.mark = time.time()

    def record(self, **entry):
        """One event, a whole line or none: a line cut short (a full disk, Ctrl-C mid-write) is
        taken back, so its readers parse every line and a resumed run appends after whole lines."""
        if self.fd is None:
            return
        data = (json.dumps(entry) + "\n").encode()
        end = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            while data:  # a write may take part of it
                data = data[os.write(self.fd, data):]
        except BaseException as e:
            os.ftruncate(self.fd, end)
            if isinstance(e, OSError) and e.errno in DISK_FULL:
                raise OSError(f"{self.path}: a line not written (the disk is full: "
                              f"{os.strerror(e.errno)}): the log keeps its whole lines; "
                              f"{kept_checkpoints(self.out_dir)}") from None
            raise

    def end(self, summary):
        """Record the run's summary (train.train's) and say it in one line."""
        self.record(event="end", **summary)
        if self.master:
            print(f"done: step {summary['steps']}, {summary['tokens']:,} tokens, "
                  f"val loss {summary['final_val_loss']}, best {summary['best_val_loss']}; "
                  f"{summary['wall_s']:.0f}s; checkpoint {os.path.join(self.out_dir, 'ckpt.pt')}")

    def close(self):
        if self.fd is not None:
            os.close(self.fd)

    def evaluation(self, step, val_loss, best_val, improved):
        self.eval_s = time.time() - self.mark
        per_byte = val_loss * self.per_byte[1] if self.per_byte[1] else None
        self.record(event="eval", step=step, val_loss=val_loss, best_val_loss=best_val,
                    val_loss_per_byte=per_byte)
        if self.master:
            print(f"step {step}: val loss {val_loss:.4f}{nats_per_byte(per_byte)}"
                  f"{' (best)' if improved else ''}")

    def step(self, step, *, loss, norm, lr, dt, tokens, stopping):
        """Optimizer step `step` is taken: its loss, gradient norm, lr and time; `tokens` read so
        far."""
        per_step = self.tokens_per_step
        peak = self.device_peak
        mfu = self.flops * per_step / dt / (peak * self.world) if peak else None
        self.record(event="train", step=step, loss=loss, lr=lr, grad_norm=norm, dt=dt,
                    tokens_per_s=per_step / dt, mfu=mfu, tokens=tokens)
        self.step_times.append(dt)
        self.mark = time.time()
        due = step % self.log_interval == 0 or step == self.max_steps or stopping
        if self.master and due:
            window = self.step_times[self.window_start :]
            # tokens/s and the ETA from these steps' pace, without this process's first step: its
            # warm-up (torch.compile compiling, the allocator growing) is not the run's speed
            steady = window[1:] if self.window_start == 0 and len(window) > 1 else window
            tok_s = len(steady) * self.tokens_per_step / sum(steady)
            self.window_start = len(self.step_times)
            mfu_s = ""
            if peak:
                mfu_s = f" | mfu {100 * self.flops * tok_s / (peak * self.world):.1f}%"
            per_byte = nats_per_byte(loss * self.per_byte[0] if self.per_byte[0] else None)
            print(f"step {step}/{self.max_steps} | loss {loss:.4f}{per_byte} | lr {lr:.2e} | "
                  f"{tok_s:,.0f} tok/s{mfu_s} | eta {clock(self.eta(step, steady))}", flush=True)

    def eta(self, step, steady):
        """Seconds left: the steps to go at these steps' pace, and the evaluations to go at the
        last one's time."""
        evals = 0
        if self.eval_interval > 0:  # at each multiple of eval_interval after this step, and the end
            evals = self.max_steps // self.eval_interval - step // self.eval_interval
            evals += self.max_steps % self.eval_interval > 0
        return (self.max_steps - step) * sum(steady) / len(steady) + evals * self.eval_s

    def tokens_per_s(self):
        """Over the steps' time (not evaluations or saves), without this process's first step (its
        warm-up) when there are others."""
        steady = self.step_times[1:] or self.step_times
        if not steady:
            return None
        return self.tokens_per_step * len(steady) / sum(steady)


def nats_per_byte(x):
    return f", {x:.4f} nats/byte" if x is not None else ""


def clock(seconds):
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m{int(seconds % 60):02d}s"


# ---------------------------------------------------------- the resume state
def training_state(*, optimizer, rngs, position, windows_per_step, windows, seed, fingerprint, best_val, eval_step,
                   world):
    """What ckpt.pt holds beyond the weights, as plain types, for an exact --resume: the optimizer's state, each
    rank's RNG states (`rngs`: rng_state's), the data position in the training order (`position`, with the
    global batch, the epoch, the seed and the data's `fingerprint` it indexes), the best validation loss so far
    and the step of the last evaluation, the number of processes."""
    data = {"position": position, "global_batch": windows_per_step, "windows": windows,
            "epoch": position // windows, "seed": seed, "fingerprint": fingerprint}
    return dict(optimizer=optimizer.state_dict(), rng=rngs, data=data, best_val_loss=best_val, eval_step=eval_step,
                world_size=world)


def check_resumable(ckpt, source):
    """--resume reads a checkpoint's training state: a best.pt (weights only), a checkpoint without that state, or
    one whose entries have other types than restore reads them as (another writer's, an older version's) is
    refused before the run claims out_dir, naming the odd entry, not a KeyError later."""
    if ckpt.get("saved_as") == "best.pt":
        step = ckpt.get("step")
        raise ValueError(f"{source} is a best.pt (step {step}'s weights, no optimizer, data position or RNG state): "
                         "--resume continues out_dir/ckpt.pt; start a run from these weights with --init_from "
                         f"{source}")
    if not {"optimizer", "step", "data", "rng"} <= ckpt.keys():
        raise ValueError(f"{source}: holds weights but no training state to resume; start from it with --init_from")
    data, rng, optimizer = ckpt["data"], ckpt["rng"], ckpt["optimizer"]
    number_or_none = (int, float, type(None))
    scores = ckpt.get("val_loss"), ckpt.get("best_val_loss")
    odd = [what for what, ok in (
        ("'step' is not a whole number >= 0", type(ckpt["step"]) is int and ckpt["step"] >= 0),
        ("'data' has no whole-number 'position' >= 0",
         isinstance(data, dict) and type(data.get("position")) is int and data["position"] >= 0),
        ("'optimizer' is not an optimizer state dict",
         isinstance(optimizer, dict) and {"state", "param_groups"} <= optimizer.keys()),
        ("'rng' is not a list of RNG states (torch, cuda, python, numpy) per process",
         isinstance(rng, list) and rng and all(
             isinstance(r, dict) and {"torch", "cuda", "python", "numpy"} <= r.keys() for r in rng)),
        ("'eval_step' is not a whole number", type(ckpt.get("eval_step")) in (int, type(None))),
        ("'val_loss' or 'best_val_loss' is not a number", all(isinstance(score, number_or_none) for score in scores)),
    ) if not ok]
    if odd:
        raise ValueError(f"{source}: cannot resume: {odd[0]} (a checkpoint of another program or version?); start "
                         "from its weights with --init_from")


def check_same_data(ckpt, source, data_dir, fingerprint, *, rank):
    """--resume reads on at the saved position in the training order, which means the same windows only in the
    same data: other data (the folder prepared again, or another one; `fingerprint`: data_dir's) is refused. A
    checkpoint older than the fingerprint cannot be checked: said once (rank 0). The fingerprint of a checkpoint
    written before it left the paths out is computed only for it (legacy)."""
    saved = ckpt["data"].get("fingerprint")
    if saved is None and rank == 0:
        say(f"note: {source} predates data fingerprints: cannot check that {data_dir} holds the data it was reading")
    elif saved not in (None, fingerprint) and saved != data_fingerprint(data_dir, legacy=True):
        raise ValueError(f"{source} was reading other data than {data_dir} now holds (fingerprint {saved}, now "
                         f"{fingerprint}: meta.json or the shards changed): its saved position would index other "
                         "windows. Resume on the data it was reading, or start from its weights with --init_from")


# chosen for the device an optimizer runs on, not saved with it
OPTIMIZER_KERNEL = ("fused", "foreach", "capturable")


def load_optimizer_state(optimizer, state_dict):
    """optimizer.load_state_dict(state_dict) keeping this optimizer's own kernel choices
    (OPTIMIZER_KERNEL) in each param group: a checkpoint written on a CPU (fused None) would
    otherwise make a GPU run's AdamW unfused. Torch moves the state (moments; steps where the kernel
    needs them there) to the parameters' device."""
    saved, own = state_dict.get("param_groups"), optimizer.param_groups
    fits = isinstance(saved, list) and len(saved) == len(own)
    if fits and all(isinstance(g, dict) for g in saved):
        groups = [{**g, **{k: mine[k] for k in OPTIMIZER_KERNEL if k in mine}}
                  for g, mine in zip(saved, own)]
        state_dict = {**state_dict, "param_groups": groups}
    optimizer.load_state_dict(state_dict)  # a state of another shape: torch's own error


def restore(ckpt, source, *, optimizer, rank, world, device) -> dict:
    """Continue where a checkpoint that passed check_resumable stopped: the optimizer's state and the RNG streams
    (each rank its own, when the number of processes is the same) -> the loop's counters there: step, position
    (in the training order), val_loss and eval_step (of the last evaluation), best_val, saved_step."""
    unfit = (ValueError, KeyError, TypeError, IndexError, RuntimeError)
    try:  # moments to the parameters' device, kernel kept
        load_optimizer_state(optimizer, ckpt["optimizer"])
    except unfit as e:
        raise ValueError(f"{source}: its optimizer state does not fit this model "
                         f"({one_line(e, 120)})") from None
    if len(ckpt["rng"]) == world:
        try:
            set_rng_state(ckpt["rng"][rank], device)
        except unfit as e:
            raise ValueError(f"{source}: its RNG state of rank {rank} is unreadable "
                             f"({one_line(e, 120)})") from None
    elif rank == 0:
        print(f"note: {source} was written by {len(ckpt['rng'])} processes, not {world}: the data "
              "order continues exactly, but each rank's RNG stays as this run's start set it (seed "
              "+ rank), so dropout draws differ from an unbroken run's")
    return dict(step=ckpt["step"], position=ckpt["data"]["position"], val_loss=ckpt.get("val_loss"),
                eval_step=ckpt.get("eval_step"), best_val=ckpt.get("best_val_loss"), saved_step=ckpt["step"])


def rng_state(device):
    """Every RNG this process uses (torch, CUDA, python, numpy), as plain types (tensors and lists)
    that weights_only loading accepts. Saved per rank, so on a CPU a run stopped and resumed logs
    the same losses, bit for bit, as one never stopped."""
    py, np_state = random.getstate(), np.random.get_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    numpy = [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]),
             float(np_state[4])]
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": [py[0], list(py[1]), py[2]],
            "numpy": numpy}


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))


def read_log(out_dir, event=None):
    """The records of out_dir's log.jsonl as Log wrote them, in order (a resumed run appends to the
    same file), each a dict with its "event": every record, or those of `event` ("start", "train",
    "eval", "end"). The one reader every tool uses."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if event is None or r["event"] == event]
