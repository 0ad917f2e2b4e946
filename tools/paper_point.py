"""
The paper's point, measured: the learned-vs-binary gap at the paper's table share (12.5%) and training
length (~36 tokens per trainable parameter of the binary model), at several model sizes.

    python -m tools.paper_point --corpus tinyshakespeare.txt janeausten.txt kjv.txt --jobs 2 --out runs/paper
    python -m tools.paper_point --quick            # tiny sizes on tiny Shakespeare, a few minutes
    python -m tools.paper_point ... --report       # train nothing: report the runs that finished
    # a third size, 3 x 96 at V = 512 (11.4% share; T = 33 keeps it under 3 epochs of that text), at the lrs the
    # sweep above chose at 4 x 32 (8e-3 for learned and binary; its own one-lr "sweep" only records that lr):
    python -m tools.paper_point --corpus ... --jobs 2 --out runs/paper512 --vocab 512 --sizes 3x96 \
        --tokens_per_param 33 --seeds 3 --smallest_seeds 3 --controls "" --lrs 8e-3 --sweep_seeds 1 \
        --sweep_tokens_per_param 0.5 --shared_lr 8e-3

Design choices, up front:
- The text: every --corpus file cut into documents of about --doc_chars characters at line ends
  (prepare_data.py --doc_chars), so every 10th document, the validation split, samples every source
  along its length. Each source's share of the validation split is recorded, and every run is evaluated
  on each source's own validation windows (per-source bits per byte; their token-weighted sum is the
  whole split's).
- Sizes sit at the paper's share: a learned table of V x D is 12.5% of the learned model's trainable
  parameters when V = 2 L D (12 D^2 per block, an untied V x D head). At V = 257 (GPT-2's 256 bytes and
  end-of-text, the smallest cut) that is L x D = 128: 4 x 32 and 2 x 64. Each run trains --tokens_per_param
  tokens per binary trainable parameter (model.py's count), whole steps of --batch_size x --block_size.
- The lr is chosen before the main runs, per input, by a sweep at the smallest size and --sweep_tokens_per_param:
  the lr with the lowest mean validation loss over --sweep_seeds seeds (last evaluation, --sweep_eval_batches
  fixed batches). Every main run trains at its input's lr; learned and binary also at --shared_lr (the
  earlier studies' one lr for every input) at the smallest size, reported beside them.
- Paired: model.GPT draws a seed's decoder and head the same whatever the input, and the seed fixes the data
  order, so a seed's gap pays for the input alone. The gap of seed s is loss(input) - loss(learned) on the
  whole validation split, in nats per token; its perplexity form exp(gap) - 1. Over seeds: mean, sd and a 95%
  t interval; the verdicts are computed from the interval: does it exclude 0, does it lie inside the paper's
  +-4.8%. The earlier studies' rule (section 8: the gap against the seed range over mean perplexity, which
  widens as seeds are added) is printed beside them, labelled.
- Runs are compare.run_one's (train.train), in <out>/<text>-V<V>/<L>x<D>-T<T>-lr<lr>/<input>-seed<k>/;
  stop and rerun the same command: finished runs are read back, interrupted ones resume. Stages run in
  order: the learned and binary sweep, their main runs at three seeds, the controls' sweep, the remaining
  seeds and the controls, the shared lr.
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bincode_gpt.cli import quiet_interrupt  # first: Ctrl-C during the imports (torch's take seconds) exits 130 with one line
quiet_interrupt(__name__)

import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain
from multiprocessing import get_context
from types import SimpleNamespace

import numpy as np
import torch

from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.cli import config_parser, parse_settings, preset_setting, resolve_presets, run_main, setting
from bincode_gpt.files import atomic_write, writer_lock
from bincode_gpt.inputs import read_documents, resolve_input
from bincode_gpt.tokenizer import get_tokenizer
from model import code_bits
from prepare_data import cut_documents, split_documents
from tools import compare, scaling, share

PAPER = share.PAPER


@dataclass
class PaperPointConfig:
    """The study in docs/results.md section 9. --quick: tiny sizes on tiny Shakespeare, a few minutes."""
    corpus: list[str] = setting(["shakespeare"], "text files, one source each", nargs="+")
    doc_chars: int = preset_setting(20000, "documents of about this many characters (prepare_data.py --doc_chars)",
                                    quick=4000)
    encoding: str = setting("gpt2", "tiktoken encoding, cut to --vocab")
    vocab: int = setting(257, "the vocabulary V (257: GPT-2's bytes and end-of-text)")
    out: str = preset_setting("runs/paper", "folder of the runs, the tables and the figure", quick="runs/paper-quick")
    quick: bool = setting(False, "tiny sizes, a few minutes: each setting's --quick value below")
    sizes: str = preset_setting("4x32,2x64", "decoder sizes n_layer x n_embd, smallest first", quick="2x16,1x32")
    tokens_per_param: float = preset_setting(36.0, "training tokens per binary trainable parameter", quick=4.0)
    seeds: int = preset_setting(3, "seeds of learned and binary at each size", quick=2)
    smallest_seeds: int = preset_setting(5, "seeds of learned and binary at the smallest size", quick=3)
    controls: str = setting("affine,random", "inputs also run at the smallest size (besides learned, binary)")
    control_seeds: int = preset_setting(3, "seeds of each control", quick=2)
    lrs: str = setting("2e-3,4e-3,8e-3", "the lr sweep's grid (peak lr; min_lr = lr / 10)")
    sweep_tokens_per_param: float = preset_setting(9.0, "the sweep's training length", quick=2.0)
    sweep_seeds: int = setting(2, "seeds of each lr in the sweep")
    sweep_eval_batches: int = preset_setting(32, "validation batches of the sweep's last evaluation", quick=4)
    shared_lr: float = setting(2e-3, "the one lr of the earlier studies, run beside the chosen ones")
    n_head: int = preset_setting(4, "attention heads", quick=2)
    block_size: int = preset_setting(128, "context length in tokens", quick=32)
    batch_size: int = preset_setting(16, "sequences per step", quick=4)
    evals: int = preset_setting(12, "evaluations along each main run", quick=4)
    eval_batches: int = preset_setting(8, "validation batches per evaluation along a run", quick=2)
    jobs: int = setting(1, "runs in parallel, each with cores/jobs threads")
    device: str = setting("cpu", "auto | cpu | cuda | mps")
    report: bool = setting(False, "train nothing: report the runs that finished, list the others")
    also: list[str] = setting([], "other studies' folders (their results.json) whose sizes join the gap-vs-size "
                                  "fit", nargs="*")


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


def counts(args, L, D):
    """model.py's trainable parameters of the learned and the binary model of a size."""
    return {v: scaling.trainable(L, D, v, args, args.vocab) for v in ("learned", "binary")}


