"""
A training run's checks: each reads and refuses (or warns), so that a run that cannot work stops
with the numbers. Before the first step, before anything is written: the settings, the data, the
checkpoint to start from and its tokenizer against the data's (and, resumed, its data against the
data now there), the model's shape and weights against the checkpoint's, whether the model and batch
fit in memory; a warning for training windows that start on a token the model reads as a constant
vector. During the run (Divergence): a diverged state stops it without saving. Each takes plain
values (settings by name, paths, the data's meta.json, a checkpoint dict, a GPTConfig).
"""

import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from bincode_gpt.checkpoint import check_buildable, check_finite, check_fits, read_checkpoint
from bincode_gpt.exits import say
from bincode_gpt.files import file_stamp
from bincode_gpt.memory import check_training_fits
from bincode_gpt.run_dir import Log
from bincode_gpt.shards import Split, data_fingerprint, load_meta, prepare_command
from bincode_gpt.tokenizer import all_ones_id, check_tokenizer, tiktoken_entry
from model import GPT, PRESETS, GPTConfig, constant_input_ids


class Start(NamedTuple):
    """What a run starts from, read and checked by read_start."""
    meta: dict  # the data's meta.json
    source: str | None  # the checkpoint: --resume's out_dir/ckpt.pt, --init_from's file, or None
    ckpt: dict | None  # that checkpoint, read
    stamp: tuple | None  # which file --resume read (files.file_stamp): claim_out_dir checks it
    tokenizer: dict  # the data's tokenizer entry, saved with every checkpoint
    fingerprint: str  # the data's (shards.data_fingerprint): what a saved data position indexes


def read_start(data_dir, *, out_dir, resume, init_from) -> Start:
    """The data and the checkpoint a run starts from, read and checked in the order a run meets
    them, before anything is written -> Start: the data's meta.json, the checkpoint (--resume:
    out_dir's ckpt.pt and its training state; --init_from: its file), its tokenizer against the
    data's."""
    meta = load_meta(data_dir)  # a ShardError names what is missing or malformed
    source = os.path.join(out_dir, "ckpt.pt") if resume else init_from
    stamp = file_stamp(source) if resume else None
    best = os.path.join(out_dir, "best.pt")
    if resume and stamp is None and os.path.isfile(best):
        raise FileNotFoundError(f"{source}: no checkpoint there to resume; {best} holds weights "
                                "only (no optimizer, data position or RNG state): start a run from "
                                f"them with --init_from {best}")
    ckpt = read_checkpoint(source) if source else None
    if resume:
        check_resumable(ckpt, source)  # its training state, with the types restore reads
    if ckpt is not None:
        check_tokenizer(ckpt, meta, source, data_dir)
    return Start(meta=meta, source=source, ckpt=ckpt, stamp=stamp, tokenizer=tiktoken_entry(meta),
                 fingerprint=data_fingerprint(data_dir))


def check_resumable(ckpt, source):
    """--resume reads a checkpoint's training state: a best.pt (weights only), a checkpoint without
    that state, or one whose entries have other types than run_dir.restore reads them as (another
    writer's, an older version's) is refused before the run claims out_dir, naming the odd entry,
    not a KeyError later."""
    if ckpt.get("saved_as") == "best.pt":
        step = ckpt.get("step")
        raise ValueError(f"{source} is a best.pt (step {step}'s weights, no optimizer, data "
                         "position or RNG state): --resume continues out_dir/ckpt.pt; start a run "
                         f"from these weights with --init_from {source}")
    if not {"optimizer", "step", "data", "rng"} <= ckpt.keys():
        raise ValueError(f"{source}: holds weights but no training state to resume; start from it "
                         "with --init_from")
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
             isinstance(r, dict) and {"torch", "cuda", "python", "numpy"} <= r.keys()
             for r in rng)),
        ("'eval_step' is not a whole number", type(ckpt.get("eval_step")) in (int, type(None))),
        ("'val_loss' or 'best_val_loss' is not a number",
         all(isinstance(score, number_or_none) for score in scores)),
    ) if not ok]
    if odd:
        raise ValueError(f"{source}: cannot resume: {odd[0]} (a checkpoint of another program or "
                         "version?); start from its weights with --init_from")


