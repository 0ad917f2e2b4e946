"""Tests for prepare_data.py: the tokenizer cut, splits, mixtures, inputs (compressed ones too), the command
line, and what a run writes. The helpers here serve the other files that prepare data: test_data_dir.py (the
output folder: nothing lost, one writer, only the project's files replaced), test_workers.py (the pool and its
signals), test_shards.py (the shard format and meta.json), test_inputs.py."""
import importlib.util, io, json, os, subprocess, sys, types, urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository's
SHARED = ROOT.parent / "shared"
if (SHARED / "tiktoken-cache").is_dir():  # offline: use the checked-in BPE files unless CI already chose
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken-cache"))

import prepare_data as P  # noqa: E402
from bincode_gpt import inputs, shards
from bincode_gpt.files import LOCK_NAME  # noqa: E402
from bincode_gpt.exits import run_main
from bincode_gpt.tokenizer import encoding_fields, get_tokenizer  # noqa: E402
from conftest import prepared, snapshot, words  # noqa: F401 (re-exported for test_shards.py, test_inputs.py)

SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"
needs_corpus = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"corpus not found at {SHAKESPEARE}")


@pytest.fixture(scope="module")
def shakespeare():
    if not SHAKESPEARE.is_file():
        pytest.skip(f"corpus not found at {SHAKESPEARE}")
    return SHAKESPEARE.read_text()


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
    full = get_tokenizer("gpt2", 50257)  # the full size is the encoding itself, uncut: all its parts, no cut's name
    assert full.name == gpt2.name and encoding_fields(full) == encoding_fields(gpt2)
    assert full.encode(text, allowed_special="all") == gpt2.encode(text, allowed_special="all")
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
    corpus = SHAKESPEARE.read_text()[:100_000] if SHAKESPEARE.is_file() else words(2000)
    text = corpus + " café 日本語 ÿ \x00<|endoftext|>"
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
    a, b = (np.concatenate([shard_tokens(tmp_path / d, m, s) for s in ("train", "val")]).tolist()
            for d, m in (("new", new), ("old", old)))
    assert a.count(187) == b.count(511) == 40 and 511 not in a and a == [{511: 187, 187: 511}.get(t, t) for t in b]
    assert (old["constant_code_tokens"], "constant_code_tokens" in new) == (40, False)  # end-of-text on all ones
    del old["reserve_ones"]  # data prepared before the option
    (tmp_path / "old" / "meta.json").write_text(json.dumps(old))
    entry = tiktoken_entry(shards.load_meta(tmp_path / "old"))
    assert entry["reserve_ones"] is False and load_text_codec({"tokenizer": entry}, "old.pt").enc.eot_token == 511
    assert load_text_codec({"tokenizer": tiktoken_entry(new)}, "new.pt").enc.eot_token == 187


def test_reserve_zero_gives_id_0_to_the_nul_byte_and_meta_records_it(tmp_path, capsys):
    """By default no real token gets id 0 (the all-zero binary code): "!" and NUL swap ids, every other
    token keeps its own, and meta.json says so; the text's NULs are dropped (tests/test_inputs.py).
    --no-reserve_zero writes the encoding's own ids, and says how many tokens that puts on id 0."""
    text = tmp_path / "t.txt"
    text.write_text("Hello! Who's there? Nay, answer me!\n" * 50 + "a NUL \x00 byte")
    assert main(capsys, str(text), "--out", tmp_path / "r", "--vocab_size", "1000", "--workers", "1")[0] == 0
    rc, err = main(capsys, str(text), "--out", tmp_path / "p", "--vocab_size", "1000", "--workers", "1",
                   "--no-reserve_zero")
    assert rc == 0 and err.splitlines()[1] == (
        "note: 100 tokens on id 0, whose binary code is constant: the encoding's own ids, as --no-reserve_zero / "
        "--no-reserve_ones ask; a bias-free binary model reads them as a constant vector (docs/zero-code.md; "
        "meta.json: constant_code_tokens)")
    r, p = shards.load_meta(tmp_path / "r"), shards.load_meta(tmp_path / "p")
    assert r["reserve_zero"] is True and p["reserve_zero"] is False
    assert (p["constant_code_tokens"], "constant_code_tokens" in r) == (100, False)
    assert (r["dropped_nul"], p["dropped_nul"]) == (1, 1)
    reserved, plain = (shard_tokens(tmp_path / d, m, "train").tolist() + shard_tokens(tmp_path / d, m, "val").tolist()
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
    env = {**os.environ, "BCGPT_CORPUS_CACHE": str(tmp_path / "cache")}
    r = cli("shakespeare", "--workers", "1", cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.splitlines()[-1] == "wrote data/shakespeare", r.stderr
    meta = shards.load_meta(tmp_path / "data" / "shakespeare")
    assert meta["sources"] == [str(tmp_path / "cache" / "tinyshakespeare.txt")]
    # the mini preset's vocabulary (train.py's default), unless --vocab_size says otherwise
    assert meta["vocab_size"] == 512
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
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
               for f in os.listdir(tmp_path / "a"))


def test_optional_packages_missing_give_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match="pip install datasets"):
        P.prepare(["cosmopedia"], tmp_path / "a", workers=1, progress=False)
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="pip install pyarrow"):
        P.prepare([str(tmp_path / "d.parquet")], tmp_path / "b", workers=1, progress=False)




