"""
Benchmark training, sampling, loading and data preparation of the binary-code GPT, and check targets.

    python -m tools.bench                      # CPU: ~5 min on 2 cores; prints one table
    python -m tools.bench --json               # the same numbers as JSON
    python -m tools.bench --sections=train --repeats=5 --steps=8
    python -m tools.bench --sections=train --nanogpt ~/nanoGPT   # and one step beside nanoGPT's model.py
    python -m tools.bench --sections=compile_cache   # sample.py --compile's restart cost, paper preset (~8 min)
    python -m tools.bench --sections=load --ref=8470b11 --load_dir=/tmp/bench   # a sampling start, itemised

Design choices, up front:
- Training is timed through train.py's own loop (train.train), not a copy of it: a small random-token
  dataset (shards.write_shard + meta.json) is written once to a temp dir, each input variant runs
  warmup+steps optimizer steps with evaluation and periodic saves off, and the per-step `dt` of
  out_dir/log.jsonl is read back; warm-up steps are dropped. The final checkpoint train() writes is
  outside the timed steps. Variants are interleaved over `repeats` rounds (binary, affine, learned,
  binary, ...) so machine noise hits all of them alike; each figure is the median of all kept steps.
- Beside nanoGPT (--nanogpt, a local checkout, never vendored): one optimizer step of model.GPT and of
  nanoGPT's model.GPT at NANOGPT_SHAPE (V 8,192, 4 x 256, block 256, batch 8, bias-free), each with its
  own configure_optimizers, the step as train.py takes it, on one batch, interleaved in one process.
- MFU = model.flops_per_token(block) * tokens/s / rate, against (a) the dense matmul rate this bench
  measures (a square matmul in the training dtype, timed in every round, median) and (b) the datasheet peak
  (devices.PEAK_FLOPS on CUDA; no datasheet figure on a CPU: "-").
- Defaults per device: CPU, the 'small' preset at block 128, batch 8, float32; CUDA, the 'paper' preset
  at block 1024, batch 8, bf16 autocast and torch.compile (train.py's own settings), one train() call per
  variant (each compiles afresh) with more timed steps advised (--steps=20).
- Sampling: one model (random weights, 'small' preset; its output head is scaled up so greedy choices
  are not near-ties that float rounding could flip) decoded greedily four ways, interleaved: the KV
  cache (decode.generate(model, ...)), the same with its one-token step under torch.compile (compiled in the untimed
  warm-up; the first call's time is reported), recomputing the whole context each step (the same
  forward without a cache), and transformers' generate(do_sample=False, use_cache=True) on convert.py's
  stock GPT-NeoX export of the same weights. Beside them, "matmuls alone": each token's nn.Linear
  weights times one row, nothing else; at batch 1 on a CPU reading the weights bounds decoding, so this
  is the ceiling any implementation with these matmuls could reach (ceiling/HF bounds KV/HF). Token equality
  with the KV-cache output is asserted for the recompute path (the same code) and reported for HF (another
  implementation); the KV/HF target counts only with equal tokens.
  Each way runs at every --threads count, interleaved. At batch 1 the KV cache also runs on bfloat16 and
  float16 copies of the weights: speed against float32, and how many leading tokens stay float32's.
  On a CPU the KV cache also runs on quantize.py's int8 copy (eager, as sample.py gets it, packing done
  before timing; the kernel quantize.choose_kernel picked, and why, in the report), and on the kernel that
  copy does not run, forced: the plain rows (torch._int_mm: what runs until the packing thread is done;
  what a model under quantize.PACK_MIN_BYTES runs), or where those run, oneDNN's packed weights (uint8
  activations) where their sums are exact on this CPU, else the widened rows; and (--sample_compile) compiled:
  the weight-only product inductor writes (Int8Linear.weight_only, what sample.py --compile runs on int8
  weights); beside them "int8 matmuls alone" (the int8 ceiling) and the bytes of weights a token reads in
  each; beside them, the read bandwidth (a float32 sum over bandwidth_mb, timed in the same rounds), and the
  fraction of it each decodes at: weight bytes a step reads x steps/s / bandwidth, both in the process's CPU
  seconds (a shared machine's other jobs take wall time from both, unevenly).
  On CUDA the compiled step also runs recorded as CUDA graphs (stream(cuda_graphs=True), sample.py --cuda_graphs).
  Paper preset: --sample_preset=paper --no-recompute (recomputing 470M parameters per context token is slow).
- Loading (--sections=load): what a sampling start costs, as a user runs it: sample.py --prompt Hello --temperature 0
  --device cpu --max_new_tokens load_tokens in a fresh process, on a float32 checkpoint of load_preset (random
  weights, written once; --load_dir keeps it), with --quantize int8, and on convert.py's int8 checkpoint of it.
  The child imports sample.py and wraps the functions it calls by name (load_checkpoint, read_checkpoint,
  load_text_codec, prompt_ids, quantize.choose_kernel, Decoder.stream), so the start is itemised: imports,
  tokenizer, reading the file, building the model, the int8 kernel choice, the first token (the prompt's
  forward), the rest; and to token load_tokens (end to end), peak RSS, CPU seconds (all threads: int8 packs on
  a second one). With --ref COMMIT the same children run that commit's code (git archive into a temp folder),
  alternating with this tree's (this, ref; then ref, this), so a regression shows as a ratio on one machine.
- Data preparation: prepare_data.prepare on `prep_copies` concatenated copies of a corpus, with one
  worker (no pool) and with all cores. How much `cores` processes can give on this machine at all is
  measured in every round too: a pure-Python loop and a tiktoken encode, 1 vs `cores` processes at once.
- The compiled step from inductor's cache on disk (--sections=compile_cache): fresh processes decode greedily
  with the compiled step, each timed from its model built to token --new_tokens: from an empty cache, and from
  the cache that shape warmed for another prompt and output length (--cache_other); each with the
  KV cache sized by class (decode.size_class: one compile serves a class) and, patched in the child, to exactly the
  positions reached (the code before issue 35: one compile per shape); and eager. The two ways share a cache folder,
  empty at each round's start; the runs interleave. Beside the times, the graphs dynamo compiled and inductor's cache
  hits and misses.
- Targets are ratios measured in the same run; each prints PASS or MISS (or "not measured").
- A setting of a section that --sections does not run (READ_BY), several --threads without the sample
  section, or a CPU-only setting on a GPU is refused, not silently ignored.
"""

import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import the root's files as `python -m tools.NAME` does
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

import contextlib
import copy
import importlib.util
import io
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

import bincode_gpt.decode as D
import model as M
import prepare_data as P
from bincode_gpt import inputs, shards
import bincode_gpt.quantize as Q
import train as T
from bincode_gpt.checkpoint import checkpoint_dict
from bincode_gpt.run_dir import read_log
from bincode_gpt.settings import check_at_least_1, config_parser, parse_int, parse_settings, setting
from bincode_gpt.devices import auto_dtype, peak_flops, pick_device
from bincode_gpt.tokenizer import get_tokenizer
from tools.quickstart import NANOGPT_URL

VARIANTS = ("binary", "affine", "learned")
SECTIONS = ("train", "sample", "load", "prep", "compile_cache")


