"""
Draw the fixed binary code and its two lifts (assets/code_lifts.png, shown in README), from model.py's own
code: the V x K code table (BinaryCodeInput's frozen buffer `weight`) and what BinaryCodeInput feeds the
decoder for every token under each layout.

    python -m tools.code_figure                          # -> assets/code_lifts.png: 16 tokens (K = 4), width 16
    python -m tools.code_figure --vocab_size 32 --n_embd 20 --out /tmp/code.png

Each bit k has a colour; a 1 is drawn in its bit's colour, a 0 white, so the picture shows where each bit
of the code lands in the model's input: "tile" copies the K bits side by side (dim j carries bit j mod K),
"interleave" gives bit k a block of n_embd/K neighbouring dims. One token's row is outlined in all three; the
ids whose code is constant (all zeros, all ones), kept for bytes text never holds, are labelled in red.
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

from dataclasses import dataclass

import torch

from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.files import atomic_open
from model import BinaryCodeInput, code_bits, lift_index

MARK = "bincode-gpt tools/code_figure.py"  # in the PNG's metadata: the one kind of file --out may replace


@dataclass
class FigureConfig:
    out: str = setting("assets/code_lifts.png", "the PNG to write (an existing file only if this tool wrote it)")
    vocab_size: int = setting(16, "tokens drawn (rows): ids 0 .. vocab_size-1, K = ceil(log2 vocab_size) bits")
    n_embd: int = setting(16, "model width the code is lifted to (columns of the two lifts)")
    token: int = setting(11, "the token whose row is outlined")


def panels(vocab_size, n_embd):
    """{title: (values (rows, cols) of 0/1, bit carried by each column)}: the code table and BinaryCodeInput's
    output for ids 0 .. vocab_size-1 under each layout."""
    ids, bits = torch.arange(vocab_size), code_bits(vocab_size)
    out = {"code table (V x K)": (BinaryCodeInput(vocab_size, n_embd).weight, torch.arange(bits))}
    rules = (("tile", "dim j carries bit j mod K"), ("interleave", "bit k fills n_embd/K neighbouring dims"))
    for layout, rule in rules:
        with torch.no_grad():
            lifted = BinaryCodeInput(vocab_size, n_embd, layout)(ids[None])[0]
        out[f'"{layout}" lift to n_embd: {rule}'] = (lifted, lift_index(n_embd, bits, layout))
    return out


def draw(cfg):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        raise ValueError("tools/code_figure.py draws with matplotlib: pip install matplotlib") from None
    bits = code_bits(cfg.vocab_size)
    if not 2 <= cfg.vocab_size <= 256 or not bits <= cfg.n_embd <= 256:
        raise ValueError(f"draws 2 to 256 tokens lifted to K ({bits}) to 256 dims, got --vocab_size {cfg.vocab_size} "
                         f"--n_embd {cfg.n_embd}")
    if not 0 <= cfg.token < cfg.vocab_size:
        raise ValueError(f"--token {cfg.token} is not one of the {cfg.vocab_size} tokens drawn")
    data = panels(cfg.vocab_size, cfg.n_embd)
    colours = plt.get_cmap("tab10" if bits <= 10 else "tab20")
    widths = [v.shape[1] for v, _ in data.values()]
    fig, axes = plt.subplots(1, 3, figsize=(2.2 + 0.3 * sum(widths), 1.6 + 0.28 * cfg.vocab_size),
                             gridspec_kw={"width_ratios": widths})
    for ax, (title, (values, bit_of)) in zip(axes, data.items()):
        rgb = torch.ones(*values.shape, 3)
        for col, k in enumerate(bit_of.tolist()):
            rgb[values[:, col] == 1, col] = torch.tensor(colours(k % colours.N)[:3], dtype=torch.float32)
        ax.imshow(rgb.numpy(), aspect="equal", interpolation="nearest")
        ax.set_xticks(range(values.shape[1]), [str(k) for k in bit_of.tolist()], fontsize=7)
        ax.set_yticks(range(cfg.vocab_size), [str(t) for t in range(cfg.vocab_size)], fontsize=7)
        ax.set_xticks([x - 0.5 for x in range(values.shape[1] + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(cfg.vocab_size + 1)], minor=True)
        ax.grid(which="minor", color="0.8", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("dims 0 .. n_embd-1, each labelled with the bit k it carries" if ax is not axes[0]
                      else "bit k (least significant first)", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.add_patch(Rectangle((-0.5, cfg.token - 0.5), values.shape[1], 1, fill=False, edgecolor="black", linewidth=2))
    axes[0].set_ylabel("token id", fontsize=8)
    table = data["code table (V x K)"][0]
    constant = (table == table[:, :1]).all(-1).nonzero().flatten().tolist()  # all zeros, all ones: LayerNorm zeroes
    for t in constant:
        axes[0].get_yticklabels()[t].set_color("red")
    code = "".join(str(int(b)) for b in table[cfg.token].tolist())
    fig.suptitle(f"V = {cfg.vocab_size} tokens, K = {bits} bits, n_embd = {cfg.n_embd}: token {cfg.token}'s code, "
                 f"least significant bit first, is {code}; nothing here is learned\n(red: ids "
                 f"{' and '.join(map(str, constant))}, whose input is a constant vector, are kept for bytes text never "
                 "holds)",
                 fontsize=10)
    fig.tight_layout()
    return fig, plt


def main(argv=None):
    description, epilog = __doc__.strip().split("\n\n", 1)
    cfg = parse_settings(config_parser(FigureConfig, description, epilog), argv)
    if os.path.exists(cfg.out):
        with open(cfg.out, "rb") as f:
            if MARK.encode() not in f.read(4096):
                raise ValueError(f"{cfg.out} exists and this tool did not write it: it is left alone; choose another "
                                 "--out")
    fig, plt = draw(cfg)
    with atomic_open(cfg.out) as f:
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight", metadata={"Software": MARK})
    plt.close(fig)
    print(f"wrote {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
