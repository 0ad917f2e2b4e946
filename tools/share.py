"""
Is the small-scale gap the input table's share of the parameters, or too little training? The
learned-vs-binary gap against the table's share (the same text cut to several vocabularies V) and
against training tokens per parameter (evaluations along each run).

    python -m tools.share --corpus janeausten.txt --jobs 2   # the study in docs/results.md, ~3 h on 2 CPU cores
    python -m tools.share --quick                            # tiny Shakespeare, tiny sizes, a few minutes

Design choices, up front:
- A point is (text, V, n_layer x n_embd, steps). Every run is compare.run_one (train.train, then a full
  validation pass), in <out>/<text>-V<V>/<L>x<D>-<steps>/<input>-seed<k>/; each (text, V) is prepared once
  into <out>/<text>-V<V>/data with prepare_data.py's defaults (ids 0 and 2^K-1 on bytes text never holds).
  Stop and rerun the same command: finished runs are read back, interrupted ones resume (only under the
  settings asked for now: compare.check_settings). Runs go seed by seed, so a stopped sweep has every point.
- The share is the learned table's V x n_embd over the learned model's trainable parameters (the paper's:
  67.1M of 536.9M, 12.5%). V moves two things at once: the share and the code's width K = ceil(log2 V).
  --depth_point moves the share at fixed V and width (another depth: the same code, the same lift);
  --width_point moves K at fixed V and shape (a wider injective code: model.canonical_code's parity bits).
- Units: within a point the gap is binary - learned validation loss of the same seed (same init stream,
  same data order), in nats per token, and as a perplexity ratio - 1 (the paper's unit, same tokenizer);
  across V, bits per byte (nats per token differ with V). Tokens per parameter count the binary model's
  trainable parameters; epochs are tokens seen over the training split's tokens.
- Verdicts, computed: the gap against our seed spread (compare.py's: the largest (max - min) / mean
  perplexity over seeds of either input) and against the paper's 4.8%. Along training, the evaluations use
  --eval_batches fixed validation batches (the same windows for every run); the final row uses all of them.
- The reading along tokens is a power law in tokens per parameter T, gap = c * T^-b, fitted to the mean
  gap over seeds at the evaluations past a quarter of the run (the warmup and first descent excluded),
  with a 16-84% range from resampling the seeds; it predicts the gap at the paper's T (~17B tokens over
  469.8M trainable, ~36). A mid-run evaluation is not a run trained to that length (the learning rate has
  not decayed yet): --short_steps trains the smallest V to a shorter end, to test that reading.
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

import math
import statistics
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from bincode_gpt.settings import check_at_least_1, parse_command_line, preset_setting, setting
from bincode_gpt.files import writer_lock
from model import code_bits
from tools import compare, scaling

PAPER = {"share": 67_108_864 / 536_937_472, "tokens_per_param": 17e9 / 469_828_608, "gap_pct": 2.36 / 2.44 - 1,
         "spread_pct": 0.048, "binary_trainable": 469_828_608}


@dataclass
class ShareConfig(compare.StudyShape):
    """The study in docs/results.md: Jane Austen, 4 x 128, V from 512 to 8,192, 3 seeds, ~3 h on 2 CPU cores
    with --jobs 2. --quick: tiny Shakespeare at tiny sizes, a few minutes."""
    corpus: list[str] = setting(["shakespeare"], "text to prepare (files, folders, 'shakespeare')", nargs="+")
    second: str = preset_setting("shakespeare", "a second text for one point (--second_vocab), or '' for none",
                                 quick="")
    encoding: str = setting("gpt2", "tiktoken encoding, cut to each of --vocabs")
    out: str = preset_setting("runs/share", "folder of the runs, the tables and the figure", quick="runs/share-quick")
    quick: bool = setting(False, "tiny sizes, a few minutes: each setting's --quick value below")
    vocabs: str = preset_setting("512,1024,2048,8192", "vocabularies V to cut the encoding to", quick="512,1024")
    steps: str = preset_setting("4400,1600,1200,600", "training steps at each of --vocabs (one each)", quick="60,40")
    size: str = preset_setting("4x128", "the decoder, n_layer x n_embd", quick="2x32")
    affine_vocabs: str = preset_setting("1024", "vocabularies whose point also trains the affine input", quick="512")
    depth_point: str = preset_setting("1024:1x128", "V:LxD, the share moved at fixed V by depth, or ''",
                                      quick="512:1x32")
    width_point: str = preset_setting("1024:16", "V:W, the code's width moved to W bits at fixed V and shape (binary, "
                                      "beside that V's learned runs), or ''", quick="512:12")
    short_steps: int = preset_setting(1200, "the smallest V also trained to this many steps (0: not)", quick=30)
    second_vocab: int = setting(1024, "the vocabulary of the --second text's point (the shape of --size)")
    second_steps: int = preset_setting(800, "training steps of the --second point", quick=40)
    seeds: int = preset_setting(3, "seeds per point", quick=2)
    evals: int = preset_setting(16, "evaluations along each run", quick=4)
    lr: float = setting(2e-3, "peak learning rate (min_lr = lr / 10)")
    eval_batches: int = preset_setting(16, "validation batches per evaluation", quick=2)
    jobs: int = setting(1, "runs in parallel, each with cores/jobs threads")
    device: str = setting("auto", "auto | cpu | cuda | mps")


def ints(text, flag):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be positive integers separated by commas, got {text!r}")
    return values


def points(args):
    """Every point, most central first: [dict(text, corpus, vocab, L, D, steps, variants)]."""
    (L, D), = scaling.parse_sizes(args.size, "--size")
    vocabs, steps = ints(args.vocabs, "--vocabs"), ints(args.steps, "--steps")
    if len(vocabs) != len(steps):
        raise ValueError(f"--steps needs one value per --vocabs ({len(vocabs)}), got {len(steps)}")
    affine = set(ints(args.affine_vocabs, "--affine_vocabs")) if args.affine_vocabs else set()
    text = os.path.splitext(os.path.basename(args.corpus[0]))[0] if len(args.corpus) == 1 else "mix"
    def point(role, text=text, corpus=args.corpus, *, vocab, L=L, D=D, steps, extra=()):
        return dict(role=role, text=text, corpus=corpus, vocab=vocab, L=L, D=D, steps=steps,
                    variants=("learned", "binary") + tuple(extra))

    out = [point("axis", vocab=v, steps=s, extra=("affine",) if v in affine else ()) for v, s in zip(vocabs, steps)]
    if args.short_steps:
        out.append(point("short", vocab=vocabs[0], steps=args.short_steps))
    if args.depth_point:
        v, size = args.depth_point.split(":") if ":" in args.depth_point else ("", "")
        if not v.isdigit():
            raise ValueError(f"--depth_point must look like 1024:1x128, got {args.depth_point!r}")
        (dl, dd), = scaling.parse_sizes(size, "--depth_point")
        at = steps[vocabs.index(int(v))] if int(v) in vocabs else steps[0]
        out.append(point("depth", vocab=int(v), L=dl, D=dd, steps=at))
    if args.width_point:
        v, w = (args.width_point.split(":") + [""])[:2]
        if not (v.isdigit() and w.isdigit() and int(v) in vocabs):
            raise ValueError(f"--width_point must look like 1024:16, its V one of --vocabs, got {args.width_point!r}")
        at = steps[vocabs.index(int(v))]
        out.append({**point("width", vocab=int(v), steps=at), "variants": ("binary",), "width": int(w)})
    if args.second:
        second = os.path.splitext(os.path.basename(args.second))[0]
        out.append(point("second", second, [args.second], vocab=args.second_vocab, steps=args.second_steps))
    return out


def name(p):
    return f"{p['text']}-V{p['vocab']}/{p['L']}x{p['D']}-{p['steps']}" + (f"-w{p['width']}" if p.get("width") else "")


def data_of(args, p):
    """The (text, V) folder's prepared data (prepared on first use) and its meta.json."""
    data = SimpleNamespace(corpus=p["corpus"], data=None, out=os.path.join(args.out, f"{p['text']}-V{p['vocab']}"),
                           encoding=args.encoding, vocab_size=p["vocab"], reserve_zero=True, reserve_ones=True)
    meta = compare.prepared(data)
    return data.data, meta