def steps_for(args, L, D, tokens_per_param):
    """Whole steps that train closest to tokens_per_param tokens per binary trainable parameter."""
    return max(1, round(tokens_per_param * counts(args, L, D)["binary"] / (args.batch_size * args.block_size)))


def point(args, role, L, D, tokens_per_param, lr):
    steps = steps_for(args, L, D, tokens_per_param)
    return dict(role=role, L=L, D=D, steps=steps, lr=lr,
                name=f"{text_name(args)}-V{args.vocab}/{L}x{D}-T{tokens_per_param:g}-lr{lr:g}")


def run_settings(args, p, data):
    sweep = p["role"] == "sweep"
    return SimpleNamespace(out=os.path.join(args.out, p["name"]), data=data, preset="small", device=args.device,
                           n_layer=p["L"], n_head=args.n_head, n_embd=p["D"], block_size=args.block_size,
                           batch_size=args.batch_size, steps=p["steps"], lr=p["lr"], evals=2 if sweep else args.evals,
                           eval_batches=args.sweep_eval_batches if sweep else args.eval_batches, compile=False,
                           code_width=0, full_val=False)  # the main runs are evaluated per source, below


def data_of(args):
    data = SimpleNamespace(corpus=args.corpus, data=None, out=os.path.join(args.out, f"{text_name(args)}-V{args.vocab}"),
                           encoding=args.encoding, vocab_size=args.vocab, reserve_zero=True, reserve_ones=True,
                           doc_chars=args.doc_chars)
    meta = compare.prepared(data)
    return data.data, meta


