"""
int8 weights for quick sampling on a CPU: `sample.py --quantize int8`.

At batch 1 a decoded token reads every weight once, so on a CPU its time is mostly the weights' bytes
over memory bandwidth: 1.88 GB of float32 for the paper preset. In int8 the same matmuls read a quarter.

    model = quantize_int8(model)   # a copy whose nn.Linear layers (output head included) hold int8 weights

What int8 costs a trained model (validation loss, greedy tokens) is measured by tools/quantize_quality.py.

Design choices, up front:
- Weights: symmetric, one float scale per output row: w[n, k] ~ scale[n] * q[n, k], q in [-127, 127],
  scale[n] = max_k |w[n, k]| / 127, so each weight is off by at most scale[n] / 2.
- Activations are quantized on the fly the same way, one scale per token (row), as int8. The int8 x int8
  products sum in int32, exactly, then both scales bring the result back to float32.
- Kernel: chosen at load by what this CPU does (choose_kernel: a few cold calls of each on one of the
  model's own layers, 0.14-0.17 s on a quiet AMD EPYC), never assumed: torch's own oneDNN int8 linear on a packed weight
  (torch.ops.onednn.qlinear_prepack / qlinear_pointwise, what torch.compile's x86 int8 lowering emits)
  with int8 activations ("onednn-s8") or uint8 ones around 128 ("onednn-u8"), torch._int_mm on the
  plain rows ("rows"), or the plain rows widened to float32 a block at a time ("widened": widened_sums).
  They differ by CPU by orders of magnitude: on an AMD EPYC Zen 4 (AVX-512 VNNI, no AMX) oneDNN runs
  int8 x int8 in its reference kernel, ~700x slower than the rows, while uint8 x int8 (VNNI's own operand
  order) is quick; an Intel Xeon with AMX took int8 x int8 1.6x past the rows; on an AVX2-only AMD EPYC
  (no VNNI) oneDNN's products saturate 16-bit pair sums (wrong by up to 17%) and the widened rows are
  the quickest, 2x torch._int_mm. Only a kernel whose sums equal the exact int32 ones on the probe layer
  is chosen: the rows' are those sums by definition, and a kernel quicker than the rows is proven on it
  (gives_exact_sums) before it can be chosen. So every kernel in use computes the same float32 result
  bit for bit.
  Packing costs 2 (the Xeon) to 10 (the AMD EPYC Zen 4) CPU-seconds for the paper preset, so it runs on a
  thread of its own (start_packing) and a layer not yet packed multiplies its plain rows: the tokens never
  depend on the kernel or on how far packing has got. Where every int8 product is slower than float32's
  (a CPU without int8 dot products), a note says so: int8 then saves memory, not time.
  docs/performance.md gives the measurements (over torchao, quantize_dynamic, the weight-only
  _weight_int8pack_mm and packing before the first token), each with its CPU.
- Compiled (sample.py --compile): no int8 activations and no oneDNN. The weights alone are int8, the
  product a float32 sum over each int8 row that inductor writes into the decode step's own loops
  (Int8Linear.weight_only, the section at the end): on the paper preset 1.4-1.5x the eager int8 rate
  once compiled (about a minute per prompt-plus-length shape), so for long outputs. Its tokens may
  differ from the eager int8 model's (activations not rounded).
- What stays float: the code table (a gather, not a matmul, and already 0/1), LayerNorms, biases,
  attention over the KV cache. The float model is left as it was: the copy shares those tensors.
"""

import copy
import ctypes
import mmap
import os
import platform
import sys
import threading
import time

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


WEIGHT_ONLY_SPLIT = 8  # row blocks of the compiled product (Int8Linear.weight_only)
EXACT_K = 1024  # 127 * 127 * 1,024 < 2**24: a float32 sum of up to 1,024 int8 x int8 products is exact
# float32 values widened_sums widens at a time (2 MB): the paper preset, one thread, an AVX2-only AMD EPYC, ms a
# token for 2**17 / 2**18 / 2**19 / 2**20 / 2**21: 418-464 / 283-316 / 234-259 / 270-354 / 390-481
WIDEN_BLOCK = 2**19


