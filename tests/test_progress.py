"""Tests of bincode_gpt/progress.py: log.jsonl written a whole line at a time, the stdout line's throughput and
ETA (its arithmetic), the time format."""

import errno
import json
import os

import pytest

from bincode_gpt.progress import Log, clock, nats_per_byte
from model import get_config


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