def run_settings(args, p, data):
    return SimpleNamespace(out=os.path.join(args.out, name(p)), data=data, preset="small", device=args.device,
                           n_layer=p["L"], n_head=args.n_head, n_embd=p["D"], block_size=args.block_size,
                           batch_size=args.batch_size, steps=p["steps"], lr=args.lr, evals=args.evals,
                           eval_batches=args.eval_batches, compile=False, code_width=p.get("width", 0))


def counts(p, args):
    """Trainable parameters of the point's learned and binary models, and the learned table's share."""
    learned, binary = (scaling.trainable(p["L"], p["D"], v, args, p["vocab"]) for v in ("learned", "binary"))
    return learned, binary, p["vocab"] * p["D"] / learned


# ----------------------------------------------------------------------------- analysis
def spread(runs):
    """compare.py's seed spread: the largest (max - min) / mean perplexity over seeds of any input."""
    out = 0.0
    for v in {r["variant"] for r in runs}:
        ppl = [math.exp(r["val_loss"]) for r in runs if r["variant"] == v]
        if len(ppl) > 1:
            out = max(out, (max(ppl) - min(ppl)) / statistics.mean(ppl))
    return out


def fit_tokens(curve, per_param, draws=1000, seed=0):
    """gap = c * T^-b on the mean gap past a quarter of the run; b, the gap predicted at the paper's T, their
    16-84% ranges over seed resamples. None when fewer than 3 evaluations or a mean gap <= 0."""
    late = [(t / per_param, g) for t, g in curve if t >= curve[-1][0] / 4 and t > 0]
    if len(late) < 3:
        return None
    T = np.log([t for t, _ in late])
    gaps = np.array([g for _, g in late])  # (evaluations, seeds)

    def fit(mean):
        if (mean <= 0).any():
            return None
        slope, icpt = np.polyfit(T, np.log(mean), 1)
        return -slope, math.exp(icpt) * PAPER["tokens_per_param"] ** slope

    best = fit(gaps.mean(1))
    if best is None:
        return None
    rng, draws_ok = np.random.default_rng(seed), []
    for _ in range(draws):
        f = fit(gaps[:, rng.integers(0, gaps.shape[1], gaps.shape[1])].mean(1))
        if f is not None:
            draws_ok.append(f)
    q = lambda xs: (float(np.quantile(xs, 0.16)), float(np.quantile(xs, 0.84)))  # noqa: E731
    return {"b": best[0], "at_paper": best[1], "b_range": q([d[0] for d in draws_ok]),
            "at_paper_range": q([d[1] for d in draws_ok]), "draws": len(draws_ok)}


