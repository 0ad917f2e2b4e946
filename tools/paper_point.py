"""
The paper's point, tuned: the learned-vs-binary gap at the paper's table share (12.5%) and training length
(T = 36 tokens per trainable parameter of the binary model), at several sizes, each input at a learning rate
searched for it at that size and length; then a rule written before the runs says whether the gap grows with size.

The study of docs/results.md sections 9b and 9c is three commands (resumable: stop and rerun them); the 8 x 32
one reads the first's record (--beside) for the depth rule and README's table:

    python -m tools.paper_point --corpus tinyshakespeare.txt janeausten.txt kjv.txt --jobs 2 \
        --out runs/paper-tuned --reuse docs/runs/paper-point.json docs/runs/paper-point-tuned-9b.json \
        --record docs/runs/paper-point-tuned.json
    python -m tools.paper_point --corpus tinyshakespeare.txt janeausten.txt kjv.txt --jobs 2 \
        --out runs/paper-tuned-8x32 --vocab 513 --sizes 8x32 --control_sizes "" \
        --beside docs/runs/paper-point-tuned.json --record docs/runs/paper-point-tuned-8x32.json
    python -m tools.paper_point --corpus tinyshakespeare.txt janeausten.txt kjv.txt --jobs 2 \
        --out runs/paper-tuned-3x96 --vocab 512 --sizes 3x96 --tokens_per_param 33 --lrs 4e-3,8e-3,1.6e-2 \
        --grid_seeds 1 --extend 0 --seeds 1 --control_sizes "" \
        --reuse docs/runs/paper-point-3x96.json --record docs/runs/paper-point-tuned-3x96.json
    python -m tools.paper_point --quick            # tiny sizes on tiny Shakespeare, a few minutes
    python -m tools.paper_point ... --report       # train nothing: report the runs that finished

The first plans, in this order: the lr grid of learned and binary at 4 x 32, then at 2 x 64 (4e-3, 8e-3, 1.6e-2,
3.2e-2, grown by x2 steps, 2 seeds a point), then both inputs to 5 seeds at their tuned lrs and at every lr tied
with them (TIE_RULE), one more paired seed while a tuned gap's interval is wide (SEED_RULE), then the controls at
2 x 64 (affine, random, frozen), each with its own lr grid (--control_lrs) and 3 seeds at its own best. The
second: 8 x 32 at V = 513 the same way. The third: 3 x 96 at V = 512 (T = 33 keeps it under 3 epochs of that
text), learned and binary at 4e-3 and 1.6e-2 beside the 3 seeds at 8e-3 it has, 1 seed each, the grid not grown
(an edge is reported).

Design choices, up front:
- The text: every --corpus file cut into documents of about --doc_chars characters at line ends
  (prepare_data.py --doc_chars), so every 10th document, the validation split, samples every source
  along its length. Every run is scored on each source's own validation windows from its final
  checkpoint (per-source bits per byte; their window-weighted mean is the whole split's loss).
- Sizes sit at the paper's share: a learned table of V x D is 12.5% of the learned model's trainable
  parameters when V = 2 L D (12 D^2 per block, an untied V x D head). At V = 257 (GPT-2's 256 bytes and
  end-of-text, the smallest cut) that is L x D = 128: 4 x 32 and 2 x 64. Each run trains --tokens_per_param
  tokens per binary trainable parameter (model.py's count), whole steps of --batch_size x --block_size.
- The lr, per size and input, at full length: a geometric grid (--lrs), --grid_seeds seeds a point. An lr's
  score is its mean whole-split loss at the end of the run over seeds 0 .. grid_seeds-1 (a seed is one init
  and one data order at every lr, so the lrs are compared paired; a diverged run scores inf). The best lr is
  tuned when it is interior: the grid's lower and higher neighbours both score worse. While the best sits at
  an end, the grid grows one x2 step that way (at most --extend steps past each end); an edge that remains is
  reported as "edge: extend the grid up" (or down) and never used: no seeds, controls or gaps run at it.
- Then learned and binary to --seeds seeds at their own tuned lrs and at the lrs tied with them, and at
  --control_sizes the controls, each at its own tuned lr against learned at learned's: the affine code, the
  frozen random table at the code's scale ("random", std sqrt(1/2)) and the learned table's own init, frozen
  ("frozen", std 0.02): learned vs frozen asks whether training the table matters, frozen vs random whether
  its scale does.
- Near ties (TIE_RULE): an lr within one pooled seed sd of its grid's best is tied with it; every verdict is
  computed under every choice of tied lrs, and called robust only when all choices agree (robustness).
- Paired: model.GPT draws a seed's decoder and head the same whatever the input, and the seed fixes the data
  order, so a seed's gap pays for the input (and its lr) alone. The gap of seed s is loss(input) - loss(learned)
  on the whole validation split, in nats per token; its perplexity form exp(gap) - 1. Over seeds: mean, sd and a
  95% t interval whose units are the seeds; its verdicts are computed: does it exclude 0, does it lie inside
  the paper's +-4.8%.
- The decision rules, RULE, TIE_RULE, SEED_RULE and DEPTH_RULE below, were committed before the runs they
  decide; the report computes them (decide, robustness, depth_decide).
- Runs already made count where they match: --reuse names records of this tool (a results.json) whose rows
  give per-seed bits per byte by source; a run of the same size, V, T and lr is taken back from them (each
  source's loss from its bits per byte, checked against the row's whole split) and not trained again; a run
  its list of runs holds (an lr grid's, in no row) is taken back with its whole-split loss alone, when the
  record was made with this text, V, T and batch.
- Runs are compare.run_one's (train.train), in <out>/<text>-V<V>/<L>x<D>-T<T>-lr<lr>/<input>-seed<k>/; stop
  and rerun the same command: finished runs are read back, interrupted ones resume from their checkpoints. As
  each run ends, the report, results.json and the --record copy are rewritten (atomically).
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

import json
import math
import re
import statistics
from dataclasses import dataclass
from itertools import chain, product
from types import SimpleNamespace

import numpy as np
import torch

from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.settings import check_at_least_1, parse_command_line, preset_setting, setting
from bincode_gpt.files import atomic_write, writer_lock
from bincode_gpt.inputs import read_documents, resolve_input
from bincode_gpt.tokenizer import get_tokenizer
from model import code_bits
from prepare_data import cut_documents, split_documents
from tools import compare, scaling, share

PAPER = share.PAPER
INPUTS = ("learned", "binary")  # tuned at every size; the controls run at the learned input's tuned lr
RULE = ("The gap grows with size only if the larger size's tuned-gap 95% interval lies entirely above the smaller "
        "size's; it shrinks only if the interval lies entirely below; otherwise the intervals overlap and no trend "
        "is claimed, the report says what was found. A seed's tuned gap is loss(binary at its tuned lr) - "
        "loss(learned at its tuned lr) on the whole validation split; both lrs interior to their grids; decided "
        "only once both sizes have --seeds paired seeds (before that: not yet).")
TIE_RULE = ("An lr ties with its grid's best when its score (the mean whole-split loss over the grid seeds) exceeds "
            "the best's by at most one seed standard deviation: the sd of the whole-split loss across seeds at one "
            "lr, pooled over that size and input's grid lrs with 2+ finished seeds. Every tied lr (the best "
            "included) runs to --seeds paired seeds. Each verdict (a row's sign against 0, the size rule, the depth "
            "rule) is computed under every combination of tied lrs, one per input per size; it is robust when every "
            "combination gives the same verdict, otherwise not robust, and only robust verdicts are findings.")
SEED_RULE = ("While a size's tuned gap (binary vs learned at their tuned lrs) has a 95% interval wider than +-2 "
             "perplexity points (half of expm1(hi) - expm1(lo) above 0.02), one more paired seed runs at the tuned "
             "lrs, up to --max_seeds (10); tied lrs that are not the tuned one stay at --seeds.")
DEPTH_RULE = ("Depth, width or size, from 4x32 and 2x64 (V 257) and 8x32 (V 513), all at share 12.5% and T 36: "
              "each size's tuned gap per byte (a seed's loss(binary) - loss(learned) times its validation split's "
              "tokens per byte: bytes, because V differs), its 95% t interval over paired seeds. X above (below) Y: "
              "X's interval lies entirely above (below) Y's; else they overlap. 8x32 has 2x64's trainable size at "
              "four times its depth, and 4x32's width at twice its depth and size. 'size': 8x32 overlaps 2x64 and "
              "lies above 4x32. 'depth' (the gap shrinks as depth grows): 8x32 lies below 2x64 and below 4x32. "
              "'width': 8x32 lies below 2x64 and overlaps 4x32. Anything else: 'undecided', the two comparisons "
              "reported. 8x32 differs from both V 257 sizes also in V and K (513 and 10 bits against 257 and 9), "
              "in the text's tokens per byte and in epochs: a verdict names these beside it.")


@dataclass
class PaperPointConfig(compare.StudyShape):
    """The study in docs/results.md section 9b. --quick: tiny sizes on tiny Shakespeare, a few minutes."""
    corpus: list[str] = setting(["shakespeare"], "text files, one source each", nargs="+")
    doc_chars: int = preset_setting(20000, "documents of about this many characters (prepare_data.py --doc_chars)",
                                    quick=4000)
    encoding: str = setting("gpt2", "tiktoken encoding, cut to --vocab")
    vocab: int = setting(257, "the vocabulary V (257: GPT-2's bytes and end-of-text)")
    out: str = preset_setting("runs/paper-tuned", "folder of the runs, the report and the figure",
                              quick="runs/paper-quick")
    quick: bool = setting(False, "tiny sizes, a few minutes: each setting's --quick value below")
    sizes: str = preset_setting("4x32,2x64", "decoder sizes n_layer x n_embd, in the order they run",
                                quick="2x16,1x32")
    tokens_per_param: float = preset_setting(36.0, "training tokens per binary trainable parameter", quick=4.0)
    lrs: str = preset_setting("4e-3,8e-3,1.6e-2,3.2e-2", "the lr grid each search starts from (peak lr; "
                              "min_lr = lr / 10)", quick="8e-3,1.6e-2,3.2e-2")
    extend: int = preset_setting(3, "x2 steps the grid may grow past each end while an input's best lr sits "
                                 "there", quick=1)
    grid_seeds: int = preset_setting(2, "seeds of each lr of the grid", quick=1)
    seeds: int = preset_setting(5, "seeds of learned and binary at each size's tuned lrs", quick=2)
    controls: str = setting("affine,random,frozen", "inputs run at --control_sizes, at the learned input's tuned lr")
    control_sizes: str = preset_setting("2x64", "sizes that run the controls ('' for none)", quick="1x32")
    control_seeds: int = preset_setting(3, "seeds of each control at its own tuned lr", quick=2)
    control_lrs: str = preset_setting("8e-3,1.6e-2,3.2e-2", "the lr grid each control's search starts from",
                                      quick="1.6e-2,3.2e-2,6.4e-2")
    max_seeds: int = preset_setting(10, "seeds of the tuned pair at most, while its interval is wide (SEED_RULE)",
                                    quick=3)
    beside: list[str] = setting([], "records of this tool at another V whose sizes join the depth rule and the "
                                    "key result's table", nargs="*")
    evals: int = preset_setting(12, "evaluations along each run (the figure's curves)", quick=4)
    eval_batches: int = preset_setting(8, "validation batches per evaluation along a run", quick=2)
    jobs: int = setting(1, "runs in parallel, each with cores/jobs threads")
    device: str = setting("cpu", "auto | cpu | cuda | mps")
    reuse: list[str] = setting([], "records of this tool (a results.json) whose runs count here where the size, "
                                   "V, T and lr match", nargs="*")
    record: str = setting("", "a copy of results.json, rewritten as each run ends (e.g. under docs/runs/)")
    report: bool = setting(False, "train nothing: report the runs that finished, list the others")


@dataclass(frozen=True)
class Point:
    """One (size, lr) at this command's V and T: its runs' folder is <out>/<name>/<input>-seed<k>/."""
    L: int
    D: int
    lr: float
    steps: int
    name: str


def floats(text, flag):
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = None
    if not values or min(values) <= 0:
        raise ValueError(f"{flag} must be positive numbers separated by commas, got {text!r}")
    return values


def text_name(args):
    names = [os.path.splitext(os.path.basename(c))[0] for c in args.corpus]
    return names[0] if len(names) == 1 else "mix"


def data_name(args):
    return f"{text_name(args)}-V{args.vocab}"


def sizes(args):
    return scaling.parse_sizes(args.sizes)


def control_sizes(args):
    return scaling.parse_sizes(args.control_sizes, "--control_sizes", allow_none=True)


def controls(args):
    return [c for c in args.controls.split(",") if c]


def trainable(args, L, D, v):
    """model.py's trainable parameters of input v at a size."""
    return scaling.trainable(L, D, v, args, args.vocab)


