"""Tests for prepare_data.py: shard format, tokenizer cut, splits, determinism, inputs, and that no bad
input, fault or interrupt loses prepared data or ends in anything but one clean line."""
import importlib.util, io, json, os, signal, struct, subprocess, sys, time, types, urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository's
SHARED = ROOT.parent / "shared"
if (SHARED / "tiktoken-cache").is_dir():  # offline: use the checked-in BPE files unless CI already chose
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken-cache"))

import prepare_data as P  # noqa: E402
from bincode_gpt import inputs, shards, workers
from bincode_gpt.files import LOCK_NAME  # noqa: E402
from bincode_gpt.exits import run_main
from bincode_gpt.tokenizer import get_tokenizer  # noqa: E402

SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"
needs_corpus = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"corpus not found at {SHAKESPEARE}")


@pytest.fixture(scope="module")
def gpt2():
    return get_tokenizer("gpt2")


@pytest.fixture(scope="module")
def shakespeare():
    if not SHAKESPEARE.is_file():
        pytest.skip(f"corpus not found at {SHAKESPEARE}")
    return SHAKESPEARE.read_text()


def words(n, seed=0, vocab=("the", "king", "queen", "café", "naïve", "over", "hill", "42", "—", "a")):
    """Generated text for tests where the real corpus isn't essential."""
    rng = np.random.default_rng(seed)
    lines = (" ".join(rng.choice(vocab, 8)) + rng.choice([".", ",", "", "  "]) for _ in range(n))
    return "\n".join(lines) + "\n"


def shard_tokens(out, meta, split):
    return np.concatenate([shards.read_shard(out / s) for s in meta["splits"][split]["shards"]] or [np.zeros(0, int)])


def main(capsys, *argv):
    """prepare_data's command line in this process, as `python prepare_data.py` runs it -> (rc, stderr)."""
    rc = run_main(P.main, [str(a) for a in argv])
    return rc, capsys.readouterr().err


def cli(*argv, **kwargs):
    """The real command line, in a subprocess."""
    return subprocess.run([sys.executable, str(ROOT / "prepare_data.py"), *map(str, argv)],
                          capture_output=True, text=True, timeout=120, **kwargs)


def snapshot(folder):
    """{name: bytes} of a folder's files, but the writer lock's, which holds the pid of the last writer."""
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.name != LOCK_NAME}


@pytest.fixture
def prepared(tmp_path):
    """A folder holding prepared data (several shards), and its bytes."""
    (tmp_path / "old.txt").write_text(words(400))
    P.prepare([str(tmp_path / "old.txt")], tmp_path / "out", shard_tokens=1000, workers=1, progress=False)
    return tmp_path / "out", snapshot(tmp_path / "out")


# ---------------------------------------------------------------- shard format
@pytest.mark.parametrize("dtype,width", [(np.uint16, 2), (np.uint32, 4)])
def test_shard_round_trip_and_header(tmp_path, dtype, width):
    tokens = np.array([0, 1, 255, 50256, np.iinfo(dtype).max], dtype=dtype)
    path = tmp_path / "s.bin"
    shards.write_shard(path, tokens)
    raw = path.read_bytes()
    assert raw[:8] == b"BCGPTTOK"
    assert struct.unpack("<IIQ", raw[8:24]) == (1, width, 5) and raw[24:32] == bytes(8)
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


# ---------------------------------------------------------------- tokenizer
def test_cut_tokenizer(gpt2, shakespeare):
    cut = get_tokenizer("gpt2", 8192)
    assert cut.n_vocab == 8192 and cut.eot_token == 8191
    low = " the king and the man of the house said that it is good"
    ids = gpt2.encode_ordinary(low)
    assert max(ids) < 8191 and cut.encode_ordinary(low) == ids  # low ranks are untouched
    text = shakespeare[:20000]
    ids = cut.encode_ordinary(text)
    assert max(ids) < 8191 and cut.decode(ids) == text
    assert len(ids) > len(gpt2.encode_ordinary(text))  # fewer merges -> more tokens
    assert cut.decode([8191]) == "<|endoftext|>"
    assert get_tokenizer("gpt2", 50257) is gpt2  # the full size is the encoding itself
    smallest = get_tokenizer("gpt2", 257)
    ids = smallest.encode_ordinary("héllo")  # bytes only: one token per UTF-8 byte
    assert len(ids) == len("héllo".encode()) and max(ids) < 256 and smallest.decode(ids) == "héllo"


@pytest.mark.parametrize("name,size,msg", [("gpt2", 256, "vocab_size"), ("gpt2", 50258, "vocab_size"),
                                           ("gpt3", None, "cl100k_base")])
def test_tokenizer_errors(name, size, msg):
    with pytest.raises(ValueError, match=msg):
        get_tokenizer(name, size)


@pytest.mark.parametrize("encoding, vocab_size", [("gpt2", 512), ("gpt2", 8192), ("cl100k_base", 65536)])
def test_reserve_ones_moves_end_of_text_off_the_all_ones_id(encoding, vocab_size):
    """In a cut to a power of two end-of-text has id 2^K - 1, the all-ones code: reserve_ones gives that
    id to the byte 0xFF, which UTF-8 text never holds, and end-of-text takes 0xFF's id (187). No merge
    changes, so real text encodes to the same tokens, renumbered."""
    old, new = (get_tokenizer(encoding, vocab_size, reserve_zero=True, reserve_ones=r) for r in (False, True))
    ones = vocab_size - 1
    assert (old.eot_token, new.eot_token, new.n_vocab) == (ones, 187, vocab_size)
    assert new.decode_single_token_bytes(ones) == old.decode_single_token_bytes(187) == b"\xff"
    text = (SHAKESPEARE.read_text()[:100_000] if SHAKESPEARE.is_file() else words(2000)) + " café 日本語 ÿ \x00<|endoftext|>"
    swap = {ones: 187, 187: ones}
    tokens = new.encode(text, allowed_special="all")
    assert tokens == [swap.get(t, t) for t in old.encode(text, allowed_special="all")] and new.decode(tokens) == text
    assert tokens.count(187) == 1 and ones not in tokens