@dataclass
class BenchConfig:
    device: str = setting("auto", "auto | cpu | cuda | cuda:N")
    sections: str = setting("train,sample,prep", f"comma-separated, any of {','.join(SECTIONS)}")
    repeats: int = setting(5, "interleaved rounds of every timing")
    threads: str | None = setting(None, "torch CPU threads, comma-separated: sampling is timed at each, interleaved; "
                                          "the other sections use the first (default: torch's)")
    # training
    preset: str | None = setting(None, "training preset (default: small on CPU, paper on CUDA)")
    block_size: int | None = setting(None, "training sequence length (default: 128 CPU, 1024 CUDA)")
    batch_size: int | None = setting(None, "sequences per step (default 8)")
    train_repeats: int | None = setting(None, "train() calls per variant "
                                              "(default: --repeats on CPU, 1 on CUDA: compiles)")
    steps: int = setting(6, "timed optimizer steps per train() call")
    warmup: int = setting(2, "optimizer steps dropped before them")
    compile: bool | None = setting(None, "torch.compile in training (default: on CUDA only)")
    matmul_n: int | None = setting(None, "side of the measured square matmul (default: 2048 CPU, 8192 CUDA)")
    nanogpt: str | None = setting(None, f"a local nanoGPT checkout ({NANOGPT_URL}): its model.py's training step "
                                        "timed beside model.py's, at one shape (NANOGPT_SHAPE)")
    # sampling
    sample_preset: str = setting("small", "model preset for sampling")
    sample_input: str = setting("binary", "input of the sampled model (its precision copies and int8 too)",
                                choices=list(VARIANTS))
    prompt_len: int = setting(16, "prompt tokens")
    new_tokens: int = setting(64, "tokens generated")
    sample_batches: str = setting("1,8", "comma-separated batch sizes")
    recompute: bool = setting(True, "also time decoding that recomputes the whole context (slow on the paper preset)")
    sample_compile: bool = setting(True, "also time the KV cache with its one-token step compiled "
                                         "(stream(compile=True)), the int8 copy's too (CPU, --int8); "
                                         "compiling happens in the untimed warm-up")
    precisions: str = setting("bfloat16,float16",
                              "comma-separated weight dtypes timed against float32 at batch 1 (KV cache)")
    int8: bool = setting(True, "also time quantize.py's int8 weights (KV cache, eager) and their matmuls alone (CPU)")
    bandwidth_mb: int = setting(512, "MB of float32 summed, at each thread count, to measure the read bandwidth that "
                                     "decoding is compared with (CPU)")
    # loading
    load_preset: str = setting("paper", "model preset of the checkpoint loaded (paper: a 1.9 GB file in a temp dir)")
    load_repeats: int = setting(3, "child processes per loading path and tree, interleaved")
    load_tokens: int = setting(64, "greedy tokens each loading child generates "
                                   "(end to end: load, quantize, these tokens)")
    ref: str | None = setting(None, "a git commit of this repository (8470b11, a tag): its sample.py timed beside this "
                                    "tree's, the same commands alternating, so a regression shows as a ratio")
    load_dir: str | None = setting(None, "a folder to keep the load section's checkpoints in and use again "
                                         "(default: a temp folder; the paper preset's takes ~1 min to write)")
    # the compiled step from inductor's cache on disk
    cache_preset: str = setting("paper", "model preset of the compile_cache section (random weights)")
    cache_other: str = setting("24,100", "prompt tokens,new tokens of the other shape the compile_cache section times "
                                         "(to token --new_tokens) from the cache --prompt_len and --new_tokens warmed")
    cache_repeats: int = setting(1, "rounds of the compile_cache section, each from empty caches, interleaved")
    # data preparation
    corpus: str | None = setting(None, "text file for data preparation "
                                       "(default: tiny Shakespeare, fetched as prepare_data.py does)")
    prep_copies: int = setting(8, "copies of the corpus concatenated")
    workers: int | None = setting(None, "prep workers for 'all cores' (default: cpu count)")
    json: bool = setting(False, "print JSON instead of the table")


def median_time(fn, repeats, sync=lambda: None):
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_rate(device, dtype, n, repeats=5):
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    return 2 * n**3 / median_time(lambda: a @ b, repeats, sync)


# ----------------------------------------------------------------------------- training
def write_random_data(folder, vocab_size, tokens=200_000, seed=0):
    rng = np.random.default_rng(seed)
    splits = {}
    for split, n in (("train", tokens), ("val", tokens // 10)):
        name = f"{split}_000000.bin"
        dtype = np.uint16 if vocab_size <= 65536 else np.uint32
        shards.write_shard(os.path.join(folder, name), rng.integers(0, vocab_size - 1, n).astype(dtype))

        splits[split] = {"shards": [name], "tokens": n, "bytes": 0, "documents": 1}
    meta = {"version": shards.VERSION, "encoding": "gpt2", "vocab_size": vocab_size, "eot_token": vocab_size - 1,
            "dtype": "uint16" if vocab_size <= 65536 else "uint32", "splits": splits}
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f)


def bench_train(cfg, device, tmp):
    cuda = device.type == "cuda"
    preset = cfg.preset or ("paper" if cuda else "small")
    block = cfg.block_size or (1024 if cuda else 128)
    batch = cfg.batch_size or 8
    compile_ = cuda if cfg.compile is None else cfg.compile
    vocab = M.get_config(preset).vocab_size
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    write_random_data(data, vocab)
    dtype = getattr(torch, auto_dtype(device))  # train.py's --dtype auto
    dts, rates = {v: [] for v in VARIANTS}, []
    for r in range(cfg.train_repeats or (1 if cuda else cfg.repeats)):
        rates.append(matmul_rate(device, dtype, cfg.matmul_n or (8192 if cuda else 2048)))  # interleaved too
        for v in VARIANTS:  # interleaved: every round runs each variant once
            out = os.path.join(tmp, f"train_{v}")
            tc = T.TrainConfig(data_dir=data, out_dir=out, preset=preset, block_size=block, input=v, batch_size=batch,
                               max_steps=cfg.warmup + cfg.steps, warmup_steps=1, eval_interval=0, save_interval=0,
                               log_interval=10**9, device=str(device), compile=compile_, seed=1337 + r, overwrite=True)
            with contextlib.redirect_stdout(io.StringIO()):
                T.train(tc)
            steps = read_log(out, "train")
            dts[v] += [e["dt"] for e in steps[cfg.warmup:]]
    rate = statistics.median(rates)
    peak = peak_flops(device)
    with torch.device("meta"):
        flops = M.GPT(M.get_config(preset, block_size=block)).flops_per_token(block)
    rows = {}
    for v in VARIANTS:
        tok_s = batch * block / statistics.median(dts[v])
        rows[v] = {"tokens_per_s": tok_s, "mfu_measured": flops * tok_s / rate,
                   "mfu_peak": flops * tok_s / peak if peak else None, "steps_timed": len(dts[v])}
    nanogpt = bench_step_vs_nanogpt(cfg, device) if cfg.nanogpt else None
    return {"preset": preset, "block_size": block, "batch_size": batch, "dtype": str(dtype).removeprefix("torch."),
            "compile": compile_, "matmul_flops": rate, "peak_flops": peak, "flops_per_token": flops, "variants": rows,
            "nanogpt": nanogpt}


# the shape model.py's training step is timed at beside nanoGPT's: a CPU-sized GPT-2 cut
NANOGPT_SHAPE = dict(vocab_size=8192, block_size=256, n_layer=4, n_head=4, n_embd=256)
NANOGPT_BATCH = 8


def nanogpt_module(checkout):
    """nanoGPT's model.py from a local checkout, imported under another name (ours is `model`)."""
    path = os.path.join(checkout, "model.py")
    if not os.path.isfile(path):
        raise ValueError(f"--nanogpt {checkout}: no model.py there (git clone {NANOGPT_URL})")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_step_vs_nanogpt(cfg, device):
    """One optimizer step as train.py takes it (the loss, backward, the norm clipped to 1, AdamW,
    gradients set to None) of model.GPT (the binary input, train.py's default) and of nanoGPT's GPT
    (bias-free, no dropout) at NANOGPT_SHAPE, float32, one batch for both; each model's own
    configure_optimizers. Interleaved over --repeats rounds of --steps steps after --warmup; medians."""
    theirs_module = nanogpt_module(cfg.nanogpt)
    torch.manual_seed(0)
    ours = M.GPT(M.GPTConfig(**NANOGPT_SHAPE)).to(device)
    settings = dict(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95), device_type=device.type)
    with contextlib.redirect_stdout(io.StringIO()):  # nanoGPT prints its counts
        config = theirs_module.GPTConfig(**NANOGPT_SHAPE, bias=False, dropout=0.0)
        theirs = theirs_module.GPT(config).to(device)
        optimizers = [m.configure_optimizers(**settings) for m in (ours, theirs)]
    shape = (NANOGPT_BATCH, NANOGPT_SHAPE["block_size"])
    x = torch.randint(NANOGPT_SHAPE["vocab_size"], shape, device=device)
    y = torch.randint(NANOGPT_SHAPE["vocab_size"], shape, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def step(model, optimizer):
        t0 = time.perf_counter()
        loss = model(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0

    times = {"ours": [], "nanogpt": []}
    for _ in range(cfg.repeats):
        for name, model, optimizer in zip(times, (ours, theirs), optimizers):
            kept = [step(model, optimizer) for _ in range(cfg.warmup + cfg.steps)][cfg.warmup:]
            times[name] += kept
    ours_s, theirs_s = statistics.median(times["ours"]), statistics.median(times["nanogpt"])
    return {"checkout": os.path.abspath(cfg.nanogpt), "shape": NANOGPT_SHAPE, "batch_size": NANOGPT_BATCH,
            "ours_step_s": ours_s, "nanogpt_step_s": theirs_s, "ratio": theirs_s / ours_s,
            "steps_timed": len(times["ours"])}


# ----------------------------------------------------------------------------- sampling
def recompute_generate(model, idx, new_tokens):
    """Greedy decoding without a cache: the whole (cropped) context goes through the model each step."""
    for _ in range(new_tokens):
        logits, _ = model(idx[:, -model.config.block_size:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def matmuls_alone(model, batch, new_tokens):
    """What decoding would cost if a token cost only its matmuls: every linear layer (nn.Linear, or
    quantize.Int8Linear with its activation rounding) times one row per sequence, new_tokens times
    (reading all the weights per token bounds batch-1 decoding on a CPU)."""
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Q.Int8Linear))]
    device = next(model.parameters()).device
    rows = {m.in_features: torch.randn(batch, 1, m.in_features, device=device) for m in layers}
    with torch.inference_mode():
        for _ in range(new_tokens):
            for m in layers:
                m(rows[m.in_features])
    return torch.zeros(1)


def weight_bytes(model):
    """Bytes of the linear layers' weights and scales: what one decoded token must read (at batch 1)."""
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Q.Int8Linear))]
    return sum(t.numel() * t.element_size() for m in layers for t in (*m.parameters(), *m.buffers()))


