"""
The quick start measured the way a newcomer runs it, side by side with nanoGPT's CPU recipe, and the
search for its defaults (issue 34).

    python -m tools.quickstart                                    # ours: prepare, train, sample (~3 min, 2 cores)
    python -m tools.quickstart --nanogpt ~/nanoGPT                # and nanoGPT's CPU recipe beside it: one table
    python -m tools.quickstart --train_flags "--max_steps 600 --lr 2e-3" --prepare_flags "--vocab_size 512"
    python -m tools.quickstart --grid tools/quickstart_grid.txt --work out/qs-search --nanogpt ~/nanoGPT

nanoGPT is never vendored: clone https://github.com/karpathy/nanoGPT and name the checkout with --nanogpt.

Design choices, up front:
- Everything runs through the real command lines, in subprocesses: `python prepare_data.py shakespeare`
  (+ --prepare_flags) into <work>/data/<flags hash>, `python train.py` (+ --train_flags; none = the quick
  start's defaults) into <work>/runs/<name>/out, then `python sample.py` with --seed and --sample_tokens.
  The tool owns <work> (one writer: <work>/.writer.lock); without --work it is a temporary folder removed
  at the end. It passes settings only as flags the scripts have: each configuration's flags are checked
  against `python train.py --help` and `python prepare_data.py --help` before anything runs, and the
  flags the tool sets itself (data and output folders, --overwrite, --resume) are refused.
- Figures. Train time: wall seconds from the train.py process's start to its end; train loop: the wall_s
  of its log.jsonl's end record. Validation loss: every window of the validation split once, from the
  checkpoint that sample.py samples (compare.full_val_loss), in nats per token and per byte (compare.per_byte:
  x validation tokens / validation UTF-8 bytes, from meta.json); train.py's own last evaluation is
  kept beside it. Real words: the share of the sample's words (runs of letters and apostrophes with a
  letter, lower-cased) that occur anywhere in the training split's text (decoded from its shards).
- nanoGPT's CPU recipe (its README): its data/shakespeare_char/prepare.py, train.py, model.py, sample.py,
  configurator.py and config/train_shakespeare_char.py are copied into <work>/nanogpt and run there (the
  checkout is only read); the same tiny Shakespeare text that our prepare step read becomes its input.txt,
  so no download. Its flags: NANOGPT_FLAGS, then --nanogpt_flags. Its train.py saves ckpt.pt only when the
  validation loss improves (always_save_checkpoint False), never at iteration 0: the checkpoint measured
  and sampled is that best one (its iteration is reported); no checkpoint at all is an error that says
  why. Its full validation loss is computed in a child process that imports the copied model.py (its
  name would clash with ours here), over every window of its val.bin once; per byte = per character x
  characters / UTF-8 bytes of its validation text (1 for this ASCII text). The loss it printed itself
  (its last evaluation, eval_iters random batches) is kept beside it. Its sample: --seed, one sample of
  as many characters as our sample has (its other sampling settings its own defaults, as ours are).
- Results: one record per configuration appended to <work>/results.jsonl as each finishes. Rerun the same
  command after a crash or Ctrl-C: finished configurations are read back (only if measured with the same
  flags and sampling: a changed one is refused by name), an interrupted one is measured again. The table
  goes to stdout and <work>/quickstart.md, with the verdict against issue 34's targets: time <= nanoGPT's,
  nats per byte <= 0.95 x nanoGPT's, real words >= nanoGPT's share.
- --grid FILE: one configuration a line, `name | prepare_data.py flags | train.py flags` (# comments);
  tools/quickstart_grid.txt is the proposed search around issue 34's one-seed hint.
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

import functools
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.files import atomic_write, writer_lock
from bincode_gpt.run_dir import read_log
from bincode_gpt.shards import load_meta, read_shard
from bincode_gpt.tokenizer import get_tokenizer
from tools import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NANOGPT_URL = "https://github.com/karpathy/nanoGPT"
NANOGPT_FILES = ("data/shakespeare_char/prepare.py", "train.py", "model.py", "sample.py", "configurator.py",
                 "config/train_shakespeare_char.py")
NANOGPT_FLAGS = ("config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1 "
                 "--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 "
                 "--lr_decay_iters=2000 --dropout=0.0")
NANOGPT_OUT = "out-shakespeare-char"  # its config's out_dir, where its sample.py is pointed
OWNED = {"prepare_data.py": ("--out", "--overwrite"),
         "train.py": ("--data_dir", "--out_dir", "--overwrite", "--resume", "--init_from")}
TARGETS = {"time": 1.0, "per_byte": 0.95, "words": 1.0}  # issue 34: ours / nanoGPT's at most, at most, at least

# run in <work>/nanogpt by a child process, so that `model` is nanoGPT's model.py, not ours
NANOGPT_EVAL = """
import json, numpy as np, torch
from model import GPT, GPTConfig
ck = torch.load("{out}/ckpt.pt", map_location="cpu", weights_only=False)
model = GPT(GPTConfig(**ck["model_args"]))
model.load_state_dict({{k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}})
model.eval()
T = model.config.block_size
data = np.memmap("data/shakespeare_char/val.bin", dtype=np.uint16, mode="r")
n, total = (len(data) - 1) // T, 0.0
with torch.no_grad():
    for s in range(0, n, 64):
        rows = np.stack([data[i * T : i * T + T + 1] for i in range(s, min(s + 64, n))]).astype(np.int64)
        x, y = torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
        total += model(x, y)[1].item() * len(rows)
