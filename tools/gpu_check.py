"""
The GPU path end to end, offline, for anyone with a CUDA GPU: the quick start in bfloat16 with --compile; a run
stopped with SIGTERM and resumed to the end, its log compared with the uninterrupted run's; --init_from; the paper
preset at the largest batch that fits, its peak memory against preflight's estimate; with two or more GPUs,
torchrun (grad_accum 2, --compile) and a stop and resume under it; sampling from the checkpoint, eager,
compiled and as CUDA graphs. One markdown table: tokens/s, MFU, peak memory and every failure.

    python -m tools.gpu_check                       # on the CUDA GPU(s); the table on stdout
    python -m tools.gpu_check --out gpu_check.md    # and in a file
    python -m tools.gpu_check --work /shared/gc     # runs kept there: the paper row times a save to that disk
    python -m tools.gpu_check --device cpu          # a dry run of the same steps at tiny sizes (CI)

Design choices, up front:
- Offline: the text is its own (deterministic English-like sentences, prepared at vocab 512 in the work
  folder) unless --data_dir names prepared data. Only tiktoken's encoding files are read, from tiktoken's
  cache: where they are missing the check stops at once and says how to fill a cache (TIKTOKEN_CACHE_DIR).
- Every step runs the scripts' real command lines (train.py, sample.py, torchrun) in a process of its own, in
  a work folder (a temp folder, removed at the end, unless --work names one): nothing here re-implements them.
  A child's stdout is read line by line and its stderr drained by a thread alongside, so a child that
  writes more than a pipe holds to either never blocks; each is stopped after --timeout seconds.
- A stopped run gets SIGTERM when its output prints step --stop_at (under torchrun, torchrun gets it and
  forwards it, as a scheduler's would); train.py finishes the step it is in, announces it ("step N/"),
  saves and exits; ckpt.pt must hold that step, and --resume then runs to --steps. Its log.jsonl (step,
  loss, lr, gradient norm, tokens, val loss) must equal the uninterrupted run's: bit for bit on a CPU; on
  CUDA step, lr and tokens exactly and losses and gradient norms within RESUME_RTOL (relative), since
  CUDA's kernels are not deterministic (atomic adds in index and scatter backwards, split-K matmuls), so two
  runs of one command already differ in the last bits. The note gives the largest difference found.
- --init_from starts a run from the reference's ckpt.pt: its step-0 validation loss must be the reference's last
  (the same weights on the same windows; on a GPU within 1e-3, as bfloat16 kernels may order sums otherwise).
- The paper row: the paper preset (32 x 1024, context 1,024, V = 65,536), eager bfloat16, 3 steps at the
  paper-size runs' --lr 6e-4, at the largest batch that runs: the first tried is the largest of BATCHES
  that preflight's estimate fits in free memory, then smaller ones while a try runs out of memory. Its
  peak (max_memory_allocated) must not exceed the estimate (else preflight could not warn before an
  out-of-memory); the time from its last step to the end (the one-batch check, the RNG states, the
  fsync'd ~5.6 GB ckpt.pt, written under --work) is what a stop under torchrun must fit in its
  --shutdown_timeout (docs/usage.md). On a CPU the tiny preset stands in, its RSS not compared.
- torchrun: two processes, grad_accum 2. On a CPU, gloo; on one GPU, skipped with a note: NCCL refuses two
  ranks on one GPU, and train.py picks NCCL for CUDA tensors. With two or more GPUs, one process each.
- tokens/s and MFU are the median over the logged steps after the first --warmup (compiling); peak memory
  is the process's (torch.cuda.max_memory_allocated on CUDA, peak RSS on a CPU). Sampling rows give the
  process's wall time, loading and compiling included.
- Time on one GPU (an estimate from the steps and sizes, no GPU has run it yet): the mini model's 100
  steps take seconds, so compiling dominates: ~60 s for the first compile, ~15 s for each of the 3 next
  (inductor's cache), ~60 s for the paper row (up to 3 tries at ~15 s, 470M parameters built each time,
  and a 5.6 GB save), ~60 s for sampling (two compiles): about 4 minutes, under 5. Two GPUs add three
  compiled torchrun runs, ~1.5 minutes. The CPU dry run: ~40 s on 2 cores.
- Exit status 1 if any step failed (the table says which and why), else 0.
"""

