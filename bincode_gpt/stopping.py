"""
How a run stops early: on a signal it finishes the step, saves and exits 0; on a diverged state (a
loss or gradient that is not finite, or far above an untrained model's) it stops without saving, so
the last checkpoint written stays good.
"""

import math
import os
import signal
import sys
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bincode_gpt.progress import Log


class GracefulStop:
    """SIGINT/SIGTERM set a flag that the loop checks after each step: it saves and exits 0. A
    second SIGINT raises KeyboardInterrupt at once (exit 130); a checkpoint being written then is
    dropped and the previous one stays. Under DDP the loop all-reduces the flag with the loss, so
    every rank stops at the same step. torchrun itself re-raises a signal sent to it and exits 1
    even when every rank saved and exited 0: to stop a DDP run cleanly, signal the ranks (pkill
    -TERM -P <torchrun pid>), and torchrun exits 0."""

    def __enter__(self):
        self.requested = False
        self.old = {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        first = not self.requested
        self.requested = True
        print(f"\n{signal.Signals(signum).name}: finishing this step, saving, then exiting",
              file=sys.stderr, flush=True)
        if first and dist.is_torchelastic_launched() and os.environ.get("RANK") == "0":
            print(TORCHRUN_KILLS, file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


# torchrun forwards a signal it gets to its ranks and SIGKILLs those still running
# --shutdown_timeout
# seconds later
TORCHRUN_KILLS = ("torchrun SIGKILLs the ranks --shutdown_timeout seconds after it forwards a "
                  "signal (default 30): a step and save that take longer are lost, the last "
                  "ckpt.pt kept; on slow storage start torchrun with --shutdown_timeout=600 "
                  "(docs/usage.md)")


def why_diverged(loss, norm, vocab_size):
    """Why a state with this loss and gradient norm cannot be trained on, or None. A state is good
    when its loss and gradient norm are finite and the loss is at most 2 ln V: an untrained model
    scores about ln V, a diverged one, finite or not, far more."""
    if not math.isfinite(loss):
        return f"non-finite loss ({loss})"
    if norm is not None and not math.isfinite(norm):
        return f"non-finite gradient norm ({norm})"
    if loss > 2 * math.log(vocab_size):
        return f"diverged: loss {loss:.4g} above 2 ln V = {2 * math.log(vocab_size):.2f}"
    return None


# an AdamW step moves each weight by up to about lr: here by the weights' own init scale (model.py)
EXTREME_LR = 0.02


def likely_fault(step, *, lr, weight_decay, warmup_steps):
    """The setting a divergence at `step` most likely comes from, read from the run's own settings,
    in this order: a weight decay with lr x weight_decay >= 1 (AdamW's decoupled decay then zeroes
    or flips the matrices each step) where the decay is what is extreme (above 1) or the lr is not;
    a divergence soon after a warmup reached a moderate lr (the ramp too short); else the learning
    rate."""
    lr_wd = lr * weight_decay
    if lr_wd >= 1 and (weight_decay > 1 or lr < EXTREME_LR):
        return (f"--weight_decay {weight_decay:g}: AdamW's decoupled decay scales each weight "
                f"matrix by 1 - lr x weight_decay = {1 - lr_wd:.3g} a step, which zeroes or flips "
                f"it: use a weight decay far below 1 / lr = {1 / lr:.4g} (0.1 is usual)")
    if lr < EXTREME_LR and warmup_steps <= step <= warmup_steps + max(warmup_steps, 10):
        return (f"--warmup_steps {warmup_steps}: the run diverged {step - warmup_steps} step(s) "
                f"after its warmup reached --lr {lr:g}: a longer warmup (e.g. --warmup_steps "
                f"{max(4 * warmup_steps, 100)}) ramps up to it more gently, or try a lower --lr")
    when = ", during the warmup (below its peak)" if step < warmup_steps else ""
    return f"--lr {lr:g}{when}: try a lower --lr, or --grad_clip"


@dataclass
class Divergence:
    """The checks that stop a diverged run (FloatingPointError, exit 1) without saving, so the last
    checkpoint written stays good: each records the event in the log and names the setting most
    likely at fault. `saved_step`: the step of the last ckpt.pt written, or None."""
    vocab_size: int
    lr: float
    weight_decay: float
    warmup_steps: int
    ckpt_path: str
    log: Log

    def check_step(self, loss, norm, step, *, saved_step):
        """A bad training loss or gradient, at the step it would make, stops the run before the
        optimizer applies it."""
        why = why_diverged(loss, norm, self.vocab_size)
        self.stop_if(why, step, saved_step, loss=loss, grad_norm=norm)

    def check_val_loss(self, loss, step, *, saved_step):
        """A bad validation loss stops the run before it is recorded or saved."""
        why = why_diverged(loss, None, self.vocab_size)
        self.stop_if(why and f"validation {why}", step, saved_step, val_loss=loss)

    def check_state(self, model: torch.nn.Module, val_loss, one_batch_loss, *, step, saved_step):
        """Stop unless the state about to be saved is good: finite weights, and its validation loss
        (`val_loss`: this step's evaluation, else None: `one_batch_loss()`) passes why_diverged.
        Every rank takes part."""
        finite = torch.stack([p.isfinite().all() for p in model.parameters()]).all().item()
        if finite and val_loss is None:
            val_loss = one_batch_loss()
        why = "non-finite weights" if not finite else why_diverged(val_loss, None, self.vocab_size)
        self.stop_if(why and f"validation {why}", step, saved_step)

    def stop_if(self, why, step, saved_step, **entry):
        if why is None:
            return
        self.log.record(event="diverged", step=step, problem=why, **entry)
        last = "none was written"
        if saved_step is not None:
            last = f"{self.ckpt_path} (step {saved_step})"
        fault = likely_fault(step, lr=self.lr, weight_decay=self.weight_decay,
                             warmup_steps=self.warmup_steps)
        raise FloatingPointError(f"{why} at step {step}: stopped without saving; the last good "
                                 f"checkpoint is untouched: {last}. Most likely at fault: {fault}.")
