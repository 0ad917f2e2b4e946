"""Text as users have it (issue 53): files in UTF-16 or UTF-32 with a byte-order mark prepare to the tokens of
their UTF-8 copy; unmarked or 8-bit text is refused naming its likely encoding and the command that converts
it; U+0000 never reaches a shard (every shipped cut: tests/test_tokenizer.py)."""

import gzip
import io
import json
import shutil
import subprocess

import pytest

import prepare_data as P
from bincode_gpt import inputs, workers
from bincode_gpt.tokenizer import get_tokenizer, without_nul
from test_prepare_data import main, shard_tokens, snapshot, words

# a character outside the BMP (a surrogate pair in UTF-16), CRLF and accents, over a few lines
TEXT = words(60) + "naïve café 😀 — 東京\r\nthe end\n"
RECORDS = [TEXT[:200], "😀" * 3 + " and more", TEXT[200:]]
MARKED = {"UTF-8-sig": "utf-8-sig", "UTF-16 LE": "utf-16", "UTF-16 BE": "utf-16-be", "UTF-32 LE": "utf-32",
          "UTF-32 BE": "utf-32-be"}  # Python's utf-16 / utf-32 write a little-endian mark; the BE ones none


def encode(text, name):
    """`text` in the encoding MARKED names, with its byte-order mark."""
    bom = "\ufeff" if name.endswith("BE") else ""
    return (bom + text).encode(MARKED[name])


def jsonl(records):
    return "".join(json.dumps({"text": r}, ensure_ascii=False) + "\n" for r in records)


def prepared(tmp_path, name, data):
    """The shards (bytes by file name) prepare_data.py writes for one input file `name` holding `data`."""
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / f"{name}.out"
    P.prepare([str(src)], out, vocab_size=512, workers=1, progress=False)
    return {k: v for k, v in snapshot(out).items() if k.endswith(".bin")}


@pytest.mark.parametrize("encoding", MARKED)
@pytest.mark.parametrize("kind", [".txt", ".jsonl", ".txt.gz", ".jsonl.gz"])
def test_marked_text_prepares_to_the_tokens_of_its_utf8_copy(tmp_path, encoding, kind):
    text = jsonl(RECORDS) if kind.startswith(".jsonl") else TEXT
    pack = gzip.compress if kind.endswith(".gz") else bytes
    utf8 = prepared(tmp_path, "utf8" + kind, pack(text.encode()))
    assert len(utf8) == 2 and prepared(tmp_path, "marked" + kind, pack(encode(text, encoding))) == utf8


def test_a_folder_of_marked_files_prepares_as_its_utf8_copy(tmp_path):
    """Each file's encoding is its own: a mark at the start of one says nothing of the next."""
    files = {"a.txt": ("UTF-16 LE", TEXT), "b.txt": ("UTF-8-sig", words(20, seed=1)),
             "c.jsonl": ("UTF-16 BE", jsonl(RECORDS)), "d.txt": ("UTF-32 LE", words(20, seed=2))}
    for folder, write in (("utf8", lambda text, _: text.encode()), ("marked", encode)):
        (tmp_path / folder).mkdir()
        for name, (encoding, text) in files.items():
            (tmp_path / folder / name).write_bytes(write(text, encoding))
        P.prepare([str(tmp_path / folder)], tmp_path / f"{folder}.out", vocab_size=512, workers=1, progress=False)
    shards = [{k: v for k, v in snapshot(tmp_path / f"{f}.out").items() if k.endswith(".bin")}
              for f in ("utf8", "marked")]
    assert shards[0] == shards[1]


class Trickle(io.RawIOBase):
    """A stream whose every read gives at most 3 bytes: each cuts a UTF-16 code unit or a surrogate pair."""

    def __init__(self, data):
        self.data = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, buffer):
        chunk = self.data.read(min(3, len(buffer)))
        buffer[:len(chunk)] = chunk
        return len(chunk)


@pytest.mark.parametrize("encoding", ["UTF-16 LE", "UTF-16 BE", "UTF-32 BE"])
def test_a_stream_read_in_odd_pieces_never_cuts_a_character(encoding):
    data = encode(jsonl(RECORDS), encoding)
    codec = inputs.text_encoding(data[:inputs.HEAD], "x.jsonl")
    lines = list(inputs.text_lines(io.BufferedReader(Trickle(data)), codec, "x.jsonl"))
    assert codec == encoding[:6] and lines == jsonl(RECORDS).splitlines(keepends=True)


UNMARKED = [("UTF-16LE", "utf-16-le", TEXT), ("UTF-16BE", "utf-16-be", TEXT), ("UTF-32LE", "utf-32-le", TEXT),
            ("UTF-32BE", "utf-32-be", TEXT), ("UTF-16LE", "utf-16-le", "Привет, мир! Как дела?\n" * 20)]


def iconv_command(src, encoding, copy):
    """The conversion a refusal names: iconv, after gzip -dc for a compressed file."""
    if src.name.endswith(".gz"):
        return f"gzip -dc {src} | iconv -f {encoding} -t UTF-8 > {copy}"
    return f"iconv -f {encoding} -t UTF-8 {src} > {copy}"