def analyse(args, pts, records, metas):
    """One row per (point, input other than learned), with everything the tables and figure need."""
    rows = []
    for p in pts:
        runs = records.get(name(p), [])
        if p.get("width"):  # a wider code changes no table: the width point's learned runs are its V's axis runs
            runs = runs + [r for r in records.get(name({**p, "width": 0}), []) if r["variant"] == "learned"]
        runs = [r for r in runs if "diverged" not in r]
        meta = metas[name(p)]
        val, train = meta["splits"]["val"], meta["splits"]["train"]["tokens"]
        per_byte = val["tokens"] / val["bytes"] / math.log(2)  # nats/token -> bits/byte
        learned_n, binary_n, share = counts(p, args)
        tokens = p["steps"] * args.batch_size * args.block_size
        learned = {r["seed"]: r["val_loss"] for r in runs if r["variant"] == "learned"}
        for variant in (v for v in p["variants"] if v != "learned"):
            mine = {r["seed"]: r["val_loss"] for r in runs if r["variant"] == variant}
            seeds = sorted(set(mine) & set(learned))
            gaps = [mine[s] - learned[s] for s in seeds]
            pct = [math.exp(g) - 1 for g in gaps]
            sp = spread([r for r in runs if r["seed"] in seeds and r["variant"] in ("learned", variant)])
            m = statistics.mean(pct) if pct else math.nan
            curve = scaling.seed_gaps(runs, variant)
            rows.append({
                "point": name(p), "role": p["role"], "text": p["text"], "vocab": p["vocab"],
                "K": p.get("width") or code_bits(p["vocab"]), "size": f"{p['L']}x{p['D']}", "steps": p["steps"],
                "input": variant, "seeds": len(seeds),
                "learned_trainable": learned_n, "binary_trainable": binary_n, "share": share, "tokens": tokens,
                "tokens_per_param": tokens / binary_n, "epochs": tokens / train, "bits_per_nat": per_byte,
                "learned_bpb": [learned[s] * per_byte for s in seeds], "bpb": [mine[s] * per_byte for s in seeds],
                "gap_nats": gaps, "gap_pct": pct, "spread": sp,
                "inside_spread": (abs(m) <= sp) if len(seeds) > 1 else None,
                "inside_paper": abs(m) <= PAPER["spread_pct"] if pct else None,
                "curve": [(t, [math.exp(g) - 1 for g in gs]) for t, gs in curve],
                "fit": fit_tokens(curve, binary_n) if len(seeds) > 1 else None,
                "diverged": [f"{r['variant']} seed {r['seed']}" for r in records.get(name(p), []) if "diverged" in r]})
    return rows


