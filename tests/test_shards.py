"""bincode_gpt/shards.py: the token shard format (header, round trip, damaged shards, a crash mid-write); meta.json,
the prepared folder's index, malformed or missing; and Split, the windows of block_size+1 tokens that training and
evaluation read, at stride block_size inside each shard, the data it refuses by name, and its warning for windows
that start on a token the model reads as a constant vector (Split.check_window_starts, through train.py's own
runs)."""
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import prepare_data
import train
from bincode_gpt import shards
from bincode_gpt.exits import run_main
from bincode_gpt.shards import ShardError, Split, write_shard
from bincode_gpt.tokenizer import get_tokenizer
from prepare_data import prepare
import test_prepare_data
import test_train
from test_prepare_data import words
from test_train import ROOT, config, flags, train_log

# fixtures of other test files, found here by name: a prepared folder, and one thread a process (autouse)
prepared, one_thread = test_prepare_data.prepared, test_train.one_thread


# ---------------------------------------------------------------- shard format
@pytest.mark.parametrize("dtype,width", [(np.uint16, 2), (np.uint32, 4)])
def test_shard_round_trip_and_header(tmp_path, dtype, width):
    tokens = np.array([0, 1, 255, 50256, np.iinfo(dtype).max], dtype=dtype)
    path = tmp_path / "s.bin"
    shards.write_shard(path, tokens)
    raw = path.read_bytes()
    assert raw[:8] == b"BCGPTTOK"
    assert struct.unpack("<IIQ", raw[8:24]) == (1, width, 5) and raw[24:32] == bytes(8)  # no tokenizer: unrecorded
    assert len(raw) == 32 + 5 * width
    back = shards.read_shard(path)
    assert back.dtype == np.dtype(dtype) and np.array_equal(back, tokens)
    assert not back.flags.writeable
    assert os.listdir(tmp_path) == ["s.bin"]


def test_write_shard_narrows_wide_ints_and_empty(tmp_path):
    shards.write_shard(tmp_path / "a.bin", np.array([1, 2, 70000], dtype=np.int64))
    assert shards.read_shard(tmp_path / "a.bin").dtype == np.uint32
    shards.write_shard(tmp_path / "b.bin", np.array([1, 2, 3], dtype=np.int64))
    assert shards.read_shard(tmp_path / "b.bin").dtype == np.uint16
    shards.write_shard(tmp_path / "c.bin", np.zeros(0, np.uint16))
    assert len(shards.read_shard(tmp_path / "c.bin")) == 0
    with pytest.raises(ValueError, match=r"d.bin: token ids must be integers in \[0, 2\*\*32\)"):
        shards.write_shard(tmp_path / "d.bin", np.array([-1]))


@pytest.mark.parametrize("damage,msg", [
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\0\0", "longer"),
    (lambda b: b"NOTMAGIC" + b[8:], "not a token shard"),
    (lambda b: b[:8] + struct.pack("<I", 9) + b[12:], "version"),
    (lambda b: b[:12] + struct.pack("<I", 3) + b[16:], "width"),
    (lambda b: b[:20], "truncated header"),
])
def test_bad_shards_raise_shard_error_naming_file(tmp_path, damage, msg):
    path = tmp_path / "bad.bin"
    shards.write_shard(path, np.arange(10, dtype=np.uint16))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(shards.ShardError, match=msg) as e:
        shards.read_shard(path)
    assert str(path) in str(e.value) and isinstance(e.value, ValueError)


