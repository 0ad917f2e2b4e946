"""
The paper's controlled comparison at small scale: learned input table vs fixed binary code vs
table-free affine code, everything else identical, over several seeds.

    python -m tools.compare --corpus janeausten.txt   # 3 inputs x 3 seeds, ~30 min on 2 CPU cores
    python -m tools.compare --quick                   # 3 inputs x 2 seeds on tiny Shakespeare, a few minutes
    python -m tools.compare --preset small --n_embd 768 --steps 5000 --device cuda   # bigger, on a GPU

Design choices, up front:
- Every run is train.train() with one TrainConfig; only `input` and `seed` change between runs. A seed
  fixes the initialisation and the data order, so for each seed the three inputs see the same batches
  in the same order, with the same architecture, steps and optimizer.
- Runs live in <out>/<input>-seed<k>/. A finished run (its final.json, written last) is read back, not
  retrained; an interrupted one resumes from its checkpoint. Stop and rerun freely. Either only when
  the run was trained with the settings asked for now (its log's start records say) on the data its
  final.json names (a hash of meta.json less its input paths: a folder of runs moved or unpacked elsewhere
  reads back beside the same text prepared there): a rerun with another --steps, --lr, ... into the same --out
  is refused, naming what differs. One comparison writes a folder at a time (a second is refused
  while the first holds <out>/.writer.lock).
- The curve's evaluations use eval_batches fixed validation batches; the final validation loss, computed
  from the last checkpoint, covers every window of the validation split once. Perplexity = exp(loss). Bits per byte
  = loss / ln 2 * (validation tokens / validation UTF-8 bytes): tokenizer-independent, so runs with
  different tokenizers compare.
- The verdict follows the paper's reading: the binary-vs-learned gap in mean perplexity, relative to
  the learned one, against the seed-to-seed spread, the largest (max - min) / mean perplexity over
  seeds of any input. "Inside" means the gap is no larger than that spread.
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

import hashlib
import json
import math
import statistics
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
import torch

from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.settings import check_at_least_1, parse_command_line, preset_setting, setting
from bincode_gpt.devices import pick_device
from bincode_gpt.files import atomic_write, staged, writer_lock
from bincode_gpt.run_dir import read_log
from bincode_gpt.devices import pick_dtype
from bincode_gpt.shards import meta_identity
from bincode_gpt.shards import load_meta
from bincode_gpt.shards import Split
from model import GPT, PRESETS, SMALL_VOCAB, GPTConfig, code_bits, get_config
from prepare_data import prepare
from train import TrainConfig, train

VARIANTS = ("learned", "binary", "affine")


@dataclass
class DataSettings:
    """What a study trains on: --data, or --corpus prepared into <out>/data on first use (see prepared())."""
    corpus: list[str] = setting(["shakespeare"], "text to prepare (files, folders, 'shakespeare'); default "
                                                 "shakespeare (downloaded once)", nargs="+")
    data: str | None = setting(None, "prepared shards to use (default: <out>/data, prepared on first run)")
    encoding: str = setting("gpt2", "tiktoken encoding")
    vocab_size: int = setting(SMALL_VOCAB, f"cut the encoding to this many tokens (default {SMALL_VOCAB}: "
                                           f"K = {code_bits(SMALL_VOCAB)} bits)")
    reserve_zero: bool = setting(True, "prepare --corpus with id 0 (the all-zero code) given to the NUL byte, as "
                                       "prepare_data.py does by default")
    reserve_ones: bool = setting(True, "prepare --corpus with id 2^K-1 (the all-ones code) given to the byte 0xFF, as "
                                       "prepare_data.py does by default")


@dataclass
class StudyShape:
    """The decoder shape and batch of the small studies built on this one (share.py, paper_point.py), and
    --quick's tiny ones."""
    n_head: int = preset_setting(4, "attention heads", quick=2)
    block_size: int = preset_setting(128, "context length in tokens", quick=32)
    batch_size: int = preset_setting(16, "sequences per step", quick=4)


