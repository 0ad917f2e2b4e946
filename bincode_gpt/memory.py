"""
Memory arithmetic, one home: how much a device has free now, and how much a model, a KV cache or a training
step will take, so that a size that cannot fit is refused up front with the numbers, not by the allocator.
"""

import torch

from bincode_gpt.decode import size_class
from model import GPTConfig


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


def memory_bytes(config: GPTConfig, batch_size=0, positions=0, dtype=torch.float32):
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
# 2.13) with a margin: per layer, token and model dim, ~23 float32 values' worth in float32, ~13 under bfloat16
# autocast; per logit, the float32 logits alone (model.CrossEntropy writes their gradient over them: 4 bytes), and
# under autocast the bfloat16 logits they are copied from, or the gradient's bfloat16 copy (6, and a margin: 8).
ACTIVATION_BYTES = {"float32": 100, "bfloat16": 60}
LOGIT_BYTES = {"float32": 4, "bfloat16": 8}


def training_bytes(config: GPTConfig, batch_size, dtype="float32"):
    """An estimate of one training process's peak in eager mode (torch.compile keeps less): the trainable weights,
    their gradients and AdamW's two moments (16 bytes a parameter: matrix_params), what GPT builds besides them
    (memory_bytes), and for each of batch_size sequences of block_size tokens, the activations backward keeps and
    the logits."""
    d, V = config.n_embd, config.vocab_size
    per_sequence = config.block_size * (ACTIVATION_BYTES[dtype] * config.n_layer * d + LOGIT_BYTES[dtype] * V)
    return 16 * matrix_params(config) + memory_bytes(config) + batch_size * per_sequence


def matrix_params(config: GPTConfig):
    """The trainable parameters that weigh: the blocks' 12 n_embd^2 a layer, the head, a learned table."""
    d, V = config.n_embd, config.vocab_size
    return config.n_layer * 12 * d * d + V * d * (2 if config.input == "learned" else 1)


def largest_batch(config, free, dtype="float32"):
    """The largest micro-batch whose training_bytes fit in `free` bytes (0: not even one sequence)."""
    fixed = training_bytes(config, 0, dtype)
    per_sequence = training_bytes(config, 1, dtype) - fixed
    return max(0, (free - fixed) // per_sequence)


def check_training_fits(config: GPTConfig, *, batch_size, eval_steps, world, device, dtype):
    """Refuse a model or batch that cannot fit, before building it, with the numbers: training_bytes against the
    device's free memory (naming the largest micro-batch that fits), and the validation windows' ids against the
    CPU's."""
    need = training_bytes(config, batch_size, dtype)
    free = available_memory(device)
    if free is not None and need > free:
        fits = largest_batch(config, free, dtype)
        advice = f"--batch_size {fits} fits (--grad_accum keeps the tokens a step)" if fits else "train a smaller model"
        raise ValueError(f"this run needs about {need / 2**30:,.1f} GiB ({matrix_params(config):,} parameters with "
                         f"their gradients and AdamW state, and the activations and logits of {batch_size:,} x "
                         f"{config.block_size:,} tokens in {dtype}), but {free / 2**30:,.1f} GiB is free on {device}: "
                         f"{advice}")
    ids = 8 * eval_steps * batch_size * world
    free = available_memory(torch.device("cpu"))
    if free is not None and ids > free:
        raise ValueError(f"eval_steps {eval_steps:,} x batch_size {batch_size:,} x {world} process(es) "
                         f"validation windows need {ids / 2**30:,.1f} GiB for their ids alone, but "
                         f"{free / 2**30:,.1f} GiB is free: evaluate fewer batches")


def check_cache_fits(config, positions, device, dtype):
    """Refuse up front a generation whose KV cache and rotary tables (memory_bytes, for a model of `config`
    whose parameters are in `dtype`) cannot fit in the device's free memory, naming the numbers, instead of
    failing in the allocator."""
    need = memory_bytes(config, 1, positions, dtype)
    free = available_memory(device)
    if free is not None and need > free:
        raise ValueError(f"prompt + --max_new_tokens = {positions:,} positions need "
                         f"{need / 2**30:,.1f} GiB for the KV cache and rotary tables, but "
                         f"{free / 2**30:,.1f} GiB is free on {device}: ask for fewer tokens")
