"""Every input in every dtype through every command (issue 35: an affine model in bfloat16 once failed on a float32 x
bfloat16 matmul in its recoding): train.py (float32, bfloat16 autocast on the CPU; float16 refused by name), sample.py
(float32, bfloat16, float16 weights), tools/convert.py native2hf --dtype and back, and bench's sampling section with
its bfloat16 and float16 copies and int8 weights, for the binary, affine and learned inputs. Tiny model, 2 steps."""

import json
import math

import pytest
import torch

import sample
import train
from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.exits import run_main
from test_sample import expected_text
from bincode_gpt.tokenizer import load_text_codec
from tools import bench, convert

INPUTS = ("binary", "affine", "learned")
DTYPES = ("float32", "bfloat16", "float16")


def train_flags(data, out, input, dtype):
    return [f"--data_dir={data}", f"--out_dir={out}", "--preset=tiny", f"--input={input}", f"--dtype={dtype}",
            "--block_size=32", "--batch_size=4", "--max_steps=2", "--warmup_steps=1", "--eval_interval=2",
            "--eval_steps=1", "--device=cpu", "--seed=5"]


def losses(out):
    return [e["loss"] for e in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if e["event"] == "train"]


@pytest.fixture(scope="module", params=INPUTS)
def trained(request, tiny_data, tmp_path_factory):
    """-> (input, {dtype: out_dir}) of two steps of train.py in float32 and in bfloat16 (autocast on the CPU)."""
    tmp = tmp_path_factory.mktemp(f"dtypes-{request.param}")
    outs = {dtype: tmp / dtype for dtype in ("float32", "bfloat16")}
    for dtype, out in outs.items():
        assert run_main(train.main, train_flags(tiny_data, out, request.param, dtype)) == 0
    return request.param, outs


def test_train_runs_each_input_in_bfloat16_and_refuses_float16(trained, tiny_data, tmp_path, capsys):
    input, outs = trained
    full, half = losses(outs["float32"]), losses(outs["bfloat16"])
    assert len(full) == len(half) == 2 and all(map(math.isfinite, full + half))
    assert full != half and max(abs(a - b) for a, b in zip(full, half)) < 0.05  # bfloat16 for real, and close
    assert {t.dtype for t in torch.load(outs["bfloat16"] / "ckpt.pt", weights_only=True)["model"].values()
            if t.is_floating_point()} == {torch.float32}  # autocast: the weights stay float32
    capsys.readouterr()
    assert run_main(train.main, train_flags(tiny_data, tmp_path, input, "float16")) == 1
    assert capsys.readouterr().err == "error: dtype must be auto, float32 or bfloat16, got 'float16'\n"


@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_runs_each_input_in_each_dtype(trained, dtype, capsys):
    _, outs = trained
    ckpt = str(outs["bfloat16"])
    assert run_main(sample.main, ["--ckpt", ckpt, "--dtype", dtype, "--prompt", "ROMEO:", "--temperature", "0",
                                  "--max_new_tokens", "8", "--device", "cpu"]) == 0
    model, saved = load_checkpoint(ckpt)
    codec = load_text_codec(saved, ckpt)
    low = model.to(getattr(torch, dtype)).eval()
    ids = codec.encode("ROMEO:")
    assert capsys.readouterr() == ("ROMEO:" + expected_text(low, ids, 8, codec.decode, codec.eos_token_id) + "\n", "")
    x = torch.tensor([ids])
    with torch.no_grad():
        diff = (low(x)[0].float() - load_checkpoint(ckpt)[0](x)[0]).abs().max().item()
    assert (diff == 0) == (dtype == "float32") and diff < 0.05  # the dtype is used, and close to float32's


@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_exports_each_input_in_each_dtype_and_back(trained, dtype, tmp_path, capsys):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    _, outs = trained
    assert run_main(convert.main, ["native2hf", str(outs["bfloat16"]), str(tmp_path / "hf"), "--dtype", dtype]) == 0
    assert run_main(convert.main, ["hf2native", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    capsys.readouterr()
    model, back = load_checkpoint(str(outs["bfloat16"]))[0], load_checkpoint(str(tmp_path / "back"))[0]
    assert back.config == model.config
    want = {n: t.to(getattr(torch, dtype)).float() if n.startswith(("blocks.", "ln_f.", "lm_head.")) or
            model.config.input == "learned" else t for n, t in model.state_dict().items()}
    assert all(torch.equal(back.state_dict()[n], t) for n, t in want.items())  # rounded to dtype; codes, A, b exact


@pytest.mark.parametrize("input", INPUTS)
def test_bench_samples_each_input_in_each_dtype(input, capsys):
    pytest.importorskip("transformers")  # the sampling section times HF generate() beside ours
    assert bench.main(["--device=cpu", "--sections=sample", "--sample_preset=tiny", f"--sample_input={input}",
                       "--prompt_len=4", "--new_tokens=4", "--sample_batches=1", "--no-recompute",
                       "--no-sample_compile", "--bandwidth_mb=8", "--repeats=1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["sample"]
    [row] = res["rows"]
    assert res["input"] == input and row["same_tokens_hf"] is True
    assert row["agree"] == {"bfloat16": 4, "float16": 4} and 0 <= row["int8_agree"] <= 4 and row["int8"] > 0
