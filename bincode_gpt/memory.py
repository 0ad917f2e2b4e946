"""
Memory arithmetic, one home: how much a device has free now, and how much a model, a KV cache or a training
step will take, so that a size that cannot fit is refused up front with the numbers, not by the allocator.
"""

import torch

from bincode_gpt.decode import size_class


def available_memory(device):
    """Bytes that new tensors on `device` can take now (CUDA: free GPU memory; CPU: Linux's MemAvailable),
    or None where that cannot be told (MPS, a CPU without /proc/meminfo): then nothing is refused on it."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return None
    return None


def memory_bytes(config, batch_size=0, positions=0, dtype=torch.float32):
    """An upper bound on the memory GPT(config) takes besides its weights, built even on the meta device
    (rotary tables of block_size positions, made from float64 angles; the code table; the lift), and with
    batch_size > 0, a KVCache reaching `positions` (keys and values, its rotary tables of every position of its
    size class): so a size that cannot fit is refused up front, with the number, not by the allocator."""
    head_dim, item = config.n_embd // config.n_head, torch.empty((), dtype=dtype).element_size()
    total = 32 * config.block_size * head_dim + 4 * config.vocab_size * config.code_bits + 8 * config.n_embd
    if batch_size:
        reach = size_class(positions)
        total += 2 * config.n_layer * batch_size * config.n_embd * min(reach, config.block_size) * item
        total += 32 * reach * head_dim
    return total


# What eager training keeps for backward, measured as peak RSS on a CPU (tests/test_memory.py; AMD EPYC, torch
# 2.13) and rounded up: per layer, token and model dim, ~23 float32 values' worth in float32, ~12 under bfloat16
# autocast; per logit, its float32 copy, log-softmax and gradient (12 bytes in float32, 16 with the bfloat16 logits).
ACTIVATION_BYTES = {"float32": 96, "bfloat16": 56}
LOGIT_BYTES = {"float32": 12, "bfloat16": 16}


def training_bytes(config, batch_size, dtype="float32"):
    """An estimate of one training process's peak in eager mode (torch.compile keeps less): the trainable weights,
    their gradients and AdamW's two moments (16 bytes a parameter: the blocks' 12 n_embd^2 a layer, the head, a
    learned table), what GPT builds besides them (memory_bytes), and for each of batch_size sequences of
    block_size tokens, the activations backward keeps and the logits."""
    d, V = config.n_embd, config.vocab_size
    params = config.n_layer * 12 * d * d + V * d * (2 if config.input == "learned" else 1)
    per_sequence = config.block_size * (ACTIVATION_BYTES[dtype] * config.n_layer * d + LOGIT_BYTES[dtype] * V)
    return 16 * params + memory_bytes(config) + batch_size * per_sequence


def largest_batch(config, free, dtype="float32"):
    """The largest micro-batch whose training_bytes fit in `free` bytes (0: not even one sequence)."""
    fixed = training_bytes(config, 0, dtype)
    per_sequence = training_bytes(config, 1, dtype) - fixed
    return max(0, (free - fixed) // per_sequence)