def test_crash_mid_write_leaves_no_shard(tmp_path, monkeypatch):
    path = tmp_path / "s.bin"
    shards.write_shard(path, np.arange(3, dtype=np.uint16))

    def disk_full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        shards.write_shard(path, np.arange(100, dtype=np.uint16))  # old shard must survive intact
    with pytest.raises(OSError):
        shards.write_shard(tmp_path / "new.bin", np.arange(100, dtype=np.uint16))
    assert np.array_equal(shards.read_shard(path), np.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.bin"]


# ---------------------------------------------------------------- meta.json
def test_load_meta_missing_folder_or_shards(tmp_path, prepared):
    with pytest.raises(shards.ShardError, match=f"{tmp_path}: no meta.json; prepare the data first"):
        shards.load_meta(tmp_path)
    out, _ = prepared
    (out / "train_000001.bin").unlink()
    with pytest.raises(shards.ShardError, match=r"missing shards \['train_000001.bin'\]"):
        shards.load_meta(out)


@pytest.mark.parametrize("edit", [
    lambda m: [m],  # a JSON list
    lambda m: {k: v for k, v in m.items() if k != "vocab_size"},
    lambda m: {**m, "vocab_size": "512"},
    lambda m: {**m, "encoding": None},
    lambda m: {**m, "splits": []},
    lambda m: {**m, "splits": {"val": m["splits"]["val"]}},  # no train split
    lambda m: {**m, "splits": {**m["splits"], "train": {**m["splits"]["train"], "shards": "train_000000.bin"}}},
    lambda m: {**m, "splits": {**m["splits"], "train": {**m["splits"]["train"], "shards": [0]}}},
    lambda m: {**m, "splits": {**m["splits"], "train": {**m["splits"]["train"], "shards": ["../escape.bin"]}}},
    lambda m: {**m, "splits": {**m["splits"], "val": {"shards": []}}},  # no token count
])
def test_malformed_meta_is_a_shard_error_naming_the_file(prepared, edit):
    out, _ = prepared
    meta = json.loads((out / "meta.json").read_text())
    shards.write_shard(out.parent / "escape.bin", np.arange(3))  # exists, but outside the folder
    (out / "meta.json").write_text(json.dumps(edit(meta)))
    with pytest.raises(shards.ShardError, match=f"^{out / 'meta.json'}: malformed: needs a positive vocab_size"):
        shards.load_meta(out)


@pytest.mark.parametrize("raw", [b"{", b"", b'{"vocab_size": 5\xff}'])
def test_meta_that_is_not_json(tmp_path, raw):
    (tmp_path / "meta.json").write_bytes(raw)
    with pytest.raises(shards.ShardError, match=f"^{tmp_path / 'meta.json'}: not valid JSON"):
        shards.load_meta(tmp_path)


# ---------------------------------------------------------------- meta.json against the shards' headers
GPT2_512 = {"encoding": "gpt2", "vocab_size": 512, "reserve_zero": True, "reserve_ones": True}  # prepare_data's


@pytest.fixture
def two_vocabs(tmp_path):
    """The same text prepared at vocab_size 512 and 1024: {vocab_size: folder}."""
    (tmp_path / "text.txt").write_text(words(200))
    folders = {v: tmp_path / f"v{v}" for v in (512, 1024)}
    for v, folder in folders.items():
        prepare([str(tmp_path / "text.txt")], str(folder), vocab_size=v, workers=1, progress=False)
    return folders


def test_headers_record_the_tokenizer(two_vocabs):
    meta = json.loads((two_vocabs[512] / "meta.json").read_text())
    raw = (two_vocabs[512] / "train_000000.bin").read_bytes()
    tag = shards.tokenizer_tag(GPT2_512)
    assert struct.unpack("<IIQII", raw[8:32]) == (1, 2, meta["splits"]["train"]["tokens"], 512, tag)
    assert shards.load_meta(two_vocabs[512]) == meta


def train_error(folder, tmp_path, capsys):
    """train.py's exit code, stdout and stderr on `folder`, run as `python train.py` runs it."""
    import train

    code = run_main(train.main, ["--data_dir", str(folder), "--out_dir", str(tmp_path / "out"), "--device", "cpu"])
    out = capsys.readouterr()
    assert not (tmp_path / "out").exists()  # refused before any work
    return code, out.out, out.err


def test_meta_json_copied_from_another_preparation_is_refused(two_vocabs, tmp_path, capsys):
    data = two_vocabs[512]
    (data / "meta.json").write_bytes((two_vocabs[1024] / "meta.json").read_bytes())
    assert train_error(data, tmp_path, capsys) == (1, "", (
        f"error: {data / 'train_000000.bin'}: its header says vocab_size 512, but {data / 'meta.json'} says 1024: "
        "the two come from different preparations; prepare the folder again\n"))


def test_edited_meta_json_is_refused_by_train_and_tools(two_vocabs, tmp_path, capsys):
    from tools import compare

    data = two_vocabs[512]
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "vocab_size": 1024}))
    line = (f"error: {data / 'train_000000.bin'}: its header says vocab_size 512, but {data / 'meta.json'} says "
            "1024: the two come from different preparations; prepare the folder again\n")
    assert train_error(data, tmp_path, capsys) == (1, "", line)
    assert run_main(compare.main, ["--data", str(data), "--out", str(tmp_path / "study")]) == 1
    assert capsys.readouterr().err == line


