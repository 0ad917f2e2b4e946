"""
Where does the fixed code catch up? The learned-vs-binary gap as a function of model size and of
training tokens, built from compare.py's runs.

    python -m tools.scaling --corpus janeausten.txt --jobs 2   # the default study, ~2 h on 2 CPU cores
    python -m tools.scaling --quick                            # tiny sizes, a few minutes
    python -m tools.scaling --gpu --data data/fineweb --device cuda --compile  # one large point, one H200
    python -m tools.scaling --contrast runs/a runs/b           # two finished studies' gaps side by side, in bits/byte

Design choices, up front:
- Three questions, one set of runs. (1) Size: at every decoder size, learned vs binary (affine at two
  sizes) over the same seeds, with the same data, tokenizer, token budget and data order (a seed fixes
  the init and the order, see compare.py). (2) Tokens: at the smallest size, learned vs binary trained
  --long_factor times longer, evaluated along the way, so "learns slower" and "ends worse" can be told
  apart (one seed by default: at this size the gap is ~40x the seed spread, and the short runs'
  seeds show that spread). (3) Fair in parameters? A binary model at the --ablation width given extra layers until it
  has the learned model's trainable parameter count, against the learned model of the base size.
- Sizes grow width and depth together (2 x 48 ... 6 x 192), as GPT families do: at V = 8,192 the
  untied head (V x n_embd) is most of a small model, so width alone would move mostly the head, and
  depth alone would leave the input's width (the place where the code's 13 bits must be unpacked) fixed.
- Every run is compare.run_one (train.train + a full validation pass); its folder layout, resume and
  read-back are compare.py's, one folder per point: <out>/<L>x<D>[-long]/<input>-seed<k>/. Stop and
  rerun the same command freely: finished runs are read back, interrupted ones resume (only when
  trained with the settings asked for now: compare.check_settings). One sweep per --out at a time.
- The gap of one seed is binary loss - learned loss of that seed (same init stream and data order), in
  nats per token; its % is the perplexity ratio - 1. The trend is a power law in the binary model's
  trainable parameters, gap = c * N^-alpha, fitted by least squares on log gap vs log N over the
  sizes' mean gaps: losses approach their limits as power laws in N (Kaplan et al. 2020), so the
  difference of two such curves with the same exponent is one too, and unlike a line in log N it can
  never cross below zero by construction. Its uncertainty comes from resampling the seeds (bootstrap):
  the 16-84% range of alpha and of the crossing point, where the fitted gap falls to the seed spread
  (the median over (size, input) of the max-min validation loss across seeds).
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import leave_signals_to_parent, run_main

import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from types import SimpleNamespace

import numpy as np
import torch

from bincode_gpt.settings import check_at_least_1, parse_command_line, preset_setting, setting
from bincode_gpt.files import writer_lock
from bincode_gpt.shards import load_meta
from model import GPT, get_config
from tools import compare


@dataclass
class ScalingConfig(compare.DataSettings):
    """The default study: ~2 h on 2 CPU cores with --jobs 2. --quick: tiny sizes, a few minutes. --gpu: one
    large point for a single H200 (bf16 autocast, --compile): 12 x 768 learned vs binary, 2 seeds, 1,500 steps
    of 32 x 1024 tokens (49M tokens a run); needs a corpus of that size (see docs/results.md)."""
    out: str = preset_setting("runs/scaling", "folder of the runs, the table and the plot",
                              quick="runs/scaling-quick", gpu="runs/scaling-gpu")
    quick: bool = setting(False, "tiny sizes, a few minutes: each setting's --quick value below")
    gpu: bool = setting(False, "one large point for a single GPU: each setting's --gpu value below")
    sizes: str = preset_setting("2x48,3x80,4x128,6x192", "decoder sizes, n_layer x n_embd",
                                quick="1x16,1x32,2x48,2x64", gpu="12x768")
    affine_sizes: str = preset_setting("2x48,4x128", "sizes that also train the affine input",
                                       quick="1x16,2x48", gpu="")
    ablation: str = preset_setting("4x128", "the size whose binary model gets the learned one's parameter count in "
                                            "extra layers, or none", quick="2x64", gpu="none")
    long_factor: int = preset_setting(3, "the smallest size trained this many times longer (1: no long runs)", gpu=1)
    long_seeds: int = preset_setting(1, "seeds of the long runs", quick=2)
    steps: int = preset_setting(400, "training steps of each run", quick=30, gpu=1500)
    seeds: int = preset_setting(2, "seeds per point")
    evals: int = preset_setting(8, "evaluations along each run", quick=3, gpu=10)
    n_head: int = preset_setting(4, "attention heads", gpu=12)
    block_size: int = preset_setting(128, "context length in tokens", quick=64, gpu=1024)
    batch_size: int = preset_setting(16, "sequences per step", quick=8, gpu=32)
    lr: float = preset_setting(2e-3, "peak learning rate (min_lr = lr / 10)", gpu=1e-3)
    eval_batches: int = preset_setting(8, "validation batches per evaluation", quick=4, gpu=20)
    jobs: int = setting(1, "runs in parallel, each with cores/jobs threads")
    device: str = setting("auto", "auto | cpu | cuda | mps")
    compile: bool = setting(False, "torch.compile each model")
    contrast: list[str] | None = setting(None, "train nothing: compare two finished studies' gaps, size by size, in "
                                               "bits per byte (e.g. two tokenizers)",
                                         nargs=2, type=str, metavar=("A", "B"))


PAPER = {"trainable": 469_828_608, "gap_nats": math.log(2.36 / 2.44), "gap_pct": 2.36 / 2.44 - 1}


def parse_sizes(text, flag="--sizes", allow_none=False):
    """'2x48,4x128' -> [(2, 48), (4, 128)]: n_layer x n_embd, positive integers; '' -> [] if allow_none."""
    sizes = []
    for s in filter(str.strip, text.split(",")):
        parts = s.strip().lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            sizes = None
            break
        sizes.append((int(parts[0]), int(parts[1])))
    if sizes is None or not (sizes or allow_none):
        raise ValueError(f"{flag} must look like 2x48,4x128 (n_layer x n_embd, positive integers), got {text!r}")
    return sizes


def trainable(n_layer, n_embd, variant, args, vocab_size):
    with torch.device("meta"):
        cfg = get_config("small", vocab_size=vocab_size, n_layer=n_layer, n_head=args.n_head, n_embd=n_embd,
                         block_size=args.block_size, input=variant)
        return GPT(cfg).num_params()["trainable"]


def ablation_depth(n_layer, n_embd, args, vocab_size):
    """The depth at which a binary model of this width has (closest to) the learned model's trainable count."""
    target = trainable(n_layer, n_embd, "learned", args, vocab_size)
    depth = n_layer
    while trainable(depth + 1, n_embd, "binary", args, vocab_size) <= target:
        depth += 1
    below = trainable(depth, n_embd, "binary", args, vocab_size)
    above = trainable(depth + 1, n_embd, "binary", args, vocab_size)
    return depth if target - below <= above - target else depth + 1