def widened_sums(xr, q):
    """The int32 sums of xr (rows, K: integers in [-127, 127], as float32) times int8 rows q (N, K), exactly,
    as float32 (what torch._int_mm's int32 sums give converted): q widened to float32 a block of rows at a
    time, summed by float32 matmuls over at most EXACT_K terms, where every partial sum is an integer below
    2**24 and so exact in any order; longer rows add those sums in float64. Quicker than torch._int_mm
    where a CPU has no int8 dot products (an AVX2-only AMD EPYC: docs/performance.md)."""
    n, k = q.shape
    rows = max(1, WIDEN_BLOCK // k)
    buf = torch.empty(min(rows, n), k)
    out = torch.empty(len(xr), n, dtype=torch.float32 if k <= EXACT_K else torch.float64)
    for i in range(0, n, rows):
        block = buf[: min(rows, n - i)].copy_(q[i : i + rows])  # (rows, K) int8 -> float32
        if k <= EXACT_K:
            torch.mm(xr, block.t(), out=out[:, i : i + rows])
            continue
        part = out[:, i : i + rows].zero_()
        for j in range(0, k, EXACT_K):
            part += torch.mm(xr[:, j : j + EXACT_K], block[:, j : j + EXACT_K].t())
    return out.float()


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights (one scale per output row) and on-the-fly int8 activations: made from an
    nn.Linear (Int8Linear.of), or from the rows and scales an int8 checkpoint holds. `weight` is the plain
    (N, K) int8 rows until pack() swaps in oneDNN's packed form (one attribute: a forward running on
    another thread sees one or the other, never half of each)."""

    def __init__(self, q, scale, bias=None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("zero", torch.zeros(self.out_features, dtype=torch.long))  # symmetric: no offsets
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.packed = False  # set once pack() has swapped the rows (torch.compile reads, and guards on, a flag)
        self.kernel = "rows"  # its product (KERNELS; start_packing sets it); a oneDNN one once pack() has run
        self.packing = None  # the thread packing the model's layers (start_packing), this one among them

    @classmethod
    def of(cls, linear: nn.Linear):
        return cls(*int8_rows(linear.weight), linear.bias)

    def pack(self):
        """Swap the plain rows for oneDNN's packed form (its CPU-specific layout); returns the rows."""
        rows = self.weight
        if not rows.is_mkldnn:
            self.weight = torch.ops.onednn.qlinear_prepack(rows, [1, self.in_features])
            self.packed = True
        return rows

    def forward(self, x):
        if torch.compiler.is_compiling():  # a compiled step (sample.py --compile): the kernels inductor writes
            return self.weight_only(x)
        x2 = x.reshape(-1, self.in_features)  # (..., K) -> (rows, K)
        # each row (token) its own scale, max |x| / 127, in place after abs (abs + amax: 4x quicker than
        # vector_norm(inf) on a 4,096-wide row)
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)  # (rows, 1)
        xr = torch.div(x2, x_scale).round_()  # integers in [-127, 127], as floats
        w = self.weight  # read once: the packing thread may swap it
        kernel = self.kernel
        if KERNELS[kernel] is not None and not w.is_mkldnn:  # not packed yet: the plain rows, the same numbers
            kernel = "rows"
        y = int8_product(kernel, xr, w, self).mul_(x_scale)
        y = y.view(*x.shape[:-1], self.out_features)  # (rows, N) -> (..., N)
        return y if self.bias is None else y + self.bias

    def weight_only(self, x):
        """The product under torch.compile: the weights alone int8, x stays float32, y = (x . q[n]) * scale[n].
        Written as a sum over K so that inductor reads each int8 row once, widening it in registers; in
        WEIGHT_ONLY_SPLIT blocks of rows, which inductor fuses into one loop that reads a row of each
        block side by side: one stream of int8 rows reads 5 GB/s on one thread, 8 read 8-10 (an Intel
        Xeon with AMX; on the shared AMD EPYC 8 was the best or near it too: docs/performance.md). That
        is for one row of x (batch-1 decoding); for several, the int8 weights
        widened to float32 and a matmul (the same numbers, no quicker than float32 weights)."""
        if self.packed:
            raise ValueError("an int8 model compiles on its plain rows: quantize_int8(model, pack=False), or an int8 "
                             "checkpoint loaded with pack=False")
        x2 = x.reshape(-1, self.in_features)  # (..., K) -> (rows, K)
        if len(x2) == 1:  # (1, 1, K) x (N/S, K) blocks -> (1, N/S) each
            y = torch.cat([(x2[:, None, :] * q.float()).sum(-1) for q in self.weight.chunk(WEIGHT_ONLY_SPLIT)], -1)
        else:  # several sequences: the reduction would read every row once per sequence; a matmul reads it once
            y = torch.mm(x2, self.weight.float().t())
        y = y * self.scale
        y = y.view(*x.shape[:-1], self.out_features)  # (rows, N) -> (..., N)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def check_quantize(scheme, device, dtype=torch.float32):
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


