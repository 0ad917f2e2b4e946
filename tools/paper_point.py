"""
The paper's point, measured: the learned-vs-binary gap at the paper's table share (12.5%) and training
length (~36 tokens per trainable parameter of the binary model), at several model sizes.

    python -m tools.paper_point --corpus ../shared/data/{tinyshakespeare,janeausten,kjv}.txt --jobs 2 --out runs/paper
    python -m tools.paper_point --quick            # tiny sizes on tiny Shakespeare, a few minutes
    python -m tools.paper_point ... --report       # train nothing: report the runs that finished

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
from model import GPT, get_config
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
    n = {}
    for variant in ("learned", "binary"):
        with torch.device("meta"):
            cfg = get_config("small", vocab_size=args.vocab, n_layer=L, n_head=args.n_head, n_embd=D,
                             block_size=args.block_size, input=variant)
            n[variant] = GPT(cfg).num_params()["trainable"]
    return n


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


def best_lr(records, sweep, variant):
    """The sweep's lr with the lowest mean loss over seeds for an input (a diverged seed counts as inf),
    or None before the sweep has every seed of every lr."""
    means = {}
    for p in sweep:
        runs = [r for r in records.get(p["name"], []) if r["variant"] == variant]
        if not runs:
            return None
        means[p["lr"]] = statistics.mean(r.get("val_loss", math.inf) for r in runs)
    return min(means, key=means.get)


def stages(args, records):
    """The stages, in order, as [(title, [(point, input, seed)])]; a stage that needs the sweep's lr of an input
    whose sweep has not finished is left out (the next command runs it)."""
    sizes = scaling.parse_sizes(args.sizes)
    sweep, controls = sweep_points(args), [c for c in args.controls.split(",") if c]
    lr = {v: best_lr(records, sweep, v) for v in ("learned", "binary", *controls)}

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
def source_windows(args, meta):
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
        evaluate_sources([compare.run_dir(run.out, v, s) for _, run, v, s in runs if not title.startswith("sweep")],
                         windows, args.jobs)
        done.add(title)


def write_report(args, meta, windows):
    print("report: to come")


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
        windows = source_windows(args, meta)
        if not args.report:
            train_all(args, data, windows)
        return write_report(args, meta, windows)


if __name__ == "__main__":
    sys.exit(run_main(main, outlive_stdout=True))  # a study outlives a closed stdout (`| head`): its files record it
