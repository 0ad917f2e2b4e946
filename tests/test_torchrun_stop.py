"""Stopping a DDP run the way a scheduler does: SIGTERM to torchrun, which forwards it to its ranks and SIGKILLs
them --shutdown_timeout seconds later. Two gloo processes, tiny preset, a real torchrun: every rank finishes the
step it is in, rank 0 announces it, says once what torchrun's timeout means, and ckpt.pt holds that step."""

import json
import os

from bincode_gpt.exits import TORCHRUN_KILLS
from tools.gpu_check import announced, run, saved_step, torchrun


def test_sigterm_to_torchrun_ends_with_ckpt_at_the_announced_step(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "out"
    flags = [f"--data_dir={tiny_data}", f"--out_dir={out}", "--device=cpu", "--preset=tiny", "--block_size=32",
             "--batch_size=4", "--grad_accum=2", "--max_steps=100000", "--log_interval=1", "--eval_interval=0",
             "--save_interval=0", "--warmup_steps=1"]  # a run that would go on for minutes, saving only when stopped
    done = run(torchrun(2, *flags), stop_after=3, timeout=240)
    step = announced(done.out)
    # torchrun re-raises the signal it forwarded: exit 1, though both ranks saved and exited 0
    assert done.code == 1 and "SignalException" in done.err, done.err[-2000:]
    assert done.err.count("SIGTERM: finishing this step, saving, then exiting") == 2  # each rank
    assert done.err.count(TORCHRUN_KILLS) == 1  # rank 0 alone, on the first signal
    assert 3 <= step < 100000 and f"done: step {step}, " in done.out
    assert saved_step(out) == step
    with open(os.path.join(out, "log.jsonl")) as f:
        trained = [e["step"] for e in map(json.loads, f) if e["event"] == "train"]
    assert trained == list(range(1, step + 1))
