"""
What int8 weights cost a trained model: quantize.py's int8 copy against the float32 model, on the data it
was trained on (CPU).

    python -m tools.quantize_quality --ckpt out --data_dir data/shakespeare

It prints the validation loss of both over every window of the validation split, how often the two pick the
same next token at every validation position (fed the same text), and how many greedy tokens agree; the same
for the weight-only product a compiled int8 model computes (sample.py --compile), as float layers holding
the int8 weights times their scales (quantize.weight_only_copy).
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

from dataclasses import dataclass

import numpy as np
import torch

from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.decode import generate
from bincode_gpt.tokenizer import check_tokenizer
from bincode_gpt.quantize import quantize_int8, weight_only_copy
from bincode_gpt.shards import load_meta
from bincode_gpt.shards import Split


@dataclass
class QualityConfig:
    ckpt: str = setting("out/ckpt.pt", "a native checkpoint .pt file, or a folder holding ckpt.pt (else best.pt)")
    data_dir: str = setting("data/shakespeare", "the prepared data the model was trained on (its validation split)")
    new_tokens: int = setting(200, "greedy tokens to compare, continuing the validation split's first prompt_tokens")
    prompt_tokens: int = setting(16, "validation tokens the greedy continuations start from")
    batch_size: int = setting(16, "validation windows per forward pass")


def quality(model, val, new_tokens, prompt_tokens, batch_size):
    """float32 against int8 (eager: quantize_int8) and int8 weight-only (compiled: weight_only_copy) on one
    model, in one pass over every window of `val` (a shards.Split): the mean loss of each and how often each
    picks float32's next token (the argmax, fed the same text); then `new_tokens` greedy tokens after its
    first `prompt_tokens` (free-running: after a first difference the texts part ways)."""
    cpu = torch.device("cpu")
    models = {"float32": model, "int8": quantize_int8(model), "weight-only": weight_only_copy(model)}
    loss, same_next = dict.fromkeys(models, 0.0), dict.fromkeys(models, 0)
    with torch.no_grad():
        for start in range(0, val.n, batch_size):
            x, y = val.batch(np.arange(start, min(start + batch_size, val.n)), cpu)
            out = {k: m(x, y) for k, m in models.items()}
            for k, (logits, l) in out.items():
                loss[k] += l.item() * len(x)
                same_next[k] += (logits.argmax(-1) == out["float32"][0].argmax(-1)).sum().item()
    prompt = torch.from_numpy(val.shards[0][:prompt_tokens].astype("int64"))[None]  # (1, prompt_tokens)
    greedy = {k: generate(m, prompt, new_tokens, temperature=0)[0, prompt.shape[1]:].tolist()
              for k, m in models.items()}
    same = {k: [a == b for a, b in zip(greedy["float32"], g)] for k, g in greedy.items()}
    return {"windows": val.n, "loss": {k: v / val.n for k, v in loss.items()}, "positions": val.n * val.block,
            "same_next": same_next, "tokens": new_tokens, "equal": {k: sum(s) for k, s in same.items()},
            "leading": {k: next((i for i, t in enumerate(s) if not t), len(s)) for k, s in same.items()}}


def main(argv=None):
    about = ("What int8 weights cost a trained model: its validation loss in float32 and int8, and how many greedy "
             "tokens agree (CPU).")
    cfg = parse_settings(config_parser(QualityConfig, about), argv)
    if min(cfg.new_tokens, cfg.prompt_tokens, cfg.batch_size) < 1:
        raise ValueError("--new_tokens, --prompt_tokens and --batch_size must be at least 1")
    # NaN or inf weights refused: else every figure would be nan
    model, ckpt = load_checkpoint(cfg.ckpt, torch.device("cpu"), purpose="measure")
    meta = load_meta(cfg.data_dir)
    check_tokenizer(ckpt, meta, cfg.ckpt, cfg.data_dir)
    val = Split(cfg.data_dir, meta, "val", model.config.block_size, model.config.vocab_size)
    r = quality(model.eval(), val, cfg.new_tokens, cfg.prompt_tokens, cfg.batch_size)
    f = r["loss"]["float32"]
    for k, name in (("int8", "int8"), ("weight-only", "int8 weight-only (what --compile runs)")):
        i = r["loss"][k]
        print(f"{name}: validation loss over {r['windows']:,} windows: float32 {f:.5f}, {k} {i:.5f} "
              f"({100 * (i / f - 1):+.3f}%)")
        print(f"{name}: greedy, {r['tokens']} tokens after the validation split's first {cfg.prompt_tokens}: the first "
              f"{r['leading'][k]} identical to float32's, {r['equal'][k]} / {r['tokens']} positions equal")
        print(f"{name}: next token (argmax) at every validation position, fed the same text: float32's at "
              f"{r['same_next'][k]:,} of {r['positions']:,} ({100 * r['same_next'][k] / r['positions']:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
