"""
The inputs that prepare_data.py reads: files, folders and globs, .txt / .jsonl / .parquet, compressed or not,
the named corpora and Hugging Face datasets, each as a stream of documents. Text is UTF-8, or UTF-16 / UTF-32
with its byte-order mark (text_encoding); other bytes are refused naming their likely encoding and the fix.
"""

import bz2
import codecs
import contextlib
import glob
import gzip
import io
import json
import lzma
import os
import re
import shlex
import stat
import sys
import urllib.request
import zlib
from pathlib import Path

from bincode_gpt.exits import one_line
from bincode_gpt.files import atomic_write

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
HUB = {"fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),
       "cosmopedia": ("HuggingFaceTB/cosmopedia", "web_samples_v2")}
NAMED = ("shakespeare", *HUB)
EXTS = (".txt", ".jsonl", ".parquet")
# compressed inputs: known by their first bytes (a gzip file needs no .gz), their suffix naming the compression
MAGICS = {"gzip": re.compile(rb"\x1f\x8b"), "xz": re.compile(rb"\xfd7zXZ\x00"),
          "zstd": re.compile(rb"\x28\xb5\x2f\xfd"),
          "bz2": re.compile(rb"BZh[1-9](\x31\x41\x59\x26\x53\x59|\x17\x72\x45\x38\x50\x90)")}  # a block or the end
PACKED = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}


def resolve_inputs(inputs: list[str]) -> list[str]:
    """Expand folders and globs to sorted files, fetch named corpora; fail before any work."""
    return [f for arg in inputs for f in resolve_input(arg)]


def resolve_input(arg: str) -> list[str]:
    """The files (or the one Hub source) one named input stands for."""
    if os.path.isdir(arg):
        files = sorted(str(p) for p in Path(arg).rglob("*") if input_type(p) in EXTS and not p.is_dir())
        if not files:
            raise ValueError(f"{arg}: folder holds no {'/'.join(EXTS)} files "
                             f"(nor compressed ones: {', '.join(PACKED)})")
        return [regular_file(f) for f in files]
    if os.path.lexists(arg):
        return [regular_file(arg)]
    if arg in HUB or arg.startswith("hf:"):
        return [arg]
    if arg == "shakespeare":
        return [download(SHAKESPEARE_URL, Path(os.environ.get("BCGPT_CORPUS_CACHE", "data")) / "tinyshakespeare.txt")]
    if any(c in arg for c in "*?["):
        files = sorted(f for f in glob.glob(arg, recursive=True) if not os.path.isdir(f))
        if not files:
            raise ValueError(f"{arg}: no files match this pattern")
        return [regular_file(f) for f in files]
    raise ValueError(f"{arg}: no such file or folder (named inputs: {', '.join(NAMED)}, hf:REPO[:CONFIG])")


KINDS = {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device", stat.S_ISFIFO: "a named pipe (FIFO)",
         stat.S_ISSOCK: "a socket"}