# ----------------------------------------------------------------------------- the plan
def sweep_points(args):
    (L, D) = scaling.parse_sizes(args.sizes)[0]
    return [point(args, "sweep", L, D, args.sweep_tokens_per_param, lr) for lr in floats(args.lrs, "--lrs")]


def best_lr(records, sweep, variant, seeds):
    """The sweep's lr with the lowest mean loss over seeds for an input (a diverged seed counts as inf),
    or None before the sweep has every seed of every lr."""
    means = {}
    for p in sweep:
        runs = [r for r in records.get(p["name"], []) if r["variant"] == variant]
        if len(runs) < seeds:
            return None
        means[p["lr"]] = statistics.mean(r.get("val_loss", math.inf) for r in runs)
    return min(means, key=means.get)


def stages(args, records):
    """The stages, in order, as [(title, [(point, input, seed)])]; a stage that needs the sweep's lr of an input
    whose sweep has not finished is left out (the next command runs it)."""
    sizes = scaling.parse_sizes(args.sizes)
    sweep, controls = sweep_points(args), [c for c in args.controls.split(",") if c]
    lr = {v: best_lr(records, sweep, v, args.sweep_seeds) for v in ("learned", "binary", *controls)}

    def main(v, L, D, seeds, at=None):
        chosen = at or lr[v]
        if chosen is None:
            return []
        role = "main" if at is None else "shared"
        return [(point(args, role, L, D, args.tokens_per_param, chosen), v, s) for s in seeds]

    smallest, first = sizes[0], range(min(args.seeds, args.smallest_seeds))
    out = [("sweep: learned, binary", [(p, v, s) for s in range(args.sweep_seeds) for p in sweep
                                       for v in ("learned", "binary")])]
    out.append(("main: learned, binary", [j for s in first for L, D in sizes for v in ("learned", "binary")
                                          for j in main(v, L, D, [s])]))
    out.append(("sweep: controls", [(p, v, s) for s in range(args.sweep_seeds) for p in sweep for v in controls]))
    out.append(("main: the smallest size's other seeds, the controls",
                [j for v in ("learned", "binary") for j in main(v, *smallest, range(len(first), args.smallest_seeds))]
                + [j for s in range(args.control_seeds) for v in controls for j in main(v, *smallest, [s])]))
    out.append(("shared lr", [j for s in first for v in ("learned", "binary")
                              for j in main(v, *smallest, [s], at=args.shared_lr)]))
    return out


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
    if sum(len(s["tokens"]) for s in out.values()) != val["tokens"] or sum(s["bytes"] for s in out.values()) != val["bytes"]:
        raise ValueError("the validation documents recomputed per source do not add up to the prepared split: "
                         "was the data prepared from these files with these settings?")
    return out


@torch.no_grad()
def source_losses(run_dir, windows, batch_size=16):
    """Mean loss per token on each source's validation windows (block_size + 1 tokens at stride block_size,
    as windows.Split reads a split), from a run's final checkpoint: {source: (loss, windows)}."""
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


def _evaluate(job):
    run_dir, windows = job
    torch.set_num_threads(1)
    path = os.path.join(run_dir, "sources.json")
    atomic_write(path, json.dumps(source_losses(run_dir, windows)))
    return path


