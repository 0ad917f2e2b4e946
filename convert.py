"""
Convert checkpoints between the paper's Hugging Face releases and this project's native format.

    python convert.py hf2native HF_FOLDER OUT_FOLDER --layout tile|interleave
    python convert.py native2hf CKPT OUT_FOLDER [--dtype float32]

hf2native reads a local copy of one of the released checkpoints (config.json with the BVVConfig
fields, weights as safetensors, sharded or single, or pytorch_model.bin, tokenizer files) and writes
OUT_FOLDER/ckpt.pt, which sample.py and train.py --init_from load. The released state-dict names are
not public, so names go through one table, MAPPING, covering nanoGPT, GPT-NeoX and Llama-style names
(and this project's own). Nothing is guessed silently: an unmapped or missing name, a wrong shape, a
non-canonical code table or an affine checkpoint without its A and b stops the conversion with a list.

native2hf writes a stock GPTNeoXForCausalLM folder (no remote code) that AutoModelForCausalLM,
AutoTokenizer, generate() and lm-evaluation-harness's `hf` backend load directly: the fixed code
becomes its V x n_embd input table (the code lifted to model width), missing biases become zeros.
config.json keeps a "native_gpt" entry, so hf2native restores the original native model exactly.

Dependencies: torch; safetensors (reading/writing .safetensors); tokenizers (writing a tokenizer.json
for tiktoken-native checkpoints). transformers is not needed here.
"""

import argparse
import json
import os
import re
import shutil
import sys

import torch

from model import GPT, GPTConfig, binary_code, checkpoint_dict, code_bits, load_checkpoint
from prepare_data import get_tokenizer


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
# Known non-weights, skipped on purpose: rotary tables, causal-mask buffers, our lift index.
SKIP = [
    r"(?:^|\.)inv_freq$",
    r"(?:^|\.)(?:rope|rotary)\w*\.(?:cos|sin)\w*$",
    r"(?:^|\.)(?:cos|sin)_cached$",
    r"(?:^|\.)rope_(?:cos|sin)$",
    r"(?:^|\.)attn\.(?:bias|masked_bias)$",  # nanoGPT / GPT-2 causal mask buffers
    r"(?:^|\.)attention\.(?:bias|masked_bias)$",  # old GPT-NeoX causal mask buffers
    r"(?:^|\.)(?:causal_)?mask$",
    r"(?:^|\.)lift$",
]
_ROWS = [(conv, re.compile(PREFIX + pat + "$"), tmpl, how) for conv, pat, tmpl, how in MAPPING]
_SKIP = [re.compile(p) for p in SKIP]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json"]
EOS_CANDIDATES = ["</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"]


def map_name(name):
    """Source tensor name -> (convention, native name, how), "skip", or None when unmapped."""
    if any(p.search(name) for p in _SKIP):
        return "skip"
    for conv, rx, tmpl, how in _ROWS:
        m = rx.match(name)
        if m:
            return conv, m.expand(tmpl), how
    return None


def _listing(named, limit=60):
    rows = [f"  {n}: {tuple(t.shape) if hasattr(t, 'shape') else t}" for n, t in named]
    more = [f"  ... and {len(rows) - limit} more"] if len(rows) > limit else []
    return "\n".join(rows[:limit] + more)