@pytest.mark.parametrize("name, codec, text", UNMARKED, ids=["16le", "16be", "32le", "32be", "cyrillic"])
@pytest.mark.parametrize("kind", [".txt", ".jsonl", ".jsonl.gz"])
def test_unmarked_utf16_and_utf32_are_refused_naming_the_encoding_and_the_conversion(tmp_path, capsys, name, codec,
                                                                                      text, kind):
    """Unmarked ASCII in UTF-16 is valid UTF-8 (a NUL after every letter), Cyrillic too (a 0x04): never read as
    text. The refusal's command converts the file, and the copy prepares as the UTF-8 text would."""
    text = jsonl([text]) if kind.startswith(".jsonl") else text
    src = tmp_path / f"in{kind}"
    src.write_bytes(gzip.compress(text.encode(codec)) if kind.endswith(".gz") else text.encode(codec))
    copy = tmp_path / f"in-utf8{kind.removesuffix('.gz')}"
    command = iconv_command(src, name, copy)
    rc, err = main(capsys, src, "--out", tmp_path / "out", "--workers", 1)
    assert (rc, err) == (1, f"error: {src}: looks like {name} text without a byte-order mark, not UTF-8: convert it "
                            f"to UTF-8 first, e.g. {command}\n")
    if shutil.which("iconv") and shutil.which("gzip"):
        subprocess.run(command, shell=True, check=True)
        assert copy.read_bytes() == text.encode()


@pytest.mark.parametrize("name, data, offset", [
    ("latin1.txt", "ok so far: café, naïve\n".encode("latin-1"), 14),
    ("cp1252.jsonl", jsonl(["fine", "“quoted” — 8-bit"]).encode("cp1252"), 27),
    ("latin1.txt.gz", gzip.compress("Ça va\n".encode("latin-1"), mtime=0), 0),
], ids=["latin1", "cp1252-jsonl", "latin1-gz"])
def test_8_bit_text_is_refused_as_latin1_with_the_conversion(tmp_path, capsys, name, data, offset):
    src = tmp_path / name
    src.write_bytes(data)
    copy = tmp_path / name.replace(".gz", "").replace(".", "-utf8.")
    command = iconv_command(src, "CP1252", copy)
    rc, err = main(capsys, src, "--out", tmp_path / "out", "--workers", 1)
    assert (rc, err) == (1, f"error: {src}: not valid UTF-8 at byte offset {offset}: it looks like 8-bit text, "
                            f"Latin-1 or Windows-1252: convert it to UTF-8 first, e.g. {command}\n")


@pytest.mark.parametrize("name, data, message", [
    ("corrupt.txt", "naïve".encode() + b" \xff", "not valid UTF-8 at byte offset 7"),  # UTF-8 before it: no guess
    ("binary.txt", bytes(range(256)), "not valid UTF-8 at byte offset 128"),
    ("cut.txt", encode("ab", "UTF-16 LE") + b"c", "not valid UTF-16 at byte offset 6 (truncated data), though it "
                                                   "starts with UTF-16's byte-order mark"),
    ("cut.jsonl", encode(jsonl(["ab"]), "UTF-16 BE")[:-1], "not valid UTF-16 (truncated data), though it starts "
                                                           "with UTF-16's byte-order mark"),
], ids=["corrupt", "binary", "cut-utf16", "cut-utf16-jsonl"])
def test_bytes_of_no_known_encoding_are_refused_without_a_guess(tmp_path, capsys, name, data, message):
    (tmp_path / name).write_bytes(data)
    rc, err = main(capsys, tmp_path / name, "--out", tmp_path / "out", "--workers", 1)
    assert (rc, err) == (1, f"error: {tmp_path / name}: {message}\n")


# ---------------------------------------------------------------- control characters
def test_nul_is_dropped_from_the_text_and_counted(tmp_path, capsys):
    """U+0000 would take id 0, the all-zero code: it never reaches a shard; stderr and meta.json say how many
    were dropped, and the tokens are those of the text without them. The other control characters are text."""
    text = "a\0b\n\0\nc \0\x01\x7f\x1b[0m\tÿ end" * 30 + "<|endoftext|>"
    (tmp_path / "t.txt").write_text(text)
    rc, err = main(capsys, tmp_path / "t.txt", "--out", tmp_path / "out", "--vocab_size", 512, "--workers", 1,
                   "--val_fraction", 0)
    assert (rc, err) == (0, "note: dropped 90 NUL characters (U+0000) from the text: NUL is no text, and by default "
                            "its token has id 0, whose binary code is all zeros (meta.json: dropped_nul)\n")
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    tokens = shard_tokens(tmp_path / "out", meta, "train").tolist()
    enc = get_tokenizer("gpt2", 512, True, True)
    assert meta["dropped_nul"] == 90 and "constant_code_tokens" not in meta and 0 not in tokens and 511 not in tokens
    assert enc.decode(tokens) == text.replace("\0", "") + "<|endoftext|>"


def test_pieces_cut_at_a_nul_tokenize_like_the_whole_text():
    """Documents are cut into pieces before their NULs are dropped (workers.encode_batch): a cut next to a
    NUL would join what the tokenizer splits ("\\n" + "\\n" against "\\n\\n")."""
    enc = get_tokenizer("gpt2", 512, True, True)
    text = "".join(f"word{i}\n\0\nnext \0\n\0x\n" for i in range(200))
    parts = [without_nul(p)[0] for p, _ in workers.pieces(text, 50)]
    assert len(parts) > 20 and [t for p in parts for t in enc.encode_ordinary(p)] == enc.encode_ordinary(
        without_nul(text)[0])