def leading_agreement(a, b, start):
    """How many generated tokens (from column `start` on) a and b share before they first differ."""
    same = (a[:, start:] == b[:, start:]).all(0)
    return int(same.cumprod(0).sum())


def hf_twin(model, tmp, device):
    """transformers' GPTNeoXForCausalLM holding `model`'s weights, through convert.py's export."""
    try:
        from transformers import GPTNeoXForCausalLM
    except ImportError:
        raise ValueError("the sample section compares against transformers' generate(): pip install transformers "
                         "(or leave it out: --sections=train,load,prep)") from None

    from transformers.utils import logging as hf_logging

    from tools.convert import convert_native_to_hf

    hf_logging.disable_progress_bar()  # from_pretrained's "Loading weights" bar would land in the table
    ckpt = os.path.join(tmp, "sample.pt")
    torch.save(checkpoint_dict(model, None), ckpt)  # ids in, ids out: no tokenizer (any vocab size)
    with contextlib.redirect_stderr(io.StringIO()):  # convert's "no tokenizer exported" warning
        convert_native_to_hf(ckpt, os.path.join(tmp, "hf"))
    os.remove(ckpt)  # the paper preset's is 1.9 GB
    hf = GPTNeoXForCausalLM.from_pretrained(os.path.join(tmp, "hf"), dtype=torch.float32).to(device).eval()
    hf.generation_config.eos_token_id = None  # run the full length, as the native paths do
    return hf