def test_mix_counts_the_inputs_named_not_their_files(tmp_path):
    for name, files, docs in (("a", 2, 10), ("b", 1, 200)):
        (tmp_path / name).mkdir()
        for i in range(files):
            lines = "".join(json.dumps({"text": f"{name}{i} doc {j}"}) + "\n" for j in range(docs))
            (tmp_path / name / f"{i}.jsonl").write_text(lines)
    r = cli(tmp_path / "a", tmp_path / "b", "--mix", "0.2,0.3,0.5", "--out", tmp_path / "o", "--workers", "1")
    refusal = ("error: --mix needs one non-negative weight per input (or all but the last), "
               "got [0.2, 0.3, 0.5] for 2 inputs\n")
    assert (r.returncode, r.stderr) == (1, refusal)

    r = cli(tmp_path / "a", tmp_path / "b", "--mix", "0.5", "--out", tmp_path / "o", "--workers", "1")
    assert r.returncode == 0, r.stderr
    meta = shards.load_meta(tmp_path / "o")
    tokens = np.concatenate([shard_tokens(tmp_path / "o", meta, s) for s in ("train", "val")])
    text = get_tokenizer("gpt2", None, reserve_zero=True).decode(tokens.tolist())
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
    assert err == (f"note: the mixture stopped at {total:,} tokens when fineweb-edu ran dry, "
                   f"{10**9 - total:,} short of --max_tokens 1,000,000,000 (0%): "
                   "give that input more data or a lower --mix weight to meet the budget "
                   "(the other inputs' remaining documents are left out, so the --mix ratio holds)\n")
    P.prepare(["fineweb-edu", "cosmopedia"], tmp_path / "b", max_tokens=total // 2, **kw)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- the command line
@pytest.mark.parametrize("argv,msg", [(["a.txt", "--shard_tokens", "2.5"], "expected an integer, got '2.5'"),
                                      (["a.txt", "--mix", "0.5,x"], "expected comma-separated numbers, got '0.5,x'"),
                                      (["a.txt"], "--out is needed (only a single named corpus")])
def test_command_line_errors(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        P.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        P.main(["--help"])
    assert e.value.code == 0 and "--vocab_size" in capsys.readouterr().out


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
    """By suffix or by first bytes alone (a gzip file named docs.jsonl), in any case: the same shards as the
    plain file."""
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
    meta = P.prepare([str(tmp_path / "d"), str(tmp_path / "c.txt.bz2")], tmp_path / "o",
                     mix=[0.5], workers=1, progress=False)
    assert meta["sources"] == [str(tmp_path / "d" / "a.jsonl.gz"), str(tmp_path / "d" / "b.Parquet.XZ"),
                               str(tmp_path / "c.txt.bz2")]


def test_broken_or_unreadable_archives_write_nothing(tmp_path, monkeypatch):
    """Through the real command line: a truncated or corrupt archive, a suffix its bytes belie, zstd without its
    package: one line naming the file, and the output folder is never made."""
    data = gzip.compress(jsonl_records(200))
    corrupt = bytearray(data)
    corrupt[len(data) // 2] ^= 0xFF
    files = {"cut.jsonl.gz": data[:len(data) // 2], "corrupt.jsonl.gz": bytes(corrupt),
             "cut.txt.xz": lzma.compress(b"x" * 9999)[:60], "cut.jsonl.bz2": bz2.compress(jsonl_records(200))[:300],
             "plain.txt.gz": b"plain text", "z.jsonl.ZST": b"\x28\xb5\x2f\xfd" + bytes(20)}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    expected = {"plain.txt.gz": "named .gz but is not gzip data (it starts with b'plai')",
                "z.jsonl.ZST": "zstd-compressed: reading it needs the optional zstandard package "
                               "(pip install zstandard), or decompress it first (unzstd)"}
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
    assert shards.prepare_command(old, "o").startswith(
        "python prepare_data.py '<INPUTS: unknown, its meta.json does not record them>'")
    assert shards.prepared_from({**old, "sources": ["shakespeare-not-here", "hf:x/y"]}) is None
    sources = [str(tmp_path / "a.txt"), "hf:x/y"]
    assert shards.prepared_from({**old, "sources": sources}) == sources

