"""
What a training run reports: log.jsonl gets every event (rank 0 writes it, a whole line at a time),
stdout a line every log_interval steps with the throughput, MFU and the time still to go.
"""

import json
import os
import time
from dataclasses import asdict, dataclass, field

from bincode_gpt.files import DISK_FULL
from bincode_gpt.run_dir import kept_checkpoints, remove_replaced_best
from model import GPTConfig


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
    peak: float | None  # FLOP/s of one device
    per_byte: tuple = (None, None)  # train and val tokens per byte of text, where the data says
    fd: int | None = None  # log.jsonl, rank 0 only
    step_times: list = field(default_factory=list)
    window_start: int = 0  # the steps since the last printed line
    mark: float = field(default_factory=time.time)  # when the last step (or the set-up) ended
    eval_s: float = 0.0  # the last evaluation's time, for the ETA

    @property
    def path(self):
        return os.path.join(self.out_dir, "log.jsonl")

    def start(self, *, config: GPTConfig, params, device, dtype, windows, step, resume, overwrite,
              train_config):
        """Open log.jsonl (rank 0, under the lock: appended to by --resume, else new; an --overwrite
        removes the replaced run's best.pt), say what is trained (`config`: the GPTConfig, `params`:
        its num_params()), on what, from which step, and record the start."""
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
        mfu = self.flops * per_step / dt / (self.peak * self.world) if self.peak else None
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
            if self.peak:
                mfu_s = f" | mfu {100 * self.flops * tok_s / (self.peak * self.world):.1f}%"
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
