"""
Convert checkpoints between the paper's Hugging Face releases and this project's native format.

    python -m tools.convert hf2native HF_FOLDER OUT_FOLDER [--layout auto|tile|interleave] [--overwrite]
    python -m tools.convert native2hf CKPT OUT_FOLDER [--dtype float32] [--overwrite]
    python -m tools.convert native2int8 CKPT OUT_FOLDER [--overwrite]

hf2native reads a local copy of a released checkpoint (config.json with the BVVConfig fields; weights
as safetensors, sharded or single, or pytorch_model.bin; tokenizer files) and writes OUT/ckpt.pt, which
sample.py and train.py --init_from load. native2hf writes a stock GPTNeoXForCausalLM folder (no remote
code) that AutoModelForCausalLM, AutoTokenizer, generate() and lm-evaluation-harness load directly.
native2int8 writes OUT/ckpt.pt with int8 linear weights (quantize.py's, one scale per row): sample.py
samples from it in a quarter of the memory, with the tokens of `--quantize int8` on the source.

Design choices:
- The released state-dict names are not public, so names go through one table, MAPPING: nanoGPT,
  GPT-NeoX and Llama-style names (and this project's own). Nothing is guessed: an unmapped or missing
  name, a wrong shape, a table that is not the fixed code, NaN/inf weights, or an affine checkpoint
  without its A and b stops the conversion with a list of what was found.
- Nothing public says how the release lifts its K code bits to model width either. `--layout auto`
  (the default) builds the model both ways, scores each by next-token loss on a short English
  paragraph (ENGLISH below, tokenized with the checkpoint's tokenizer) and keeps the better one.
- The export writes the fixed code as GPT-NeoX's V x n_embd input table (the code lifted to width),
  absent biases as zeros, and keeps a "native_gpt" entry in config.json so that hf2native restores
  the native model exactly.
- Output folders: every file is written atomically; one conversion writes an OUT at a time; an OUT that
  is, holds or lies inside the source folder is refused; a non-empty OUT is refused unless --overwrite,
  which replaces the model and tokenizer files and removes old ones the new folder does not have
  (a stale shard index would otherwise be read with the new weights). Other files are left alone.
- File names read from a config or checkpoint (shards, tokenizer) must be plain names in their folder.

Needs torch; safetensors for .safetensors files; tokenizers for tokenizer.json (scoring layouts with a
release's tokenizer, exporting a tiktoken one). transformers is not needed here.
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import one_line, run_main

import hashlib
import json
import re
from dataclasses import dataclass, replace

import torch

from bincode_gpt.checkpoint import (atomic_torch_save, check_finite, checkpoint_dict, checkpoint_file, load_checkpoint,
                                   model_from_weights)
from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.files import atomic_write, file_problem, LOCK_NAME, staged, writer_lock
from bincode_gpt.quantize import int8_checkpoint
from bincode_gpt.tokenizer import encoding_fields, file_in, load_text_codec, mergeable_ranks
from model import GPT, GPTConfig, canonical_code, code_bits

# layout auto scores both layouts on this (any plain English works; a model that reads its input
# through the wrong layout sees scrambled bits and cannot predict it)
ENGLISH = (
    "The sun rises in the east and sets in the west. Water boils at one hundred degrees at sea level, "
    "and it freezes at zero. Paris is the capital of France, and Berlin is the capital of Germany. "
    "Children learn to read and write at school, where their teachers help them to understand the world. "
    "Many people drink a cup of coffee or tea in the morning before they go to work."
)
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]  # what sample.py and the export read
# what a loader may read beside tokenizer.json: removed from OUT by an --overwrite that does not write them
OLD_TOKENIZER_FILES = TOKENIZER_FILES + ["special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
                                         "added_tokens.json"]


class ConversionError(ValueError):
    """The input cannot be converted faithfully; the message says why and lists what was found."""


# ----------------------------------------------------------------------------------- the name table
# Every source tensor name is matched, after optional wrapper prefixes (model., transformer.,
# gpt_neox., ...), against these rows in order; the first match gives its native name. `how`:
#   conv1d      nanoGPT/GPT-2 names: transposed when the checkpoint is in HF-GPT2 Conv1D form
#   neox_qkv    GPT-NeoX fused rows are [q_h, k_h, v_h] per head: reordered to ours, [q; k; v]
#   q / k / v   Llama-style split projections: concatenated into our fused qkv
PREFIX = r"^(?:(?:model|transformer|gpt_neox|base_model|module|decoder)\.)*"
N = r"(?:h|layers|blocks)\.(\d+)\."
MAPPING = [
    # convention, source pattern (after PREFIX), native name template, how
    ("nanoGPT", r"wte\.weight", "embed.weight", None),
    ("nanoGPT", N + r"ln_1\.(weight|bias)", r"blocks.\1.ln_1.\2", None),
    ("nanoGPT", N + r"attn\.c_attn\.(weight|bias)", r"blocks.\1.attn.qkv.\2", "conv1d"),
    ("nanoGPT", N + r"attn\.c_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2", "conv1d"),
    ("nanoGPT", N + r"ln_2\.(weight|bias)", r"blocks.\1.ln_2.\2", None),
    ("nanoGPT", N + r"mlp\.c_fc\.(weight|bias)", r"blocks.\1.mlp.fc.\2", "conv1d"),
    ("nanoGPT", N + r"mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp.proj.\2", "conv1d"),
    ("nanoGPT", r"ln_f\.(weight|bias)", r"ln_f.\1", None),
    ("GPT-NeoX", r"embed_in\.weight", "embed.weight", None),
    ("GPT-NeoX/Llama", N + r"input_layernorm\.(weight|bias)", r"blocks.\1.ln_1.\2", None),
    ("GPT-NeoX", N + r"attention\.query_key_value\.(weight|bias)", r"blocks.\1.attn.qkv.\2", "neox_qkv"),
    ("GPT-NeoX", N + r"attention\.dense\.(weight|bias)", r"blocks.\1.attn.proj.\2", None),
    ("GPT-NeoX/Llama", N + r"post_attention_layernorm\.(weight|bias)", r"blocks.\1.ln_2.\2", None),
    ("GPT-NeoX", N + r"mlp\.dense_h_to_4h\.(weight|bias)", r"blocks.\1.mlp.fc.\2", None),
    ("GPT-NeoX", N + r"mlp\.dense_4h_to_h\.(weight|bias)", r"blocks.\1.mlp.proj.\2", None),
    ("GPT-NeoX", r"final_layer_norm\.(weight|bias)", r"ln_f.\1", None),
    ("GPT-NeoX", r"embed_out\.weight", "lm_head.weight", None),
    ("Llama", r"embed_tokens\.weight", "embed.weight", None),
    ("Llama", N + r"self_attn\.q_proj\.(weight|bias)", r"blocks.\1.attn.qkv.\2", "q"),
    ("Llama", N + r"self_attn\.k_proj\.(weight|bias)", r"blocks.\1.attn.qkv.\2", "k"),
    ("Llama", N + r"self_attn\.v_proj\.(weight|bias)", r"blocks.\1.attn.qkv.\2", "v"),
    ("Llama", N + r"self_attn\.o_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2", None),
    ("Llama", N + r"mlp\.up_proj\.(weight|bias)", r"blocks.\1.mlp.fc.\2", None),
    ("Llama", N + r"mlp\.down_proj\.(weight|bias)", r"blocks.\1.mlp.proj.\2", None),
    ("Llama", r"norm\.(weight|bias)", r"ln_f.\1", None),
    ("native", r"embed\.(weight|A|b)", r"embed.\1", None),
    ("native", N + r"(ln_1|ln_2|attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.(weight|bias)", r"blocks.\1.\2.\3", None),
    ("any", r"lm_head\.weight", "lm_head.weight", None),
    ("affine code", r"(?:\w+\.)?(?:affine_A|code_A|recode_A|A)", "embed.A", None),
    ("affine code", r"(?:\w+\.)?(?:affine_b|code_b|recode_b|b)", "embed.b", None),
]
ROWS = [(conv, re.compile(PREFIX + pat + "$"), tmpl, how) for conv, pat, tmpl, how in MAPPING]
# known non-weights, skipped on purpose: rotary tables, causal-mask buffers, our lift index
SKIP = re.compile(r"(?:^|\.)(?:inv_freq|(?:rope|rotary)\w*\.(?:cos|sin)\w*|(?:cos|sin)_cached|rope_(?:cos|sin)"
                  r"|attn\.(?:bias|masked_bias)|attention\.(?:bias|masked_bias)|(?:causal_)?mask|lift)$")


def map_name(name):
    """Source tensor name -> (convention, native name, how), "skip", or None when unmapped."""
    if SKIP.search(name):
        return "skip"
    for conv, rx, tmpl, how in ROWS:
        m = rx.match(name)
        if m:
            return conv, m.expand(tmpl), how
    return None


def listing(named, limit=60):
    rows = [f"  {n}: {tuple(t.shape) if hasattr(t, 'shape') else t}" for n, t in named]
    return "\n".join(rows[:limit] + ([f"  ... and {len(rows) - limit} more"] if len(rows) > limit else []))


# ----------------------------------------------------------------------------------- files and folders
# what a conversion writes into OUT: a killed conversion's temp files of these names are removed
WRITTEN = ("ckpt.pt", "model.safetensors", "config.json", "generation_config.json", *OLD_TOKENIZER_FILES)


def check_out(src, out, overwrite):
    """Refuse an OUT that is the source folder, lies inside it or holds it (an --overwrite would replace
    the source's own files; for a checkpoint file, its folder must not be OUT), and a non-empty OUT
    unless --overwrite. Checked before any work, and again as OUT's one writer."""
    if not os.fspath(out):
        raise ConversionError("OUT is '' (empty): name a folder")
    folder = os.path.realpath(src if os.path.isdir(src) else os.path.dirname(os.path.abspath(src)))
    o = os.path.realpath(out)
    where = ("is" if o == folder else "is inside" if o.startswith(folder + os.sep) and os.path.isdir(src) else
             "holds" if folder.startswith(o + os.sep) and os.path.isdir(src) else None)
    if where:
        raise ConversionError(f"OUT {out} {where} the source {'' if os.path.isdir(src) else 'folder of '}{src}: "
                              "write the conversion to a folder of its own")
    held = sorted(set(os.listdir(out)) - {LOCK_NAME}) if os.path.isdir(out) else []
    if held and not overwrite:
        raise ConversionError(f"{out} is not empty (it holds {', '.join(held[:6])}): pass "
                              "--overwrite to replace its model and tokenizer files (other files are kept)")


def remove_stale(out, written, weights):
    """After an --overwrite: remove the old tokenizer files (and, for an HF folder, weight files and
    shard indexes) that this conversion did not write, so that none is read with the new files."""
    for f in os.listdir(out):
        old_weights = weights and re.search(r"\.safetensors$|\.index\.json$|^pytorch_model.*\.bin$", f)
        if f not in written and (f in OLD_TOKENIZER_FILES or old_weights):
            os.remove(os.path.join(out, f))


def copy_file(src, dst):
    with open(src, "rb") as f:
        atomic_write(dst, f.read())


def check_tokenizer_entry(entry, folder):
    """A checkpoint's tokenizer entry: None, {"kind": "tiktoken", ...} or {"kind": "hf", "file": name}."""
    if entry is None or isinstance(entry, dict) and entry.get("kind") == "tiktoken":
        return entry
    if isinstance(entry, dict) and entry.get("kind") == "hf":
        file_in(folder, entry.get("file", "tokenizer.json"), "the tokenizer entry")
        return entry
    raise ConversionError(f"unknown tokenizer entry {entry!r}")


# ------------------------------------------------------------------------------------- reading
def read_json(path):
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark (Windows editors) is no JSON
            raw = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConversionError(f"{path} holds a {type(raw).__name__}, expected a JSON object")
    return raw


def read_weights(folder):
    """All tensors of an HF folder: sharded (*.index.json) or single safetensors, else pytorch_model.bin."""
    files = sorted(os.listdir(folder))
    index = next((f for f in ("model.safetensors.index.json", "pytorch_model.bin.index.json") if f in files), None)
    weight_map = read_json(os.path.join(folder, index)).get("weight_map") if index else None
    if index and not isinstance(weight_map, dict):
        raise ConversionError(f"{index} has no weight_map object")
    shards = sorted(set(weight_map.values())) if index else (
        [f for f in files if f.lower().endswith(".safetensors")] or [f for f in files if f == "pytorch_model.bin"])
    if not shards:
        raise ConversionError(f"no weights in {folder}: expected *.safetensors (optionally with "
                              f"model.safetensors.index.json) or pytorch_model.bin; found {files}")
    paths = {shard: file_in(folder, shard, index or folder) for shard in shards}
    for shard, path in paths.items():  # a file that is missing or no file is named before any package is asked for
        problem = file_problem(path)
        if problem:
            raise ConversionError(f"{index} lists {shard}, which is not in {folder}"
                                  if index and problem == "no such file" else f"{path}: {problem}")
    if any(s.lower().endswith(".safetensors") for s in shards):
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ConversionError("reading .safetensors files needs the safetensors package: "
                                  "pip install safetensors") from None
    tensors = {}
    for shard, path in paths.items():
        try:  # torch.load maps the file instead of reading it
            part = (load_file(path, device="cpu") if shard.lower().endswith(".safetensors")
                    else torch.load(path, map_location="cpu", weights_only=True, mmap=True))
        except Exception as e:
            raise ConversionError(f"cannot read {path}: {one_line(e)} (is the file truncated or corrupt?)") from None
        if not isinstance(part, dict) or not all(isinstance(t, torch.Tensor) for t in part.values()):
            raise ConversionError(f"{path} does not hold a dict of tensors")
        for name, t in part.items():
            if name in tensors:
                raise ConversionError(f"tensor {name} appears in more than one weight file (again in {shard})")
            tensors[name] = t
    lost = sorted(n for n in weight_map or {} if n not in tensors)
    if lost:
        raise ConversionError(f"{index} lists tensors that its shards do not hold: {lost[:20]}")
    return tensors


def read_hf_config(folder):
    """The GPTConfig fields a BVV (or GPT-NeoX / GPT-2 / Llama-like) config.json gives, and its raw dict."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        native = [n for n in ("ckpt.pt", "best.pt") if os.path.isfile(os.path.join(folder, n))]
        if native:
            raise ConversionError(f"no config.json in {folder}: it holds a native checkpoint ({native[0]}), not a "
                                  "Hugging Face model (native2hf converts a native checkpoint to one)")
        raise ConversionError(f"no config.json in {folder}: is this a Hugging Face model folder?")
    raw = read_json(path)

    def first(*keys, default=None):
        return next((raw[k] for k in keys if raw.get(k) is not None), default)

    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope = rope if isinstance(rope, dict) else {}
    fields = {
        "vocab_size": first("vocab_size"),
        "block_size": first("block_size", "max_position_embeddings", "n_positions", "n_ctx", "seq_len"),
        "n_embd": first("n_embd", "d_model", "hidden_size"),  # not n_embed: that is the input width (16 for codes)
        "n_layer": first("n_layer", "num_hidden_layers", "num_layers"),
        "n_head": first("n_head", "num_attention_heads", "n_heads"),
        "pad_token_id": first("pad_token_id", "pad_id"),
        "rope_base": first("rope_base", "rope_theta", "rotary_emb_base", default=rope.get("rope_theta")),
    }
    missing = [k for k in ("vocab_size", "block_size", "n_head") if fields[k] is None]
    if missing:
        raise ConversionError(f"{path} lacks {missing}; it has {sorted(raw)}")
    for k in ("vocab_size", "block_size", "n_embd", "n_layer", "n_head", "pad_token_id"):
        v = fields[k]
        if v is not None and (type(v) is not int or v < (k != "pad_token_id")):
            raise ConversionError(f"{path}: {k} must be a {'positive' if k != 'pad_token_id' else 'non-negative'} "
                                  f"integer, got {v!r}")
    if fields["rope_base"] is None:
        print("note: config.json gives no RoPE base; assuming 10000 (not confirmed for the release)", file=sys.stderr)
        fields["rope_base"] = 10000.0
    if type(fields["rope_base"]) not in (int, float):
        raise ConversionError(f"{path}: the RoPE base must be a number, got {fields['rope_base']!r}")
    eps = raw.get("layer_norm_eps", raw.get("layer_norm_epsilon"))
    if type(eps) in (int, float) and abs(eps - 1e-5) > 1e-12:
        print(f"note: config layer_norm_eps = {eps}; the native model uses 1e-5", file=sys.stderr)
    meta = raw.get("native_gpt") or {}
    if not isinstance(meta, dict):
        raise ConversionError(f"{path}: native_gpt must be an object, got {meta!r}")
    return fields, raw, meta


def variant_from_model_type(model_type):
    """The release's names: model_n_embed_16_binary_* -> binary, *affine* -> affine, model_n_embed_1024_* -> learned."""
    mt = model_type.lower() if isinstance(model_type, str) else ""
    if "affine" in mt:
        return "affine"
    if "binary" in mt:
        return "binary"
    return "learned" if re.match(r"model_n_embed_\d+_n_layer", mt) else None


# ------------------------------------------------------------------------------------ HF -> native
def gather(tensors, n_head, n_embd):
    """Rename source tensors through MAPPING; return (native dict, native -> source names, conventions)."""
    mapped, unmapped = {}, []
    for name, t in tensors.items():
        m = map_name(name)
        if m is None:
            unmapped.append((name, t))
        elif m != "skip":
            mapped[name] = m
    if unmapped:
        raise ConversionError("tensors with no row in convert.MAPPING (add one if the release uses them):\n"
                              + listing(unmapped) + "\nall tensors found:\n" + listing(sorted(tensors.items())))
    # HF-GPT2 Conv1D stores (in, out): detectable from the fused qkv or fc shape, never square
    conv1d = any(how == "conv1d" and native.endswith(("qkv.weight", "fc.weight")) and tensors[name].shape[0] == n_embd
                 for name, (_, native, how) in mapped.items())
    out, origin, parts = {}, {}, {}
    for name, (conv, native, how) in mapped.items():
        t = tensors[name]
        if how == "conv1d" and conv1d and t.dim() == 2:
            t = t.t()
        elif how == "neox_qkv":
            if t.shape[0] != 3 * n_embd:
                raise ConversionError(f"{name} has shape {tuple(t.shape)}, expected first dim 3 * {n_embd}")
            # (H, 3, D, ...) -> (3, H, D, ...): per-head [q_h, k_h, v_h] rows -> ours, [q; k; v]
            t = t.reshape(n_head, 3, n_embd // n_head, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
        if how in ("q", "k", "v"):
            parts.setdefault(native, {})[how] = (name, t)
        elif native in out:
            raise ConversionError(f"{name} and {origin[native]} both map to {native}")
        else:
            out[native], origin[native] = t.contiguous(), name
    for native, qkv in parts.items():
        if sorted(qkv) != ["k", "q", "v"]:
            raise ConversionError(f"{native}: found only the {sorted(qkv)} projections: {[n for n, _ in qkv.values()]}")
        out[native] = torch.cat([qkv[p][1] for p in "qkv"], dim=0)
        origin[native] = "+".join(qkv[p][0] for p in "qkv")
    return out, origin, sorted({conv for conv, _, _ in mapped.values()})


def input_variant(emb, sd, hint, *, V, K, n_embd, origin, raw, tensors):
    """Which input interface the weights hold; the config's word for it (hint) must agree."""
    if "embed.A" in sd or "embed.b" in sd or (emb is None and hint == "affine"):
        variant = "affine"
    elif emb is None:
        raise ConversionError("found no input table and no affine A/b buffers; the tensors are:\n"
                              + listing(sorted(tensors.items())))
    elif tuple(emb.shape) == (V, K) and K != n_embd:
        variant = "binary"
    elif tuple(emb.shape) == (V, n_embd):  # a learned table, or a code already lifted (our own export)
        variant = hint if hint in ("binary", "affine") else "learned"
    else:
        raise ConversionError(f"input table {origin['embed.weight']} has shape {tuple(emb.shape)}: expected "
                              f"V x K = ({V}, {K}) for the code or V x n_embd = ({V}, {n_embd}) for a learned table")
    if hint is not None and hint != variant:
        found = [(origin[n], t) for n, t in [("embed.weight", emb)] + [(n, sd.get(n)) for n in ("embed.A", "embed.b")]
                 if t is not None]
        raise ConversionError(f"config says the {hint} variant (model_type {raw.get('model_type')!r}) but the weights "
                              f"hold the {variant} one; input tensors:\n" + listing(found))
    return variant


def code_table_pad(table, pad_token_id):
    """A stored V x K table must be model.py's canonical code (bit i of row t = (t >> i) & 1, the pad
    row zero). Returns the pad id the native model needs: the config's, or None when the table keeps
    that row's plain code."""
    V, K = table.shape
    t = table.float()
    if not bool(((t == 0) | (t == 1)).all()):
        raise ConversionError(f"the {V} x {K} input table is not 0/1 (values {t.unique()[:8].tolist()}...): "
                              "not a code table")
    expected = canonical_code(V, pad_token_id)
    if torch.equal(t, expected):
        return pad_token_id
    if pad_token_id is not None and torch.equal(t, canonical_code(V)):
        print(f"note: the code table keeps the plain code on pad row {pad_token_id}", file=sys.stderr)
        return None
    bad = (t != expected).any(dim=1).nonzero().flatten()
    shown = "\n".join(f"  id {int(i)}: expected {expected[i].int().tolist()}, found {t[i].int().tolist()}"
                      for i in bad[:8])
    raise ConversionError(f"the stored {V} x {K} code table is not the canonical code (bit i = (t >> i) & 1, "
                          f"pad row {pad_token_id} zero): {len(bad)} rows differ, the first:\n{shown}")


def affine_A_b(sd, meta, K, tensors):
    """The affine recoding, stored as tensors or (our export) in config.json; never invented."""
    if meta.get("A") is not None:
        try:
            sd["embed.A"], sd["embed.b"] = torch.tensor(meta["A"]), torch.tensor(meta["b"])
        except (TypeError, ValueError, RuntimeError, KeyError):
            raise ConversionError("config.json's native_gpt A / b are not matrices of 0/1") from None
    missing = [n for n in ("embed.A", "embed.b") if n not in sd]
    if missing:
        raise ConversionError(f"the affine variant needs its recoding A (K x K) and b (K) to be stored; {missing} "
                              "not found (they are never invented). Tensors found:\n"
                              + listing(sorted(tensors.items())))
    A, b = sd["embed.A"].float(), sd["embed.b"].float()
    if tuple(A.shape) != (K, K) or tuple(b.shape) != (K,) or not all(bool(((x == 0) | (x == 1)).all()) for x in (A, b)):
        raise ConversionError(f"affine A {tuple(A.shape)} / b {tuple(b.shape)} must be 0/1 of shapes "
                              f"({K}, {K}) / ({K},)")


def keep_biases(sd, config, meta, origin):
    """Biases are all or nothing in the native model: with some absent, the present ones must be zero
    (and are dropped). Returns config.bias."""
    names = [n for n in shapes_of(replace(config, bias=True)) if n.endswith(".bias")]
    present = [n for n in names if n in sd]
    bias = meta.get("bias", len(present) == len(names))
    nonzero = [(origin[n], sd[n]) for n in present if bool(sd[n].any())]
    if not bias and nonzero:
        raise ConversionError("some biases are nonzero but others are missing (the native model has all or none):\n"
                              + listing(nonzero) + "\nmissing:\n" + "\n".join(f"  {n}" for n in names if n not in sd))
    for n in present if not bias else []:
        del sd[n]
    return bias


def check_names(sd, want, origin):
    missing = [(n, want[n]) for n in want if n not in sd]
    extra = [(origin.get(n, n), sd[n]) for n in sd if n not in want]
    shapes = [f"  {n} (from {origin.get(n, n)}): expected {tuple(want[n].shape)}, found {tuple(sd[n].shape)}"
              for n in sd if n in want and sd[n].shape != want[n].shape]
    msg = ((["missing (native name: expected shape):\n" + listing(missing)] if missing else [])
           + (["not used by the model (source name: shape):\n" + listing(extra)] if extra else [])
           + (["wrong shapes:\n" + "\n".join(shapes)] if shapes else []))
    if msg:
        raise ConversionError("the weights do not fit the model the config describes\n" + "\n".join(msg))


def shapes_of(config):
    """The native state dict's names, shapes and dtypes for `config` (on the meta device: no memory)."""
    with torch.device("meta"):
        return GPT(config).state_dict()


def lifted_table(model):
    """The model's input as a V x n_embd table (what a stock embedding layer must hold)."""
    with torch.no_grad():
        return model.embed(torch.arange(model.config.vocab_size)[None])[0].float().contiguous()


def pick_layout(config, sd, tokenizer, folder):
    """--layout auto: the model built with each layout, scored by next-token loss on ENGLISH -> the better model."""
    if tokenizer is None:
        raise ConversionError("--layout auto scores both layouts on English text, "
                              "but the folder has no tokenizer.json: pass --layout tile or --layout interleave")
    ids = load_text_codec({"tokenizer": tokenizer}, folder).encode(ENGLISH)[: config.block_size + 1]
    if len(ids) < 2 or max(ids) >= config.vocab_size:
        raise ConversionError(f"the tokenizer gives {len(ids)} tokens (largest id {max(ids, default=None)}) "
                              f"for English text, not a sequence the model's vocabulary ({config.vocab_size}) "
                              "can score: pass --layout")
    x = torch.tensor(ids)[None]
    # both models hold the same tensors (assigned, not copied); only the lift index differs
    models = {layout: model_from_weights(replace(config, layout=layout), sd, folder).eval()
              for layout in ("tile", "interleave")}
    with torch.no_grad():
        loss = {layout: model(x[:, :-1], x[:, 1:])[1].item() for layout, model in models.items()}
    best = min(loss, key=loss.get)
    print(f"layout auto: next-token loss on {len(ids) - 1} tokens of English: tile {loss['tile']:.3f}, "
          f"interleave {loss['interleave']:.3f} -> {best}")
    if abs(loss["tile"] - loss["interleave"]) < 0.01 * loss[best]:
        print("warning: the two layouts score alike, so the choice is not reliable: check samples, or force --layout",
              file=sys.stderr)
    return models[best]


def hf_to_native(folder, layout="auto", input=None):
    """Read an HF folder; return (GPT model, tokenizer entry, info dict). See the module docstring."""
    fields, raw, meta = read_hf_config(folder)
    tensors = read_weights(folder)
    check_finite(tensors, folder, "convert")
    norm_widths = (t.shape[0] for n, t in tensors.items() if re.search(r"(ln_f|norm)\.weight$", n))
    n_embd = fields["n_embd"] or next(norm_widths, None)
    if n_embd is None:
        raise ConversionError("config.json gives no width (n_embd / d_model / hidden_size) and no final norm shows it")
    sd, origin, conventions = gather(tensors, fields["n_head"], n_embd)
    layers = {int(m.group(1)) for n in sd for m in [re.match(r"blocks\.(\d+)\.", n)] if m}
    n_layer = fields["n_layer"] if fields["n_layer"] is not None else max(layers, default=-1) + 1
    V, K = fields["vocab_size"], code_bits(fields["vocab_size"])
    if meta.get("layout") and layout not in ("auto", meta["layout"]):
        raise ConversionError(f"--layout {layout} contradicts the layout {meta['layout']} recorded in config.json")

    # the input: metadata of our own export, the model_type and the weights must agree
    emb = sd.pop("embed.weight", None)
    hint = meta.get("input") or input or variant_from_model_type(raw.get("model_type"))
    variant = input_variant(emb, sd, hint, V=V, K=K, n_embd=n_embd, origin=origin, raw=raw, tensors=tensors)
    pad = meta.get("pad_token_id", fields["pad_token_id"])
    if variant == "learned":
        sd["embed.weight"] = emb
    elif variant == "binary" and emb.shape[1] == K:
        pad = code_table_pad(emb, pad)
        sd["embed.weight"] = emb
    elif variant == "binary":  # a lifted table: the model keeps its own code, checked against it below
        sd["embed.weight"] = canonical_code(V, pad)
    else:
        affine_A_b(sd, meta, K, tensors)

    config = GPTConfig(vocab_size=V, block_size=fields["block_size"], n_layer=n_layer, n_head=fields["n_head"],
                       n_embd=n_embd, input=variant, pad_token_id=pad, rope_base=float(fields["rope_base"]),
                       affine_seed=meta.get("affine_seed", 0))
    config = replace(config, bias=keep_biases(sd, config, meta, origin))
    want = shapes_of(config)
    check_names(sd, want, origin)
    sd = {n: t.to(want[n].dtype) for n, t in sd.items()}  # once, so that both layouts' models share the tensors
    tok = check_tokenizer_entry(meta.get("tokenizer") or ({"kind": "hf", "file": "tokenizer.json"}
                                if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None), folder)
    if variant != "learned" and not meta.get("layout") and layout == "auto":
        model = pick_layout(config, sd, tok, folder)
    else:
        layout = meta.get("layout") or ("tile" if layout == "auto" else layout)
        model = model_from_weights(replace(config, layout=layout), sd, folder).eval()
    if emb is not None and variant != "learned":  # a stored code table must be exactly the model's input
        stored = emb.float() if emb.shape[1] == n_embd else emb.float()[:, model.embed.lift]  # (V, K) -> (V, n_embd)
        if not torch.equal(stored, lifted_table(model)):
            raise ConversionError(f"the stored {V} x {emb.shape[1]} input table is not the {variant} code lifted with "
                                  f"layout {model.config.layout}: it was changed, so it is not the fixed code")
    info = {"model_type": raw.get("model_type"), "conventions": conventions, "variant": variant,
            "layout": model.config.layout}
    return model, tok, info


def copy_tokenizer_files(src, dst):
    """Copy the tokenizer files `src` has to `dst`; returns their names."""
    copied = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(src, f))]
    if os.path.abspath(src) != os.path.abspath(dst):
        for f in copied:
            copy_file(os.path.join(src, f), os.path.join(dst, f))
    return copied