def ppl_pct(gap):
    """A gap in nats as a perplexity ratio - 1, in percent; inf where a fit's extrapolation overflows."""
    return 100 * math.expm1(gap) if gap < 700 else math.inf


def ms(xs, fmt, scale=1.0):
    """mean ± std of xs (times scale), or a dash when there is none."""
    if not xs:
        return "—"
    std = f" ± {scale * statistics.stdev(xs):{fmt.lstrip('+')}}" if len(xs) > 1 else ""
    return f"{scale * statistics.mean(xs):{fmt}}{std}"


def yes_no(flag):
    return "—" if flag is None else "inside" if flag else "OUTSIDE"


def end_table(rows):
    header = [("text", "l"), ("V (K)", "r"), ("size", "l"), ("input", "l"), ("seeds", "r"), ("table share", "r"),
              ("tokens/param", "r"), ("epochs", "r"), ("learned bits/byte", "r"), ("bits/byte", "r"),
              ("gap (bits/byte)", "r"), ("gap (perplexity)", "r"), ("seed spread", "r"), ("vs spread", "l"),
              ("vs paper's 4.8%", "l")]
    return compare.markdown_table(header, [[
        r["text"], f"{r['vocab']:,} ({r['K']})", r["size"], r["input"], str(r["seeds"]), f"{100 * r['share']:.1f}%",
        f"{r['tokens_per_param']:.2f}", f"{r['epochs']:.2f}", ms(r["learned_bpb"], ".4f"), ms(r["bpb"], ".4f"),
        ms([g * r["bits_per_nat"] for g in r["gap_nats"]], ".4f"), ms(r["gap_pct"], "+.1f", 100) + "%",
        f"{100 * r['spread']:.1f}%", yes_no(r["inside_spread"]), yes_no(r["inside_paper"])] for r in rows])