@pytest.mark.parametrize("encoding, vocab_size", [("gpt2", 1000), ("gpt2", None), ("cl100k_base", None)])
def test_reserve_ones_moves_nothing_where_the_all_ones_id_is_past_the_vocabulary(encoding, vocab_size):
    old, new = (get_tokenizer(encoding, vocab_size, reserve_zero=True, reserve_ones=r) for r in (False, True))
    text = words(300) + " café 日本語<|endoftext|>"
    assert (new.n_vocab, new.eot_token, new.name) == (old.n_vocab, old.eot_token, old.name)
    assert new.encode(text, allowed_special="all") == old.encode(text, allowed_special="all")
    assert 2 ** (new.n_vocab - 1).bit_length() - 1 >= new.n_vocab


def test_reserve_ones_is_the_default_and_older_data_keeps_its_ids(tmp_path, capsys):
    """prepare_data.py moves end-of-text off the all-ones id by default and meta.json says so;
    --no-reserve_ones writes the ids of data prepared before the option, and a meta.json or checkpoint
    entry without the key rebuilds exactly that tokenizer."""
    from bincode_gpt.tokenizer import load_text_codec, tiktoken_entry
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"Chapter {i}. " + words(3, seed=i)}) + "\n" for i in range(40)))
    args = [str(docs), "--vocab_size", "512", "--workers", "1"]
    assert main(capsys, *args, "--out", tmp_path / "new")[0] == 0
    assert main(capsys, *args, "--out", tmp_path / "old", "--no-reserve_ones")[0] == 0
    new, old = shards.load_meta(tmp_path / "new"), shards.load_meta(tmp_path / "old")
    assert (new["reserve_ones"], new["eot_token"], old["reserve_ones"], old["eot_token"]) == (True, 187, False, 511)
    a, b = (np.concatenate([shard_tokens(tmp_path / d, m, s) for s in ("train", "val")]).tolist() for d, m in (("new", new), ("old", old)))
    assert a.count(187) == b.count(511) == 40 and 511 not in a and a == [{511: 187, 187: 511}.get(t, t) for t in b]
    assert (old["constant_code_tokens"], "constant_code_tokens" in new) == (40, False)  # end-of-text on all ones
    del old["reserve_ones"]  # data prepared before the option
    (tmp_path / "old" / "meta.json").write_text(json.dumps(old))
    entry = tiktoken_entry(shards.load_meta(tmp_path / "old"))
    assert entry["reserve_ones"] is False and load_text_codec({"tokenizer": entry}, "old.pt").enc.eot_token == 511
    assert load_text_codec({"tokenizer": tiktoken_entry(new)}, "new.pt").enc.eot_token == 187


def test_pieces_tokenize_like_the_whole_text(gpt2):
    # Tricky whitespace around the cut points: trailing spaces, blank lines, CRLF.
    text = words(300) + "end  \nx\n\n\ny \r\nz\t\nw" + words(300, seed=1)
    text += SHAKESPEARE.read_text()[:30000] if SHAKESPEARE.is_file() else ""
    parts = list(workers.pieces(text, 500))
    assert len(parts) > 20 and [last for _, last in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p for p, _ in parts) == text
    assert [t for p, _ in parts for t in gpt2.encode_ordinary(p)] == gpt2.encode_ordinary(text)


# ---------------------------------------------------------------- prepare
@needs_corpus
def test_shakespeare_char_split_matches_reference(tmp_path, gpt2, shakespeare):
    meta = P.prepare([str(SHAKESPEARE)], tmp_path, workers=1, progress=False)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    # data/README.md: a 90/10 character split is 301,966 / 36,059 GPT-2 tokens; +1 EOT each.
    assert (train["tokens"], val["tokens"]) == (301_967, 36_060)
    cut = int(len(shakespeare) * 0.9)
    assert train["bytes"] == len(shakespeare[:cut].encode()) and val["bytes"] == len(shakespeare[cut:].encode())
    tokens = shard_tokens(tmp_path, meta, "val")
    assert get_tokenizer("gpt2", None, reserve_zero=True).decode(tokens.tolist()) == shakespeare[cut:] + "<|endoftext|>"
    # the same tokens as the plain encoding's, with ids 0 ("!") and 188 (NUL) swapped
    swap = {0: 188, 188: 0}
    assert [swap.get(t, t) for t in tokens.tolist()] == gpt2.encode(shakespeare[cut:]) + [gpt2.eot_token]
    assert meta["vocab_size"] == 50257 and meta["eot_token"] == 50256 and meta["dtype"] == "uint16"
    assert shards.load_meta(tmp_path) == meta


def test_named_corpus_is_downloaded_once_into_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BCGPT_CORPUS_CACHE", str(tmp_path / "cache"))
    offline = OSError("network unreachable")
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(offline))
    rc, err = main(capsys, "shakespeare", "--out", tmp_path / "a", "--workers", "1")
    assert rc == 1 and err.splitlines()[-1] == (
        f"error: could not download {inputs.SHAKESPEARE_URL} (network unreachable); save it as "
        f"{tmp_path / 'cache' / 'tinyshakespeare.txt'} by hand, or set BCGPT_CORPUS_CACHE to a folder "
        "that holds tinyshakespeare.txt")
    assert not (tmp_path / "a").exists() and not (tmp_path / "cache").exists()

    text = words(50)
    urls = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: urls.append(url) or io.BytesIO(text.encode()))
    for out in ("a", "b"):  # the second run finds it in the cache
        meta = P.prepare(["shakespeare"], tmp_path / out, workers=1, progress=False)
        assert meta["sources"] == [str(tmp_path / "cache" / "tinyshakespeare.txt")]
    assert urls == [inputs.SHAKESPEARE_URL] and os.listdir(tmp_path / "cache") == ["tinyshakespeare.txt"]
    assert (tmp_path / "cache" / "tinyshakespeare.txt").read_text() == text


