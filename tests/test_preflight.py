"""Tests of bincode_gpt/preflight.py: the checks before the first step, taking plain values (settings by name,
the checkpoint's shape, a pad row on a token), and the warning for windows that start on a constant input."""

import json
import math
import re
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest

import prepare_data
import train
from bincode_gpt import preflight, run_dir, shards
from bincode_gpt.exits import run_main
from bincode_gpt.shards import write_shard
from bincode_gpt.tokenizer import get_tokenizer
# the run's helpers, and its autouse fixture one_thread (one thread a process)
from test_train import config, flags, one_thread, ROOT, train_log


@pytest.mark.parametrize("reserve_zero", [False, True])
def test_deep_binary_model_on_windows_that_start_with_the_formerly_zero_coded_token(tmp_path, reserve_zero):
    """GPT-2's id 0 is "!": its code is all zeros, a window that starts with it keeps a zero residual
    stream in a bias-free model, and a deep binary model diverges on it (docs/zero-code.md). With id 0
    reserved for the NUL byte (prepare_data.py's default), "!" has a nonzero code and the same training
    stays finite. Every window here starts with "!"; 32 layers x 32, lr 2e-3, train.py's own loop."""
    enc = get_tokenizer("gpt2", 512, reserve_zero)
    bang, = enc.encode_ordinary("!")
    assert bang == (188 if reserve_zero else 0)
    T, n = 32, 64
    body = enc.encode_ordinary(("the quick brown fox, jumps over the lazy dog. " * 400).replace("!", "."))
    ids = np.array([t for k in range(n) for t in [bang, *body[k * (T - 1):(k + 1) * (T - 1)]]] + [bang])
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        write_shard(data / f"{split}_000000.bin", ids)
    (data / "meta.json").write_text(json.dumps({
        "version": 1, "encoding": "gpt2", "vocab_size": 512, "eot_token": 511, "reserve_zero": reserve_zero,
        "dtype": "uint16", "splits": {s: {"shards": [f"{s}_000000.bin"], "tokens": len(ids)} for s in ("train", "val")}}))
    cfg = config(data, tmp_path / "out", n_layer=32, n_embd=32, n_head=2, block_size=T, batch_size=8, max_steps=20,
                 lr=2e-3, min_lr=2e-4, warmup_steps=2, eval_interval=0, save_interval=0, seed=0, bias=False, input="binary")
    if reserve_zero:
        assert train.train(cfg)["steps"] == 20
        assert all(math.isfinite(e["grad_norm"]) for e in train_log(tmp_path / "out"))
    else:
        with pytest.raises(FloatingPointError, match="non-finite gradient norm"):
            train.train(cfg)


def test_windows_that_start_with_a_constant_input_are_counted_before_the_first_step(tmp_path, capsys):
    """Data prepared before end-of-text left the all-ones code (--no-reserve_ones, many short documents):
    before the first step train.py says how many training windows start with a token a bias-free binary
    model reads as a constant vector, and the command that prepares the data again; that command, run as
    printed, gives data with no such window. A learned input or a model with biases: nothing to say."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"Letter {i}. " + "My dear sister, the ball was long. " * (i % 4)}) + "\n"
                            for i in range(400)))
    data, out = tmp_path / "data", tmp_path / "out"
    assert run_main(prepare_data.main, [str(docs), "--out", str(data), "--vocab_size", "512", "--workers", "1",
                                        "--no-reserve_ones"]) == 0
    tokens = shards.read_shard(data / "train_000000.bin")
    n = (len(tokens) - 1) // 32
    count = int((tokens[: n * 32 : 32] == 511).sum())  # windows of 33 tokens at stride 32 (tiny: block_size 32)
    assert count > 10
    capsys.readouterr()
    assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0)) == 0
    command = f"python prepare_data.py {docs} --out {data} --encoding gpt2 --vocab_size 512 --overwrite"
    assert capsys.readouterr().err == (
        f"warning: {count:,} of {n:,} training windows start with token id 511 (end-of-text), which this model (no "
        "biases, binary input) reads as a constant vector: a deep model diverges on them (docs/zero-code.md); prepare "
        f"the data with the ids that keep text off them: {command}\n")
    for quiet in (dict(input="learned"), dict(bias=True)):
        assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0, overwrite=True, **quiet)) == 0
        assert capsys.readouterr().err == ""
    assert run_main(prepare_data.main, [*command.split()[2:], "--workers", "1"]) == 0
    assert shards.load_meta(data)["eot_token"] == 187
    capsys.readouterr()
    assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0, overwrite=True, input="affine")) == 0
    assert capsys.readouterr().err == ""


def test_the_re_prepare_command_names_the_recorded_source_or_says_it_is_unknown(tmp_path, capsys, monkeypatch):
    """Data prepared from a relative path in another folder (by the real command line there): the command train.py
    prints names the file as meta.json records it, a path from any folder; data whose meta.json records no inputs
    (prepared before it did, from a relative path) gets a command that says its inputs are unknown."""
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"Letter {i}. " + "My dear sister. " * (i % 3)})
                                                 + "\n" for i in range(300)))
    made = subprocess.run([sys.executable, str(ROOT / "prepare_data.py"), "docs.jsonl", "--out", "data", "--vocab_size",
                           "512", "--workers", "1", "--no-reserve_ones"], cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    data, meta_path = tmp_path / "data", tmp_path / "data" / "meta.json"
    assert json.loads(meta_path.read_text())["inputs"] == [str(tmp_path / "docs.jsonl")]
    monkeypatch.chdir(ROOT)
    fix = "prepare the data with the ids that keep text off them: python prepare_data.py"
    for inputs in (str(tmp_path / "docs.jsonl"), "'<INPUTS: unknown, its meta.json does not record them>'"):
        capsys.readouterr()
        assert run_main(train.main, flags(data, tmp_path / "out", max_steps=1, eval_interval=0, overwrite=True)) == 0
        assert f"{fix} {inputs} --out {data} --encoding gpt2 --vocab_size 512 --overwrite\n" in capsys.readouterr().err
        old = {k: v for k, v in json.loads(meta_path.read_text()).items() if k != "inputs"}
        meta_path.write_text(json.dumps({**old, "sources": ["docs.jsonl"]}))


def settings(**changes):
    """train.TrainConfig's defaults by name, min_lr filled in as train.py fills it, and `changes`."""
    values = {**asdict(train.TrainConfig()), "min_lr": 3e-4}
    return {**values, **changes}


