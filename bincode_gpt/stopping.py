"""
How a run stops early: on a signal it finishes the step, saves and exits 0; on a diverged state (a loss or
gradient that is not finite, or far above an untrained model's) it stops without saving, so the last checkpoint
written stays good.
"""

import math
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist


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
        first, self.requested = not self.requested, True
        print(f"\n{signal.Signals(signum).name}: finishing this step, saving, then exiting", file=sys.stderr,
              flush=True)
        if first and dist.is_torchelastic_launched() and os.environ.get("RANK") == "0":
            print(TORCHRUN_KILLS, file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


# torchrun forwards a signal it gets to its ranks and SIGKILLs those still running --shutdown_timeout seconds later
TORCHRUN_KILLS = ("torchrun SIGKILLs the ranks --shutdown_timeout seconds after it forwards a signal (default 30): a "
                  "step and save that take longer are lost, the last ckpt.pt kept; on slow storage start torchrun "
                  "with --shutdown_timeout=600 (docs/usage.md)")


def mean_loss_and_stop(run, loss, requested):
    """-> (the loss averaged over ranks, whether any rank was signalled), in one all-reduce, so every rank
    sees the same loss and stops at the same step."""
    flags = torch.stack([loss, torch.tensor(float(requested), device=run.device)])
    if run.distributed:
        dist.all_reduce(flags)
        flags[0] /= run.world
    return flags[0].item(), flags[1].item() > 0


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
                             f"untouched: {last}. Most likely at fault: {likely_fault(run.cfg, step)}.")


EXTREME_LR = 0.02  # an AdamW step moves each weight by up to about lr: here by the weights' own init scale (model.py)


def likely_fault(cfg, step):
    """The setting a divergence at `step` most likely comes from, read from the run's own settings, in this order:
    a weight decay with lr x weight_decay >= 1 (AdamW's decoupled decay then zeroes or flips the matrices each step)
    where the decay is what is extreme (above 1) or the lr is not; a divergence soon after a warmup reached a
    moderate lr (the ramp too short); else the learning rate."""
    lr, wd, warmup = cfg.lr, cfg.weight_decay, cfg.warmup_steps
    if lr * wd >= 1 and (wd > 1 or lr < EXTREME_LR):
        return (f"--weight_decay {wd:g}: AdamW's decoupled decay scales each weight matrix by 1 - lr x weight_decay = "
                f"{1 - lr * wd:.3g} a step, which zeroes or flips it: use a weight decay far below 1 / lr = "
                f"{1 / lr:.4g} (0.1 is usual)")
    if lr < EXTREME_LR and warmup <= step <= warmup + max(warmup, 10):
        return (f"--warmup_steps {warmup}: the run diverged {step - warmup} step(s) after its warmup reached --lr "
                f"{lr:g}: a longer warmup (e.g. --warmup_steps {max(4 * warmup, 100)}) ramps up to it more gently, "
                "or try a lower --lr")
    when = ", during the warmup (below its peak)" if step < warmup else ""
    return f"--lr {lr:g}{when}: try a lower --lr, or --grad_clip"


def check_step(run, state, loss, norm):
    """A bad training loss or gradient stops the run before the optimizer step applies it."""
    why = why_diverged(loss, norm, run.raw_model.config.vocab_size)
    stop_if_bad(run, state, why, state.step + 1, loss=loss, grad_norm=norm)


def check_val_loss(run, state, loss):
    """A bad validation loss stops the run before it is recorded or saved."""
    why = why_diverged(loss, None, run.raw_model.config.vocab_size)
    stop_if_bad(run, state, why and f"validation {why}", state.step, val_loss=loss)


def check_state(run, state, one_batch_loss):
    """Stop unless the state about to be saved is good: finite weights, and its validation loss (this
    step's evaluation, else one batch's: `one_batch_loss()`) passes `why_diverged`. Every rank takes part."""
    finite = torch.stack([p.isfinite().all() for p in run.raw_model.parameters()]).all().item()
    loss = state.val_loss if state.eval_step == state.step else None
    if finite and loss is None:
        loss = one_batch_loss()
    why = "non-finite weights" if not finite else why_diverged(loss, None, run.raw_model.config.vocab_size)
    stop_if_bad(run, state, why and f"validation {why}", state.step)
