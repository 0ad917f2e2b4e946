"""Tests of bincode_gpt/run_dir.py: out_dir has one writer and loses nothing (claim_out_dir, check_out_dir,
kept_checkpoints); log.jsonl written a whole line at a time, the stdout line's throughput and ETA (its
arithmetic), the time format (Log); what a run starts from (read_start) and the resume's data check
(check_same_data, on the data's fingerprint); the rest of the exact-resume parts are in test_resume.py and
test_devices.py."""

import errno
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
from bincode_gpt import run_dir, shards
from bincode_gpt.exits import run_main
from bincode_gpt.files import LOCK_NAME, file_stamp
from bincode_gpt.run_dir import Log, clock, nats_per_byte, read_log
from model import get_config
import test_train
from test_train import cli, config, files, flags, ROOT, train_log

# test_train's fixtures, found here by name: the prepared data folder, and one thread a process (autouse)
data_dir, one_thread = test_train.data_dir, test_train.one_thread


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
                     "def save(obj, f):\n"
                     "    f.write(b'half a checkpoint'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
                     "torch.save = save\nsys.exit(train.main(sys.argv[1:]))\n")
    resumed = flags(data_dir, tmp_path, max_steps=4, eval_interval=0, resume=True)
    killed = subprocess.run([sys.executable, "-c", kill_mid_save, *resumed], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
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
    assert (rc, out, err) == (1, "", f"error: {tmp_path / 'log.jsonl'} holds the log of an earlier run, which saved "
                                     "no checkpoint: keep it by choosing another out_dir, or replace it with "
                                     "--overwrite\n")
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
    both = f"{tmp_path / 'ckpt.pt'}, {tmp_path / 'best.pt'}"
    assert run_dir.kept_checkpoints(str(tmp_path)) == f"kept as they were: {both}"


def test_the_eta_and_tokens_per_s_leave_out_the_warm_up_step(capsys):
    log = stdout_log(max_steps=200, eval_interval=50)
    log.eval_s = 4.0  # the last evaluation's time
    for step, dt in enumerate([9.0] + [0.5] * 9, start=1):  # a slow first step (warm-up), then 0.5 s a step
        log.step(step, loss=1.0, norm=None, lr=1e-3, dt=dt, tokens=step * 32, stopping=False)
    # 190 steps at 0.5 s, and the evaluations at 50, 100, 150 and 200 at 4 s each: 111 s; the tokens/s of
    # the 9 steady steps (16 x 32 tokens in 0.5 s), the warm-up left out of it and of the run's summary
    assert capsys.readouterr().out.endswith("| 1,024 tok/s | eta 0h01m51s\n")
    assert log.tokens_per_s() == 1024
    assert stdout_log(max_steps=210, eval_interval=50).eta(200, [1.0]) == 10
    assert clock(3 * 3600 + 62.7) == "3h01m02s"


def stdout_log(max_steps, eval_interval, out_dir="", peak=None):
    """A Log of one process that prints every 10 steps (16 x 32 tokens a step) and writes no log.jsonl."""
    return Log(out_dir=out_dir, master=True, world=1, tokens_per_step=16 * 32, max_steps=max_steps,
               log_interval=10, eval_interval=eval_interval, flops=1.0, peak=peak)


def test_the_eta_counts_the_steps_and_the_evaluations_to_go():
    log = stdout_log(max_steps=210, eval_interval=50)
    log.eval_s = 3.0
    assert log.eta(200, [1.0, 3.0]) == 10 * 2.0 + 1 * 3.0  # 10 steps at their mean; the end's evaluation
    assert log.eta(149, [1.0]) == 61 + 3 * 3.0  # at 150, 200 and the end (210)
    assert log.eta(150, [1.0]) == 60 + 2 * 3.0  # 150's is taken: 200 and the end
    assert stdout_log(max_steps=200, eval_interval=50).eta(150, [1.0]) == 50  # 200 is the end: one, at 0 s
    never = stdout_log(max_steps=20, eval_interval=0)
    never.eval_s = 100.0
    assert never.eta(10, [2.0]) == 20  # no evaluations


def test_the_printed_line_has_the_mfu_where_the_peak_is_known(capsys):
    log = stdout_log(max_steps=20, eval_interval=0, peak=1024.0)
    for step in range(1, 11):
        log.step(step, loss=2.0, norm=1.0, lr=1e-3, dt=0.5, tokens=step * 512, stopping=False)
    out = capsys.readouterr().out
    # 512 tokens in 0.5 s at 1 FLOP a token: 1,024 FLOP/s, all of the 1,024 peak
    assert out == "step 10/20 | loss 2.0000 | lr 1.00e-03 | 1,024 tok/s | mfu 100.0% | eta 0h00m05s\n"
    assert clock(59.9) == "0h00m59s" and nats_per_byte(None) == "" and nats_per_byte(0.5) == ", 0.5000 nats/byte"


def test_without_a_peak_the_mfu_is_against_the_devices_figure_from_the_table(tmp_path, monkeypatch, capsys):
    """--peak_flops unset: the started device's figure (devices.peak_flops), looked up for its dtype; none, no MFU."""
    asked = []
    monkeypatch.setattr(run_dir, "peak_flops", lambda device, dtype: asked.append((device, dtype)) or 2048.0)
    log = stdout_log(max_steps=20, eval_interval=0, out_dir=str(tmp_path))
    log.start(config=get_config("tiny", vocab_size=512), params={"trainable": 1, "frozen": 2}, device="cpu",
              dtype="bfloat16", windows=7, step=0, resume=False, overwrite=False, train_config={})
    for step in range(1, 11):
        log.step(step, loss=2.0, norm=1.0, lr=1e-3, dt=0.5, tokens=step * 512, stopping=False)
    assert capsys.readouterr().out.endswith("1,024 tok/s | mfu 50.0% | eta 0h00m05s\n")
    assert asked == [(torch.device("cpu"), "bfloat16")]  # once, at the first step
    with_none = stdout_log(max_steps=20, eval_interval=0, out_dir=str(tmp_path))
    monkeypatch.setattr(run_dir, "peak_flops", lambda device, dtype: None)
    with_none.start(config=get_config("tiny", vocab_size=512), params={"trainable": 1, "frozen": 2},
                    device="cpu", dtype="float32", windows=7, step=0, resume=False, overwrite=False,
                    train_config={})
    for step in range(1, 11):
        with_none.step(step, loss=2.0, norm=1.0, lr=1e-3, dt=0.5, tokens=step * 512, stopping=False)
    assert capsys.readouterr().out.endswith("1,024 tok/s | eta 0h00m05s\n")


def started(tmp_path, *, resume=False, overwrite=False):
    log = stdout_log(max_steps=10, eval_interval=0, out_dir=str(tmp_path))
    log.start(config=get_config("tiny", vocab_size=512), params={"trainable": 1, "frozen": 2}, device="cpu",
              dtype="float32", windows=7, step=0, resume=resume, overwrite=overwrite, train_config={"lr": 1.0})
    return log


def test_log_jsonl_is_new_appended_on_resume_and_an_overwrite_drops_the_replaced_best(tmp_path, capsys):
    log = started(tmp_path)
    log.record(event="train", step=1)
    log.close()
    assert capsys.readouterr().out.endswith("| 512 tokens/step, 7 train windows/epoch | starting at step 0\n")
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["start", "train"]
    started(tmp_path, resume=True).close()
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 3
    (tmp_path / "best.pt").write_bytes(b"the replaced run's")
    started(tmp_path, overwrite=True).close()
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 1 and not (tmp_path / "best.pt").exists()


def test_read_log_gives_back_what_log_wrote_across_a_resume(tmp_path, capsys):
    """run_dir.read_log, the one reader of log.jsonl: every record in order, or one event's."""
    log = started(tmp_path)
    log.step(1, loss=2.0, norm=1.0, lr=1e-3, dt=0.5, tokens=512, stopping=False)
    log.close()
    log = started(tmp_path, resume=True)
    log.evaluation(1, 1.5, 1.5, True)
    log.close()
    records = read_log(str(tmp_path))
    assert [(r["event"], r["step"]) for r in records] == [("start", 0), ("train", 1), ("start", 0), ("eval", 1)]
    assert records[0]["train_config"] == {"lr": 1.0} and records[1]["tokens"] == 512
    assert read_log(str(tmp_path), "start") == [records[0], records[2]]
    assert read_log(str(tmp_path), "eval") == [dict(event="eval", step=1, val_loss=1.5, best_val_loss=1.5,
                                                    val_loss_per_byte=None)]


def test_a_line_cut_short_by_a_full_disk_is_taken_back(tmp_path, monkeypatch):
    log = started(tmp_path)
    write = os.write

    def half_then_full(fd, data):
        write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError) as info:
        log.record(event="train", step=1, loss=2.0)
    monkeypatch.undo()
    log.close()
    assert str(info.value) == (f"{tmp_path / 'log.jsonl'}: a line not written (the disk is full: No space left on "
                               "device): the log keeps its whole lines; no checkpoint of this run is on disk yet")
    assert [json.loads(line)["event"] for line in (tmp_path / "log.jsonl").read_text().splitlines()] == ["start"]