@pytest.mark.parametrize("changes, message", [
    (dict(batch_size=0), "batch_size must be at least 1, got 0"),
    (dict(save_interval=-1), "save_interval must be 0 or more, got -1"),
    (dict(weight_decay=math.nan), "weight_decay must be a finite number >= 0, got nan"),
    (dict(beta1=1.0), "beta1 must be in [0, 1), got 1.0"),
    (dict(lr_decay_steps=0), "lr_decay_steps must be at least 1 (or none: max_steps), got 0"),
    (dict(peak_flops=0.0), "peak_flops must be a finite number > 0 (or none), got 0.0"),
    (dict(resume=True, overwrite=True), "--resume continues the checkpoint in out_dir and --overwrite replaces it"),
    (dict(out_dir=""), "--out_dir is '' (empty): name a folder"),
])
def test_settings_by_name_that_cannot_work_are_refused(changes, message):
    preflight.check_settings(settings())  # the defaults can
    with pytest.raises(ValueError, match=re.escape(message)):
        preflight.check_settings(settings(**changes))


def test_an_override_must_agree_with_the_checkpoints_shape_but_for_dropout():
    theirs = {"n_layer": 2, "n_embd": 32, "dropout": 0.0}
    preflight.check_same_shape(theirs, {"n_layer": 2, "dropout": 0.1}, "c.pt")
    with pytest.raises(ValueError, match=re.escape("c.pt: the checkpoint has another shape than this run asks for: "
                                                   "n_embd=32 (asked 64), input=None (asked 'affine')")):
        preflight.check_same_shape(theirs, {"n_embd": 64, "input": "affine"}, "c.pt")


def test_a_pad_row_on_a_token_is_dropped_from_a_preset_and_refused_when_asked_for():
    meta = {"encoding": "gpt2", "vocab_size": 512}
    notes = []
    assert preflight.pad_off_the_tokens({"n_layer": 2}, "tiny", meta, notes.append) == {"n_layer": 2}
    assert preflight.pad_off_the_tokens({}, "paper", {**meta, "vocab_size": 65536}, notes.append) == {
        "pad_token_id": None}  # 57344, the released tokenizer's <pad>, is a token here: dropped
    assert notes == ["note: preset paper's pad_token_id 57344 (the released tokenizer's <pad>) is a token of this "
                     "data's tokenizer: every id keeps its own code (pad_token_id none)"]
    assert preflight.pad_off_the_tokens({}, "paper", meta, notes.append) == {}  # past the data's ids: kept
    with pytest.raises(ValueError, match=r"^--pad_token_id 5 is a token of the data's tokenizer \(gpt2, 512 ids\)"):
        preflight.pad_off_the_tokens({"pad_token_id": 5}, "tiny", meta, notes.append)


def test_a_resume_from_a_folder_with_best_pt_alone_says_to_init_from_it(tiny_data, tmp_path):
    (tmp_path / "best.pt").write_bytes(b"weights")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'ckpt.pt'}: no checkpoint there to resume; "
                                                          f"{tmp_path / 'best.pt'} holds weights only")):
        preflight.read_start(tiny_data, out_dir=str(tmp_path), resume=True, init_from=None)
    start = preflight.read_start(tiny_data, out_dir=str(tmp_path), resume=False, init_from=None)
    assert (start.source, start.ckpt, start.stamp) == (None, None, None)
    assert start.meta["vocab_size"] == 512 and start.tokenizer["kind"] == "tiktoken"
    assert start.fingerprint == run_dir.data_fingerprint(tiny_data)