def check_settings(settings: dict):
    """Counts and rates in range, `settings` by name (train.TrainConfig's fields): a value the run
    cannot use is refused, never read as 'off' or 'never'."""
    for name in ("batch_size", "grad_accum", "eval_steps", "log_interval"):
        if settings[name] < 1:
            raise ValueError(f"{name} must be at least 1, got {settings[name]}")
    for name in ("max_steps", "eval_interval", "save_interval", "warmup_steps"):
        if settings[name] < 0:
            raise ValueError(f"{name} must be 0 or more, got {settings[name]}")
    # finite in float32, where AdamW uses them
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
        if not (0 <= settings[name] <= torch.finfo(torch.float32).max):
            off = " (0: no clipping)" if name == "grad_clip" else ""
            raise ValueError(f"{name} must be a finite number >= 0{off}, got {settings[name]}")
    for name in ("beta1", "beta2"):
        if not 0 <= settings[name] < 1:
            raise ValueError(f"{name} must be in [0, 1), got {settings[name]}")
    # numpy's data order takes no negative seed, torch none past 2**64
    if not 0 <= settings["seed"] < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {settings['seed']}")
    decay = settings["lr_decay_steps"]
    if decay is not None and decay < 1:
        raise ValueError(f"lr_decay_steps must be at least 1 (or none: max_steps), got {decay}")
    peak = settings["peak_flops"]
    if peak is not None and not (math.isfinite(peak) and peak > 0):
        raise ValueError(f"peak_flops must be a finite number > 0 (or none), got {peak}")
    if settings["resume"] and settings["overwrite"]:
        raise ValueError("--resume continues the checkpoint in out_dir and --overwrite replaces "
                         "it: pass one of them")
    if settings["resume"] and settings["init_from"] is not None:
        raise ValueError("--resume continues out_dir's ckpt.pt and --init_from starts afresh from "
                         "another checkpoint's weights: pass one of them")
    if settings["min_lr"] > settings["lr"]:
        raise ValueError(f"min_lr {settings['min_lr']:g} is above lr {settings['lr']:g}: the "
                         "cosine decays from lr down to min_lr")
    for name in ("out_dir", "init_from"):  # --data_dir: shards.load_meta
        if settings[name] == "":
            what = "file" if name == "init_from" else "folder"
            raise ValueError(f"--{name} is '' (empty): name a {what}")


def check_same_shape(theirs, asked, source):
    """An override (`asked`: GPTConfig fields by name) must agree with the checkpoint's model_config
    (`theirs`); dropout alone may change."""
    clash = [f"{k}={theirs.get(k)!r} (asked {v!r})" for k, v in asked.items()
             if k != "dropout" and theirs.get(k) != v]
    if clash:
        raise ValueError(f"{source}: the checkpoint has another shape than this run asks for: "
                         f"{', '.join(clash)}")


def pad_off_the_tokens(asked, preset, meta, note):
    """`asked` (GPTConfig fields by name, over the preset's) with no <pad> on a token: an all-zeros
    <pad> row must be an id text cannot produce (the rule above model.BinaryCodeInput), and a
    tiktoken vocabulary has no <pad>, every id below the data's vocab_size being a token or
    end-of-text. A preset's pad_token_id there (the paper preset's 57344, the released tokenizer's)
    is dropped with a note; an asked one is refused."""
    pad = asked.get("pad_token_id", PRESETS.get(preset, {}).get("pad_token_id"))
    if pad is None or not 0 <= pad < meta["vocab_size"]:
        return asked
    if "pad_token_id" in asked:
        raise ValueError(f"--pad_token_id {pad} is a token of the data's tokenizer "
                         f"({meta['encoding']}, {meta['vocab_size']:,} ids): its code row would be "
                         "all zeros, so that token would enter the model as a constant vector "
                         "(docs/zero-code.md); leave --pad_token_id unset")
    note(f"note: preset {preset}'s pad_token_id {pad} (the released tokenizer's <pad>) is a token "
         "of this data's tokenizer: every id keeps its own code (pad_token_id none)")
    return {**asked, "pad_token_id": None}


