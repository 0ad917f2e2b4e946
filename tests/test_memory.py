"""bincode_gpt/memory.py's training estimate against what one eager training step takes: the peak RSS a fresh
process adds over its model and optimizer during the step (gradients, AdamW's moments, activations, logits) lies
within the estimate and not far below it, in float32 and under bfloat16 autocast; a KV cache that cannot fit is
refused with its numbers."""

import os
import subprocess
import sys

import pytest
import torch

from bincode_gpt import memory
from bincode_gpt.memory import check_cache_fits, largest_batch, memory_bytes, training_bytes
from model import get_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = """import sys, torch
from model import GPT, get_config
torch.set_num_threads(1)
dtype, V = sys.argv[1], int(sys.argv[2])
model = GPT(get_config("mini", vocab_size=V, block_size=256))
opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
x, y = torch.randint(1, V - 1, (2, 16, 256))
def status(key):  # bytes, from Linux's /proc/self/status
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
with open("/proc/self/clear_refs", "w") as f:  # the peak RSS back to the RSS now: torch's import is not the step
    f.write("5")
before = status("VmRSS:")
with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
    loss = model(x, y)[1]
loss.backward()
opt.step()
print(status("VmHWM:") - before, sum(p.numel() for p in model.parameters()))
"""

@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("dtype, vocab_size", [("float32", 4096), ("bfloat16", 512)])
def test_the_estimate_covers_a_measured_training_step(dtype, vocab_size):
    r = subprocess.run([sys.executable, "-c", STEP, dtype, str(vocab_size)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    added, params = map(int, r.stdout.split())
    config = get_config("mini", vocab_size=vocab_size, block_size=256)
    estimate = training_bytes(config, 16, dtype) - 4 * params  # the weights were there before the step
    assert 0.6 * estimate <= added <= estimate, (added, estimate)


def test_the_largest_batch_is_the_last_that_fits():
    config = get_config("paper")
    free = 80 * 2**30
    batch = largest_batch(config, free, "bfloat16")
    assert training_bytes(config, batch, "bfloat16") <= free < training_bytes(config, batch + 1, "bfloat16")
    assert largest_batch(config, 2**30, "bfloat16") == 0  # not even the weights and AdamW state


def test_a_kv_cache_that_cannot_fit_is_refused_with_its_numbers(monkeypatch):
    """check_cache_fits (sample.py, before the first token): memory_bytes of a KV cache reaching `positions`, in the
    model's dtype, against the device's free memory; a generation that fits passes, one that cannot is one line with
    both numbers."""
    config = get_config("tiny")
    cpu = torch.device("cpu")
    assert check_cache_fits(config, 64, cpu, torch.float32) is None
    monkeypatch.setattr(memory, "available_memory", lambda device: 8 * 2**30)
    need = memory_bytes(config, 1, 10**9, torch.bfloat16)
    assert need > 8 * 2**30  # 2**30 positions of rotary tables alone: 512 GiB
    with pytest.raises(ValueError) as e:
        check_cache_fits(config, 10**9, cpu, torch.bfloat16)
    assert str(e.value) == (f"prompt + --max_new_tokens = 1,000,000,000 positions need {need / 2**30:,.1f} GiB for the "
                            "KV cache and rotary tables, but 8.0 GiB is free on cpu: ask for fewer tokens")
    assert check_cache_fits(config, 2**20, cpu, torch.bfloat16) is None  # 2**20 positions: within 8 GiB