def quantize_int8(model, pack=True):
    """A copy of `model` (float32, on the CPU) whose nn.Linear layers are Int8Linear; every other tensor is
    shared with `model` (the copy's code table is the very same buffer), and `model` is not modified.
    pack=False leaves the layers on their plain rows (torch._int_mm: the same numbers, slower), as a model
    that will run compiled needs them (Int8Linear.weight_only)."""
    p = next(model.parameters())
    check_quantize("int8", p.device, p.dtype)
    shared = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    shared.update({id(t): t for t in model.buffers()})  # non-persistent ones too (lift, rotary tables)
    q = copy.deepcopy(model, shared)  # the module tree anew, tensors shared
    for parent in list(q.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.of(child))
    compiles_weight_only(q)
    return start_packing(q) if pack else q


# ----------------------------------------------------------------------------- the int8 checkpoint
# tools/convert.py native2int8 writes what quantize_int8 would compute: every nn.Linear's weight as its int8 rows
# (name.weight, int8) and their scales (name.weight_scale, float32), every other tensor as the source holds
# it, and an entry "quantization" saying so. Loading it builds the model on the meta device and its int8
# layers on the rows of the memory-mapped file itself: no float32 copy, no rounding, the first token at once;
# the packing thread then packs them and (Linux) drops each layer's file pages once packed, so peak memory
# is about the int8 weights once.
SCHEME = "int8 rows: symmetric, one float32 scale per output row (name.weight_scale); int8 activations per token"


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


def pack_int8(model, rows, file, pack=True):
    """`model` (built by checkpoint.load_checkpoint, its int8 weights meta stand-ins) with an Int8Linear holding
    each layer's int8 rows from `rows` (the file's own memory, not copied), packed on a background thread
    that drops each layer's file pages once packed (start_packing); pack=False: left on the rows."""
    own = dict(model.named_modules())
    linear = [n for n, m in own.items() if isinstance(m, nn.Linear)]
    if sorted(rows) != sorted(linear):  # a linear layer left out would have read its int8 rows as floats
        raise ValueError(f"{file}: its int8 layers are not its model's linear layers ({len(rows)} listed, "
                         f"{len(linear)} in the model)")
    for name, (q, scale) in rows.items():
        model.set_submodule(name, Int8Linear(q, scale, own[name].bias))
    compiles_weight_only(model)
    return start_packing(model, file) if pack else model


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