def test_command_line_defaults_to_data_shakespeare(tmp_path):
    """`python prepare_data.py shakespeare` writes where train.py reads by default, from a pre-seeded cache."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tinyshakespeare.txt").write_text(words(200))
    r = cli("shakespeare", "--workers", "1", cwd=tmp_path, env={**os.environ, "BCGPT_CORPUS_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0 and r.stderr == "" and r.stdout.splitlines()[-1] == "wrote data/shakespeare", r.stderr
    meta = shards.load_meta(tmp_path / "data" / "shakespeare")
    assert meta["sources"] == [str(tmp_path / "cache" / "tinyshakespeare.txt")]
    assert meta["vocab_size"] == 512  # the mini preset's vocabulary (train.py's default), unless --vocab_size says otherwise
    assert sorted(os.listdir(tmp_path)) == ["cache", "data"] and os.listdir(tmp_path / "data") == ["shakespeare"]


def test_meta_and_shards_agree(tmp_path, gpt2):
    text = words(3000)
    src = tmp_path / "in.txt"
    src.write_text(text)
    meta = P.prepare([str(src)], tmp_path / "out", shard_tokens=5000, workers=1, progress=False)
    out = tmp_path / "out"
    for split, part in [("train", text[:int(len(text) * 0.9)]), ("val", text[int(len(text) * 0.9):])]:
        s = meta["splits"][split]
        tokens = shard_tokens(out, meta, split)
        assert len(tokens) == s["tokens"] == len(gpt2.encode_ordinary(part)) + 1
        assert s["bytes"] == len(part.encode()) and s["documents"] == 1
        assert all(len(shards.read_shard(out / f)) == 5000 for f in s["shards"][:-1])  # fixed-size shards
    assert meta["splits"]["train"]["shards"][:2] == ["train_000000.bin", "train_000001.bin"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [LOCK_NAME, "meta.json"] + meta["splits"]["train"]["shards"] + meta["splits"]["val"]["shards"])
    assert shards.load_meta(out) == meta


def test_document_split_and_cut_tokenizer(tmp_path, gpt2):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    for i in range(20):  # nested folder, sorted by path
        (docs / ("sub" if i % 2 else "") / f"d{i:02d}.txt").write_text(f"document {i}\n" + words(5, seed=i))
    (docs / "ignored.md").write_text("not an input")
    meta = P.prepare([str(docs)], tmp_path / "out", vocab_size=1000, workers=1, progress=False)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert (train["documents"], val["documents"]) == (18, 2)  # every 10th document is val
    assert len(meta["sources"]) == 20 and meta["vocab_size"] == 1000 and meta["eot_token"] == 999
    tokens = shard_tokens(tmp_path / "out", meta, "val")
    assert tokens.max() == 999 and (tokens == 999).sum() == 2
    cut = get_tokenizer("gpt2", 1000)
    texts = [Path(s).read_text() for s in meta["sources"]]
    assert cut.decode(tokens.tolist()) == "".join(t + "<|endoftext|>" for t in (texts[9], texts[19]))
    assert val["bytes"] + train["bytes"] == sum(len(t.encode()) for t in texts)


def test_cut_documents_cuts_at_line_ends_and_loses_nothing():
    docs = ["aaa\nbb\ncccc\nd", "", "x\n"]
    assert list(P.cut_documents(docs, 4)) == ["aaa\n", "bb\ncccc\n", "d", "x\n"]  # a line end at or past 4
    assert list(P.cut_documents(docs, 0)) == ["aaa\nbb\ncccc\nd", "x\n"]  # 0: as they are (empty ones dropped)
    assert "".join(P.cut_documents(docs, 1)) == "".join(docs)


def test_doc_chars_draws_val_from_every_source(tmp_path):
    """Three books, each one document: --doc_chars cuts them into pieces, every 10th val, from each book."""
    books = [tmp_path / f"{name}.txt" for name in ("a", "b", "c")]
    for i, book in enumerate(books):
        book.write_text(words(600 * (i + 1), seed=i))
    meta = P.prepare([str(b) for b in books], tmp_path / "out", doc_chars=2000, workers=1, progress=False)
    assert meta["doc_chars"] == 2000
    pieces = [(k, t) for k, b in enumerate(books) for t in P.cut_documents([b.read_text()], 2000)]
    split = [s for s, _ in P.split_documents([t for _, t in pieces], 0.1)]
    val = [(k, t) for (k, t), s in zip(pieces, split) if s == "val"]
    assert {k for k, _ in val} == {0, 1, 2} and len(pieces) > 30  # every book has val documents
    assert meta["splits"]["val"]["documents"] == len(val)
    assert meta["splits"]["val"]["bytes"] == sum(len(t.encode()) for _, t in val)
    assert "--doc_chars 2000" in shards.prepare_command(meta, "x")


def test_few_documents_are_each_cut_by_characters(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text(words(50, seed=i))
    meta = P.prepare([str(tmp_path / "*.txt")], tmp_path / "out", workers=1, progress=False)
    assert meta["splits"]["train"]["documents"] == meta["splits"]["val"]["documents"] == 3


def test_deterministic_across_runs_and_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "PIECE_CHARS", 2000)  # many batches, so two workers really share work
    for i in range(25):
        (tmp_path / f"{i:02d}.txt").write_text(words(60 + i, seed=i))
    kw = dict(shard_tokens=3000, vocab_size=4096, progress=False)
    runs = [P.prepare([str(tmp_path / "*.txt")], tmp_path / f"out{n}", workers=w, **kw) for n, w in enumerate([1, 2, 2])]
    assert runs[0] == runs[1] == runs[2] and len(runs[0]["splits"]["train"]["shards"]) > 3
    for name in os.listdir(tmp_path / "out0"):
        assert len({(tmp_path / f"out{n}" / name).read_bytes() for n in range(3)}) == 1, name


def test_jsonl_text_field(tmp_path, gpt2):
    records = [{"content": f"record {i}: " + words(3, seed=i), "id": i} for i in range(30)] + [{"content": ""}]
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    meta = P.prepare([str(src)], tmp_path / "out", text_field="content", workers=2, progress=False)
    assert (meta["splits"]["train"]["documents"], meta["splits"]["val"]["documents"]) == (27, 3)
    tokens = shard_tokens(tmp_path / "out", meta, "train")
    assert gpt2.decode(tokens.tolist()).startswith(records[0]["content"] + "<|endoftext|>record 1: ")


def test_parquet_input(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": [f"row {i} " + words(2, seed=i) for i in range(10)]}), tmp_path / "d.parquet")
    meta = P.prepare([str(tmp_path)], tmp_path / "out", workers=1, progress=False)
    assert (meta["splits"]["train"]["documents"], meta["splits"]["val"]["documents"]) == (9, 1)
    with pytest.raises(ValueError, match="d.parquet: no column 'body'"):
        P.prepare([str(tmp_path / "d.parquet")], tmp_path / "out2", text_field="body", workers=1, progress=False)


def test_max_tokens_keeps_whole_documents(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": words(5, seed=i)}) + "\n" for i in range(100)))
    meta = P.prepare([str(src)], tmp_path / "out", max_tokens=1000, workers=2, progress=False)
    total = sum(s["tokens"] for s in meta["splits"].values())
    assert 900 < total <= 1000
    assert sum(s["documents"] for s in meta["splits"].values()) == sum(
        int((shard_tokens(tmp_path / "out", meta, s) == 50256).sum()) for s in ("train", "val"))


# ---------------------------------------------------------------- mixtures (the Hub path, in memory)
def records(prefix, n):
    return [{"text": f"{prefix} {i} the king over the hill"} for i in range(n)]


def test_mix_documents_ratio_and_determinism():
    a, b = inputs.record_texts(records("A", 5000), "text", "a"), inputs.record_texts(records("B", 5000), "text", "b")
    docs = list(P.mix_documents([a, b], [0.7, 0.3], seed=1))
    share = sum(d.startswith("A") for d in docs[:2000]) / 2000
    assert abs(share - 0.7) < 0.04
    assert sum(d.startswith("A") for d in docs) == 5000  # stopped when A ran dry
    again = list(P.mix_documents([(r["text"] for r in records(p, 5000)) for p in "AB"], [0.7, 0.3], seed=1))
    assert again == docs
    other = list(P.mix_documents([(r["text"] for r in records(p, 5000)) for p in "AB"], [0.7, 0.3], seed=2))
    assert other != docs


def test_mix_weights():
    assert P.mix_weights([0.7], 2) == [0.7, 1 - 0.7]  # the last input takes the rest
    assert P.mix_weights([0.5, 0.5], 3) == [0.5, 0.5, 0.0]
    assert P.mix_weights([2, 1], 2) == [2, 1]  # relative weights
    for mix, n in [([1.5], 2), ([0.5], 3), ([float("nan")], 2), ([0.0, 0.0], 2), ([0.2] * 4, 3)]:
        with pytest.raises(ValueError, match=r"--mix needs one non-negative weight per input \(or all but the last\)"):
            P.mix_weights(mix, n)


def test_hub_mixture_with_budget(tmp_path, monkeypatch):
    fake = {"HuggingFaceFW/fineweb-edu": records("FW", 1000), "HuggingFaceTB/cosmopedia": records("CO", 1000)}
    calls = []

    def load_dataset(repo, config, split, streaming):
        calls.append((repo, config, split, streaming))
        return iter(fake[repo])  # a streaming dataset yields one dict a row
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    kw = dict(mix=[0.7], max_tokens=10_000, seed=3, workers=2, progress=False)
    meta = P.prepare(["fineweb-edu", "cosmopedia"], tmp_path / "a", **kw)
    assert calls[0] == ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)
    total = sum(s["tokens"] for s in meta["splits"].values())
    assert 9_980 < total <= 10_000
    text = get_tokenizer().decode(shard_tokens(tmp_path / "a", meta, "train").tolist())
    docs = text.split("<|endoftext|>")[:-1]
    assert abs(sum(d.startswith("FW") for d in docs) / len(docs) - 0.7) < 0.06
    P.prepare(["fineweb-edu", "cosmopedia"], tmp_path / "b", **kw)
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in os.listdir(tmp_path / "a"))


def test_optional_packages_missing_give_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match="pip install datasets"):
        P.prepare(["cosmopedia"], tmp_path / "a", workers=1, progress=False)
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="pip install pyarrow"):
        P.prepare([str(tmp_path / "d.parquet")], tmp_path / "b", workers=1, progress=False)


# ---------------------------------------------------------------- bad input, faults, interrupts: nothing lost
def test_bad_inputs_are_one_line_and_keep_the_old_data(tmp_path, capsys, prepared):
    out, before = prepared
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text(" \n\n")
    (tmp_path / "latin1.txt").write_bytes("ok so far ".encode() + "café".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    (tmp_path / "nofield.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    (tmp_path / "nodocs.jsonl").write_text('{"text": ""}\n\n')
    (tmp_path / "ok.txt").write_text(words(20))
    ok = tmp_path / "ok.txt"
    cases = [
        ([tmp_path / "empty.txt"], "empty.txt: empty file"),
        ([tmp_path / "blank.txt"], "blank.txt: empty file (only whitespace)"),
        ([ok, tmp_path / "latin1.txt"], "latin1.txt: not valid UTF-8 at byte offset 13"),
        ([ok, tmp_path / "bad.jsonl"], "bad.jsonl:2: invalid JSON (Expecting value)"),
        ([tmp_path / "nofield.jsonl"], "nofield.jsonl:2: record has no string field 'text' (try --text_field)"),
        ([tmp_path / "nodocs.jsonl"], "nodocs.jsonl: no documents (no record has a non-empty 'text')"),
        ([ok, "--encoding", "gpt5"], "unknown encoding 'gpt5'"),
        ([ok, "--vocab_size", "100"], "vocab_size must be in [257, 50257]"),
        ([ok, tmp_path / "missing.txt"], "missing.txt: no such file or folder"),
        ([tmp_path / "*.nothing"], "no files match"),
        ([ok, ok, "--mix", "1.5"], "--mix needs one non-negative weight per input"),
        ([ok, "--val_fraction", "1"], "need 0 <= val_fraction < 1"),
        ([ok, "--workers", "-1"], "workers must be at least 1, got -1"),
        ([ok, "--max_tokens", "1"], "the train split is empty (--val_fraction 0.1, --max_tokens 1): give a smaller fraction "
                                    "or a larger budget"),
        ([ok, "--val_fraction", "0.9999999"], "the train split is empty (--val_fraction 0.9999999): give a smaller "
                                              "fraction or a larger budget"),  # said --max_tokens, never given
        ([ok, "--mix", "0.5"], "--mix draws documents from two or more inputs, but 1 is named: drop --mix"),
    ]
    for args, msg in cases:
        rc, err = main(capsys, "--out", out, "--workers", "1", "--overwrite", *args)
        assert rc == 1 and err.startswith("error: ") and msg in err and err.count("\n") == 1, (msg, err)
        assert snapshot(out) == before, msg


@pytest.mark.parametrize("argv,msg", [(["a.txt", "--shard_tokens", "2.5"], "expected an integer, got '2.5'"),
                                      (["a.txt", "--mix", "0.5,x"], "expected comma-separated numbers, got '0.5,x'"),
                                      (["a.txt"], "--out is needed (only a single named corpus")])
def test_command_line_errors(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        P.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_input_bad_halfway_keeps_the_old_data(tmp_path, prepared):
    """Through the real command line: the first records pass the up-front check, a later one is broken."""
    out, before = prepared
    src = tmp_path / "late.jsonl"
    src.write_text("".join(json.dumps({"text": words(3, seed=i)}) + "\n" for i in range(200)) + '{"text": \n')
    r = cli(src, "--out", out, "--overwrite", "--shard_tokens", "100", "--workers", "2")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"error: {src}:201: invalid JSON (Expecting value)\n"
    assert snapshot(out) == before


def test_failure_halfway_leaves_no_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "PIECE_CHARS", 200)  # so shards are written before the bad record is read
    for i in range(11):
        (tmp_path / f"{i:02d}.txt").write_text(words(100, seed=i))
    (tmp_path / "zz.jsonl").write_bytes(b'{"text": "passes the up-front check"}\n{"text": "\xff"}\n')
    written = []
    monkeypatch.setattr(shards, "write_shard", lambda path, t, w=shards.write_shard: written.append(path) or w(path, t))
    with pytest.raises(ValueError, match="zz.jsonl: not valid UTF-8 at byte offset 48"):
        P.prepare([str(tmp_path)], tmp_path / "out", shard_tokens=100, workers=2, progress=False)
    assert len(written) > 10 and not (tmp_path / "out").exists()  # the folder it made goes too


def test_full_disk_keeps_the_old_data(tmp_path, capsys, monkeypatch, prepared):
    out, before = prepared
    (tmp_path / "new.txt").write_text(words(400, seed=1))
    fsync, calls = os.fsync, []

    def fills_up(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        fsync(fd)
    monkeypatch.setattr(os, "fsync", fills_up)
    rc, err = main(capsys, tmp_path / "new.txt", "--out", out, "--overwrite", "--shard_tokens", "1000", "--workers", "1")
    assert (rc, err) == (1, f"error: {out}: not prepared: the disk is full (No space left on device); the prepared data "
                            "there is as it was\n")
    assert snapshot(out) == before


def test_refuses_prepared_folder_unless_overwrite(tmp_path, capsys, prepared):
    out, before = prepared
    (tmp_path / "b.txt").write_text(words(20))
    rc, err = main(capsys, tmp_path / "b.txt", "--out", out)
    assert rc == 1 and err == f"error: {out}: already holds prepared data (meta.json); pass --overwrite to replace it\n"
    assert snapshot(out) == before
    assert main(capsys, tmp_path / "b.txt", "--out", out, "--overwrite")[0] == 0
    meta = shards.load_meta(out)  # no stale shards from the bigger first run
    assert sorted(os.listdir(out)) == sorted([LOCK_NAME, "meta.json", *meta["splits"]["train"]["shards"], *meta["splits"]["val"]["shards"]])
    assert len(meta["splits"]["train"]["shards"]) < len([n for n in before if n.startswith("train_")])


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupt_is_one_line_and_keeps_the_old_data(tmp_path, prepared, how):
    """Ctrl-C reaches the whole process group (parent and workers); `kill` reaches the parent only."""
    out, before = prepared
    big = tmp_path / "big.jsonl"
    lines = words(2000).splitlines()
    records = "".join(json.dumps({"text": "\n".join(lines[i:i + 20])}) + "\n" for i in range(0, 2000, 20))
    big.write_text(records * 300)  # 30,000 documents, ~30 MB: the first shards come at once, the rest takes seconds
    proc = subprocess.Popen([sys.executable, str(ROOT / "prepare_data.py"), str(big), "--out", str(out), "--overwrite",
                             "--shard_tokens", "20000", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                # a shell's background job inherits SIGINT ignored: give the child Ctrl-C back
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not (out / ".partial" / "train_000000.bin").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()  # still working: the interrupt lands mid-run
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stdout, stderr) == (130, "", "interrupted\n")
    assert snapshot(out) == before
    for _ in range(100):  # and no worker outlives it
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("pool workers still running after the interrupt")


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        P.main(["--help"])
    assert e.value.code == 0 and "--vocab_size" in capsys.readouterr().out


def test_reserve_zero_gives_id_0_to_the_nul_byte_and_meta_records_it(tmp_path, capsys):
    """By default no real token gets id 0 (the all-zero binary code): "!" and NUL swap ids, every other
    token keeps its own, and meta.json says so; the text's NULs are dropped (tests/test_inputs.py).
    --no-reserve_zero writes the encoding's own ids, and says how many tokens that puts on id 0."""
    text = tmp_path / "t.txt"
    text.write_text("Hello! Who's there? Nay, answer me!\n" * 50 + "a NUL \x00 byte")
    assert main(capsys, str(text), "--out", tmp_path / "r", "--vocab_size", "1000", "--workers", "1")[0] == 0
    rc, err = main(capsys, str(text), "--out", tmp_path / "p", "--vocab_size", "1000", "--workers", "1", "--no-reserve_zero")
    assert rc == 0 and err.splitlines()[1] == (
        "note: 100 tokens on id 0, whose binary code is constant: the encoding's own ids, as --no-reserve_zero / "
        "--no-reserve_ones ask; a bias-free binary model reads them as a constant vector (docs/zero-code.md; "
        "meta.json: constant_code_tokens)")
    r, p = shards.load_meta(tmp_path / "r"), shards.load_meta(tmp_path / "p")
    assert r["reserve_zero"] is True and p["reserve_zero"] is False
    assert (p["constant_code_tokens"], "constant_code_tokens" in r, r["dropped_nul"], p["dropped_nul"]) == (100, False, 1, 1)
    reserved, plain = ([*shard_tokens(tmp_path / d, m, "train").tolist(), *shard_tokens(tmp_path / d, m, "val").tolist()]
                       for d, m in (("r", r), ("p", p)))
    swap = {0: 188, 188: 0}
    assert plain.count(0) == 100 and reserved.count(0) == 0  # the "!"s; the NUL byte is dropped
    assert reserved == [swap.get(t, t) for t in plain]
    decoded = get_tokenizer("gpt2", 1000, reserve_zero=True).decode(reserved).replace("<|endoftext|>", "")
    assert decoded == text.read_text().replace("\x00", "")
    # data prepared before the option: no key, read as the plain ids
    meta = {k: v for k, v in p.items() if k != "reserve_zero"}
    (tmp_path / "p" / "meta.json").write_text(json.dumps(meta))
    assert "reserve_zero" not in shards.load_meta(tmp_path / "p")


