"""
The GPU path end to end, in one command, on a GPU node that has only this checkout and no network: the paper
preset at the largest batch that runs; the quick start in bfloat16 with --compile; sampling from its checkpoint,
eager, compiled and as CUDA graphs; a run stopped with SIGTERM and resumed to the end, its log compared with the
uninterrupted run's; --init_from; with two or more GPUs, torchrun (grad_accum 2) and a stop and resume under it.
One markdown table (tokens/s, MFU, peak memory, every failure), written row by row as each ends.

    python -m tools.gpu_check --out "$OUT"          # on the CUDA GPU: each row's file in $OUT as it ends
    python -m tools.gpu_check                       # the table on stdout (and in $OUT where that is set)
    python -m tools.gpu_check --work /shared/gc     # runs kept there: the paper row times a save to that disk
    python -m tools.gpu_check --device cpu          # a dry run of the same steps at tiny sizes (CI)

Design choices, up front:
- Nothing from outside the checkout: the text is its own (deterministic English-like sentences, prepared at
  vocab 512 in the work folder) unless --data_dir names prepared data, and GPT-2's two tiktoken files ship in
  tools/tiktoken-cache, which TIKTOKEN_CACHE_DIR is set to (for the check and every process it starts) where
  none is set. Another encoding (--data_dir) must be in the user's cache: else the check stops at once.
- Written as it goes (--out, default $OUT): as each row ends, its own file NN-name.md (the row; for a failure,
  the last lines its process wrote to stderr) and gpu_check.md (the table so far), each written atomically, so a
  job stopped at its time limit keeps every row that ended. A row skipped gets no file: on one GPU, 10 row files
  and the table at most. --work (default: a temp folder, removed at the end) must be new or empty, and --out
  must hold no gpu_check.md: a second run there is refused before any work.
- Whatever the box lacks, the table comes: its first row is the environment (torch, CUDA, the card and its
  compute mode, the compiler and Python's headers, numpy and tiktoken, free disk). Each row declares what it
  needs beyond torch (ROWS): the scripts' rows numpy and tiktoken (their data and tokenizer), the compiled rows a
  compiler (C for Triton on CUDA, C++ for inductor on a CPU, on PATH). A row whose needs are absent is skipped
  naming them, and the training runs go eager where no compiler is found. Two rows need torch alone: the paper
  preset's speed, MFU and peak on token ids they make (eager), and the mini model compiled (made_ids_steps).
- Rows in the order of their value, each as independent of the others as it can be: the torch-only rows; the
  paper row (eager, from the data alone; its speed kept when a later step of it fails); the quick start, whose
  checkpoint the rows after it start from (where its compiled run fails, the row fails and an eager run stands
  in for it, and the rows after it train eager); sampling, eager, compiled and as CUDA graphs; the stop and
  resume; --init_from; torchrun.
- Time: each row has a share of seconds (ROWS), the processes it starts included: a process still running
  GRACE seconds before the end of its row's share gets SIGTERM, then SIGKILL at the end; and no row runs past
  --time_limit (570 s), under a 600 s job. A CPU dry run's shares are 5 times as long (--time_scale): its
  times say nothing, and a loaded machine must not fail it. The shares of one GPU's rows add up to 550 s
  (the torchrun rows, with two GPUs or more, need a longer --time_limit). Expected on one H200 (an estimate: no
  GPU has run it yet; each process starts in ~10 s, importing torch and starting CUDA): the data ~5 s; the
  paper row ~40 s (470M parameters built, 3 steps of 16 x 1,024 tokens at ~0.3 s, an fsync'd 5.6 GB save
  ~15 s; a batch that faults costs ~20 s more); the quick start ~70 s (compiling the mini model's training and
  evaluation graphs from cold, ~50 s; its 100 steps take seconds); sampling ~100 s (eager ~10 s, each compiled
  way ~45 s); the stop and resume ~50 s and --init_from ~25 s (inductor's cache warm by then): ~5 minutes,
  and 9.5 at most.
- Every step runs the scripts' real command lines (train.py, sample.py, torchrun) in a process of its own, in
  the work folder: nothing here re-implements them. A child's stdout is read line by line and its stderr
  drained by a thread alongside, so a child that writes more than a pipe holds to either never blocks.
- A stopped run gets SIGTERM when its output prints step --stop_at (under torchrun, torchrun gets it and
  forwards it, as a scheduler's would); train.py finishes the step it is in, announces it ("step N/"),
  saves and exits; ckpt.pt must hold that step, and --resume then runs to --steps. Its log.jsonl (step,
  loss, lr, gradient norm, tokens, val loss) must equal the uninterrupted run's: bit for bit on a CPU; on
  CUDA step, lr and tokens exactly and losses and gradient norms within RESUME_RTOL (relative), since
  CUDA's kernels are not deterministic (atomic adds in index and scatter backwards, split-K matmuls), so two
  runs of one command already differ in the last bits. The note gives the largest difference found.
- --init_from starts a run from the reference's ckpt.pt: its step-0 validation loss must be the reference's last
  (the same weights on the same windows; on a GPU within 1e-3, as bfloat16 kernels may order sums otherwise).
- The paper row: the paper preset (32 x 1024, context 1,024, V = 65,536), eager bfloat16, PAPER_STEPS steps at
  the paper-size runs' --lr 6e-4, at the largest batch that runs: the first tried is the largest of BATCHES
  that the memory check's estimate fits in free memory and that gives cross_entropy fewer than 2^31 logits
  (batch 32 gives it exactly 2^31, which overflows its 32-bit indexing), then smaller ones while a try fails
  with a CUDA fault (out of memory, an illegal memory access, ...) before its last step. Its peak
  (max_memory_allocated) and tokens/s are written beside the memory check's estimate, and the peak must not
  exceed it (else the check could not warn before an out-of-memory); the time from its last step to the end (the
  one-batch check, the RNG states, the fsync'd ~5.6 GB ckpt.pt, written under --work) is what a stop under
  torchrun must fit in its --shutdown_timeout (docs/usage.md). On a CPU the tiny preset stands in, its RSS not compared.
- The CUDA-graphs row counts the graphs recorded: train.py and sample.py run under CHILD, which counts each
  torch.cuda.CUDAGraph replayed (inductor replays a graph as soon as it records it); none recorded is a
  FAIL, with inductor's reason for skipping them (TORCH_LOGS=cudagraphs). On a CPU the row is n/a.
- torchrun: two processes, grad_accum 2. On a CPU, gloo; on one GPU, skipped with a note: NCCL refuses two
  ranks on one GPU, and train.py picks NCCL for CUDA tensors. With two or more GPUs, one process each.
- tokens/s and MFU are the median over the logged steps after the first --warmup (compiling); MFU is against
  the GPU's datasheet peak for bfloat16 (bincode_gpt/devices.py), named in the table's heading. Peak memory
  is the process's (torch.cuda.max_memory_allocated on CUDA, peak RSS on a CPU). Sampling rows give the
  process's wall time, loading and compiling included.
- Runs on torch 2.11 as on 2.13 (the torch APIs checked: docs/performance.md, "The GPU path").
- Exit status 1 if any row failed (the table says which and why), else 0.
"""

