"""
int8 weights for quick sampling on a CPU: `sample.py --quantize int8`.

At batch 1 a decoded token reads every weight once, so on a CPU its time is mostly the weights' bytes
over memory bandwidth: 1.88 GB of float32 for the paper preset. In int8 the same matmuls read a quarter.

    model = quantize_int8(model)   # a copy whose nn.Linear layers (output head included) hold int8 weights
    python quantize.py --ckpt out --data_dir data/shakespeare   # what int8 costs a trained model: loss, greedy tokens

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
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from common import config_parser, parse_settings, run_main, setting
from model import generate

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
    """nn.Linear with int8 weights (one scale per output row) and on-the-fly int8 activations."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        q, scale = int8_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.ops.onednn.qlinear_prepack(q, [1, self.in_features]))  # oneDNN's layout
        self.register_buffer("scale", scale)
        self.register_buffer("zero", torch.zeros(self.out_features, dtype=torch.long))  # symmetric: no offset
        self.register_buffer("x_zero", torch.tensor(128))  # activations as uint8 around 128
        self.register_buffer("one", torch.tensor(1.0))
        self.bias = linear.bias

    def forward(self, x):
        x2 = x.reshape(-1, self.in_features)  # (..., K) -> (rows, K)
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127  # (rows, 1): each token its own scale
        xq = (x2 / x_scale).round_().add_(128).to(torch.uint8)
        # the kernel takes one activation scale: give it 1 and apply the rows' scales to its output
        y = torch.ops.onednn.qlinear_pointwise.tensor(xq, self.one, self.x_zero, self.weight, self.scale, self.zero,
                                                      None, 1.0, 0, torch.float32, "none", [], "") * x_scale
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
        raise ValueError(f"--quantize int8 is a CPU path (oneDNN's int8 kernel); on {device} use --dtype bfloat16")
    if not torch.backends.mkldnn.is_available():
        raise ValueError("--quantize int8 needs a PyTorch build with oneDNN (the x86 builds from PyPI have it)")
    if dtype != torch.float32:
        raise ValueError("--quantize int8 starts from float32 weights: leave --dtype at float32")
    if compile:  # torch 2.13's inductor fails on the oneDNN int8 op called this way
        raise ValueError("--quantize int8 runs eagerly: drop --compile (torch.compile fails on its oneDNN int8 op)")


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
                setattr(parent, name, Int8Linear(child))
    return q


# ----------------------------------------------------------------------------- command line: int8 against float32
@dataclass
class QualityConfig:
    ckpt: str = setting("out/ckpt.pt", "a native checkpoint .pt file, or a folder holding ckpt.pt")
    data_dir: str = setting("data/shakespeare", "the prepared data the model was trained on (its validation split)")
    new_tokens: int = setting(200, "greedy tokens to compare, continuing the validation split's first prompt_tokens")
    prompt_tokens: int = setting(16, "validation tokens the greedy continuations start from")
    batch_size: int = setting(16, "validation windows per forward pass")


def quality(model, val, new_tokens, prompt_tokens, batch_size):
    """float32 against int8 on one model, in one pass over every window of `val` (a train.Split): the mean
    loss of each and how often the two pick the same next token (the argmax, fed the same text); then
    `new_tokens` greedy tokens after its first `prompt_tokens` (free-running: after a first difference the
    two texts part ways)."""
    cpu = torch.device("cpu")
    q = quantize_int8(model)
    loss, same_next = [0.0, 0.0], 0
    with torch.no_grad():
        for start in range(0, val.n, batch_size):
            x, y = val.batch(np.arange(start, min(start + batch_size, val.n)), cpu)
            (lf, f), (lq, i) = model(x, y), q(x, y)
            loss = [loss[0] + f.item() * len(x), loss[1] + i.item() * len(x)]
            same_next += (lf.argmax(-1) == lq.argmax(-1)).sum().item()
    prompt = torch.from_numpy(val.shards[0][:prompt_tokens].astype("int64"))[None]  # (1, prompt_tokens)
    greedy = [generate(m, prompt, new_tokens, temperature=0)[0, prompt.shape[1]:].tolist() for m in (model, q)]
    same = [a == b for a, b in zip(*greedy)]
    return {"windows": val.n, "loss": [x / val.n for x in loss], "positions": val.n * val.block,
            "same_next": same_next, "tokens": len(same), "equal": sum(same),
            "leading": next((i for i, s in enumerate(same) if not s), len(same))}


def main(argv=None):
    from checkpoint import check_finite, load_checkpoint
    from train import Split, check_tokenizer, read_meta

    cfg = parse_settings(config_parser(QualityConfig, "What int8 weights cost a trained model: its validation loss "
                                                      "in float32 and int8, and how many greedy tokens agree (CPU)."), argv)
    if min(cfg.new_tokens, cfg.prompt_tokens, cfg.batch_size) < 1:
        raise ValueError("--new_tokens, --prompt_tokens and --batch_size must be at least 1")
    model, ckpt = load_checkpoint(cfg.ckpt, torch.device("cpu"))
    check_finite(model.state_dict(), cfg.ckpt, "measure")  # else every figure would be nan
    meta = read_meta(cfg.data_dir)
    check_tokenizer(ckpt, meta, cfg.ckpt, cfg.data_dir)
    val = Split(cfg.data_dir, meta, "val", model.config.block_size, model.config.vocab_size)
    r = quality(model.eval(), val, cfg.new_tokens, cfg.prompt_tokens, cfg.batch_size)
    f, i = r["loss"]
    print(f"validation loss over {r['windows']:,} windows: float32 {f:.5f}, int8 {i:.5f} ({100 * (i / f - 1):+.3f}%)")
    print(f"greedy, {r['tokens']} tokens after the validation split's first {cfg.prompt_tokens}: the first "
          f"{r['leading']} identical, {r['equal']} / {r['tokens']} positions equal")
    print(f"next token (argmax) at every validation position, fed the same text: the same at {r['same_next']:,} of "
          f"{r['positions']:,} ({100 * r['same_next'] / r['positions']:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
