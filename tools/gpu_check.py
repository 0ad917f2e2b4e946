"""
The GPU path end to end, for anyone with one CUDA GPU (under ten minutes): the quick start in bfloat16 with
--compile; a run stopped with SIGTERM and resumed to the end, its log bit-identical to the uninterrupted run's;
--init_from; two processes under torchrun; sampling from the checkpoint, eager, compiled and as CUDA graphs (the
compiled step recorded: sample.py --cuda_graphs). One markdown table: tokens/s, MFU, peak memory and every failure.

    python -m tools.gpu_check                       # on the CUDA GPU; the table on stdout
    python -m tools.gpu_check --out gpu_check.md    # and in a file
    python -m tools.gpu_check --device cpu          # a dry run of the same steps at tiny sizes (CI, ~40 s)

Design choices, up front:
- Every step runs the scripts' real command lines (train.py, sample.py, torchrun) in a process of its own, in
  a work folder (a temp folder, removed at the end, unless --work names one): nothing here re-implements them.
- The stopped run gets SIGTERM when its output prints step --stop_at; train.py finishes that step, saves and
  exits 0; --resume then runs it to --steps. Its log.jsonl's train and eval entries (step, loss, lr, gradient
  norm, tokens, val loss) must equal the uninterrupted run's bit for bit; timings are left out.
- --init_from starts a run from the reference's ckpt.pt: its step-0 validation loss must be the reference's last
  (the same weights on the same windows; on a GPU within 1e-3, as bfloat16 kernels may order sums otherwise).
- torchrun: two processes. On a CPU, gloo; on one GPU, skipped with a note: NCCL refuses two ranks on one GPU,
  and train.py picks NCCL for CUDA tensors. With two or more GPUs, one process each.
- tokens/s and MFU are the median over the reference's logged steps after the first --warmup (compiling);
  peak memory is the process's (torch.cuda.max_memory_allocated on CUDA, peak RSS on a CPU). Sampling rows
  give the process's wall time, loading and compiling included.
- Exit status 1 if any step failed (the table says which and why), else 0.
"""

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bincode_gpt.cli import config_parser, parse_settings, run_main, setting
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
PROMPT = "ROMEO:"


@dataclass
class CheckConfig:
    device: str = setting("auto", "cuda (auto: the CUDA GPU) | cpu: a dry run at tiny sizes")
    data_dir: str | None = setting(None, "prepared data (default: tiny Shakespeare prepared in the work folder)")
    work: str | None = setting(None, "folder for the runs, kept (default: a temp folder, removed at the end)")
    out: str | None = setting(None, "also write the table to this markdown file")
    steps: int | None = setting(None, "training steps of each run (default: 200 on CUDA, 8 on a CPU)")
    stop_at: int | None = setting(None, "the step after which the stopped run gets SIGTERM (default: steps / 2)")
    warmup: int = setting(5, "first steps left out of tokens/s and MFU (compiling)")
    compile: bool | None = setting(None, "torch.compile the training runs (default: on CUDA only)")
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