def regular_file(path: str) -> str:
    """`path` if it is a regular file (or a symlink to one); else a ValueError saying what it is: a
    device or a pipe is not text to read to its end."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror})") from None
    if stat.S_ISREG(mode):
        return path
    kind = next((k for test, k in KINDS.items() if test(mode)), "not a regular file")
    link = f"a symlink to {os.path.realpath(path)}, " if os.path.islink(path) else ""
    raise ValueError(f"{path}: {link}{kind}, not a file: give a text file, a folder or a named corpus")


def download(url: str, path: Path) -> str:
    """`path`, downloading `url` there unless it is already there."""
    if not path.exists():
        print(f"downloading {url} -> {path}", file=sys.stderr)
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                data = r.read()
        except OSError as e:
            raise OSError(f"could not download {url} ({e}); save it as {path} by hand, "
                          f"or set BCGPT_CORPUS_CACHE to a folder that holds {path.name}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    return str(path)


def input_type(path) -> str:
    """The type of an input file by its name, in any case, a compression suffix dropped: docs.JSONL.GZ -> .jsonl."""
    name = Path(path).name.lower()
    for suffix in PACKED:
        name = name.removesuffix(suffix)
    return Path(name).suffix


def compression(path) -> str | None:
    """gzip, bz2, xz, zstd or None (plain), by the file's first bytes; a ValueError if its suffix names a
    compression its bytes are not."""
    with open(path, "rb") as f:
        head = f.read(10)
    found = next((name for name, magic in MAGICS.items() if magic.match(head)), None)
    named = PACKED.get(Path(path).suffix.lower())
    if named and found != named:
        raise ValueError(f"{path}: named {Path(path).suffix} but is not {named} data (it starts with {head[:4]!r})")
    return found


def open_input(path, packing: str | None):
    """`path` as a binary file that decompresses as it is read (standard library; zstd through the optional
    zstandard package)."""
    if packing == "zstd":
        raw = zstandard(path).ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True, closefd=True)
        return io.BufferedReader(raw)
    return {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open, None: open}[packing](path, "rb")


def zstandard(path):
    """The optional zstandard package, or a ValueError saying that `path` needs it."""
    try:
        import zstandard
    except ImportError:
        raise ValueError(f"{path}: zstd-compressed: reading it needs the optional zstandard package "
                         "(pip install zstandard), or decompress it first (unzstd)") from None
    return zstandard


def broken_archive(e: BaseException) -> bool:
    """Whether a decompressor's exception says its data is truncated or corrupt."""
    zstd = sys.modules.get("zstandard")
    return isinstance(e, (EOFError, OSError, zlib.error, lzma.LZMAError, *([zstd.ZstdError] if zstd else [])))


def check_inputs(sources: list[str], text_field: str) -> int | None:
    """Open every input and read its first document, so that a missing, unreadable, undecodable or
    empty input (or a missing optional package) fails before any work; a compressed file is read to its
    end, so that a truncated or corrupt one fails then too (decompressing is fast beside tokenizing).
    Returns the inputs' uncompressed bytes (for the progress line), None if one streams from the Hub."""
    total = 0
    for source in sources:
        local = os.path.isfile(source)
        size = uncompressed_size(source) if local else None  # first: a truncated archive may end in its first document
        with contextlib.closing(read_documents(source, text_field)) as docs:
            if next(docs, None) is None:
                raise ValueError(f"{source}: no documents (no record has a non-empty {text_field!r})")
        total = total + size if local and total is not None else None
    return total


def uncompressed_size(path) -> int:
    """The bytes of a file once decompressed; a ValueError naming it if its archive is truncated or corrupt."""
    packing = compression(path)
    if packing is None:
        return os.path.getsize(path)
    size = 0
    try:
        if packing == "zstd":  # zstandard's reader ends quietly at a cut-off frame: its decompressor says so
            return zstd_size(path)
        with open_input(path, packing) as f:
            while chunk := f.read(1 << 20):
                size += len(chunk)
    except Exception as e:
        if not broken_archive(e):
            raise
        raise ValueError(f"{path}: not readable {packing} data, truncated or corrupt ({one_line(e)})") from None
    return size


def zstd_size(path) -> int:
    """The decompressed size of a file of zstd frames; EOFError if the last one is cut off."""
    size, obj, dctx = 0, None, zstandard(path).ZstdDecompressor()
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            while data:
                obj = obj if obj and not obj.eof else dctx.decompressobj()
                size += len(obj.decompress(data))
                data = obj.unused_data if obj.eof else b""
    if obj is None or not obj.eof:
        raise EOFError("the last zstd frame is cut off")
    return size


def read_documents(source: str, text_field: str = "text"):
    """The documents (str) of one input: a file (compressed or not), a Hub alias or hf:REPO[:CONFIG]."""
    if source in HUB or source.startswith("hf:"):
        repo, config = HUB[source] if source in HUB else (source[3:].split(":", 1) + [None])[:2]
        yield from hub_documents(repo, config, text_field)
        return
    packing = compression(source)
    try:
        yield from file_documents(source, packing, text_field)
    except Exception as e:
        if packing is None or not broken_archive(e):
            raise
        raise ValueError(f"{source}: not readable {packing} data, truncated or corrupt ({one_line(e)})") from None