import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bincode_gpt.cli import config_parser, one_line, parse_settings, run_main, setting
from bincode_gpt.devices import pick_device
from bincode_gpt.files import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# runs a root script as its __main__ and says its peak memory on stderr at exit, however it exits
PEAK = """import resource, runpy, sys
import torch
script = sys.argv.pop(1)
sys.argv[0] = script
try:
    runpy.run_path(script, run_name="__main__")
finally:
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"gpu_check peak {'cuda' if cuda else 'rss'} {peak}", file=sys.stderr, flush=True)
"""
LOGGED = {"train": ("step", "loss", "lr", "grad_norm", "tokens"), "eval": ("step", "val_loss", "best_val_loss")}
NOISY = {"loss", "grad_norm", "val_loss", "best_val_loss"}  # the logged values that CUDA's kernels may move
RESUME_RTOL = 1e-2  # CUDA: a resumed run's losses and gradient norms against the uninterrupted run's, relative
BATCHES = (64, 32, 16, 8, 4, 2, 1)  # the paper row's batch sizes, tried from the largest that the estimate fits
PROMPT = "The"
TEXT_CHARS = 300_000  # ~120k tokens at vocab 512: validation windows enough for the paper preset's 1,024 context
VOCAB = 512  # of the check's own data (K = 9, the quick start's)


@dataclass
class CheckConfig:
    device: str = setting("auto", "cuda (auto: the CUDA GPU) | cpu: a dry run at tiny sizes")
    data_dir: str | None = setting(None, "prepared data (default: the check's own text, prepared in the work folder)")
    work: str | None = setting(None, "folder for the runs, kept (default: a temp folder, removed at the end)")
    out: str | None = setting(None, "also write the table to this markdown file")
    steps: int | None = setting(None, "training steps of each run (default: 100 on CUDA, 8 on a CPU)")
    stop_at: int | None = setting(None, "the step after which the stopped runs get SIGTERM (default: steps / 2)")
    warmup: int = setting(5, "first steps left out of tokens/s and MFU (compiling)")
    compile: bool | None = setting(None, "torch.compile the training runs (default: on CUDA only)")
    paper: bool = setting(True, "the paper-preset row (--no-paper: skipped)")
    sample_compile: bool = setting(True, "also sample with --compile (--no-sample_compile: skipped, as CI's dry run "
                                         "does: it compiles for tens of seconds on a CPU)")
    sample_tokens: int = setting(64, "tokens per sample")
    timeout: float = setting(900, "seconds each process may run before it is stopped (a FAIL row)")


@dataclass
class Row:
    check: str
    ok: bool | None  # None: skipped
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak: str = "-"
    wall_s: float | None = None
    note: str = ""


@dataclass
class Done:
    """A finished child process."""
    code: int
    out: str
    err: str
    wall: float
    lines: list = field(default_factory=list)  # (seconds since its start, stdout line)


# ----------------------------------------------------------------------------- processes
def run(cmd, stop_after=None, timeout=900):
    """Run cmd in the repository root -> Done. Its stdout is read line by line, each line's arrival time kept,
    and its stderr drained by a thread meanwhile: no pipe is left unread, so a child never blocks on a full
    one. stop_after: SIGTERM once stdout prints that step's line ("step N/"). After `timeout` seconds the
    child gets SIGTERM (torchrun forwards it to its ranks), and SIGKILL a minute later."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    drain.start()
    late = threading.Event()
    watch = threading.Thread(target=stop_if_late, args=(proc, timeout, late), daemon=True)
    watch.start()
    lines = []
    for line in proc.stdout:
        lines.append((time.monotonic() - t0, line))
        if stop_after is not None and line.startswith(f"step {stop_after}/"):
            proc.send_signal(signal.SIGTERM)
            stop_after = None
    proc.wait()
    drain.join()
    note = f"\n(stopped after {timeout:g} s)" if late.is_set() else ""
    return Done(proc.returncode, "".join(line for _, line in lines), "".join(err) + note, time.monotonic() - t0, lines)


def stop_if_late(proc, timeout, late):
    """SIGTERM `proc` once it has run `timeout` seconds, SIGKILL a minute later (setting `late`)."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        late.set()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def command(script, *args):
    return [sys.executable, "-c", PEAK, os.path.join(ROOT, script), *args]


def torchrun(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            os.path.join(ROOT, "train.py"), *args]


