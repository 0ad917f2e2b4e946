"""Tests of train.py's --resume and --init_from: bit-exact continuation, a signal's save, best.pt, and the
checkpoints and data a resume refuses (another shape, tokenizer or data; a failed save keeps the previous one)."""

import errno
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

import pytest
import torch

import prepare_data
import train
from bincode_gpt import shards
from bincode_gpt.exits import run_main
from prepare_data import prepare
# the run's helpers, and its autouse fixture one_thread (one thread a process)
from test_train import (cli, config, copy_data, expect_error, files, flags, one_thread,  # noqa: F401 (one_thread)
                        ROOT, train_log, weights)


def test_resume_is_bit_exact_with_dropout(data_dir, tmp_path):
    K, N = 12, 5
    full, part = tmp_path / "full", tmp_path / "part"
    train.train(config(data_dir, full, max_steps=K, dropout=0.1, grad_accum=2))
    # stop at N (the LR schedule still ends at K), then resume to K
    train.train(config(data_dir, part, max_steps=N, lr_decay_steps=K, dropout=0.1, grad_accum=2))
    train.train(config(data_dir, part, max_steps=K, dropout=0.1, grad_accum=2, resume=True))
    a, b = train_log(full), train_log(part)
    assert [e["step"] for e in b] == list(range(1, K + 1))
    assert [e["loss"] for e in a] == [e["loss"] for e in b]  # exact, every step (those after N included)
    wa, wb = weights(full), weights(part)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # dropout really was on: the same run without it logs other losses
    train.train(config(data_dir, tmp_path / "nodrop", max_steps=2, grad_accum=2))
    assert train_log(tmp_path / "nodrop")[1]["loss"] != a[1]["loss"]


def test_sigint_finishes_the_step_saves_and_resumes(data_dir, tmp_path):
    args = [f"--data_dir={data_dir}", f"--out_dir={tmp_path}", "--preset=tiny", "--device=cpu", "--batch_size=8",
            "--max_steps=100000", "--eval_interval=0", "--save_interval=0", "--log_interval=1", "--warmup_steps=3"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=os.environ)
    for line in proc.stdout:  # wait for a few steps
        if line.startswith("step 3/"):
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "SIGINT" in err
    steps = [e["step"] for e in train_log(tmp_path)]
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == steps[-1] >= 3 and steps == list(range(1, steps[-1] + 1))
    assert train_log(tmp_path, "end")[0]["interrupted"] is True


def test_best_pt_holds_the_weights_only_and_a_resume_reads_ckpt_pt(data_dir, tmp_path):
    """best.pt: the weights of the best evaluation and that evaluation, no optimizer, data position or RNG state
    (under half of ckpt.pt's bytes even at this size), for --init_from; a --resume finds no training state in it
    and says where to go instead."""
    run = tmp_path / "run"
    s = train.train(config(data_dir, run, max_steps=4, eval_interval=2, save_interval=0))
    best, ckpt = (torch.load(run / name, weights_only=True) for name in ("best.pt", "ckpt.pt"))
    assert sorted(best) == ["model", "model_config", "saved_as", "step", "tokenizer", "train_config", "val_loss"]
    evals = train_log(run, "eval")
    assert best["saved_as"] == "best.pt" and best["val_loss"] == s["best_val_loss"] == min(e["val_loss"] for e in evals)
    assert best["step"] == next(e["step"] for e in evals if e["val_loss"] == s["best_val_loss"]) > 0
    assert (run / "best.pt").stat().st_size < 0.5 * (run / "ckpt.pt").stat().st_size
    assert best["tokenizer"] == ckpt["tokenizer"] and best["model_config"] == ckpt["model_config"]
    tuned = train.train(config(data_dir, tmp_path / "tuned", max_steps=1, eval_interval=100,
                               init_from=str(run / "best.pt")))
    assert tuned["first_val_loss"] == best["val_loss"]  # the same fixed validation windows, the same weights
    (run / "ckpt.pt").rename(tmp_path / "ckpt.pt")
    with pytest.raises(FileNotFoundError) as e:
        train.train(config(data_dir, run, max_steps=6, resume=True))
    assert str(e.value) == (f"{run / 'ckpt.pt'}: no checkpoint there to resume; {run / 'best.pt'} holds weights only "
                            "(no optimizer, data position or RNG state): start a run from them with --init_from "
                            f"{run / 'best.pt'}")
    shutil.copy(run / "best.pt", run / "ckpt.pt")  # best.pt where --resume reads
    with pytest.raises(ValueError) as e:
        train.train(config(data_dir, run, max_steps=6, resume=True))
    assert str(e.value) == (f"{run / 'ckpt.pt'} is a best.pt (step {best['step']}'s weights, no optimizer, data "
                            "position or RNG state): --resume continues out_dir/ckpt.pt; start a run from these "
                            f"weights with --init_from {run / 'ckpt.pt'}")
    assert [e["event"] for e in map(json.loads, (run / "log.jsonl").read_text().splitlines())][-1] == "end"


