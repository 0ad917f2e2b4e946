"""bincode_gpt/tokenizer.py: its cuts, its decoding (token by token, an id past it, old checkpoints' plain ids), and
the memory a cut holds.

Every tokenizer cut, end to end: each shipped encoding at the sizes where encodings differ, through the
real commands: prepare_data.py on a short text -> train.py one step -> sample.py a few tokens ->
tools.convert native2hf -> the exported tokenizer.json encodes and decodes as tiktoken -> hf2native.

A size either works all the way or is refused by prepare_data.py with one `error:` line naming the sizes
that work. The edges: the smallest cut (the 256 bytes + end-of-text), powers of two (end-of-text on the
all-ones id moves to 0xFF's), one either side of every special token and hole (GPT-2's end-of-text at
50,256; cl100k_base's hole at 100,256, its specials at 100,257-100,260 and 100,276, its holes at
100,261-100,275), the full size, one past it, and uncut. The table runs in-process through each script's
main(argv) (the cl100k heads are 100k x 32: a tiny width), but for two cases (REAL), a process per command.
The export needs tokenizers and safetensors (requirements-extras.txt): its tests skip without them."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

import prepare_data
import sample
import train
from bincode_gpt import tokenizer
from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.exits import run_main
from bincode_gpt.files import LOCK_NAME
from bincode_gpt.shards import read_shard
from bincode_gpt.tokenizer import (
    TiktokenText,
    all_ones_id,
    constant_ids,
    encoding_parts,
    get_tokenizer,
    load_text_codec,
    mergeable_ranks,
    token_ids,
)
from tools import convert

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak. We're told it "
        "1234567 times: café, naïve — 東京 😀!\n  indented\tline with  two  spaces\r\nand <|endoftext|> or "
        "<|fim_prefix|> are text here.\n") * 2
PROMPT = "Speak, speak."
TRAIN = ["--preset", "tiny", "--n_layer", "1", "--n_head", "1", "--n_embd", "32", "--block_size", "16",
         "--batch_size", "1", "--max_steps", "1", "--eval_interval", "0", "--device", "cpu"]
GPT2_SIZES = [257, 511, 512, 513, 50256, 50257, None]  # 511-513: either side of the power of two
REFUSED = {  # encoding -> (sizes refused, the refusal, which names the sizes that work)
    "gpt2": ({256, 50258}, "vocab_size must be in [257, 50257] for gpt2"),
    "r50k_base": ({256, 50258}, "vocab_size must be in [257, 50257] for r50k_base"),
    "cl100k_base": ({256, 100258, 100261, 100262, 100275, 100276, 100278},
                    "vocab_size must be in [257, 100257] or 100277 for cl100k_base"),
}
WORKS = {"gpt2": GPT2_SIZES, "r50k_base": [257, 512, 50256, 50257, None],  # GPT-2's ranks, under its own name
         "cl100k_base": [257, 65536, 100256, 100257, 100277, None]}
FULL = {"gpt2": 50257, "r50k_base": 50257, "cl100k_base": 100277}
CASES = [(e, v) for e, sizes in WORKS.items() for v in sizes] + [(e, v) for e, (sizes, _) in REFUSED.items()
                                                                   for v in sorted(sizes)]
REAL = {("cl100k_base", 100277), ("cl100k_base", 100276)}  # as a user types them: a process per command
SCRIPTS = {"prepare_data": (prepare_data.main, ["prepare_data.py"]), "train": (train.main, ["train.py"]),
           "sample": (sample.main, ["sample.py"]), "convert": (convert.main, ["-m", "tools.convert"])}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def runner(real, capsys):
    """run(script, *argv) -> (exit code, stdout, stderr): in this process through the script's main(argv), by
    run_main as its command line runs it, or, `real`, as a process of its own."""
    def run(script, *argv):
        main, command = SCRIPTS[script]
        argv = [str(a) for a in argv]
        if real:
            done = subprocess.run([sys.executable, *command, *argv], cwd=ROOT, capture_output=True, text=True,
                                  timeout=600)
            return done.returncode, done.stdout, done.stderr
        code = run_main(main, argv)
        return (code, *capsys.readouterr())
    return run


def size_args(vocab_size):
    return [] if vocab_size is None else ["--vocab_size", vocab_size]


def prepared(folder):
    """What prepare_data.py wrote in `folder`: file name -> bytes (its lock file aside)."""
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.name != LOCK_NAME}


def check_ids(ids, encoding, meta):
    """The cut's ids are tiktoken's, holes and all, and `ids` (TEXT, specials allowed) are the encoding's own
    tokens below the cut, renumbered only where get_tokenizer reserves ids: each non-special id's bytes are a
    token whose rank in the uncut encoding is below the cut (below V - 1, end-of-text's), with that id unless
    it is one of the moved ones."""
    plain = tiktoken.get_encoding(encoding)
    V, eot = meta["vocab_size"], meta["eot_token"]
    full = V == plain.n_vocab
    moved = {0, plain.encode_single_token(b"\x00")}
    if all_ones_id(V) < V:
        moved |= {all_ones_id(V), plain.encode_single_token(b"\xff")}
    special_ids = set(plain._special_tokens.values()) if full else {eot}
    cut = get_tokenizer(encoding, V, meta["reserve_zero"], meta["reserve_ones"])
    assert token_ids(cut) == ({*plain._mergeable_ranks.values(), *plain._special_tokens.values()} if full
                              else set(range(V)))  # the holes of a full size are no ids; a smaller cut has none
    assert max(ids) < V and eot in ids
    for i in ids:
        if i not in special_ids:
            token = cut.decode_single_token_bytes(i)
            rank = plain.encode_single_token(token)
            assert rank < (V if full else V - 1) and (rank == i or {rank, i} <= moved), (i, token, rank)


@pytest.mark.parametrize("encoding, vocab_size", CASES, ids=[f"{e}-{v or 'uncut'}" for e, v in CASES])
def test_cut_end_to_end(encoding, vocab_size, text_file, tmp_path, capsys):
    run = runner((encoding, vocab_size) in REAL, capsys)
    data, out, hf, back = (tmp_path / name for name in ("data", "out", "hf", "back"))
    code, _, err = run("prepare_data", text_file, "--out", data, "--encoding", encoding, *size_args(vocab_size),
                       "--workers", 1)
    if vocab_size in REFUSED[encoding][0]:  # refused up front: one line naming the sizes that work, nothing written
        assert (code, err) == (1, f"error: {REFUSED[encoding][1]}, got {vocab_size}\n") and not data.exists()
        return
    assert code == 0, err
    meta = json.loads((data / "meta.json").read_text())
    assert meta["vocab_size"] == (vocab_size or FULL[encoding])
    if vocab_size is None:  # uncut: the very files of the full-size cut, whose case runs the commands that read them
        assert run("prepare_data", text_file, "--out", tmp_path / "full", "--encoding", encoding,
                   "--vocab_size", FULL[encoding], "--workers", 1)[0] == 0
        assert prepared(data) == prepared(tmp_path / "full") and len(prepared(data)) == 3  # meta.json and 2 shards
        return
    pytest.importorskip("tokenizers", reason="the export writes tokenizer.json (pip install tokenizers)")
    pytest.importorskip("safetensors", reason="the export writes model.safetensors (pip install safetensors)")

    code, stdout, err = run("train", "--data_dir", data, "--out_dir", out, *TRAIN)
    assert code == 0 and "done: step 1" in stdout, err
    code, stdout, err = run("sample", "--ckpt", out, "--prompt", PROMPT, "--max_new_tokens", 4, "--device", "cpu",
                            "--temperature", 2, "--seed", 1)
    assert code == 0 and stdout.startswith(PROMPT), err

    code, _, err = run("convert", "native2hf", out, hf)
    assert (code, err) == (0, ""), err
    from tokenizers import Tokenizer
    exported = Tokenizer.from_file(str(hf / "tokenizer.json"))
    enc = get_tokenizer(encoding, meta["vocab_size"], meta["reserve_zero"], meta["reserve_ones"])  # sample.py's
    ids = enc.encode(TEXT, allowed_special="all")
    assert exported.encode(TEXT, add_special_tokens=False).ids == ids
    assert exported.decode(ids, skip_special_tokens=False) == TEXT
    assert set(exported.get_vocab(with_added_tokens=True).values()) == token_ids(enc)  # holes and all
    check_ids(ids, encoding, meta)
    config = json.loads((hf / "config.json").read_text())
    assert config["vocab_size"] == meta["vocab_size"] and config["eos_token_id"] == meta["eot_token"] == enc.eot_token

    code, _, err = run("convert", "hf2native", hf, back)
    assert (code, err) == (0, ""), err
    model, ckpt = load_checkpoint(str(out / "ckpt.pt"))
    model_back, ckpt_back = load_checkpoint(str(back / "ckpt.pt"))
    assert ckpt_back["tokenizer"] == ckpt["tokenizer"] and model_back.config == model.config
    state = model.state_dict()
    assert all(torch.equal(t, state[n]) for n, t in model_back.state_dict().items())


SHIPPED = [(e, v) for e, sizes in WORKS.items() for v in sizes]


@pytest.mark.parametrize("encoding, vocab_size", SHIPPED, ids=[f"{e}-{v or 'uncut'}" for e, v in SHIPPED])
def test_no_text_puts_a_constant_code_in_a_shard(encoding, vocab_size, tmp_path):
    """Text holding U+0000, U+00FF (whose UTF-8 holds no 0xFF byte) and other control characters: no token id
    whose K-bit code is constant (0, and 2^K - 1 where the cut holds it) in any shard of any shipped cut. Those ids
    hold the NUL byte, which prepare_data.py drops from text, and the 0xFF byte, which UTF-8 never holds."""
    path = tmp_path / "t.txt"
    path.write_text((TEXT + "a NUL \0, two \0\0, ÿ, \x01\x1f\x7f and one last\0") * 3)
    meta = prepare_data.prepare([str(path)], tmp_path / "data", encoding=encoding, vocab_size=vocab_size, workers=1,
                                progress=False)
    shards = [s for split in meta["splits"].values() for s in split["shards"]]
    tokens = np.concatenate([read_shard(tmp_path / "data" / s) for s in shards])
    constant = constant_ids(meta["vocab_size"])
    assert not np.isin(tokens, constant).any() and meta["dropped_nul"] == 12 and "constant_code_tokens" not in meta
    cut = get_tokenizer(encoding, meta["vocab_size"], True, True)
    assert [cut.decode_single_token_bytes(i) for i in constant] == [b"\x00", b"\xff"][:len(constant)]


def test_model_wider_than_its_tokenizer(text_file, tmp_path, capsys):
    """train.py --vocab_size past the data's (as nanoGPT pads GPT-2's 50,257 to 50,304): sample.py draws only
    ids the tokenizer decodes; the export's tokenizer.json keeps the tokenizer's ids, config.json the model's."""
    pytest.importorskip("tokenizers", reason="the export writes tokenizer.json (pip install tokenizers)")
    pytest.importorskip("safetensors", reason="the export writes model.safetensors (pip install safetensors)")
    run = runner(False, capsys)
    data, out, hf = tmp_path / "data", tmp_path / "out", tmp_path / "hf"
    assert run("prepare_data", text_file, "--out", data, "--vocab_size", 512, "--workers", 1)[0] == 0
    code, _, err = run("train", "--data_dir", data, "--out_dir", out, *TRAIN, "--vocab_size", 1024)
    assert code == 0, err
    code, stdout, err = run("sample", "--ckpt", out, "--prompt", PROMPT, "--max_new_tokens", 20, "--device", "cpu",
                            "--temperature", 5, "--seed", 1)
    assert code == 0 and stdout.startswith(PROMPT), err
    assert run("convert", "native2hf", out, hf)[0] == 0
    from tokenizers import Tokenizer
    assert json.loads((hf / "config.json").read_text())["vocab_size"] == 1024
    assert Tokenizer.from_file(str(hf / "tokenizer.json")).get_vocab_size(with_added_tokens=True) == 512