def bench_sample(cfg, device, tmp, threads):
    torch.manual_seed(0)
    model = M.GPT(M.get_config(cfg.sample_preset, input=cfg.sample_input)).to(device).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # peaked logits: greedy picks are far from ties
    vocab = model.config.vocab_size
    hf = hf_twin(model, tmp, device)
    low = {name: copy.deepcopy(model).to(getattr(torch, name)) for name in cfg.precisions.split(",") if name}
    int8 = Q.wait_packed(Q.quantize_int8(model)) if cfg.int8 and device.type == "cpu" else None  # as sample.py gets it
    forced = None
    if int8 is not None:  # and a kernel it does not run, forced: the plain rows (torch._int_mm), or where those were
        # chosen (quantize.choose_kernel, or PACK_MIN_BYTES), oneDNN's uint8 one where its sums are exact here, else
        # the widened rows
        forced = "rows"
        if int8.int8_kernel[0] == "rows":
            layer = next(m for m in int8.modules() if isinstance(m, Q.Int8Linear))
            forced = "onednn-u8" if Q.gives_exact_sums("onednn-u8", layer) else "widened"
        other = Q.wait_packed(Q.start_packing(Q.quantize_int8(model, pack=False), kernel=forced))
    # and compiled: Int8Linear.weight_only, on the plain rows (sample.py --compile)
    int8_compiled = Q.quantize_int8(model, pack=False) if int8 is not None and cfg.sample_compile else None
    # each compiled way's decoder, made once: its step compiles once per size class, in the warm-up round
    compiled = D.Decoder(model, compile=True) if cfg.sample_compile else None
    graphs = D.Decoder(model, compile=True, cuda_graphs=True) if cfg.sample_compile and device.type == "cuda" else None
    int8_decoder = D.Decoder(int8_compiled, compile=True) if int8_compiled is not None else None
    big = torch.ones(cfg.bandwidth_mb * 2**20 // 4) if device.type == "cpu" else None  # read bandwidth: summed
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for B in (int(b) for b in cfg.sample_batches.split(",")):
        prompt = torch.randint(0, vocab, (B, cfg.prompt_len), generator=torch.Generator().manual_seed(B)).to(device)
        ways = {"kv_cache": lambda: D.generate(model, prompt, cfg.new_tokens, temperature=0),
                "hf_generate": lambda: hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                                   use_cache=True, max_new_tokens=cfg.new_tokens,
                                                   min_new_tokens=cfg.new_tokens, pad_token_id=0)}
        if cfg.recompute:
            ways["recompute"] = lambda: recompute_generate(model, prompt, cfg.new_tokens)
        ways["matmuls_alone"] = lambda: matmuls_alone(model, B, cfg.new_tokens)
        if compiled is not None:
            ways["kv_compiled"] = lambda: compiled.generate(prompt, cfg.new_tokens, temperature=0)
        if graphs is not None:  # and recorded as CUDA graphs (sample.py --cuda_graphs)
            ways["kv_cuda_graphs"] = lambda: graphs.generate(prompt, cfg.new_tokens, temperature=0)
        if int8 is not None:
            ways["int8"] = lambda: D.generate(int8, prompt, cfg.new_tokens, temperature=0)
            ways["int8_matmuls_alone"] = lambda: matmuls_alone(int8, B, cfg.new_tokens)
            ways["int8_forced"] = lambda: D.generate(other, prompt, cfg.new_tokens, temperature=0)
        if int8_decoder is not None:
            ways["int8_compiled"] = lambda: int8_decoder.generate(prompt, cfg.new_tokens, temperature=0)
        if B == 1:
            ways.update({name: (lambda m=m: D.generate(m, prompt, cfg.new_tokens, temperature=0))
                         for name, m in low.items()})
        outs, times, first = {}, {(t, k): [] for t in threads for k in ways}, {}
        reads = {t: [] for t in threads}
        cpu = {(t, k): [] for t in threads for k in ("read", "kv_cache", "int8", "int8_compiled")}
        with torch.no_grad():
            # warm-up (and compiling), and the tokens compared (a thread count may change float rounding)
            for t in threads:
                torch.set_num_threads(t)
                outs[t] = {}
                for k, fn in ways.items():
                    t0 = time.perf_counter()
                    outs[t][k] = fn().cpu()
                    first.setdefault((B, k), time.perf_counter() - t0)
            for _ in range(cfg.repeats):  # interleaved
                for t in threads:
                    torch.set_num_threads(t)
                    for k, fn in ways.items():
                        c0 = time.process_time()
                        times[t, k].append(median_time(fn, 1, sync))
                        if (t, k) in cpu:
                            cpu[t, k].append(time.process_time() - c0)
                    if big is not None:
                        c0 = time.process_time()
                        reads[t].append(median_time(big.sum, 1))
                        cpu[t, "read"].append(time.process_time() - c0)
        for t in threads:
            out = outs[t]
            assert "recompute" not in out or torch.equal(out["recompute"], out["kv_cache"]), \
                "KV-cache and recompute greedy tokens differ"
            assert "int8" not in out or torch.equal(out["int8"], out["int8_forced"]), \
                f"the int8 greedy tokens of {Q.kernel_line(int8)} and of {forced} differ"
            row = {"threads": t, "batch": B, **{k: B * cfg.new_tokens / statistics.median(times[t, k]) for k in ways},
                   "same_tokens_hf": bool(torch.equal(out["hf_generate"], out["kv_cache"]))}
            if "kv_compiled" in out:
                row["compiled_same_tokens_hf"] = bool(torch.equal(out["hf_generate"], out["kv_compiled"]))
                row["compiled_first_call_s"] = first[B, "kv_compiled"]
            if "kv_cuda_graphs" in out:
                row["cuda_graphs_same_tokens"] = bool(torch.equal(out["kv_cuda_graphs"], out["kv_compiled"]))
            row["agree"] = {name: leading_agreement(out[name], out["kv_cache"], cfg.prompt_len)
                            for name in low if name in out}
            if "int8" in out:
                row["int8_agree"] = leading_agreement(out["int8"], out["kv_cache"], cfg.prompt_len)
            if "int8_compiled" in out:
                row["int8_compiled_agree"] = leading_agreement(out["int8_compiled"], out["kv_cache"], cfg.prompt_len)
                row["int8_compiled_first_call_s"] = first[B, "int8_compiled"]
            if reads[t]:  # bytes/s; each decoding step reads every weight once for all B sequences
                row["bandwidth"] = big.numel() * 4 / statistics.median(reads[t])
                # the fractions in CPU seconds (this process's), so that time other jobs took the core is in
                # neither the bandwidth nor the decoding rate: on a shared machine wall time counts it in both,
                # unevenly
                row["cpu_s"] = {k: statistics.median(v) for (u, k), v in cpu.items() if u == t and v}
                row["bandwidth_cpu"] = big.numel() * 4 / row["cpu_s"]["read"]
                row["kv_fraction"] = (weight_bytes(model) * cfg.new_tokens / row["cpu_s"]["kv_cache"]
                                      / row["bandwidth_cpu"])
                if "int8" in out:
                    row["int8_fraction"] = (weight_bytes(int8) * cfg.new_tokens / row["cpu_s"]["int8"]
                                            / row["bandwidth_cpu"])
                if "int8_compiled" in out:
                    row["int8_compiled_fraction"] = (weight_bytes(int8) * cfg.new_tokens / row["cpu_s"]["int8_compiled"]
                                                     / row["bandwidth_cpu"])
            rows.append(row)
    torch.set_num_threads(threads[0])
    return {"preset": cfg.sample_preset, "input": cfg.sample_input, "prompt_len": cfg.prompt_len,
            "new_tokens": cfg.new_tokens, "rows": rows,
            "bandwidth_mb": cfg.bandwidth_mb,
            "weight_bytes": weight_bytes(model), "int8_weight_bytes": int8 and weight_bytes(int8),
            "int8_forced": forced, "int8_kernel": int8 is not None and Q.kernel_line(int8)}


# ----------------------------------------------------------------------------- loading
LOAD_PATHS = ("float32", "quantize int8", "int8 checkpoint")  # float32 alone with --no-int8
# a start's parts, in seconds; "rest": the rest of sample.py's start (settings, its checks, the drawable ids)
LOAD_PARTS = ("imports", "tokenizer", "reading", "building", "kernel_choice", "first_token", "rest")
LOAD_CHILD = """
import contextlib, io, json, os, sys, time
t0 = time.perf_counter()
import torch
import sample
import bincode_gpt.checkpoint as C
path, way, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if way != "float32":  # imported at load by sample.py for int8 weights: here, to time its kernel choice
    import bincode_gpt.quantize as Q
imports = time.perf_counter() - t0
torch.set_num_threads(threads)
spent, spans, returned, marks = {}, {}, {}, []


def timed(owner, name, part):  # owner.name from now on adds its wall time to spent[part], and spans it
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            returned[part] = inner(*args, **kwargs)
            return returned[part]
        finally:
            end = time.perf_counter()
            spent[part] = spent.get(part, 0.0) + end - start
            first, last = spans.get(part, (start, end))
            spans[part] = min(first, start), max(last, end)
    setattr(owner, name, wrapper)


def marked(inner):  # a token stream, each token's time marked
    def stream(*args, **kwargs):
        marks.append(time.perf_counter())
        for token in inner(*args, **kwargs):
            marks.append(time.perf_counter())
            yield token
    return stream


# building: from load_checkpoint's start to the end of the last of them (code that quantizes or checks the
# weights after load_checkpoint, as sample.py once did, included), less reading and the kernel choice
timed(sample, "load_checkpoint", "load")
if hasattr(sample, "check_finite"):
    timed(sample, "check_finite", "load")
timed(C, "read_checkpoint", "reading")
timed(sample, "load_text_codec", "tokenizer")
timed(sample, "prompt_ids", "tokenizer")
if way != "float32":
    timed(Q, "choose_kernel", "kernel_choice")
    timed(Q, "quantize_int8", "load")
if hasattr(sample, "stream"):  # a tree whose sample.py calls decode.stream
    sample.stream = marked(sample.stream)
else:  # sample.py calls decode.Decoder.stream
    import bincode_gpt.decode as D
    D.Decoder.stream = marked(D.Decoder.stream)
args = ["--ckpt", path, "--prompt", "Hello", "--max_new_tokens", str(tokens), "--temperature", "0", "--device", "cpu"]
with contextlib.redirect_stdout(io.StringIO()):
    sample.main(args + (["--quantize", "int8"] if way == "quantize int8" else []))
parts = {"imports": imports, "tokenizer": spent["tokenizer"], "reading": spent["reading"],
         "kernel_choice": spent.get("kernel_choice", 0.0), "first_token": marks[1] - marks[0]}
parts["building"] = spans["load"][1] - spans["load"][0] - parts["reading"] - parts["kernel_choice"]
parts["rest"] = marks[1] - t0 - sum(parts.values())
# this process's own peak RSS (VmHWM: kB; ru_maxrss would carry the parent's high-water mark over exec)
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({**parts, "to_first_s": marks[1] - t0, "to_last_s": marks[-1] - t0, "tokens": len(marks) - 1,
                  "peak_rss": peak, "cpu_s": sum(os.times()[:2]),  # every thread's, the packing thread's too
                  "kernel": returned["kernel_choice"][0] if "kernel_choice" in returned else "float32"}))
"""