def plan(args, vocab_size):
    """Every (point, variant, seed) to run, most informative first: the size axis, the ablation, the
    affine sizes, the long runs. A point is (name, n_layer, n_embd, steps, evals)."""
    sizes, jobs = parse_sizes(args.sizes), []
    point = lambda L, D, suffix="", factor=1: (f"{L}x{D}{suffix}", L, D, args.steps * factor, args.evals * factor)  # noqa: E731
    for L, D in sizes:
        jobs += [(point(L, D), v, s) for s in range(args.seeds) for v in ("learned", "binary")]
    if args.ablation != "none":
        (L, D), = parse_sizes(args.ablation)
        if (L, D) not in sizes:
            jobs += [(point(L, D), "learned", s) for s in range(args.seeds)]
        jobs += [(point(ablation_depth(L, D, args, vocab_size), D), "binary", s) for s in range(args.seeds)]
    affine = parse_sizes(args.affine_sizes, allow_none=True)
    jobs += [(point(L, D), "affine", s) for L, D in affine for s in range(args.seeds)]
    if args.long_factor > 1:
        L, D = sizes[0]
        long = point(L, D, "-long", args.long_factor)
        jobs += [(long, v, s) for s in range(args.long_seeds) for v in ("learned", "binary")]
    return list(dict.fromkeys(jobs))