def peak_bytes(err):
    """-> (kind: cuda | rss, bytes) of the PEAK line, or None."""
    m = re.search(r"gpu_check peak (cuda|rss) (\d+)", err)
    return (m.group(1), int(m.group(2))) if m else None


def peak_of(err):
    peak = peak_bytes(err)
    return f"{peak[1] / 2**30:.2f} GiB{' RSS' if peak[0] == 'rss' else ''}" if peak else "-"


def why(code, err):
    """The last line of a failed process's stderr that says something (not the peak line)."""
    lines = [l for l in err.strip().splitlines() if l.strip() and not l.startswith("gpu_check peak")]
    return f"exit {code}: {lines[-1].strip()[:200] if lines else 'no message'}"


# ----------------------------------------------------------------------------- data, offline
NOUNS = ("king", "river", "garden", "letter", "captain", "sister", "window", "horse", "city", "winter", "friend",
         "song", "ship", "door", "child", "mountain", "lamp", "storm", "teacher", "road")
ADJECTIVES = ("old", "quiet", "bright", "small", "patient", "cold", "green", "honest", "tired", "distant")
VERBS = ("found", "watched", "carried", "remembered", "followed", "painted", "answered", "opened", "lost", "praised")
PLACES = ("across the field", "by the sea", "before dawn", "in the kitchen", "under the bridge", "at the market",
          "after the rain", "near the church", "on the hill", "through the forest")


def english(chars, seed=0):
    """Deterministic English-like text of at least `chars` characters: paragraphs of sentences drawn from a small
    grammar, so that the check needs no corpus and no download."""
    rng = random.Random(seed)
    paragraphs, size = [], 0
    while size < chars:
        sentences = []
        for _ in range(rng.randint(3, 7)):
            words = (rng.choice(("the", "a", "my", "our")), rng.choice(ADJECTIVES), rng.choice(NOUNS),
                     rng.choice(VERBS), "the", rng.choice(NOUNS), rng.choice(PLACES))
            sentences.append(" ".join(words).capitalize() + rng.choice((".", ".", ".", "!", "?")))
        paragraphs.append(" ".join(sentences))
        size += len(paragraphs[-1]) + 2
    return "\n\n".join(paragraphs) + "\n"


def check_encoding(name):
    """Stop at once, with how to fix it, where tiktoken cannot read encoding `name`'s files (not cached, and no
    network): preparing the data and decoding samples both need them."""
    from bincode_gpt.tokenizer import encoding_parts

    try:
        encoding_parts(name)
    except Exception as e:  # tiktoken's download fails with whatever its HTTP client raises
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
        where = f"TIKTOKEN_CACHE_DIR={cache} holds" if cache else "tiktoken's default cache holds"
        raise ValueError(f"tiktoken's {name} encoding could not be read ({type(e).__name__}: {str(e)[:100]}): "
                         f"{where} no copy and its files cannot be downloaded here. On a machine with internet run "
                         f"`TIKTOKEN_CACHE_DIR=/path/tiktoken-cache python -c \"import tiktoken; "
                         f"tiktoken.get_encoding('{name}')\"`, copy that folder here and set TIKTOKEN_CACHE_DIR to "
                         "it") from None


def prepare(work):
    """The check's own text, prepared at vocab VOCAB into work/data -> that folder."""
    text, data = os.path.join(work, "text.txt"), os.path.join(work, "data")
    atomic_write(text, english(TEXT_CHARS))
    done = run([sys.executable, os.path.join(ROOT, "prepare_data.py"), text, "--out", data,
                f"--vocab_size={VOCAB}", "--workers=1"])
    if done.code:
        raise ValueError(f"prepare_data.py on the check's own text failed ({why(done.code, done.err)}): give "
                         "prepared data with --data_dir")
    return data