@pytest.fixture
def holey(monkeypatch):
    """GPT-2's ranks from id 300 on shifted up one, end-of-text at 300 amid them, as p50k_base has it at 50,256
    (not in the offline cache here): an encoding with a hole below a cut. get_tokenizer's cache is emptied around."""
    parts = tokenizer.encoding_parts("gpt2")
    ranks = {token: r + (r >= 300) for token, r in parts["mergeable_ranks"].items()}
    monkeypatch.setattr(tokenizer, "encoding_parts", lambda name: {**parts, "mergeable_ranks": dict(ranks),
                                                                   "special_tokens": {"<|endoftext|>": 300}})
    get_tokenizer.cache_clear()
    yield
    get_tokenizer.cache_clear()


@pytest.mark.parametrize("vocab_size", [1000, 50257, 50258])  # a cut past the hole, the full size, the largest cut
def test_a_hole_below_the_cut(holey, vocab_size):
    pytest.importorskip("tokenizers", reason="the export writes tokenizer.json (pip install tokenizers)")
    enc = get_tokenizer("gpt2", vocab_size, True, True)
    holes = set() if vocab_size == 50257 else {300}  # the full size: end-of-text fills it; a cut moves it to V - 1
    assert enc.n_vocab == vocab_size and token_ids(enc) == set(range(vocab_size)) - holes
    assert enc.eot_token == (300 if vocab_size == 50257 else vocab_size - 1)
    ids = enc.encode(TEXT, allowed_special="all")
    exported = convert.tiktoken_to_hf(enc)
    assert exported.encode(TEXT, add_special_tokens=False).ids == ids
    assert exported.decode(ids, skip_special_tokens=False) == TEXT
    if holes:
        with pytest.raises(ValueError,
                           match=f"^the model produced token id 300, but its tokenizer has {vocab_size:,} "):
            TiktokenText(enc).decoder()(300)
    with pytest.raises(ValueError, match=r"^vocab_size must be in \[257, 50258\] for gpt2, got 50259"):
        get_tokenizer("gpt2", 50259, True, True)


