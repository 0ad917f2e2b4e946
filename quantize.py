"""
int8 weights for quick sampling on a CPU: `sample.py --quantize int8`.

At batch 1 a decoded token reads every weight once, so on a CPU its time is mostly the weights' bytes
over memory bandwidth: 1.88 GB of float32 for the paper preset. In int8 the same matmuls read a quarter.

    model = quantize_int8(model)   # a copy whose nn.Linear layers (output head included) hold int8 weights

What int8 costs a trained model (validation loss, greedy tokens) is measured by tools/quantize_quality.py.

Design choices, up front:
- Weights: symmetric, one float scale per output row: w[n, k] ~ scale[n] * q[n, k], q in [-127, 127],
  scale[n] = max_k |w[n, k]| / 127, so each weight is off by at most scale[n] / 2.
- Activations are quantized on the fly the same way, one scale per token (row), stored as uint8 around
  128, the form the x86 int8 kernel takes. The int8 x int8 products sum in int32,
  then both scales bring the result back to float32.
- Kernel: torch's own oneDNN int8 linear on a weight packed once (torch.ops.onednn.qlinear_prepack /
  qlinear_pointwise, what torch.compile's x86 int8 lowering emits). README's "Sampling in int8" gives the
  measurements that chose it over torchao, quantize_dynamic (deprecated) and other torch kernels.
- What stays float: the code table (a gather, not a matmul, and already 0/1), LayerNorms, biases,
  attention over the KV cache. The float model is left as it was: the copy shares those tensors.
"""

import copy
import ctypes
import math
import mmap
import os

import torch
import torch.nn as nn


QUANTIZE = ("int8",)  # the choices of --quantize