print(json.dumps({{"val_loss": total / n, "windows": n, "iter": int(ck["iter_num"]),
                  "best_val_loss": float(ck["best_val_loss"])}}))
"""


@dataclass
class QuickstartConfig:
    work: str | None = setting(None, "the tool's own folder: data, runs, results.jsonl, quickstart.md (default: a "
                                     "temporary folder, removed at the end; --grid needs one, to resume)")
    prepare_flags: str = setting("", "extra prepare_data.py flags for our run, one string: "
                                     "--prepare_flags='--vocab_size 512' (default: none, the quick start's)")
    train_flags: str = setting("", "extra train.py flags for our run, one string: --train_flags='--lr 2e-3' "
                                   "(default: none, the quick start's)")
    grid: str | None = setting(None, "a file of configurations, `name | prepare flags | train flags` a line: the "
                                     "search (instead of one run of --prepare_flags/--train_flags)")
    nanogpt: str | None = setting(None, f"a local nanoGPT checkout ({NANOGPT_URL}): its CPU recipe side by side")
    nanogpt_flags: str = setting("", "extra flags for nanoGPT's train.py, after its recipe's (tests: tiny runs)")
    sample_tokens: int = setting(300, "tokens our sample.py draws (nanoGPT draws as many characters as that is)")
    seed: int = setting(1337, "sampling seed, both sides")


def say(msg):
    print(msg, flush=True)


def run_logged(cmd, log, cwd=ROOT):
    """Run cmd in cwd, its output to the file log; its wall seconds. A failure raises, naming the log's tail."""
    say(f"$ {shlex.join(cmd)}   (output: {log})")
    start = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    if rc:
        with open(log) as f:
            tail = "".join(f.readlines()[-15:])
        raise RuntimeError(f"{shlex.join(cmd)} failed (exit {rc}) in {cwd}; the end of {log}:\n{tail}")
    return seconds


def output_of(cmd, cwd=ROOT):
    """stdout of cmd (stderr shown on failure)."""
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed (exit {r.returncode}) in {cwd}:\n{r.stderr[-3000:]}")
    return r.stdout


@functools.cache
def options(script):
    """The --flags that `python script --help` lists (a bool's --no-X form included)."""
    found = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", output_of([sys.executable, script, "--help"])))
    return found | {"--no-" + f[2:] for f in found}