def evaluate_sources(run_dirs, windows, jobs):
    """sources.json in each finished run folder that lacks one, `jobs` at a time."""
    todo = [(d, windows) for d in run_dirs if os.path.exists(os.path.join(d, "final.json"))
            and not os.path.exists(os.path.join(d, "sources.json"))]
    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            list(pool.map(_evaluate, todo))
    else:
        for job in todo:
            _evaluate(job)


# ----------------------------------------------------------------------------- running it
def read_records(args, plan):
    """The records of every planned run that finished (compare.run_one reads a finished run back)."""
    records = {}
    for _, work in plan:
        for p, v, s in work:
            if os.path.exists(os.path.join(args.out, p["name"], f"{v}-seed{s}", "final.json")):
                run = run_settings(args, p, os.path.join(args.out, f"{text_name(args)}-V{args.vocab}", "data"))
                rec = compare.run_one(run, None, v, s)
                records.setdefault(p["name"], []).append(rec)
    return records


def train_all(args, data, windows):
    """Every stage in order; the plan is redrawn after each, as the sweep's lrs become known."""
    done = set()
    while True:
        plan = stages(args, read_records(args, stages(args, {})))  # the sweep's records give the main runs' lrs
        todo = [(title, work) for title, work in plan if title not in done and work]
        if not todo:
            return
        title, work = todo[0]
        print(f"\n### stage: {title}: {len(work)} runs", flush=True)
        runs = [(p["name"], run_settings(args, p, data), v, s) for p, v, s in work]
        for _, run, v, s in runs:
            compare.check_settings(compare.run_config(run, v, s))
        scaling.run_all(runs, args.jobs)
        evaluate_sources(main_run_dirs(args, plan), windows, args.jobs)
        done.add(title)


def main_run_dirs(args, plan):
    return [os.path.join(args.out, p["name"], f"{v}-seed{s}") for _, work in plan for p, v, s in work
            if p["role"] != "sweep"]


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


def line_fit(x, y, at):
    """Least squares y = a + b x over points (x, y), and the 95% t interval of the fitted mean at x = at:
    (b, prediction, lo, hi), or None under three points or two distinct x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or len(set(x.tolist())) < 2:
        return None
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    s = math.sqrt((resid ** 2).sum() / (len(x) - 2))
    se = s * math.sqrt(1 / len(x) + (at - x.mean()) ** 2 / ((x - x.mean()) ** 2).sum())
    half = t_quantile(0.975, len(x) - 2) * se
    return b, a + b * at, a + b * at - half, a + b * at + half


# ----------------------------------------------------------------------------- the report
def whole_loss(losses):
    """A run's loss per token on the whole validation split from its per-source (loss, windows)."""
    return sum(l * n for l, n in losses.values()) / sum(n for _, n in losses.values())