def check_model(config: GPTConfig, ckpt, source, *, batch_size, eval_steps, world, device, dtype):
    """The model about to be built from `config`: a checkpoint's weights finite and those of
    `config`'s model (names and shapes, checked against one built on the meta device), and
    training's memory (refused with the numbers, not built until OOM)."""
    if ckpt is not None:
        check_finite(ckpt["model"], source, "train from")  # names the tensor, as sample.py does
        # another writer's config may ask for 10**9 blocks
        check_buildable(config, ckpt["model"], source)
        with torch.device("meta"):  # the shapes alone: no memory, no values drawn
            check_fits(GPT(config).state_dict(), ckpt["model"], source)
    check_training_fits(config, batch_size=batch_size, eval_steps=eval_steps, world=world,
                        device=device, dtype=dtype)


def check_window_starts(split: Split, meta: dict, model: GPT, data_dir: str):
    """Warn, before the first step, when a bias-free binary or affine model would read training
    windows that start with a token it reads as a constant vector (model.constant_input_ids): a deep
    model diverges on a step that holds one (docs/zero-code.md). A warning, not a refusal: shallow
    models train on such data, and data prepared before the tokenizer kept text off the constant
    codes must still train and resume as it did. Names the count and, where the tokenizer's ids are
    the cause, the command that prepares the data again with the ids that keep text off them."""
    constant = constant_input_ids(model)
    if not constant:
        return
    firsts = np.concatenate([t[: n * split.block : split.block]
                             for t, n in zip(split.shards, np.diff(split.starts))])
    hit = np.isin(firsts, constant)
    if not hit.any():
        return
    found = np.unique(firsts[hit]).tolist()
    entry = tiktoken_entry(meta)
    reserved = {0: entry["reserve_zero"], all_ones_id(meta["vocab_size"]): entry["reserve_ones"]}
    # text sits there only because the data predates a default
    if all(reserved.get(i) is False for i in found):
        shard = len(split.shards[0]) if len(split.shards) > 1 else None
        fix = ("; prepare the data with the ids that keep text off them: "
               f"{prepare_command(meta, data_dir, shard)}")
    else:
        fix = ("; the model's input puts them there (its pad_token_id row, or an affine A and b "
               "drawn before the affine input kept its constant codes on ids 0 and 2^K - 1)")
    names = [f"{i} (end-of-text)" if i == meta.get("eot_token") else str(i) for i in found]
    say(f"warning: {int(hit.sum()):,} of {split.n:,} training windows start with token id "
        f"{', '.join(names)}, which this model (no biases, {model.config.input} input) reads as "
        f"a constant vector: a deep model diverges on them (docs/zero-code.md){fix}")


def check_same_data(ckpt, source, data_dir, fingerprint, *, rank):
    """--resume reads on at the saved position in the training order, which means the same windows
    only in the same data: other data (the folder prepared again, or another one; `fingerprint`:
    data_dir's) is refused. A checkpoint older than the fingerprint cannot be checked: said once
    (rank 0)."""
    saved = ckpt["data"].get("fingerprint")
    if saved is None and rank == 0:
        say(f"note: {source} predates data fingerprints: cannot check that {data_dir} holds the "
            "data it was reading")
    elif saved is not None and saved not in (fingerprint, data_fingerprint(data_dir, legacy=True)):
        raise ValueError(f"{source} was reading other data than {data_dir} now holds (fingerprint "
                         f"{saved}, now {fingerprint}: meta.json or the shards changed): its saved "
                         "position would index other windows. Resume on the data it was reading, "
                         "or start from its weights with --init_from")


# ---------------------------------------------------------- during the run
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