def curve_table(rows, fractions=(1 / 8, 1 / 4, 1 / 2, 1)):
    """The gap along each binary run at a few fractions of its length (the --eval_batches evaluations)."""
    body = []
    for r in rows:
        if r["input"] != "binary" or not r["curve"]:
            continue
        cells = []
        for f in fractions:
            t, pct = min(r["curve"], key=lambda e: abs(e[0] - f * r["tokens"]))
            cells.append(f"{t / r['binary_trainable']:.2f}: {ms(pct, '+.1f', 100)}%")
        fit = r["fit"]
        body.append([f"{r['text']} V={r['vocab']:,} {r['size']} ({100 * r['share']:.1f}%)", str(r["seeds"]), *cells,
                     "—" if not fit else f"{fit['b']:.2f} ({fit['b_range'][0]:.2f} to {fit['b_range'][1]:.2f})",
                     "—" if not fit else f"{ppl_pct(fit['at_paper']):+.1f}% "
                                         f"({ppl_pct(fit['at_paper_range'][0]):+.1f} to "
                                         f"{ppl_pct(fit['at_paper_range'][1]):+.1f})"])
    header = [("point (table share)", "l"), ("seeds", "r")]
    header += [(f"at {f:g} of the run: T: gap", "r") for f in fractions]
    header += [("b in gap ~ T^-b (16-84%)", "r"), (f"gap at the paper's T = {PAPER['tokens_per_param']:.0f}", "r")]
    return compare.markdown_table(header, body)


def at_tokens(r, T):
    """The mean gap (perplexity ratio - 1) of a row's curve at T tokens per parameter, interpolated;
    None past its end."""
    ts = [t / r["binary_trainable"] for t, _ in r["curve"]]
    if len(ts) < 2 or not ts[0] <= T <= ts[-1]:
        return None
    return float(np.interp(T, ts, [statistics.mean(g) for _, g in r["curve"]]))


def side_by_side(a, b):
    """The two rows' mean gaps at the larger T both reach: (T, gap a, gap b), or None."""
    if not a["curve"] or not b["curve"]:
        return None
    T = min(a["curve"][-1][0] / a["binary_trainable"], b["curve"][-1][0] / b["binary_trainable"])
    ga, gb = at_tokens(a, T), at_tokens(b, T)
    return None if ga is None or gb is None else (T, ga, gb)


def beside_axis(binary, axis, role, key):
    """(axis row, row, side_by_side of the two) for each row of `role` that has an axis row of its
    vocabulary and its `key` (text or size) to stand beside, at a T both reach."""
    for row in (r for r in binary if r["role"] == role):
        same = [r for r in axis if r["vocab"] == row["vocab"] and r[key] == row[key]]
        if same and (sbs := side_by_side(same[0], row)):
            yield same[0], row, sbs


