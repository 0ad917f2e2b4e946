"""
Checkpoints: reading, building the model they hold, and writing them: the one home of every script that
saves or loads one (what a training run's ckpt.pt holds beyond it for --resume: run_dir.py).

A checkpoint is a dict of plain types, so torch.load(weights_only=True) reads it: "model" (the state
dict), "model_config" (GPTConfig's fields), "tokenizer" (how to turn ids into text), and training state
where train.py wrote it (optimizer, step, RNG, ...). Loading builds the model on the meta device and
assigns the file's memory-mapped tensors to it: no random init, no second copy. The file is always read on
the CPU: what a model on another device takes from it is moved there (load_weights), and what it does not
take (AdamW's moments, in sampling) never leaves the file.
"""

import errno
import os
import sys
from dataclasses import asdict, replace

import torch

from bincode_gpt.exits import one_line, say
from bincode_gpt.files import atomic_open, DISK_FULL, disk_full, file_problem
from bincode_gpt.memory import available_memory, memory_bytes
from model import GPT, PRESETS, GPTConfig, get_config


def checkpoint_dict(model: GPT, tokenizer, **extra):
    """The plain-typed dict load_checkpoint reads: weights, config, tokenizer, and any training state."""
    return {"model": model.state_dict(), "model_config": asdict(model.config), "tokenizer": tokenizer, **extra}


def atomic_torch_save(obj, path):
    """torch.save to `path` atomically; torch reports a failed write (a full disk) as a RuntimeError,
    turned here into the OSError it is."""
    try:
        with atomic_open(path) as f:
            torch.save(obj, f)
    except RuntimeError as e:  # errno EIO, so callers that add their own context can use .strerror
        cause = e.__context__  # torch reports the file's own OSError as "unexpected pos": a full disk says so
        if isinstance(cause, OSError) and cause.errno in DISK_FULL:
            raise disk_full(path, cause.errno) from None
        raise OSError(errno.EIO, f"write failed ({one_line(e)})", str(path)) from None


def checkpoint_file(path):
    """The file a checkpoint path names: a file as given; in a folder its ckpt.pt, else its best.pt (what a run
    whose last save was removed leaves, or a copied best). Where there is none, a FileNotFoundError says what
    the folder holds instead (checkpoint_hint)."""
    file = path
    if os.path.isdir(path):
        latest, best = os.path.join(path, "ckpt.pt"), os.path.join(path, "best.pt")
        file = best if os.path.lexists(best) and not os.path.lexists(latest) else latest
    problem = file_problem(file)
    if problem == "no such file":
        raise FileNotFoundError(f"{file}: no checkpoint there{checkpoint_hint(file)}")
    if problem:
        raise FileNotFoundError(f"{file}: {problem}")
    return file


def checkpoint_hint(file):
    """What the folder of a missing checkpoint file holds instead, and what to do with it: the run's other
    checkpoint, a Hugging Face model, or a run's log alone; '' for none of them."""
    folder = os.path.dirname(file) or "."
    beside = [n for n in ("ckpt.pt", "best.pt")
              if n != os.path.basename(file) and os.path.isfile(os.path.join(folder, n))]
    if beside:
        what = " (the weights of the run's best evaluation)" if beside[0] == "best.pt" else ""
        return f"; {os.path.join(folder, beside[0])}{what} is there: name that file, or the folder {folder}"
    if os.path.isfile(os.path.join(folder, "config.json")):
        return (f"; {folder} holds a Hugging Face model (config.json): convert it to a native checkpoint first: "
                f"python -m tools.convert hf2native {folder} OUT")
    if os.path.isfile(os.path.join(folder, "log.jsonl")):
        return (f"; {folder} holds a run's log.jsonl but neither of its checkpoints (ckpt.pt, best.pt): they were "
                "removed, or the run stopped before its first save")
    return ""