def test_an_id_past_the_tokenizer_is_a_clear_error():
    """A model with more ids than its tokenizer (a padded vocabulary, a mismatched checkpoint) can emit
    an id nothing decodes: one clear error, not tiktoken's KeyError."""
    codec = TiktokenText(tiktoken.get_encoding("gpt2"))
    with pytest.raises(ValueError, match="^the model produced token id 50300, but its tokenizer has 50,257 tokens"):
        codec.decoder()(50300)


def test_streams_pieces_and_utf8():
    enc = tiktoken.get_encoding("gpt2")
    codec = TiktokenText(enc)
    text = "naïve 日本語 🎉 — done"
    step = codec.decoder()
    pieces = [step(i) for i in enc.encode(text)] + [step()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert sum(bool(p) for p in pieces) > 5  # text arrives token by token, not at the end


def test_a_checkpoint_entry_without_reserve_zero_decodes_the_plain_ids():
    """Checkpoints written before prepare_data.py reserved id 0 name no reserve_zero: their ids are the
    encoding's own ("!" = 0); new ones say reserve_zero, "!" = 188 and NUL = 0."""
    old = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512}
    assert load_text_codec({"tokenizer": old}, "old.pt").encode("!\x00") == [0, 188]
    assert load_text_codec({"tokenizer": {**old, "reserve_zero": True}}, "new.pt").encode("!\x00") == [188, 0]