# ------------------------------------------------------------------- the kernel, and packing on a thread of its own
# A model whose int8 weights are smaller is never packed: they sit in the CPU's caches, where oneDNN's cost
# per call outweighs its quicker inner loop (docs/performance.md, tokens/s packed / plain at 14 MB: 1.03x and
# 0.82x on an Intel Xeon with AMX at 1 and 2 threads, 0.83x on an AMD EPYC Zen 4 at 1); its plain rows are
# measured against the widened ones all the same (1.25x the rows at 13 MiB on an AVX2-only AMD EPYC).
PACK_MIN_BYTES = 16 * 2**20
# eager int8 products: the packed (oneDNN) ones' activation shift, None for the plain rows
KERNELS = {"onednn-s8": 0, "onednn-u8": 128, "rows": None, "widened": None}
UNPACKED = tuple(k for k, shift in KERNELS.items() if shift is None)
FLUSH_BYTES = 64 * 2**20  # choose_kernel reads this much of the leading layers between calls: past a last-level cache
CPU_FLAGS = ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def cpu_summary():
    """This CPU as speed claims name it: its model name and the flags that decide int8 and bfloat16 speed, from
    /proc/cpuinfo ("AMD EPYC: avx2 avx512f avx512_vnni avx512_bf16"); elsewhere platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
    except OSError:
        return platform.processor() or platform.machine()
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = set(info.get("flags", "").split())
    found = [f for f in CPU_FLAGS if f in flags]
    return f"{info.get('model name', platform.machine())}: {' '.join(found) or 'none of ' + ' '.join(CPU_FLAGS)}"


def choose_kernel(layers, kernels=tuple(KERNELS), flush_bytes=FLUSH_BYTES, rounds=3):
    """The quickest exact eager int8 product on this CPU among `kernels` (the rows among them), measured, and a
    line saying what was measured. The probe is one real layer, the smallest of the model's leading layers (a
    copy packed: oneDNN packs at 0.05-0.23 GB/s).
    Timed first: a first call of each, untimed, builds it for the shape (oneDNN's kernel: 1-3 ms for onednn-u8
    on an AMD EPYC Zen 4); a kernel whose first call fails is left out. Then each call is timed cold, after a
    pass of the plain rows over the leading flush_bytes of layers, so that its weights come from memory as a
    decoded token reads them. A kernel 10x slower than the rows in the first round is left out of the rest
    (oneDNN's reference kernel, ~700x the rows on some CPUs); the best of `rounds` rounds, interleaved, decides.
    Then the sums: the rows' are the exact int32 ones by definition (torch._int_mm); a kernel quicker than
    the rows is proven on the probe (gives_exact_sums), quickest first, until one is exact, and left out
    where its sums differ: on an AVX2-only CPU (no VNNI) oneDNN's uint8 x int8 products are the quickest and
    saturate 16-bit pair sums, off by up to 17% of the largest output. So the kernel returned is the
    quickest with exact sums; one slower than it needs no proof.
    0.14-0.17 s on the paper preset, one thread, a quiet AMD EPYC Zen 4: 80-100 ms the 13 cold-cache
    passes, 45-55 ms the reference kernel's two calls, 14 ms packing the probe. float32's product on the
    same layer (its rows times their scales) is timed alike, for scale: -> kernel, line, the kernel's time /
    float32's.
    The line gives the best times of those timed, then those left out after one call, those proven inexact
    (with their times), those that failed, and float32's; a kernel slower than the one chosen was not proven
    either way."""
    flush, size = [], 0
    for layer in layers:
        if size >= flush_bytes:
            break
        flush.append(layer)
        size += layer.weight.numel()
    probe = min(flush, key=lambda m: m.weight.numel())
    packed, failed = None, []
    if any(KERNELS[k] is not None for k in kernels):
        try:
            packed = torch.ops.onednn.qlinear_prepack(probe.weight, [1, probe.in_features])
        except RuntimeError as e:  # a CPU or build oneDNN cannot pack for
            failed = [f"oneDNN cannot pack here ({str(e).splitlines()[0][:200]})"]
            kernels = [k for k in kernels if KERNELS[k] is None]
    x = {k: torch.randint(-127, 128, (1, k)).float() for k in {m.in_features for m in flush}}
    dense = probe.weight.float().mul_(probe.scale[:, None])  # float32 rows, for scale

    def call(kernel):
        if kernel == "float32":
            return nn.functional.linear(x[probe.in_features], dense)
        w = probe.weight if KERNELS[kernel] is None else packed
        return int8_product(kernel, x[probe.in_features], w, probe)

    def cold(kernel):
        for m in flush:
            int8_product("rows", x[m.in_features], m.weight, m)
        start = time.perf_counter()
        call(kernel)
        return time.perf_counter() - start

    working = []
    for k in kernels:  # the first call builds the kernel for the shape; one it cannot build is left out
        try:
            call(k)
        except RuntimeError:
            failed.append(k)
            continue
        working.append(k)
    best = {k: cold(k) for k in working}
    # against the rows, not the quickest: a quicker kernel may yet prove inexact
    kept = [k for k in working if best[k] <= 10 * best["rows"]]
    f32 = cold("float32")
    for _ in range(rounds - 1):
        for k in kept:
            best[k] = min(best[k], cold(k))
        f32 = min(f32, cold("float32"))
    wrong = []
    for kernel in sorted(kept, key=best.get):  # quickest first, up to the rows or the first one proven exact
        if kernel == "rows":
            break
        try:
            if gives_exact_sums(kernel, probe, packed):
                break
        except RuntimeError:
            failed.append(kernel)
            continue
        wrong.append(kernel)
    why = (f"measured at load, ms a call on a {probe.out_features} x {probe.in_features} layer, cold, best of "
           f"{rounds}: " + ", ".join(f"{k} {1e3 * best[k]:.3f}" for k in kept if k not in wrong + failed))
    if len(kept) < len(working):
        why += "; left out after one: " + ", ".join(f"{k} {1e3 * best[k]:.3f}" for k in working if k not in kept)
    if wrong:
        why += "; left out, inexact sums here: " + ", ".join(f"{k} {1e3 * best[k]:.3f}" for k in wrong)
    if failed:
        why += "; failed: " + ", ".join(failed)
    why += f"; float32 {1e3 * f32:.3f}"
    return kernel, why, best[kernel] / f32


def int8_product(kernel, xr, w, layer):
    """The product of activations xr (rows, K: integers in [-127, 127], as float32) and `layer`'s int8 weights
    by `kernel` (KERNELS), float32, the rows' scales applied: w is the layer's plain rows, or for a oneDNN
    kernel its packed weight. Every kernel with exact sums (gives_exact_sums) gives the same numbers."""
    shift = KERNELS[kernel]
    if shift is not None:  # oneDNN takes one activation scale: give it 1 and apply the rows' scales to its output
        xq = (xr + shift).to(torch.uint8) if shift else xr.to(torch.int8)  # uint8: the same values around 128
        return torch.ops.onednn.qlinear_pointwise.default(xq, 1.0, shift, w, layer.scale, layer.zero, None, 1.0, 0,
                                                          torch.float32, "none", [], "")
    if kernel == "widened":  # the rows widened to float32: the same sums, exact
        return torch.mul(widened_sums(xr, w), layer.scale)
    return torch.mul(torch._int_mm(xr.to(torch.int8), w.t()), layer.scale)  # int32 sums to float32, scaled


def gives_exact_sums(kernel, layer, packed=None):
    """Whether `kernel` computes `layer`'s exact int32 sums on this CPU (the rows' torch._int_mm does), for
    activations over the whole int8 range; `packed`: the layer's weight packed for oneDNN (default: packed
    here). True on CPUs with int8 dot products (VNNI, AMX); False for oneDNN on an AVX2-only CPU."""
    if kernel == "rows":
        return True
    w = layer.weight
    if KERNELS[kernel] is not None:
        w = packed if packed is not None else torch.ops.onednn.qlinear_prepack(w, [1, layer.in_features])
    # the extremes, where 16-bit pair sums saturate first, and a spread over the whole range
    spread = torch.randint(-127, 128, (layer.in_features,), generator=torch.Generator().manual_seed(0)).float()
    x = torch.stack([torch.full_like(spread, 127), torch.full_like(spread, -127), spread])
    return torch.equal(int8_product(kernel, x, w, layer), int8_product("rows", x, layer.weight, layer))


def kernel_line(model, compiled=False):
    """One line for stderr (sample.py --verbose): which int8 product `model` runs, why, and on which CPU; or,
    for a model without int8 weights, the dtype of its matmuls."""
    if not any(isinstance(m, Int8Linear) for m in model.modules()):
        return f"no int8 weights: {str(next(model.parameters()).dtype).removeprefix('torch.')} matmuls"
    if compiled:
        kernel, why = "weight-only, compiled", "Int8Linear.weight_only: float32 activations times the int8 rows"
    else:
        kernel, why = getattr(model, "int8_kernel", ("rows", "not packed (pack=False)"))
    return f"int8 kernel: {kernel} ({why}) on {cpu_summary()}"


def start_packing(model, file=None, min_bytes=PACK_MIN_BYTES, kernel=None):
    """Choose `model`'s int8 product (choose_kernel; under min_bytes of int8 weights, an unpacked one), or
    take `kernel`, record it as model.int8_kernel (kernel_line), and for a packed one pack its Int8Linear
    layers for oneDNN on a background thread (each layer's `packing`), in the order a forward pass meets them;
    returns `model`. Until a layer is packed it multiplies its plain rows (bit-identical, slower), so the first
    token need not wait the 2-10 CPU-seconds packing takes. With `file`, the int8 checkpoint the rows are
    mapped from, each layer's file pages are dropped once it is packed. The thread stops between layers once
    the main thread has ended (a short run exits without packing the rest); wait_packed waits for it. Until
    then leave the model's tensors be: Module.to, say, would write back the plain rows it read over a layer
    just packed (its numbers the same, slower)."""
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    if kernel is not None:
        why = "asked for"
    elif sum(m.out_features * m.in_features for m in layers) < min_bytes:
        kernel, why, _ = choose_kernel(layers, kernels=UNPACKED)
        why = f"int8 weights under {min_bytes / 2**20:g} MiB, in the CPU's caches: not packed; {why}"
    else:
        kernel, why, ratio = choose_kernel(layers)
        # said of a model that streams its weights from memory, where the kernels' rates are the CPU's
        if ratio > 1:  # a CPU without int8 dot products (an AVX2-only AMD EPYC: 1.4-2x float32's time)
            print(f"note: int8 is slower than float32 on this CPU ({cpu_summary()}): its quickest int8 product, "
                  f"{kernel}, took {ratio:.1f}x float32's time on a layer of this model; int8 saves memory here, "
                  "not time", file=sys.stderr)
    model.int8_kernel = kernel, why  # a plain attribute: not a submodule, not in the state dict
    for layer in layers:
        layer.kernel = kernel
    if KERNELS[kernel] is None:
        return model
    mapped = file_mappings(file) if file else []

    def pack_all():
        rows = []
        for layer in layers:
            if not threading.main_thread().is_alive():
                return
            try:
                plain = layer.pack()
            except RuntimeError as e:  # a CPU or build oneDNN cannot pack for: the plain rows serve, slower
                print(f"int8: packing failed ({str(e).splitlines()[0][:200]}); the plain int8 rows serve instead "
                      "(the same tokens, slower)", file=sys.stderr)
                return
            if mapped:  # the file's rows: their pages go back to the page cache
                drop_pages(plain, mapped)
                rows.append(plain)
            else:  # rows rounded in memory of their own: freed now, and handed back to the system
                del plain
                trim_heap()
        for r in rows:  # again: a forward that read a layer's rows just before its swap may have paged some back in
            drop_pages(r, mapped)

    packing = threading.Thread(target=pack_all, name="int8 packing")
    for layer in layers:  # each layer knows the thread that packs it (wait_packed)
        layer.packing = packing
    packing.start()
    return model


def trim_heap():
    """Hand memory freed inside the C heap back to the system (glibc's malloc_trim; elsewhere nothing):
    freed rows lie between packed ones, where a plain free() leaves them counted in the process's memory
    (peak RSS of `--quantize int8` on the paper preset: 3.09 GB without, 2.71 GB with)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except AttributeError:
        pass


def wait_packed(model):
    """`model` once the packing of its int8 layers (start_packing) is done: a steady speed from the first token
    on."""
    for layer in model.modules():
        if isinstance(layer, Int8Linear) and layer.packing is not None:
            layer.packing.join()
    return model


# ----------------------------------------------------------------------------- compiled: weight-only int8
# Under torch.compile (sample.py --compile, decode.stream(compile=True)) an Int8Linear computes weight_only:
# no int8 activations, no oneDNN; inductor writes the decode step's loops, each reading int8 rows and
# multiplying in float32. The one setting it needs: store an intermediate of more than one op rather than
# inline it into its readers (realize_opcount_threshold 1), or inductor recomputes a LayerNorm or GELU
# inside every output row's loop. Paper preset, one thread, an Intel Xeon with AMX (scratch): 17.5 tokens/s
# without, 20.8 with (eager int8: 12.8); AMD EPYC Zen 4: docs/performance.md. Tokens may differ from the
# eager model's (float activations here, int8 there); tools/quantize_quality.py measures both.
COMPILE_OPTIONS = {"realize_opcount_threshold": 1}


def weight_only_copy(model):
    """A float32 copy of `model` whose nn.Linear weights are their int8 rounding, q * scale: the numbers a
    compiled int8 model multiplies by (Int8Linear.weight_only), for measuring them eagerly
    (tools/quantize_quality.py; tests hold the two equal to float32 summation order)."""
    twin = copy.deepcopy(model)
    for m in twin.modules():
        if isinstance(m, nn.Linear):
            q, scale = int8_rows(m.weight)
            m.weight = nn.Parameter(q.float() * scale[:, None], requires_grad=False)
    return twin


def compiles_weight_only(model):
    """Mark `model` for decode.compiled_step to compile with COMPILE_OPTIONS."""
    model.compile_options = COMPILE_OPTIONS  # a plain attribute: not a submodule, not in the state dict


# it had a quality command once; `python quantize.py --ckpt X --data_dir D` still says where it went
if __name__ == "__main__":
    import shlex

    from bincode_gpt.exits import not_a_command
    quality = shlex.join(["python", "-m", "tools.quantize_quality", *sys.argv[1:]])
    sys.exit(not_a_command("bincode_gpt/quantize.py", "sample with int8 weights by `python sample.py --quantize int8`; "
                                                      f"measure what int8 costs by `{quality}`"))