def test_other_ranks_write_and_print_nothing(tmp_path, capsys):
    log = Log(out_dir=str(tmp_path), master=False, world=2, tokens_per_step=512, max_steps=10, log_interval=1,
              eval_interval=0, flops=1.0, peak=None)
    log.start(config=get_config("tiny", vocab_size=512), params={"trainable": 1, "frozen": 2}, device="cpu",
              dtype="float32", windows=7, step=0, resume=False, overwrite=False, train_config={})
    log.step(1, loss=2.0, norm=None, lr=1.0, dt=1.0, tokens=512, stopping=False)
    log.close()
    assert capsys.readouterr().out == "" and not (tmp_path / "log.jsonl").exists()


def read_start(data, out_dir, resume):
    """run_dir.read_start as train.py calls it for the tiny preset on one CPU process, no overrides."""
    return run_dir.read_start(data, out_dir=str(out_dir), resume=resume, init_from=None, preset="tiny", asked={},
                              batch_size=8, eval_steps=2, rank=0, world=1, device=torch.device("cpu"),
                              dtype="float32")


def test_a_resume_from_a_folder_with_best_pt_alone_says_to_init_from_it(tiny_data, tmp_path):
    (tmp_path / "best.pt").write_bytes(b"weights")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'ckpt.pt'}: no checkpoint there to resume; "
                                                          f"{tmp_path / 'best.pt'} holds weights only")):
        read_start(tiny_data, tmp_path, resume=True)
    start = read_start(tiny_data, tmp_path, resume=False)
    assert (start.source, start.ckpt, start.stamp) == (None, None, None)
    assert start.meta["vocab_size"] == 512 and start.tokenizer["kind"] == "tiktoken"
    assert start.fingerprint == shards.data_fingerprint(tiny_data)
    assert (start.config.vocab_size, start.train_split.n > 0, start.val_split.block) == (512, True, 32)


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
    run_dir.check_same_data(ckpt, "c.pt", str(data_dir), fingerprint, rank=0)
    with pytest.raises(ValueError, match=f"c.pt was reading other data than {re.escape(str(moved))} now holds"):
        run_dir.check_same_data(ckpt, "c.pt", str(moved), shards.data_fingerprint(str(moved)), rank=0)
    run_dir.check_same_data({"data": {}}, "c.pt", str(moved), "x", rank=1)
    assert capsys.readouterr().err == ""  # said once, by rank 0
    run_dir.check_same_data({"data": {}}, "c.pt", str(moved), "x", rank=0)
    assert "c.pt predates data fingerprints" in capsys.readouterr().err