import importlib
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.exits import one_line, run_main
from bincode_gpt.devices import auto_dtype, pick_device
from bincode_gpt.files import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIKTOKEN_CACHE = os.path.join(ROOT, "tools", "tiktoken-cache")  # GPT-2's files, shipped (its README says which)
# runs a root script as its __main__ and says on stderr at exit, however it exits, its peak memory and how many
# CUDA graphs it replayed, and how often (inductor's cudagraph trees replay each graph once they record it)
CHILD = """import resource, runpy, sys
import torch
script = sys.argv.pop(1)
sys.argv[0] = script
replays = {}  # id of each CUDA graph replayed -> its replays
if torch.cuda.is_available():
    replay = torch.cuda.CUDAGraph.replay
    def counted(graph):
        replays[id(graph)] = replays.get(id(graph), 0) + 1
        return replay(graph)
    torch.cuda.CUDAGraph.replay = counted
try:
    runpy.run_path(script, run_name="__main__")
finally:
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"gpu_check peak {'cuda' if cuda else 'rss'} {peak}", file=sys.stderr, flush=True)
    print(f"gpu_check cuda_graphs {len(replays)} replays {sum(replays.values())}", file=sys.stderr, flush=True)
"""
# runs made_ids_steps in a process of its own (torch and model.py alone): its arguments as JSON in argv[1]
MADE_IDS = "import json, sys; from tools.gpu_check import made_ids_steps; made_ids_steps(**json.loads(sys.argv[1]))"
LOGGED = {"train": ("step", "loss", "lr", "grad_norm", "tokens"), "eval": ("step", "val_loss", "best_val_loss")}
NOISY = {"loss", "grad_norm", "val_loss", "best_val_loss"}  # the logged values that CUDA's kernels may move
RESUME_RTOL = 1e-2  # CUDA: a resumed run's losses and gradient norms against the uninterrupted run's, relative
BATCHES = (64, 32, 16, 8, 4, 2, 1)  # the paper row's batch sizes, tried from the largest that the estimate fits
LOGITS_LIMIT = 2**31  # cross_entropy's logits (batch x context x V) from here on overflow its 32-bit indexing
PAPER_STEPS = 3
# a paper-row try that failed with one of these before its last step may run at a smaller batch
CUDA_FAULT = re.compile(r"out of memory|is free on|CUDA error|AcceleratorError|illegal memory access|CUBLAS_STATUS|"
                        r"CUDNN_STATUS|unspecified launch failure", flags=re.I)
# "torch.OutOfMemoryError: CUDA out of memory...", not torchrun's "ChildFailedError:" (its message is the summary
# under it: the rank's own error line above it says more)
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception): \S")
PROMPT = "The"
TEXT_CHARS = 300_000  # ~120k tokens at vocab 512: validation windows enough for the paper preset's 1,024 context
VOCAB = 512  # of the check's own data (K = 9, the quick start's)
GRACE = 10  # seconds between a late process's SIGTERM (train.py saves and exits) and its SIGKILL
PREPARE_S = 30  # seconds for preparing the check's own text
EAGER_S = 30  # of the quick start's share, kept for the eager run that stands in for a failed compiled one
MIN_ROW_S = 2 * GRACE  # a row that would start with less of --time_limit left is skipped
TABLE = "gpu_check.md"


@dataclass
class CheckConfig:
    device: str = setting("auto", "cuda (auto: the CUDA GPU) | cpu: a dry run at tiny sizes")
    data_dir: str | None = setting(None, "prepared data (default: the check's own text, prepared in the work folder)")
    work: str | None = setting(None, "folder for the runs, new or empty, kept (default: a temp folder, removed at "
                                     "the end)")
    out: str | None = setting(None, "folder for the table and each row's file, written as each row ends "
                                    "(default: $OUT where it is set, else none: the table on stdout only)")
    time_limit: float = setting(570, "seconds the whole check may take: a row gets its share within what is left, "
                                     "and one that would start with less than 20 s left is skipped")
    time_scale: float | None = setting(None, "each row's share of seconds multiplied by this (default: 1 on CUDA; "
                                             "5 on a CPU, whose dry run shares the machine with whatever else runs)")
    steps: int | None = setting(None, "training steps of each run (default: 100 on CUDA, 8 on a CPU)")
    stop_at: int | None = setting(None, "the step after which the stopped runs get SIGTERM (default: steps / 2)")
    warmup: int = setting(5, "first steps left out of tokens/s and MFU (compiling)")
    compile: bool | None = setting(None, "torch.compile the training runs (default: on CUDA only)")
    paper: bool = setting(True, "the paper-preset row (--no-paper: skipped)")
    sample_compile: bool = setting(True, "also sample with --compile (--no-sample_compile: skipped, as CI's dry run "
                                         "does: it compiles for tens of seconds on a CPU)")
    sample_tokens: int = setting(64, "tokens per sample")


@dataclass
class Row:
    check: str
    ok: bool | None  # None: skipped
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak: str = "-"
    wall_s: float | None = None
    note: str = ""
    log: str = ""  # a failure's last stderr lines: in the row's own file, not in the table


@dataclass
class Done:
    """A finished child process."""
    code: int
    out: str
    err: str
    wall: float
    lines: list = field(default_factory=list)  # (seconds since its start, stdout line)
    late: bool = False  # stopped for time: a failure whatever its exit (train.py saves and exits 0 on SIGTERM)
    cmd: list = field(default_factory=list)

    @property
    def failed(self):
        return self.code != 0 or self.late


