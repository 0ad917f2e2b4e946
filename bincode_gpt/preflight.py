"""
The checks train.py runs before its first step, so that a run that cannot work is refused at once, with the
numbers, and before it writes anything: the settings, the data, the checkpoint to start from, its tokenizer
against the data's, the model's shape (preset, checkpoint, overrides), whether the model and batch fit in memory,
and the training windows that start on a token the model reads as a constant vector.
"""

import math
import os
import sys
from dataclasses import fields, replace
from typing import NamedTuple

import numpy as np
import torch

from bincode_gpt.checkpoint import check_buildable, check_finite, check_resumable, read_checkpoint
from bincode_gpt.files import file_stamp
from bincode_gpt.memory import check_training_fits
from bincode_gpt.shards import load_meta, prepare_command
from bincode_gpt.tokenizer import all_ones_id, check_tokenizer, tiktoken_entry
from model import PRESETS, GPTConfig, constant_input_ids, get_config

MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig))  # train.TrainConfig overrides each; None keeps the preset's


class Start(NamedTuple):
    """What a run starts from, read and checked by read_start."""
    meta: dict  # the data's meta.json
    source: str | None  # the checkpoint it starts from: --resume's out_dir/ckpt.pt, --init_from's file, or None
    ckpt: dict | None  # that checkpoint, read
    stamp: tuple | None  # which file --resume read (files.file_stamp): run_dir.claim_out_dir checks it is still there
    model_config: GPTConfig
    tokenizer: dict  # the data's tokenizer entry, saved with every checkpoint


def read_start(cfg, *, rank, world, device, dtype):
    """Everything a run starts from, read and checked in the order a run meets it, before anything is written ->
    Start: the settings, the data's meta.json, the checkpoint to start from (--resume: its training state), its
    tokenizer against the data's, the model's shape (model_config), the checkpoint's weights (finite, and as many
    blocks as its model_config says), and whether training fits in memory."""
    check_settings(resolve_settings(cfg))  # min_lr's default follows lr
    meta = load_meta(cfg.data_dir)  # a ShardError names what is missing or malformed
    source = cfg.ckpt_path if cfg.resume else cfg.init_from
    stamp = file_stamp(source) if cfg.resume else None
    best = os.path.join(cfg.out_dir, "best.pt")
    if cfg.resume and stamp is None and os.path.isfile(best):
        raise FileNotFoundError(f"{source}: no checkpoint there to resume; {best} holds weights only (no optimizer, "
                                f"data position or RNG state): start a run from them with --init_from {best}")
    ckpt = read_checkpoint(source) if source else None
    if cfg.resume:
        check_resumable(ckpt, source)  # its training state, with the types restore reads
    tokenizer = tiktoken_entry(meta)
    if ckpt is not None:
        check_tokenizer(ckpt, meta, source, cfg.data_dir)
    mcfg = model_config(cfg, meta, ckpt, source, note=print if rank == 0 else lambda text: None)
    if ckpt is not None:
        check_finite(ckpt["model"], source, "train from")  # names the tensor, as sample.py does
        check_buildable(mcfg, ckpt["model"], source)  # another writer's config may ask for 10**9 blocks
    check_training_fits(cfg, mcfg, world, device, dtype)  # refused with the numbers, not built until OOM
    if mcfg.vocab_size != meta["vocab_size"] and rank == 0:
        print(f"note: model vocab_size {mcfg.vocab_size} differs from the data's {meta['vocab_size']}")
    return Start(meta=meta, source=source, ckpt=ckpt, stamp=stamp, model_config=mcfg, tokenizer=tokenizer)


def resolve_settings(cfg):
    """Fill in the settings whose default follows another: min_lr = lr / 10, so that --lr alone never contradicts
    a fixed min_lr. -> cfg."""
    if cfg.min_lr is None:
        cfg.min_lr = cfg.lr / 10
    return cfg