def steps_for(args, L, D):
    """Whole steps that train closest to --tokens_per_param tokens per binary trainable parameter."""
    tokens = args.tokens_per_param * trainable(args, L, D, "binary")
    return max(1, round(tokens / (args.batch_size * args.block_size)))


def point(args, L, D, lr):
    name = f"{data_name(args)}/{L}x{D}-T{args.tokens_per_param:g}-lr{lr:g}"
    return Point(L=L, D=D, lr=lr, steps=steps_for(args, L, D), name=name)


def run_folder(args, p, v, s):
    return os.path.join(args.out, p.name, f"{v}-seed{s}")


def run_settings(args, p, data):
    return SimpleNamespace(out=os.path.join(args.out, p.name), data=data, preset="small", device=args.device,
                           n_layer=p.L, n_head=args.n_head, n_embd=p.D, block_size=args.block_size,
                           batch_size=args.batch_size, steps=p.steps, lr=p.lr, evals=args.evals,
                           eval_batches=args.eval_batches, compile=False, code_width=0,
                           full_val=False)  # each run is scored per source, below


def data_of(args):
    data = SimpleNamespace(corpus=args.corpus, data=None, out=os.path.join(args.out, data_name(args)),
                           encoding=args.encoding, vocab_size=args.vocab, reserve_zero=True, reserve_ones=True,
                           doc_chars=args.doc_chars)
    meta = compare.prepared(data)
    return data.data, meta


# ----------------------------------------------------------------------------- the lr grid and the plan
def search(score, start, extend):
    """One input's lr grid at one size: the lrs `start`, grown by one x2 step at an end while the best lr sits
    there, at most `extend` steps past each end. score(lr): the lr's mean loss, None until its runs finished.
    -> (lrs, best, where): where is "interior" (a lower and a higher lr both score worse: the lr is tuned),
    "edge: extend the grid up" or "... down" (--extend spent: reported, never used) or "unfinished"."""
    lrs, grown = sorted(start), {"up": 0, "down": 0}
    while True:
        scores = [score(lr) for lr in lrs]
        if None in scores:
            return lrs, None, "unfinished"
        best = lrs[scores.index(min(scores))]
        if lrs[0] < best < lrs[-1]:
            return lrs, best, "interior"
        side = "up" if best == lrs[-1] else "down"
        if grown[side] == extend:
            return lrs, best, f"edge: extend the grid {side}"
        grown[side] += 1
        lrs = lrs + [2 * lrs[-1]] if side == "up" else [lrs[0] / 2] + lrs


def whole_loss(losses):
    """A run's loss per token on the whole validation split from its per-source (loss, windows)."""
    return sum(l * n for l, n in losses.values()) / sum(n for _, n in losses.values())