@dataclass
class CompareConfig(DataSettings):
    """CPU-sized defaults: a 4 x 128 decoder, context 128; --quick shortens the run and drops a seed."""
    out: str = setting("runs/compare", "folder of the runs, the table and the plot")
    variants: str = setting(",".join(VARIANTS), "comma-separated inputs to compare")
    quick: bool = setting(False, "a short run: each setting's --quick value below")
    preset: str = setting("small", "model preset the sizes below start from", choices=list(PRESETS))
    n_layer: int = setting(4, "decoder layers")
    n_head: int = setting(4, "attention heads")
    n_embd: int = setting(128, "model width")
    block_size: int = setting(128, "context length in tokens")
    batch_size: int = setting(16, "sequences per step")
    steps: int = preset_setting(600, "training steps of each run", quick=60)
    lr: float = setting(2e-3, "peak learning rate (min_lr = lr / 10)")
    seeds: int = preset_setting(3, "seeds per input", quick=2)
    evals: int = preset_setting(10, "evaluations along each run", quick=3)
    eval_batches: int = setting(8, "validation batches per evaluation")
    device: str = setting("auto", "auto | cpu | cuda | mps")
    compile: bool = setting(False, "torch.compile each model")
    code_width: int = setting(0, "the binary input's code width in bits (0: K = ceil(log2 V); wider appends parity "
                                 "bits: the width study)")


def run_dir(out, variant, seed):
    return os.path.join(out, f"{variant}-seed{seed}")


def log_summary(out_dir):
    """The eval curve [(tokens seen, val loss)], the start record and the median training tokens/s of
    one run's log (resumed runs append to it)."""
    curve, start, tokens_per_step, speeds = [], None, 0, []
    for e in read_log(out_dir):
        if e["event"] == "start":
            start = start or e
        elif e["event"] == "train":
            tokens_per_step = e["tokens"] / e["step"]
            speeds.append(e["tokens_per_s"])
        elif e["event"] == "eval" and (not curve or curve[-1][0] < e["step"] * tokens_per_step):
            curve.append((e["step"] * tokens_per_step, e["val_loss"]))
    return curve, start, statistics.median(speeds)


@torch.no_grad()
def full_val_loss(out, data_dir, meta, batch_size, device, dtype="float32"):
    """Mean loss over every window of the validation split, each counted once, from the final checkpoint, in
    the run's precision (`dtype`: devices.pick_dtype's; bfloat16 is autocast, as in its evaluations)."""
    model, _ = load_checkpoint(out, device)
    model.eval()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    val = Split(data_dir, meta, "val", model.config.block_size, model.config.vocab_size)
    total = 0.0
    for start in range(0, val.n, batch_size):
        x, y = val.batch(np.arange(start, min(start + batch_size, val.n)), device)
        with autocast:
            total += model(x, y)[1].item() * len(x)
    return total / val.n