@pytest.mark.parametrize("edit,said", [
    (lambda m: {**m, "reserve_zero": False},
     "its header says tokenizer gpt2 at vocab_size 512, reserve_zero True, reserve_ones True, but {meta} says "
     "gpt2 at vocab_size 512, reserve_zero False, reserve_ones True"),
    (lambda m: {**m, "encoding": "r50k_base"},
     "its header says tokenizer gpt2 at vocab_size 512, reserve_zero True, reserve_ones True, but {meta} says "
     "r50k_base at vocab_size 512, reserve_zero True, reserve_ones True"),
    (lambda m: {**m, "dtype": "uint32"}, "its header says 2-byte tokens, but {meta} says dtype uint32"),
])
def test_a_shard_whose_header_disagrees_is_named_with_both_values(two_vocabs, edit, said):
    data = two_vocabs[512]
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps(edit(meta)))
    with pytest.raises(ShardError) as e:
        shards.load_meta(data)
    assert str(e.value) == (f"{data / 'train_000000.bin'}: {said.format(meta=data / 'meta.json')}: the two come from "
                            "different preparations; prepare the folder again")


def test_a_tokenizer_tiktoken_does_not_know_is_named_by_its_tag(two_vocabs):
    shard = two_vocabs[512] / "train_000000.bin"
    raw = shard.read_bytes()
    shard.write_bytes(raw[:28] + struct.pack("<I", 0xDEADBEEF) + raw[32:])  # an encoding of some other code
    with pytest.raises(ShardError) as e:
        shards.load_meta(two_vocabs[512])
    assert str(e.value) == (f"{shard}: its header says tokenizer tag deadbeef (an encoding tiktoken does not know "
                            f"here), but {two_vocabs[512] / 'meta.json'} says gpt2 at vocab_size 512, reserve_zero "
                            "True, reserve_ones True: the two come from different preparations; prepare the folder "
                            "again")


def test_a_shard_of_another_vocab_among_good_ones(two_vocabs):
    data = two_vocabs[512]
    (data / "val_000000.bin").write_bytes((two_vocabs[1024] / "val_000000.bin").read_bytes())
    with pytest.raises(ShardError, match=f"^{data / 'val_000000.bin'}: its header says vocab_size 1024, but "
                                         f"{data / 'meta.json'} says 512: "):
        shards.load_meta(data)


def test_token_counts_that_disagree_with_the_headers(two_vocabs):
    data = two_vocabs[512]
    meta = json.loads((data / "meta.json").read_text())
    n = meta["splits"]["val"]["tokens"]
    meta["splits"]["val"]["tokens"] += 1
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ShardError) as e:
        shards.load_meta(data)
    assert str(e.value) == (f"{data / 'meta.json'}: says the val split holds {n + 1:,} tokens, but the headers of its "
                            f"shards say {n:,}: the two come from different preparations; prepare the folder again")


def test_shards_written_before_headers_recorded_the_tokenizer_still_load(two_vocabs):
    data = two_vocabs[512]
    for name in ("train_000000.bin", "val_000000.bin"):
        raw = (data / name).read_bytes()
        (data / name).write_bytes(raw[:24] + bytes(8) + raw[32:])  # the header as it was: 8 zero bytes
    meta = json.loads((data / "meta.json").read_text())
    assert shards.load_meta(data) == meta


# ---------------------------------------------------------------- the windows training reads
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


@pytest.mark.parametrize("reserve_zero", [False, True])
def test_deep_binary_model_on_windows_that_start_with_the_formerly_zero_coded_token(tmp_path, reserve_zero):
    """GPT-2's id 0 is "!": its code is all zeros, a window that starts with it keeps a zero residual
    stream in a bias-free model, and a deep binary model diverges on it (docs/zero-code.md). With id 0
    reserved for the NUL byte (prepare_data.py's default), "!" has a nonzero code and the same training
    stays finite. Every window here starts with "!"; 32 layers x 32, lr 2e-3, train.py's own loop."""
    enc = get_tokenizer("gpt2", 512, reserve_zero)
    bang, = enc.encode_ordinary("!")
    assert bang == (188 if reserve_zero else 0)
    T, n = 32, 64
    body = enc.encode_ordinary(("the quick brown fox, jumps over the lazy dog. " * 400).replace("!", "."))
    ids = np.array([t for k in range(n) for t in [bang, *body[k * (T - 1):(k + 1) * (T - 1)]]] + [bang])
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        write_shard(data / f"{split}_000000.bin", ids)
    (data / "meta.json").write_text(json.dumps({
        "version": 1, "encoding": "gpt2", "vocab_size": 512, "eot_token": 511, "reserve_zero": reserve_zero,
        "dtype": "uint16",
        "splits": {s: {"shards": [f"{s}_000000.bin"], "tokens": len(ids)} for s in ("train", "val")}}))
    cfg = config(data, tmp_path / "out", n_layer=32, n_embd=32, n_head=2, block_size=T, batch_size=8, max_steps=20,
                 lr=2e-3, min_lr=2e-4, warmup_steps=2, eval_interval=0, save_interval=0, seed=0, bias=False,
                 input="binary")
    if reserve_zero:
        assert train.train(cfg)["steps"] == 20
        assert all(math.isfinite(e["grad_norm"]) for e in train_log(tmp_path / "out"))
    else:
        with pytest.raises(FloatingPointError, match="non-finite gradient norm"):
            train.train(cfg)


