"""Tests of bincode_gpt/shards.py's Split: the windows of block_size+1 tokens that training and
evaluation read, at stride block_size inside each shard, and the data it refuses by name. The shard
format and meta.json are tested with prepare_data.py (test_prepare_data.py)."""

import numpy as np
import pytest
import torch

from bincode_gpt.shards import ShardError, Split, write_shard


def folder_of(tmp_path, shards, vocab_size=100):
    """A prepared folder's meta for `shards` (name: tokens), the train split made of them all."""
    for name, tokens in shards.items():
        write_shard(tmp_path / name, np.array(tokens, dtype=np.uint16))
    total = sum(len(t) for t in shards.values())
    return {"vocab_size": vocab_size, "encoding": "gpt2",
            "splits": {"train": {"shards": list(shards), "tokens": total, "bytes": 2 * total}}}


def test_windows_stay_inside_their_shard_and_targets_are_the_next_tokens(tmp_path):
    meta = folder_of(tmp_path, {"a.bin": range(10), "b.bin": range(50, 57)})
    split = Split(str(tmp_path), meta, "train", 3, 100)
    assert split.n == 3 + 2  # (10 - 1) // 3 windows in a, (7 - 1) // 3 in b: none across the two
    assert split.tokens_per_byte == 0.5
    x, y = split.batch(np.array([0, 2, 3, 4]), torch.device("cpu"))
    assert x.tolist() == [[0, 1, 2], [6, 7, 8], [50, 51, 52], [53, 54, 55]]
    assert y.tolist() == [[1, 2, 3], [7, 8, 9], [51, 52, 53], [54, 55, 56]]
    assert x.dtype == y.dtype == torch.int64


def test_a_split_it_cannot_read_is_refused_by_name(tmp_path):
    meta = folder_of(tmp_path, {"a.bin": range(10)})
    with pytest.raises(ShardError, match="meta.json: no val shards listed"):
        Split(str(tmp_path), meta, "val", 3, 100)
    with pytest.raises(ValueError, match=r"a\.bin: holds token id 9, beyond the model's vocab_size 9 "):
        Split(str(tmp_path), meta, "train", 3, 9)
    with pytest.raises(ShardError, match="the train split has no shard of block_size\\+1 = 11 tokens"):
        Split(str(tmp_path), meta, "train", 10, 100)