def run_config(args, variant, seed):
    """The TrainConfig of one (input, seed) run."""
    return TrainConfig(
        data_dir=os.path.abspath(args.data), out_dir=run_dir(args.out, variant, seed), preset=args.preset,
        input=variant, seed=seed, device=args.device, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
        block_size=args.block_size, batch_size=args.batch_size, max_steps=args.steps, lr=args.lr, min_lr=args.lr / 10,
        warmup_steps=max(1, args.steps // 20), eval_interval=max(1, args.steps // args.evals),
        eval_steps=args.eval_batches, log_interval=max(1, args.steps // 10), save_interval=max(1, args.steps // 4),
        compile=args.compile, code_width=(args.code_width or None) if variant == "binary" else None,
    )


# where and how a run executes, not what it trains: a run is continued or read back under other values of these.
# The data is compared by content, not path (final.json's hash here, train.py's fingerprint on resume): a folder
# of runs unpacked or moved elsewhere, beside its data prepared again, reads back.
PLACE = ("out_dir", "data_dir", "device", "compile", "resume", "overwrite")


def check_settings(cfg):
    """A run folder that holds an earlier run (finished, diverged or interrupted) is reused only if that
    run was trained under the settings asked for now (every "start" record of its log.jsonl says so);
    otherwise a ValueError names the settings that differ."""
    log = os.path.join(cfg.out_dir, "log.jsonl")
    if not os.path.exists(log):
        return
    asked = {k: v for k, v in asdict(cfg).items() if k not in PLACE}
    try:
        starts = [e["train_config"] for e in read_log(cfg.out_dir, "start")]
        for was in starts:  # a setting added since that run is at its default there: it did what the default does
            was = {**asdict(TrainConfig()), **was}
            if diff := [k for k in asked if was.get(k) != asked[k]]:
                raise ValueError(f"{cfg.out_dir} was trained with {', '.join(f'{k}={was.get(k)}' for k in diff)}, "
                                 f"but this command asks for {', '.join(f'{k}={asked[k]}' for k in diff)}: its results "
                                 "would be reported under settings it never used; use another --out (or remove that "
                                 "folder to train it again)")
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError):
        raise ValueError(f"{log} is not a log train.py wrote (its start records are unreadable): cannot tell the "
                         "settings of that run; use another --out") from None
    final = os.path.join(cfg.out_dir, "final.json")
    if os.path.exists(final):
        with open(final) as f:
            was = json.load(f).get("data")
        if was is not None and was not in (data_hash(cfg.data_dir), data_hash(cfg.data_dir, legacy=True)):
            raise ValueError(f"{cfg.out_dir} was trained on other data than {cfg.data_dir} holds now (its meta.json "
                             "changed since): use another --out (or remove that folder to train it again)")


def data_hash(data_dir, legacy=False):
    """A fingerprint of a prepared folder's contents: shards.meta_identity (meta.json: the tokenizer, every shard,
    each split's token, byte and document counts; not the paths the text was read from), so the same text prepared
    elsewhere matches. legacy: the hash of meta.json's bytes, paths and all, that final.json held before."""
    with open(os.path.join(data_dir, "meta.json"), "rb") as f:
        return hashlib.sha256(meta_identity(f.read(), legacy)).hexdigest()[:16]


def run_one(args, meta, variant, seed):
    """Train one (input, seed) run, or read it back when it already finished; returns its record."""
    out = run_dir(args.out, variant, seed)
    final = os.path.join(out, "final.json")  # written last: its presence means the run is complete
    cfg = run_config(args, variant, seed)
    check_settings(cfg)
    if not os.path.exists(final):
        # the folder is this run's own: continue its checkpoint, or start afresh over a hard-killed start
        cfg.resume = os.path.exists(cfg.ckpt_path)
        cfg.overwrite = not cfg.resume
        print(f"\n=== {variant}, seed {seed} ===", flush=True)
        try:
            summary = train(cfg)
        except FloatingPointError as e:  # a diverged run is a result: recorded, not retried on every rerun
            print(f"diverged: {e}")
            atomic_write(final, json.dumps({"diverged": str(e), "data": data_hash(args.data)}))
            return {"variant": variant, "seed": seed, "diverged": str(e)}
        if summary["interrupted"]:
            raise SystemExit(f"stopped during {out}: rerun the same command to continue")
        if getattr(args, "full_val", True):
            device = pick_device(args.device)
            val_loss = full_val_loss(out, args.data, meta, args.batch_size, device, pick_dtype(cfg.dtype, device))
        else:  # a study that evaluates its runs itself (paper_point.py): the last evaluation's batches
            val_loss = log_summary(out)[0][-1][1]
        atomic_write(final, json.dumps({"val_loss": val_loss, "data": data_hash(args.data)}))
    with open(final) as f:
        done = json.load(f)
    if "diverged" in done:
        return {"variant": variant, "seed": seed, "diverged": done["diverged"]}
    curve, start, speed = log_summary(out)
    return {"variant": variant, "seed": seed, "curve": curve, "model_config": start["model_config"],
            "val_loss": done["val_loss"], "tokens_per_s": speed}


def diverged(runs):
    """Report lines for the runs that diverged (they are left out of every mean)."""
    return "".join(f"\ndiverged, left out: {r['variant']} seed {r['seed']}: {r['diverged']}"
                   for r in runs if "diverged" in r)


def mean_std(xs):
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def per_byte(loss, meta):
    """Validation nats per token -> nats per byte of the validation text: x validation tokens / UTF-8 bytes."""
    val = meta["splits"]["val"]
    return loss * val["tokens"] / val["bytes"]


def summarize(runs, meta):
    """One row per input: parameter counts and mean +- std over seeds of loss, perplexity, bits/byte."""
    rows = []
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == variant]
        with torch.device("meta"):  # the run's own config, whatever preset and overrides made it
            counts = GPT(GPTConfig(**mine[0]["model_config"])).num_params()
        losses = [r["val_loss"] for r in mine]
        rows.append({
            "input": variant, "seeds": len(mine), "trainable": counts["trainable"], "input_params": counts["input"],
            "frozen": counts["frozen"], "val_loss": mean_std(losses),
            "perplexity": mean_std([math.exp(x) for x in losses]),
            "bits_per_byte": mean_std([per_byte(x, meta) / math.log(2) for x in losses]),
            "tokens_per_s": mean_std([r["tokens_per_s"] for r in mine]),
            "ppl_spread": (max(math.exp(x) for x in losses) - min(math.exp(x) for x in losses))
                          / statistics.mean(math.exp(x) for x in losses),
        })
    return rows