# ----------------------------------------------------------------------------- checks on the settings
def check_settings(cfg):
    """Counts and rates in range: a value the run cannot use is refused, never read as 'off' or 'never'."""
    for name in ("batch_size", "grad_accum", "eval_steps", "log_interval"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("max_steps", "eval_interval", "save_interval", "warmup_steps"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be 0 or more, got {getattr(cfg, name)}")
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):  # finite in float32, where AdamW uses them
        if not (0 <= getattr(cfg, name) <= torch.finfo(torch.float32).max):
            off = " (0: no clipping)" if name == "grad_clip" else ""
            raise ValueError(f"{name} must be a finite number >= 0{off}, got {getattr(cfg, name)}")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    if not 0 <= cfg.seed < 2**63:  # numpy's data order takes no negative seed, torch none past 2**64
        raise ValueError(f"seed must be in [0, 2**63), got {cfg.seed}")
    if cfg.lr_decay_steps is not None and cfg.lr_decay_steps < 1:
        raise ValueError(f"lr_decay_steps must be at least 1 (or none: max_steps), got {cfg.lr_decay_steps}")
    if cfg.peak_flops is not None and not (math.isfinite(cfg.peak_flops) and cfg.peak_flops > 0):
        raise ValueError(f"peak_flops must be a finite number > 0 (or none), got {cfg.peak_flops}")
    if cfg.resume and cfg.overwrite:
        raise ValueError("--resume continues the checkpoint in out_dir and --overwrite replaces it: pass one of them")
    if cfg.resume and cfg.init_from is not None:
        raise ValueError("--resume continues out_dir's ckpt.pt and --init_from starts afresh from another checkpoint's "
                         "weights: pass one of them")
    if cfg.min_lr > cfg.lr:
        raise ValueError(f"min_lr {cfg.min_lr:g} is above lr {cfg.lr:g}: the cosine decays from lr down to min_lr")
    for name in ("out_dir", "init_from"):  # --data_dir: prepare_data.load_meta
        if getattr(cfg, name) == "":
            raise ValueError(f"--{name} is '' (empty): name a {'file' if name == 'init_from' else 'folder'}")


def check_window_starts(split, meta, model, data_dir):
    """Warn, before the first step, when a bias-free binary or affine model would read training windows
    that start with a token it reads as a constant vector (model.constant_input_ids): a deep model
    diverges on a step that holds one (docs/zero-code.md). A warning, not a refusal: shallow models train
    on such data, and data prepared before the tokenizer kept text off the constant codes must still
    train and resume as it did. Names the count and, where the tokenizer's ids are the cause, the
    command that prepares the data again with the ids that keep text off them."""
    constant = constant_input_ids(model)
    if not constant:
        return
    firsts = np.concatenate([t[: n * split.block : split.block] for t, n in zip(split.shards, np.diff(split.starts))])
    hit = np.isin(firsts, constant)
    if not hit.any():
        return
    found = np.unique(firsts[hit]).tolist()
    entry = tiktoken_entry(meta)
    reserved = {0: entry["reserve_zero"], all_ones_id(meta["vocab_size"]): entry["reserve_ones"]}
    if all(reserved.get(i) is False for i in found):  # text sits there only because the data predates a default
        shard = len(split.shards[0]) if len(split.shards) > 1 else None
        fix = f"; prepare the data with the ids that keep text off them: {prepare_command(meta, data_dir, shard)}"
    else:
        fix = ("; the model's input puts them there (its pad_token_id row, or an affine A and b drawn before "
               "the affine input kept its constant codes on ids 0 and 2^K - 1)")
    names = [f"{i} (end-of-text)" if i == meta.get("eot_token") else str(i) for i in found]
    print(f"warning: {int(hit.sum()):,} of {split.n:,} training windows start with token id "
          f"{', '.join(names)}, which this model (no biases, {model.config.input} input) reads as a "
          f"constant vector: a deep model diverges on them (docs/zero-code.md){fix}", file=sys.stderr)


def model_config(cfg, meta, ckpt, path, note=print):
    """The model's shape, lowest to highest precedence: the preset (vocab_size from the data's meta.json),
    the checkpoint's model_config (--resume or --init_from), explicit overrides (--n_layer=...). An
    override that clashes with a checkpoint is an error (dropout may differ)."""
    asked = {k: getattr(cfg, k) for k in MODEL_FIELDS if getattr(cfg, k) is not None}
    if ckpt is None:
        # The rule above model.BinaryCodeInput: an all-zeros <pad> row must be an id text cannot produce. A
        # tiktoken vocabulary has no <pad>: every id below the data's vocab_size is a token or end-of-text.
        pad = asked.get("pad_token_id", PRESETS.get(cfg.preset, {}).get("pad_token_id"))
        if pad is not None and 0 <= pad < meta["vocab_size"]:
            if "pad_token_id" in asked:
                raise ValueError(f"--pad_token_id {pad} is a token of the data's tokenizer ({meta['encoding']}, "
                                 f"{meta['vocab_size']:,} ids): its code row would be all zeros, so that token would "
                                 "enter the model as a constant vector (docs/zero-code.md); leave --pad_token_id unset")
            note(f"note: preset {cfg.preset}'s pad_token_id {pad} (the released tokenizer's <pad>) is a token of "
                 "this data's tokenizer: every id keeps its own code (pad_token_id none)")
            asked["pad_token_id"] = None
        try:
            return get_config(cfg.preset, **{"vocab_size": meta["vocab_size"], **asked})
        except ValueError as e:  # e.g. the paper preset's pad_token_id 57344 with a smaller vocabulary
            raise ValueError(f"preset {cfg.preset!r} with vocab_size {asked.get('vocab_size', meta['vocab_size'])} "
                             f"(from {os.path.join(cfg.data_dir, 'meta.json')} unless --vocab_size): {e}") from None
    theirs = ckpt["model_config"]
    clash = [f"{k}={theirs.get(k)!r} (asked {v!r})" for k, v in asked.items() if k != "dropout" and theirs.get(k) != v]
    if clash:
        raise ValueError(f"{path}: the checkpoint has another shape than this run asks for: {', '.join(clash)}")
    try:
        return replace(GPTConfig(**theirs), **asked)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad model_config in checkpoint: {e}") from None