def test_checkpoints_of_another_shape_name_the_file(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train.train(config(data_dir, out, max_steps=2))
    ckpt_path = out / "ckpt.pt"
    msg = expect_error(config(data_dir, out, max_steps=4, n_embd=64, resume=True), str(ckpt_path))
    assert "n_embd=32 (asked 64)" in msg
    # weights that do not fit the checkpoint's own model_config
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["model_config"]["n_layer"] = 3
    torch.save(ckpt, tmp_path / "other.pt")
    expect_error(config(data_dir, tmp_path / "ft", init_from=str(tmp_path / "other.pt")), str(tmp_path / "other.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    expect_error(config(data_dir, tmp_path / "ft", init_from=str(tmp_path / "junk.pt")), str(tmp_path / "junk.pt"))
    expect_error(config(data_dir, tmp_path / "fresh", resume=True), str(tmp_path / "fresh" / "ckpt.pt"))
    (tmp_path / "weights_only").mkdir()  # e.g. what convert.py writes: weights, no training state
    torch.save({k: ckpt[k] for k in ("model", "tokenizer")} | {"model_config": torch.load(ckpt_path)["model_config"]},
               tmp_path / "weights_only" / "ckpt.pt")
    assert "--init_from" in expect_error(config(data_dir, tmp_path / "weights_only", resume=True), "no training state")
    assert os.listdir(tmp_path / "weights_only") == ["ckpt.pt"]  # refused before the claim: no lock file written
    # through the command line: a clear one-line error, exit status 1
    argv = [f"--data_dir={data_dir}", f"--out_dir={out}", "--resume", "--n_layer=5", "--device=cpu"]
    assert run_main(train.main, argv) == 1
    assert f"error: {ckpt_path}" in capsys.readouterr().err


def test_resume_on_data_of_another_tokenizer_says_so(data_dir, tmp_path, capsys):
    train.train(config(data_dir, tmp_path / "run", max_steps=2))
    d = copy_data(data_dir, tmp_path)
    meta = {**json.loads((d / "meta.json").read_text()), "encoding": "r50k_base"}
    (d / "meta.json").write_text(json.dumps(meta))
    for shard in d.glob("*.bin"):  # the headers too: the folder's parts agree, as r50k_base's data would
        raw = shard.read_bytes()
        shard.write_bytes(raw[:28] + struct.pack("<I", shards.tokenizer_tag(meta)) + raw[32:])
    ckpt = tmp_path / "run" / "ckpt.pt"
    before = ckpt.read_bytes()
    assert run_main(train.main, flags(d, tmp_path / "run", max_steps=4, resume=True)) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {ckpt}: trained on gpt2 tokens at vocab_size 512, ids 0 and 511 reserved, but "
                   f"{d / 'meta.json'} says r50k_base at vocab_size 512, ids 0 and 511 reserved: prepare the data "
                   "with --encoding gpt2 --vocab_size 512\n")
    assert ckpt.read_bytes() == before
    expect_error(config(d, tmp_path / "ft", init_from=str(ckpt)), "says r50k_base at vocab_size 512")


def test_resume_on_other_data_is_refused(data_dir, tmp_path):
    d = copy_data(data_dir, tmp_path)
    run = tmp_path / "run"
    train.train(config(d, run, max_steps=2))
    before = files(run)
    (tmp_path / "other.txt").write_text("another corpus entirely, prepared into the same folder\n" * 400)
    assert run_main(prepare_data.main, [str(tmp_path / "other.txt"), "--out", str(d), "--overwrite",
                                        "--vocab_size", "512", "--workers", "1"]) == 0
    saved = torch.load(run / "ckpt.pt", weights_only=True)["data"]["fingerprint"]
    rc, out, err = cli(*flags(d, run, max_steps=4, resume=True))
    assert (rc, out) == (1, "")
    assert re.fullmatch(rf"error: {re.escape(str(run / 'ckpt.pt'))} was reading other data than "
                        rf"{re.escape(str(d))} now holds \(fingerprint {saved}, now [0-9a-f]{{16}}: meta.json or the "
                        r"shards changed\): its saved position would index other windows. Resume on the data it was "
                        r"reading, or start from its weights with --init_from\n", err), err
    assert files(run) == before
    # a checkpoint written before fingerprints still resumes, and says it cannot check
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    del ckpt["data"]["fingerprint"]
    torch.save(ckpt, run / "ckpt.pt")
    rc, out, err = cli(*flags(data_dir, run, max_steps=3, resume=True))
    assert (rc, err) == (0, f"note: {run / 'ckpt.pt'} predates data fingerprints: cannot check that {data_dir} holds "
                            "the data it was reading\n")


def test_resume_beside_the_same_text_prepared_elsewhere_continues(data_dir, tmp_path):
    """The data is its content, not the path its text was read from: a run resumes on the same text prepared again
    from another path (to the same steps and weights as an unbroken run), and a checkpoint whose fingerprint
    hashed meta.json's paths too (before) still resumes where it was made."""
    whole = train.train(config(data_dir, tmp_path / "whole", max_steps=6))
    train.train(config(data_dir, tmp_path / "run", max_steps=3))
    text = shutil.copy(data_dir.parent / "corpus.txt", tmp_path / "moved.txt")
    prepare([str(text)], str(tmp_path / "again"), vocab_size=512, workers=1, progress=False)
    assert json.loads((tmp_path / "again" / "meta.json").read_text())["inputs"] == [str(text)]
    resumed = train.train(config(tmp_path / "again", tmp_path / "run", max_steps=6, resume=True))
    assert resumed["final_val_loss"] == whole["final_val_loss"]
    a, b = (torch.load(tmp_path / r / "ckpt.pt", weights_only=True)["model"] for r in ("whole", "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    ckpt["data"]["fingerprint"] = shards.data_fingerprint(str(tmp_path / "again"), legacy=True)
    torch.save(ckpt, tmp_path / "run" / "ckpt.pt")
    assert train.train(config(tmp_path / "again", tmp_path / "run", max_steps=7, resume=True))["steps"] == 7


def test_fine_tuning_a_tokenizer_json_model_on_tiktoken_data_is_refused(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path / "run", max_steps=1, eval_interval=0))
    release = tmp_path / "release"
    release.mkdir()
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    torch.save({"model": ckpt["model"], "model_config": ckpt["model_config"],
                "tokenizer": {"kind": "hf", "file": "tokenizer.json"}}, release / "ckpt.pt")
    rc, out, err = cli(*flags(data_dir, tmp_path / "ft", init_from=release / "ckpt.pt"))
    assert (rc, out) == (1, "")
    assert err == (f"error: {release / 'ckpt.pt'}: its tokenizer is a tokenizer.json ('tokenizer.json'), but "
                   f"{data_dir / 'meta.json'} says the data was made with tiktoken's gpt2: the same ids would mean "
                   "other text. prepare_data.py writes tiktoken data only, so this model cannot be trained on it "
                   "here\n")
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda c: c["data"].pop("position"), "cannot resume: 'data' has no whole-number 'position' >= 0 (a checkpoint of "
                                          "another program or version?); start from its weights with --init_from"),
    (lambda c: c.update(rng={"torch": 1}),
     "cannot resume: 'rng' is not a list of RNG states (torch, cuda, python, numpy) per process (a checkpoint of "
     "another program or version?); start from its weights with --init_from"),
    (lambda c: c.update(step="4"),
     "cannot resume: 'step' is not a whole number >= 0 (a checkpoint of another program or version?); start from "
     "its weights with --init_from"),
    (lambda c: c.update(model_config=list(c["model_config"].values())),
     "its 'model_config' entry is not a dict of GPTConfig fields (a list)"),
    (lambda c: c.update(tokenizer=["gpt2"]), "unknown tokenizer entry ['gpt2']"),
    (lambda c: c["rng"][0].update(numpy=[1, 2]), "its RNG state of rank 0 is unreadable (not enough values to unpack "
                                                  "(expected 5, got 2))"),
])
def test_a_checkpoint_of_another_shape_is_one_line_naming_the_entry(data_dir, tmp_path, capsys, damage, message):
    train.train(config(data_dir, tmp_path, max_steps=1, eval_interval=0))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    damage(ckpt)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    capsys.readouterr()
    assert run_main(train.main, flags(data_dir, tmp_path, max_steps=2, resume=True)) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'ckpt.pt'}: {message}\n"


