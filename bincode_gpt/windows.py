"""
The windows of prepared token shards that training and evaluation read (prepare_data.py writes the shards).
"""

import os

import numpy as np
import torch

from bincode_gpt.shards import read_shard, ShardError


class Split:
    """The windows of block_size+1 tokens of one split, at stride block_size, inside each shard."""

    def __init__(self, folder, meta, split, block_size, vocab_size):
        names = meta["splits"].get(split, {}).get("shards", [])
        if not names:
            raise ShardError(f"{os.path.join(folder, 'meta.json')}: no {split} shards listed")
        self.block = block_size
        info = meta["splits"][split]  # nats per token x tokens per byte = nats per byte, comparable across vocabularies
        self.tokens_per_byte = info["tokens"] / info["bytes"] if info.get("bytes") and info.get("tokens") else None
        self.paths = [os.path.join(folder, n) for n in names]
        self.shards = [read_shard(path) for path in self.paths]  # ShardError names a bad file
        for path, tokens in zip(self.paths, self.shards):
            top = int(tokens.max()) if len(tokens) else -1  # one pass over the data, once
            if top >= vocab_size:
                raise ValueError(f"{path}: holds token id {top}, beyond the model's vocab_size {vocab_size} "
                                 f"({os.path.join(folder, 'meta.json')} says vocab_size {meta['vocab_size']})")
        counts = [max(0, (len(t) - 1) // block_size) for t in self.shards]
        self.starts = np.cumsum([0] + counts)  # index of each shard's first window
        self.n = int(self.starts[-1])
        if self.n == 0:
            raise ShardError(f"{folder}: the {split} split has no shard of block_size+1 = {block_size + 1} tokens")

    def batch(self, windows, device):
        """(B,) window ids -> inputs, targets: two (B, block_size) int64 tensors on device."""
        shard = np.searchsorted(self.starts, windows, side="right") - 1
        offset = (windows - self.starts[shard]) * self.block
        rows = np.stack([self.shards[s][o : o + self.block + 1] for s, o in zip(shard, offset)]).astype(np.int64)
        x, y = torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)