@dataclass
class Context:
    """What every row's check reads: the settings, whether it runs on CUDA, the prepared data, the work folder,
    and the dtype train.py's --dtype auto picks there (devices.auto_dtype)."""
    cfg: CheckConfig
    cuda: bool
    data: str | None  # prepared for the first row that reads it
    work: str
    dtype: str
    texts: dict = field(default_factory=dict)  # sample.py's text of each way, the others compared with eager's


# ----------------------------------------------------------------------------- processes
def run(cmd, stop_after=None, timeout=900, env=None):
    """Run cmd in the repository root -> Done. Its stdout is read line by line, each line's arrival time kept,
    and its stderr drained by a thread meanwhile: no pipe is left unread, so a child never blocks on a full
    one. stop_after: SIGTERM once stdout prints that step's line ("step N/"). After `timeout` seconds the
    child gets SIGTERM (torchrun forwards it to its ranks), and SIGKILL GRACE seconds later."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
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
    return Done(proc.returncode, "".join(line for _, line in lines), "".join(err), time.monotonic() - t0, lines,
                late=late.is_set(), cmd=cmd)


def stop_if_late(proc, timeout, late):
    """SIGTERM `proc` once it has run `timeout` seconds, SIGKILL GRACE seconds later (setting `late`)."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        late.set()
        proc.terminate()
        try:
            proc.wait(GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()


def left(until):
    """The timeout of a process that a row starts now: its SIGKILL (GRACE after its SIGTERM) lands by `until`."""
    return max(1, round(until - time.monotonic() - GRACE))


def command(script, *args):
    return [sys.executable, "-c", CHILD, os.path.join(ROOT, script), *args]


def torchrun(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            os.path.join(ROOT, "train.py"), *args]


def peak_bytes(err):
    """-> (kind: cuda | rss, bytes) of CHILD's peak line, or None."""
    m = re.search(r"gpu_check peak (cuda|rss) (\d+)", err)
    return (m.group(1), int(m.group(2))) if m else None


def peak_of(err):
    peak = peak_bytes(err)
    return f"{peak[1] / 2**30:.2f} GiB{' RSS' if peak[0] == 'rss' else ''}" if peak else "-"


def graphs_of(err):
    """-> (CUDA graphs replayed, replays) of CHILD's line, (0, 0) without one."""
    m = re.search(r"gpu_check cuda_graphs (\d+) replays (\d+)", err)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def own_lines(err):
    """A process's stderr lines that say something, less CHILD's."""
    return [line for line in err.strip().splitlines() if line.strip() and not line.startswith("gpu_check ")]


def why(done):
    """Why a process failed, in one line: stopped for time, else the last of its stderr lines that says so: a
    script's own `error:` line (under torchrun, the rank that failed first prints it; another may then fail on the
    lost connection), else an exception's (not a hint printed after it), else its last line."""
    if done.late:
        return f"stopped after {done.wall:.0f} s: its row's share of the time ran out"
    lines = [line.strip() for line in own_lines(done.err)]
    said = ([line for line in lines if line.startswith("error: ")] or
            [line for line in lines if EXCEPTION_LINE.match(line)] or lines or ["no message"])
    return f"exit {done.code}: {said[-1][:200]}"


def failed(name, done, before=""):
    """The FAIL row of a process that failed: why in its note (after `before`); in its log, its command as one
    would type it (a script under CHILD as `python SCRIPT ...`) and its last stderr lines."""
    args = done.cmd[3:] if done.cmd[1:3] == ["-c", CHILD] else done.cmd[1:]
    return Row(name, False, peak=peak_of(done.err), wall_s=done.wall, note=before + why(done),
               log="\n".join([f"$ {shlex.join(['python', *args])}", *own_lines(done.err)[-40:]]))


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


def use_shipped_tiktoken():
    """Point tiktoken at tools/tiktoken-cache where the user set no cache: it reads the variable at each load, so
    this process and every one it starts find GPT-2's files there."""
    if "TIKTOKEN_CACHE_DIR" not in os.environ and "DATA_GYM_CACHE_DIR" not in os.environ:
        os.environ["TIKTOKEN_CACHE_DIR"] = TIKTOKEN_CACHE


def check_encoding(name):
    """Stop at once, with how to fix it, where tiktoken cannot read encoding `name`'s files (not cached, and no
    network): preparing the data and decoding samples both need them."""
    from bincode_gpt.tokenizer import encoding_parts

    try:
        encoding_parts(name)
    except Exception as e:  # tiktoken's download fails with whatever its HTTP client raises
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
        unset = "" if cache == TIKTOKEN_CACHE else " (unset it: the check then reads gpt2's from tools/tiktoken-cache)"
        raise ValueError(f"tiktoken's {name} encoding could not be read ({type(e).__name__}: {str(e)[:100]}): "
                         f"TIKTOKEN_CACHE_DIR={cache}{unset} holds no copy and its files cannot be downloaded "
                         f"here. On a machine with internet run `TIKTOKEN_CACHE_DIR=/path/tiktoken-cache python -c "
                         f"\"import tiktoken; tiktoken.get_encoding('{name}')\"`, copy that folder here and set "
                         "TIKTOKEN_CACHE_DIR to it") from None


def refuse_earlier_runs(work, out):
    """Before any work: --work must be new or empty, and --out hold no table of an earlier check."""
    if work and os.path.isdir(work) and os.listdir(work):
        raise ValueError(f"--work {work} is not empty (an earlier check's runs?): name a new or empty folder, "
                         "each check starts afresh")
    if out and os.path.exists(os.path.join(out, TABLE)):
        raise ValueError(f"--out {out} holds an earlier check's {TABLE}: name a new or empty folder")


def prepare(work, until):
    """The check's own text, prepared at vocab VOCAB into work/data -> that folder."""
    text, data = os.path.join(work, "text.txt"), os.path.join(work, "data")
    atomic_write(text, english(TEXT_CHARS))
    done = run([sys.executable, os.path.join(ROOT, "prepare_data.py"), text, "--out", data,
                f"--vocab_size={VOCAB}", "--workers=1"], timeout=left(until))
    if done.failed:
        raise ValueError(f"prepare_data.py on the check's own text failed ({why(done)}): give "
                         "prepared data with --data_dir")
    return data


# ----------------------------------------------------------------------------- logs
def train_flags(ctx, out_dir, **kw):
    """The quick start's `python train.py` (--dtype auto, --compile on CUDA), or a tiny run on a CPU; kw overrides."""
    cfg = ctx.cfg
    sizes = {} if ctx.cuda else dict(preset="tiny", block_size=32, batch_size=4, eval_steps=2)
    settings = {**dict(data_dir=ctx.data, out_dir=out_dir, device="cuda" if ctx.cuda else "cpu",
                       dtype=ctx.dtype, max_steps=cfg.steps, log_interval=1,
                       eval_interval=max(1, cfg.steps // 4), save_interval=max(1, cfg.steps // 2),
                       warmup_steps=max(1, cfg.steps // 10), compile=cfg.compile, **sizes), **kw}
    flags = [f"--{k}={v}" for k, v in settings.items() if not isinstance(v, bool)]
    return flags + [f"--{k}" for k, v in settings.items() if v is True]


def repeated(out_dir):
    """{(event, step): {name: value} that a resumed run must repeat} of a run's log."""
    from bincode_gpt.run_dir import read_log  # imports torch: not at this tool's start

    return {(e["event"], e["step"]): {k: e.get(k) for k in LOGGED[e["event"]]} for e in read_log(out_dir)
            if e["event"] in LOGGED}


def differences(ref, got, rtol):
    """-> (the (event, step) entries of two repeated()s that differ, the largest relative difference of a NOISY
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


def speed(out_dir, warmup):
    """(median tokens/s, median MFU) of a run's logged steps after the first `warmup`."""
    from bincode_gpt.run_dir import read_log  # imports torch: not at this tool's start

    train = read_log(out_dir, "train")
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


def finished(ctx, out_dir):
    """Whether the run in out_dir ran to --steps (its ckpt.pt holds that step): one a later row can start from."""
    return saved_step(out_dir) == ctx.cfg.steps


# ----------------------------------------------------------------------------- the rows
NO_REFERENCE = "skipped: no finished quick-start run to start from (its row says why)"
ONE_GPU = ("skipped: one GPU, and NCCL refuses two ranks on one GPU (train.py uses NCCL for CUDA tensors; gloo on "
           "CUDA is not a train.py option)")


def mfu_basis(device):
    """What MFU is a fraction of on `device`, named: its datasheet peak for bfloat16, the dtype of every CUDA run."""
    import torch

    from bincode_gpt.devices import peak_flops

    if device.type != "cuda":
        return "MFU: none on a CPU (no datasheet peak)"
    name, peak = torch.cuda.get_device_name(device), peak_flops(device, "bfloat16")
    if peak is None:
        return f"MFU: none, {name!r} is not in bincode_gpt/devices.py's PEAK_FLOPS"
    return f"MFU against the {name}'s bfloat16 datasheet peak, {peak / 1e12:,.0f} TFLOP/s (bincode_gpt/devices.py)"


def estimated_bytes(mcfg, batch_size):
    """The memory check's estimate of what training at batch_size holds (the paper row trains in bfloat16,
    eager): the one place the check asks for it."""
    from bincode_gpt.memory import training_bytes

    return training_bytes(mcfg, batch_size, "bfloat16")


def runnable(mcfg):
    """The BATCHES that give cross_entropy fewer than LOGITS_LIMIT logits."""
    return [b for b in BATCHES if b * mcfg.block_size * mcfg.vocab_size < LOGITS_LIMIT]


def first_batch(mcfg, free):
    """The largest runnable batch whose estimate fits in `free` bytes, else the smallest."""
    batches = runnable(mcfg)
    return next((b for b in batches if estimated_bytes(mcfg, b) <= free), batches[-1])


def faulted_early(done):
    """Whether a paper-row try failed with a CUDA fault, or the memory check's refusal, before its last step: a smaller
    batch may run. A fault after it (saving) is no batch's."""
    return done.failed and announced(done.out) != PAPER_STEPS and CUDA_FAULT.search(done.err) is not None


def largest_batch_that_runs(attempt, first):
    """attempt(batch) -> Done, from `first` down BATCHES while a try faults early -> (the batch of the last try,
    its Done, the batches that faulted)."""
    faulted = []
    for batch in BATCHES[BATCHES.index(first):]:
        done = attempt(batch)
        if not faulted_early(done):
            return batch, done, faulted
        faulted.append(batch)
    return batch, done, faulted


def check_paper(ctx, name, until):
    """The paper preset (tiny on a CPU) at the largest batch that runs: its speed and peak memory beside
    the memory check's estimate, and how long its stop path after the last step took (the save under torchrun's
    --shutdown_timeout)."""
    import torch

    from bincode_gpt.memory import available_memory
    from model import get_config

    if not ctx.cfg.paper:
        return Row(name, None, note="skipped (--no-paper)")
    shape = dict(preset="paper", vocab_size=65536) if ctx.cuda else dict(preset="tiny", block_size=32)
    mcfg = get_config(**shape)
    device = torch.device("cuda" if ctx.cuda else "cpu")
    first = first_batch(mcfg, available_memory(device) or 0)
    out_dir = lambda b: os.path.join(ctx.work, f"paper-b{b}")
    attempt = lambda b: run(command("train.py", *train_flags(
        ctx, out_dir(b), **shape, batch_size=b, max_steps=PAPER_STEPS, warmup_steps=1, lr=6e-4, eval_interval=0,
        save_interval=0, compile=False)), timeout=left(until))
    batch, done, faulted = largest_batch_that_runs(attempt, first)
    too_many = [b for b in BATCHES if b not in runnable(mcfg)]
    tried = f" ({', '.join(map(str, faulted))} faulted)" if faulted else ""
    if too_many:
        tried += f"; {', '.join(map(str, too_many))} not tried (2^31 logits or more overflow cross_entropy)"
    if done.failed:  # its speed, where it stepped before the failure (a save that failed, a fault after the steps)
        row = failed(name, done, before=f"batch {batch}{tried}: ")
        if os.path.exists(os.path.join(out_dir(batch), "log.jsonl")):
            row.tokens_per_s, row.mfu = speed(out_dir(batch), 1)
        return row
    tok, mfu = speed(out_dir(batch), 1)
    stepped = [t for t, line in done.lines if line.startswith("step ")]
    ended = [t for t, line in done.lines if line.startswith("done:")]
    ckpt = os.path.join(out_dir(batch), "ckpt.pt")
    save = (f"; the stop path after the last step (one-batch check, RNG states, fsync'd "
            f"{os.path.getsize(ckpt) / 1e9:.2f} GB ckpt.pt) {ended[0] - stepped[-1]:.1f} s"
            if stepped and ended and os.path.exists(ckpt) else "")
    estimate, (kind, peak) = estimated_bytes(mcfg, batch), peak_bytes(done.err) or (None, None)
    what = f"{mcfg.n_layer} x {mcfg.n_embd}, context {mcfg.block_size}, V {mcfg.vocab_size:,}, eager {ctx.dtype}"
    speed_s = f"{tok:,.0f} tokens/s" if tok else "no tokens/s"
    if kind != "cuda":
        return Row(name, True, tokens_per_s=tok, mfu=mfu, peak=peak_of(done.err), wall_s=done.wall,
                   note=f"dry run, tiny preset ({what}): batch {batch} of {first} first tried{tried}; {speed_s} "
                   f"beside the memory check's estimate {estimate / 2**20:.1f} MiB (an RSS holds the interpreter: not "
                   f"compared){save}")
    fits = peak <= estimate
    return Row(name, fits, tokens_per_s=tok, mfu=mfu, peak=peak_of(done.err), wall_s=done.wall,
               note=f"{what}: batch {batch} of {first} first tried{tried}; peak {peak / 2**30:.1f} GiB and "
               f"{speed_s} beside the memory check's estimate {estimate / 2**30:.1f} GiB"
               f"{'' if fits else ' (below the peak: cannot warn before an OOM)'}; {mfu_basis(device)}{save}")


def made_ids_steps(*, shape, batches, steps, device, compile):
    """Train GPT(get_config(**shape)) `steps` AdamW steps on token ids drawn here (torch and model.py alone: no data,
    no tokenizer), bfloat16 autocast on CUDA, at the first of `batches` that does not run out of memory, compiled
    where asked; a line "gpu_check made_ids {json}" on stdout after each step (batch, seconds, peak bytes), so a
    failure later keeps the steps before it."""
    import resource
    from contextlib import nullcontext

    import torch

    from model import GPT, get_config

    device = torch.device(device)
    mcfg = get_config(**shape)
    torch.manual_seed(0)
    model = GPT(mcfg).to(device)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    forward = torch.compile(model) if compile else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    for batch in batches:
        try:
            for _ in range(steps):
                ids = torch.randint(mcfg.vocab_size, (batch, mcfg.block_size + 1), device=device)  # (B, T + 1)
                x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # (B, T) each: inputs, next tokens
                start = time.perf_counter()
                with autocast:
                    _, loss = forward(x, y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                loss.item()  # waits for the step's kernels
                seconds = time.perf_counter() - start
                peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
                print("gpu_check made_ids " + json.dumps({"batch": batch, "seconds": seconds, "peak": peak,
                                                           "flops_per_token": model.flops_per_token()}), flush=True)
            return
        except torch.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            print(f"batch {batch}: out of memory", file=sys.stderr, flush=True)
    raise SystemExit("out of memory at every batch tried")


def check_made_ids(ctx, name, until):
    """Training speed, MFU and peak memory on token ids made here, needing torch alone (made_ids_steps): the paper
    preset eager at the largest batch the estimate fits (tiny on a CPU), or the mini model compiled."""
    import torch

    from bincode_gpt.devices import peak_flops
    from bincode_gpt.memory import available_memory
    from model import get_config

    compiled = name.startswith("mini")
    if compiled and not ctx.cfg.compile:
        return Row(name, None, note="skipped: --compile is off (on by default on CUDA only)")
    if not compiled and not ctx.cfg.paper:
        return Row(name, None, note="skipped (--no-paper)")
    device = torch.device("cuda" if ctx.cuda else "cpu")
    big, small = (("paper", 65536), ("mini", None)) if ctx.cuda else (("tiny", 512), ("tiny", 512))
    preset, vocab_size = small if compiled else big
    shape = dict(preset=preset, **({"vocab_size": vocab_size} if vocab_size else {}))
    shape |= {} if ctx.cuda else dict(block_size=32)
    mcfg = get_config(**shape)
    first = 8 if compiled else first_batch(mcfg, available_memory(device) or 0)
    batches = list(BATCHES[BATCHES.index(first):]) if not compiled else [first]
    args = dict(shape=shape, batches=batches, steps=PAPER_STEPS + 2, device=device.type, compile=compiled)
    done = run([sys.executable, "-c", MADE_IDS, json.dumps(args)], timeout=left(until))
    stepped = [json.loads(line.split(" ", 2)[2]) for line in done.out.splitlines()
               if line.startswith("gpu_check made_ids ")]
    kept = stepped[1:] or stepped  # the first step warms up (allocates, compiles)
    tok = statistics.median(s["batch"] * mcfg.block_size / s["seconds"] for s in kept) if kept else None
    peak_flop_s = peak_flops(device, "bfloat16")
    mfu = tok * stepped[0]["flops_per_token"] / peak_flop_s if tok and peak_flop_s else None
    peak = f"{stepped[-1]['peak'] / 2**30:.2f} GiB{'' if ctx.cuda else ' RSS'}" if stepped else "-"
    what = (f"{preset} preset ({mcfg.n_layer} x {mcfg.n_embd}, context {mcfg.block_size}, V {mcfg.vocab_size:,}), "
            f"{'compiled' if compiled else 'eager'} {'bfloat16' if ctx.cuda else 'float32'}, token ids made here")
    ran = f"{len(stepped)} steps at batch {stepped[-1]['batch']} of {first} first tried" if stepped else "no step"
    if done.failed:
        row = failed(name, done, before=f"{what}: {ran}; ")
        row.tokens_per_s, row.mfu, row.peak = tok, mfu, peak
        return row
    return Row(name, True, tokens_per_s=tok, mfu=mfu, peak=peak, wall_s=done.wall, note=f"{what}: {ran}")


def check_quick_start(ctx, name, until):
    """The reference run the rows after it start from: the quick start (bfloat16 and --compile on CUDA). Where the
    compiled run fails, the row fails, an eager run stands in for it, and the rows after it train eager too: a
    compiler's fault hides no other row."""
    cfg, ref = ctx.cfg, os.path.join(ctx.work, "reference")
    compiled_until = until - EAGER_S * cfg.time_scale if cfg.compile else until
    done = run(command("train.py", *train_flags(ctx, ref)), timeout=left(compiled_until))
    if not done.failed:
        tok, mfu = speed(ref, cfg.warmup)
        return Row(name, True, tokens_per_s=tok, mfu=mfu, peak=peak_of(done.err), wall_s=done.wall,
                   note=f"{cfg.steps} steps, {ctx.dtype}{', compiled' if cfg.compile else ''}")
    row = failed(name, done, before="compiled: " if cfg.compile else "")
    if cfg.compile:
        cfg.compile = False  # for the stand-in and every run after it
        eager = run(command("train.py", *train_flags(ctx, ref, overwrite=True)), timeout=left(until))
        row.wall_s += eager.wall
        row.note += (f"; eager instead: {why(eager)}" if eager.failed else
                     "; eager instead: ok, the rows below start from it and train eager")
    return row


def check_sample(ctx, name, until):
    """sample.py from the reference's checkpoint, greedy, one way (the row's name: eager, compiled or CUDA graphs):
    a compiled way's text should be the eager one, and CUDA graphs must be recorded."""
    way = name.removeprefix("sample.py, ")
    flags = {"eager": [], "compiled": ["--compile"], "CUDA graphs": ["--compile", "--cuda_graphs"]}[way]
    ref = os.path.join(ctx.work, "reference")
    if way == "CUDA graphs" and not ctx.cuda:
        return Row(name, None, note="n/a on a CPU: CUDA graphs record GPU kernels (sample.py refuses --cuda_graphs "
                                    "here)")
    if way != "eager" and not ctx.cfg.sample_compile:
        return Row(name, None, note="skipped (--no-sample_compile)")
    if not finished(ctx, ref):
        return Row(name, None, note=NO_REFERENCE)
    args = ["--ckpt", ref, "--device", "cuda" if ctx.cuda else "cpu", "--prompt", PROMPT, "--temperature", "0",
            "--max_new_tokens", str(ctx.cfg.sample_tokens), *flags]
    env = {**os.environ, "TORCH_LOGS": "cudagraphs"} if way == "CUDA graphs" else None  # says why none recorded
    done = run(command("sample.py", *args), timeout=left(until), env=env)
    if done.failed:
        return failed(name, done)
    if not (done.out.startswith(PROMPT) and len(done.out) > len(PROMPT) + 1):
        return Row(name, False, peak=peak_of(done.err), wall_s=done.wall, note="no text")
    ctx.texts[way] = done.out
    ok, note = True, f"{ctx.cfg.sample_tokens} greedy tokens"
    if way != "eager" and "eager" in ctx.texts:
        note += ", the eager text" if done.out == ctx.texts["eager"] else ", text differs from eager"
    if way == "CUDA graphs":
        graphs, replays = graphs_of(done.err)
        skipped = re.search(r"skipping cudagraphs due to (.*)", done.err)
        ok = graphs > 0
        note += (f"; {graphs} CUDA graphs recorded, replayed {replays} times" if ok else
                 f"; no CUDA graph recorded{f': inductor skipped them ({skipped.group(1)[:150]})' if skipped else ''}")
    return Row(name, ok, peak=peak_of(done.err), wall_s=done.wall, note=note)


def check_resume(ctx, name, until):
    """The quick start stopped with SIGTERM halfway and resumed, its log against the reference's."""
    ref = os.path.join(ctx.work, "reference")
    if not finished(ctx, ref):
        return Row(name, None, note=NO_REFERENCE)
    return stop_and_resume(ctx, name, launch=lambda *a: command("train.py", *a), flags=lambda *a, **kw: train_flags(
        ctx, *a, **kw), out_dir=os.path.join(ctx.work, "stopped"), ref_log=repeated(ref), exits=0, until=until)


def check_init_from(ctx, name, until):
    """A run started from the reference's ckpt.pt: its step-0 validation loss must be the reference's last."""
    ref, tuned = os.path.join(ctx.work, "reference"), os.path.join(ctx.work, "init_from")
    if not finished(ctx, ref):
        return Row(name, None, note=NO_REFERENCE)
    steps = max(2, ctx.cfg.steps // 4)
    done = run(command("train.py", *train_flags(ctx, tuned, init_from=os.path.join(ref, "ckpt.pt"), max_steps=steps)),
               timeout=left(until))
    if done.failed:
        return failed(name, done)
    ref_log = repeated(ref)
    first = repeated(tuned)[("eval", 0)]["val_loss"]
    last = ref_log[max(k for k in ref_log if k[0] == "eval")]["val_loss"]
    same = first == last if not ctx.cuda else abs(first - last) <= 1e-3 * abs(last)
    return Row(name, same, peak=peak_of(done.err), wall_s=done.wall,
               note=f"step-0 val loss {first:.6f}, the reference's last {last:.6f}")


def stop_and_resume(ctx, name, *, launch, flags, out_dir, ref_log, exits, until):
    """`launch(*flags(out_dir))` gets SIGTERM once it prints step --stop_at and must exit with `exits`, its
    ckpt.pt at the step it announced; `--resume` then runs it to --steps, its log compared with ref_log -> a Row."""
    cfg = ctx.cfg
    first = run(launch(*flags(out_dir)), stop_after=cfg.stop_at, timeout=left(until))
    step, saved = announced(first.out), saved_step(out_dir)
    if "SIGTERM: finishing this step" not in first.err or first.code != exits or first.late:
        return failed(name, first, before=f"no SIGTERM stop at step {cfg.stop_at} (expected exit {exits}), ")
    if saved != step or step >= cfg.steps:
        return Row(name, False, wall_s=first.wall, note=f"train.py announced step {step} of {cfg.steps}, but "
                                                         f"ckpt.pt holds step {saved}")
    second = run(launch(*flags(out_dir, resume=True)), timeout=left(until))
    wall = first.wall + second.wall
    if second.failed:
        row = failed(name, second)
        row.wall_s = wall
        return row
    rtol = RESUME_RTOL if ctx.cuda else 0
    differ, worst = differences(ref_log, repeated(out_dir), rtol)
    same = ("log bit-identical" if not rtol else
            f"log within rtol {rtol:g} (largest difference {worst:.1e}; step, lr, tokens exact)")
    note = (f"stopped at step {step} (ckpt.pt holds it), resumed to {cfg.steps}: {same}" if not differ else
            f"log differs at {len(differ)} entries, first {differ[0][0]} step {differ[0][1]} (largest difference "
            f"{worst:.1e}{f', rtol {rtol:g}' if rtol else ''})")
    return Row(name, not differ, peak=peak_of(second.err), wall_s=wall, note=note)


def one_gpu(ctx):
    import torch

    return ctx.cuda and torch.cuda.device_count() < 2


def check_torchrun(ctx, name, until):
    """Two processes under torchrun, grad_accum 2, to --steps."""
    if one_gpu(ctx):
        return Row(name, None, note=ONE_GPU)
    out_dir = os.path.join(ctx.work, "torchrun")
    done = run(torchrun(2, *train_flags(ctx, out_dir, grad_accum=2)), timeout=left(until))
    if done.failed:
        return failed(name, done)
    from bincode_gpt.run_dir import read_log  # imports torch: not at this tool's start

    tok, mfu = speed(out_dir, min(ctx.cfg.warmup, ctx.cfg.steps - 1))
    start = read_log(out_dir, "start")[0]
    steps = [e["step"] for e in read_log(out_dir, "train")] == list(range(1, ctx.cfg.steps + 1))
    how = f"{'nccl' if ctx.cuda else 'gloo'}{', compiled' if ctx.cfg.compile else ''}"
    return Row(name, steps and start["world_size"] == 2, tokens_per_s=tok, mfu=mfu, wall_s=done.wall,
               note=f"{how}, {ctx.cfg.steps} steps, world size {start['world_size']}")


def check_torchrun_resume(ctx, name, until):
    """A SIGTERM to torchrun halfway, then --resume under it, its log against the uninterrupted torchrun run's."""
    if one_gpu(ctx):
        return Row(name, None, note=ONE_GPU)
    ref = os.path.join(ctx.work, "torchrun")
    if not finished(ctx, ref):
        return Row(name, None, note="skipped: no finished torchrun run to compare with (its row says why)")
    # torchrun forwards the signal to its ranks, which save and exit 0, then re-raises it itself: exit 1
    return stop_and_resume(ctx, name, launch=lambda *a: torchrun(2, *a), flags=lambda *a, **kw: train_flags(
        ctx, *a, grad_accum=2, **kw), out_dir=os.path.join(ctx.work, "torchrun-stopped"), ref_log=repeated(ref),
        exits=1, until=until)


# what a row needs beyond torch: the scripts' data and tokenizer (train.py, sample.py, prepare_data.py), and a compiler
DATA, COMPILER = ("numpy", "tiktoken"), "compiler"
# each row: its name, its share of seconds (on one GPU 550 s in all with the torch-only rows, PREPARE_S included:
# the docstring's Time), its check and what it needs (NEEDS), in the order of their value: torch's alone first
ROWS = (("paper preset, token ids made here", 40, check_made_ids, ()),
        ("mini model compiled, token ids made here", 50, check_made_ids, (COMPILER,)),
        ("paper preset, largest batch", 70, check_paper, DATA),
        ("train (quick start)", 100, check_quick_start, DATA),
        ("sample.py, eager", 35, check_sample, DATA),
        ("sample.py, compiled", 65, check_sample, (*DATA, COMPILER)),
        ("sample.py, CUDA graphs", 65, check_sample, (*DATA, COMPILER)),
        ("SIGTERM, then --resume", 60, check_resume, DATA),
        ("--init_from", 35, check_init_from, DATA),
        ("torchrun, 2 processes, grad_accum 2", 120, check_torchrun, DATA),
        ("torchrun: SIGTERM, then --resume", 120, check_torchrun_resume, DATA))


def lacking(cuda):
    """What the rows may need beyond torch that is not here -> {need: what is missing, in words}: a module that
    does not import, or a compiler for torch.compile's kernels (on CUDA Triton builds its launchers with a C
    compiler, on a CPU inductor its kernels with a C++ one; both include Python's headers)."""
    lacks = {}
    for module in DATA:
        try:
            importlib.import_module(module)
        except Exception as e:  # not installed, or broken (built for another numpy, a syntax error, ...)
            lacks[module] = f"{module} (it does not import: {type(e).__name__}: {one_line(str(e), 80)})"
    kind, found = compiler(cuda)
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if found is None:
        lacks[COMPILER] = f"a {kind} compiler (none of {', '.join(compilers(cuda))} on PATH)"
    elif not os.path.exists(headers):
        lacks[COMPILER] = f"Python's headers ({headers} is missing)"
    return lacks


def compilers(cuda):
    """The compilers torch.compile may call, the one its variable names first (CC on CUDA, CXX on a CPU)."""
    named = os.environ.get("CC" if cuda else "CXX")
    return ([named] if named else []) + (["cc", "gcc", "clang"] if cuda else ["c++", "g++", "clang++"])


def compiler(cuda):
    """-> ("C" or "C++", the path of the first of compilers(cuda) on PATH, or None)."""
    return "C" if cuda else "C++", next(filter(None, map(shutil.which, compilers(cuda))), None)


def environment(cuda, device, work, lacks):
    """The table's first row: torch, CUDA, the card and its compute mode, the compiler, the modules, free disk."""
    import torch

    card, mode = "none (a CPU dry run)", "n/a"
    if cuda:
        card = torch.cuda.get_device_name(device)
        smi = shutil.which("nvidia-smi")
        mode = "unknown (no nvidia-smi)"
        if smi:
            index = str(device.index or 0)
            asked = subprocess.run([smi, "-i", index, "--query-gpu=compute_mode", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30)
            mode = asked.stdout.strip() or f"unknown ({one_line(asked.stderr, 80)})"
    kind, found = compiler(cuda)
    headers = "present" if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else "missing"
    modules = [lacks.get(m) or f"{m} {importlib.import_module(m).__version__}" for m in DATA]
    free = shutil.disk_usage(work).free
    note = (f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, card {card}, compute mode {mode}; "
            f"{kind} compiler {found or 'none on PATH'}, Python headers {headers}; {', '.join(modules)}; free disk "
            f"{free / 1e9:,.1f} GB in {work}")
    return Row("environment", True, note=note)


def row_of(check_fn, ctx, name, until):
    """check_fn(ctx, name, until) -> its row; an exception in it (a log or an output not as this check expects) is
    a FAIL row, and the other rows still run: one GPU session gets the whole table."""
    try:
        return check_fn(ctx, name, until)
    except Exception as e:
        return Row(name, False, note=f"gpu_check itself failed: {type(e).__name__}: {one_line(str(e), 150)}")


# ----------------------------------------------------------------------------- the report
def table(rows, title, footer=""):
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    lines = [title, "", "| check | result | tokens/s | MFU | peak memory | wall s | note |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        result = "skipped" if r.ok is None else "ok" if r.ok else "**FAIL**"
        mfu = fmt(r.mfu and 100 * r.mfu, ".1f") + ("%" if r.mfu else "")
        lines.append(f"| {r.check} | {result} | {fmt(r.tokens_per_s, ',.0f')} | {mfu} | {r.peak} | "
                     f"{fmt(r.wall_s, '.0f')} | {r.note} |")
    return "\n".join(lines + ([f"\n{footer}"] if footer else [])) + "\n"


def file_name(index, check):
    """A row's file in --out: its place in the table and its name, in letters, digits, '.', '_' and '-' alone."""
    return f"{index:02d}-{re.sub(r'[^A-Za-z0-9_.]+', '-', check).strip('-')}.md"


class Report:
    """The table as it grows, each row said on stderr as it ends; with a folder `out`, written there at once: the
    row's own file (a skipped row gets none) and TABLE, every row so far."""

    def __init__(self, out, title):
        self.out, self.title, self.rows = out, title, []
        if out:
            os.makedirs(out, exist_ok=True)
            atomic_write(os.path.join(out, TABLE), table([], title, footer="running: no row has ended yet"))

    def add(self, row):
        self.rows.append(row)
        print(f"gpu_check: {row.check}: {'skipped' if row.ok is None else 'ok' if row.ok else 'FAIL'}", file=sys.stderr,
              flush=True)
        if not self.out:
            return
        if row.ok is not None:
            log = f"\nThe command that failed, and its last stderr lines:\n\n```\n{row.log}\n```\n" if row.log else ""
            atomic_write(os.path.join(self.out, file_name(len(self.rows), row.check)), table([row], self.title) + log)
        atomic_write(os.path.join(self.out, TABLE), table(self.rows, self.title, footer=f"running: {len(self.rows)} "
                     f"of {len(ROWS) + 1} rows ended, the rest to come"))

    def close(self, seconds):
        """The finished table -> its text, and in `out`."""
        report = table(self.rows, self.title, footer=f"done in {seconds:.0f} s")
        if self.out:
            atomic_write(os.path.join(self.out, TABLE), report)
        return report


def check(cfg):
    """Run every row, each written to --out as it ends -> (the rows, the finished table)."""
    import torch

    start = time.monotonic()
    device = pick_device(cfg.device)
    if cfg.device == "auto" and device.type != "cuda":
        raise ValueError("no CUDA GPU here: --device cpu runs the same steps as a dry run at tiny sizes")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"the GPU check runs on CUDA (or --device cpu, a dry run), not on {device.type}")
    cuda = device.type == "cuda"
    cfg.steps = cfg.steps or (100 if cuda else 8)
    cfg.stop_at = cfg.stop_at or cfg.steps // 2
    cfg.compile = cuda if cfg.compile is None else cfg.compile
    cfg.time_scale = cfg.time_scale or (1 if cuda else 5)
    if not (1 <= cfg.stop_at < cfg.steps):
        raise ValueError(f"--stop_at must be a step in [1, --steps), got {cfg.stop_at} with --steps {cfg.steps}")
    out = cfg.out or os.environ.get("OUT")
    refuse_earlier_runs(cfg.work, out)
    use_shipped_tiktoken()
    lacks = lacking(cuda)
    if not any(m in lacks for m in DATA):  # the data rows' encoding: its files missing stop the check at once
        from bincode_gpt.shards import load_meta

        check_encoding(load_meta(cfg.data_dir)["encoding"] if cfg.data_dir else "gpt2")
    if COMPILER in lacks:  # the training runs eager; each compiled row says what it lacked
        cfg.compile = False
    name = torch.cuda.get_device_name(device) if cuda else f"cpu ({os.cpu_count()} cores), a dry run at tiny sizes"
    cuda_version = f" (CUDA {torch.version.cuda})" if cuda else ""
    title = (f"GPU check on {name}, torch {torch.__version__}{cuda_version}, Python {platform.python_version()}; "
             f"{mfu_basis(device)}")
    report = Report(out, title)
    work = os.path.abspath(cfg.work) if cfg.work else tempfile.mkdtemp(prefix="gpu_check-")  # children run in ROOT
    os.makedirs(work, exist_ok=True)
    end = start + cfg.time_limit
    try:
        report.add(environment(cuda, device, work, lacks))
        ctx = Context(cfg, cuda, None, work, auto_dtype(device))
        for row_name, seconds, check_fn, needs in ROWS:
            now = time.monotonic()
            lacked = [lacks[need] for need in needs if need in lacks]
            if end - now < MIN_ROW_S:
                report.add(Row(row_name, None, note=f"skipped: out of time (--time_limit {cfg.time_limit:g} s)"))
                continue
            if lacked:
                report.add(Row(row_name, None, note=f"skipped: needs {'; '.join(lacked)}"))
                continue
            if set(DATA) <= set(needs) and ctx.data is None:  # prepared for the first row that reads it
                prepared_by = min(now + PREPARE_S * cfg.time_scale, end)
                ctx.data = os.path.abspath(cfg.data_dir) if cfg.data_dir else prepare(work, prepared_by)
                now = time.monotonic()
            report.add(row_of(check_fn, ctx, row_name, min(now + seconds * cfg.time_scale, end)))
    finally:
        if not cfg.work:
            shutil.rmtree(work, ignore_errors=True)
    return report.rows, report.close(time.monotonic() - start)


def main(argv=None):
    description, epilog = __doc__.strip().split("\n\n", 1)
    cfg = parse_settings(config_parser(CheckConfig, description, epilog), argv)
    rows, report = check(cfg)
    print(report, end="")
    return 1 if any(r.ok is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
