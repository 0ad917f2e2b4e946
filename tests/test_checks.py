"""Tests of bincode_gpt/checks.py: the checks before the first step, taking plain values (settings by name, the
checkpoint's shape, a pad row on a token, the data a resume reads on in), the warning for windows that start on
a constant input; and during the run, a diverged state stops the run unsaved and names the setting most likely
at fault (why_diverged, likely_fault, Divergence). The signal path is in test_resume.py and test_train_ddp.py."""

import json
import math
import re
import subprocess
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import prepare_data
import train
from bincode_gpt import checks, shards
from bincode_gpt.checks import Divergence, likely_fault, why_diverged
from bincode_gpt.exits import run_main
from bincode_gpt.shards import write_shard
from bincode_gpt.tokenizer import get_tokenizer
# the run's helpers, and its autouse fixture one_thread (one thread a process)
from test_train import cli, config, data_dir, flags, one_thread, ROOT, train_log, weights


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
    checks.check_settings(settings())  # the defaults can
    with pytest.raises(ValueError, match=re.escape(message)):
        checks.check_settings(settings(**changes))


def test_an_override_must_agree_with_the_checkpoints_shape_but_for_dropout():
    theirs = {"n_layer": 2, "n_embd": 32, "dropout": 0.0}
    checks.check_same_shape(theirs, {"n_layer": 2, "dropout": 0.1}, "c.pt")
    with pytest.raises(ValueError, match=re.escape("c.pt: the checkpoint has another shape than this run asks for: "
                                                   "n_embd=32 (asked 64), input=None (asked 'affine')")):
        checks.check_same_shape(theirs, {"n_embd": 64, "input": "affine"}, "c.pt")


def test_a_pad_row_on_a_token_is_dropped_from_a_preset_and_refused_when_asked_for():
    meta = {"encoding": "gpt2", "vocab_size": 512}
    notes = []
    assert checks.pad_off_the_tokens({"n_layer": 2}, "tiny", meta, notes.append) == {"n_layer": 2}
    assert checks.pad_off_the_tokens({}, "paper", {**meta, "vocab_size": 65536}, notes.append) == {
        "pad_token_id": None}  # 57344, the released tokenizer's <pad>, is a token here: dropped
    assert notes == ["note: preset paper's pad_token_id 57344 (the released tokenizer's <pad>) is a token of this "
                     "data's tokenizer: every id keeps its own code (pad_token_id none)"]
    assert checks.pad_off_the_tokens({}, "paper", meta, notes.append) == {}  # past the data's ids: kept
    with pytest.raises(ValueError, match=r"^--pad_token_id 5 is a token of the data's tokenizer \(gpt2, 512 ids\)"):
        checks.pad_off_the_tokens({"pad_token_id": 5}, "tiny", meta, notes.append)


def test_a_resume_from_a_folder_with_best_pt_alone_says_to_init_from_it(tiny_data, tmp_path):
    (tmp_path / "best.pt").write_bytes(b"weights")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'ckpt.pt'}: no checkpoint there to resume; "
                                                          f"{tmp_path / 'best.pt'} holds weights only")):
        checks.read_start(tiny_data, out_dir=str(tmp_path), resume=True, init_from=None)
    start = checks.read_start(tiny_data, out_dir=str(tmp_path), resume=False, init_from=None)
    assert (start.source, start.ckpt, start.stamp) == (None, None, None)
    assert start.meta["vocab_size"] == 512 and start.tokenizer["kind"] == "tiktoken"
    assert start.fingerprint == shards.data_fingerprint(tiny_data)