def convert_hf_to_native(folder, out_dir, layout="auto", input=None, overwrite=False):
    check_out(folder, out_dir, overwrite)
    model, tok, info = hf_to_native(folder, layout, input)
    with writer_lock(out_dir, WRITTEN):
        check_out(folder, out_dir, overwrite)
        with staged(out_dir, last=("ckpt.pt",)) as stage:  # all files or none (a full disk, Ctrl-C)
            copied = copy_tokenizer_files(folder, stage)
            atomic_torch_save(checkpoint_dict(model, tok, source={**info, "tokenizer_files": copied}),
                              os.path.join(stage, "ckpt.pt"))
        if tok is None:
            print(f"warning: {folder} has no tokenizer.json; sample.py will need one in {out_dir}", file=sys.stderr)
        path = os.path.join(out_dir, "ckpt.pt")
        remove_stale(out_dir, copied + ["ckpt.pt"], weights=False)
    return path, model, info


# ------------------------------------------------------------------------------------ native -> HF
NEOX_NAMES = {"ln_1": "input_layernorm", "attn.qkv": "attention.query_key_value", "attn.proj": "attention.dense",
              "ln_2": "post_attention_layernorm", "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}


def to_neox_qkv(t, n_head):
    """Our fused rows [q; k; v] (heads contiguous in each) -> GPT-NeoX's [q_h, k_h, v_h] per head."""
    D = t.shape[0] // (3 * n_head)
    return t.reshape(3, n_head, D, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()


def neox_state_dict(model):
    """Our weights under GPTNeoXForCausalLM's names; absent biases become zeros (but NeoX has no
    attention biases when attention_bias = config.bias is false)."""
    c, sd = model.config, model.state_dict()
    out = {"gpt_neox.embed_in.weight": lifted_table(model)}
    for i in range(c.n_layer):
        for ours, theirs in NEOX_NAMES.items():
            for kind in ("weight", "bias"):
                t = sd.get(f"blocks.{i}.{ours}.{kind}")
                if t is None and ours.startswith("attn."):
                    continue
                t = torch.zeros(sd[f"blocks.{i}.{ours}.weight"].shape[0]) if t is None else t
                out[f"gpt_neox.layers.{i}.{theirs}.{kind}"] = to_neox_qkv(t, c.n_head) if ours == "attn.qkv" else t
    out["gpt_neox.final_layer_norm.weight"] = sd["ln_f.weight"]
    out["gpt_neox.final_layer_norm.bias"] = sd.get("ln_f.bias", torch.zeros(c.n_embd))
    out["embed_out.weight"] = sd["lm_head.weight"]
    return {n: t.detach().contiguous() for n, t in out.items()}


def tiktoken_to_hf(enc):
    """A `tokenizers` byte-level BPE that encodes exactly like the tiktoken encoding `enc`: vocab from its
    mergeable ranks, merges as every split of a token into two tokens, ranked by the merged token's rank
    (tiktoken merges the pair whose concatenation has the lowest rank), the encoding's split regex."""
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise ConversionError("writing tokenizer.json needs the tokenizers package: pip install tokenizers") from None
    ranks, specials = mergeable_ranks(enc), encoding_fields(enc)["special_tokens"]
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    rest = [n for n in range(256) if n not in bs]  # GPT-2's bytes_to_unicode: other bytes -> 256, 257, ...
    byte_char = str.maketrans({**{chr(b): chr(b) for b in bs}, **{chr(b): chr(256 + k) for k, b in enumerate(rest)}})
    s = {tok: tok.decode("latin-1").translate(byte_char) for tok in ranks}  # each token's bytes as those characters
    vocab = {s[tok]: rank for tok, rank in ranks.items()}
    # a special token amid the ranks (end-of-text moved off the all-ones id, tokenizer.get_tokenizer) is
    # a vocabulary entry no merge makes; added below as special, it keeps that id. So does every special token:
    # uncut cl100k_base has no token at 100,256 nor at 100,261-100,275, and its specials keep their ids past them
    vocab.update(specials)
    merges = []
    for tok, rank in ranks.items():
        splits = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        merges += [(rank, ranks[a], ranks[b], s[a], s[b]) for a, b in splits]
    merges = [(a, b) for *_, a, b in sorted(merges)]
    tk = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(onig_pattern(encoding_fields(enc)["pat_str"])), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    for text, i in sorted(specials.items(), key=lambda kv: kv[1]):
        tk.add_special_tokens([AddedToken(text, special=True, normalized=False)])
        if tk.token_to_id(text) != i:
            raise ConversionError(f"special token {text} has id {i}, "
                                  f"but tokenizer.json gives it {tk.token_to_id(text)}")
    return tk


# an atom (\p{..}, an escape, a class, a character) with a possessive interval quantifier, {n,m}+
POSSESSIVE_INTERVAL = re.compile(r"(\\[pP]\{\w+\}|\\.|\[(?:\\.|[^\]])*\]|[^\\()|])(\{\d+(?:,\d*)?\})\+")


def onig_pattern(pattern):
    r"""A tiktoken split regex as the tokenizers library's engine (Oniguruma) reads it the same: Oniguruma takes
    `{n,m}+` for the interval repeated (one or more times), not possessive, so cl100k_base's `\p{N}{1,3}+` would keep
    1234567 in one piece (tokens 123, 45, 67, not 123, 456, 7); an atomic group is the possessive it means."""
    return POSSESSIVE_INTERVAL.sub(r"(?>\1\2)", pattern)


def export_tokenizer(entry, ckpt_dir, out_dir, block_size):
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return (their names,
    bos id, eos id)."""
    if entry is None:
        print("warning: the checkpoint names no tokenizer; none exported", file=sys.stderr)
        return [], None, None
    codec = load_text_codec({"tokenizer": entry}, ckpt_dir)  # the tokenizer sample.py uses, and its end-of-text
    ours = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    if entry["kind"] == "tiktoken":
        tk, src_cfg = tiktoken_to_hf(codec.enc), {}
        atomic_write(os.path.join(out_dir, "tokenizer.json"), tk.to_str())
    else:
        tk = codec.tk
        copy_file(os.path.join(ckpt_dir, entry.get("file", "tokenizer.json")), os.path.join(out_dir, "tokenizer.json"))
        cfg_path = os.path.join(ckpt_dir, "tokenizer_config.json")
        src_cfg = read_json(cfg_path) if os.path.isfile(cfg_path) else {}
    eos_id = codec.eos_token_id
    bos_id = next((tk.token_to_id(n) for n in ("<s>", "<|begin_of_text|>", "<bos>") if tk.token_to_id(n) is not None),
                  None) if entry["kind"] == "hf" else eos_id
    cfg = {k: v for k, v in src_cfg.items() if k not in ("auto_map", "tokenizer_class", "added_tokens_decoder")}
    # a stock fast tokenizer: no remote code; no BOS added (the card's protocol: add_bos_token=False)
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=block_size, add_bos_token=False,
               add_eos_token=False, clean_up_tokenization_spaces=False)
    special = {key: tk.id_to_token(i) for key, i in (("eos_token", eos_id), ("bos_token", bos_id)) if i is not None}
    special.update({key: src_cfg[key] for key in ("unk_token", "pad_token") if isinstance(src_cfg.get(key), str)})
    cfg.update(special)
    atomic_write(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(cfg, indent=2))
    atomic_write(os.path.join(out_dir, "special_tokens_map.json"), json.dumps(special, indent=2))
    return ours, bos_id, eos_id


def convert_native_to_hf(ckpt_path, out_dir, dtype="float32", overwrite=False):
    """Write a GPTNeoXForCausalLM folder: config.json, model.safetensors, generation_config.json, tokenizer."""
    check_out(ckpt_path, out_dir, overwrite)
    model, ckpt = load_checkpoint(ckpt_path, "cpu")
    if model.config.code_width:
        raise ConversionError(f"{ckpt_path}: its code is {model.config.code_width} bits wide, not the paper's K = "
                              f"ceil(log2 V) (code_width, a study setting): the Hugging Face form holds only that code")
    check_finite(model.state_dict(), ckpt_path, "convert")
    ckpt_dir = ckpt_path if os.path.isdir(ckpt_path) else os.path.dirname(os.path.abspath(ckpt_path))
    entry = check_tokenizer_entry(ckpt.get("tokenizer"), ckpt_dir)
    try:
        from safetensors.torch import save
    except ImportError:
        raise ConversionError("writing model.safetensors needs the safetensors package: "
                              "pip install safetensors") from None
    state = neox_state_dict(model)
    check_fits_dtype(state, dtype)
    tensors = {n: t.to(getattr(torch, dtype)) for n, t in state.items()}
    weights = save(tensors, metadata={"format": "pt"})
    with writer_lock(out_dir, WRITTEN):
        check_out(ckpt_path, out_dir, overwrite)
        with staged(out_dir, last=("config.json",)) as stage:  # all files or none (a full disk, Ctrl-C)
            written = write_hf_folder(model, weights, entry, ckpt_dir, stage, dtype)
        remove_stale(out_dir, written, weights=True)
        return out_dir


def check_fits_dtype(tensors, dtype):
    """Refuse an export whose weights the target dtype cannot hold (1e6 is inf in float16), naming them."""
    top = torch.finfo(getattr(torch, dtype)).max
    big = {}
    for name, t in tensors.items():
        if t.is_floating_point() and t.numel():
            lo, hi = torch.aminmax(t)  # no temporary of the tensor's size
            largest = max(-lo.item(), hi.item())
            if largest > top:
                big[name] = largest
    if big:
        shown = ", ".join(f"{n} ({v:.4g})" for n, v in list(big.items())[:5])
        raise ConversionError(f"{shown}: beyond {dtype}'s largest value {top:.6g}, so written as inf: export with "
                              "--dtype float32 or bfloat16")


def write_hf_folder(model, weights, entry, ckpt_dir, out_dir, dtype):
    """native2hf's writes into `out_dir` (a staging folder): tokenizer, model.safetensors (`weights`, bytes),
    configs; returns the names written."""
    c = model.config
    written, bos_id, eos_id = export_tokenizer(entry, ckpt_dir, out_dir, c.block_size)
    atomic_write(os.path.join(out_dir, "model.safetensors"), weights)
    meta = {"input": c.input, "layout": c.layout, "affine_seed": c.affine_seed, "pad_token_id": c.pad_token_id,
            "bias": c.bias, "tokenizer": entry if entry and entry["kind"] == "tiktoken" else None}
    if c.input == "affine":
        meta.update(A=model.embed.A.int().tolist(), b=model.embed.b.int().tolist())
    config = {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "intermediate_size": 4 * c.n_embd, "hidden_act": "gelu",
        "max_position_embeddings": c.block_size, "layer_norm_eps": 1e-5, "use_parallel_residual": False,
        "tie_word_embeddings": False, "attention_bias": c.bias, "attention_dropout": 0.0, "hidden_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True,
        # rotary over the full head: older transformers read rotary_pct / rotary_emb_base, 5.x rope_parameters
        "rotary_pct": 1.0, "rotary_emb_base": c.rope_base,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_base, "partial_rotary_factor": 1.0},
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": c.pad_token_id,
        "torch_dtype": dtype, "dtype": dtype,
        "native_gpt": meta,  # lets hf2native restore the exact native model
    }
    atomic_write(os.path.join(out_dir, "config.json"), json.dumps(config, indent=2))
    atomic_write(os.path.join(out_dir, "generation_config.json"),
                 json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": c.pad_token_id}, indent=2))
    return [*written, "model.safetensors", "config.json", "generation_config.json"]


# ------------------------------------------------------------------------------------ native -> int8
def fingerprint(file):
    """What identifies a checkpoint file: its absolute path, size and SHA-256."""
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(2**24), b""):
            h.update(chunk)
    return {"path": os.path.abspath(file), "bytes": os.path.getsize(file), "sha256": h.hexdigest()}


def convert_native_to_int8(ckpt_path, out_dir, overwrite=False):
    """Write OUT/ckpt.pt, the int8 checkpoint of a native one (quantize.int8_checkpoint), and its tokenizer files."""
    check_out(ckpt_path, out_dir, overwrite)
    model, ckpt = load_checkpoint(ckpt_path, "cpu")  # an int8 checkpoint is refused here: it is int8 already
    check_finite(model.state_dict(), ckpt_path, "convert")
    file = checkpoint_file(ckpt_path)
    ckpt_dir = os.path.dirname(os.path.abspath(file))
    entry = check_tokenizer_entry(ckpt.get("tokenizer"), ckpt_dir)
    int8 = int8_checkpoint(model, ckpt, fingerprint(file))
    with writer_lock(out_dir, WRITTEN):
        check_out(ckpt_path, out_dir, overwrite)
        with staged(out_dir, last=("ckpt.pt",)) as stage:  # all files or none (a full disk, Ctrl-C)
            copied = copy_tokenizer_files(ckpt_dir, stage) if entry and entry["kind"] == "hf" else []
            if entry and entry["kind"] == "hf" and entry.get("file", "tokenizer.json") not in copied:
                copy_file(os.path.join(ckpt_dir, entry["file"]), os.path.join(stage, entry["file"]))
                copied.append(entry["file"])
            atomic_torch_save(int8, os.path.join(stage, "ckpt.pt"))
        path = os.path.join(out_dir, "ckpt.pt")
        remove_stale(out_dir, copied + ["ckpt.pt"], weights=False)
    return path, int8


# ------------------------------------------------------------------------------------------- CLI
@dataclass
class HfToNative:
    """a released HF folder -> OUT/ckpt.pt"""
    src: str = setting(help="local HF model folder (config.json, *.safetensors or pytorch_model.bin, tokenizer files)",
                       positional=True)
    out: str = setting(help="output folder; ckpt.pt and the tokenizer files are written there", positional=True)
    layout: str = setting("auto", "how the K code bits are lifted to model width (tile: dim j carries bit j mod K; "
                                  "interleave: bit k fills a contiguous block of dims). auto: the one with the lower "
                                  "loss on English text", choices=["auto", "tile", "interleave"])
    input: str | None = setting(None, "the variant, if config.json's model_type does not say (it is checked against "
                                      "the weights)", choices=["binary", "affine", "learned"])
    overwrite: bool = setting(False, "write into a non-empty OUT, replacing its model files")


@dataclass
class NativeToInt8:
    """a native checkpoint -> OUT/ckpt.pt with int8 linear weights, for sampling"""
    src: str = setting(help="native float32 checkpoint: a .pt file or a folder holding ckpt.pt (else best.pt)",
                       positional=True)
    out: str = setting(help="output folder; ckpt.pt (and a converted release's tokenizer files) are written there",
                       positional=True)
    overwrite: bool = setting(False, "write into a non-empty OUT, replacing its model and tokenizer files")


@dataclass
class NativeToHf:
    """a native checkpoint -> a stock GPTNeoXForCausalLM folder"""
    src: str = setting(help="native checkpoint: a .pt file or a folder holding ckpt.pt (else best.pt)", positional=True)
    out: str = setting(help="output folder (config.json, model.safetensors, tokenizer.json, ...)", positional=True)
    dtype: str = setting("float32", "weight dtype written", choices=["float32", "bfloat16", "float16"])
    overwrite: bool = setting(False, "write into a non-empty OUT, replacing its model files")


def main(argv=None):
    commands = {"hf2native": HfToNative, "native2hf": NativeToHf, "native2int8": NativeToInt8}
    examples = ("examples:\n"
                "  python -m tools.convert hf2native ./llm-fix-min-fixed-minimal-binary-code out/fixmin\n"
                "  python -m tools.convert native2hf out/fixmin out/fixmin-hf\n"
                "  python -m tools.convert native2int8 out/fixmin out/fixmin-int8")
    parser = config_parser(commands, __doc__.strip().split("\n\n")[0], epilog=examples)
    cfg = parse_settings(parser, argv)
    if isinstance(cfg, HfToNative):
        path, model, info = convert_hf_to_native(cfg.src, cfg.out, cfg.layout, cfg.input, cfg.overwrite)
        n = model.num_params()
        print(f"wrote {path}: {info['variant']} input, layout {info['layout']}, "
              f"names {', '.join(info['conventions'])}, "
              f"{n['trainable']:,} trainable parameters, {n['frozen']:,} frozen values")

    elif isinstance(cfg, NativeToInt8):
        path, int8 = convert_native_to_int8(cfg.src, cfg.out, cfg.overwrite)
        print(f"wrote {path}: {len(int8['quantization']['layers'])} linear layers in int8 (sample.py --ckpt {cfg.out})")
    else:
        out = convert_native_to_hf(cfg.src, cfg.out, cfg.dtype, cfg.overwrite)
        print(f"wrote {out}: GPTNeoXForCausalLM (load with AutoModelForCausalLM.from_pretrained({out!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