@pytest.mark.parametrize("fault", ["second Ctrl-C", "full disk"])
def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, capsys, fault):
    train.train(config(data_dir, tmp_path, max_steps=4, eval_interval=100))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "log.jsonl"}

    def save_and_fail(obj, f):
        f.write(b"the first half of a checkpoint")
        if fault == "full disk":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.kill(os.getpid(), signal.SIGINT)  # stop after this step ...
        os.kill(os.getpid(), signal.SIGINT)  # ... no, now: KeyboardInterrupt mid-write

    monkeypatch.setattr(train.torch, "save", save_and_fail)
    rc = run_main(train.main, flags(data_dir, tmp_path, max_steps=8, eval_interval=100, resume=True))
    err = capsys.readouterr().err
    if fault == "full disk":
        assert (rc, err) == (1, f"error: {tmp_path / 'ckpt.pt'}: not written (the disk is full: No space left on "
                                f"device); kept as they were: {tmp_path / 'ckpt.pt'}, {tmp_path / 'best.pt'}\n")
    else:
        assert rc == 130 and err.endswith("SIGINT: finishing this step, saving, then exiting\ninterrupted\n"), err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "log.jsonl"} == before  # no temp file left
    monkeypatch.undo()
    assert train.train(config(data_dir, tmp_path, max_steps=6, eval_interval=100, resume=True))["steps"] == 6


def test_init_from_a_nan_checkpoint_names_the_tensor(data_dir, tmp_path, capsys):
    train.train(config(data_dir, tmp_path / "a", max_steps=2))
    ckpt = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)
    ckpt["model"]["blocks.1.mlp.fc.weight"][3, 4] = float("nan")
    torch.save(ckpt, tmp_path / "nan.pt")
    assert run_main(train.main, flags(data_dir, tmp_path / "b", init_from=tmp_path / "nan.pt")) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'nan.pt'} holds NaN or inf values in blocks.1.mlp.fc.weight: "
                   "refusing to train from a diverged or corrupt checkpoint\n")
    assert not (tmp_path / "b").exists()
