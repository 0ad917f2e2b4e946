"""Tests of bench.py: every section runs on the tiny preset with tiny sizes (no timed assertions), and
bad input is refused through the command line."""

import json
import os
import subprocess
import sys

import pytest
import torch

from bincode_gpt.quantize import cpu_summary
from tools import bench

TINY = ["--device=cpu", "--preset=tiny", "--block_size=16", "--batch_size=2", "--steps=1", "--warmup=1", "--repeats=1",
        "--sample_preset=tiny", "--prompt_len=4", "--new_tokens=4", "--sample_batches=1,2",
        "--prep_copies=1", "--matmul_n=64", "--load_preset=tiny", "--no-sample_compile", "--bandwidth_mb=8"]


def test_run_reports_every_section(tmp_path):
    pytest.importorskip("transformers")  # the sample section times HF generate() beside ours
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("It is a truth universally acknowledged.\nThat a single man in possession.\n" * 200)
    flags = TINY + [f"--corpus={corpus}", "--workers=2", "--sections=train,sample,load,prep", "--threads=1,2"]
    cfg = bench.BenchConfig(**vars(bench.build_parser().parse_args(flags)))
    res = bench.run(cfg)
    tr = res["train"]
    assert tr["preset"] == "tiny" and tr["matmul_flops"] > 0 and tr["flops_per_token"] > 0
    assert set(tr["variants"]) == {"binary", "affine", "learned"}
    for r in tr["variants"].values():
        assert r["tokens_per_s"] > 0 and r["mfu_measured"] > 0 and r["steps_timed"] == 1
        assert r["mfu_peak"] is None  # CPU: no datasheet peak
    rows = res["sample"]["rows"]
    assert [(r["threads"], r["batch"]) for r in rows] == [(1, 1), (2, 1), (1, 2), (2, 2)]
    for r in rows:
        assert min(r["kv_cache"], r["recompute"], r["hf_generate"], r["matmuls_alone"]) > 0
        assert r["same_tokens_hf"] is True
        # precision copies run at batch 1 only; tiny random weights with a peaked head keep every greedy token
        assert r["agree"] == ({"bfloat16": 4, "float16": 4} if r["batch"] == 1 else {})
        assert min(r["int8"], r["int8_matmuls_alone"]) > 0 and 0 <= r["int8_agree"] <= 4
        assert r["bandwidth"] > 0 and r["bandwidth_cpu"] > 0  # bytes/s of the float32 sum, wall and CPU time
        # what each decoding reads of it: weight bytes x steps per CPU second / bytes per CPU second of the sum
        cpu, sa = r["cpu_s"], res["sample"]
        assert r["bandwidth_cpu"] == 8 * 2**20 / cpu["read"]
        assert r["kv_fraction"] == sa["weight_bytes"] * 4 / cpu["kv_cache"] / r["bandwidth_cpu"]
        assert r["int8_fraction"] == sa["int8_weight_bytes"] * 4 / cpu["int8"] / r["bandwidth_cpu"]
    assert res["sample"]["int8_weight_bytes"] < res["sample"]["weight_bytes"] / 3  # int8 plus a scale per row
    # every figure names its CPU; the int8 kernel sample.py would run is recorded (tiny: the rows, unmeasured)
    assert res["cpu"] == cpu_summary() and res["cpu"].split(": ")[0] in bench.table(res).splitlines()[0]
    kernel = res["sample"]["int8_kernel"]
    assert kernel.split(" (")[0] in ("int8 kernel: rows", "int8 kernel: widened")
    assert kernel.endswith(f") on {res['cpu']}")
    assert "(int8 weights under 16 MiB, in the CPU's caches: not packed; measured at load" in kernel
    lo = res["load"]
    assert lo["preset"] == "tiny" and lo["ckpt_bytes"] > 0 and 0 < lo["int8_ckpt_bytes"] < lo["ckpt_bytes"]
    assert [(r["way"], r["tree"]) for r in lo["rows"]] == [(w, "this") for w in bench.LOAD_PATHS]
    assert [r["kernel"] for r in lo["rows"]][0] == "float32"
    assert {r["kernel"] for r in lo["rows"][1:]} <= {"rows", "widened"}  # unpacked: tiny
    for r in lo["rows"]:
        assert 0 < r["to_first_s"] < r["to_last_s"] and r["peak_rss"] > lo["ckpt_bytes"]
    pr = res["prep"]
    assert pr["mb"] > 0 and pr["mb_s_1"] > 0 and pr["mb_s_all"] > 0 and pr["workers"] == 2
    assert pr["python_scaling"] > 0 and pr["tiktoken_scaling"] > 0
    goals = [">= 1", ">= 1.5", ">= 3", ">= 1", ">= 0.75", ">= 1.5", ">= 3", ">= 1",
             "<= 1.15", "<= 0.5", "<= 0.5", "<= 0.45", "<= 1", ">= 0.8", ">= 0.5"]
    assert [t["goal"] for t in res["targets"]] == goals
    assert [t["target"] for t in res["targets"][1:8]] == [
        s for n in (1, 2) for s in (f"KV-cache / HF generate tokens/s, batch 1, {n} threads, same tokens (tiny)",
                                    f"int8 / float32 KV-cache tokens/s, batch 1, {n} threads (tiny)",
                                    f"int8 not slower than float32, batch 1, {n} threads (tiny)",
                                    "int8 decoding: weight bytes read / one-thread read bandwidth, batch 1 (tiny)")
        if n == 1 or "bandwidth" not in s]
    assert [t["target"] for t in res["targets"][8:13]] == [
        "peak RSS, float32 checkpoint / its size (tiny)",
        "end to end (process start to token 64), --quantize int8 / float32 (tiny)",
        "end to end (process start to token 64), int8 checkpoint / float32 (tiny)",
        "peak RSS, int8 checkpoint / float32 checkpoint size (tiny)",
        "first token, int8 checkpoint / float32 (tiny)"]
    for t in res["targets"][:-1]:
        assert t["verdict"] == ("PASS" if eval(f"{t['ratio']} {t['goal']}") else "MISS"), t
    assert res["targets"][-1]["verdict"] == "not measured"  # the H200 target needs the paper preset
    text = bench.table(res)
    for heading in ("training:", "sampling:", "int8 weights", "loading:", "data preparation:", "| target |"):
        assert heading in text
    json.dumps(res)  # --json works