def reading(rows):
    """Sentences computed from the rows: each point's verdicts, the gap against share (V moved, then depth
    moved), the mid-run check, the second text, and what the fits predict at the paper's tokens per parameter."""
    out = []
    binary = [r for r in rows if r["input"] == "binary" and r["seeds"]]
    for r in binary:
        out.append(f"- {r['text']} V={r['vocab']:,} {r['size']}, {r['steps']} steps (share {100 * r['share']:.1f}%, "
                   f"{r['tokens_per_param']:.2f} tokens/param): binary {ms(r['gap_pct'], '+.1f', 100)}% perplexity vs "
                   f"learned, {yes_no(r['inside_spread'])} our seed spread ({100 * r['spread']:.1f}%), "
                   f"{yes_no(r['inside_paper'])} the paper's 4.8%.")
    axis = sorted((r for r in binary if r["role"] == "axis"), key=lambda r: r["share"])
    # the gap against share at one tokens-per-parameter every axis point reaches (interpolated on its curve)
    common = min((r["curve"][-1][0] / r["binary_trainable"] for r in axis if r["curve"]), default=0)
    at = [(r["share"], g) for r in axis if (g := at_tokens(r, common)) is not None]
    if len(at) >= 2:
        slope, icpt = np.polyfit([s for s, _ in at], [g for _, g in at], 1)
        out.append(f"Against share (V moved), at T = {common:.2f} tokens per parameter (reached by every V): "
                   + ", ".join(f"{100 * s:.1f}% -> {100 * g:+.1f}%" for s, g in at)
                   + f"; a line through them: {slope:+.2f} points of gap per point of share, "
                     f"{100 * (icpt + slope * PAPER['share']):+.1f}% at the paper's share "
                     f"({100 * PAPER['share']:.1f}%).")
    for base, depth, (T, ga, gb) in beside_axis(binary, axis, "depth", "text"):
        out.append(f"Share moved at fixed V={depth['vocab']:,} (same width, same code) by depth, at T = {T:.2f}: "
                   f"{base['size']} (share {100 * base['share']:.1f}%) {100 * ga:+.1f}%, {depth['size']} "
                   f"(share {100 * depth['share']:.1f}%) {100 * gb:+.1f}%: the larger share has the "
                   f"{'larger' if (gb > ga) == (depth['share'] > base['share']) else 'smaller'} gap.")
    short = [r for r in binary if r["role"] == "short"]
    long = [r for r in axis if short and r["vocab"] == short[0]["vocab"]]
    if short and long and short[0]["curve"] and long[0]["curve"]:
        short, long = short[0], long[0]
        t, pct = min(long["curve"], key=lambda e: abs(e[0] - short["tokens"]))
        out.append(f"Mid-run vs trained to that length (V={short['vocab']:,}): at {t / short['binary_trainable']:.2f} "
                   f"tokens/param the long run's evaluation reads {ms(pct, '+.1f', 100)}%, the run that ends there "
                   f"{ms(short['curve'][-1][1], '+.1f', 100)}% (same evaluation batches).")
    for wide in (r for r in binary if r["role"] == "width"):
        same = [r for r in axis if r["vocab"] == wide["vocab"] and r["size"] == wide["size"] and r["gap_pct"]]
        if same and wide["gap_pct"]:
            a, sp = same[0], max(same[0]["spread"], wide["spread"])
            d = statistics.mean(wide["gap_pct"]) - statistics.mean(a["gap_pct"])
            out.append(f"Code width moved at fixed V={wide['vocab']:,} and shape ({wide['size']}, the same learned "
                       f"runs): K = {a['K']} bits {ms(a['gap_pct'], '+.1f', 100)}%, W = {wide['K']} bits "
                       f"{ms(wide['gap_pct'], '+.1f', 100)}%: the wider code's gap is {100 * abs(d):.1f} points "
                       f"{'smaller' if d < 0 else 'larger'}, {yes_no(abs(d) <= sp)} our seed spread ({100 * sp:.1f}%).")
    for base, second, (T, ga, gb) in beside_axis(binary, axis, "second", "size"):
        out.append(f"Second text, V={second['vocab']:,} {second['size']} at T = {T:.2f}: {base['text']} "
                   f"{100 * ga:+.1f}%, {second['text']} {100 * gb:+.1f}% ({second['epochs']:.1f} epochs of it).")
    if axis:
        near = min(axis, key=lambda r: abs(r["share"] - PAPER["share"]))
        if fit := near["fit"]:
            pct = ppl_pct
            lo, hi = (pct(g) for g in fit["at_paper_range"])
            out.append(f"At the paper's regime (share {100 * PAPER['share']:.1f}%, "
                       f"T = {PAPER['tokens_per_param']:.0f}): our nearest point (V={near['vocab']:,}, share "
                       f"{100 * near['share']:.1f}%) ends at T = {near['tokens_per_param']:.2f}; its fit gap ~ "
                       f"T^-{fit['b']:.2f} predicts {pct(fit['at_paper']):+.1f}% there (16-84% over seeds {lo:+.1f} "
                       f"to {hi:+.1f}; an extrapolation {PAPER['tokens_per_param'] / near['tokens_per_param']:.0f}x "
                       f"past the data, at a model {PAPER['binary_trainable'] / near['binary_trainable']:.0f}x "
                       f"smaller than the paper's).")
    return "\n".join(out)