def lr_score(known, size, v, seeds):
    """search's score: an lr's mean whole-split loss over seeds 0 .. seeds-1 (inf for a diverged run), or None
    until each has finished."""
    def score(lr):
        runs = [(size, v, lr, s) for s in range(seeds)]
        if any(r not in known for r in runs):
            return None
        return sum(math.inf if known[r] is None else whole_loss(known[r]) for r in runs) / seeds
    return score


def grid(args, known, size, v):
    """search() of input v at a size, on the runs known so far: (lrs, best, where). The controls start from
    --control_lrs, learned and binary from --lrs."""
    start = floats(args.lrs, "--lrs") if v in INPUTS else floats(args.control_lrs, "--control_lrs")
    return search(lr_score(known, size, v, args.grid_seeds), start, args.extend)


def tuned(args, known, size, v):
    """Input v's tuned lr at a size: its grid's best when interior, else None."""
    _, best, where = grid(args, known, size, v)
    return best if where == "interior" else None


# ----------------------------------------------------------------------------- near ties (TIE_RULE)
def pooled_sd(losses_by_lr):
    """The sd of the loss across seeds at one lr, pooled over the lrs with 2+ losses ({lr: [loss, ...]});
    None when no lr has two."""
    groups = [x for x in losses_by_lr.values() if len(x) >= 2]
    df = sum(len(x) - 1 for x in groups)
    if df == 0:
        return None
    return math.sqrt(sum((len(x) - 1) * statistics.variance(x) for x in groups) / df)


def tied(scores, best, sd):
    """TIE_RULE on one grid: the lrs whose score is within `sd` of the best's, the best first ({lr: score})."""
    return [best] + sorted(lr for lr, x in scores.items() if lr != best and x - scores[best] <= sd)


def grid_losses(known, size, v, lrs, seeds):
    """{lr: [whole-split loss of each finished, not diverged seed 0 .. seeds-1]} of input v's grid at a size."""
    return {lr: [whole_loss(known[r]) for s in range(seeds) if (r := (size, v, lr, s)) in known and known[r]]
            for lr in lrs}


def ties(args, known, size, v):
    """Input v's lrs tied with its tuned lr at a size, the tuned first: {"lrs", "sd", "scores"}, or None until
    the lr is tuned."""
    lrs, best, where = grid(args, known, size, v)
    if where != "interior":
        return None
    score = lr_score(known, size, v, args.grid_seeds)
    scores = {lr: score(lr) for lr in lrs}
    sd = pooled_sd(grid_losses(known, size, v, lrs, args.grid_seeds)) or 0.0
    return {"lrs": tied(scores, best, sd), "sd": sd, "scores": scores}


def tuned_gaps(known, size, lrs, seeds=None):
    """Per-seed gaps loss(binary) - loss(learned) (nats per token) at lrs {input: lr}, over the seeds both
    finished (diverged runs left out), or over `seeds` only."""
    by = {v: {s: whole_loss(x) for (z, w, r, s), x in known.items() if (z, w, r) == (size, v, lr) and x}
          for v, lr in lrs.items()}
    common = sorted(set(by["binary"]) & set(by["learned"]) & (set(seeds) if seeds is not None else set(by["binary"])))
    return [by["binary"][s] - by["learned"][s] for s in common]


def wide(gaps, points=0.02):
    """SEED_RULE's test: a 95% interval wider than +-points in perplexity (None: under two seeds, wide)."""
    ci = interval(gaps)
    return ci is None or (math.expm1(ci["hi"]) - math.expm1(ci["lo"])) / 2 > points


def stages(args, known):
    """The runs, in the order of their value, as [(title, [(point, input, seed)])]: each size's lr grid (in the
    order of --sizes); learned and binary to --seeds seeds at their tuned and tied lrs; one more seed of the
    tuned pair while its interval is wide (SEED_RULE); the controls' grids, then each control to
    --control_seeds at its own tuned lr. A run that needs a tuned lr not yet found is left out; the plan is
    redrawn as runs end."""
    out = []
    for L, D in sizes(args):
        lrs = {v: grid(args, known, (L, D), v)[0] for v in INPUTS}
        out.append((f"lr grid {L}x{D}", [(point(args, L, D, lr), v, s) for v in INPUTS for lr in lrs[v]
                                         for s in range(args.grid_seeds)]))
    work, more = [], []
    for size in sizes(args):
        tie = {v: ties(args, known, size, v) for v in INPUTS}
        for v in INPUTS:
            work += [(point(args, *size, lr), v, s) for lr in (tie[v] or {"lrs": []})["lrs"]
                     for s in range(args.seeds)]
        if None in tie.values():
            continue
        lrs = {v: tie[v]["lrs"][0] for v in INPUTS}
        n = len(tuned_gaps(known, size, lrs))
        if args.seeds <= n < args.max_seeds and wide(tuned_gaps(known, size, lrs)):
            more += [(point(args, *size, lrs[v]), v, n) for v in INPUTS]
    out.append(("seeds at the tuned and tied lrs", work))
    out.append(("one more seed of a tuned pair whose interval is wide", more))
    grids, work = [], []
    for size in control_sizes(args):
        for c in controls(args):
            grids += [(point(args, *size, lr), c, s) for lr in grid(args, known, size, c)[0]
                      for s in range(args.grid_seeds)]
            if (lr := tuned(args, known, size, c)) is not None:
                work += [(point(args, *size, lr), c, s) for s in range(args.control_seeds)]
    out.append(("the controls' lr grids", grids))
    out.append(("controls at their own tuned lrs", work))
    return out


def key(p, v, s):
    """A run's key in `known`: (size, input, lr, seed)."""
    return (p.L, p.D), v, p.lr, s


# ----------------------------------------------------------------------------- validation per source
def source_windows(meta):
    """Each source's validation tokens, by prepare_data.py's own cut and split of the same files:
    {source name: dict(tokens=np.array, bytes=int, documents=int, all_bytes=int)}."""
    enc = get_tokenizer(meta["encoding"], meta["vocab_size"], meta["reserve_zero"], meta["reserve_ones"])
    labels, texts = [], []
    for source in meta["inputs"]:
        docs = chain.from_iterable(read_documents(f, meta["text_field"]) for f in resolve_input(source))
        for doc in cut_documents(docs, meta.get("doc_chars", 0)):
            labels.append(os.path.splitext(os.path.basename(source))[0])
            texts.append(doc)
    out = {name: dict(tokens=[], bytes=0, documents=0, all_bytes=0) for name in labels}
    for name, (split, text) in zip(labels, split_documents(texts, meta["val_fraction"])):
        size = len(text.encode("utf-8"))
        out[name]["all_bytes"] += size
        if split == "val":
            out[name]["tokens"] += enc.encode_ordinary(text) + [enc.eot_token]
            out[name]["bytes"] += size
            out[name]["documents"] += 1
    for s in out.values():
        s["tokens"] = np.array(s["tokens"], dtype=np.int64)
    val = meta["splits"]["val"]
    tokens, n_bytes = sum(len(s["tokens"]) for s in out.values()), sum(s["bytes"] for s in out.values())
    if tokens != val["tokens"] or n_bytes != val["bytes"]:
        raise ValueError("the validation documents recomputed per source do not add up to the prepared split: "
                         "was the data prepared from these files with these settings?")
    return out


@torch.no_grad()
def source_losses(run_dir, windows, batch_size=16):
    """Mean loss per token on each source's validation windows (block_size + 1 tokens at stride block_size,
    as shards.Split reads a split), from a run's final checkpoint: {source: (loss, windows)}."""
    model, _ = load_checkpoint(run_dir, "cpu")
    model.eval()
    T, out = model.config.block_size, {}
    for name, s in windows.items():
        n = (len(s["tokens"]) - 1) // T
        rows = np.stack([s["tokens"][i * T: i * T + T + 1] for i in range(n)])  # (windows, T + 1)
        total = 0.0
        for start in range(0, n, batch_size):
            batch = rows[start:start + batch_size]
            x, y = torch.from_numpy(batch[:, :-1].copy()), torch.from_numpy(batch[:, 1:].copy())
            total += model(x, y)[1].item() * len(batch)
        out[name] = (total / n, n)
    return out