def test_the_load_section_itemises_a_start_beside_a_ref(tmp_path):
    """sample.py's start in fresh processes, itemised, for float32, --quantize int8 and an int8 checkpoint, this
    tree's and a git commit's (HEAD: the same code), alternating; the parts add up to the first token's time; the
    checkpoints are written once into --load_dir and used again."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout: no commit to compare with")
    args = ["--device=cpu", "--sections=load", "--load_preset=tiny", "--load_repeats=1", "--load_tokens=4",
            "--ref=HEAD", f"--load_dir={tmp_path}", "--threads=1"]
    cfg = bench.BenchConfig(**vars(bench.build_parser().parse_args(args)))
    written = {p: os.path.getmtime(p) for p in bench.load_checkpoints("tiny", str(tmp_path), int8=True).values()}
    res = bench.run(cfg)
    assert {p: os.path.getmtime(p) for p in written} == written  # used again, not written anew
    lo = res["load"]
    assert [(r["way"], r["tree"]) for r in lo["rows"]] == [(w, t) for w in bench.LOAD_PATHS for t in ("this", "HEAD")]
    for r in lo["rows"]:
        assert len(r["runs"]) == 1 and r["tokens"] == 4, r
        assert min(r[part] for part in bench.LOAD_PARTS if part != "rest") >= 0, r
        assert sum(r[part] for part in bench.LOAD_PARTS) == pytest.approx(r["to_first_s"]), r
        assert (r["kernel"] == "float32") == (r["way"] == "float32") == (r["kernel_choice"] == 0), r
    assert [t["target"] for t in res["targets"][:3]] == [f"sample.py's first token, {w}, this tree / HEAD (tiny)"
                                                         for w in bench.LOAD_PATHS]
    text = bench.table(res)
    assert "this tree beside HEAD (git archive), alternating" in text
    for way in bench.LOAD_PATHS:
        assert f"| {way} | this / HEAD | " in text


def test_an_unknown_ref_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^--ref no-such-commit: not a commit of this repository \("):
        bench.ref_tree("no-such-commit", str(tmp_path / "ref"))


# a stand-in for a nanoGPT checkout's model.py: its GPTConfig and GPT(config) and configure_optimizers, built on ours
STAND_IN_NANOGPT = """
from dataclasses import dataclass
import model