def plot(rows, path):
    """The gap (perplexity %) against tokens per binary parameter, one line per point, seed min-max bands."""
    if (plt := compare.pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(11, 5))
    for r in rows:
        if r["input"] != "binary" or not r["curve"]:
            continue
        c = [(t / r["binary_trainable"], g) for t, g in r["curve"] if t > 0]
        label = (f"{r['text']} V={r['vocab']:,} (K={r['K']}) {r['size']}, {r['steps']:,} steps: "
                 f"share {100 * r['share']:.1f}%")
        line, = ax.plot([t for t, _ in c], [100 * statistics.mean(g) for _, g in c], label=label)
        ax.fill_between([t for t, _ in c], [100 * min(g) for _, g in c], [100 * max(g) for _, g in c],
                        color=line.get_color(), alpha=0.15)
    ax.axhspan(-100 * PAPER["spread_pct"], 100 * PAPER["spread_pct"], color="green", alpha=0.08,
               label="± the paper's 4.8% seed spread")
    ax.plot([PAPER["tokens_per_param"]], [100 * PAPER["gap_pct"]], "r*", ms=12, label="paper (share 12.5%)")
    scaling.gap_axes(ax, "training tokens per trainable parameter of the binary model",
                     "binary vs learned perplexity (%)", 7, beside=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: same results, same bytes
    plt.close(fig)
    return path


def parse_config(argv=None):
    return parse_command_line(ShareConfig, __doc__, argv, presets=("quick",))


def main(argv=None):
    args = parse_config(argv)
    check_at_least_1(args, "seeds", "evals", "jobs", "batch_size", "eval_batches", "block_size", "n_head")
    pts = points(args)
    with writer_lock(args.out, outputs=("results.md", "results.json")):  # one sweep per folder at a time
        compare.check_results(args.out, ("results.md", "results.json", "share.png"))
        data, metas = {}, {}
        for p in pts:
            data[name(p)], metas[name(p)] = data_of(args, p)
        # seed by seed, the axis points nearest the paper's share first: a stopped sweep has every point
        first = sorted(pts, key=lambda p: (p["role"] != "axis", abs(math.log(counts(p, args)[2] / PAPER["share"]))))
        work = [(name(p), run_settings(args, p, data[name(p)]), v, s)
                for s in range(args.seeds) for p in first for v in p["variants"]]
        for _, run, v, s in work:  # before any training: every run to be reused was trained as asked now
            compare.check_settings(compare.run_config(run, v, s))
        print(f"{len(work)} runs over {len(pts)} points: " + ", ".join(dict.fromkeys(name(p) for p in pts)), flush=True)
        records = scaling.run_all(work, args.jobs)
        rows = analyse(args, pts, records, metas)
        header = (f"{args.batch_size} x {args.block_size} tokens a step, lr {args.lr}, {args.n_head} heads, "
                  f"{args.seeds} seeds, {args.encoding} cut to each V; evaluations along the runs on "
                  f"{args.eval_batches} validation batches, the final columns on the whole validation split")
        report = (f"{header}\n\n{end_table(rows)}\n\n"
                  f"Along training (T = tokens per binary parameter; gap in perplexity):\n\n{curve_table(rows)}\n\n"
                  f"{reading(rows)}\n"
                  + "".join(f"\nDiverged, left out: {r['point']} {d}" for r in rows for d in r["diverged"]))
        compare.write_results(args.out, report, {"rows": rows, "runs": records},
                              ("share.png", lambda path: plot(rows, path)))
    return rows


if __name__ == "__main__":
    # a study outlives a closed stdout (`| head`): its files are the record
    sys.exit(run_main(main, outlive_stdout=True))