def test_windows_that_start_with_a_constant_input_are_counted_before_the_first_step(tmp_path, capsys):
    """Data prepared before end-of-text left the all-ones code (--no-reserve_ones, many short documents):
    before the first step train.py says how many training windows start with a token a bias-free binary
    model reads as a constant vector, and the command that prepares the data again; that command, run as
    printed, gives data with no such window. A learned input or a model with biases: nothing to say."""
    docs = tmp_path / "docs.jsonl"
    letters = [{"text": f"Letter {i}. " + "My dear sister, the ball was long. " * (i % 4)} for i in range(400)]
    docs.write_text("".join(json.dumps(letter) + "\n" for letter in letters))
    data, out = tmp_path / "data", tmp_path / "out"
    assert run_main(prepare_data.main, [str(docs), "--out", str(data), "--vocab_size", "512", "--workers", "1",
                                        "--no-reserve_ones"]) == 0
    tokens = shards.read_shard(data / "train_000000.bin")
    n = (len(tokens) - 1) // 32
    count = int((tokens[: n * 32 : 32] == 511).sum())  # windows of 33 tokens at stride 32 (tiny: block_size 32)
    assert count > 10
    capsys.readouterr()
    assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0)) == 0
    command = f"python prepare_data.py {docs} --out {data} --encoding gpt2 --vocab_size 512 --overwrite"
    assert capsys.readouterr().err == (
        f"warning: {count:,} of {n:,} training windows start with token id 511 (end-of-text), which this model (no "
        "biases, binary input) reads as a constant vector: a deep model diverges on them (docs/zero-code.md); prepare "
        f"the data with the ids that keep text off them: {command}\n")
    for quiet in (dict(input="learned"), dict(bias=True)):
        assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0, overwrite=True, **quiet)) == 0
        assert capsys.readouterr().err == ""
    assert run_main(prepare_data.main, [*command.split()[2:], "--workers", "1"]) == 0
    assert shards.load_meta(data)["eot_token"] == 187
    capsys.readouterr()
    assert run_main(train.main, flags(data, out, max_steps=1, eval_interval=0, overwrite=True, input="affine")) == 0
    assert capsys.readouterr().err == ""


def test_the_re_prepare_command_names_the_recorded_source_or_says_it_is_unknown(tmp_path, capsys, monkeypatch):
    """Data prepared from a relative path in another folder (by the real command line there): the command train.py
    prints names the file as meta.json records it, a path from any folder; data whose meta.json records no inputs
    (prepared before it did, from a relative path) gets a command that says its inputs are unknown."""
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"Letter {i}. " + "My dear sister. " * (i % 3)})
                                                 + "\n" for i in range(300)))
    made = subprocess.run([sys.executable, str(ROOT / "prepare_data.py"), "docs.jsonl", "--out", "data", "--vocab_size",
                           "512", "--workers", "1", "--no-reserve_ones"], cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    data, meta_path = tmp_path / "data", tmp_path / "data" / "meta.json"
    assert json.loads(meta_path.read_text())["inputs"] == [str(tmp_path / "docs.jsonl")]
    monkeypatch.chdir(ROOT)
    fix = "prepare the data with the ids that keep text off them: python prepare_data.py"
    for inputs in (str(tmp_path / "docs.jsonl"), "'<INPUTS: unknown, its meta.json does not record them>'"):
        capsys.readouterr()
        assert run_main(train.main, flags(data, tmp_path / "out", max_steps=1, eval_interval=0, overwrite=True)) == 0
        assert f"{fix} {inputs} --out {data} --encoding gpt2 --vocab_size 512 --overwrite\n" in capsys.readouterr().err
        old = {k: v for k, v in json.loads(meta_path.read_text()).items() if k != "inputs"}
        meta_path.write_text(json.dumps({**old, "sources": ["docs.jsonl"]}))
