"""Tests of bincode_gpt/run_dir.py: out_dir has one writer and loses nothing (claim_out_dir, check_out_dir,
kept_checkpoints), and a resume reads on only in the same data (data_fingerprint, check_same_data)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

import train
from bincode_gpt import run_dir
from bincode_gpt.exits import run_main
from bincode_gpt.files import LOCK_NAME, file_stamp
# the run's helpers, and its fixtures: data_dir, one_thread (autouse: one thread a process)
from test_train import cli, config, data_dir, files, flags, one_thread, ROOT, train_log


def test_a_fresh_run_never_replaces_a_checkpoint(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path, max_steps=5))
    before = files(tmp_path)
    assert {"ckpt.pt", "best.pt", "log.jsonl"} <= before.keys()
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=3))
    assert (rc, out, err) == (1, "", f"error: {tmp_path / 'ckpt.pt'} exists: continue that run with --resume, "
                                     "or start afresh and replace it with --overwrite\n")
    assert files(tmp_path) == before
    train.train(config(data_dir, tmp_path, max_steps=3, overwrite=True))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 3


def test_a_second_run_into_a_busy_out_dir_is_refused(data_dir, tmp_path):
    """Two real processes, one out_dir: the second is refused by name and pid; the first finishes intact."""
    first = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *flags(data_dir, tmp_path, max_steps=100000,
                              eval_interval=0, save_interval=0, log_interval=1)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in first.stdout:
        if line.startswith("step 2/"):
            break
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=3))
    assert (rc, out, err) == (1, "", f"error: {tmp_path} is being written by another process (pid {first.pid}); "
                                     "wait for it to finish or choose another folder\n")
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=3, overwrite=True))  # not even with --overwrite
    assert rc == 1 and err.startswith(f"error: {tmp_path} is being written by another process")
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    steps = [e["step"] for e in train_log(tmp_path)]
    assert len(train_log(tmp_path, "start")) == 1 and steps == list(range(1, steps[-1] + 1))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == steps[-1]


def test_a_save_killed_with_sigkill_leaves_a_temp_file_the_next_run_removes(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path, max_steps=2, eval_interval=0))
    good = (tmp_path / "ckpt.pt").read_bytes()
    (tmp_path / "ckpt.pt.tmp_notes").write_text("the user's file")  # not a temp file of ours: kept
    kill_mid_save = ("import os, signal, sys, torch, train\n"
                     "def save(obj, f):\n    f.write(b'half a checkpoint'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
                     "torch.save = save\nsys.exit(train.main(sys.argv[1:]))\n")
    killed = subprocess.run([sys.executable, "-c", kill_mid_save, *flags(data_dir, tmp_path, max_steps=4, eval_interval=0,
                             resume=True)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    left = sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name)
    assert len(left) == 2 and re.fullmatch(r"ckpt\.pt\.tmp\d+", left[0]) and left[1] == "ckpt.pt.tmp_notes"
    assert (tmp_path / "ckpt.pt").read_bytes() == good
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=4, eval_interval=0, resume=True))
    assert (rc, err) == (0, ""), err
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == ["ckpt.pt.tmp_notes"]
    assert (tmp_path / "ckpt.pt.tmp_notes").read_text() == "the user's file"
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 4


def test_a_fresh_run_keeps_the_log_of_a_run_that_saved_nothing(data_dir, tmp_path):
    assert run_main(train.main, flags(data_dir, tmp_path, lr=1e6, save_interval=1, eval_interval=0)) == 1  # diverges
    log = (tmp_path / "log.jsonl").read_bytes()
    assert b'"diverged"' in log and not (tmp_path / "ckpt.pt").exists()
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=2))
    assert (rc, out, err) == (1, "", f"error: {tmp_path / 'log.jsonl'} holds the log of an earlier run, which saved no "
                                     "checkpoint: keep it by choosing another out_dir, or replace it with --overwrite\n")
    assert (tmp_path / "log.jsonl").read_bytes() == log
    assert cli(*flags(data_dir, tmp_path, max_steps=2, overwrite=True))[0] == 0
    assert not train_log(tmp_path, "diverged") and train_log(tmp_path)[-1]["step"] == 2


def test_an_overwrite_leaves_no_best_pt_of_the_replaced_run(data_dir, tmp_path):
    train.train(config(data_dir, tmp_path, max_steps=5))
    assert (tmp_path / "best.pt").is_file()
    rc, out, err = cli(*flags(data_dir, tmp_path, max_steps=2, n_layer=1, eval_interval=0, overwrite=True))
    assert (rc, err) == (0, ""), err
    assert sorted(files(tmp_path)) == ["ckpt.pt", "log.jsonl"]
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["model_config"]["n_layer"] == 1


def test_a_fresh_run_refuses_a_folder_with_an_earlier_runs_files(tmp_path):
    run_dir.check_out_dir(str(tmp_path), resume=False, overwrite=False)  # empty: nothing to keep
    (tmp_path / "notes.txt").write_text("the user's")
    run_dir.check_out_dir(str(tmp_path), resume=False, overwrite=False)  # not a run's file
    (tmp_path / "log.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="holds the log of an earlier run, which saved no checkpoint"):
        run_dir.check_out_dir(str(tmp_path), resume=False, overwrite=False)
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'ckpt.pt'} exists: continue that run with --resume")):
        run_dir.check_out_dir(str(tmp_path), resume=False, overwrite=False)
    run_dir.check_out_dir(str(tmp_path), resume=True, overwrite=False)
    run_dir.check_out_dir(str(tmp_path), resume=False, overwrite=True)


def test_the_claim_locks_the_folder_until_the_run_ends_and_a_refusal_writes_nothing(tmp_path):
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    with ExitStack() as lock, pytest.raises(ValueError, match="exists"):
        run_dir.claim_out_dir(str(tmp_path), lock, stamp=None, resume=False, overwrite=False)
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # checked before the lock: no lock file
    with ExitStack() as lock:
        run_dir.claim_out_dir(str(tmp_path), lock, stamp=file_stamp(tmp_path / "ckpt.pt"), resume=True,
                              overwrite=False)
        assert LOCK_NAME in os.listdir(tmp_path)
    with ExitStack() as lock:  # released: another run may claim it
        run_dir.claim_out_dir(str(tmp_path), lock, stamp=None, resume=True, overwrite=False)
    stamp = file_stamp(tmp_path / "ckpt.pt")
    os.replace(tmp_path / "ckpt.pt", tmp_path / "old.pt")
    (tmp_path / "ckpt.pt").write_bytes(b"another run's weights, saved since")
    with ExitStack() as lock, pytest.raises(ValueError, match="was replaced by another run while this one started"):
        run_dir.claim_out_dir(str(tmp_path), lock, stamp=stamp, resume=True, overwrite=False)
    run_dir.claim_out_dir(str(tmp_path), None, stamp=stamp, resume=True, overwrite=False)  # other ranks: checks


def test_kept_checkpoints_names_what_a_failed_write_left(tmp_path):
    assert run_dir.kept_checkpoints(str(tmp_path)) == "no checkpoint of this run is on disk yet"
    (tmp_path / "best.pt").write_bytes(b"")
    assert run_dir.kept_checkpoints(str(tmp_path)) == f"kept as they were: {tmp_path / 'best.pt'}"
    (tmp_path / "ckpt.pt").write_bytes(b"")
    assert run_dir.kept_checkpoints(str(tmp_path)) == f"kept as they were: {tmp_path / 'ckpt.pt'}, {tmp_path / 'best.pt'}"


def test_the_data_fingerprint_is_the_content_not_the_path(data_dir, tmp_path, capsys):
    moved = Path(shutil.copytree(data_dir, tmp_path / "moved"))
    meta = json.loads((moved / "meta.json").read_text())
    (moved / "meta.json").write_text(json.dumps({**meta, "inputs": ["/elsewhere/corpus.txt"]}))
    fingerprint = run_dir.data_fingerprint(str(data_dir))
    assert re.fullmatch("[0-9a-f]{16}", fingerprint) and run_dir.data_fingerprint(str(moved)) == fingerprint
    assert run_dir.data_fingerprint(str(moved), legacy=True) != fingerprint  # the paths were hashed too
    with open(moved / "val_000000.bin", "ab") as f:
        f.write(b"\0\0")
    assert run_dir.data_fingerprint(str(moved)) != fingerprint
    ckpt = {"data": {"fingerprint": fingerprint}}
    run_dir.check_same_data(ckpt, "c.pt", str(data_dir), fingerprint, rank=0)
    with pytest.raises(ValueError, match=f"c.pt was reading other data than {re.escape(str(moved))} now holds"):
        run_dir.check_same_data(ckpt, "c.pt", str(moved), run_dir.data_fingerprint(str(moved)), rank=0)
    run_dir.check_same_data({"data": {}}, "c.pt", str(moved), "x", rank=1)
    assert capsys.readouterr().err == ""  # said once, by rank 0
    run_dir.check_same_data({"data": {}}, "c.pt", str(moved), "x", rank=0)
    assert "c.pt predates data fingerprints" in capsys.readouterr().err