def test_the_data_fingerprint_is_the_content_not_the_path(data_dir, tmp_path, capsys):
    moved = Path(shutil.copytree(data_dir, tmp_path / "moved"))
    meta = json.loads((moved / "meta.json").read_text())
    (moved / "meta.json").write_text(json.dumps({**meta, "inputs": ["/elsewhere/corpus.txt"]}))
    fingerprint = shards.data_fingerprint(str(data_dir))
    assert re.fullmatch("[0-9a-f]{16}", fingerprint) and shards.data_fingerprint(str(moved)) == fingerprint
    assert shards.data_fingerprint(str(moved), legacy=True) != fingerprint  # the paths were hashed too
    with open(moved / "val_000000.bin", "ab") as f:
        f.write(b"\0\0")
    assert shards.data_fingerprint(str(moved)) != fingerprint
    ckpt = {"data": {"fingerprint": fingerprint}}
    checks.check_same_data(ckpt, "c.pt", str(data_dir), fingerprint, rank=0)
    with pytest.raises(ValueError, match=f"c.pt was reading other data than {re.escape(str(moved))} now holds"):
        checks.check_same_data(ckpt, "c.pt", str(moved), shards.data_fingerprint(str(moved)), rank=0)
    checks.check_same_data({"data": {}}, "c.pt", str(moved), "x", rank=1)
    assert capsys.readouterr().err == ""  # said once, by rank 0
    checks.check_same_data({"data": {}}, "c.pt", str(moved), "x", rank=0)
    assert "c.pt predates data fingerprints" in capsys.readouterr().err


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    good = tmp_path / "good"  # the state after step 4 of the same run, for comparison
    train.train(config(data_dir, good, max_steps=4, lr_decay_steps=10, save_interval=4))
    forward, calls = train.GPT.forward, []

    def poisoned(self, idx, targets=None, cache=None):
        logits, loss = forward(self, idx, targets, cache)
        if self.training:
            calls.append(1)
            if len(calls) > 5:  # the 6th training forward: step 6
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(train.GPT, "forward", poisoned)
    bad = tmp_path / "bad"
    args = [f"--data_dir={data_dir}", f"--out_dir={bad}", "--preset=tiny", "--block_size=32", "--batch_size=8",
            "--max_steps=10", "--lr=3e-3", "--min_lr=3e-4", "--warmup_steps=3", "--eval_interval=5",
            "--eval_steps=2", "--save_interval=4", "--device=cpu", "--seed=7", "--lr_decay_steps=10"]
    assert run_main(train.main, args) == 1
    err = capsys.readouterr().err
    assert "non-finite loss (nan) at step 6" in err and str(bad / "ckpt.pt") in err and "(step 4)" in err
    assert torch.load(bad / "ckpt.pt", weights_only=True)["step"] == 4
    # ckpt.pt holds the state after step 4 exactly: equal to a clean 4-step run with the same schedule
    wg, wb = weights(good), weights(bad)
    assert all(torch.equal(wg[k], wb[k]) for k in wg)
    assert train_log(bad, "diverged")[0]["step"] == 6


def test_a_diverged_state_is_never_saved(data_dir, tmp_path, capsys):
    # --lr=1e6 --save_interval=1 from scratch: step 1's weights are finite but huge; nothing is written
    fresh = tmp_path / "fresh"
    assert run_main(train.main, flags(data_dir, fresh, lr=1e6, save_interval=1, eval_interval=0)) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: validation diverged: loss \S+ above 2 ln V = 12\.48 at step 1: stopped without saving; "
                        r"the last good checkpoint is untouched: none was written\. Most likely at fault: --lr 1e\+06, "
                        r"during the warmup \(below its peak\): try a lower --lr, or --grad_clip\.\n", err), err
    assert not (fresh / "ckpt.pt").exists() and train_log(fresh, "diverged")[0]["step"] == 1
    # the same on a resumed run: its last checkpoint survives byte for byte and still resumes
    run = tmp_path / "run"
    train.train(config(data_dir, run, max_steps=4, lr_decay_steps=10))
    good = (run / "ckpt.pt").read_bytes()
    # lr 1e10, far past where the first resumed update ruins the weights (1e6 is borderline: on some data
    # step 5 still passes its one-batch validation check and step 6 fails)
    assert run_main(train.main, flags(data_dir, run, max_steps=10, resume=True, lr=1e10, save_interval=1)) == 1
    assert f"at step 5: stopped without saving; the last good checkpoint is untouched: {run / 'ckpt.pt'} (step 4)" in capsys.readouterr().err
    assert (run / "ckpt.pt").read_bytes() == good
    s = train.train(config(data_dir, run, max_steps=6, lr_decay_steps=10, resume=True))
    assert s["steps"] == 6 and s["final_val_loss"] < 6.3


def test_a_divergence_names_the_setting_most_likely_at_fault(data_dir, tmp_path):
    """--weight_decay 1e30 (AdamW's decoupled decay then multiplies each matrix by 1 - lr x wd, about -3e27) once
    suggested a lower --lr: the message names the weight decay, from the run's own settings, and no lr change."""
    rc, out, err = cli(*flags(data_dir, tmp_path, weight_decay=1e30, eval_interval=0))
    assert (rc, err.count("\n")) == (1, 1) and err.startswith("error: ") and "at step 2: stopped without saving" in err
    assert err.endswith("Most likely at fault: --weight_decay 1e+30: AdamW's decoupled decay scales each weight "
                        "matrix by 1 - lr x weight_decay = -3e+27 a step, which zeroes or flips it: use a weight decay "
                        "far below 1 / lr = 333.3 (0.1 is usual).\n"), err
    assert "--lr" not in err and not (tmp_path / "ckpt.pt").exists()