def run_args(args, point):
    name, L, D, steps, evals = point
    return SimpleNamespace(out=os.path.join(args.out, name), data=args.data, preset="small", device=args.device,
                           n_layer=L, n_head=args.n_head, n_embd=D, block_size=args.block_size,
                           batch_size=args.batch_size, steps=steps, lr=args.lr, evals=evals,
                           eval_batches=args.eval_batches, compile=args.compile, code_width=0)


def _worker_init(threads, stop):
    global _stop
    torch.set_num_threads(threads)
    leave_signals_to_parent()  # Ctrl-C reaches training through train's own handler only
    _stop = stop


_stop = None  # in a worker: the sweep's "stop" event, set on Ctrl-C, so queued jobs do not start


def _run(job):
    """One run; None when it was stopped (Ctrl-C: train saved it), so the sweep can say so."""
    name, run, variant, seed = job
    if _stop is not None and _stop.is_set():
        return None
    try:
        return name, compare.run_one(run, load_meta(run.data), variant, seed)
    except SystemExit as e:
        print(e)
        return None


def run_all(work, jobs, after=None):
    """Runs every (point name, compare.run_one settings, input, seed) of `work`, in `jobs` worker processes
    when > 1; returns {point name: [run records]}. after(name, record), if given, is called in this process
    as each run ends (paper_point.py records each result as it lands)."""
    done = []
    if jobs > 1:
        ctx = get_context("spawn")
        stop, threads = ctx.Event(), max(1, torch.get_num_threads() // jobs)
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init, initargs=(threads, stop)) as pool:
            futures = {pool.submit(_run, w): i for i, w in enumerate(work)}
            done = [None] * len(work)  # in the order of `work`, whatever order the runs end in
            try:
                for f in as_completed(futures):
                    i = futures[f]
                    done[i] = f.result()
                    if after and done[i]:
                        after(*done[i])
            except KeyboardInterrupt:  # running jobs save and stop; queued ones return at once
                stop.set()
                pool.shutdown(cancel_futures=True)
                raise
    else:
        for w in work:
            done.append(_run(w))
            if done[-1] is None:
                break
            if after:
                after(*done[-1])
    if None in done:
        raise SystemExit("stopped before every run finished: rerun the same command to continue")
    runs = {}
    for name, record in done:
        runs.setdefault(name, []).append(record)
    return runs


def finished(runs_by_point):
    """Every point's runs without the diverged ones, and the diverged ones as [(point, record)]."""
    kept = {name: [r for r in runs if "diverged" not in r] for name, runs in runs_by_point.items()}
    return {name: runs for name, runs in kept.items() if runs}, [
        (name, r) for name, runs in runs_by_point.items() for r in runs if "diverged" in r]


# ----------------------------------------------------------------------------- analysis
def paired_gaps(runs, a="binary", b="learned"):
    """Per seed, loss(a) - loss(b) of the runs of one point that share that seed."""
    loss = {(r["variant"], r["seed"]): r["val_loss"] for r in runs}
    return [loss[a, s] - loss[b, s] for s in sorted({r["seed"] for r in runs}) if (a, s) in loss and (b, s) in loss]


def fit_power_law(n, gap):
    """Least squares of log gap = log c - alpha log N; returns (c, alpha), or None unless every gap > 0."""
    n, gap = np.asarray(n, float), np.asarray(gap, float)
    if len(set(n.tolist())) < 2 or (gap <= 0).any():
        return None
    slope, intercept = np.polyfit(np.log(n), np.log(gap), 1)
    return math.exp(intercept), -slope