def run_load_child(root, path, way, tokens, threads):
    """sample.py's start, itemised (LOAD_PARTS), in a fresh process running the code in `root`: greedy from
    the prompt "Hello" to token `tokens`, seconds from the child's first line; peak RSS, CPU seconds, kernel."""
    import subprocess

    run = subprocess.run([sys.executable, "-c", LOAD_CHILD, path, way, str(tokens), str(threads)], cwd=root,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode:
        raise RuntimeError(f"the {way} loading child in {root} failed (exit {run.returncode}): "
                           f"{run.stderr.strip().splitlines()[-1:]}")
    return json.loads(run.stdout)


def ref_tree(ref, folder):
    """The code of git commit `ref` of this repository, written into `folder` (git archive): the root to
    run a loading child in."""
    import subprocess
    import tarfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(folder)
    archive = subprocess.run(["git", "-C", root, "archive", "--format=tar", ref], capture_output=True)
    if archive.returncode:
        raise ValueError(f"--ref {ref}: not a commit of this repository ({archive.stderr.decode().strip()[:200]})")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def load_checkpoints(preset, folder, int8):
    """{path: checkpoint file} for the load section: random weights of `preset` with a GPT-2 tokenizer entry,
    and (int8) convert.py's int8 checkpoint of them; kept in `folder` and used again where they are there."""
    from tools.convert import convert_native_to_int8

    config = M.get_config(preset)
    files = {"float32": os.path.join(folder, f"{preset}.pt")}
    if not os.path.exists(files["float32"]):
        torch.manual_seed(0)
        tokenizer = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": min(config.vocab_size, 50257)}
        torch.save(checkpoint_dict(M.GPT(config), tokenizer), files["float32"])
    if int8:
        files["quantize int8"] = files["float32"]
        files["int8 checkpoint"] = os.path.join(folder, f"{preset}-int8", "ckpt.pt")
        if not os.path.exists(files["int8 checkpoint"]):
            convert_native_to_int8(files["float32"], os.path.dirname(files["int8 checkpoint"]))
    return files


def bench_load(cfg, tmp):
    """sample.py's start itemised (LOAD_PARTS) and its load_tokens greedy tokens end to end, in fresh
    processes, for a float32 checkpoint of `load_preset`, the same with --quantize int8 and convert.py's int8
    checkpoint of it (--int8); with `ref`, the same commands on that commit's code beside this tree's, the
    runs alternating (this, ref; then ref, this), load_repeats of each, medians."""
    files = load_checkpoints(cfg.load_preset, cfg.load_dir or tmp, cfg.int8)
    trees = {"this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if cfg.ref:
        trees[cfg.ref] = ref_tree(cfg.ref, os.path.join(tmp, "ref"))
    runs = {(way, tree): [] for way in files for tree in trees}
    for repeat in range(cfg.load_repeats):
        for way in files:
            for tree in list(trees)[:: 1 if repeat % 2 == 0 else -1]:
                runs[way, tree].append(run_load_child(trees[tree], files[way], way, cfg.load_tokens,
                                                      torch.get_num_threads()))
    rows = [{"way": way, "tree": tree, "runs": rs, "kernel": ", ".join(sorted({r["kernel"] for r in rs})),
             **{k: statistics.median(r[k] for r in rs) for k in (*LOAD_PARTS, "to_first_s", "to_last_s", "cpu_s")},
             "tokens": min(r["tokens"] for r in rs), "peak_rss": max(r["peak_rss"] for r in rs)}
            for (way, tree), rs in runs.items()]
    return {"preset": cfg.load_preset, "ckpt_bytes": os.path.getsize(files["float32"]), "ref": cfg.ref,
            "int8_ckpt_bytes": os.path.getsize(files["int8 checkpoint"]) if cfg.int8 else None,
            "repeats": cfg.load_repeats, "tokens": cfg.load_tokens, "rows": rows}


# ----------------------------------------------------------------------------- the compiled step, warm cache
CACHE_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
from torch._dynamo.utils import counters
from bincode_gpt import decode
from model import GPT, get_config
preset, device, way = sys.argv[1:4]
prompt_len, new_tokens, until, threads = map(int, sys.argv[4:8])
if way == "exact":  # as before issue 35: a cache of exactly the positions reached, one shape (one compile) each
    decode.size_class = lambda positions: positions
torch.set_num_threads(threads)
torch.manual_seed(0)
model = GPT(get_config(preset)).to(device).eval()
prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len)).to(device)
t1 = time.perf_counter()
for i, _ in enumerate(decode.stream(model, prompt, new_tokens, temperature=0, compile=way != "eager"), 1):
    if i == min(2, until):  # token 2: the step's first call (token 1 comes from the prompt's eager pass)
        t_step = time.perf_counter()
    if i == until:
        break
t2 = time.perf_counter()
made = counters["inductor"]
print(json.dumps({"to_step_s": t_step - t1, "to_token_s": t2 - t1, "process_s": t2 - t0,
                  "graphs": counters["stats"]["unique_graphs"], "hits": made["fxgraph_cache_hit"],
                  "misses": made["fxgraph_cache_miss"]}))
