"""
What a training run reports: log.jsonl gets every event (rank 0 writes it, a whole line at a time),
stdout a line every log_interval steps with the throughput, MFU and the time still to go.
"""

import json
import time
from dataclasses import asdict, dataclass, field

from bincode_gpt.run_dir import open_outputs


@dataclass
class Log:
    """log.jsonl gets every event (rank 0 writes it); stdout a line every log_interval steps, with
    the throughput over those steps."""
    cfg: object  # train.TrainConfig
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
    per_byte: tuple = (None, None)  # train and val tokens per byte of text, where the data says

    @property
    def tokens_per_step(self):
        return self.cfg.batch_size * self.cfg.grad_accum * self.world * self.block_size

    def start(self, run, state, dtype):
        """Open log.jsonl (rank 0: an --overwrite removes the replaced run's best.pt), say what is
        trained, on what, from which step, and record the start."""
        cfg, mcfg = self.cfg, run.raw_model.config
        if self.master:
            self.file = open_outputs(cfg)
            n = run.raw_model.num_params()
            starting = "resuming at" if cfg.resume else "starting at"
            print(f"{mcfg.n_layer} layers x {mcfg.n_embd}, input={mcfg.input}, "
                  f"vocab {mcfg.vocab_size}: {n['trainable']:,} trainable, "
                  f"{n['frozen']:,} frozen values | {self.world} process(es) on {run.device}, "
                  f"{dtype} | {self.tokens_per_step:,} tokens/step, "
                  f"{run.train_split.n:,} train windows/epoch | {starting} step {state.step}")
        self.record(event="start", step=state.step, world_size=self.world, device=str(run.device),
                    train_config=asdict(cfg), model_config=asdict(mcfg))
        self.per_byte = (run.train_split.tokens_per_byte, run.val_split.tokens_per_byte)
        self.mark = time.time()

    def record(self, **entry):
        if self.file:
            self.file.write(json.dumps(entry) + "\n")  # a whole line or none (run_dir.LineLog)

    def close(self):
        if self.file:
            self.file.close()

    def evaluation(self, state, improved):
        self.eval_s = time.time() - self.mark
        per_byte = state.val_loss * self.per_byte[1] if self.per_byte[1] else None
        self.record(event="eval", step=state.step, val_loss=state.val_loss,
                    best_val_loss=state.best_val, val_loss_per_byte=per_byte)
        if self.master:
            print(f"step {state.step}: val loss {state.val_loss:.4f}{nats_per_byte(per_byte)}"
                  f"{' (best)' if improved else ''}")

    def step(self, state, loss, norm, lr, dt, stopping):
        cfg = self.cfg
        tokens = self.tokens_per_step
        mfu = self.flops * tokens / dt / (self.peak * self.world) if self.peak else None
        self.record(event="train", step=state.step, loss=loss, lr=lr, grad_norm=norm, dt=dt,
                    tokens_per_s=tokens / dt, mfu=mfu, tokens=state.position * self.block_size)
        self.step_times.append(dt)
        self.mark = time.time()
        due = state.step % cfg.log_interval == 0 or state.step == cfg.max_steps or stopping
        if self.master and due:
            window = self.step_times[self.window_start :]
            # tokens/s and the ETA from these steps' pace, without this process's first step: its
            # warm-up (torch.compile compiling, the allocator growing) is not the run's speed
            steady = window[1:] if self.window_start == 0 and len(window) > 1 else window
            tok_s = len(steady) * tokens / sum(steady)
            self.window_start = len(self.step_times)
            mfu_s = ""
            if self.peak:
                mfu_s = f" | mfu {100 * self.flops * tok_s / (self.peak * self.world):.1f}%"
            per_byte = nats_per_byte(loss * self.per_byte[0] if self.per_byte[0] else None)
            print(f"step {state.step}/{cfg.max_steps} | loss {loss:.4f}{per_byte} | lr {lr:.2e} | "
                  f"{tok_s:,.0f} tok/s{mfu_s} | eta {clock(self.eta(state.step, steady))}",
                  flush=True)

    def eta(self, step, steady):
        """Seconds left: the steps to go at these steps' pace, and the evaluations to go at the
        last one's time."""
        cfg = self.cfg
        evals = 0
        if cfg.eval_interval > 0:  # at each multiple of eval_interval after this step, and the end
            evals = cfg.max_steps // cfg.eval_interval - step // cfg.eval_interval
            evals += cfg.max_steps % cfg.eval_interval > 0
        return (cfg.max_steps - step) * sum(steady) / len(steady) + evals * self.eval_s

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