def int8_rows(w):
    """(N, K) float -> (q int8 (N, K), scale float32 (N,)): symmetric per-row rounding, w ~ scale[:, None] * q."""
    w = w.detach()
    scale = torch.maximum(w.amax(dim=1), -w.amin(dim=1)).float().clamp(min=1e-12) / 127  # no |w| temporary
    q = torch.empty(w.shape, dtype=torch.int8)
    # a block of rows at a time through one small float buffer: a whole-matrix temporary would cost its page
    # faults (~3x slower on the paper preset's weights, a second before the first token)
    step = max(1, 2**18 // w.shape[1])
    buf = torch.empty(step, w.shape[1])
    for i in range(0, len(w), step):
        block = torch.div(w[i : i + step], scale[i : i + step, None], out=buf[: min(step, len(w) - i)])
        q[i : i + step] = block.round_()
    return q, scale


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights (one scale per output row) and on-the-fly int8 activations: made from an
    nn.Linear (Int8Linear.of), or from the rows and scales an int8 checkpoint holds."""

    def __init__(self, q, scale, bias=None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight", torch.ops.onednn.qlinear_prepack(q, [1, self.in_features]))  # oneDNN's layout
        self.register_buffer("scale", scale)
        self.register_buffer("zero", torch.zeros(self.out_features, dtype=torch.long))  # symmetric: no offset
        self.register_buffer("x_zero", torch.tensor(128))  # activations as uint8 around 128
        self.register_buffer("one", torch.tensor(1.0))
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def of(cls, linear: nn.Linear):
        return cls(*int8_rows(linear.weight), linear.bias)

    def forward(self, x):
        x2 = x.reshape(-1, self.in_features)  # (..., K) -> (rows, K)
        # each row (token) its own scale, max |x| / 127: one op for max |x|, the rest in place
        x_scale = torch.linalg.vector_norm(x2, math.inf, dim=1, keepdim=True).clamp_(min=1e-12).div_(127)  # (rows, 1)
        xq = torch.div(x2, x_scale).round_().add_(128).to(torch.uint8)
        # the kernel takes one activation scale: give it 1 and apply the rows' scales to its output
        y = torch.ops.onednn.qlinear_pointwise.tensor(xq, self.one, self.x_zero, self.weight, self.scale, self.zero,
                                                      None, 1.0, 0, torch.float32, "none", [], "").mul_(x_scale)
        y = y.view(*x.shape[:-1], self.out_features)  # (rows, N) -> (..., N)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def check_quantize(scheme, device, dtype=torch.float32, compile=False):
    """Nothing, or a clear refusal of a --quantize this build, device or combination of flags cannot do."""
    if scheme is None:
        return
    if scheme not in QUANTIZE:
        raise ValueError(f"unknown --quantize {scheme!r}: choose {', '.join(QUANTIZE)}")
    if torch.device(device).type != "cpu":
        raise ValueError(f"int8 weights (--quantize int8, an int8 checkpoint) are a CPU path (oneDNN's int8 kernel); "
                         f"on {device} sample the float32 checkpoint with --dtype bfloat16")
    if not torch.backends.mkldnn.is_available():
        raise ValueError("int8 weights: needs a PyTorch build with oneDNN (the x86 builds from PyPI have it)")
    if dtype != torch.float32:
        raise ValueError("int8 weights compute in float32 between their matmuls: leave --dtype at float32")
    if compile:  # torch 2.13's inductor fails on the oneDNN int8 op called this way
        raise ValueError("int8 weights run eagerly: drop --compile (torch.compile fails on their oneDNN int8 op)")


def quantize_int8(model):
    """A copy of `model` (float32, on the CPU) whose nn.Linear layers are Int8Linear; every other tensor is
    shared with `model` (the copy's code table is the very same buffer), and `model` is not modified."""
    p = next(model.parameters())
    check_quantize("int8", p.device, p.dtype)
    shared = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    shared.update({id(t): t for t in model.buffers()})  # non-persistent ones too (lift, rotary tables)
    shared.update({id(v): v for k, v in model.__dict__.items() if k == "_compiled"})  # a compiled step is not copied
    q = copy.deepcopy(model, memo=shared)  # the module tree anew, tensors shared
    q.__dict__.pop("_compiled", None)  # the float model's compiled step would call the float layers
    for parent in list(q.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.of(child))
    return q


# ----------------------------------------------------------------------------- the int8 checkpoint
# tools/convert.py native2int8 writes what quantize_int8 would compute: every nn.Linear's weight as its int8 rows
# (name.weight, int8) and their scales (name.weight_scale, float32), every other tensor as the source holds
# it, and an entry "quantization" saying so. Loading it builds the model on the meta device and packs the
# int8 rows straight from the memory-mapped file: no float32 copy, no rounding, and (Linux) each layer's
# file pages are dropped from the process once packed, so peak memory is about the int8 weights once.
SCHEME = "int8 rows: symmetric, one float32 scale per output row (name.weight_scale); int8 activations per token"


def is_int8(ckpt):
    """Whether a checkpoint dict is an int8 checkpoint (python -m tools.convert native2int8)."""
    return "quantization" in ckpt


def int8_checkpoint(model, ckpt, source):
    """The int8 checkpoint of `model` (float32, loaded from the checkpoint dict `ckpt`): its linear layers'
    int8 rows and scales, int8_rows of the very weights quantize_int8 rounds (so both sample the same
    tokens); every other tensor and entry of `ckpt` as it is, the optimizer's state left out; `source`
    (a dict: the file it came from, its fingerprint) recorded under "quantization"."""
    linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    sd = {k: t for k, t in ckpt["model"].items() if k.rpartition(".")[0] not in linear or not k.endswith(".weight")}
    for name in linear:
        sd[f"{name}.weight"], sd[f"{name}.weight_scale"] = int8_rows(model.get_submodule(name).weight)
    rest = {k: v for k, v in ckpt.items() if k not in ("model", "optimizer")}
    return {**rest, "model": sd, "quantization": {"scheme": SCHEME, "layers": linear, "source": source}}


def split_int8(ckpt, file):
    """The int8 checkpoint `ckpt` (read from `file`) -> (its state dict with a meta-device stand-in for each
    int8 weight, {layer: (int8 rows, scales)}): checkpoint.load_checkpoint builds the model from the first
    (names and shapes checked, nothing read) and pack_int8 puts the second in. A missing, misshapen or
    mistyped tensor is a ValueError naming the file."""
    entry = ckpt["quantization"]
    if not (isinstance(entry, dict) and entry.get("scheme") == SCHEME and isinstance(entry.get("layers"), list)):
        raise ValueError(f"{file}: an int8 checkpoint of another scheme or version ({str(entry)[:200]}): "
                         "convert its float32 source again with python -m tools.convert native2int8")
    sd, rows = dict(ckpt["model"]), {}
    scaled = sorted(k.removesuffix(".weight_scale") for k in sd if k.endswith(".weight_scale"))
    if scaled != sorted(entry["layers"]):  # a layer left out of the list would read its int8 rows as floats
        raise ValueError(f"{file}: its int8 layers are not the layers with int8 scales ({len(entry['layers'])} listed, "
                         f"{len(scaled)} with scales)")
    for name in entry["layers"]:
        q, scale = sd.get(f"{name}.weight"), sd.pop(f"{name}.weight_scale", None)
        if q is None or scale is None:
            raise ValueError(f"{file}: its int8 layer {name!r} has no int8 rows and scales")
        if q.dtype != torch.int8 or scale.dtype != torch.float32 or scale.shape != q.shape[:1]:
            raise ValueError(f"{file}: {name}: int8 rows and float32 scales per row expected, found {q.dtype} "
                             f"{tuple(q.shape)} and {scale.dtype} {tuple(scale.shape)}")
        rows[name] = q, scale
        sd[f"{name}.weight"] = torch.empty(q.shape, device="meta")  # a stand-in: the shape is checked, nothing read
    return sd, rows


def pack_int8(model, rows, file):
    """`model` (built by checkpoint.load_checkpoint, its int8 weights meta stand-ins) with an Int8Linear holding
    each layer's int8 rows from `rows`; the file's pages of each are dropped once packed (drop_pages)."""
    own = dict(model.named_modules())
    linear = [n for n, m in own.items() if isinstance(m, nn.Linear)]
    if sorted(rows) != sorted(linear):  # a linear layer left out would have read its int8 rows as floats
        raise ValueError(f"{file}: its int8 layers are not its model's linear layers ({len(rows)} listed, "
                         f"{len(linear)} in the model)")
    mapped = file_mappings(file)
    for name, (q, scale) in rows.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, Int8Linear(q, scale, own[name].bias))
        drop_pages(q, mapped)  # packed now: the file's copy need not stay in memory
    return model


def file_mappings(file):
    """(start, end) addresses of this process's memory mappings of `file` (Linux; elsewhere none)."""
    real, spans = os.path.realpath(file), []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == real:
                    lo, hi = fields[0].split("-")
                    spans.append((int(lo, 16), int(hi, 16)))
    except OSError:
        pass
    return spans


def drop_pages(t, mapped):
    """Drop the whole pages of t's bytes from this process's memory with madvise(MADV_DONTNEED), if they lie
    in a mapping of the checkpoint file (`mapped`): they hold the file's unmodified bytes, so a later read
    faults them in again from the page cache. Never anonymous memory, whose contents it would discard."""
    start = -(-t.data_ptr() // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (t.data_ptr() + t.numel() * t.element_size()) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start and any(lo <= start and end <= hi for lo, hi in mapped):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)