# ----------------------------------------------------------------------------- logs
def train_flags(cfg, cuda, data_dir, out_dir, **kw):
    """The quick start's `python train.py` (bfloat16 and --compile on CUDA), or a tiny run on a CPU; kw overrides."""
    sizes = {} if cuda else dict(preset="tiny", block_size=32, batch_size=4, eval_steps=2)
    settings = {**dict(data_dir=data_dir, out_dir=out_dir, device="cuda" if cuda else "cpu",
                       dtype="bfloat16" if cuda else "float32", max_steps=cfg.steps, log_interval=1,
                       eval_interval=max(1, cfg.steps // 4), save_interval=max(1, cfg.steps // 2),
                       warmup_steps=max(1, cfg.steps // 10), compile=cfg.compile, **sizes), **kw}
    flags = [f"--{k}={v}" for k, v in settings.items() if not isinstance(v, bool)]
    return flags + [f"--{k}" for k, v in settings.items() if v is True]


def read_log(out_dir):
    """{(event, step): {name: value} that a resumed run must repeat} of a run's log.jsonl, and its entries."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        entries = [json.loads(line) for line in f]
    return {(e["event"], e["step"]): {k: e.get(k) for k in LOGGED[e["event"]]} for e in entries
            if e["event"] in LOGGED}, entries


def differences(ref, got, rtol):
    """-> (the (event, step) entries of two read_log()s that differ, the largest relative difference of a NOISY
    value). rtol 0: every value bit for bit; else NOISY values within rtol (relative), the others exactly."""
    differ, worst = [], 0.0
    for key in sorted(ref.keys() | got.keys()):
        a, b = ref.get(key), got.get(key)
        if a is None or b is None:
            differ.append(key)
            continue
        for name in a:
            x, y = a[name], b[name]
            if name in NOISY and x is not None and y is not None:
                gap = abs(x - y) / max(abs(x), 1e-30)
                worst = max(worst, gap)
                off = gap > rtol if rtol else x != y
            else:
                off = x != y
            if off:
                differ.append(key)
                break
    return differ, worst


def speed(entries, warmup):
    train = [e for e in entries if e["event"] == "train"]
    kept = train[warmup:] or train
    tok = statistics.median(e["tokens_per_s"] for e in kept) if kept else None
    mfu = [e["mfu"] for e in kept if e.get("mfu") is not None]
    return tok, statistics.median(mfu) if mfu else None


def announced(out):
    """The last step a run printed ("step N/..."), or None: on a signal, the step train.py stops and saves at."""
    steps = re.findall(r"^step (\d+)/", out, flags=re.M)
    return int(steps[-1]) if steps else None


def saved_step(out_dir):
    """The step out_dir's ckpt.pt holds, or None."""
    import torch

    path = os.path.join(out_dir, "ckpt.pt")
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"] if os.path.exists(path) else None


# ----------------------------------------------------------------------------- the checks
def check_training(cfg, cuda, data, work):
    """The reference run, the stopped and resumed one, and --init_from -> rows."""
    rows, ref = [], os.path.join(work, "reference")
    done = run(command("train.py", *train_flags(cfg, cuda, data, ref)), timeout=cfg.timeout)
    if done.code:
        return [Row("train (quick start)", False, peak=peak_of(done.err), wall_s=done.wall,
                    note=why(done.code, done.err))]
    ref_log, entries = read_log(ref)
    tok, mfu = speed(entries, cfg.warmup)
    dtype = "bfloat16, compiled" if cuda and cfg.compile else "bfloat16" if cuda else "float32"
    rows.append(Row("train (quick start)", True, tokens_per_s=tok, mfu=mfu, peak=peak_of(done.err),
                    wall_s=done.wall, note=f"{cfg.steps} steps, {dtype}"))

    flags = lambda out_dir, **kw: train_flags(cfg, cuda, data, out_dir, **kw)
    rows.append(stop_and_resume("SIGTERM, then --resume", cfg, cuda, launch=lambda *a: command("train.py", *a),
                                flags=flags, out_dir=os.path.join(work, "stopped"), ref_log=ref_log, exits=0))

    tuned = os.path.join(work, "init_from")
    steps = max(2, cfg.steps // 4)
    done = run(command("train.py", *flags(tuned, init_from=os.path.join(ref, "ckpt.pt"), max_steps=steps)),
               timeout=cfg.timeout)
    if done.code:
        rows.append(Row("--init_from", False, peak=peak_of(done.err), wall_s=done.wall, note=why(done.code, done.err)))
    else:
        first = read_log(tuned)[0][("eval", 0)]["val_loss"]
        last = ref_log[max(k for k in ref_log if k[0] == "eval")]["val_loss"]
        same = first == last if not cuda else abs(first - last) <= 1e-3 * abs(last)
        rows.append(Row("--init_from", same, peak=peak_of(done.err), wall_s=done.wall,
                        note=f"step-0 val loss {first:.6f}, the reference's last {last:.6f}"))
    return rows


def stop_and_resume(name, cfg, cuda, *, launch, flags, out_dir, ref_log, exits):
    """`launch(*flags(out_dir))` gets SIGTERM once it prints step --stop_at and must exit with `exits`, its
    ckpt.pt at the step it announced; `--resume` then runs it to --steps, its log compared with ref_log -> a Row."""
    first = run(launch(*flags(out_dir)), stop_after=cfg.stop_at, timeout=cfg.timeout)
    step, saved = announced(first.out), saved_step(out_dir)
    if "SIGTERM: finishing this step" not in first.err or first.code != exits:
        return Row(name, False, wall_s=first.wall, note=f"no SIGTERM stop at step {cfg.stop_at} (expected exit "
                                                         f"{exits}), {why(first.code, first.err)}")
    if saved != step or step >= cfg.steps:
        return Row(name, False, wall_s=first.wall, note=f"train.py announced step {step} of {cfg.steps}, but "
                                                         f"ckpt.pt holds step {saved}")
    second = run(launch(*flags(out_dir, resume=True)), timeout=cfg.timeout)
    wall = first.wall + second.wall
    if second.code:
        return Row(name, False, peak=peak_of(second.err), wall_s=wall, note=why(second.code, second.err))
    rtol = RESUME_RTOL if cuda else 0
    differ, worst = differences(ref_log, read_log(out_dir)[0], rtol)
    same = ("log bit-identical" if not rtol else
            f"log within rtol {rtol:g} (largest difference {worst:.1e}; step, lr, tokens exact)")
    note = (f"stopped at step {step} (ckpt.pt holds it), resumed to {cfg.steps}: {same}" if not differ else
            f"log differs at {len(differ)} entries, first {differ[0][0]} step {differ[0][1]} (largest difference "
            f"{worst:.1e}{f', rtol {rtol:g}' if rtol else ''})")
    return Row(name, not differ, peak=peak_of(second.err), wall_s=wall, note=note)


def estimated_bytes(mcfg, batch_size):
    """preflight's estimate of what training at batch_size holds (the paper row trains in bfloat16, eager): the one
    place the check asks for it."""
    from bincode_gpt.memory import training_bytes

    return training_bytes(mcfg, batch_size, "bfloat16")


def first_batch(mcfg, free):
    """The largest of BATCHES whose estimate fits in `free` bytes, else the smallest."""
    return next((b for b in BATCHES if estimated_bytes(mcfg, b) <= free), BATCHES[-1])


def out_of_memory(done):
    """Whether a try ran out of memory, or preflight refused it as too big (a smaller batch may run)."""
    return done.code != 0 and re.search(r"out of memory|is free on", done.err, flags=re.I) is not None


def largest_batch_that_runs(attempt, first):
    """attempt(batch) -> Done, from `first` down BATCHES while a try runs out of memory -> (the batch of the last
    try, its Done, the batches that ran out of memory)."""
    failed = []
    for batch in BATCHES[BATCHES.index(first):]:
        done = attempt(batch)
        if not out_of_memory(done):
            return batch, done, failed
        failed.append(batch)
    return batch, done, failed


def check_paper(cfg, cuda, data, work):
    """One row: the paper preset (tiny on a CPU) at the largest batch that runs, its speed and peak memory against
    preflight's estimate, and how long its stop path after the last step took (the save under torchrun's
    --shutdown_timeout)."""
    import torch

    from bincode_gpt.memory import available_memory
    from model import get_config

    name = "paper preset, largest batch"
    shape = dict(preset="paper", vocab_size=65536) if cuda else dict(preset="tiny", block_size=32)
    mcfg = get_config(**shape)
    device = torch.device("cuda" if cuda else "cpu")
    first = first_batch(mcfg, available_memory(device) or 0)
    attempt = lambda b: run(command("train.py", *train_flags(
        cfg, cuda, data, os.path.join(work, f"paper-b{b}"), **shape, batch_size=b, max_steps=3, warmup_steps=1, lr=6e-4,
        eval_interval=0, save_interval=0, compile=False)), timeout=cfg.timeout)
    batch, done, failed = largest_batch_that_runs(attempt, first)
    tried = f" ({', '.join(map(str, failed))} ran out of memory)" if failed else ""
    if done.code:
        return Row(name, False, peak=peak_of(done.err), wall_s=done.wall, note=f"batch {batch}{tried}: "
                                                                              f"{why(done.code, done.err)}")
    tok, mfu = speed(read_log(os.path.join(work, f"paper-b{batch}"))[1], 1)
    stepped = [t for t, line in done.lines if line.startswith("step ")]
    ended = [t for t, line in done.lines if line.startswith("done:")]
    ckpt = os.path.join(work, f"paper-b{batch}", "ckpt.pt")
    save = (f"; the stop path after the last step (one-batch check, RNG states, fsync'd {os.path.getsize(ckpt) / 1e9:.2f}"
            f" GB ckpt.pt) {ended[0] - stepped[-1]:.1f} s" if stepped and ended and os.path.exists(ckpt) else "")
    estimate, (kind, peak) = estimated_bytes(mcfg, batch), peak_bytes(done.err) or (None, None)
    what = (f"{mcfg.n_layer} x {mcfg.n_embd}, context {mcfg.block_size}, V {mcfg.vocab_size:,}, eager "
            f"{'bfloat16' if cuda else 'float32'}")
    if kind != "cuda":
        return Row(name, True, tokens_per_s=tok, mfu=mfu, peak=peak_of(done.err), wall_s=done.wall,
                   note=f"dry run, tiny preset ({what}): batch {batch} of {first} first tried{tried}; preflight's "
                   f"estimate {estimate / 2**20:.1f} MiB (an RSS holds the interpreter: not compared){save}")
    fits = peak <= estimate
    return Row(name, fits, tokens_per_s=tok, mfu=mfu, peak=peak_of(done.err), wall_s=done.wall,
               note=f"{what}: batch {batch} of {first} first tried{tried}; peak {peak / 2**30:.1f} GiB against preflight's "
               f"estimate {estimate / 2**30:.1f} GiB{'' if fits else ' (below the peak: cannot warn before an OOM)'}"
               f"{save}")


def check_torchrun(cfg, cuda, data, work):
    """Two processes under torchrun, grad_accum 2, uninterrupted and stopped and resumed -> rows."""
    import torch

    names = ("torchrun, 2 processes, grad_accum 2", "torchrun: SIGTERM, then --resume")
    if cuda and torch.cuda.device_count() < 2:
        return [Row(n, None, note="skipped: one GPU, and NCCL refuses two ranks on one GPU (train.py uses NCCL "
                                  "for CUDA tensors; gloo on CUDA is not a train.py option)") for n in names]
    flags = lambda out_dir, **kw: train_flags(cfg, cuda, data, out_dir, grad_accum=2, **kw)
    out_dir = os.path.join(work, "torchrun")
    done = run(torchrun(2, *flags(out_dir)), timeout=cfg.timeout)
    if done.code:
        return [Row(names[0], False, wall_s=done.wall, note=why(done.code, done.err))]
    ref_log, entries = read_log(out_dir)
    tok, mfu = speed(entries, min(cfg.warmup, cfg.steps - 1))
    start = next(e for e in entries if e["event"] == "start")
    steps = [e["step"] for e in entries if e["event"] == "train"] == list(range(1, cfg.steps + 1))
    how = f"{'nccl' if cuda else 'gloo'}{', compiled' if cfg.compile else ''}"
    row = Row(names[0], steps and start["world_size"] == 2, tokens_per_s=tok, mfu=mfu, wall_s=done.wall,
              note=f"{how}, {cfg.steps} steps, world size {start['world_size']}")
    # torchrun forwards the signal to its ranks, which save and exit 0, then re-raises it itself: exit 1
    stopped = stop_and_resume(names[1], cfg, cuda, launch=lambda *a: torchrun(2, *a), flags=flags,
                              out_dir=os.path.join(work, "torchrun-stopped"), ref_log=ref_log, exits=1)
    return [row, stopped]


def check_sampling(cfg, cuda, work):
    """sample.py from the reference's checkpoint, eager, --compile and (CUDA) --compile --cuda_graphs -> rows (greedy:
    the texts should agree)."""
    rows, texts = [], {}
    for way, flags in (("eager", []), ("compiled", ["--compile"]), ("CUDA graphs", ["--compile", "--cuda_graphs"])):
        if way == "CUDA graphs" and not cuda:
            rows.append(Row(f"sample.py, {way}", None, note="skipped: CUDA only (sample.py refuses --cuda_graphs "
                                                            "here)"))
            continue
        if way != "eager" and not cfg.sample_compile:
            rows.append(Row(f"sample.py, {way}", None, note="skipped (--no-sample_compile)"))
            continue
        args = ["--ckpt", os.path.join(work, "reference"), "--device", "cuda" if cuda else "cpu", "--prompt", PROMPT,
                "--temperature", "0", "--max_new_tokens", str(cfg.sample_tokens), *flags]
        done = run(command("sample.py", *args), timeout=cfg.timeout)
        ok = done.code == 0 and done.out.startswith(PROMPT) and len(done.out) > len(PROMPT) + 1
        texts[way] = done.out
        note = f"{cfg.sample_tokens} greedy tokens" if ok else why(done.code, done.err) if done.code else "no text"
        rows.append(Row(f"sample.py, {way}", ok, peak=peak_of(done.err), wall_s=done.wall, note=note))
    for r in rows[1:]:
        if r.ok and rows[0].ok:
            way = r.check.removeprefix("sample.py, ")
            r.note += ", the eager text" if texts[way] == texts["eager"] else ", text differs from eager"
    return rows


def rows_of(name, check_fn, *args):
    """check_fn(*args) -> its rows; an exception in it (a log or an output not as this check expects) is one FAIL
    row, `name`, and the other checks still run: one GPU session gets the whole table."""
    try:
        return check_fn(*args)
    except Exception as e:
        return [Row(name, False, note=f"gpu_check itself failed: {type(e).__name__}: {one_line(str(e), 150)}")]


def table(rows, device_name):
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    lines = [f"GPU check on {device_name}", "",
             "| check | result | tokens/s | MFU | peak memory | wall s | note |", "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        result = "skipped" if r.ok is None else "ok" if r.ok else "**FAIL**"
        mfu = fmt(r.mfu and 100 * r.mfu, ".1f") + ("%" if r.mfu else "")
        lines.append(f"| {r.check} | {result} | {fmt(r.tokens_per_s, ',.0f')} | {mfu} | {r.peak} | "
                     f"{fmt(r.wall_s, '.0f')} | {r.note} |")
    return "\n".join(lines) + "\n"


def check(cfg):
    """Run every step -> (rows, device name)."""
    import torch

    from bincode_gpt.shards import load_meta

    device = pick_device(cfg.device)
    if cfg.device == "auto" and device.type != "cuda":
        raise ValueError("no CUDA GPU here: --device cpu runs the same steps as a dry run at tiny sizes")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"the GPU check runs on CUDA (or --device cpu, a dry run), not on {device.type}")
    cuda = device.type == "cuda"
    cfg.steps = cfg.steps or (100 if cuda else 8)
    cfg.stop_at = cfg.stop_at or cfg.steps // 2
    cfg.compile = cuda if cfg.compile is None else cfg.compile
    if not (1 <= cfg.stop_at < cfg.steps):
        raise ValueError(f"--stop_at must be a step in [1, --steps), got {cfg.stop_at} with --steps {cfg.steps}")
    check_encoding(load_meta(cfg.data_dir)["encoding"] if cfg.data_dir else "gpt2")
    work = cfg.work or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(work, exist_ok=True)
    try:
        data = os.path.abspath(cfg.data_dir) if cfg.data_dir else prepare(work)
        rows = rows_of("train (quick start)", check_training, cfg, cuda, data, work)
        if rows[0].ok:  # the rest start from its checkpoint
            if cfg.paper:
                rows += rows_of("paper preset, largest batch", lambda *a: [check_paper(*a)], cfg, cuda, data, work)
            rows += rows_of("torchrun", check_torchrun, cfg, cuda, data, work)
            rows += rows_of("sample.py", check_sampling, cfg, cuda, work)
    finally:
        if not cfg.work:
            shutil.rmtree(work, ignore_errors=True)
    name = torch.cuda.get_device_name(device) if cuda else f"cpu ({os.cpu_count()} cores), a dry run at tiny sizes"
    return rows, f"{name}, torch {torch.__version__}"


def main(argv=None):
    description, epilog = __doc__.strip().split("\n\n", 1)
    cfg = parse_settings(config_parser(CheckConfig, description, epilog), argv)
    rows, name = check(cfg)
    report = table(rows, name)
    print(report, end="")
    if cfg.out:
        atomic_write(cfg.out, report)
    return 1 if any(r.ok is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