def train_flags(cfg, cuda, data_dir, out_dir, **kw):
    """The quick start's `python train.py` (bfloat16 and --compile on CUDA), or a tiny run on a CPU."""
    sizes = {} if cuda else dict(preset="tiny", block_size=32, batch_size=4, eval_steps=2)
    settings = {**dict(data_dir=data_dir, out_dir=out_dir, device="cuda" if cuda else "cpu",
                       dtype="bfloat16" if cuda else "float32", max_steps=cfg.steps, log_interval=1,
                       eval_interval=max(1, cfg.steps // 4), save_interval=max(1, cfg.steps // 2),
                       warmup_steps=max(1, cfg.steps // 10), **sizes), **kw}
    flags = [f"--{k}={v}" for k, v in settings.items() if not isinstance(v, bool)]
    return flags + [f"--{k}" for k, v in {**settings, "compile": cfg.compile}.items() if v is True]


def command(script, *args):
    return [sys.executable, "-c", PEAK, os.path.join(ROOT, script), *args]


def run(cmd, stop_after=None, timeout=900):
    """Run cmd in the repository root -> (exit status, stdout, stderr, wall s). stop_after: SIGTERM once stdout
    prints that step's line ("step N/")."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    if stop_after is not None:
        for line in proc.stdout:
            out.append(line)
            if line.startswith(f"step {stop_after}/"):
                proc.send_signal(signal.SIGTERM)
                break
    try:
        rest, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, err = proc.communicate()
        err += f"\n(killed after {timeout} s)"
    return proc.returncode, "".join(out) + rest, err, time.time() - t0


def peak_of(err):
    m = re.search(r"gpu_check peak (cuda|rss) (\d+)", err)
    return f"{int(m.group(2)) / 2**30:.2f} GiB{' RSS' if m.group(1) == 'rss' else ''}" if m else "-"


def why(code, err):
    """The last line of a failed process's stderr that says something (not the peak line)."""
    lines = [l for l in err.strip().splitlines() if l.strip() and not l.startswith("gpu_check peak")]
    return f"exit {code}: {lines[-1].strip()[:200] if lines else 'no message'}"


def read_log(out_dir):
    """{(event, step): the logged values that a resumed run must repeat} of a run's log.jsonl, and its entries."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        entries = [json.loads(line) for line in f]
    return {(e["event"], e["step"]): tuple(e.get(k) for k in LOGGED[e["event"]]) for e in entries
            if e["event"] in LOGGED}, entries


def speed(entries, warmup):
    train = [e for e in entries if e["event"] == "train"]
    kept = train[warmup:] or train
    tok = statistics.median(e["tokens_per_s"] for e in kept) if kept else None
    mfu = [e["mfu"] for e in kept if e.get("mfu") is not None]
    return tok, statistics.median(mfu) if mfu else None


def prepare(work):
    """Tiny Shakespeare, as the quick start prepares it, into work/data."""
    data = os.path.join(work, "data")
    code, _, err, _ = run([sys.executable, os.path.join(ROOT, "prepare_data.py"), "shakespeare", "--out", data])
    if code:
        raise ValueError(f"prepare_data.py shakespeare failed ({why(code, err)}): give prepared data with --data_dir")
    return data


def check_training(cfg, cuda, data, work):
    """The reference run, the stopped and resumed one, and --init_from -> rows."""
    rows, ref, part = [], os.path.join(work, "reference"), os.path.join(work, "stopped")
    code, _, err, wall = run(command("train.py", *train_flags(cfg, cuda, data, ref)))
    if code:
        return [Row("train (quick start)", False, peak=peak_of(err), wall_s=wall, note=why(code, err))]
    ref_log, entries = read_log(ref)
    tok, mfu = speed(entries, cfg.warmup)
    dtype = "bfloat16, compiled" if cuda and cfg.compile else "bfloat16" if cuda else "float32"
    rows.append(Row("train (quick start)", True, tok, mfu, peak_of(err), wall, f"{cfg.steps} steps, {dtype}"))

    code, out, err, wall = run(command("train.py", *train_flags(cfg, cuda, data, part)), stop_after=cfg.stop_at)
    stopped = code == 0 and "SIGTERM: finishing this step" in err
    if not stopped:
        rows.append(Row("SIGTERM, then --resume", False, wall_s=wall,
                        note=why(code, err) if code else f"no SIGTERM stop at step {cfg.stop_at}"))
    else:
        stop = max(s for e, s in read_log(part)[0] if e == "train")
        code, _, err, more = run(command("train.py", *train_flags(cfg, cuda, data, part, resume=True)))
        if code:
            rows.append(Row("SIGTERM, then --resume", False, peak=peak_of(err), wall_s=wall + more,
                            note=why(code, err)))
        else:
            got, _ = read_log(part)
            differ = sorted(k for k in ref_log.keys() | got.keys() if ref_log.get(k) != got.get(k))
            note = (f"stopped after step {stop}, resumed to {cfg.steps}: log bit-identical" if not differ else
                    f"log differs at {len(differ)} entries, first {differ[0][0]} step {differ[0][1]}")
            rows.append(Row("SIGTERM, then --resume", not differ, peak=peak_of(err), wall_s=wall + more, note=note))

    tuned = os.path.join(work, "init_from")
    steps = max(2, cfg.steps // 4)
    flags = train_flags(cfg, cuda, data, tuned, init_from=os.path.join(ref, "ckpt.pt"), max_steps=steps)
    code, _, err, wall = run(command("train.py", *flags))
    if code:
        rows.append(Row("--init_from", False, peak=peak_of(err), wall_s=wall, note=why(code, err)))
    else:
        first = read_log(tuned)[0][("eval", 0)][1]
        last = ref_log[max(k for k in ref_log if k[0] == "eval")][1]
        same = first == last if not cuda else abs(first - last) <= 1e-3 * abs(last)
        rows.append(Row("--init_from", same, peak=peak_of(err), wall_s=wall,
                        note=f"step-0 val loss {first:.6f}, the reference's last {last:.6f}"))
    return rows


def check_torchrun(cfg, cuda, data, work):
    """Two processes under torchrun -> a row."""
    import torch

    name = "torchrun, 2 processes"
    if cuda and torch.cuda.device_count() < 2:
        return Row(name, None, note="skipped: one GPU, and NCCL refuses two ranks on one GPU (train.py uses NCCL "
                                    "for CUDA tensors; gloo on CUDA is not a train.py option)")
    out_dir = os.path.join(work, "torchrun")
    steps = max(2, cfg.steps // 2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py"), *train_flags(cfg, cuda, data, out_dir, max_steps=steps)]
    code, _, err, wall = run(cmd)
    if code:
        return Row(name, False, wall_s=wall, note=why(code, err))
    _, entries = read_log(out_dir)
    tok, mfu = speed(entries, min(cfg.warmup, steps - 1))
    start = next(e for e in entries if e["event"] == "start")
    done = [e["step"] for e in entries if e["event"] == "train"] == list(range(1, steps + 1))
    return Row(name, done and start["world_size"] == 2, tok, mfu, wall_s=wall,
               note=f"{'nccl' if cuda else 'gloo'}, {steps} steps, world size {start['world_size']}")


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
        code, out, err, wall = run(command("sample.py", *args))
        ok = code == 0 and out.startswith(PROMPT) and len(out) > len(PROMPT) + 1
        texts[way] = out
        rows.append(Row(f"sample.py, {way}", ok, peak=peak_of(err), wall_s=wall,
                        note=f"{cfg.sample_tokens} greedy tokens" if ok else why(code, err) if code else "no text"))
    for r in rows[1:]:
        if r.ok and rows[0].ok:
            way = r.check.removeprefix("sample.py, ")
            r.note += ", the eager text" if texts[way] == texts["eager"] else ", text differs from eager"
    return rows


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

    device = pick_device(cfg.device)
    if cfg.device == "auto" and device.type != "cuda":
        raise ValueError("no CUDA GPU here: --device cpu runs the same steps as a dry run at tiny sizes")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"the GPU check runs on CUDA (or --device cpu, a dry run), not on {device.type}")
    cuda = device.type == "cuda"
    cfg.steps = cfg.steps or (200 if cuda else 8)
    cfg.stop_at = cfg.stop_at or cfg.steps // 2
    cfg.compile = cuda if cfg.compile is None else cfg.compile
    if not (1 <= cfg.stop_at < cfg.steps):
        raise ValueError(f"--stop_at must be a step in [1, --steps), got {cfg.stop_at} with --steps {cfg.steps}")
    work = cfg.work or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(work, exist_ok=True)
    try:
        data = os.path.abspath(cfg.data_dir) if cfg.data_dir else prepare(work)
        rows = check_training(cfg, cuda, data, work)
        if rows[0].ok:  # the rest start from its checkpoint
            rows += [check_torchrun(cfg, cuda, data, work), *check_sampling(cfg, cuda, work)]
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