def run_losses(args, p, v, s):
    """sources.json of a run: {source: (loss, windows)}, or None (not finished, diverged or not evaluated)."""
    path = os.path.join(args.out, p["name"], f"{v}-seed{s}", "sources.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return {k: tuple(x) for k, x in json.load(f).items()}


def pct(nats):
    return 100 * math.expm1(nats)


def ci_text(ci):
    if ci is None:
        return "—"
    return f"{pct(ci['mean']):+.2f}% ({pct(ci['lo']):+.2f} to {pct(ci['hi']):+.2f})"


def main_rows(args, plan, windows, meta):
    """One row per (role, size, input other than learned): paired per-seed gaps against learned of the same
    role and size (each at its own lr, or both at the shared lr), with everything the tables need."""
    tokens_per_byte = {k: len(w["tokens"]) / w["bytes"] for k, w in windows.items()}
    val = meta["splits"]["val"]
    runs = {}  # (role, size, input, seed) -> (point, losses)
    for _, work in plan:
        for p, v, s in work:
            if p["role"] != "sweep":
                runs[p["role"], (p["L"], p["D"]), v, s] = (p, run_losses(args, p, v, s))
    rows = []
    for role, size, v in dict.fromkeys((r, z, v) for r, z, v, _ in runs if v != "learned"):
        seeds = sorted(s for r, z, w, s in runs if (r, z, w) == (role, size, v))
        paired = [s for s in seeds if runs[role, size, v, s][1] and runs.get((role, size, "learned", s), (0, 0))[1]]
        mine = {s: runs[role, size, v, s][1] for s in paired}
        base = {s: runs[role, size, "learned", s][1] for s in paired}
        gaps = [whole_loss(mine[s]) - whole_loss(base[s]) for s in paired]
        ci = interval(gaps)
        p = runs[role, size, v, seeds[0]][0]
        n = counts(args, *size)
        tokens = p["steps"] * args.batch_size * args.block_size
        per_nat = val["tokens"] / val["bytes"] / math.log(2)
        sources = {k: {"learned_bpb": [base[s][k][0] * tokens_per_byte[k] / math.log(2) for s in paired],
                       "bpb": [mine[s][k][0] * tokens_per_byte[k] / math.log(2) for s in paired],
                       "ci": interval([mine[s][k][0] - base[s][k][0] for s in paired])} for k in windows}
        ppl = {w: [math.exp(whole_loss(runs[role, size, w, s][1])) for s in paired] for w in ("learned", v)}
        spread = max(((max(x) - min(x)) / statistics.mean(x) for x in ppl.values() if len(x) > 1), default=None)
        learned_p = runs[role, size, "learned", seeds[0]][0] if (role, size, "learned", seeds[0]) in runs else p
        rows.append({
            "role": role, "size": f"{size[0]}x{size[1]}", "input": v, "vocab": args.vocab, "lr": p["lr"],
            "learned_lr": learned_p["lr"], "planned_seeds": len(seeds), "seeds": paired,
            "learned_trainable": n["learned"], "binary_trainable": n["binary"],
            "share": args.vocab * size[1] / n["learned"], "tokens": tokens, "tokens_per_param": tokens / n["binary"],
            "epochs": tokens / meta["splits"]["train"]["tokens"], "gap_nats": gaps, "ci": ci, **verdicts(ci),
            "learned_bpb": [whole_loss(base[s]) * per_nat for s in paired],
            "bpb": [whole_loss(mine[s]) * per_nat for s in paired], "sources": sources,
            "spread": spread, "inside_spread": None if spread is None or ci is None else abs(math.expm1(ci["mean"])) <= spread,
            "curve": [(t, [math.expm1(g) for g in gs]) for t, gs in scaling.seed_gaps(
                [r for r in (read_curve(args, runs[role, size, w, s][0], w, s) for w in ("learned", v) for s in paired)
                 if r], v)]})
    return rows


def read_curve(args, p, v, s):
    """A run's evaluations along training: {variant, seed, curve}, or None without its log."""
    log = os.path.join(args.out, p["name"], f"{v}-seed{s}", "log.jsonl")
    return {"variant": v, "seed": s, "curve": compare.read_log(log)[0]} if os.path.exists(log) else None


def choice(chosen, lr, grid):
    """The sweep table's mark of the chosen lr, saying when it sits at the grid's edge (the optimum may lie past it)."""
    if chosen != lr:
        return ""
    edge = "largest" if lr == max(grid) else "smallest" if lr == min(grid) else ""
    return f"chosen (the grid's {edge}: past it not tried)" if edge else "chosen"


def sweep_table(args, plan, records):
    sweep = sweep_points(args)
    lines, chosen = [], {}
    variants = list(dict.fromkeys(v for title, work in plan if title.startswith("sweep") for _, v, _ in work))
    for v in variants:
        chosen[v] = best_lr(records, sweep, v, args.sweep_seeds)
        for p in sweep:
            runs = [r for r in records.get(p["name"], []) if r["variant"] == v]
            losses = [r["val_loss"] for r in runs if "val_loss" in r]
            diverged = [str(r["seed"]) for r in runs if "diverged" in r]
            lines.append([v, f"{p['lr']:g}", str(len(runs)), share.ms(losses, ".4f"),
                          ", ".join(diverged) or "—", choice(chosen[v], p["lr"], [q["lr"] for q in sweep])])
    header = [("input", "l"), ("lr", "r"), ("seeds", "r"), ("val loss (last evaluation)", "r"),
              ("diverged seeds", "l"), ("", "l")]
    return compare.markdown_table(header, lines), chosen


def source_table(windows):
    total = sum(w["all_bytes"] for w in windows.values())
    val = sum(w["bytes"] for w in windows.values())
    return compare.markdown_table(
        [("source", "l"), ("bytes", "r"), ("share of the text", "r"), ("val documents", "r"), ("val bytes", "r"),
         ("share of val", "r")],
        [[k, f"{w['all_bytes']:,}", f"{100 * w['all_bytes'] / total:.1f}%", str(w["documents"]), f"{w['bytes']:,}",
          f"{100 * w['bytes'] / val:.1f}%"] for k, w in windows.items()])


def point_table(rows):
    header = [("size", "l"), ("V (K)", "r"), ("input", "l"), ("table share", "r"), ("T", "r"), ("epochs", "r"),
              ("lr (input / learned)", "r"), ("seeds", "r"), ("learned bits/byte", "r"), ("bits/byte", "r"),
              ("gap, perplexity (95% CI)", "r"), ("sd (nats)", "r"), ("vs 0", "l"), ("vs the paper's ±4.8%", "l"),
              ("section 8's rule: range/mean", "l")]
    body = []
    for r in rows:
        rule = "—" if r["spread"] is None else f"{100 * r['spread']:.1f}%: {'inside' if r['inside_spread'] else 'OUTSIDE'}"
        body.append([r["size"], f"{r['vocab']} ({code_bits(r['vocab'])})", r["input"], f"{100 * r['share']:.1f}%",
                     f"{r['tokens_per_param']:.1f}", f"{r['epochs']:.2f}", f"{r['lr']:g} / {r['learned_lr']:g}",
                     f"{len(r['seeds'])} of {r['planned_seeds']}", share.ms(r["learned_bpb"], ".4f"),
                     share.ms(r["bpb"], ".4f"), ci_text(r["ci"]), "—" if r["ci"] is None else f"{r['ci']['sd']:.4f}",
                     r["sign"], r["paper"], rule])
    return compare.markdown_table(header, body)


def summary_table(rows):
    """The README's table: the main rows, the gap and its verdicts."""
    header = [("size", "l"), ("input vs learned", "l"), ("table share", "r"), ("T", "r"), ("epochs", "r"),
              ("lr", "r"), ("seeds", "r"), ("gap, perplexity (95% CI)", "r"), ("vs 0", "l"), ("vs ±4.8%", "l")]
    return compare.markdown_table(header, [[
        r["size"], r["input"], f"{100 * r['share']:.1f}%", f"{r['tokens_per_param']:.1f}", f"{r['epochs']:.2f}",
        f"{r['lr']:g} / {r['learned_lr']:g}", str(len(r["seeds"])), ci_text(r["ci"]), r["sign"], r["paper"]]
        for r in rows])


def per_source_table(rows):
    header = [("size", "l"), ("input", "l"), ("source", "l"), ("learned bits/byte", "r"), ("bits/byte", "r"),
              ("gap, perplexity (95% CI)", "r"), ("vs 0", "l")]
    return compare.markdown_table(header, [[r["size"], r["input"], k, share.ms(x["learned_bpb"], ".4f"),
                                            share.ms(x["bpb"], ".4f"), ci_text(x["ci"]), verdicts(x["ci"])["sign"]]
                                           for r in rows for k, x in r["sources"].items()])


def size_fit(rows):
    """The binary gap against log N (binary trainable parameters) over every seed at the paper's point, and
    the fit's mean at the paper's 469.8M parameters (an extrapolation)."""
    mains = [r for r in rows if r["role"] == "main" and r["input"] == "binary" and r["gap_nats"]]
    x = [math.log(r["binary_trainable"]) for r in mains for _ in r["gap_nats"]]
    y = [g for r in mains for g in r["gap_nats"]]
    fit = line_fit(x, y, math.log(PAPER["binary_trainable"]))
    if fit is None:
        return None, "Gap against size: too few seeds or sizes for a fit."
    b, at, lo, hi = fit
    largest = max(r["binary_trainable"] for r in mains)
    return ({"slope_per_e": b, "at_paper": at, "lo": lo, "hi": hi, "points": len(x)},
            f"Gap against size at the paper's point (binary vs learned, {len(x)} per-seed gaps at "
            f"{len(mains)} sizes ({', '.join(r['size'] + ' at V = ' + str(r['vocab']) for r in mains)}), a line in log N): "
            f"{b * math.log(10):+.4f} nats per decade of N. "
            f"EXTRAPOLATED {PAPER['binary_trainable'] / largest:,.0f}x past our largest model, to the paper's "
            f"{PAPER['binary_trainable'] / 1e6:.0f}M parameters: {pct(at):+.1f}% (95% CI of the line {pct(lo):+.1f} "
            f"to {pct(hi):+.1f}), beside the paper's {100 * PAPER['gap_pct']:+.1f}%: a line through sizes "
            f"{largest / min(r['binary_trainable'] for r in mains):.1f}x apart in N says little that far out.")


def plot(rows, path):
    """The gap (perplexity %) along training against tokens per binary parameter at the paper's share: one
    line per (size, input), the paper's point marked, the legend beside the axes."""
    if (plt := compare.pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for r in rows:
        if r["role"] != "main" or not r["curve"]:
            continue
        c = [(t / r["binary_trainable"], g) for t, g in r["curve"] if t > 0]
        label = (f"{r['size']} V={r['vocab']} {r['input']}: share {100 * r['share']:.1f}%, "
                 f"T {r['tokens_per_param']:.0f}, {len(r['seeds'])} seeds")
        style = "-" if r["input"] == "binary" else "--"
        line, = ax.plot([t for t, _ in c], [100 * statistics.mean(g) for _, g in c], style, label=label)
        ax.fill_between([t for t, _ in c], [100 * min(g) for _, g in c], [100 * max(g) for _, g in c],
                        color=line.get_color(), alpha=0.12)
    ax.axhspan(-100 * PAPER["spread_pct"], 100 * PAPER["spread_pct"], color="green", alpha=0.08,
               label="the paper's ±4.8% seed spread")
    ax.plot([PAPER["tokens_per_param"]], [100 * PAPER["gap_pct"]], "r*", ms=13, label="the paper: -3.3% at T = 36")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ticks = [t for t in (1, 2, 3, 5, 10, 20, 36) if t >= min((r["tokens_per_param"] / 12 for r in rows), default=1)]
    ax.set_xticks(ticks, labels=[str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("training tokens per trainable parameter of the binary model (T)")
    ax.set_ylabel("perplexity vs learned (%), evaluation batches")
    ax.set_title("the gap at the paper's point: table share ~12.5%, T ~ 36", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def write_report(args, meta, windows):
    """The tables, the sentences and the figure, from the finished runs; the unfinished ones listed."""
    plan = stages(args, read_records(args, stages(args, {})))
    records = read_records(args, plan)
    sweep, chosen = sweep_table(args, plan, records)
    rows = main_rows(args, plan, windows, meta)
    also = []  # rows of the other studies named by --also, for the fit
    for folder in args.also:
        with open(os.path.join(folder, "results.json")) as f:
            also += json.load(f)["rows"]
    fit, fit_line = size_fit(rows + also)
    missing = [f"{p['name']} {v} seed {s}" for _, work in plan for p, v, s in work
               if not os.path.exists(os.path.join(args.out, p["name"], f"{v}-seed{s}", "final.json"))]
    controls = [c for c in args.controls.split(",") if c]
    missing += [f"every main run of {v} (its sweep unfinished)" for v in ("learned", "binary", *controls)
                if best_lr(records, sweep_points(args), v, args.sweep_seeds) is None]
    missing = list(dict.fromkeys(missing))  # a run of two stages (the shared lr is an input's own) once
    diverged = [f"{name} {r['variant']} seed {r['seed']}" for name, rs in records.items() for r in rs if "diverged" in r]
    header = (f"V = {args.vocab}, {args.batch_size} x {args.block_size} tokens a step, {args.n_head} heads, "
              f"{args.encoding} cut to V; sources cut into ~{args.doc_chars:,}-character documents, every 10th for val; "
              f"{meta['splits']['train']['tokens']:,} train / {meta['splits']['val']['tokens']:,} val tokens")
    mains = [r for r in rows if r["role"] == "main"]
    speed = {}  # size -> each main run's median training tokens/s (its log)
    for p, v, s in (j for title, work in plan if not title.startswith("sweep") for j in work):
        for r in records.get(p["name"], []):
            if (r["variant"], r["seed"]) == (v, s) and "tokens_per_s" in r:
                speed.setdefault(f"{p['L']}x{p['D']}", []).append(r["tokens_per_s"])
    report = "\n\n".join([
        header, "The text, by source:\n\n" + source_table(windows),
        f"The lr sweep (the smallest size, T = {args.sweep_tokens_per_param:g}; the lr of each input's lowest mean "
        "loss is chosen):\n\n" + sweep,
        "At the paper's point (gap: loss(input) - loss(learned) of the same seed on the whole validation split, "
        "as perplexity; CI: 95%, t over seeds):\n\n" + point_table(mains),
        f"The same at the one shared lr {args.shared_lr:g} (the smallest size):\n\n"
        + point_table([r for r in rows if r["role"] == "shared"]),
        "Bits per byte by source (the same runs, each source's own validation windows):\n\n" + per_source_table(mains),
        fit_line,
        "Training speed, median tokens/s of each run's log (min to max over runs): " + ", ".join(
            f"{k} {statistics.median(x):,.0f} ({min(x):,.0f} to {max(x):,.0f})" for k, x in speed.items()) + ".",
        "In short (README):\n\n" + summary_table(mains),
        "Not finished (not in any table): " + ("; ".join(missing) or "none") + ".",
        "Diverged: " + ("; ".join(diverged) or "none") + "."]) + "\n"
    results = {"rows": rows, "sweep_lrs": chosen, "fit": fit, "missing": missing, "diverged": diverged,
               "sources": {k: {x: w[x] for x in ("all_bytes", "bytes", "documents")} for k, w in windows.items()},
               "runs": records}
    drawn = mains + [r for r in also if r["role"] == "main"]
    compare.write_results(args.out, report, results, ("paper_point.png", lambda path: plot(drawn, path)))
    return rows


def parse_config(argv=None):
    parser = config_parser(PaperPointConfig, __doc__.strip().split("\n\n")[0])
    return resolve_presets(parse_settings(parser, argv), "quick")


def main(argv=None):
    args = parse_config(argv)
    for flag in ("seeds", "smallest_seeds", "control_seeds", "sweep_seeds", "jobs", "evals", "eval_batches"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    with writer_lock(args.out, outputs=("results.md", "results.json")):
        compare.check_results(args.out, ("results.md", "results.json", "paper_point.png"))
        data, meta = data_of(args)
        windows = source_windows(meta)
        if not args.report:
            train_all(args, data, windows)
        evaluate_sources(main_run_dirs(args, stages(args, read_records(args, stages(args, {})))), windows, args.jobs)
        return write_report(args, meta, windows)


if __name__ == "__main__":
    sys.exit(run_main(main, outlive_stdout=True))  # a study outlives a closed stdout (`| head`): its files record it