# ----------------------------------------------------------------------------- the runs that finished
def finished_runs(args, windows):
    """{(size, input, lr, seed): per-source losses, None for a diverged run} of the runs in --out at these
    sizes, V and T that finished (each checked to have been trained as asked now); a finished run not yet
    scored per source is scored first (its sources.json)."""
    found, base = {}, os.path.join(args.out, data_name(args))
    data = os.path.join(base, "data")
    folder = re.compile(rf"(\d+)x(\d+)-T{re.escape(f'{args.tokens_per_param:g}')}-lr(.+)")
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        m = folder.fullmatch(name)
        if not m or (int(m[1]), int(m[2])) not in sizes(args):
            continue
        p = point(args, int(m[1]), int(m[2]), float(m[3]))
        for run in sorted(os.listdir(os.path.join(base, name))):
            v, s = run.rsplit("-seed", 1)
            d = run_folder(args, p, v, int(s))
            if not os.path.exists(os.path.join(d, "final.json")):
                continue
            compare.check_settings(compare.run_config(run_settings(args, p, data), v, int(s)))
            with open(os.path.join(d, "final.json")) as f:
                diverged = "diverged" in json.load(f)
            sources = os.path.join(d, "sources.json")
            if not diverged and not os.path.exists(sources):
                threads = torch.get_num_threads()
                torch.set_num_threads(1)  # it runs beside the training workers: one thread, none left spinning
                atomic_write(sources, json.dumps(source_losses(d, windows)))
                torch.set_num_threads(threads)
            found[key(p, v, int(s))] = None if diverged else read_sources(sources)
    return found


def read_sources(path):
    with open(path) as f:
        return {k: tuple(x) for k, x in json.load(f).items()}