def r_squared(n, gap, c, alpha):
    """How much of the variance of log gap the power law explains (1 = all of it)."""
    y, fit = np.log(gap), math.log(c) - alpha * np.log(n)
    return float(1 - ((y - fit) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def crossing(c, alpha, threshold):
    """The N where c * N^-alpha falls to threshold (inf when the gap does not shrink)."""
    return (c / threshold) ** (1 / alpha) if alpha > 0 else math.inf


def trend(points, threshold, draws=2000, seed=0):
    """points: [(N, [per-seed gaps])]. The fit to the mean gap of each size, and its 16-84% ranges over
    seed resamples (each size's seeds drawn with replacement; draws with a mean gap <= 0 are skipped)."""
    n, means = [n for n, _ in points], [statistics.mean(gs) for _, gs in points]
    fit = fit_power_law(n, means)
    if fit is None:
        return None
    rng, alphas, cross = np.random.default_rng(seed), [], []
    for _ in range(draws):
        f = fit_power_law([n for n, _ in points], [rng.choice(gs, len(gs)).mean() for _, gs in points])
        if f is not None:
            alphas.append(f[1])
            cross.append(crossing(*f, threshold))

    def q(xs):  # the 16th and 84th percentiles
        if not xs:
            return math.nan, math.nan
        xs = sorted(xs)
        return xs[round(0.16 * (len(xs) - 1))], xs[round(0.84 * (len(xs) - 1))]
    return {"c": fit[0], "alpha": fit[1], "r2": r_squared(np.array(n), np.array(means), *fit), "alpha_range": q(alphas),
            "threshold": threshold, "draws": len(alphas),
            "crossing": crossing(*fit, threshold), "crossing_range": q(cross)}


def seed_spread(runs_by_point):
    """Median over (point, input) of the max - min validation loss across seeds, in nats."""
    ranges = []
    for runs in runs_by_point.values():
        for v in {r["variant"] for r in runs}:
            losses = [r["val_loss"] for r in runs if r["variant"] == v]
            if len(losses) > 1:
                ranges.append(max(losses) - min(losses))
    return statistics.median(ranges) if ranges else math.nan


def seed_gaps(runs, variant="binary"):
    """Along training: [(tokens, [per-seed gaps, variant - learned, in nats])] over the seeds both finished."""
    curves = {(r["variant"], r["seed"]): r["curve"] for r in runs}
    seeds = sorted(s for v, s in curves if v == variant and ("learned", s) in curves)
    if not seeds:
        return []
    n = min(len(curves[v, s]) for s in seeds for v in (variant, "learned"))
    return [(curves[variant, seeds[0]][i][0], [curves[variant, s][i][1] - curves["learned", s][i][1] for s in seeds])
            for i in range(n)]


def gap_curve(runs):
    """Gap (binary - learned) along training: [(tokens, mean gap, min gap, max gap)] over shared seeds."""
    return [(tokens, statistics.mean(gaps), min(gaps), max(gaps)) for tokens, gaps in seed_gaps(runs)]


def size_rows(runs_by_point, meta):
    """One row per (point, input): compare.summarize's row plus the point and its gap to learned."""
    rows = []
    for name, runs in runs_by_point.items():
        learned = {r["seed"]: r["val_loss"] for r in runs if r["variant"] == "learned"}
        for row in compare.summarize(runs, meta):
            gaps = paired_gaps(runs, row["input"]) if row["input"] != "learned" and learned else []
            rows.append({"point": name, **row, "gap_nats": compare.mean_std(gaps) if gaps else None,
                         "gap_pct": compare.mean_std([math.exp(g) - 1 for g in gaps]) if gaps else None})
    return rows


def table(rows):
    pct = lambda ms: "—" if ms is None else f"{100 * ms[0]:+.1f}% ± {100 * ms[1]:.1f}"  # noqa: E731
    header = [("size", "l"), ("input", "l"), ("seeds", "r"), ("trainable params", "r"), ("val loss", "r"),
              ("perplexity", "r"), ("bits/byte", "r"), ("gap to learned (nats)", "r"), ("gap (perplexity %)", "r"),
              ("seed spread (ppl)", "r")]
    return compare.markdown_table(header, [
        [r["point"], r["input"], str(r["seeds"]), f"{r['trainable']:,}", compare.pm(r["val_loss"], ".4f"),
         compare.pm(r["perplexity"], ".2f"), compare.pm(r["bits_per_byte"], ".4f"), compare.pm(r["gap_nats"], ".4f"),
         pct(r["gap_pct"]), f"{100 * r['ppl_spread']:.1f}%"] for r in rows])


def analyse(runs_by_point, args, vocab_size):
    """The size-axis points, the trend, the ablation and the long-run curve, as one dict."""
    sizes = parse_sizes(args.sizes)
    axis = []
    for L, D in sizes:
        gaps = paired_gaps(runs_by_point.get(f"{L}x{D}", []))
        if gaps:
            axis.append((trainable(L, D, "binary", args, vocab_size), gaps))
    spread = seed_spread(runs_by_point)
    result = {"axis": [{"trainable": n, "gaps": g} for n, g in axis], "seed_spread": spread,
              "trend": trend(axis, spread) if len(axis) >= 2 and spread > 0 else None}
    if args.ablation != "none":
        (L, D), = parse_sizes(args.ablation)
        depth = ablation_depth(L, D, args, vocab_size)
        runs = [r for r in runs_by_point.get(f"{depth}x{D}", []) if r["variant"] == "binary"]
        runs += [r for r in runs_by_point.get(f"{L}x{D}", []) if r["variant"] == "learned"]
        gaps = paired_gaps(runs)
        result["ablation"] = {"learned": f"{L}x{D}", "binary": f"{depth}x{D}", "gaps": gaps,
                              "learned_trainable": trainable(L, D, "learned", args, vocab_size),
                              "binary_trainable": trainable(depth, D, "binary", args, vocab_size)}
    if args.long_factor > 1:
        L, D = sizes[0]
        result["long"] = {"point": f"{L}x{D}-long", "curve": gap_curve(runs_by_point.get(f"{L}x{D}-long", [])),
                          "short": gap_curve(runs_by_point.get(f"{L}x{D}", []))}
    return result


def reading(result):
    """Sentences computed from the numbers: the trend, where it crosses the spread, the ablation, the long run."""
    out = [f"Seed spread: {result['seed_spread']:.4f} nats (median max-min validation loss over seeds)."]
    for p in result["axis"]:
        out.append(f"- {p['trainable']:,} trainable (binary): gap {statistics.mean(p['gaps']):+.4f} nats "
                   f"({', '.join(f'{g:+.4f}' for g in p['gaps'])} per seed)")
    t = result["trend"]
    if t:
        out.append(f"Fit (mean gap per size): gap = {t['c']:.3g} * N^-{t['alpha']:.3f}, R^2 {t['r2']:.2f} "
                   f"on log gap (alpha 16-84% over seed resamples: {t['alpha_range'][0]:.3f} to "
                   f"{t['alpha_range'][1]:.3f}; the range counts seed noise only, not how well a power law fits). "
                   f"Extrapolated, the gap falls to the seed "
                   f"spread ({t['threshold']:.4f} nats) at N = {t['crossing']:.3g} trainable parameters (16-84%: "
                   f"{t['crossing_range'][0]:.3g} to {t['crossing_range'][1]:.3g}); the paper's model has "
                   f"{PAPER['trainable']:.3g} and trained on orders of magnitude more tokens, so this is an "
                   f"extrapolation across both size and data.")
    else:
        out.append("Fit: none (needs a positive gap at two or more sizes and a seed spread).")
    a = result.get("ablation")
    if a and a["gaps"]:
        g, spread = statistics.mean(a["gaps"]), result["seed_spread"]
        said = ("the extra decoder capacity closes the gap (inside the seed spread)" if abs(g) <= spread else
                "the binary model is now better (outside the seed spread)" if g < 0 else
                "the extra decoder capacity does not close the gap (still outside the seed spread)")
        out.append(f"Ablation: binary {a['binary']} ({a['binary_trainable']:,} trainable) vs learned {a['learned']} "
                   f"({a['learned_trainable']:,}): gap {g:+.4f} nats; {said}.")
    long = result.get("long")
    if long and long["curve"]:
        first, last = long["curve"][len(long["curve"]) // 4], long["curve"][-1]
        out.append(f"Tokens ({long['point']}): gap {first[1]:+.4f} nats at {first[0]:,.0f} tokens, {last[1]:+.4f} at "
                   f"{last[0]:,.0f} tokens ({'narrowing' if abs(last[1]) < abs(first[1]) else 'not narrowing'} with "
                   f"training).")
    return "\n".join(out)


def plot(result, path):
    """Left: gap against binary trainable params (log x), seed bands, fit, paper's point. Right: gap
    against tokens seen for the long run."""
    if (plt := compare.pyplot()) is None:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    n = [p["trainable"] for p in result["axis"]]
    ax.plot(n, [statistics.mean(p["gaps"]) for p in result["axis"]], "o-", label="binary - learned (mean over seeds)")
    ax.fill_between(n, [min(p["gaps"]) for p in result["axis"]], [max(p["gaps"]) for p in result["axis"]],
                    alpha=0.25, label="seed min-max")
    if t := result["trend"]:
        xs = np.geomspace(min(n), PAPER["trainable"], 100)
        ax.plot(xs, t["c"] * xs ** -t["alpha"], "--", color="gray", label=f"fit c·N^-{t['alpha']:.2f} (extrapolated)")
    ax.axhspan(-result["seed_spread"], result["seed_spread"], color="green", alpha=0.1, label="± seed spread")
    ax.plot([PAPER["trainable"]], [PAPER["gap_nats"]], "r*", ms=12, label="paper (470M, -3.3% ppl)")
    if a := result.get("ablation"):
        if a["gaps"]:
            ax.plot([a["binary_trainable"]], [statistics.mean(a["gaps"])], "s", color="purple",
                    label=f"binary {a['binary']} vs learned {a['learned']}")
    gap_axes(ax, "binary model's trainable parameters", "val loss gap, binary - learned (nats/token)", 8)
    for key, label in (("curve", "long run"), ("short", "default-length run")):
        c = (result.get("long") or {}).get(key) or []
        if c:
            line, = bx.plot([p[0] for p in c], [p[1] for p in c], label=label)
            bx.fill_between([p[0] for p in c], [p[2] for p in c], [p[3] for p in c], color=line.get_color(), alpha=0.2)
    bx.axhline(0, color="black", lw=0.8)
    bx.set_xlabel("training tokens seen")
    bx.set_title((result.get("long") or {}).get("point", ""), fontsize=9)
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def gap_axes(ax, xlabel, ylabel, legend_size, beside=False):
    """Finish a plot of the gap against a log x axis (parameters or tokens): the zero line, the
    labels, a grid and the legend (this tool's and share.py's); `beside`: the legend right of the
    axes, off the data."""
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if beside:
        ax.legend(fontsize=legend_size, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=legend_size)


def contrast(a, b):
    """Two finished studies (folders A and B), size by size: the binary-minus-learned gap in bits per byte
    (comparable across tokenizers), paired by seed. "Outside" means B's mean gap differs from A's by more than
    the larger max-min spread of the per-seed gaps. A markdown table."""
    def gaps(folder):
        path = os.path.join(folder, "results.json")
        if not os.path.isfile(path):
            raise ValueError(f"{path} not found: --contrast reads two finished studies")
        with open(path) as f:
            r = json.load(f)
        per_nat = {row["point"]: row["bits_per_byte"][0] / row["val_loss"][0] for row in r["rows"]}  # bits/byte per nat
        out = {point: [g * per_nat[point] for g in paired_gaps([x for x in runs if "diverged" not in x])]
               for point, runs in r["runs"].items()}
        return {point: g for point, g in out.items() if g}

    ga, gb = gaps(a), gaps(b)
    rows = []
    for p in sorted(set(ga) & set(gb), key=lambda p: [int(v) for v in p.split("-")[0].split("x")] + [p]):
        ma, mb = statistics.mean(ga[p]), statistics.mean(gb[p])
        spread = max(max(g) - min(g) for g in (ga[p], gb[p]))
        verdict = "needs 2 seeds" if min(len(ga[p]), len(gb[p])) < 2 else "yes" if abs(mb - ma) > spread else "no"
        seeds = f"{len(ga[p])}, {len(gb[p])}"
        rows.append([p, seeds, f"{ma:.4f}", f"{mb:.4f}", f"{mb - ma:+.4f}", f"{spread:.4f}", verdict])
    header = [("size", "l"), ("seeds", "r"), ("gap A (bits/byte)", "r"), ("gap B (bits/byte)", "r"), ("B - A", "r"),
              ("seed spread of the gap", "r"), ("outside it?", "l")]
    return f"A = {a}, B = {b}\n\n" + compare.markdown_table(header, rows)


def parse_config(argv=None):
    """The settings of a command line, --quick's or --gpu's values filled in."""
    return parse_command_line(ScalingConfig, __doc__, argv, presets=("quick", "gpu"))


def main(argv=None):
    args = parse_config(argv)
    if args.contrast:
        given = sys.argv[1:] if argv is None else argv
        ignored = [a.split("=")[0] for a in given if a.startswith("-") and a.split("=")[0] != "--contrast"]
        if ignored:
            raise ValueError(f"--contrast reads two finished studies and trains nothing: drop {', '.join(ignored)}")
        print(contrast(*args.contrast))
        return None
    check_at_least_1(args, "seeds", "steps", "evals", "jobs", "long_factor", "long_seeds", "batch_size", "eval_batches")
    parse_sizes(args.sizes), parse_sizes(args.affine_sizes, "--affine_sizes", allow_none=True)
    if args.ablation != "none" and len(parse_sizes(args.ablation, "--ablation")) != 1:
        raise ValueError(f"--ablation takes one size (e.g. 4x128) or none, got {args.ablation!r}")
    with writer_lock(args.out, outputs=("results.md", "results.json")):  # one sweep per folder at a time
        compare.check_results(args.out, ("results.md", "results.json", "scaling.png"))
        meta = compare.prepared(args)
        jobs = plan(args, meta["vocab_size"])
        for point, variant, seed in jobs:  # before any training: every run to be reused was trained as asked now
            compare.check_settings(compare.run_config(run_args(args, point), variant, seed))
        print(f"{len(jobs)} runs: " + ", ".join(f"{p[0]} {v} s{s}" for p, v, s in jobs), flush=True)
        every = run_all([(p[0], run_args(args, p), v, s) for p, v, s in jobs], args.jobs)
        runs_by_point, failed = finished(every)

        rows = size_rows(runs_by_point, meta)
        result = analyse(runs_by_point, args, meta["vocab_size"])
        header = (f"{args.steps} steps of {args.batch_size} x {args.block_size} tokens per run (long runs "
                  f"x{args.long_factor}), {args.seeds} seeds, lr {args.lr}, {args.n_head} heads; data {args.data} "
                  f"({meta['encoding']} cut to {meta['vocab_size']}, {meta['splits']['train']['tokens']:,} train / "
                  f"{meta['splits']['val']['tokens']:,} val tokens)")
        failed = "".join(f"\nDiverged, left out: {name} {r['variant']} seed {r['seed']}: {r['diverged']}"
                         for name, r in failed)
        compare.write_results(args.out, f"{header}\n\n{table(rows)}\n\n{reading(result)}{failed}\n",
                              {"rows": rows, "analysis": result, "runs": every},
                              ("scaling.png", lambda path: plot(result, path)))
    return rows, result


if __name__ == "__main__":
    # a study outlives a closed stdout (`| head`): its files are the record
    sys.exit(run_main(main, outlive_stdout=True))