def check_flags(flags, script, known, what):
    """Refuse any flag `script` lacks, or one the tool sets itself, naming the configuration."""
    for token in shlex.split(flags):
        if token.startswith("--"):
            flag = token.split("=", 1)[0]
            if flag not in known:
                raise ValueError(f"{what}: {script} has no flag {flag} (see python {script} --help)")
            if flag in OWNED[script]:
                raise ValueError(f"{what}: {flag} is set by the tool itself, not a {script} setting to vary")
        elif not flags.strip().startswith("--"):
            raise ValueError(f"{what}: {script} flags must start with a --flag, got {flags!r}")


def parse_grid(text):
    """Grid file text -> [(name, prepare flags, train flags)], names unique and plain (they name folders)."""
    configs = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3 or not re.fullmatch(r"[\w.+-]+", parts[0]):
            raise ValueError(f"grid line {n}: expected `name | prepare_data.py flags | train.py flags` with a plain "
                             f"name (letters, digits, . _ + -), got {line!r}")
        if parts[0] in [c[0] for c in configs] or parts[0] == "nanoGPT":
            raise ValueError(f"grid line {n}: the name {parts[0]!r} is taken")
        configs.append(tuple(parts))
    if not configs:
        raise ValueError("the grid names no configuration")
    return configs


def words(text):
    """Runs of letters and apostrophes holding a letter, lower-cased."""
    return re.findall(r"[a-z']*[a-z][a-z']*", text.lower())


def real_share(sample, train_words):
    found = words(sample)
    return sum(w in train_words for w in found) / len(found) if found else 0.0


def train_text(data, meta):
    """The training split's text, decoded from its shards (end-of-text tokens left out)."""
    enc = get_tokenizer(meta["encoding"], meta["vocab_size"], meta.get("reserve_zero", False),
                        meta.get("reserve_ones", False))
    ids = np.concatenate([read_shard(os.path.join(data, s)) for s in meta["splits"]["train"]["shards"]])
    return enc.decode(ids[ids != meta["eot_token"]].tolist())


def machine():
    names = re.findall(r"^model name\s*:\s*(.+)$", open("/proc/cpuinfo").read(), re.M) if os.path.exists(
        "/proc/cpuinfo") else []
    return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def prepared(work, flags):
    """<work>/data/<hash of flags>, prepared by prepare_data.py on first use: (folder, meta, seconds or None)."""
    data = os.path.join(work, "data", hashlib.sha1(flags.encode()).hexdigest()[:10])
    if os.path.exists(os.path.join(data, "meta.json")):
        return data, load_meta(data), None
    os.makedirs(os.path.dirname(data), exist_ok=True)
    seconds = run_logged([sys.executable, "prepare_data.py", "shakespeare", "--out", data, *shlex.split(flags)],
                         data + ".log")
    return data, load_meta(data), seconds


def end_record(out_dir):
    ends = read_log(out_dir, "end")
    if not ends:
        raise RuntimeError(f"{os.path.join(out_dir, 'log.jsonl')} has no end record: train.py did not finish")
    return ends[-1]


def measure_ours(work, name, prepare_flags, train_flags, args):
    """Prepare, train and sample one configuration of ours through the command lines; its figures."""
    data, meta, prep_s = prepared(work, prepare_flags)
    run = os.path.join(work, "runs", name)
    out = os.path.join(run, "out")
    os.makedirs(run, exist_ok=True)
    again = ["--overwrite"] if os.path.exists(out) else []  # an interrupted measurement of this tool's own
    train_s = run_logged([sys.executable, "train.py", "--data_dir", data, "--out_dir", out, *again,
                          *shlex.split(train_flags)], os.path.join(run, "train.log"))
    end = end_record(out)
    model, ckpt = load_checkpoint(out, "cpu")
    loss = compare.full_val_loss(out, data, meta, 16, torch.device("cpu"))
    sample = output_of([sys.executable, "sample.py", "--ckpt", out, "--seed", str(args.seed),
                        "--max_new_tokens", str(args.sample_tokens), "--device", "cpu"])
    atomic_write(os.path.join(run, "sample.txt"), sample)
    return {"name": name, "prepare_flags": prepare_flags, "train_flags": train_flags, "settings": settings(args),
            "prepare_s": prep_s, "train_s": train_s, "loop_s": end["wall_s"], "steps": end["steps"],
            "tokens": end["tokens"], "model_config": ckpt["model_config"],
            "params": model.num_params()["trainable"], "val_loss": loss, "per_byte": compare.per_byte(loss, meta),
            "own_val_loss": end["final_val_loss"], "words": real_share(sample, set(words(train_text(data, meta)))),
            "sample_chars": len(sample), "sample": sample, "machine": machine()}