# ---------------------------------------------------------------- one writer, and only the project's files (issue 18)
def busy_input(path):
    """~4 MB of JSONL: enough work that a run is still writing when it is paused after its first shard."""
    lines = words(2000).splitlines()
    path.write_text("".join(json.dumps({"text": "\n".join(lines[i:i + 20])}) + "\n" for i in range(0, 2000, 20)) * 40)
    return path


def wait_for(path, proc, seconds=60):
    deadline = time.time() + seconds
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()


def consistent(out):
    """meta.json agrees with the shards: every listed shard, each split's token count, ids inside the vocabulary."""
    meta = shards.load_meta(out)
    for split in ("train", "val"):
        tokens = shard_tokens(out, meta, split)
        assert len(tokens) == meta["splits"][split]["tokens"] and tokens.max() < meta["vocab_size"]
    assert sorted(os.listdir(out)) == sorted([LOCK_NAME, "meta.json", *meta["splits"]["train"]["shards"],
                                              *meta["splits"]["val"]["shards"]])
    return meta


def test_a_second_writer_is_refused_while_the_first_runs(tmp_path, prepared):
    """Two real processes into one --out: the second is refused with one line while the first holds the folder
    (paused with SIGSTOP, so the overlap is certain); the first then finishes with meta.json matching its shards."""
    out, _ = prepared
    first = subprocess.Popen([sys.executable, str(ROOT / "prepare_data.py"), str(busy_input(tmp_path / "big.jsonl")),
                              "--out", str(out), "--overwrite", "--shard_tokens", "20000", "--workers", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(out / ".partial" / "train_000000.bin", first)
        first.send_signal(signal.SIGSTOP)
        (tmp_path / "small.txt").write_text(words(50, seed=3))
        second = cli(tmp_path / "small.txt", "--out", out, "--overwrite", "--workers", "1")
        assert (second.returncode, second.stdout) == (1, "")
        assert second.stderr == (f"error: {out} is being written by another process (pid {first.pid}); wait for it "
                                 "to finish or choose another folder\n")
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=120)
    assert (first.returncode, stderr) == (0, ""), stderr
    assert consistent(out)["sources"] == [str(tmp_path / "big.jsonl")]


def test_a_writer_killed_with_sigkill_leaves_no_lock_and_its_staging_goes(tmp_path, prepared):
    out, before = prepared
    first = subprocess.Popen([sys.executable, str(ROOT / "prepare_data.py"), str(busy_input(tmp_path / "big.jsonl")),
                              "--out", str(out), "--overwrite", "--shard_tokens", "20000", "--workers", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(out / ".partial" / "train_000000.bin", first)
    first.kill()
    first.communicate(timeout=60)
    assert (out / ".partial").is_dir() and {n: b for n, b in tree(out).items() if "/" not in n} == before
    (tmp_path / "small.txt").write_text(words(50, seed=3))
    r = cli(tmp_path / "small.txt", "--out", out, "--overwrite", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert consistent(out)["sources"] == [str(tmp_path / "small.txt")]


def test_user_files_in_the_output_folder_are_refused_by_name_and_kept(tmp_path):
    (tmp_path / "a.txt").write_text(words(50))
    corpus = tmp_path / "corpus"  # a folder with a meta.json of its own: not prepared data
    corpus.mkdir()
    (corpus / "meta.json").write_text('{"title": "my corpus", "license": "CC-BY"}\n')
    staged = tmp_path / "staged"  # a user's folder that happens to be called .partial
    (staged / ".partial").mkdir(parents=True)
    (staged / ".partial" / "notes.txt").write_text("my notes\n")
    shard = tmp_path / "shard"  # a user's file with a shard's name
    shard.mkdir()
    (shard / "train_000000.bin").write_bytes(b"my own binary file")
    for folder, msg in [(corpus, f"{corpus / 'meta.json'} is not a meta.json of prepared data (prepare_data.py did not "
                                 "write it): it is left alone; choose another --out"),
                        (staged, f"{staged / '.partial'} exists and prepare_data.py did not make it (it has no "
                                 ".prepare_data mark): it is left alone; move it away or choose another --out"),
                        (shard, f"{shard / 'train_000000.bin'} is not a token shard (prepare_data.py did not write it): "
                                "it is left alone; choose another --out")]:
        before = tree(folder)
        for overwrite in ([], ["--overwrite"]):
            r = cli(tmp_path / "a.txt", "--out", folder, "--workers", "1", *overwrite)
            assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: {msg}\n")
            assert tree(folder) == before


def test_a_marked_staging_folder_with_a_user_file_inside_is_refused(tmp_path, prepared):
    out, before = prepared
    (out / ".partial").mkdir()
    (out / ".partial" / ".prepare_data").write_text("mark\n")
    (out / ".partial" / "train_000000.bin").write_bytes(b"left by a killed run")
    (out / ".partial" / "keep.txt").write_text("mine\n")
    (tmp_path / "a.txt").write_text(words(50))
    r = cli(tmp_path / "a.txt", "--out", out, "--overwrite", "--workers", "1")
    assert (r.returncode, r.stderr) == (1, f"error: {out / '.partial'} holds files prepare_data.py did not write "
                                           "(keep.txt): they are left alone; move them away or choose another --out\n")
    assert (out / ".partial" / "keep.txt").read_text() == "mine\n"
    assert {n: b for n, b in tree(out).items() if "/" not in n} == before


def tree(folder):
    """{relative path: bytes} of every file under folder, but the writer lock's (it holds the last writer's pid)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file() and p.name != LOCK_NAME}


def test_bad_inputs_of_every_kind_are_one_line_naming_them(tmp_path):
    (tmp_path / "nested.jsonl").write_text('{"text": "fine"}\n' + "[" * 100_000 + "\n")
    (tmp_path / "surrogate.jsonl").write_text('{"text": "fine"}\n{"text": "half a pair \\ud800 here"}\n')
    os.symlink("/dev/zero", tmp_path / "zero.txt")
    os.mkfifo(tmp_path / "pipe.txt")
    ok = tmp_path / "ok.txt"
    ok.write_text(words(20))
    o = tmp_path / "o"
    cases = [
        ([ok], "", "the output folder is '' (empty): name one, e.g. --out data/mine"),
        ([ok], ok, f"{ok} is a file, not a folder: name a folder to write into"),
        ([ok, tmp_path / "nested.jsonl"], o, f"{tmp_path / 'nested.jsonl'}:2: JSON nested too deeply to read (not a text record)"),
        ([tmp_path / "surrogate.jsonl"], o,
         f"{tmp_path / 'surrogate.jsonl'}:2: 'text' holds a lone surrogate (\\ud800) at character 12, which is not Unicode text"),
        ([ok, tmp_path / "zero.txt"], o, f"{tmp_path / 'zero.txt'}: a symlink to /dev/zero, a character device, not a file: "
                                         "give a text file, a folder or a named corpus"),
        ([tmp_path], o, f"{tmp_path / 'pipe.txt'}: a named pipe (FIFO), not a file: give a text file, a folder or a named corpus"),
    ]
    for named, out, msg in cases:
        r = cli(*named, "--out", out, "--workers", "1")
        assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: {msg}\n"), msg
    assert not o.exists()  # the records past the first were read as the folder's writer, which removes the folder it made


def test_mix_counts_the_inputs_named_not_their_files(tmp_path):
    for name, files, docs in (("a", 2, 10), ("b", 1, 200)):
        (tmp_path / name).mkdir()
        for i in range(files):
            (tmp_path / name / f"{i}.jsonl").write_text("".join(json.dumps({"text": f"{name}{i} doc {j}"}) + "\n" for j in range(docs)))
    r = cli(tmp_path / "a", tmp_path / "b", "--mix", "0.2,0.3,0.5", "--out", tmp_path / "o", "--workers", "1")
    assert (r.returncode, r.stderr) == (1, "error: --mix needs one non-negative weight per input (or all but the last), "
                                           "got [0.2, 0.3, 0.5] for 2 inputs\n")
    r = cli(tmp_path / "a", tmp_path / "b", "--mix", "0.5", "--out", tmp_path / "o", "--workers", "1")
    assert r.returncode == 0, r.stderr
    text = get_tokenizer("gpt2", None, reserve_zero=True).decode(np.concatenate([shard_tokens(tmp_path / "o", shards.load_meta(tmp_path / "o"), s)
                                                    for s in ("train", "val")]).tolist())
    docs = text.split("<|endoftext|>")[:-1]  # folder a's two files are one stream: its second file is reached
    assert {d[:2] for d in docs} == {"a0", "a1", "b0"} and sum(d.startswith("a") for d in docs) == 20


def test_a_mixture_that_runs_dry_before_its_budget_says_so(tmp_path, monkeypatch, capsys):
    """--mix with a --max_tokens beyond what an input holds (FineWeb-Edu's sample-10BT at the paper's 17B) stops
    when that input runs dry: said, with the shortfall; a budget met says nothing."""
    fake = {"HuggingFaceFW/fineweb-edu": records("FW", 200), "HuggingFaceTB/cosmopedia": records("CO", 1000)}
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(
        load_dataset=lambda repo, config, split, streaming: iter(fake[repo])))
    kw = dict(mix=[0.7], seed=3, workers=1, progress=False)
    meta = P.prepare(["fineweb-edu", "cosmopedia"], tmp_path / "a", max_tokens=10**9, **kw)
    total = sum(s["tokens"] for s in meta["splits"].values())
    err = capsys.readouterr().err
    assert err == (f"note: the mixture stopped at {total:,} tokens when fineweb-edu ran dry, {10**9 - total:,} short of "
                   f"--max_tokens 1,000,000,000 (0%): give that input more data or a lower --mix weight to meet the "
                   "budget (the other inputs' remaining documents are left out, so the --mix ratio holds)\n")
    P.prepare(["fineweb-edu", "cosmopedia"], tmp_path / "b", max_tokens=total // 2, **kw)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- compressed inputs (issue 35)
import bz2, gzip, lzma  # noqa: E402

PACK = {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}


def jsonl_records(n, seed=0):
    return "".join(json.dumps({"text": words(5, seed=seed + i)}) + "\n" for i in range(n)).encode()


def tokens_of(out):
    meta = shards.load_meta(out)
    return [shard_tokens(out, meta, s).tolist() for s in ("train", "val")]


@pytest.mark.parametrize("name, pack", [("docs.JSONL.GZ", "gzip"), ("docs.jsonl.bz2", "bz2"), ("docs.Jsonl.XZ", "xz"),
                                        ("docs.jsonl", "gzip"), ("notes.txt.gz", "gzip"), ("notes.TXT.bz2", "bz2"),
                                        ("notes.txt", "xz")])
def test_compressed_inputs_give_the_plain_files_tokens(tmp_path, name, pack):
    """By suffix or by first bytes alone (a gzip file named docs.jsonl), in any case: the same shards as the plain file."""
    data = jsonl_records(30) if "jsonl" in name.lower() else words(300).encode()
    plain = tmp_path / ("plain.jsonl" if "jsonl" in name.lower() else "plain.txt")
    plain.write_bytes(data)
    (tmp_path / name).write_bytes(PACK[pack](data))
    P.prepare([str(plain)], tmp_path / "a", workers=1, progress=False)
    meta = P.prepare([str(tmp_path / name)], tmp_path / "b", workers=1, progress=False)
    assert tokens_of(tmp_path / "a") == tokens_of(tmp_path / "b") and meta["inputs"] == [str(tmp_path / name)]


def test_compressed_files_in_folders_and_mixes(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa, pyarrow.parquet as pq

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl.gz").write_bytes(gzip.compress(jsonl_records(20)))
    (tmp_path / "d" / "skip.gz").write_bytes(gzip.compress(b"no known type inside"))
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [words(5, seed=100 + i) for i in range(20)]}), buf)
    (tmp_path / "d" / "b.Parquet.XZ").write_bytes(lzma.compress(buf.getvalue()))
    (tmp_path / "c.txt.bz2").write_bytes(bz2.compress(words(200).encode()))
    meta = P.prepare([str(tmp_path / "d"), str(tmp_path / "c.txt.bz2")], tmp_path / "o", mix=[0.5], workers=1, progress=False)
    assert meta["sources"] == [str(tmp_path / "d" / "a.jsonl.gz"), str(tmp_path / "d" / "b.Parquet.XZ"), str(tmp_path / "c.txt.bz2")]


def test_broken_or_unreadable_archives_write_nothing(tmp_path, monkeypatch):
    """Through the real command line: a truncated or corrupt archive, a suffix its bytes belie, zstd without its
    package: one line naming the file, and the output folder is never made."""
    data = gzip.compress(jsonl_records(200))
    corrupt = bytearray(data)
    corrupt[len(data) // 2] ^= 0xFF
    files = {"cut.jsonl.gz": data[:len(data) // 2], "corrupt.jsonl.gz": bytes(corrupt), "cut.txt.xz": lzma.compress(b"x" * 9999)[:60],
             "cut.jsonl.bz2": bz2.compress(jsonl_records(200))[:300], "plain.txt.gz": b"plain text", "z.jsonl.ZST": b"\x28\xb5\x2f\xfd" + bytes(20)}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    expected = {"plain.txt.gz": "named .gz but is not gzip data (it starts with b'plai')",
                "z.jsonl.ZST": "zstd-compressed: reading it needs the optional zstandard package (pip install zstandard), "
                               "or decompress it first (unzstd)"}
    if importlib.util.find_spec("zstandard"):
        expected["z.jsonl.ZST"] = "not readable zstd data, truncated or corrupt"
    for name in files:
        r = cli(tmp_path / name, "--out", tmp_path / "o", "--workers", "1")
        assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, name
        assert r.stderr.startswith(f"error: {tmp_path / name}: {expected.get(name, 'not readable')}"), r.stderr
        assert not (tmp_path / "o").exists()


def test_zstd_when_its_package_is_there(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    c = zstandard.ZstdCompressor()
    data = jsonl_records(40)
    (tmp_path / "two_frames.jsonl.zst").write_bytes(c.compress(data[:999]) + c.compress(data[999:]))
    (tmp_path / "plain.jsonl").write_bytes(data)
    (tmp_path / "cut.jsonl.zst").write_bytes(c.compress(data)[:-9])
    P.prepare([str(tmp_path / "plain.jsonl")], tmp_path / "a", workers=1, progress=False)
    P.prepare([str(tmp_path / "two_frames.jsonl.zst")], tmp_path / "b", workers=1, progress=False)
    assert tokens_of(tmp_path / "a") == tokens_of(tmp_path / "b")
    with pytest.raises(ValueError, match="cut.jsonl.zst: not readable zstd data, truncated or corrupt"):
        P.prepare([str(tmp_path / "cut.jsonl.zst")], tmp_path / "c", workers=1, progress=False)


def test_the_re_prepare_command_names_the_inputs_from_any_folder(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text(words(200))
    monkeypatch.chdir(tmp_path)
    meta = P.prepare(["a.txt"], "o", workers=1, progress=False)
    assert shards.prepared_from(meta) == [str(tmp_path / "a.txt")]
    assert shards.prepare_command(meta, "o").startswith(f"python prepare_data.py {tmp_path / 'a.txt'} --out o ")
    monkeypatch.chdir("/")  # data prepared before meta.json recorded its inputs: relative sources, found or unknown
    old = {k: v for k, v in meta.items() if k != "inputs"} | {"sources": ["a.txt"]}
    assert shards.prepared_from(old) is None
    assert shards.prepare_command(old, "o").startswith("python prepare_data.py '<INPUTS: unknown, its meta.json does not record them>'")
    assert shards.prepared_from({**old, "sources": ["shakespeare-not-here", "hf:x/y"]}) is None
    assert shards.prepared_from({**old, "sources": [str(tmp_path / "a.txt"), "hf:x/y"]}) == [str(tmp_path / "a.txt"), "hf:x/y"]