@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool


class GPT(model.GPT):
    def __init__(self, config):
        print("number of parameters: ...")
        super().__init__(model.GPTConfig(**vars(config), input="learned"))
"""


def test_one_training_step_is_timed_beside_nanogpts(tmp_path):
    """--nanogpt CHECKOUT: its model.py's GPT and ours take the same step, interleaved; the ratio, a table line and a
    target (CPU) report it. A folder without model.py is refused, naming it."""
    (tmp_path / "model.py").write_text(STAND_IN_NANOGPT)
    train_flags = [f for f in TINY if f.split("=")[0][2:].removeprefix("no-") in bench.READ_BY["train"] + ("device",)]
    flags = train_flags + ["--sections=train", f"--nanogpt={tmp_path}"]
    cfg = bench.BenchConfig(**vars(bench.build_parser().parse_args(flags)))
    res = bench.run(cfg)
    ng = res["train"]["nanogpt"]
    assert ng["shape"] == bench.NANOGPT_SHAPE and ng["steps_timed"] == 1 and ng["checkout"] == str(tmp_path)
    assert ng["ratio"] == ng["nanogpt_step_s"] / ng["ours_step_s"] > 0
    [step] = [t for t in res["targets"] if t["target"].startswith("training step time, nanoGPT's")]
    assert step["goal"] == ">= 1.1" and step["ratio"] == ng["ratio"]
    assert f"one training step beside nanoGPT's model.py ({tmp_path})" in bench.table(res)
    with pytest.raises(ValueError, match=f"--nanogpt {tmp_path / 'none'}: no model.py there"):
        bench.run(bench.BenchConfig(**{**vars(cfg), "nanogpt": str(tmp_path / "none")}))


def test_main_json_one_section(capsys):
    pytest.importorskip("transformers")
    sample_flags = [f for f in TINY if f.split("=")[0][2:].removeprefix("no-") in bench.READ_BY["sample"] + ("device",)]
    assert bench.main(sample_flags + ["--sections=sample", "--sample_batches=1", "--no-recompute", "--precisions=",
                                      "--json", "--sample_compile"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["train"] is None and res["prep"] is None
    [row] = res["sample"]["rows"]
    assert "recompute" not in row and row["agree"] == {} and row["same_tokens_hf"] is True
    assert row["kv_compiled"] > 0 and row["compiled_same_tokens_hf"] is True and row["compiled_first_call_s"] > 0
    assert [t["target"] for t in res["targets"][:2]] == [
        f"KV-cache{c} / HF generate tokens/s, batch 1, 1 threads, same tokens (tiny)" for c in ("", " compiled step")]


def test_compile_cache_another_shape_compiles_nothing_new(capsys, monkeypatch):
    """Fresh processes over one inductor cache: sized by class, another prompt and length of the class (4+4 and
    6+8 positions: class 64) loads the graph the first shape compiled; sized exactly (the code before), it misses."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no pool of compile workers to start: a tiny graph
    assert bench.main(["--device=cpu", "--sections=compile_cache", "--cache_preset=tiny", "--prompt_len=4",
                       "--new_tokens=4", "--cache_other=6,8", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    cc = res["compile_cache"]
    assert cc["positions"] == {"cold": 8, "other": 14} and set(cc["classes"].values()) == {64}
    counts = {run: (r["graphs"], r["hits"], r["misses"]) for run, r in cc["runs"].items()}
    assert counts == {"class cold": (1, 0, 1), "exact cold": (1, 0, 1),  # (graphs, inductor cache hits, misses)
                      "class other": (1, 1, 0), "exact other": (1, 0, 1)}
    assert cc["eager"]["graphs"] == 0
    assert all(0 < r["to_step_s"] < r["to_token_s"] < r["process_s"] for r in [*cc["runs"].values(), cc["eager"]])
    assert "| warm, another prompt and length | 6, 8 | 14 (64) |" in bench.table(res)


def test_prep_defaults_to_tiny_shakespeare(tmp_path, monkeypatch):
    """No --corpus: tiny Shakespeare, from $BCGPT_CORPUS_CACHE when it is there (as prepare_data.py fetches it)."""
    monkeypatch.setenv("BCGPT_CORPUS_CACHE", str(tmp_path))
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 300
    (tmp_path / "tinyshakespeare.txt").write_text(text)
    res = bench.run(bench.BenchConfig(device="cpu", sections="prep", repeats=1, prep_copies=2, workers=2))
    assert res["prep"]["mb"] == 2 * os.path.getsize(tmp_path / "tinyshakespeare.txt") / 1e6


@pytest.mark.parametrize("args, message", [
    (["--sections=bogus"], "error: unknown section(s) bogus: choose from train,sample,load,prep,compile_cache\n"),
    (["--sections=train,prep,nope", "--device=cpu"], "error: unknown section(s) nope: choose from "
                                                     "train,sample,load,prep,compile_cache\n"),
    (["--sections=compile_cache", "--cache_other=8,3"], "error: --cache_other must be prompt tokens >= 1 and new "
                                                         "tokens >= --new_tokens (64), as 24,100, got '8,3'\n"),
    (["--sections=prep", "--device=cpu", "--cache_repeats=2"], "error: --cache_repeats is a setting of the "
                                                                "compile_cache section, which --sections=prep does not "
                                                                "run: add compile_cache there, or drop the flag\n"),
    (["--sections=prep", "--threads=1,0"], "error: --threads must be positive integers, got '1,0'\n"),
    (["--sections=prep", "--device=cpu", "--steps=3"],
     "error: --steps is a setting of the train section, which --sections=prep does not run: add train there, "
     "or drop the flag\n"),
    (["--sections=train,prep", "--device=cpu", "--no-int8"],
     "error: --int8 is a setting of the sample and load sections, which --sections=train,prep does not run: "
     "add sample there, or drop the flag\n"),
    (["--sections=load", "--device=cpu", "--repeats=2"],
     "error: --repeats is a setting of the train, sample and prep sections, which --sections=load does not run: "
     "add train there, or drop the flag\n"),
    (["--sections=prep", "--device=cpu", "--threads=1,2"],
     "error: --threads=1,2: only the sample section is timed at each count (the others use the first): "
     "add sample to --sections, or give one count\n"),
])
def test_bad_input_is_one_error_line(args, message):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "tools.bench", *args], capture_output=True, text=True, timeout=300,
                       cwd=root)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", message)


def test_unusable_device_is_refused():
    no_gpu = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ValueError, match=f"device '{no_gpu}' asked for, but"):
        bench.run(bench.BenchConfig(device=no_gpu, sections="prep"))


def test_each_section_reads_the_settings_it_claims():
    """READ_BY (what check_sections refuses for sections not run) is what each bench_* function reads, by its source."""
    import ast, inspect

    for section, names in bench.READ_BY.items():
        tree = ast.parse(inspect.getsource(getattr(bench, f"bench_{section}")))
        read = {n.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "cfg"}

        assert read == set(names), section