def copy_nanogpt(checkout, folder, text):
    """The recipe's files from the checkout (only read) into folder, and our tiny Shakespeare as its input.txt."""
    missing = [f for f in NANOGPT_FILES if not os.path.isfile(os.path.join(checkout, f))]
    if missing:
        raise ValueError(f"{checkout} is not a nanoGPT checkout: it lacks {', '.join(missing)} "
                         f"(git clone {NANOGPT_URL})")
    for f in NANOGPT_FILES:
        os.makedirs(os.path.dirname(os.path.join(folder, f)), exist_ok=True)
        shutil.copy2(os.path.join(checkout, f), os.path.join(folder, f))
    shutil.copy2(text, os.path.join(folder, "data/shakespeare_char/input.txt"))


def printed_val(log):
    """The last `val loss X` nanoGPT's train.py printed, and its iteration: (step, loss) or (None, None)."""
    with open(log) as f:
        found = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", f.read())
    return (int(found[-1][0]), float(found[-1][1])) if found else (None, None)


def sample_text(stdout):
    """The sample in nanoGPT's sample.py output: without its model and meta notes and the closing dashes."""
    lines = stdout.split("\n")
    notes = ("Overriding:", "number of parameters:", "Loading meta from", "No meta.pkl found")  # configurator, model
    while lines and lines[0].startswith(notes):
        lines.pop(0)
    text = "\n".join(lines)
    return text[: text.rfind("\n---------------")] if "\n---------------" in text else text


def measure_nanogpt(work, args, text, chars):
    """nanoGPT's CPU recipe run in <work>/nanogpt from copies of its files; its figures."""
    import pickle

    folder = os.path.join(work, "nanogpt")
    copy_nanogpt(args.nanogpt, folder, text)
    prep_s = run_logged([sys.executable, "data/shakespeare_char/prepare.py"], os.path.join(folder, "prepare.log"),
                        folder)
    shutil.rmtree(os.path.join(folder, NANOGPT_OUT), ignore_errors=True)  # a killed try's: it would be measured
    flags = [*shlex.split(NANOGPT_FLAGS), *shlex.split(args.nanogpt_flags)]
    train_s = run_logged([sys.executable, "train.py", *flags], os.path.join(folder, "train.log"), folder)
    step, own = printed_val(os.path.join(folder, "train.log"))
    if not os.path.exists(os.path.join(folder, NANOGPT_OUT, "ckpt.pt")):
        raise RuntimeError(f"nanoGPT's train.py saved no checkpoint: it saves one only at an evaluation after "
                           f"iteration 0 that improves the validation loss (last printed: step {step}); give it "
                           "--eval_interval at most --max_iters")
    ev = json.loads(output_of([sys.executable, "-c", NANOGPT_EVAL.format(out=NANOGPT_OUT)], folder).splitlines()[-1])
    with open(os.path.join(folder, "data/shakespeare_char/meta.pkl"), "rb") as f:
        itos = pickle.load(f)["itos"]  # what its own prepare.py wrote here

    def decoded(split):
        return "".join(itos[int(i)] for i in np.fromfile(os.path.join(folder, f"data/shakespeare_char/{split}.bin"),
                                                         dtype=np.uint16))
    val = decoded("val")
    stdout = output_of([sys.executable, "sample.py", f"--out_dir={NANOGPT_OUT}", "--device=cpu", f"--seed={args.seed}",
                        "--num_samples=1", f"--max_new_tokens={chars}"], folder)
    sample = sample_text(stdout)
    atomic_write(os.path.join(folder, "sample.txt"), sample)
    return {"name": "nanoGPT", "checkout": os.path.abspath(args.nanogpt), "train_flags": shlex.join(flags),
            "settings": settings(args), "prepare_s": prep_s, "train_s": train_s, "loop_s": None,
            "ckpt_iter": ev["iter"],
            "val_loss": ev["val_loss"], "per_byte": ev["val_loss"] * len(val) / len(val.encode()),
            "own_val_loss": own, "own_val_step": step, "words": real_share(sample, set(words(decoded("train")))),
            "sample_chars": len(sample), "sample": sample, "machine": machine()}


