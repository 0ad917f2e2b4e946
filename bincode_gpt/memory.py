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


def check_training_fits(cfg, mcfg, world, device):
    """Refuse a model or batch that cannot fit, before building it, with the numbers: a lower bound of what
    training holds (weights, gradients and AdamW's two moments, 16 bytes a parameter, counting only the
    blocks' 12 n_embd^2 and the head; a micro-batch's logits at 2 bytes or more; what GPT builds besides
    its weights) against the device's free memory, and the validation windows' ids against the CPU's."""
    params = mcfg.n_layer * 12 * mcfg.n_embd**2 + mcfg.vocab_size * mcfg.n_embd
    need = 16 * params + 2 * cfg.batch_size * mcfg.block_size * mcfg.vocab_size + memory_bytes(mcfg)
    free = available_memory(device)
    if free is not None and need > free:
        raise ValueError(f"this run needs at least {need / 2**30:,.1f} GiB ({params:,} parameters with their gradients "
                         f"and AdamW state, and logits of {cfg.batch_size:,} x {mcfg.block_size:,} tokens over "
                         f"{mcfg.vocab_size:,}), but {free / 2**30:,.1f} GiB is free on {device}: train a smaller "
                         "model or batch")
    ids, free = 8 * cfg.eval_steps * cfg.batch_size * world, available_memory(torch.device("cpu"))
    if free is not None and ids > free:
        raise ValueError(f"eval_steps {cfg.eval_steps:,} x batch_size {cfg.batch_size:,} x {world} process(es) "
                         f"validation windows need {ids / 2**30:,.1f} GiB for their ids alone, but "
                         f"{free / 2**30:,.1f} GiB is free: evaluate fewer batches")
