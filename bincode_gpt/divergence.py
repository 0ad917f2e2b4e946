"""
A diverged run stops unsaved (Divergence): a training loss or gradient that is not finite or far above an
untrained model's, a validation loss of that kind, or non-finite weights about to be saved stop the run before
the step is applied, the evaluation recorded or the checkpoint written, so the last checkpoint stays good; the
message names the setting most likely at fault, read from the run's own settings.
"""

import math
from dataclasses import dataclass

import torch

from bincode_gpt.run_dir import Log


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
