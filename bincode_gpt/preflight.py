"""
The checks train.py runs before its first step, so that a run that cannot work is refused at once,
with the numbers, and before it writes anything: the settings, the data, the checkpoint to start
from and its tokenizer against the data's, the model's shape against the checkpoint's, whether the
model and batch fit in memory; and a warning for training windows that start on a token the model
reads as a constant vector. Each takes plain values (settings by name, paths, the data's meta.json,
a checkpoint dict, a GPTConfig).
"""

import math
import os
import sys
from typing import NamedTuple

import numpy as np
import torch

from bincode_gpt.checkpoint import check_buildable, check_finite, check_resumable, read_checkpoint
from bincode_gpt.files import file_stamp
from bincode_gpt.memory import check_training_fits
from bincode_gpt.run_dir import data_fingerprint
from bincode_gpt.shards import Split, load_meta, prepare_command
from bincode_gpt.tokenizer import all_ones_id, check_tokenizer, tiktoken_entry
from model import GPT, PRESETS, GPTConfig, constant_input_ids


class Start(NamedTuple):
    """What a run starts from, read and checked by read_start."""
    meta: dict  # the data's meta.json
    source: str | None  # the checkpoint: --resume's out_dir/ckpt.pt, --init_from's file, or None
    ckpt: dict | None  # that checkpoint, read
    stamp: tuple | None  # which file --resume read (files.file_stamp): claim_out_dir checks it
    tokenizer: dict  # the data's tokenizer entry, saved with every checkpoint
    fingerprint: str  # the data's (run_dir.data_fingerprint): what a saved data position indexes


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
    """The model about to be built from `config`: a checkpoint's weights finite and as many blocks
    as config says, and training's memory (refused with the numbers, not built until OOM)."""
    if ckpt is not None:
        check_finite(ckpt["model"], source, "train from")  # names the tensor, as sample.py does
        # another writer's config may ask for 10**9 blocks
        check_buildable(config, ckpt["model"], source)
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
    print(f"warning: {int(hit.sum()):,} of {split.n:,} training windows start with token id "
          f"{', '.join(names)}, which this model (no biases, {model.config.input} input) reads as "
          f"a constant vector: a deep model diverges on them (docs/zero-code.md){fix}",
          file=sys.stderr)