# ------------------------------------------------------------------------------------- reading
def _load_safetensors(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ConversionError("reading .safetensors files needs the safetensors package: pip install safetensors") from None
    try:
        return load_file(path, device="cpu")
    except Exception as e:
        raise ConversionError(f"cannot read {path}: {e} (is the file truncated or corrupt?)") from None


def _load_bin(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConversionError(f"cannot read {path}: {e} (is the file truncated or corrupt?)") from None


def read_weights(folder):
    """All tensors of an HF folder: sharded (*.index.json) or single safetensors, else pytorch_model.bin."""
    files = sorted(os.listdir(folder))
    index = next((f for f in ("model.safetensors.index.json", "pytorch_model.bin.index.json") if f in files), None)
    if index:
        with open(os.path.join(folder, index)) as f:
            weight_map = json.load(f)["weight_map"]
        shards = sorted(set(weight_map.values()))
    else:
        shards = [f for f in files if f.endswith(".safetensors")] or [f for f in files if f == "pytorch_model.bin"]
        weight_map = None
    if not shards:
        raise ConversionError(f"no weights in {folder}: expected *.safetensors (optionally with "
                              f"model.safetensors.index.json) or pytorch_model.bin; found {files}")
    tensors = {}
    for shard in shards:
        path = os.path.join(folder, shard)
        if not os.path.isfile(path):
            raise ConversionError(f"{index} lists {shard}, which is not in {folder}")
        part = _load_safetensors(path) if shard.endswith(".safetensors") else _load_bin(path)
        if not isinstance(part, dict):
            raise ConversionError(f"{path} does not hold a dict of tensors")
        for name, t in part.items():
            if name in tensors:
                raise ConversionError(f"tensor {name} appears in more than one weight file (again in {shard})")
            tensors[name] = t
    if weight_map is not None:
        lost = sorted(n for n in weight_map if n not in tensors)
        if lost:
            raise ConversionError(f"{index} lists tensors that its shards do not hold: {lost[:20]}")
    return tensors


def read_hf_config(folder):
    """The GPTConfig fields a BVV (or GPT-NeoX / GPT-2 / Llama-like) config.json gives, plus its raw dict."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ConversionError(f"no config.json in {folder}: is this a Hugging Face model folder?")
    with open(path) as f:
        raw = json.load(f)

    def first(*keys, default=None):
        return next((raw[k] for k in keys if raw.get(k) is not None), default)

    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    fields = {
        "vocab_size": first("vocab_size"),
        "block_size": first("block_size", "max_position_embeddings", "n_positions", "n_ctx", "seq_len"),
        "n_embd": first("n_embd", "d_model", "hidden_size"),  # not n_embed: that is the input width (16 for codes)
        "n_layer": first("n_layer", "num_hidden_layers", "num_layers"),
        "n_head": first("n_head", "num_attention_heads", "n_heads"),
        "pad_token_id": first("pad_token_id", "pad_id"),
        "rope_base": first("rope_base", "rope_theta", "rotary_emb_base", default=rope.get("rope_theta", 10000.0)),
    }
    if not any(k in raw for k in ("rope_base", "rope_theta", "rotary_emb_base")) and "rope_theta" not in rope:
        print("note: config.json gives no RoPE base; assuming 10000 (inferred, not confirmed for the release)",
              file=sys.stderr)
    missing = [k for k in ("vocab_size", "block_size", "n_head") if fields[k] is None]
    if missing:
        raise ConversionError(f"{path} lacks {missing}; it has {sorted(raw)}")
    eps = raw.get("layer_norm_eps", raw.get("layer_norm_epsilon"))
    if eps is not None and abs(eps - 1e-5) > 1e-12:
        print(f"note: config layer_norm_eps = {eps}; the native model uses 1e-5", file=sys.stderr)
    return fields, raw


def variant_from_model_type(model_type):
    """PAPER.md's table: model_n_embed_16_binary_* -> binary, *affine* -> affine, model_n_embed_1024_* -> learned."""
    mt = (model_type or "").lower()
    if "affine" in mt:
        return "affine"
    if "binary" in mt:
        return "binary"
    if re.match(r"model_n_embed_\d+_n_layer", mt):
        return "learned"
    return None


# ------------------------------------------------------------------------------ codes and tables
def canonical_code(vocab_size, pad_token_id=None):
    """The release's V x K table: bit i of row t = (t >> i) & 1, the pad row all zeros."""
    table = binary_code(torch.arange(vocab_size), code_bits(vocab_size))
    if pad_token_id is not None:
        table[pad_token_id] = 0.0
    return table


def check_code_table(table, pad_token_id):
    """A stored V x K table must be the canonical code. Returns the pad id the native model needs
    (the config's if its row is zero, None if the table keeps that row's plain code)."""
    V, K = table.shape
    t = table.float()
    if not bool(((t == 0) | (t == 1)).all()):
        raise ConversionError(f"the {V} x {K} input table is not 0/1 (values {t.unique()[:8].tolist()}...): not a code table")
    expected = canonical_code(V, pad_token_id)
    if torch.equal(t, expected):
        return pad_token_id
    if pad_token_id is not None and torch.equal(t, canonical_code(V)):
        print(f"note: the code table keeps the plain code on pad row {pad_token_id}", file=sys.stderr)
        return None
    bad = (t != expected).any(dim=1).nonzero().flatten()
    shown = "\n".join(f"  id {int(i)}: expected {expected[i].int().tolist()}, found {t[i].int().tolist()}" for i in bad[:8])
    raise ConversionError(f"the stored {V} x {K} code table is not the canonical code (bit i = (t >> i) & 1, "
                          f"pad row {pad_token_id} zero): {len(bad)} rows differ, the first:\n{shown}")


def lifted_table(model):
    """The model's input as a V x n_embd table (what a stock embedding layer must hold)."""
    with torch.no_grad():
        return model.embed(torch.arange(model.config.vocab_size)[None])[0].float().contiguous()


# ------------------------------------------------------------------------------------ HF -> native
def _gather(tensors, n_head, n_embd):
    """Rename source tensors through MAPPING; return (native dict, native -> source names, conventions)."""
    out, origin, parts, conventions, unmapped = {}, {}, {}, set(), []
    mapped = {}
    for name, t in tensors.items():
        m = map_name(name)
        if m == "skip":
            continue
        if m is None:
            unmapped.append((name, t))
            continue
        mapped[name] = m
    if unmapped:
        raise ConversionError("tensors with no row in convert.MAPPING (add one if the release uses them):\n"
                              + _listing(unmapped) + "\nall tensors found:\n" + _listing(sorted(tensors.items())))
    # HF-GPT2 Conv1D stores (in, out): detectable from the fused qkv or fc shape, never square
    conv1d = any(how == "conv1d" and native.endswith(("qkv.weight", "fc.weight")) and tensors[name].shape[0] == n_embd
                 for name, (_, native, how) in mapped.items())
    for name, (conv, native, how) in mapped.items():
        t = tensors[name]
        conventions.add(conv)
        if how == "conv1d" and conv1d and t.dim() == 2:
            t = t.t()
        elif how == "neox_qkv":
            D = n_embd // n_head
            if t.shape[0] != 3 * n_embd:
                raise ConversionError(f"{name} has shape {tuple(t.shape)}, expected first dim 3 * {n_embd}")
            t = t.reshape(n_head, 3, D, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
        if how in ("q", "k", "v"):
            parts.setdefault(native, {})[how] = (name, t)
            continue
        if native in out:
            raise ConversionError(f"{name} and {origin[native]} both map to {native}")
        out[native], origin[native] = t.contiguous(), name
    for native, qkv in parts.items():
        if sorted(qkv) != ["k", "q", "v"]:
            raise ConversionError(f"{native}: found only the {sorted(qkv)} projections: {[n for n, _ in qkv.values()]}")
        out[native] = torch.cat([qkv[p][1] for p in "qkv"], dim=0)
        origin[native] = "+".join(qkv[p][0] for p in "qkv")
    return out, origin, sorted(conventions)


def hf_to_native(folder, layout=None, input=None):
    """Read an HF folder; return (GPT model, tokenizer entry, info dict). See the module docstring."""
    fields, raw = read_hf_config(folder)
    meta = raw.get("native_gpt") or {}
    tensors = read_weights(folder)
    n_embd = fields["n_embd"]
    if n_embd is None:  # infer the width from any final norm
        n_embd = next((t.shape[0] for n, t in tensors.items() if re.search(r"(ln_f|norm)\.weight$", n)), None)
        if n_embd is None:
            raise ConversionError("config.json gives no width (n_embd / d_model / hidden_size) and none can be inferred")
    sd, origin, conventions = _gather(tensors, fields["n_head"], n_embd)
    layers = {int(m.group(1)) for n in sd for m in [re.match(r"blocks\.(\d+)\.", n)] if m}
    n_layer = fields["n_layer"] if fields["n_layer"] is not None else (max(layers) + 1 if layers else 0)
    V, K = fields["vocab_size"], code_bits(fields["vocab_size"])

    # which input interface: metadata of our own export, the model_type, and the weights must agree
    hint = meta.get("input") or input or variant_from_model_type(raw.get("model_type"))
    emb = sd.pop("embed.weight", None)
    if "embed.A" in sd or "embed.b" in sd or (emb is None and hint == "affine"):
        found = "affine"
    elif emb is None:
        raise ConversionError("found no input table and no affine A/b buffers; the tensors are:\n"
                              + _listing(sorted(tensors.items())))
    elif tuple(emb.shape) == (V, K) and K != n_embd:
        found = "binary"
    elif tuple(emb.shape) == (V, n_embd):  # a learned table, or a code already lifted (our own export)
        found = hint if hint in ("binary", "affine") else "learned"
    else:
        raise ConversionError(f"input table {origin['embed.weight']} has shape {tuple(emb.shape)}: expected "
                              f"V x K = ({V}, {K}) for the code or V x n_embd = ({V}, {n_embd}) for a learned table")
    if hint is not None and hint != found:
        raise ConversionError(f"config says the {hint} variant (model_type {raw.get('model_type')!r}) but the weights "
                              f"hold the {found} one; input tensors: "
                              + ", ".join(f"{origin.get(n, n)} {tuple(t.shape)}" for n, t in [("embed.weight", emb)]
                                          + [(n, sd[n]) for n in ("embed.A", "embed.b") if n in sd] if t is not None))
    variant = found
    layout = _pick_layout(layout, meta) if variant != "learned" else (layout or meta.get("layout"))
    lifted = emb if variant != "learned" and emb is not None and tuple(emb.shape) == (V, n_embd) else None

    pad = meta.get("pad_token_id", fields["pad_token_id"])
    config = dict(vocab_size=V, block_size=fields["block_size"], n_layer=n_layer, n_head=fields["n_head"],
                  n_embd=n_embd, input=variant, layout=layout or "tile", pad_token_id=pad,
                  rope_base=float(fields["rope_base"]), affine_seed=meta.get("affine_seed", 0))
    if variant == "learned":
        sd["embed.weight"] = emb
    elif variant == "binary" and lifted is None:
        config["pad_token_id"] = check_code_table(emb, pad)
        sd["embed.weight"] = emb.float()
    elif variant == "affine":
        if meta.get("A") is not None:  # our export: A and b are in config.json, the weights hold the lifted table
            sd["embed.A"], sd["embed.b"] = torch.tensor(meta["A"]).float(), torch.tensor(meta["b"]).float()
        missing = [n for n in ("embed.A", "embed.b") if n not in sd]
        if missing:
            raise ConversionError(f"the affine variant needs its recoding A (K x K) and b (K) to be stored; {missing} "
                                  "not found (they are never invented). Tensors found:\n" + _listing(sorted(tensors.items())))
        A, b = sd["embed.A"].float(), sd["embed.b"].float()
        if tuple(A.shape) != (K, K) or tuple(b.shape) != (K,) or not all(bool(((x == 0) | (x == 1)).all()) for x in (A, b)):
            raise ConversionError(f"affine A {tuple(A.shape)} / b {tuple(b.shape)} must be 0/1 of shapes ({K}, {K}) / ({K},)")
        sd["embed.A"], sd["embed.b"] = A, b
        if emb is not None and tuple(emb.shape) == (V, K):  # a stored recoded table must be A c XOR b
            want_code = (binary_code(torch.arange(V), K) @ A.T + b) % 2
            if not torch.equal(emb.float(), want_code):
                bad = (emb.float() != want_code).any(dim=1).nonzero().flatten()[:8].tolist()
                raise ConversionError(f"the stored {V} x {K} table is not A c XOR b of the stored A, b (rows {bad} differ)")

    # bias: all or nothing in the native model; biases that are absent elsewhere must be zero to drop
    bias_names = [n for n in GPT_names(n_layer, True) if n.endswith(".bias")]
    present = [n for n in bias_names if n in sd]
    config["bias"] = meta.get("bias", len(present) == len(bias_names) and len(present) > 0)
    if not config["bias"]:
        nonzero = [(origin[n], sd[n]) for n in present if bool(sd[n].any())]
        if nonzero:
            absent = [n for n in bias_names if n not in sd]
            raise ConversionError("some biases are nonzero but others are missing (the native model has all or none):\n"
                                  + _listing(nonzero) + "\nmissing:\n" + "\n".join(f"  {n}" for n in absent))
        for n in present:
            sd.pop(n)

    model = GPT(GPTConfig(**config))
    want = model.state_dict()
    if variant == "binary" and lifted is not None:
        sd["embed.weight"] = want["embed.weight"]  # the canonical table; the lifted one is checked below
    _check_names(sd, want, origin, tensors)
    model.load_state_dict({n: t.to(want[n].dtype) for n, t in sd.items()}, strict=True)
    if lifted is not None and not torch.equal(lifted.float(), lifted_table(model)):
        raise ConversionError(f"the stored {V} x {n_embd} input table is not the {variant} code lifted with layout "
                              f"{config['layout']}: it was changed, so it is not the fixed code")
    tok = meta.get("tokenizer") or ({"kind": "hf", "file": "tokenizer.json"}
                                    if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None)
    info = {"format": "hf", "path": os.path.abspath(folder), "model_type": raw.get("model_type"),
            "conventions": conventions, "variant": variant, "layout": config["layout"]}
    return model, tok, info


def GPT_names(n_layer, bias):
    """The native state-dict names for a config (cheap: no model built)."""
    names = []
    for i in range(n_layer):
        for m in ("ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.fc", "mlp.proj"):
            names += [f"blocks.{i}.{m}.weight"] + ([f"blocks.{i}.{m}.bias"] if bias else [])
    return names + ["ln_f.weight"] + (["ln_f.bias"] if bias else []) + ["lm_head.weight"]


def _pick_layout(layout, meta):
    if meta.get("layout") and layout and layout != meta["layout"]:
        raise ConversionError(f"--layout {layout} contradicts the layout {meta['layout']} recorded in config.json")
    layout = layout or meta.get("layout")
    if layout not in ("tile", "interleave"):
        raise ConversionError("code variants need --layout tile|interleave: nothing public says how the release lifts "
                              "its K bits to model width (tile: dim j carries bit j mod K; interleave: bit k fills a "
                              "contiguous block of n_embd/K dims)")
    return layout


def _check_names(sd, want, origin, tensors):
    missing = [(n, want[n]) for n in want if n not in sd]
    extra = [(origin.get(n, n), sd[n]) for n in sd if n not in want]
    shapes = [f"  {n} (from {origin.get(n, n)}): expected {tuple(want[n].shape)}, found {tuple(sd[n].shape)}"
              for n in sd if n in want and sd[n].shape != want[n].shape]
    if missing or extra or shapes:
        msg = []
        if missing:
            msg.append("missing (native name: expected shape):\n" + _listing(missing))
        if extra:
            msg.append("not used by the model (source name: shape):\n" + _listing(extra))
        if shapes:
            msg.append("wrong shapes:\n" + "\n".join(shapes))
        raise ConversionError("the weights do not fit the model the config describes\n" + "\n".join(msg)
                              + "\nall tensors found:\n" + _listing(sorted(tensors.items())))


def copy_tokenizer_files(src, dst):
    copied = []
    for f in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, f)) and os.path.abspath(src) != os.path.abspath(dst):
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
            copied.append(f)
    return copied


def convert_hf_to_native(folder, out_dir, layout=None, input=None):
    model, tok, info = hf_to_native(folder, layout, input)
    os.makedirs(out_dir, exist_ok=True)
    info["tokenizer_files"] = copy_tokenizer_files(folder, out_dir)
    if tok is None:
        print(f"warning: {folder} has no tokenizer.json; sample.py will need one in {out_dir}", file=sys.stderr)
    path = os.path.join(out_dir, "ckpt.pt")
    torch.save(checkpoint_dict(model, tok, source=info), path)
    return path, model, info


# ------------------------------------------------------------------------------------ native -> HF
def to_neox_qkv(t, n_head):
    """Our fused rows [q; k; v] (heads contiguous in each) -> GPT-NeoX's [q_h, k_h, v_h] per head."""
    D = t.shape[0] // (3 * n_head)
    return t.reshape(3, n_head, D, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()


def neox_state_dict(model):
    """Our weights under GPTNeoXForCausalLM's names; absent biases become zeros."""
    c, sd = model.config, model.state_dict()

    def get(name, size):
        return sd[name] if name in sd else torch.zeros(size)

    C = c.n_embd
    out = {"gpt_neox.embed_in.weight": lifted_table(model)}
    for i in range(c.n_layer):
        p, q = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        out[p + "input_layernorm.weight"] = sd[q + "ln_1.weight"]
        out[p + "input_layernorm.bias"] = get(q + "ln_1.bias", C)
        out[p + "attention.query_key_value.weight"] = to_neox_qkv(sd[q + "attn.qkv.weight"], c.n_head)
        out[p + "attention.dense.weight"] = sd[q + "attn.proj.weight"]
        if c.bias:  # attention_bias = config.bias: NeoX has no attention biases then
            out[p + "attention.query_key_value.bias"] = to_neox_qkv(sd[q + "attn.qkv.bias"], c.n_head)
            out[p + "attention.dense.bias"] = sd[q + "attn.proj.bias"]
        out[p + "post_attention_layernorm.weight"] = sd[q + "ln_2.weight"]
        out[p + "post_attention_layernorm.bias"] = get(q + "ln_2.bias", C)
        out[p + "mlp.dense_h_to_4h.weight"] = sd[q + "mlp.fc.weight"]
        out[p + "mlp.dense_h_to_4h.bias"] = get(q + "mlp.fc.bias", 4 * C)
        out[p + "mlp.dense_4h_to_h.weight"] = sd[q + "mlp.proj.weight"]
        out[p + "mlp.dense_4h_to_h.bias"] = get(q + "mlp.proj.bias", C)
    out["gpt_neox.final_layer_norm.weight"] = sd["ln_f.weight"]
    out["gpt_neox.final_layer_norm.bias"] = get("ln_f.bias", C)
    out["embed_out.weight"] = sd["lm_head.weight"]
    return {n: t.detach().clone().contiguous() for n, t in out.items()}


def tiktoken_to_hf(enc):
    """A `tokenizers` byte-level BPE that encodes exactly like the tiktoken encoding `enc`: vocab from its
    mergeable ranks, merges as every split of a token into two tokens, ranked by the merged token's rank
    (tiktoken merges the pair whose concatenation has the lowest rank), the encoding's split regex."""
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise ConversionError("writing tokenizer.json needs the tokenizers package: pip install tokenizers") from None
    ranks = enc._mergeable_ranks
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    rest = [n for n in range(256) if n not in bs]  # GPT-2's bytes_to_unicode: other bytes -> 256, 257, ...
    byte_char = {**{b: chr(b) for b in bs}, **{b: chr(256 + k) for k, b in enumerate(rest)}}

    def s(b):
        return "".join(byte_char[x] for x in b)

    vocab = {s(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        splits = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        merges += [(rank, ranks[a], ranks[b], s(a), s(b)) for a, b in splits]
    merges = [(a, b) for *_, a, b in sorted(merges)]
    tk = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(enc._pat_str), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    for text, i in sorted(enc._special_tokens.items(), key=lambda kv: kv[1]):
        if tk.get_vocab_size(with_added_tokens=True) != i:
            raise ConversionError(f"special token {text} has id {i}, not the next free id: cannot express in tokenizer.json")
        tk.add_special_tokens([AddedToken(text, special=True, normalized=False)])
    return tk


def _token_id(tk, names):
    return next((tk.token_to_id(n) for n in names if tk.token_to_id(n) is not None), None)


def export_tokenizer(ckpt, ckpt_dir, out_dir, block_size):
    """Write tokenizer.json + tokenizer_config.json (+ special_tokens_map.json); return (bos, eos) ids."""
    entry = ckpt.get("tokenizer")
    if not entry:
        print("warning: the checkpoint names no tokenizer; none exported", file=sys.stderr)
        return None, None
    if entry.get("kind") == "tiktoken":
        tiktoken_to_hf(get_tokenizer(entry.get("encoding", "gpt2"), entry.get("vocab_size"))).save(os.path.join(out_dir, "tokenizer.json"))
        src_cfg = {}
    elif entry.get("kind") == "hf":
        src = os.path.join(ckpt_dir, entry.get("file", "tokenizer.json"))
        if not os.path.isfile(src):
            raise ConversionError(f"the checkpoint's tokenizer {src} does not exist")
        copy_tokenizer_files(ckpt_dir, out_dir)
        if os.path.basename(src) != "tokenizer.json":
            shutil.copyfile(src, os.path.join(out_dir, "tokenizer.json"))
        cfg_path = os.path.join(ckpt_dir, "tokenizer_config.json")
        src_cfg = json.load(open(cfg_path)) if os.path.isfile(cfg_path) else {}
    else:
        raise ConversionError(f"unknown tokenizer entry {entry!r}")
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    eos = src_cfg.get("eos_token") if isinstance(src_cfg.get("eos_token"), str) else None
    eos_id = tk.token_to_id(eos) if eos else _token_id(tk, EOS_CANDIDATES)
    bos_id = _token_id(tk, ["<s>", "<|begin_of_text|>", "<bos>"]) if entry["kind"] == "hf" else eos_id
    cfg = {k: v for k, v in src_cfg.items() if k not in ("auto_map", "tokenizer_class", "added_tokens_decoder")}
    # a stock fast tokenizer: no remote code; no BOS added (the card's protocol: add_bos_token=False)
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=block_size, add_bos_token=False,
               add_eos_token=False, clean_up_tokenization_spaces=False)
    special = {}
    for key, i in (("eos_token", eos_id), ("bos_token", bos_id)):
        if i is not None:
            special[key] = tk.id_to_token(i)
    for key in ("unk_token", "pad_token"):
        if isinstance(src_cfg.get(key), str):
            special[key] = src_cfg[key]
    cfg.update(special)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
    return bos_id, eos_id


def convert_native_to_hf(ckpt_path, out_dir, dtype="float32"):
    """Write a GPTNeoXForCausalLM folder: config.json, model.safetensors, generation_config.json, tokenizer."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConversionError("writing model.safetensors needs the safetensors package: pip install safetensors") from None
    model, ckpt = load_checkpoint(ckpt_path, "cpu")
    c = model.config
    ckpt_dir = ckpt_path if os.path.isdir(ckpt_path) else os.path.dirname(os.path.abspath(ckpt_path))
    os.makedirs(out_dir, exist_ok=True)
    tensors = {n: t.to(getattr(torch, dtype)) for n, t in neox_state_dict(model).items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    bos_id, eos_id = export_tokenizer(ckpt, ckpt_dir, out_dir, c.block_size)
    meta = {"input": c.input, "layout": c.layout, "affine_seed": c.affine_seed, "pad_token_id": c.pad_token_id,
            "bias": c.bias, "tokenizer": ckpt.get("tokenizer") if (ckpt.get("tokenizer") or {}).get("kind") == "tiktoken" else None}
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
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": c.pad_token_id}, f, indent=2)
    return out_dir


# ------------------------------------------------------------------------------------------- CLI
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(), formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples:\n  python convert.py hf2native ./llm-fix-min-fixed-minimal-binary-code out/fixmin --layout tile\n"
                                       "  python convert.py native2hf out/fixmin out/fixmin-hf")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("hf2native", help="a released HF folder -> OUT/ckpt.pt")
    a.add_argument("src", help="local HF model folder (config.json, *.safetensors or pytorch_model.bin, tokenizer files)")
    a.add_argument("out", help="output folder; ckpt.pt and the tokenizer files are written there")
    a.add_argument("--layout", choices=["tile", "interleave"], default=None,
                   help="how the K code bits are lifted to model width; required for the binary and affine variants "
                        "(nothing public says which the release uses). tile: dim j carries bit j mod K; "
                        "interleave: bit k fills dims [k*n_embd/K, (k+1)*n_embd/K)")
    a.add_argument("--input", choices=["binary", "affine", "learned"], default=None,
                   help="the variant, if config.json's model_type does not say (it is checked against the weights)")
    b = sub.add_parser("native2hf", help="a native checkpoint -> a stock GPTNeoXForCausalLM folder")
    b.add_argument("src", help="native checkpoint: a .pt file or a folder holding ckpt.pt")
    b.add_argument("out", help="output folder (config.json, model.safetensors, tokenizer.json, ...)")
    b.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="weight dtype written")
    args = p.parse_args(argv)
    try:
        if args.cmd == "hf2native":
            path, model, info = convert_hf_to_native(args.src, args.out, args.layout, args.input)
            n = model.num_params()
            print(f"wrote {path}: {info['variant']} input, layout {info['layout']}, names {', '.join(info['conventions'])}, "
                  f"{n['trainable']:,} trainable parameters, {n['frozen']:,} frozen values")
        else:
            out = convert_native_to_hf(args.src, args.out, args.dtype)
            print(f"wrote {out}: GPTNeoXForCausalLM (load with AutoModelForCausalLM.from_pretrained({out!r}))")
    except (ConversionError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