def settings(args):
    return {"sample_tokens": args.sample_tokens, "seed": args.seed}


def read_results(path):
    """The records of results.jsonl by name; a torn last line (a killed write) is left out."""
    records = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                records[r["name"]] = r
    return records


def append(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def reusable(record, want):
    """A finished record is read back only if it was measured as asked now; else a ValueError names what differs."""
    keys = [k for k in ("prepare_flags", "train_flags", "settings", "checkout") if k in want]
    differ = [k for k in keys if record.get(k) != want[k]]
    if differ:
        raise ValueError(f"{record['name']} in results.jsonl was measured with other "
                         + ", ".join(f"{k} ({record.get(k)!r}, now {want[k]!r})" for k in differ)
                         + ": choose another --work or another name")
    return record


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(records, ref):
    """Markdown: one row per record, nanoGPT's (ref) last; the ratio column needs ref."""
    rows = ["| run | train time s | train loop s | val nats/token | val nats/byte | ours / nanoGPT per byte "
            "| real words | train.py's own val loss | machine |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in records + ([ref] if ref else []):
        ratio = r["per_byte"] / ref["per_byte"] if ref and r is not ref else None
        token = "-" if r is ref else fmt(r["val_loss"], ".4f")  # nanoGPT's token is a byte
        rows.append(f"| {r['name']} | {r['train_s']:.1f} | {fmt(r['loop_s'], '.1f')} | {token} | {r['per_byte']:.4f} "
                    f"| {fmt(ratio, '.3f')} | {r['words']:.1%} | {fmt(r['own_val_loss'], '.4f')} | {r['machine']} |")
    return "\n".join(rows)


def verdict(r, ref):
    """Issue 34's three targets, each met or not, computed."""
    checks = [("time", r["train_s"], ref["train_s"], "<=", r["train_s"] <= TARGETS["time"] * ref["train_s"]),
              ("nats/byte", r["per_byte"], TARGETS["per_byte"] * ref["per_byte"], "<=",
               r["per_byte"] <= TARGETS["per_byte"] * ref["per_byte"]),
              ("real words", r["words"], ref["words"], ">=", r["words"] >= TARGETS["words"] * ref["words"])]
    lines = [f"- {what}: {a:.4g} {op} {b:.4g}: {'met' if ok else 'NOT met'}" for what, a, b, op, ok in checks]
    met = all(c[-1] for c in checks)
    return f"{r['name']} against nanoGPT's CPU recipe: {'all targets met' if met else 'targets not met'}\n" + \
        "\n".join(lines), met


def grid_table(records, ref):
    rows = ["| configuration | prepare_data.py | train.py | params | train time s | val nats/byte | real words "
            "| targets met |", "|---|---|---|---:|---:|---:|---:|---|"]
    for r in records:
        met = "-" if not ref else ("yes" if verdict(r, ref)[1] else "no")
        rows.append(f"| {r['name']} | `{r['prepare_flags']}` | `{r['train_flags']}` | {r['params']:,} "
                    f"| {r['train_s']:.1f} | {r['per_byte']:.4f} | {r['words']:.1%} | {met} |")
    return "\n".join(rows)


def choice(records, ref):
    """The search's pick, computed: the lowest loss per byte of the configurations that meet every target."""
    ok = [r for r in records if verdict(r, ref)[1]]
    return min(ok, key=lambda r: r["per_byte"]) if ok else None


def report(records, ref, grid):
    parts = [f"Machine: {machine()}.", table(records, ref)]
    if grid:
        parts.append(grid_table(records, ref))
    if grid and ref:
        best = choice(records, ref)
        parts.append("No configuration meets every target." if best is None else
                     f"Chosen (the lowest nats/byte of those meeting every target): {best['name']}, "
                     f"{best['per_byte']:.4f} nats/byte in {best['train_s']:.1f} s.")
    if ref:
        parts += [verdict(r, ref)[0] for r in records]
    for r in records + ([ref] if ref else []):
        parts.append(f"{r['name']} sample (seed {r['settings']['seed']}):\n\n" +
                     "\n".join("    " + line for line in r["sample"].split("\n")))
    return "\n\n".join(parts) + "\n"


def parse_config(argv=None):
    return parse_settings(config_parser(QuickstartConfig, __doc__.strip().split("\n\n")[0]), argv)


def main(argv=None):
    args = parse_config(argv)
    if args.sample_tokens < 1:
        raise ValueError(f"--sample_tokens must be at least 1, got {args.sample_tokens}")
    if args.grid and not args.work:
        raise ValueError("--grid needs --work: the folder whose results.jsonl a stopped search resumes from")
    if args.grid and (args.prepare_flags or args.train_flags):
        raise ValueError("--grid names every configuration's flags: drop --prepare_flags/--train_flags")
    if args.nanogpt and not os.path.isdir(args.nanogpt):
        raise ValueError(f"--nanogpt {args.nanogpt}: no such folder (git clone {NANOGPT_URL})")
    if args.grid:
        with open(args.grid) as f:
            configs = parse_grid(f.read())
    else:
        configs = [("quickstart", args.prepare_flags, args.train_flags)]
    known = {s: options(s) for s in OWNED}
    for name, prep, train in configs:  # every configuration checked before anything runs
        check_flags(prep, "prepare_data.py", known["prepare_data.py"], name)
        check_flags(train, "train.py", known["train.py"], name)
    for flag in shlex.split(args.nanogpt_flags):
        if flag.startswith("--out_dir"):
            raise ValueError(f"--nanogpt_flags: {flag} is set by the tool itself ({NANOGPT_OUT}, what sample.py reads)")
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="quickstart-")
    try:
        with writer_lock(work, outputs=("quickstart.md",)):
            return measure_all(work, args, configs)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)  # the temporary folder this run made