def verdict(rows):
    by = {r["input"]: r for r in rows}
    if "binary" not in by or "learned" not in by:
        return "no verdict: the comparison needs both the binary and the learned input."
    spread = max(r["ppl_spread"] for r in rows)
    if min(r["seeds"] for r in rows) < 2:
        return "no verdict: a seed-to-seed spread needs at least two seeds per input."
    b, l = by["binary"]["perplexity"][0], by["learned"]["perplexity"][0]
    gap = (b - l) / l
    inside = abs(gap) <= spread
    return (f"binary vs learned: mean perplexity {b:.3f} vs {l:.3f}, a gap of {100 * gap:+.2f}%; seed-to-seed spread "
            f"{100 * spread:.2f}%: the gap is {'INSIDE' if inside else 'OUTSIDE'} the spread "
            f"(the paper: 2.36 vs 2.44, -3.3%, inside its 4.8% spread).")


def markdown_table(header, rows):
    """A Markdown table: header is [(title, align)] with align "l" or "r"; rows are lists of cell strings."""
    lines = ["| " + " | ".join(t for t, _ in header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for _, a in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])


def pm(ms, fmt):
    """mean ± std, or a dash when there is no value."""
    return "—" if ms is None else f"{ms[0]:{fmt}} ± {ms[1]:{fmt}}"


def table(rows):
    header = [("input", "l"), ("seeds", "r"), ("trainable params", "r"), ("input-interface params", "r"),
              ("frozen stored values", "r"), ("val loss", "r"), ("perplexity", "r"), ("bits/byte", "r"),
              ("tokens/s", "r")]
    return markdown_table(header, [[r["input"], str(r["seeds"]), f"{r['trainable']:,}", f"{r['input_params']:,}",
                                     f"{r['frozen']:,}", pm(r["val_loss"], ".4f"), pm(r["perplexity"], ".3f"),
                                     pm(r["bits_per_byte"], ".4f"), pm(r["tokens_per_s"], ",.0f")] for r in rows])