"""
CACHE_RUNS = ("cold", "other")  # an empty cache; the cache the first shape warmed, another prompt and length


def bench_compile_cache(cfg, device, tmp):
    """Time to token new_tokens of a fresh process decoding greedily with the compiled step, from inductor's cache
    on disk: empty (cold), and warmed by that shape for another prompt and output length (other, the `cache_other`
    shape), each with caches of exactly the positions reached (exact: as before issue 35, one compile
    per shape) and of their size class (class: decode.size_class); and eager, the other shape. Each round starts
    from an empty cache folder that the two ways share (their graphs differ): the runs interleave, class first, so
    its cold run also compiles what every graph shares (inductor's C++ prelude)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = tuple(int(n) for n in cfg.cache_other.split(","))
    shapes = {"cold": (cfg.prompt_len, cfg.new_tokens), "other": other}

    def child(way, shape, cache):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        argv = [cfg.cache_preset, str(device), way, *map(str, (*shape, cfg.new_tokens, torch.get_num_threads()))]
        run = subprocess.run([sys.executable, "-c", CACHE_CHILD, *argv], cwd=root, env=env, stdout=subprocess.PIPE,
                             text=True)
        if run.returncode:
            raise RuntimeError(f"the compile_cache child ({way}, {shape}) failed (exit {run.returncode})")
        return json.loads(run.stdout)

    runs = {(way, r): [] for way in ("class", "exact") for r in CACHE_RUNS}
    eager = []
    for n in range(cfg.cache_repeats):
        cache = os.path.join(tmp, f"inductor-{n}")
        for r in CACHE_RUNS:
            for way in ("class", "exact"):
                runs[way, r].append(child(way, shapes[r], cache))
        eager.append(child("eager", other, cache))
    median = lambda rs: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    positions = {r: sum(shape) for r, shape in shapes.items()}
    return {"preset": cfg.cache_preset, "tokens": cfg.new_tokens, "shapes": shapes, "repeats": cfg.cache_repeats,
            "classes": {r: D.size_class(p) for r, p in positions.items()}, "positions": positions,
            "runs": {f"{way} {r}": median(rs) for (way, r), rs in runs.items()}, "eager": median(eager)}


# ----------------------------------------------------------------------------- data preparation
def _python_work(n):
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i * i
    return time.perf_counter() - t0


def _tiktoken_work(text):
    enc = get_tokenizer("gpt2")
    enc.encode_ordinary(text[:10_000])  # build the regex and caches before timing
    t0 = time.perf_counter()
    enc.encode_ordinary(text)
    return time.perf_counter() - t0


def parallel_scaling(work, arg, procs):
    """Throughput of `procs` processes running work(arg) at once, relative to one: procs * t1 / t_procs."""
    with mp.Pool(procs) as pool:
        one = pool.apply(work, (arg,))
        many = pool.map(work, [arg] * procs)
    return procs * one / max(many)


def bench_prep(cfg, tmp):
    workers = cfg.workers or os.cpu_count() or 1
    source = inputs.resolve_inputs([cfg.corpus or "shakespeare"])[0]
    with open(source, encoding="utf-8-sig") as f:  # a byte-order mark is not text, nor one in each copy
        text = f.read()
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for _ in range(cfg.prep_copies):
            f.write(text)
    mb = os.path.getsize(corpus) / 1e6
    times, py, tk = {1: [], workers: []}, [], []
    for _ in range(cfg.repeats):  # interleaved: prep 1 worker, prep all, then what the machine gives now
        for w in times:
            t0 = time.perf_counter()
            P.prepare([corpus], os.path.join(tmp, f"prep{w}"), vocab_size=8192, workers=w, overwrite=True,
                      progress=False)
            times[w].append(time.perf_counter() - t0)
        py.append(parallel_scaling(_python_work, 3_000_000, workers))
        tk.append(parallel_scaling(_tiktoken_work, text[:1_000_000], workers))
    one, many = (mb / statistics.median(times[w]) for w in (1, workers))
    return {"mb": mb, "workers": workers, "mb_s_1": one, "mb_s_all": many,
            "python_scaling": statistics.median(py), "tiktoken_scaling": statistics.median(tk)}


# ----------------------------------------------------------------------------- report
def run(cfg: BenchConfig) -> dict:
    """Run the chosen sections; returns {"device", "train", "sample", "load", "prep", "compile_cache", "targets"}
    (absent sections: None)."""
    check_settings(cfg)
    sections = set(cfg.sections.split(","))
    if not sections <= set(SECTIONS):
        unknown = ", ".join(sorted(sections - set(SECTIONS)))
        raise ValueError(f"unknown section(s) {unknown}: choose from {','.join(SECTIONS)}")
    device = pick_device(cfg.device)
    threads = [parse_int(t) for t in cfg.threads.split(",")] if cfg.threads else [torch.get_num_threads()]
    if min(threads) < 1:
        raise ValueError(f"--threads must be positive integers, got {cfg.threads!r}")
    check_sections(cfg, sections, device)
    torch.set_num_threads(threads[0])
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
           "cpu": Q.cpu_summary(),  # model name and flags: every speed figure is this CPU's
           "config": asdict(cfg), "train": None, "sample": None, "load": None, "prep": None, "compile_cache": None,
           "threads": torch.get_num_threads(), "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        if "train" in sections:
            res["train"] = bench_train(cfg, device, tmp)
        if "sample" in sections:
            res["sample"] = bench_sample(cfg, device, tmp, threads)
        if "load" in sections:
            res["load"] = bench_load(cfg, tmp)
        if "prep" in sections:
            res["prep"] = bench_prep(cfg, tmp)
        if "compile_cache" in sections:
            res["compile_cache"] = bench_compile_cache(cfg, device, tmp)
    res["load_after"] = os.getloadavg()[0]  # 1-minute load average: > cores means other jobs competed
    tr, sa, lo, pr = res["train"], res["sample"], res["load"], res["prep"]
    targets = []

    def target(name, value, goal, measured=True, at_most=False, valid=True):
        """valid=False: a condition besides the ratio (identical tokens) failed, so MISS whatever the ratio."""
        met = measured and valid and (value <= goal if at_most else value >= goal)
        targets.append({"target": name, "ratio": value if measured else None,
                        "goal": f"{'<=' if at_most else '>='} {goal:g}",
                        "verdict": "not measured" if not measured else "PASS" if met else "MISS"})

    if tr and device.type == "cpu":
        v = tr["variants"]
        target("binary / learned training tokens/s (CPU)",
               v["binary"]["tokens_per_s"] / v["learned"]["tokens_per_s"], 1.0)
    if tr and tr["nanogpt"] and device.type == "cpu":
        target("training step time, nanoGPT's model.py / model.py (CPU, NANOGPT_SHAPE)", tr["nanogpt"]["ratio"], 1.1)
    for r in sa["rows"] if sa else []:
        if r["batch"] == 1:
            target(f"KV-cache / HF generate tokens/s, batch 1, {r['threads']} threads, same tokens ({sa['preset']})",
                   r["kv_cache"] / r["hf_generate"], 1.5, valid=r["same_tokens_hf"])
            if "kv_compiled" in r:
                target(f"KV-cache compiled step / HF generate tokens/s, batch 1, {r['threads']} threads, "
                       f"same tokens ({sa['preset']})",
                       r["kv_compiled"] / r["hf_generate"], 1.5, valid=r["compiled_same_tokens_hf"])
            if "int8" in r:
                target(f"int8 / float32 KV-cache tokens/s, batch 1, {r['threads']} threads ({sa['preset']})",
                       r["int8"] / r["kv_cache"], 3.0)
                target(f"int8 not slower than float32, batch 1, {r['threads']} threads ({sa['preset']})",
                       r["int8"] / r["kv_cache"], 1.0)
            if "int8_fraction" in r and r["threads"] == 1:
                target(f"int8 decoding: weight bytes read / one-thread read bandwidth, batch 1 ({sa['preset']})",
                       r["int8_fraction"], 0.75)
            if "int8_compiled_fraction" in r and r["threads"] == 1:
                target(f"int8 decoding, compiled step: weight bytes read / one-thread read bandwidth, "
                       f"batch 1 ({sa['preset']})",
                       r["int8_compiled_fraction"], 0.75)
    if lo:
        row = {(r["way"], r["tree"]): r for r in lo["rows"]}
        f32 = row["float32", "this"]
        if lo["ref"]:
            for way in dict.fromkeys(r["way"] for r in lo["rows"]):
                target(f"sample.py's first token, {way}, this tree / {lo['ref']} ({lo['preset']})",
                       row[way, "this"]["to_first_s"] / row[way, lo["ref"]]["to_first_s"], 1.05, at_most=True)
        target(f"peak RSS, float32 checkpoint / its size ({lo['preset']})", f32["peak_rss"] / lo["ckpt_bytes"], 1.15,
               at_most=True)
        if ("quantize int8", "this") in row:
            i8, ckpt8 = row["quantize int8", "this"], row["int8 checkpoint", "this"]
            for name, r in (("--quantize int8", i8), ("int8 checkpoint", ckpt8)):
                target(f"end to end (process start to token {lo['tokens']}), {name} / float32 ({lo['preset']})",
                       r["to_last_s"] / f32["to_last_s"], 0.5, at_most=True)
            target(f"peak RSS, int8 checkpoint / float32 checkpoint size ({lo['preset']})",
                   ckpt8["peak_rss"] / lo["ckpt_bytes"], 0.45, at_most=True)
            target(f"first token, int8 checkpoint / float32 ({lo['preset']})", ckpt8["to_first_s"] / f32["to_first_s"],
                   1.0, at_most=True)
    if pr:
        target(f"prep all cores / ({pr['workers']} x one worker) MB/s",
               pr["mb_s_all"] / (pr["workers"] * pr["mb_s_1"]), 0.8)
    h200 = tr is not None and "H200" in res["device"] and tr["preset"] == "paper"
    mfu = tr["variants"]["binary"]["mfu_measured"] if h200 else None
    target("paper preset MFU vs measured bf16 matmul (H200)", mfu, 0.5, h200)
    res["targets"] = targets
    return res


def fmt(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def rate(x):
    """tokens/s: one decimal below 100 (the paper preset decodes a few a second on a CPU)."""
    return fmt(x, ",.1f" if x is not None and x < 100 else ",.0f")


def table(res) -> str:
    lines = [f"CPU: {res['cpu']}",
             f"device: {res['device']}, {res['threads']} torch threads "
             f"(sampling: {res['config']['threads'] or 'default'}); "
             f"1-min load average {res['load_before']:.2f} before, {res['load_after']:.2f} after", ""]
    tr, sa, lo, pr = res["train"], res["sample"], res["load"], res["prep"]
    if tr:
        lines += [f"training: preset {tr['preset']}, block {tr['block_size']}, batch {tr['batch_size']}, "
                  f"{tr['dtype']}, compile {tr['compile']}; measured matmul {tr['matmul_flops'] / 1e9:,.1f} GFLOP/s, "
                  f"datasheet peak {fmt(tr['peak_flops'] and tr['peak_flops'] / 1e12, ',.0f')} TFLOP/s",
                  "| input | tokens/s | MFU (measured matmul) | MFU (datasheet) | steps timed |",
                  "|---|---:|---:|---:|---:|"]
        for v, r in tr["variants"].items():
            lines.append(f"| {v} | {r['tokens_per_s']:,.0f} | {100 * r['mfu_measured']:.1f}% | "
                         f"{fmt(r['mfu_peak'] and 100 * r['mfu_peak'], '.1f')}{'%' if r['mfu_peak'] else ''} | "
                         f"{r['steps_timed']} |")
        ng = tr["nanogpt"]
        if ng:
            shape = ", ".join(f"{k} {v:,}" for k, v in ng["shape"].items())
            lines.append(f"one training step beside nanoGPT's model.py ({ng['checkout']}), {shape}, batch "
                         f"{ng['batch_size']}, float32: {1e3 * ng['ours_step_s']:,.1f} ms vs "
                         f"{1e3 * ng['nanogpt_step_s']:,.1f} ms, {ng['ratio']:.2f}x (medians of {ng['steps_timed']})")
        lines.append("")
    if sa:
        lines += [f"sampling: preset {sa['preset']}, {sa['input']} input, prompt {sa['prompt_len']}, "
                  f"{sa['new_tokens']} new tokens, greedy, float32; "
                  "tokens/s, and ratios to HF generate "
                  "(matmuls alone: every weight times one row per token, the ceiling)",
                  "| threads | batch | KV cache | KV compiled | recompute | HF generate | matmuls alone | KV/HF | "
                  "compiled/HF | ceiling/HF | same tokens as HF (KV, compiled) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in sa["rows"]:
            comp, hf = r.get("kv_compiled"), r["hf_generate"]
            lines.append(f"| {r['threads']} | {r['batch']} | {rate(r['kv_cache'])} | {rate(comp)} | "
                         f"{rate(r.get('recompute'))} | {rate(hf)} | {rate(r['matmuls_alone'])} | "
                         f"{r['kv_cache'] / hf:.2f}x | {fmt(comp and comp / hf, '.2f')}"
                         f"{'x' if comp else ''} | {r['matmuls_alone'] / hf:.2f}x | {r['same_tokens_hf']}, "
                         f"{r.get('compiled_same_tokens_hf', '-')} |")
        compiled = [f"{r['compiled_first_call_s']:.1f} s (batch {r['batch']})"
                    for r in sa["rows"] if "compiled_first_call_s" in r]
        if compiled:
            lines.append(f"compiled step: first call, compiling included: {', '.join(dict.fromkeys(compiled))}")
        lines += [f"CUDA graphs (the compiled step recorded), batch {r['batch']}: {rate(r['kv_cuda_graphs'])} tok/s, "
                  f"{r['kv_cuda_graphs'] / r['kv_compiled']:.2f}x the compiled step, the same tokens: "
                  f"{r['cuda_graphs_same_tokens']}" for r in sa["rows"] if "kv_cuda_graphs" in r]
        i8 = [r for r in sa["rows"] if "int8" in r]
        if i8:
            lines += ["", f"int8 weights (quantize.py, eager): a token reads {sa['weight_bytes'] / 1e6:,.0f} MB of "
                      f"weights in float32, {sa['int8_weight_bytes'] / 1e6:,.0f} MB in int8 (with scales); "
                      f"int8 KV: quantize_int8 as sample.py runs it ({sa['int8_kernel']}); "
                      f"forced: the same weights on {sa['int8_forced']} (the plain rows, what a layer runs until the "
                      "packing thread reaches it; where those were chosen, oneDNN's uint8 kernel if its sums are "
                      "exact here, else the widened rows), the same tokens; "

                      "int8 matmuls alone: the int8 ceiling; "
                      f"read: a float32 sum over {sa['bandwidth_mb']:,} MB; "
                      "of read: weight bytes a step reads x steps/s / read, "
                      "both in this process's CPU seconds (other jobs' time left out)",
                      "| threads | batch | float32 KV | int8 KV | int8 forced | int8 / float32 | int8 / HF | "
                      "int8 matmuls alone | int8 ceiling / HF | read GB/s (wall, CPU) | float32 of read | "
                      "int8 of read | leading tokens equal to float32 |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['threads']} | {r['batch']} | {rate(r['kv_cache'])} | {rate(r['int8'])} | "
                      f"{rate(r['int8_forced'])} | "
                      f"{r['int8'] / r['kv_cache']:.2f}x | "
                      f"{r['int8'] / r['hf_generate']:.2f}x | {rate(r['int8_matmuls_alone'])} | "
                      f"{r['int8_matmuls_alone'] / r['hf_generate']:.2f}x | "
                      f"{fmt(r.get('bandwidth') and r['bandwidth'] / 1e9, '.1f')}, "
                      f"{fmt(r.get('bandwidth_cpu') and r['bandwidth_cpu'] / 1e9, '.1f')} | "
                      f"{fmt(r.get('kv_fraction') and 100 * r['kv_fraction'], '.0f')}% | "
                      f"{fmt(r.get('int8_fraction') and 100 * r['int8_fraction'], '.0f')}% | "
                      f"{r['int8_agree']} / {sa['new_tokens']} |"
                      for r in i8]
        i8c = [r for r in sa["rows"] if "int8_compiled" in r]
        if i8c:
            lines += ["", "int8 compiled (sample.py --compile: Int8Linear.weight_only, weights alone int8), "
                      "beside float32 compiled; of read: as above",
                      "| threads | batch | float32 compiled | int8 compiled | int8 / float32, both compiled | "
                      "int8 compiled / int8 eager | int8 compiled of read | leading tokens equal to float32 | "
                      "first call s (compiling) |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['threads']} | {r['batch']} | {rate(r.get('kv_compiled'))} | "
                      f"{rate(r['int8_compiled'])} | "
                      f"{fmt(r.get('kv_compiled') and r['int8_compiled'] / r['kv_compiled'], '.2f')}x | "
                      f"{r['int8_compiled'] / r['int8']:.2f}x | "
                      f"{fmt(r.get('int8_compiled_fraction') and 100 * r['int8_compiled_fraction'], '.0f')}% | "
                      f"{r['int8_compiled_agree']} / {sa['new_tokens']} | {r['int8_compiled_first_call_s']:.1f} |"
                      for r in i8c]
        low = [(r, name, n) for r in sa["rows"] for name, n in r["agree"].items()]
        if low:
            lines += ["", "sampling precision: KV cache at batch 1, weights and activations in the dtype, greedy",
                      "| threads | dtype | tok/s | vs float32 | leading tokens equal to float32 |",
                      "|---:|---|---:|---:|---:|"]
            lines += [f"| {r['threads']} | {name} | {rate(r[name])} | {r[name] / r['kv_cache']:.2f}x | "
                      f"{n} / {sa['new_tokens']} |"
                      for r, name, n in low]
        lines.append("")
    if lo:
        int8_file = f", int8 checkpoint {lo['int8_ckpt_bytes'] / 1e9:.2f} GB" if lo["int8_ckpt_bytes"] else ""
        beside = f"; this tree beside {lo['ref']} (git archive), alternating" if lo["ref"] else ""
        lines += [f"loading: preset {lo['preset']}, checkpoint {lo['ckpt_bytes'] / 1e9:.2f} GB{int8_file}; "
                  f"sample.py --prompt Hello --temperature 0 --max_new_tokens {lo['tokens']} in a fresh process a "
                  f"run{beside}; median of {lo['repeats']}; s from the child's first line "
                  "(imports: torch, sample.py's, quantize.py's for int8); "
                  "building: load_checkpoint less reading and the kernel choice; rest: "
                  "sample.py's other set-up",
                  f"| path | code | imports | tokenizer | reading the file | building the model | int8 kernel choice | "
                  f"first token | rest | to first token | to token {lo['tokens']} | peak RSS GB | CPU s | kernel |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        row = {(r["way"], r["tree"]): r for r in lo["rows"]}
        for r in lo["rows"]:
            short = f" ({r['tokens']} tokens: end of text)" if r["tokens"] < lo["tokens"] else ""
            lines.append(f"| {r['way']} | {r['tree']} | " + " | ".join(f"{r[k]:.3f}" for k in LOAD_PARTS)
                         + f" | {r['to_first_s']:.2f} | {r['to_last_s']:.2f}{short} | {r['peak_rss'] / 1e9:.2f} | "
                         f"{r['cpu_s']:.1f} | {r['kernel']} |")
            if lo["ref"] and r["tree"] == lo["ref"]:
                this = row[r["way"], "this"]
                timed = (*LOAD_PARTS, "to_first_s", "to_last_s")
                ratios = [f"{this[k] / r[k]:.2f}x" if r[k] > 0.0005 else "-" for k in timed]
                lines.append(f"| {r['way']} | this / {lo['ref']} | {' | '.join(ratios)} | "
                             f"{this['peak_rss'] / r['peak_rss']:.2f}x | {this['cpu_s'] / r['cpu_s']:.2f}x | |")
        lines.append("")
    if pr:
        lines += [f"data preparation: {pr['mb']:.1f} MB corpus, vocab 8192",
                  f"| 1 worker MB/s | {pr['workers']} workers MB/s | speed-up | machine: pure-Python speed-up | "
                  "machine: tiktoken speed-up | prep / pure-Python speed-up |",
                  "|---:|---:|---:|---:|---:|---:|",
                  f"| {pr['mb_s_1']:.2f} | {pr['mb_s_all']:.2f} | {pr['mb_s_all'] / pr['mb_s_1']:.2f}x | "
                  f"{pr['python_scaling']:.2f}x | {pr['tiktoken_scaling']:.2f}x | "
                  f"{pr['mb_s_all'] / pr['mb_s_1'] / pr['python_scaling']:.2f} |", ""]
    cc = res["compile_cache"]
    if cc:
        lines += [f"compiled step from inductor's cache on disk: preset {cc['preset']}, a fresh process per run "
                  f"(median of {cc['repeats']}), greedy; s from the model built to token 2 (the compiled step's first "
                  f"call) and to token {cc['tokens']}; graphs compiled, inductor cache hits/misses; exact: caches of "
                  "the positions reached (before issue 35), class: of their size class; one cache folder, class "
                  "first: its empty-cache run also compiles the kernels both ways share",
                  f"| run | prompt, new tokens | positions (class) | exact s, token 2, {cc['tokens']} | exact graphs, "
                  f"hits/misses | class s, token 2, {cc['tokens']} | class graphs, hits/misses | class / exact, token "
                  f"{cc['tokens']} |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        names = {"cold": "empty cache", "other": "warm, another prompt and length"}
        for r, name in names.items():
            ex, cl = cc["runs"][f"exact {r}"], cc["runs"][f"class {r}"]
            shape = ", ".join(map(str, cc["shapes"][r]))
            lines.append(f"| {name} | {shape} | {cc['positions'][r]} ({cc['classes'][r]}) | "
                         f"{ex['to_step_s']:.1f}, {ex['to_token_s']:.1f} | {ex['graphs']:.0f}, "
                         f"{ex['hits']:.0f}/{ex['misses']:.0f} | {cl['to_step_s']:.1f}, {cl['to_token_s']:.1f} | "
                         f"{cl['graphs']:.0f}, {cl['hits']:.0f}/{cl['misses']:.0f} | "
                         f"{format(cl['to_token_s'] / ex['to_token_s'], '.2f') + 'x' if r == 'other' else '-'} |")
        eager = cc["eager"]
        lines += [f"eager, the other shape: {eager['to_step_s']:.2f} s to token 2, {eager['to_token_s']:.2f} s to "
                  f"token {cc['tokens']}", ""]
    lines += ["| target | ratio | goal | verdict |", "|---|---:|---:|---|"]
    for t in res["targets"]:
        lines.append(f"| {t['target']} | {fmt(t['ratio'], '.2f')} | {t['goal']} | {t['verdict']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- checks on the settings
# the settings each section reads (the others: device, sections, threads, json, read by the run as a whole):
# one given for sections that are not run is refused, not ignored
READ_BY = {"train": ("preset", "block_size", "batch_size", "train_repeats", "steps", "warmup", "compile", "matmul_n",
                     "repeats", "nanogpt"),

           "sample": ("sample_preset", "sample_input", "prompt_len", "new_tokens", "sample_batches", "recompute",
                      "sample_compile", "precisions", "int8", "bandwidth_mb", "repeats"),
           "load": ("load_preset", "load_repeats", "load_tokens", "int8", "ref", "load_dir"),
           "prep": ("corpus", "prep_copies", "workers", "repeats"),
           "compile_cache": ("cache_preset", "cache_other", "prompt_len", "new_tokens", "cache_repeats")}


def check_sections(cfg, sections, device):
    """A setting changed from its default does something in the sections run, on this device, or is refused."""
    default = BenchConfig()
    for name in sorted({n for names in READ_BY.values() for n in names}):
        readers = [s for s, names in READ_BY.items() if name in names]
        if getattr(cfg, name) != getattr(default, name) and not sections & set(readers):
            named = " and ".join([", ".join(readers[:-1]), readers[-1]] if len(readers) > 1 else readers)
            raise ValueError(f"--{name} is a setting of the {named} section{'s' * (len(readers) > 1)}, which "
                             f"--sections={cfg.sections} does not run: add {readers[0]} there, or drop the flag")
    if cfg.threads and "," in cfg.threads and "sample" not in sections:
        raise ValueError(f"--threads={cfg.threads}: only the sample section is timed at each count (the others use the "
                         "first): add sample to --sections, or give one count")
    if device.type != "cpu" and cfg.bandwidth_mb != default.bandwidth_mb:
        raise ValueError(f"--bandwidth_mb measures a CPU's read bandwidth, which a {device.type} run does not: drop it")


def check_settings(cfg):
    """Counts a timing needs at least one of (0 would time nothing, or be read as the default), by flag."""
    counts = ("repeats", "steps", "prompt_len", "new_tokens", "load_repeats", "load_tokens", "prep_copies",
              "block_size", "batch_size", "train_repeats", "matmul_n", "workers", "cache_repeats")

    check_at_least_1(cfg, *counts)
    if cfg.warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, got {cfg.warmup}")
    batches = cfg.sample_batches.split(",")
    if not all(b.strip().isdigit() and int(b) >= 1 for b in batches):
        raise ValueError(f"--sample_batches must be batch sizes >= 1, comma-separated, got {cfg.sample_batches!r}")
    odd = [p for p in cfg.precisions.split(",") if p and p not in ("bfloat16", "float16")]
    if odd:
        raise ValueError(f"--precisions takes bfloat16 and float16, got {', '.join(odd)}")
    if cfg.corpus == "":
        raise ValueError("--corpus is '' (empty): name a text file, or leave it out for tiny Shakespeare")
    other = cfg.cache_other.split(",")
    if not (len(other) == 2 and all(n.strip().isdigit() for n in other) and int(other[0]) >= 1
            and int(other[1]) >= cfg.new_tokens):
        raise ValueError(f"--cache_other must be prompt tokens >= 1 and new tokens >= --new_tokens ({cfg.new_tokens}), "
                         f"as 24,100, got {cfg.cache_other!r}")


def build_parser():
    return config_parser(BenchConfig, __doc__.strip().split("\n\n")[0])


def main(argv=None) -> int:
    cfg = parse_settings(build_parser(), argv)
    res = run(cfg)
    print(json.dumps(res, indent=2) if cfg.json else table(res))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