def read_checkpoint(path, int8=False):
    """The checkpoint dict in a .pt file, or in a folder holding ckpt.pt (else best.pt, said on stderr); a clear
    error names the file. An int8 checkpoint (python -m tools.convert native2int8) is refused unless int8=True:
    only sampling can use it.

    The file is memory-mapped on the CPU (copy-on-write: writing a tensor never touches the file), so its
    tensors are read from the page cache when first used and never held twice; a tensor no one uses (the
    optimizer state, to a sampler) is never read, and never reaches a GPU.
    """
    if not os.fspath(path):
        raise ValueError("the checkpoint is '' (empty): name a .pt file or a folder holding ckpt.pt")
    file = checkpoint_file(path)
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise ValueError(f"{file}: cannot read this checkpoint, truncated or not a PyTorch file "
                         f"({type(e).__name__}: {one_line(e)})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        what = f"a {type(ckpt).__name__}"
        if isinstance(ckpt, dict) and ckpt and all(isinstance(t, torch.Tensor) for t in ckpt.values()):
            what = f"a bare state dict ({len(ckpt)} tensor{'s' * (len(ckpt) != 1)}, no model_config)"
        raise ValueError(f"{file}: not a checkpoint of this project (needs 'model' and 'model_config'; it holds "
                         f"{what})")
    if not (isinstance(ckpt["model"], dict) and all(isinstance(t, torch.Tensor) for t in ckpt["model"].values())):
        raise ValueError(f"{file}: its 'model' entry is not a dict of tensors (a {type(ckpt['model']).__name__})")
    ckpt["model"] = unwrapped(ckpt["model"], file)
    if not (isinstance(ckpt["model_config"], dict) and all(isinstance(k, str) for k in ckpt["model_config"])):
        raise ValueError(f"{file}: its 'model_config' entry is not a dict of GPTConfig fields "
                         f"(a {type(ckpt['model_config']).__name__})")
    if "quantization" in ckpt and not int8:
        entry = ckpt["quantization"]
        source = entry.get("source") if isinstance(entry, dict) else None
        made_from = (source.get("path") if isinstance(source, dict) else None) or "a float32 checkpoint"
        raise ValueError(f"{file}: an int8 checkpoint for sampling (tools/convert.py native2int8 of {made_from}): only "
                         "sample.py reads it; train, convert or evaluate the float32 checkpoint it was made from")
    if os.path.isdir(path) and os.path.basename(file) == "best.pt":
        say(f"note: {path} holds no ckpt.pt: reading {file}, the weights of the run's best evaluation (step "
            f"{ckpt.get('step')})")
    return ckpt


def unwrapped(state_dict, file):
    """The state dict of a model saved through a wrapper, its keys as the model's own: torch.compile's
    `_orig_mod.` (on the model or any of its modules) and DDP's or DataParallel's leading `module.` dropped,
    said once on stderr. A ValueError where two keys come to name one tensor."""
    keys, dropped = {}, []
    for key in state_dict:
        parts = key.split(".")
        lead = 0
        while lead < len(parts) - 1 and parts[lead] in ("module", "_orig_mod"):
            lead += 1
        kept = [p for p in parts[lead:-1] if p != "_orig_mod"] + parts[-1:]
        own = ".".join(kept)
        if own != key:
            dropped += [p for p in parts[:-1] if p in ("module", "_orig_mod") and p not in dropped]
        if own in keys:
            raise ValueError(f"{file}: its weights hold both {keys[own]} and {key}, one tensor of the model under a "
                             "wrapper's prefix and not")
        keys[own] = key
    if not dropped:
        return state_dict
    say(f"note: {file}: its weights were saved from a wrapped model (torch.compile, DDP): read without their "
        f"{' and '.join(repr(p + '.') for p in dropped)} prefixes")
    return {own: state_dict[key] for own, key in keys.items()}


def check_finite(tensors, what, doing):
    """Refuse NaN or inf weights, naming the tensors: a diverged or corrupt checkpoint is not `doing`'d."""
    bad = [n for n, t in tensors.items() if t.is_floating_point() and not all_finite(t)]
    if bad:
        raise ValueError(f"{what} holds NaN or inf values in {', '.join(bad[:10])}: refusing to {doing} a diverged "
                         "or corrupt checkpoint")


def all_finite(t):
    """Whether a float tensor holds no NaN or inf, making no temporary of its size (torch.isfinite makes
    two, one its abs: 268 MB for the paper preset's output head, on top of the memory-mapped file).
    aminmax is one pass with no temporary, and NaN or inf anywhere shows in its min or max; dtypes neither
    takes (float8) are read 2**20 values at a time, as float32."""
    if t.numel() == 0:
        return True
    if t.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        lo, hi = torch.aminmax(t)
        return bool(lo.isfinite() & hi.isfinite())
    return all(bool(torch.isfinite(block.float()).all()) for block in t.reshape(-1).split(2**20))


def load_weights(model, state_dict, source, device=None):
    """Make model's parameters and buffers the state dict's tensors, each on `device` (default: the device of
    the model's parameters) in the model's dtype: assigned, so where both already match (the CPU) no copy is
    made. A model built on the meta device as a placeholder names its real device here. A meta tensor in the
    state dict is a stand-in that stays one (quantize.split_int8's: pack_int8 replaces it). A missing,
    unexpected or misshapen tensor is a ValueError naming `source` (check_fits)."""
    own = model.state_dict()
    check_fits(own, state_dict, source)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    # assign: the model takes these very tensors (memory-mapped on the CPU), moved only to another device: a
    # parameter left on the file's device would meet the model's buffers (lift, rotary tables) on the GPU
    model.load_state_dict({k: t if t.is_meta else t.to(device=device, dtype=own[k].dtype)
                           for k, t in state_dict.items()}, assign=True)


def check_fits(own, state_dict, source):
    """Refuse a state dict whose tensors are not those of the model's state dict `own` (names and shapes): a
    ValueError naming `source` and the first misfits (misfits)."""
    problems = misfits(own, state_dict)
    if problems:
        raise ValueError(f"{source}: weights do not fit its model_config: {problems}")


def misfits(own, state_dict):
    """The first unexpected key of a state dict, its first missing key and its first misshapen tensor against
    the model's state dict `own`, each with how many more there are, in one line; '' where it fits."""
    unexpected = [k for k in state_dict if k not in own]
    missing = [k for k in own if k not in state_dict]
    misshapen = [f"{k}: {tuple(t.shape)} in the file, {tuple(own[k].shape)} in the model" for k, t in state_dict.items()
                 if k in own and t.shape != own[k].shape]
    said = []
    for what, found in (("unexpected", unexpected), ("missing", missing), ("misshapen", misshapen)):
        if found:
            more = f" (and {len(found) - 1} more {what})" if len(found) > 1 else ""
            said.append(f"{what} {found[0]}{more}")
    return "; ".join(said)


def check_buildable(config: GPTConfig, state_dict, source):
    """Before a model is built from a checkpoint's model_config: its n_layer must be the number of blocks
    its weights hold (else the first keys that differ are named), and what GPT builds besides the weights
    (memory_bytes) must fit in memory. A config from another writer (n_layer = 10**9, block_size = 10**12)
    would otherwise build for hours, or end in the allocator."""
    blocks = len({k.split(".")[1] for k in state_dict if k.startswith("blocks.")})
    if blocks != config.n_layer:
        with torch.device("meta"):  # the names alone, of one block past the weights' at most: no memory
            own = GPT(replace(config, n_layer=min(config.n_layer, blocks + 1))).state_dict()
        raise ValueError(f"{source}: its model_config says n_layer {config.n_layer:,}, but its weights hold {blocks} "
                         f"blocks: {misfits(own, state_dict)}")
    need, free = memory_bytes(config), available_memory(torch.device("cpu"))
    if free is not None and need > free:
        raise ValueError(f"{source}: its model_config (block_size {config.block_size:,}, vocab_size "
                         f"{config.vocab_size:,}, n_embd {config.n_embd:,}) needs {need / 2**30:,.1f} GiB of tables "
                         f"besides its weights; {free / 2**30:,.1f} GiB is free")


def check_weights(config: GPTConfig, state_dict, source, doing):
    """A checkpoint's weights, before a model of `config` takes them: finite (check_finite, naming the tensor),
    buildable (check_buildable: another writer's config may ask for 10**9 blocks), and those of GPT(config)
    (names and shapes: check_fits, against a model built on the meta device, so no memory, no values drawn)."""
    check_finite(state_dict, source, doing)
    check_buildable(config, state_dict, source)
    with torch.device("meta"):
        check_fits(GPT(config).state_dict(), state_dict, source)


def model_config(preset, asked, *, meta, meta_path, ckpt, source, note=print) -> GPTConfig:
    """A training run's model shape, lowest to highest precedence: the preset (vocab_size: the data's, `meta`
    its meta.json, read from `meta_path`), the checkpoint's model_config (`ckpt`, read from `source`, or None),
    the overrides (`asked`: GPTConfig fields by name, None: unset), which may change a checkpoint's dropout
    alone."""
    asked = {k: v for k, v in asked.items() if v is not None}
    if ckpt is not None:
        check_same_shape(ckpt["model_config"], asked, source)
        try:
            return replace(GPTConfig(**ckpt["model_config"]), **asked)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: bad model_config in checkpoint: {e}") from None
    # no all-zeros <pad> row on a token of this data's tokenizer: a preset's is dropped there
    asked = pad_off_the_tokens(asked, preset, meta, note)
    try:
        return get_config(preset, **{"vocab_size": meta["vocab_size"], **asked})
    except ValueError as e:  # e.g. the paper preset's pad_token_id 57344 with a smaller vocabulary
        vocab = asked.get("vocab_size", meta["vocab_size"])
        raise ValueError(f"preset {preset!r} with vocab_size {vocab} (from {meta_path} unless --vocab_size): "
                         f"{e}") from None


def check_same_shape(theirs, asked, source):
    """An override (`asked`: GPTConfig fields by name) must agree with the checkpoint's model_config (`theirs`);
    dropout alone may change."""
    clash = [f"{k}={theirs.get(k)!r} (asked {v!r})" for k, v in asked.items() if k != "dropout" and theirs.get(k) != v]
    if clash:
        raise ValueError(f"{source}: the checkpoint has another shape than this run asks for: {', '.join(clash)}")


def pad_off_the_tokens(asked, preset, meta, note):
    """`asked` (GPTConfig fields by name, over the preset's) with no <pad> on a token: an all-zeros <pad> row must
    be an id text cannot produce (the rule above model.BinaryCodeInput), and a tiktoken vocabulary has no <pad>,
    every id below the data's vocab_size being a token or end-of-text. A preset's pad_token_id there (the paper
    preset's 57344, the released tokenizer's) is dropped with a note; an asked one is refused."""
    pad = asked.get("pad_token_id", PRESETS.get(preset, {}).get("pad_token_id"))
    if pad is None or not 0 <= pad < meta["vocab_size"]:
        return asked
    if "pad_token_id" in asked:
        raise ValueError(f"--pad_token_id {pad} is a token of the data's tokenizer ({meta['encoding']}, "
                         f"{meta['vocab_size']:,} ids): its code row would be all zeros, so that token would enter "
                         "the model as a constant vector (docs/zero-code.md); leave --pad_token_id unset")
    note(f"note: preset {preset}'s pad_token_id {pad} (the released tokenizer's <pad>) is a token of this data's "
         "tokenizer: every id keeps its own code (pad_token_id none)")
    return {**asked, "pad_token_id": None}


def model_from_weights(config, state_dict, source):
    """GPT(config) holding the state dict's tensors, on the CPU: built on the meta device (its weights no
    memory, no values drawn; its tables built on the CPU from the config), then the tensors assigned, so
    nothing is left on meta but the state dict's own stand-ins."""
    check_buildable(config, state_dict, source)
    with torch.device("meta"):
        model = GPT(config)
    load_weights(model, state_dict, source, device="cpu")
    return model


def load_checkpoint(path, device="cpu", *, dtype=None, quantize=None, int8=False, pack=True, purpose=None):
    """Read a checkpoint and build its model on `device`, in `dtype` (None: float32, as built): returns
    (model, ckpt), the one entry of every script that loads a model to run it. The model is built on the CPU
    from the file's map and then moved, so only its weights reach the device (ckpt's other tensors stay in
    the file). With `purpose` (what the weights are loaded to do: "sample from"), NaN or inf weights are
    refused first (check_finite), on the CPU, before any cast.

    int8 weights (quantize.py: a CPU path, float32 between the matmuls): quantize="int8" rounds a float
    checkpoint's linear layers, refused before the file is read where `device` or `dtype` cannot run them;
    int8=True also takes an int8 checkpoint (python -m tools.convert native2int8), whose model is int8
    already. Either is packed for oneDNN on a thread of its own unless pack=False (a model that will run
    compiled), and is never cast: Module.to would write back each tensor it read over a layer just packed."""
    if quantize:  # imported here, as below: training and float sampling never load quantize.py
        from bincode_gpt.quantize import check_quantize

        check_quantize(quantize, device, dtype or torch.float32)
    ckpt = read_checkpoint(path, int8)
    try:
        config = GPTConfig(**ckpt["model_config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: its model_config does not fit GPTConfig ({e})") from None
    int8_weights = is_int8(ckpt)
    if int8_weights:
        from bincode_gpt.quantize import check_quantize, pack_int8, split_int8

        check_quantize("int8", device, dtype or torch.float32)
        file = checkpoint_file(path)
        state_dict, rows = split_int8(ckpt, file)
        model = pack_int8(model_from_weights(config, state_dict, file), rows, file, pack)
    else:
        model = model_from_weights(config, ckpt["model"], path)
    if purpose:  # a diverged model would print "!!!!!!" greedily
        check_finite(model.state_dict(), path, purpose)
    if int8_weights:
        return model, ckpt
    model = model.to(device, dtype)
    if quantize:
        from bincode_gpt.quantize import quantize_int8

        model = quantize_int8(model, pack=pack)
    return model, ckpt


def is_int8(ckpt):
    """Whether a checkpoint dict is an int8 checkpoint (python -m tools.convert native2int8)."""
    return "quantization" in ckpt


if __name__ == "__main__":
    from bincode_gpt.exits import not_a_command
    sys.exit(not_a_command("bincode_gpt/checkpoint.py", "sample from a checkpoint by `python sample.py --ckpt FILE`, "
                                                         "convert one by `python -m tools.convert --help`"))