def file_documents(source: str, packing: str | None, text_field: str):
    """The documents of a .txt (one), .jsonl or .parquet file, by its type (input_type); `packing` its compression."""
    kind = input_type(source)
    if os.path.getsize(source) == 0:
        raise ValueError(f"{source}: empty file")
    elif kind == ".jsonl":
        with open_input(source, packing) as f:
            encoding = text_encoding(f.read(HEAD), source, packing)
        with open_input(source, packing) as f:  # read again from its start: a compressed stream cannot seek back
            for lineno, line in enumerate(text_lines(f, encoding, source, packing), 1):
                if line.strip():
                    try:
                        record = json.loads(line.removeprefix(BOM))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{source}:{lineno}: invalid JSON ({e.msg})") from None
                    except RecursionError:  # the parser recurses once per bracket
                        raise ValueError(f"{source}:{lineno}: JSON nested too deeply to read "
                                         "(not a text record)") from None
                    yield from record_texts([record], text_field, f"{source}:{lineno}")
    elif kind == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"{source}: reading .parquet needs the optional pyarrow package "
                             "(pip install pyarrow)") from None
        if packing:  # parquet reads its footer first: a compressed file is decompressed into memory (its columns
            with open_input(source, packing) as f:  # are compressed inside the file anyway, so this is rare)
                data = f.read()
        table = pq.ParquetFile(io.BytesIO(data) if packing else source)
        if text_field not in table.schema_arrow.names:
            raise ValueError(f"{source}: no column {text_field!r} (has {table.schema_arrow.names}; try --text_field)")
        for batch in table.iter_batches(columns=[text_field]):  # nulls skipped; a value that is no string refused
            yield from record_texts(({text_field: t} for t in batch.column(0).to_pylist() if t is not None), text_field,
                                    source)
    else:
        with open_input(source, packing) as f:
            data = f.read()
        if not data:
            raise ValueError(f"{source}: empty file (once decompressed)")
        text = decode_text(data, source, packing)
        if not text.strip():
            raise ValueError(f"{source}: empty file (only whitespace)")
        yield text


# a byte-order mark (Windows editors write one at a file's start) is not text: dropped at document starts
BOM = "\ufeff"
# UTF-16 and UTF-32 text starts with a byte-order mark, the one certain sign of an encoding (UTF-32 LE's starts with
# UTF-16 LE's, so it is tried first); Python's UTF-16 and UTF-32 codecs read the mark and drop it
MARKS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))
HEAD = 4096  # the first bytes of a file, enough to tell its encoding
CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r")  # bytes that text seldom holds
# Text in UTF-16 without its mark: the high byte of nearly every code unit is below 0x20 (0 for Latin letters, 4 for
# Cyrillic, 6 for Arabic...), so control bytes fill every other byte offset; in UTF-32, two or three of every four.
# The offsets (mod 4) where most bytes are control bytes -> the encoding.
UNMARKED = {(1, 3): "UTF-16LE", (0, 2): "UTF-16BE", (2, 3): "UTF-32LE", (1, 2, 3): "UTF-32LE", (0, 1): "UTF-32BE",
            (0, 1, 2): "UTF-32BE"}
UNPACK = {"gzip": "gzip -dc", "bz2": "bzip2 -dc", "xz": "xz -dc", "zstd": "zstd -dc"}  # the decompressors' commands