def pyplot():
    """matplotlib.pyplot drawing to files, or None (with a note) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed (pip install matplotlib): table only, no plot")
        return None
    return plt


def plot(runs, path):
    """Validation loss against tokens seen: the mean over seeds per input, with a min-max band."""
    if (plt := pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant in dict.fromkeys(r["variant"] for r in runs):
        curves = [r["curve"] for r in runs if r["variant"] == variant]
        n = min(len(c) for c in curves)
        tokens = [curves[0][i][0] for i in range(n)]
        losses = [[c[i][1] for c in curves] for i in range(n)]  # (points, seeds)
        line, = ax.plot(tokens, [statistics.mean(ls) for ls in losses], label=f"{variant} ({len(curves)} seeds)")
        ax.fill_between(tokens, [min(ls) for ls in losses], [max(ls) for ls in losses], color=line.get_color(),
                        alpha=0.2)
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("validation loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("learned input table vs fixed binary code vs affine code")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def check_results(out, names):
    """This study replaces only results it wrote: files of these `names` in `out` must sit beside a
    results.json of its own (the two are written together); else a ValueError names them, before any run."""
    present = [n for n in names if os.path.lexists(os.path.join(out, n))]
    try:
        with open(os.path.join(out, "results.json")) as f:
            ours = {"rows", "runs"} <= json.load(f).keys()
    except (OSError, ValueError, AttributeError):
        ours = False
    if present and not ours:
        raise ValueError(f"{out} holds {', '.join(present)}, not written by this study (no results.json of its own "
                         "beside them): they are left alone; choose another --out")


def write_results(out, report, results, figure=None, show=True):
    """results.md, results.json and the figure (name, draw: draw(path) writes it there -> path, or None without
    matplotlib) into out, all or none (files.staged; results.json, which marks the folder as this study's, last);
    the report, and where the figure went, to stdout when `show` (paper_point.py rewrites them quietly as
    each run ends)."""
    name, draw = figure or (None, None)
    with staged(out, last=("results.json",)) as stage:
        png = draw(os.path.join(stage, name)) if draw else None
        atomic_write(os.path.join(stage, "results.md"), report)
        atomic_write(os.path.join(stage, "results.json"), json.dumps(results, indent=1))
    if show:
        print("\n" + report + (f"plot: {os.path.join(out, name)}\n" if png else ""))


def prepared(args):
    """The meta.json of args.data (default <out>/data), preparing args.corpus there on first use. Data
    this study prepared earlier must have been prepared as asked now, or a ValueError says what differs."""
    if args.data == "":
        raise ValueError("--data is '' (empty): name a prepared folder, or leave --data out for <out>/data")
    own = args.data is None  # <out>/data: the study prepares it from --corpus, --encoding, ...
    doc_chars = getattr(args, "doc_chars", 0)  # prepare_data.py's --doc_chars: only paper_point.py sets it
    args.data = args.data or os.path.join(args.out, "data")
    if not os.path.exists(os.path.join(args.data, "meta.json")):
        ids = ("" if args.reserve_zero and args.reserve_ones
               else f" (reserve_zero={args.reserve_zero}, reserve_ones={args.reserve_ones})")
        print(f"preparing {args.corpus} with {args.encoding} cut to {args.vocab_size} tokens{ids} into {args.data}")
        prepare(args.corpus, args.data, encoding=args.encoding, vocab_size=args.vocab_size,
                reserve_zero=args.reserve_zero, reserve_ones=args.reserve_ones, doc_chars=doc_chars)
    meta = load_meta(args.data)
    asked = {"encoding": args.encoding, "vocab_size": args.vocab_size, "reserve_zero": args.reserve_zero,
             "reserve_ones": args.reserve_ones, "doc_chars": doc_chars}
    was = {**asked, **meta, "reserve_zero": meta.get("reserve_zero", False),  # data from before the options: plain ids
           "reserve_ones": meta.get("reserve_ones", False), "doc_chars": meta.get("doc_chars", 0)}
    if own and (diff := [k for k in asked if was[k] != asked[k]]):
        raise ValueError(f"{args.data} was prepared with {', '.join(f'{k}={was[k]}' for k in diff)}, but this "
                         f"command asks for {', '.join(f'{k}={asked[k]}' for k in diff)}: use another --out (or remove "
                         f"{args.data} to prepare it again)")
    return meta


def parse_config(argv=None):
    """The settings of a command line, --quick's values filled in."""
    return parse_command_line(CompareConfig, __doc__, argv, presets=("quick",))


def main(argv=None):
    args = parse_config(argv)
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        raise ValueError(f"unknown input(s) {sorted(unknown)}: choose from {', '.join(VARIANTS)}")
    if twice := sorted({v for v in variants if variants.count(v) > 1}):
        raise ValueError(f"--variants names {', '.join(twice)} more than once: name each input once")
    check_at_least_1(args, "seeds", "steps", "evals", "eval_batches", "batch_size")
    with writer_lock(args.out, outputs=("results.md", "results.json")):  # one comparison per folder at a time
        check_results(args.out, ("results.md", "results.json", "val_loss.png"))
        meta = prepared(args)
        for seed in range(args.seeds):  # before any training: every run to be reused was trained as asked now
            for v in variants:
                check_settings(run_config(args, v, seed))
        every = [run_one(args, meta, v, seed) for seed in range(args.seeds) for v in variants]
        runs = [r for r in every if "diverged" not in r]
        rows = summarize(runs, meta)
        cfg = get_config(args.preset, vocab_size=meta["vocab_size"], n_layer=args.n_layer, n_head=args.n_head,
                         n_embd=args.n_embd, block_size=args.block_size)
        header = (f"{len(variants)} inputs x {args.seeds} seeds, {args.steps} steps of {args.batch_size} x "
                  f"{args.block_size} tokens; {cfg.n_layer} layers x {cfg.n_embd}, {cfg.n_head} heads, vocab "
                  f"{cfg.vocab_size} (K = {cfg.code_bits} bits); data {args.data} ({meta['encoding']}, "
                  f"{meta['splits']['train']['tokens']:,} train / {meta['splits']['val']['tokens']:,} val tokens)")
        write_results(args.out, f"{header}\n\n{table(rows)}\n\n{verdict(rows)}{diverged(every)}\n",
                      {"rows": rows, "runs": every}, ("val_loss.png", lambda path: plot(runs, path) if runs else None))
    return rows


if __name__ == "__main__":
    sys.exit(run_main(main, outlive_stdout=True))  # a study outlives a closed stdout (`| head`): its files record it