def test_a_cut_tokenizer_holds_no_uncut_encoding():
    """Issue 35: sample.py on a cut held tiktoken's cached uncut encoding too (~57 MiB for cl100k_base)."""
    code = ("import tiktoken.registry; from bincode_gpt import tokenizer; "
            "tokenizer.get_tokenizer('gpt2', 4096, True, True); print(sorted(tiktoken.registry.ENCODINGS))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "[]\n", "")


def test_a_cut_holds_its_ranks_once():
    """The cut's ranks live in its encoder alone (tiktoken's Python copy, ~7 MB at 65,536 tokens, kept only to pickle
    it, goes): tokenizer.mergeable_ranks reads them back, and every id below the cut's size decodes."""
    plain, reserved = get_tokenizer("gpt2", 4096), get_tokenizer("gpt2", 4096, True, True)
    assert plain._mergeable_ranks is None and reserved._mergeable_ranks is None
    assert mergeable_ranks(plain) == {b: r for b, r in encoding_parts("gpt2")["mergeable_ranks"].items() if r < 4095}
    ranks = mergeable_ranks(reserved)
    assert sorted(ranks.values()) == [i for i in range(4096) if i != reserved.eot_token] and ranks[b"\x00"] == 0
    assert all(reserved.decode_single_token_bytes(i) == b for b, i in ranks.items()) and ranks[b"\xff"] == 4095
    assert TiktokenText(reserved).token_ids() == set(range(4096))
    assert TiktokenText(get_tokenizer("gpt2")).token_ids() == set(range(50257))  # uncut: tiktoken's own, ranks kept


@pytest.mark.parametrize("cut", [None, 4096], ids=["uncut", "cut"])
def test_an_encoding_is_read_once(cut, monkeypatch):
    """A sampling start pays for reading an encoding's ranks (~0.2 s for GPT-2's) once: the uncut encoding is built
    from the parts get_tokenizer read, not read again by tiktoken.get_encoding; and it is tiktoken's own."""
    tiktoken.list_encoding_names()  # the constructors found
    constructor = tiktoken.registry.ENCODING_CONSTRUCTORS["gpt2"]
    calls = []
    monkeypatch.setitem(tiktoken.registry.ENCODING_CONSTRUCTORS, "gpt2", lambda: calls.append(1) or constructor())
    get_tokenizer.cache_clear()
    try:
        enc = get_tokenizer("gpt2", cut)
    finally:
        get_tokenizer.cache_clear()
    assert len(calls) == 1
    plain = tiktoken.get_encoding("gpt2")
    text = "Hello, world! \u00e9t\u00e9 <|endoftext|> 12345"
    assert enc.n_vocab == (cut or plain.n_vocab) and enc.eot_token == (cut or plain.n_vocab) - 1
    ids = enc.encode(text, allowed_special="all")
    assert enc.decode(ids) == text
    if cut is None:
        assert enc.name == plain.name and ids == plain.encode(text, allowed_special="all")