@pytest.mark.parametrize("settings, step, fault", [
    (dict(lr=1e-3, weight_decay=1e30, warmup_steps=3), 2, "--weight_decay 1e+30: "),
    (dict(lr=1.0, weight_decay=10, warmup_steps=3), 2, "--weight_decay 10: "),  # both extreme: the decay's is worse
    (dict(lr=1e6, weight_decay=0.1, warmup_steps=3), 1, "--lr 1e+06, during the warmup (below its peak): "),
    (dict(lr=1e6, weight_decay=0.1, warmup_steps=3), 5, "--lr 1e+06: try"),  # past the warmup, but no moderate lr
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=0), 1, "--warmup_steps 0: the run diverged 1 step(s) after its "
                                                         "warmup reached --lr 0.006: a longer warmup (e.g. "
                                                         "--warmup_steps 100)"),
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=50), 80, "--warmup_steps 50: the run diverged 30 step(s) after"),
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=50), 101, "--lr 0.006: try a lower --lr, or --grad_clip"),
    (dict(lr=6e-3, weight_decay=0.1, warmup_steps=50), 20, "--lr 0.006, during the warmup (below its peak): "),
])
def test_the_likely_fault_follows_the_runs_settings(settings, step, fault):
    assert likely_fault(step, **settings).startswith(fault)


def test_why_a_state_diverged():
    """Three causes, in this order, and None for a good state: a loss that is not finite, a gradient norm that
    is not finite, a loss above 2 ln V (an untrained model's is about ln V)."""
    V = 512
    assert why_diverged(float("nan"), float("inf"), V) == "non-finite loss (nan)"
    assert why_diverged(3.0, float("inf"), V) == "non-finite gradient norm (inf)"
    assert why_diverged(13.0, 1.0, V) == "diverged: loss 13 above 2 ln V = 12.48"
    assert why_diverged(12.0, 1e9, V) is None and why_diverged(12.0, None, V) is None


def divergence(records):
    """A Divergence of a 512-token model whose log keeps its records in `records`."""
    return Divergence(vocab_size=512, lr=1e-3, weight_decay=0.1, warmup_steps=3, ckpt_path="out/ckpt.pt",
                      log=SimpleNamespace(record=lambda **entry: records.append(entry)))


def test_a_diverged_step_is_recorded_and_names_the_last_checkpoint_and_the_fault():
    records = []
    divergence(records).check_step(2.0, 1.0, step=5, saved_step=4)  # a good step: nothing
    assert records == []
    with pytest.raises(FloatingPointError) as info:
        divergence(records).check_step(float("inf"), 1.0, step=5, saved_step=4)
    assert str(info.value) == ("non-finite loss (inf) at step 5: stopped without saving; the last good checkpoint is "
                               "untouched: out/ckpt.pt (step 4). Most likely at fault: --warmup_steps 3: the run "
                               "diverged 2 step(s) after its warmup reached --lr 0.001: a longer warmup (e.g. "
                               "--warmup_steps 100) ramps up to it more gently, or try a lower --lr.")
    assert records == [{"event": "diverged", "step": 5, "problem": "non-finite loss (inf)", "loss": float("inf"),
                        "grad_norm": 1.0}]
    with pytest.raises(FloatingPointError, match="^validation diverged: loss 20 above 2 ln V = 12.48 at step 2: .*"
                                                 "none was written"):
        divergence(records).check_val_loss(20.0, step=2, saved_step=None)
    assert records[-1] == {"event": "diverged", "step": 2, "problem": "validation diverged: loss 20 above 2 ln V = "
                                                                      "12.48", "val_loss": 20.0}


def test_a_state_is_saved_only_with_finite_weights_and_a_good_loss():
    records, asked = [], []
    model = torch.nn.Linear(2, 2)

    def one_batch():  # a loss computed only when asked for
        asked.append(1)
        return 3.0

    divergence(records).check_state(model, 2.0, one_batch, step=4, saved_step=None)  # this step's evaluation
    divergence(records).check_state(model, None, one_batch, step=4, saved_step=None)  # none: one batch's
    assert asked == [1] and records == []
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="^validation non-finite weights at step 4"):
        divergence(records).check_state(model, None, one_batch, step=4, saved_step=None)
    assert asked == [1] and records[-1]["problem"] == "validation non-finite weights"