def reused_runs(args, windows, meta):
    """{(size, input, lr, seed): per-source losses} of the runs in --reuse's records that match these sizes,
    V and T (the same steps of the same batch): a row gives each seed's bits per byte by source, of its input
    at its lr and of learned at learned_lr. Each source's loss is taken back from its bits per byte and the
    whole split's checked against the row's: a record of another text is refused."""
    tokens_per_byte = {k: len(w["tokens"]) / w["bytes"] for k, w in windows.items()}
    n = {k: (len(w["tokens"]) - 1) // args.block_size for k, w in windows.items()}
    val = meta["splits"]["val"]
    per_nat = val["tokens"] / val["bytes"] / math.log(2)  # whole-split bits per byte per nat per token
    found = {}
    for path in args.reuse:
        with open(path) as f:
            record = json.load(f)
        for r in record["rows"]:
            (L, D), = scaling.parse_sizes(r["size"])
            if (L, D) not in sizes(args) or r["vocab"] != args.vocab:
                continue
            if r["tokens"] != steps_for(args, L, D) * args.batch_size * args.block_size:
                continue
            if set(r["sources"]) != set(windows):
                raise ValueError(f"{path}: {r['size']}'s sources {sorted(r['sources'])} are not this text's "
                                 f"{sorted(windows)}")
            for i, s in enumerate(r["seeds"]):
                for v, lr, bpb in ((r["input"], r["lr"], "bpb"), ("learned", r["learned_lr"], "learned_bpb")):
                    losses = {k: (x[bpb][i] * math.log(2) / tokens_per_byte[k], n[k]) for k, x in r["sources"].items()}
                    if abs(whole_loss(losses) * per_nat - r[bpb][i]) > 1e-9:
                        raise ValueError(f"{path}: {r['size']} {v} seed {s} does not add up on this text's validation "
                                         "split: was it made from these files with these settings?")
                    found[(L, D), v, lr, s] = losses
        found = {**listed_runs(args, record), **found}
    return found


SAME_STUDY = ("corpus", "doc_chars", "encoding", "vocab", "tokens_per_param", "n_head", "block_size", "batch_size")


def listed_runs(args, record):
    """The runs a record of this tool lists with their whole-split loss only (its lr grids' runs, in no row),
    at these sizes, when it was made with this study's text, V, T and batch: {(size, input, lr, seed): {"all":
    (loss, 1)}, or None for a diverged run}; a record of another study gives none."""
    settings = record.get("settings", {})
    here = {**vars(args), "corpus": [os.path.basename(c) for c in args.corpus]}
    if any(settings.get(k) != here[k] for k in SAME_STUDY):
        return {}
    found = {}
    for r in record["runs"]:
        (L, D), = scaling.parse_sizes(r["size"])
        if (L, D) in sizes(args):
            found[(L, D), r["input"], r["lr"], r["seed"]] = None if r["loss"] == "diverged" else {"all": (r["loss"], 1)}
    return found


def known_runs(args, windows, meta):
    """The reused runs and this study's own (its own first where both hold a run): (known, the reused keys)."""
    reused = reused_runs(args, windows, meta)
    found = finished_runs(args, windows)
    return {**reused, **found}, set(reused) - set(found)


# ----------------------------------------------------------------------------- running it
def train_all(args, data, meta, windows):
    """Stage after stage in order, the plan redrawn as runs end (a grid grows, a tuned lr becomes known); the
    report and the record rewritten as each run ends."""
    last = None
    while True:
        known, _ = known_runs(args, windows, meta)
        for title, work in stages(args, known):
            work = [j for j in dict.fromkeys(work) if key(*j) not in known]
            if work:
                break
        else:
            return
        if work == last:  # they ran, yet are not found: a loop, not a study
            raise RuntimeError(f"the runs of stage {title!r} ended but are not found in {args.out}")
        last = work
        print(f"\n### stage: {title}: {len(work)} runs", flush=True)
        runs = [(p.name, run_settings(args, p, data), v, s) for p, v, s in work]
        for _, run, v, s in runs:
            compare.check_settings(compare.run_config(run, v, s))
        scaling.run_all(runs, args.jobs, after=lambda name, run: recorded(args, meta, windows, name, run))


# ----------------------------------------------------------------------------- statistics
def t_quantile(p, df):
    """The p-quantile (p >= 0.5) of Student's t with df degrees of freedom: its density integrated from 0
    (Simpson's rule) and inverted by bisection; accurate to ~1e-6 (no scipy needed)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x):
        t = np.linspace(0.0, x, 4001)
        f = c * (1 + t * t / df) ** (-(df + 1) / 2)
        return 0.5 + x / 12000 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def interval(gaps, level=0.95):
    """Mean, sd and the t interval of the mean of per-seed gaps (nats), or None under two seeds."""
    if len(gaps) < 2:
        return None
    m, sd = statistics.mean(gaps), statistics.stdev(gaps)
    half = t_quantile((1 + level) / 2, len(gaps) - 1) * sd / math.sqrt(len(gaps))
    return {"n": len(gaps), "mean": m, "sd": sd, "lo": m - half, "hi": m + half}


def verdicts(ci):
    """Computed from a gap's interval (nats): its sign, and where it lies against the paper's +-4.8%."""
    if ci is None:
        return {"sign": "no interval (under two seeds)", "paper": "no interval (under two seeds)"}
    sign = "worse (CI above 0)" if ci["lo"] > 0 else "better (CI below 0)" if ci["hi"] < 0 else "CI includes 0"
    lo, hi, band = math.expm1(ci["lo"]), math.expm1(ci["hi"]), PAPER["spread_pct"]
    paper = ("inside ±4.8%" if -band <= lo and hi <= band else "outside ±4.8%" if lo > band or hi < -band
             else "straddles ±4.8%")
    return {"sign": sign, "paper": paper}


def recorded(args, meta, windows, name, run):
    """As a run ends: the report and the record rewritten (quietly), and one line on stdout."""
    write_report(args, meta, windows, show=False)  # it scores the run per source first
    folder = os.path.join(args.out, name, f"{run['variant']}-seed{run['seed']}")
    if "diverged" in run:
        said = "diverged"
    else:
        said = f"whole-split loss {whole_loss(read_sources(os.path.join(folder, 'sources.json'))):.4f}"
    print(f"recorded: {folder}: {said}", flush=True)


# ----------------------------------------------------------------------------- the decision rule
def ci_text(ci):
    if ci is None:
        return "—"
    return f"{pct(ci['mean']):+.2f}% ({pct(ci['lo']):+.2f} to {pct(ci['hi']):+.2f})"


def pct(nats):
    return 100 * math.expm1(nats)


def decide(small, large, seeds):
    """RULE on two sizes, the smaller first, each (size, per-seed tuned gaps in nats, or None before both its lrs
    are tuned) -> {"sizes", "verdict": "grows" | "shrinks" | "overlap" | "not yet", "text": what the report says}."""
    (a, gaps_a), (b, gaps_b) = small, large
    have = [len(g or []) for g in (gaps_a, gaps_b)]
    out = {"sizes": [a, b]}
    if min(have) < max(seeds, 2):
        return {**out, "verdict": "not yet", "text": f"{a} vs {b}: not decided yet: the rule needs both sizes' lrs "
                f"tuned and {seeds} paired seeds each (now {a}: {have[0]}, {b}: {have[1]})."}
    ca, cb = interval(gaps_a), interval(gaps_b)
    found = f"{a} {ci_text(ca)}, {b} {ci_text(cb)}"
    if cb["lo"] > ca["hi"]:
        return {**out, "verdict": "grows", "text": f"The gap grows with size from {a} to {b}: {b}'s 95% interval "
                f"lies entirely above {a}'s ({found})."}
    if cb["hi"] < ca["lo"]:
        return {**out, "verdict": "shrinks", "text": f"The gap shrinks with size from {a} to {b}: {b}'s 95% interval "
                f"lies entirely below {a}'s ({found})."}
    return {**out, "verdict": "overlap", "text": f"No trend claimed from {a} to {b}: the 95% intervals overlap "
            f"({found})."}


def decision(rows, names, seeds):
    """RULE on each two consecutive sizes of `names` (smallest first), from the record's binary rows."""
    gaps = {r["size"]: r["gap_nats"] for r in rows if r["input"] == "binary"}
    return [decide((a, gaps.get(a)), (b, gaps.get(b)), seeds) for a, b in zip(names, names[1:])]


# ----------------------------------------------------------------------------- verdicts under near ties
DEPTH_SIZES = ("4x32", "2x64", "8x32")  # DEPTH_RULE's sizes: the smaller V 257 size, the larger, the deep one


def side(x, y):
    """Where interval x lies against interval y: "above", "below" or "overlap"."""
    return "above" if x["lo"] > y["hi"] else "below" if x["hi"] < y["lo"] else "overlap"


def depth_decide(small, large, deep):
    """DEPTH_RULE on the three sizes' intervals of the gap per byte -> "size" | "depth" | "width" |
    "undecided", and the two comparisons it reads."""
    against = {"vs 2x64": side(deep, large), "vs 4x32": side(deep, small)}
    verdict = {("overlap", "above"): "size", ("below", "below"): "depth",
               ("below", "overlap"): "width"}.get(tuple(against.values()), "undecided")
    return verdict, against


def size_facts(record):
    """What the verdicts read of each size of a record whose learned and binary lrs are tuned: {size: {"vocab",
    "tokens_per_byte", "ties": {input: [lrs]}, "losses": {input: {lr: {seed: loss}}}}} (diverged runs left out)."""
    out = {}
    for z in record["sizes"]:
        tie = record["ties"].get(z["size"], {})
        if any(tie.get(v) is None for v in INPUTS):
            continue
        losses = {v: {float(lr): {s: x for s, x in enumerate(seeds) if isinstance(x, float)}
                      for lr, seeds in z["lr_grid"].get(v, {}).items()} for v in INPUTS}
        out[z["size"]] = {"vocab": z["vocab"], "tokens_per_byte": record["tokens_per_byte"],
                          "ties": {v: tie[v]["lrs"] for v in INPUTS}, "losses": losses}
    return out


def pair_gaps(fact, lrs):
    """A size's per-seed gaps (nats per token) of binary at lrs["binary"] against learned at lrs["learned"]."""
    mine, base = fact["losses"]["binary"].get(lrs["binary"], {}), fact["losses"]["learned"].get(lrs["learned"], {})
    return [mine[s] - base[s] for s in sorted(set(mine) & set(base))]


def choices(facts, names):
    """Every combination of tied lrs of the sizes `names`: [{size: {input: lr}}], the tuned combination first."""
    slots = [(z, v) for z in names for v in INPUTS]
    out = []
    for pick in product(*(facts[z]["ties"][v] for z, v in slots)):
        combo = {z: {} for z in names}
        for (z, v), lr in zip(slots, pick):
            combo[z][v] = lr
        out.append(combo)
    return out


def sign_verdict(facts, name, seeds):
    """A size's gap against 0 (verdicts()'s sign) at one choice of lrs."""
    def verdict(combo):
        gaps = pair_gaps(facts[name], combo[name])
        return "not yet" if len(gaps) < seeds else verdicts(interval(gaps))["sign"]
    return verdict


def size_verdict(facts, small, large, seeds):
    """RULE from `small` to `large` at one choice of lrs."""
    def verdict(combo):
        return decide((small, pair_gaps(facts[small], combo[small])),
                      (large, pair_gaps(facts[large], combo[large])), seeds)["verdict"]
    return verdict


def per_byte(fact, gaps):
    """Gaps in nats per token -> bits per byte of the size's validation split."""
    return [g * fact["tokens_per_byte"] / math.log(2) for g in gaps]


def depth_verdict(facts, seeds):
    """DEPTH_RULE at one choice of lrs."""
    def verdict(combo):
        gaps = [per_byte(facts[z], pair_gaps(facts[z], combo[z])) for z in DEPTH_SIZES]
        if min(len(g) for g in gaps) < seeds:
            return "not yet"
        return depth_decide(*(interval(g) for g in gaps))[0]
    return verdict


def seeds_asked(facts, name, max_seeds):
    """SEED_RULE at a size: whether its tuned pair's interval is still wide with under max_seeds seeds."""
    gaps = pair_gaps(facts[name], choices(facts, [name])[0][name])
    return max_seeds is not None and len(gaps) < max_seeds and wide(gaps)


def robust(name, names, verdict, facts, max_seeds=None):
    """A verdict under every combination of the sizes' tied lrs: each combination's outcome; robust when all
    agree (TIE_RULE). "outcome": the common verdict, "not yet" while any combination lacks its seeds or
    SEED_RULE still asks one of the sizes for seeds, else "not robust"."""
    combos = [{"lrs": combo, "verdict": verdict(combo)} for combo in choices(facts, names)]
    found = {c["verdict"] for c in combos}
    waiting = any(seeds_asked(facts, z, max_seeds) for z in names)
    outcome = "not yet" if "not yet" in found or waiting else found.pop() if len(found) == 1 else "not robust"
    return {"verdict": name, "sizes": list(names), "at_tuned": combos[0]["verdict"], "outcome": outcome,
            "robust": outcome not in ("not yet", "not robust"), "combinations": combos}


def robustness(facts, order, seeds, max_seeds=None):
    """Every verdict the study states, each under every combination of tied lrs: each size's sign, RULE on
    consecutive sizes of one V (`order`: smallest first), and DEPTH_RULE when its three sizes are known; each
    "not yet" while SEED_RULE asks one of its sizes for seeds (up to max_seeds)."""
    out = [robust(f"{z}: binary vs learned", [z], sign_verdict(facts, z, seeds), facts, max_seeds)
           for z in order if z in facts]
    same_v = [z for z in order if z in facts]
    for a, b in zip(same_v, same_v[1:]):
        if facts[a]["vocab"] == facts[b]["vocab"]:
            out.append(robust(f"RULE: {a} -> {b}", [a, b], size_verdict(facts, a, b, seeds), facts, max_seeds))
    if all(z in facts for z in DEPTH_SIZES):
        out.append(robust("DEPTH_RULE", DEPTH_SIZES, depth_verdict(facts, seeds), facts, max_seeds))
    return out


def depth_text(facts, seeds, max_seeds):
    """DEPTH_RULE at the tuned lrs, in words, with each size's gap per byte and its interval; "not yet" while a
    size's tuned interval is wide and SEED_RULE still asks for seeds (the reading so far given beside it)."""
    if not all(z in facts for z in DEPTH_SIZES):
        return "DEPTH_RULE: not yet: " + ", ".join(z for z in DEPTH_SIZES if z not in facts) + " not tuned."
    tuned_lrs = choices(facts, DEPTH_SIZES)[0]
    cis = {z: interval(per_byte(facts[z], pair_gaps(facts[z], tuned_lrs[z]))) for z in DEPTH_SIZES}
    if any(ci is None or ci["n"] < seeds for ci in cis.values()):
        return "DEPTH_RULE: not yet: each size needs its paired seeds."
    verdict, against = depth_decide(*cis.values())
    waiting = [z for z in DEPTH_SIZES if cis[z]["n"] < max_seeds
               and wide(pair_gaps(facts[z], tuned_lrs[z]))]
    found = "; ".join(f"{z} (V {facts[z]['vocab']}) {1000 * c['mean']:+.1f} ({1000 * c['lo']:+.1f} to "
                      f"{1000 * c['hi']:+.1f}) millibits/byte, {c['n']} seeds" for z, c in cis.items())
    reading = (f"'{verdict}' (8x32 {against['vs 2x64']} 2x64, {against['vs 4x32']} 4x32): {found}. 8x32 also "
               "differs in V and K (513 / 10 bits against 257 / 9), tokens per byte and epochs.")
    if waiting:
        return (f"DEPTH_RULE at the tuned lrs: not yet: SEED_RULE asks {', '.join(waiting)} for more seeds (an "
                f"interval wider than +-2 points); the reading so far: {reading}")
    return f"DEPTH_RULE at the tuned lrs: {reading}"


# ----------------------------------------------------------------------------- the record
def lr_grid(known, size, inputs):
    """{input: {lr: [end-of-run whole-split loss of seed 0, 1, ...]}} of the runs known at a size, each input's
    lrs in increasing order; a seed's entry is "diverged" for a diverged run, None while it has not finished."""
    out = {}
    for v in inputs:
        for (z, w, lr, s), losses in sorted(known.items(), key=lambda run: run[0][2:]):
            if (z, w) != (size, v):
                continue
            seeds = out.setdefault(v, {}).setdefault(f"{lr:g}", [])
            seeds += [None] * (s + 1 - len(seeds))
            seeds[s] = "diverged" if losses is None else whole_loss(losses)
    return out


def size_entry(args, known, size, meta):
    """A size in the record: its counts and length, each input's lr_grid and where its best lr lies."""
    L, D = size
    n = {v: trainable(args, L, D, v) for v in INPUTS}
    steps = steps_for(args, L, D)
    tokens = steps * args.batch_size * args.block_size
    inputs = [*INPUTS, *(controls(args) if size in control_sizes(args) else [])]
    best = {}
    for v in inputs:
        lrs, lr, where = grid(args, known, size, v)
        best[v] = {"lr": lr, "where": where, "grid": lrs}
    return {"size": f"{L}x{D}", "vocab": args.vocab, "steps": steps, "tokens": tokens,
            "tokens_per_param": tokens / n["binary"], "epochs": tokens / meta["splits"]["train"]["tokens"],
            "learned_trainable": n["learned"], "binary_trainable": n["binary"], "share": args.vocab * D / n["learned"],
            "lr_grid": lr_grid(known, size, inputs), "best": best}


def read_curve(args, p, v, s):
    """A run's evaluations along training: {variant, seed, curve}, or None without its log (a reused run)."""
    folder = run_folder(args, p, v, s)
    logged = os.path.exists(os.path.join(folder, "log.jsonl"))
    return {"variant": v, "seed": s, "curve": compare.log_summary(folder)[0]} if logged else None


def gap_row(args, known, size, v, lr, learned_lr, windows, meta):
    """Input v at lr against learned at learned_lr at a size: the per-seed gaps over the seeds both finished,
    their interval and verdicts, counts, bits per byte (the whole split and each source) and the curve."""
    L, D = size

    def finished(w, at):
        return {s: x for (z, u, r, s), x in known.items() if (z, u, r) == (size, w, at) and x is not None}

    mine, base = finished(v, lr), finished("learned", learned_lr)
    seeds = sorted(set(mine) & set(base))
    gaps = [whole_loss(mine[s]) - whole_loss(base[s]) for s in seeds]
    ci = interval(gaps)
    n = {w: trainable(args, L, D, w) for w in ("learned", "binary", v)}
    tokens = steps_for(args, L, D) * args.batch_size * args.block_size
    val = meta["splits"]["val"]
    per_nat = val["tokens"] / val["bytes"] / math.log(2)  # whole-split bits per byte per nat per token
    tokens_per_byte = {k: len(w["tokens"]) / w["bytes"] for k, w in windows.items()}

    def bpb(losses, k):
        return losses[k][0] * tokens_per_byte[k] / math.log(2)

    by_source = [s for s in seeds if set(mine[s]) == set(base[s]) == set(windows)]  # a record's runs list: none
    sources = {k: {"learned_bpb": [bpb(base[s], k) for s in by_source], "bpb": [bpb(mine[s], k) for s in by_source],
                   "ci": interval([mine[s][k][0] - base[s][k][0] for s in by_source])} for k in windows}
    curves = [c for w, at in (("learned", learned_lr), (v, lr)) for s in seeds
              if (c := read_curve(args, point(args, L, D, at), w, s))]
    curve = [(t, [math.expm1(g) for g in gs]) for t, gs in scaling.seed_gaps(curves, v)]
    return {"size": f"{L}x{D}", "input": v, "vocab": args.vocab, "lr": lr, "learned_lr": learned_lr,
            "planned_seeds": args.seeds if v in INPUTS else args.control_seeds, "seeds": seeds,
            "trainable": n[v], "learned_trainable": n["learned"], "binary_trainable": n["binary"],
            "share": args.vocab * D / n["learned"], "tokens": tokens, "tokens_per_param": tokens / n["binary"],
            "epochs": tokens / meta["splits"]["train"]["tokens"], "gap_nats": gaps, "ci": ci, **verdicts(ci),
            "learned_bpb": [whole_loss(base[s]) * per_nat for s in seeds],
            "bpb": [whole_loss(mine[s]) * per_nat for s in seeds], "sources": sources,
            "curve": curve or reused_curve(args, f"{L}x{D}", v, lr, learned_lr, seeds)}


def reused_curve(args, size, v, lr, learned_lr, seeds):
    """The curve of the same row (size, V, input, lrs, seeds) in a --reuse record, whose runs left no log
    here; [] when none matches."""
    for path in filter(os.path.exists, args.reuse):  # reused_runs has already refused a missing record
        with open(path) as f:
            for r in json.load(f)["rows"]:
                same = (r["size"], r["vocab"], r["input"], r["lr"], r["learned_lr"], r["seeds"])
                if same == (size, args.vocab, v, lr, learned_lr, seeds):
                    return r["curve"]
    return []


def tuned_rows(args, known, windows, meta):
    """Binary and each control against learned at each size, each input at its own tuned lr; a size whose
    learned lr is not tuned yet has no such row, nor an input whose own lr is not."""
    rows = []
    for size in sizes(args):
        base = tuned(args, known, size, "learned")
        if base is None:
            continue
        inputs = ["binary", *(controls(args) if size in control_sizes(args) else [])]
        lrs = {v: tuned(args, known, size, v) for v in inputs}
        rows += [gap_row(args, known, size, v, lr, base, windows, meta) for v, lr in lrs.items() if lr is not None]
    return rows


def unfinished(args, known):
    """What the record still lacks, in words: each planned run not finished, each grid without a tuned lr."""
    runs = dict.fromkeys(j for _, work in stages(args, known) for j in work if key(*j) not in known)
    out = [f"{p.L}x{p.D} {v} lr {p.lr:g} seed {s}" for p, v, s in runs]
    for L, D in sizes(args):
        for v in [*INPUTS, *(controls(args) if (L, D) in control_sizes(args) else [])]:
            _, best, where = grid(args, known, (L, D), v)
            if where == "unfinished":
                out.append(f"{L}x{D} {v}: its lr grid is unfinished, so its seeds at the tuned lr are not planned "
                           "yet")
            elif where != "interior":
                out.append(f"{L}x{D} {v}: best lr {best:g} at the grid's {where} (--extend {args.extend} spent): "
                           "no seeds, controls or gap at it")
    return out


def build_record(args, meta, windows, known, reused):
    """results.json: the settings, the rule and its outcome, each size's lr grids, the gap rows, every run."""
    rows = tuned_rows(args, known, windows, meta)
    by_size = sorted(sizes(args), key=lambda z: trainable(args, *z, "binary"))
    settings = {k: x for k, x in vars(args).items() if k not in ("jobs", "report")}  # how it ran, not what
    val = meta["splits"]["val"]
    record = {"settings": {**settings, "corpus": [os.path.basename(c) for c in args.corpus]}, "rule": RULE,
              "tie_rule": TIE_RULE, "seed_rule": SEED_RULE, "depth_rule": DEPTH_RULE,
              "decision": decision(rows, [f"{L}x{D}" for L, D in by_size], args.seeds),
              "sizes": [size_entry(args, known, size, meta) for size in sizes(args)], "rows": rows,
              "tokens_per_byte": val["tokens"] / val["bytes"],
              "ties": {f"{L}x{D}": {v: ties(args, known, (L, D), v) for v in INPUTS} for L, D in sizes(args)},
              "unfinished": unfinished(args, known),
              "sources": {k: {x: w[x] for x in ("all_bytes", "bytes", "documents")} for k, w in windows.items()},
              "runs": [{"size": f"{z[0]}x{z[1]}", "input": v, "lr": lr, "seed": s,
                        "loss": "diverged" if x is None else whole_loss(x), "reused": (z, v, lr, s) in reused}
                       for (z, v, lr, s), x in sorted(known.items(), key=lambda run: run[0])]}
    facts, order = {}, []
    for other in [*map(read_record, args.beside), record]:
        facts.update(size_facts(other))
        order += [z["size"] for z in sorted(other["sizes"], key=lambda z: z["binary_trainable"])]
    record["robustness"] = robustness(facts, order, args.seeds, args.max_seeds)
    record["depth"] = depth_text(facts, args.seeds, args.max_seeds)
    return record


def read_record(path):
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- the report
def grid_table(args, known, size):
    """Each lr tried at a size, by input: every seed's loss, the score search() compares, the best lr's mark."""
    lines = []
    for v in INPUTS:
        lrs, best, where = grid(args, known, size, v)
        score = lr_score(known, size, v, args.grid_seeds)
        for lr in sorted({r for z, w, r, _ in known if (z, w) == (size, v)} | set(lrs)):
            runs = sorted((s, x) for (z, w, r, s), x in known.items() if (z, w, r) == (size, v, lr))
            losses = ", ".join("diverged" if x is None else f"{whole_loss(x):.4f}" for _, x in runs)
            mean = score(lr)
            mark = f"best: {where}" if lr == best else "" if lr in lrs else "outside the grid"
            score_text = "—" if mean is None else f"{mean:.4f}"
            lines.append([v, f"{lr:g}", str(len(runs)), losses or "—", score_text, mark])
    header = [("input", "l"), ("lr", "r"), ("seeds", "r"), ("whole-split loss, each seed", "l"),
              (f"score (mean of seeds 0-{args.grid_seeds - 1})", "r"), ("", "l")]
    return compare.markdown_table(header, lines)


def source_table(windows):
    total = sum(w["all_bytes"] for w in windows.values())
    val = sum(w["bytes"] for w in windows.values())
    return compare.markdown_table(
        [("source", "l"), ("bytes", "r"), ("share of the text", "r"), ("val documents", "r"), ("val bytes", "r"),
         ("share of val", "r")],
        [[k, f"{w['all_bytes']:,}", f"{100 * w['all_bytes'] / total:.1f}%", str(w["documents"]), f"{w['bytes']:,}",
          f"{100 * w['bytes'] / val:.1f}%"] for k, w in windows.items()])


def point_table(rows):
    header = [("size", "l"), ("V (K)", "r"), ("input", "l"), ("trainable (input / learned)", "r"),
              ("table share", "r"), ("T", "r"), ("epochs", "r"), ("lr (input / learned)", "r"), ("seeds", "r"),
              ("learned bits/byte", "r"), ("bits/byte", "r"), ("gap, perplexity (95% CI)", "r"), ("sd (nats)", "r"),
              ("vs 0", "l"), ("vs the paper's ±4.8%", "l")]
    return compare.markdown_table(header, [[
        r["size"], f"{r['vocab']} ({code_bits(r['vocab'])})", r["input"],
        f"{r['trainable']:,} / {r['learned_trainable']:,}", f"{100 * r['share']:.1f}%", f"{r['tokens_per_param']:.1f}",
        f"{r['epochs']:.2f}", f"{r['lr']:g} / {r['learned_lr']:g}", f"{len(r['seeds'])} of {r['planned_seeds']}",
        share.ms(r["learned_bpb"], ".4f"), share.ms(r["bpb"], ".4f"), ci_text(r["ci"]),
        "—" if r["ci"] is None else f"{r['ci']['sd']:.4f}", r["sign"], r["paper"]] for r in rows])


def key_table(records):
    """README's key result: every size of these records with its depth, width, V, share, T, epochs, each
    input's own tuned lr, seeds, the gap and its interval, the sign against 0 and whether it survives the
    near-tied lrs; then the paper's own row."""
    header = [("L x D", "l"), ("V (K)", "r"), ("input vs learned", "l"), ("share", "r"), ("T", "r"),
              ("epochs", "r"), ("own tuned lr (input / learned)", "r"), ("seeds", "r"),
              ("gap, perplexity (95% CI)", "r"), ("vs 0", "l"), ("under the tied lrs", "l")]
    lines = []
    for record in records:
        robust_of = {v["verdict"]: v for v in record.get("robustness", [])}
        for r in record["rows"]:
            tie = robust_of.get(f"{r['size']}: binary vs learned") if r["input"] == "binary" else None
            lines.append([r["size"], f"{r['vocab']} ({code_bits(r['vocab'])})", r["input"],
                          f"{100 * r['share']:.1f}%", f"{r['tokens_per_param']:.1f}", f"{r['epochs']:.2f}",
                          f"{r['lr']:g} / {r['learned_lr']:g}", str(len(r["seeds"])), ci_text(r["ci"]), r["sign"],
                          "no ties checked (a control)" if tie is None else
                          ("robust" if tie["robust"] else tie["outcome"])])
    lines.append(["32x1024 (the paper)", "65536 (16)", "binary", f"{100 * PAPER['share']:.1f}%",
                  f"{PAPER['tokens_per_param']:.1f}", "not stated", "not stated", "3",
                  f"{100 * PAPER['gap_pct']:+.2f}% (perplexity 2.36 vs 2.44; no interval)",
                  f"inside its ±{100 * PAPER['spread_pct']:.1f}% seed spread", "—"])
    return compare.markdown_table(header, lines)


def verdict_lines(record):
    """Each verdict under the tied lrs, one line each: its outcome, at the tuned lrs, and how many choices."""
    out = []
    for v in record["robustness"]:
        kinds = {}
        for c in v["combinations"]:
            kinds[c["verdict"]] = kinds.get(c["verdict"], 0) + 1
        counts = ", ".join(f"{k}: {n}" for k, n in kinds.items())
        label = "robust" if v["robust"] else v["outcome"]
        out.append(f"- {v['verdict']}: {label} (at the tuned lrs: {v['at_tuned']}; over the "
                   f"{len(v['combinations'])} choices of tied lrs: {counts})")
    return "\n".join(out) or "- none yet"


def tie_table(record):
    """Each size and input's tuned lr, its tied lrs and the pooled seed sd that ties them."""
    lines = [[z, v, f"{t['lrs'][0]:g}", ", ".join(f"{lr:g}" for lr in t["lrs"][1:]) or "none", f"{t['sd']:.4f}"]
             for z, by in record["ties"].items() for v, t in by.items() if t]
    header = [("size", "l"), ("input", "l"), ("tuned lr", "r"), ("tied lrs", "l"), ("pooled seed sd (nats)", "r")]
    return compare.markdown_table(header, lines)


def per_source_table(rows):
    header = [("size", "l"), ("input", "l"), ("source", "l"), ("learned bits/byte", "r"), ("bits/byte", "r"),
              ("gap, perplexity (95% CI)", "r"), ("vs 0", "l")]
    return compare.markdown_table(header, [[r["size"], r["input"], k, share.ms(x["learned_bpb"], ".4f"),
                                            share.ms(x["bpb"], ".4f"), ci_text(x["ci"]), verdicts(x["ci"])["sign"]]
                                           for r in rows for k, x in r["sources"].items()])


def plot(rows, path):
    """The gap (perplexity %) along training against tokens per binary parameter at the tuned lrs: one line per
    (size, V, input) of this record and the --beside ones, over the seeds with logs (a reused row keeps its
    record's curve), the paper's point marked."""
    if (plt := compare.pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for r in rows:
        c = [(t / r["binary_trainable"], g) for t, g in r["curve"] if t > 0]
        if not c:
            continue
        label = (f"{r['size']} V={r['vocab']} {r['input']} (lr {r['lr']:g} / {r['learned_lr']:g}): "
                 f"{len(c[0][1])} seeds with logs")
        line, = ax.plot([t for t, _ in c], [100 * statistics.mean(g) for _, g in c],
                        "-" if r["input"] == "binary" else "--", label=label)
        ax.fill_between([t for t, _ in c], [100 * min(g) for _, g in c], [100 * max(g) for _, g in c],
                        color=line.get_color(), alpha=0.12)
    ax.axhspan(-100 * PAPER["spread_pct"], 100 * PAPER["spread_pct"], color="green", alpha=0.08,
               label="the paper's ±4.8% seed spread")
    ax.plot([PAPER["tokens_per_param"]], [100 * PAPER["gap_pct"]], "r*", ms=13, label="the paper: -3.3% at T = 36")
    ax.set_ylabel("perplexity vs learned (%), evaluation batches")
    ax.set_title("the gap at the paper's point, each input at its tuned lr", fontsize=10)
    scaling.gap_axes(ax, "training tokens per trainable parameter of the binary model (T)", ax.get_ylabel(), 7,
                     beside=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def write_report(args, meta, windows, show=True):
    """results.md, results.json (the record) and the figure from the runs finished so far, and the --record copy;
    the report to stdout when `show`."""
    known, reused = known_runs(args, windows, meta)
    record = build_record(args, meta, windows, known, reused)
    val, train = meta["splits"]["val"], meta["splits"]["train"]
    header = (f"V = {args.vocab}, {args.batch_size} x {args.block_size} tokens a step, {args.n_head} heads, "
              f"{args.encoding} cut to V; sources cut into ~{args.doc_chars:,}-character documents, "
              f"every 10th for val; {train['tokens']:,} train / {val['tokens']:,} val tokens; "
              f"runs reused from {', '.join(args.reuse) or 'no record'}: {len(reused)}")
    grids = [f"The lr grid at {L}x{D} (T = {args.tokens_per_param:g}; each run's loss on the whole validation split "
             f"at its end):\n\n" + grid_table(args, known, (L, D)) for L, D in sizes(args)]
    diverged = [f"{r['size']} {r['input']} lr {r['lr']:g} seed {r['seed']}" for r in record["runs"]
                if r["loss"] == "diverged"]
    report = "\n\n".join([
        header, "The text, by source:\n\n" + source_table(windows), *grids,
        "Each input at its tuned lr (gap: loss(input) - loss(learned) of the same seed on the whole validation "
        "split, as perplexity; CI: 95%, t over seeds):\n\n" + point_table(record["rows"]),
        "Bits per byte by source (the same runs, each source's own validation windows):\n\n"
        + per_source_table(record["rows"]),
        f"The decision rule, committed before the runs: {RULE}\n\n"
        + ("\n".join(f"- {d['text']}" for d in record["decision"]) or "- one size: nothing to decide."),
        f"Near ties, by the rule committed before the runs: {TIE_RULE}\n\n" + tie_table(record),
        f"Seeds of a tuned pair: {SEED_RULE}",
        "Each verdict under every choice of tied lrs:\n\n" + verdict_lines(record),
        f"The depth rule, committed before the runs: {DEPTH_RULE}\n\n- {record['depth']}",
        "In short (README):\n\n" + key_table([*map(read_record, args.beside), record]),
        "Not finished (in no table): " + ("; ".join(record["unfinished"]) or "none") + ".",
        "Diverged: " + ("; ".join(diverged) or "none") + "."]) + "\n"
    rows = [r for other in map(read_record, args.beside) for r in other["rows"]] + record["rows"]
    compare.write_results(args.out, report, record, ("paper_point.png", lambda path: plot(rows, path)),
                          show=show)
    if args.record:
        atomic_write(args.record, json.dumps(record, indent=1) + "\n")
    return record


def parse_config(argv=None):
    return parse_command_line(PaperPointConfig, __doc__, argv, presets=("quick",))


def main(argv=None):
    args = parse_config(argv)
    check_at_least_1(args, "grid_seeds", "seeds", "control_seeds", "jobs", "evals", "eval_batches")
    if args.extend < 0:
        raise ValueError(f"--extend must be 0 or more, got {args.extend}")
    floats(args.lrs, "--lrs")
    if stray := [f"{L}x{D}" for L, D in control_sizes(args) if (L, D) not in sizes(args)]:
        raise ValueError(f"--control_sizes {', '.join(stray)} not among --sizes {args.sizes}")
    if unknown := set(controls(args)) - {"affine", "random", "frozen"}:
        raise ValueError(f"--controls {', '.join(sorted(unknown))}: choose from affine, random, frozen")
    with writer_lock(args.out, outputs=("results.md", "results.json")):
        compare.check_results(args.out, ("results.md", "results.json", "paper_point.png"))
        data, meta = data_of(args)
        windows = source_windows(meta)
        if not args.report:
            train_all(args, data, meta, windows)
        return write_report(args, meta, windows)


if __name__ == "__main__":
    sys.exit(run_main(main, outlive_stdout=True))  # a study outlives a closed stdout (`| head`): its files record it
