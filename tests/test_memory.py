"""bincode_gpt/memory.py's training estimate against what one eager training step takes: the peak RSS a fresh
process adds over its model and optimizer during the step (gradients, AdamW's moments, activations, logits) lies within the
estimate and not far below it, in float32 and under bfloat16 autocast."""

import os
import subprocess
import sys

import pytest

from bincode_gpt.memory import largest_batch, training_bytes
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