def measure_all(work, args, configs):
    path = os.path.join(work, "results.jsonl")
    done = read_results(path)
    records = []
    for i, (name, prep, train) in enumerate(configs, 1):
        want = {"prepare_flags": prep, "train_flags": train, "settings": settings(args)}
        if name in done:
            records.append(reusable(done[name], want))
            say(f"[{i}/{len(configs)}] {name}: read back from {path}")
            continue
        say(f"[{i}/{len(configs)}] {name}: prepare_data.py {prep or '(defaults)'} | train.py {train or '(defaults)'}")
        records.append(measure_ours(work, name, prep, train, args))
        append(path, records[-1])
        say(f"  {records[-1]['train_s']:.1f} s, {records[-1]['per_byte']:.4f} nats/byte, "
            f"{records[-1]['words']:.1%} real words")
    ref = None
    if args.nanogpt:
        want = {"train_flags": shlex.join([*shlex.split(NANOGPT_FLAGS), *shlex.split(args.nanogpt_flags)]),
                "settings": settings(args), "checkout": os.path.abspath(args.nanogpt)}
        if "nanoGPT" in done:
            ref = reusable(done["nanoGPT"], want)
        else:
            say("nanoGPT's CPU recipe")
            meta = load_meta(prepared(work, configs[0][1])[0])
            ref = measure_nanogpt(work, args, meta["sources"][0], records[0]["sample_chars"])
            append(path, ref)
    text = report(records, ref, bool(args.grid))
    atomic_write(os.path.join(work, "quickstart.md"), text)
    print("\n" + text + (f"(also in {os.path.join(work, 'quickstart.md')})\n" if args.work else ""))
    return {"records": records, "nanogpt": ref}


if __name__ == "__main__":
    sys.exit(run_main(main, outlive_stdout=True))