def text_encoding(head: bytes, name: str, packing: str | None = None) -> str:
    """The encoding of a text file by its first bytes (decompressed): UTF-16 or UTF-32 by its byte-order mark,
    else UTF-8. Bytes laid out as UTF-16 or UTF-32 without a mark are refused, naming the encoding and the
    conversion: read as UTF-8 they would be text with a control character after every letter."""
    marked = next((encoding for mark, encoding in MARKS if head.startswith(mark)), None)
    if marked:
        return marked
    n = len(head) // 4 * 4
    offsets = tuple(r for r in range(4) if n and count_control(head[r:n:4]) > n // 8)  # over half of their n / 4
    wide = UNMARKED.get(offsets)
    if wide:
        raise ValueError(f"{name}: looks like {wide} text without a byte-order mark, not UTF-8: convert it to UTF-8 "
                         f"first, e.g. {conversion(name, packing, wide)}")
    return "UTF-8"


def count_control(data: bytes) -> int:
    """How many of `data`'s bytes are control bytes (CONTROL)."""
    return len(data) - len(data.translate(None, CONTROL))


def conversion(name: str, packing: str | None, encoding: str) -> str:
    """The command line that writes a UTF-8 copy of the input `name` in `encoding` beside it (decompressed)."""
    path = Path(name)
    plain = path.name
    for suffix in PACKED:  # notes.txt.gz -> notes.txt, as input_type reads it
        plain = plain[:-len(suffix)] if plain.lower().endswith(suffix) else plain
    copy = shlex.quote(str(path.with_name(f"{Path(plain).stem}-utf8{Path(plain).suffix}")))
    iconv = f"iconv -f {encoding} -t UTF-8"
    if packing:
        return f"{UNPACK[packing]} {shlex.quote(name)} | {iconv} > {copy}"
    return f"{iconv} {shlex.quote(name)} > {copy}"


def decode_text(data: bytes, name: str, packing: str | None = None) -> str:
    """A text file's bytes (decompressed) as text, in the encoding text_encoding tells, its byte-order mark dropped."""
    encoding = text_encoding(data[:HEAD], name, packing)
    if encoding == "UTF-8":
        return decode_utf8(data, name, packing=packing).removeprefix(BOM)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not valid {encoding} at byte offset {e.start} ({e.reason}), though it starts "
                         f"with {encoding}'s byte-order mark") from None


def text_lines(f, encoding: str, name: str, packing: str | None = None):
    """The lines of a binary stream as text: UTF-8 line by line (an error names its byte offset), UTF-16 and
    UTF-32 through an incremental decoder, which never cuts a code unit or a character in two, wherever the
    stream's reads end."""
    if encoding == "UTF-8":
        offset = 0  # of the line, in the uncompressed bytes
        for line in f:
            yield decode_utf8(line, name, offset, packing)
            offset += len(line)
        return
    try:
        yield from io.TextIOWrapper(f, encoding, newline="\n")  # lines end at "\n" only, as they do in bytes
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not valid {encoding} ({e.reason}), though it starts with {encoding}'s byte-order "
                         "mark") from None


def decode_utf8(data: bytes, name: str, offset: int = 0, packing: str | None = None) -> str:
    """`data` (bytes of `name` from `offset` on) as UTF-8; else a ValueError naming the offset, and Latin-1 and the
    conversion where the bytes look like 8-bit text: ASCII up to the first byte that is not UTF-8, no NUL, hardly
    any control bytes (a UTF-8 file with a corrupt byte has UTF-8 characters before it, a binary file many
    control bytes)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"{name}: not valid UTF-8 at byte offset {offset + e.start}"
        if not data[:e.start].isascii() or b"\0" in data or count_control(data) * 100 > len(data):
            raise ValueError(where) from None
        raise ValueError(f"{where}: it looks like 8-bit text, Latin-1 or Windows-1252: convert it to UTF-8 first, "
                         f"e.g. {conversion(name, packing, 'CP1252')}") from None


def record_texts(records, text_field: str, name: str):
    """The non-empty `text_field` strings of dict records (JSONL lines, Hub rows)."""
    for record in records:
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{name}: record has no string field {text_field!r} (try --text_field)")
        try:
            text.encode("utf-8")  # a JSON "\\ud800" escape decodes to a lone surrogate, which is no text
        except UnicodeEncodeError as e:
            code = ord(text[e.start])
            raise ValueError(f"{name}: {text_field!r} holds a lone surrogate (\\u{code:04x}) at character "
                             f"{e.start}, which is not Unicode text") from None
        text = text.removeprefix(BOM)
        if text:
            yield text


def hub_documents(repo: str, config: str | None, text_field: str = "text"):
    """Stream a Hugging Face Hub dataset's train split through the optional `datasets`."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"hf:{repo}: streaming from the Hugging Face Hub needs the optional "
                         "datasets package (pip install datasets)") from None
    stream = datasets.load_dataset(repo, config, split="train", streaming=True)
    yield from record_texts(stream, text_field, f"hf:{repo}")
