"""Tests of bincode_gpt/divergence.py: during the run, a diverged state stops the run unsaved and names the setting
most likely at fault (why_diverged, likely_fault, Divergence). The signal path is in test_resume.py and
test_train_ddp.py."""

import re
from types import SimpleNamespace

import pytest
import torch

import train
from bincode_gpt.divergence import Divergence, likely_fault, why_diverged
from bincode_gpt.exits import run_main
# the run's helpers, and its autouse fixture one_thread (one thread a process)
from test_train import cli, config, flags, one_thread, train_log, weights  # noqa: F401 (one_thread)


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
    assert re.fullmatch(r"error: validation diverged: loss \S+ above 2 ln V = 12\.48 at step 1: stopped without "
                        r"saving; the last good checkpoint is untouched: none was written\. Most likely at fault: "
                        r"--lr 1e\+06, during the warmup \(below its peak\): try a lower --lr, or --grad_clip\.\n",
                        err), err
    assert not (fresh / "ckpt.pt").exists() and train_log(fresh, "diverged")[0]["step"] == 1
    # the same on a resumed run: its last checkpoint survives byte for byte and still resumes
    run = tmp_path / "run"
    train.train(config(data_dir, run, max_steps=4, lr_decay_steps=10))
    good = (run / "ckpt.pt").read_bytes()
    # lr 1e10, far past where the first resumed update ruins the weights (1e6 is borderline: on some data
    # step 5 still passes its one-batch validation check and step 6 fails)
    assert run_main(train.main, flags(data_dir, run, max_steps=10, resume=True, lr=1e10, save_interval=1)) == 1
    err = capsys.readouterr().err
    assert (f"at step 5: stopped without saving; the last good checkpoint is untouched: {run / 'ckpt.pt'} "
            "(step 4)") in err
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
