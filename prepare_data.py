"""Tokenize text corpora into binary token shards for train.py.

    python prepare_data.py shakespeare --out data/shakespeare
    python prepare_data.py notes/ more.jsonl --out data/mine --vocab_size 8192
    python prepare_data.py fineweb-edu cosmopedia --mix 0.7 --max_tokens 1e9 --out data/paper

Design choices:
- Tokenizer: any tiktoken encoding; `vocab_size=N` keeps its first N-1 BPE merge
  ranks (a prefix of the ranks is still a valid BPE) and puts <|endoftext|> at id N-1.
- Documents: a .txt file is one document; .jsonl / .parquet give one document per
  record (its `text_field`, empty ones skipped); Hub datasets stream one per record.
  Every document is followed by the end-of-text token.
- Train/val split: document i (0-based, input order) is val when
  floor((i+1)*f) > floor(i*f), i.e. every 10th document for f=0.1, spread over the
  whole corpus rather than taken from its end. If there are too few documents for
  one of them to be val (fewer than 1/f), each document is cut by characters
  instead: its first int(len*(1-f)) characters are train, the rest val (so one big
  .txt file such as tinyshakespeare gets the usual 90/10 character split).
- Mixtures (`--mix`): documents are drawn from the inputs with the given weights by
  a seeded RNG (a document-level ratio); the mixture stops when any input runs dry.
- Budget (`--max_tokens`): whole documents only; stop before the first document
  that would take train+val past the budget.
- Parallelism: long documents are cut into ~256k-character pieces only right after
  "<non-space>\\n" and before a non-space, a point where the tokenizer's regex splits
  anyway, so tokens equal encoding the whole document at once. Pieces are grouped
  into batches that a process pool encodes in order: output bytes do not depend
  on the worker count.
- Shard file (little-endian): 32-byte header = b"BCGPTTOK", uint32 version (1),
  uint32 token width in bytes (2 or 4), uint64 token count, 8 zero bytes; then the
  tokens (uint16 when the vocabulary fits, else uint32). Shards are written to a
  .tmp file and renamed, and meta.json is written last, so a crash never leaves a
  shard or a folder that looks complete.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import re
import struct
import sys
import time
import urllib.request
from collections import deque
from functools import lru_cache
from itertools import chain, islice
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import tiktoken

MAGIC, VERSION, HEADER = b"BCGPTTOK", 1, struct.Struct("<8sIIQ8x")  # 32 bytes
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
PIECE_CHARS = 1 << 18  # size of the units sent to workers; does not change the output
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
HUB = {"fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),
       "cosmopedia": ("HuggingFaceTB/cosmopedia", "web_samples_v2")}
EXTS = (".txt", ".jsonl", ".parquet")
# machines without internet keep the corpora beside the checkout (see the project's README)
OFFLINE_AUSTEN = Path(__file__).resolve().parent.parent / "shared" / "data" / "janeausten.txt"


class ShardError(ValueError):
    """A shard file or a prepared data folder is missing, malformed or truncated."""


# ---------------------------------------------------------------- tokenizer
@lru_cache(maxsize=8)  # building a cut encoding takes ~0.2 s; forked pool workers inherit the cache
def get_tokenizer(encoding: str = "gpt2", vocab_size: int | None = None) -> tiktoken.Encoding:
    """A tiktoken encoding, optionally cut to its first `vocab_size` - 1 merge ranks + EOT."""
    if encoding not in tiktoken.list_encoding_names():
        raise ValueError(f"unknown encoding {encoding!r}; choose one of {tiktoken.list_encoding_names()}")
    base = tiktoken.get_encoding(encoding)
    if vocab_size is None or vocab_size == base.n_vocab:
        return base
    ranks = base._mergeable_ranks
    # The cut needs the 256 single bytes (so any text encodes) and cannot add ranks.
    if not 257 <= vocab_size <= len(ranks) + 1:
        full = f" or {base.n_vocab}" if base.n_vocab != len(ranks) + 1 else ""
        raise ValueError(f"vocab_size must be in [257, {len(ranks) + 1}]{full} for {encoding}, got {vocab_size}")
    kept = {b: r for b, r in ranks.items() if r < vocab_size - 1}
    return tiktoken.Encoding(name=f"{encoding}_{vocab_size}", pat_str=base._pat_str,
                             mergeable_ranks=kept, special_tokens={"<|endoftext|>": vocab_size - 1})


def token_dtype(n_vocab: int) -> np.dtype:
    return DTYPES[2] if n_vocab <= 1 << 16 else DTYPES[4]


# ---------------------------------------------------------------- shards
def write_shard(path, tokens: np.ndarray) -> None:
    """Write 1-d `tokens` atomically to `path`; uint16/uint32 are kept, other integers narrowed."""
    tokens = np.asarray(tokens)
    if tokens.dtype not in (np.uint16, np.uint32):
        if tokens.dtype.kind not in "ui" or tokens.size and (tokens.min() < 0 or tokens.max() >= 1 << 32):
            raise ValueError(f"{path}: token ids must be integers in [0, 2**32), got {tokens.dtype}")
        tokens = tokens.astype(token_dtype(int(tokens.max(initial=0)) + 1))
    tokens = np.ascontiguousarray(tokens.ravel(), DTYPES[tokens.itemsize])  # little-endian on any host
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, tokens.itemsize, tokens.size))
            f.write(tokens.data)
            f.flush()
            os.fsync(f.fileno())  # the rename must not land before the data
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_shard(path) -> np.ndarray:
    """A read-only memmap of the tokens in a shard; ShardError if it is malformed."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise ShardError(f"{path}: truncated header ({size} bytes)")
    magic, version, width, count = HEADER.unpack(head)
    if magic != MAGIC:
        raise ShardError(f"{path}: not a token shard (magic {magic!r})")
    if version != VERSION or width not in DTYPES:
        raise ShardError(f"{path}: unsupported shard version {version} / token width {width}")
    body = size - HEADER.size
    if body != count * width:
        what = "truncated" if body < count * width else "longer than its header says"
        raise ShardError(f"{path}: {what}: header says {count} tokens ({count * width} bytes), body has {body}")
    if count == 0:  # np.memmap cannot map zero bytes
        empty = np.zeros(0, DTYPES[width])
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=DTYPES[width], mode="r", offset=HEADER.size, shape=(count,))


def load_meta(folder) -> dict:
    """meta.json of a prepared folder, checked to list shards that exist."""
    path = Path(folder) / "meta.json"
    if not path.is_file():
        raise ShardError(f"{folder}: no meta.json; run prepare_data.py on it first")
    meta = json.loads(path.read_text())
    shards = [s for split in meta.get("splits", {}).values() for s in split["shards"]]
    if not shards:
        raise ShardError(f"{folder}: meta.json lists no shards")
    missing = [s for s in shards if not (Path(folder) / s).is_file()]
    if missing:
        raise ShardError(f"{folder}: missing shards {missing[:3]}")
    return meta


class ShardWriter:
    """Buffers one split's tokens and writes them out in shards of exactly `shard_tokens`."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int, dtype: np.dtype):
        self.out_dir, self.split, self.size, self.dtype = out_dir, split, shard_tokens, dtype
        self.buf, self.buffered, self.shards = [], 0, []
        self.tokens = self.bytes = self.documents = 0

    def add(self, tokens: np.ndarray, nbytes: int) -> None:
        """One whole document (its tokens end with EOT) and its UTF-8 size."""
        self.buf.append(tokens)
        self.buffered += len(tokens)
        self.tokens, self.bytes, self.documents = self.tokens + len(tokens), self.bytes + nbytes, self.documents + 1
        while self.buffered >= self.size:
            self._flush(self.size)

    def _flush(self, n: int) -> None:
        flat = np.concatenate(self.buf).astype(self.dtype, copy=False)
        name = f"{self.split}_{len(self.shards):06d}.bin"
        write_shard(self.out_dir / name, flat[:n])
        self.shards.append(name)
        self.buf, self.buffered = [flat[n:]], len(flat) - n

    def close(self) -> dict:
        if self.buffered:
            self._flush(self.buffered)
        return {"shards": self.shards, "tokens": self.tokens, "bytes": self.bytes, "documents": self.documents}


# ---------------------------------------------------------------- inputs
def resolve_inputs(inputs: list[str], cache_dir: str) -> list[str]:
    """Expand folders and globs to sorted files, fetch named corpora; fail before any work."""
    out = []
    for arg in inputs:
        if os.path.isdir(arg):
            files = sorted(str(p) for p in Path(arg).rglob("*") if p.suffix in EXTS and p.is_file())
            if not files:
                raise ValueError(f"{arg}: folder holds no {'/'.join(EXTS)} files")
            out += files
        elif os.path.exists(arg) or arg in HUB or arg.startswith("hf:"):
            out.append(arg)
        elif arg == "shakespeare":
            out.append(download(SHAKESPEARE_URL, Path(cache_dir) / "tinyshakespeare.txt"))
        elif any(c in arg for c in "*?["):
            files = sorted(f for f in glob.glob(arg, recursive=True) if os.path.isfile(f))
            if not files:
                raise ValueError(f"{arg}: no files match this pattern")
            out += files
        else:
            raise ValueError(f"{arg}: no such file or folder (named inputs: shakespeare, {', '.join(HUB)}, hf:REPO[:CONFIG])")
    return out


def default_prose() -> str:
    """The prose corpus of compare.py and bench.py: Jane Austen where it lies offline beside the
    checkout, else tiny Shakespeare (downloaded on first use)."""
    return str(OFFLINE_AUSTEN) if OFFLINE_AUSTEN.is_file() else "shakespeare"


def download(url: str, path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"downloading {url} -> {path}", file=sys.stderr)
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                data = r.read()
        except OSError as e:
            raise OSError(f"could not download {url} ({e}); save it as {path} by hand") from None
        Path(f"{path}.tmp").write_bytes(data)
        os.replace(f"{path}.tmp", path)
    return str(path)


def decode_utf8(data: bytes, name: str, offset: int = 0) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not valid UTF-8 at byte offset {offset + e.start}") from None


def read_documents(source: str, text_field: str = "text") -> Iterator[str]:
    """The documents of one input: a file, a Hub alias or hf:REPO[:CONFIG]."""
    if source in HUB or source.startswith("hf:"):
        repo, config = HUB[source] if source in HUB else (source[3:].split(":", 1) + [None])[:2]
        yield from hub_documents(repo, config, text_field)
        return
    if os.path.getsize(source) == 0:
        raise ValueError(f"{source}: empty file")
    if source.endswith(".jsonl"):
        offset = 0
        with open(source, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        record = json.loads(decode_utf8(line, source, offset))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{source}:{lineno}: invalid JSON ({e.msg})") from None
                    yield from record_texts([record], text_field, f"{source}:{lineno}")
                offset += len(line)
    elif source.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"{source}: reading .parquet needs the optional pyarrow package (pip install pyarrow)") from None
        table = pq.ParquetFile(source)
        if text_field not in table.schema_arrow.names:
            raise ValueError(f"{source}: no column {text_field!r} (has {table.schema_arrow.names}; try --text_field)")
        for batch in table.iter_batches(columns=[text_field]):
            yield from (t for t in batch.column(0).to_pylist() if t)
    else:
        text = decode_utf8(Path(source).read_bytes(), source)
        if not text.strip():
            raise ValueError(f"{source}: empty file (only whitespace)")
        yield text


def record_texts(records: Iterable[dict], text_field: str, name: str) -> Iterator[str]:
    """The non-empty `text_field` strings of dict records (JSONL lines, Hub rows)."""
    for record in records:
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{name}: record has no string field {text_field!r} (try --text_field)")
        if text:
            yield text


def hub_documents(repo: str, config: str | None, text_field: str = "text") -> Iterator[str]:
    """Stream a Hugging Face Hub dataset's train split through the optional `datasets`."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"hf:{repo}: streaming from the Hugging Face Hub needs the optional "
                         "datasets package (pip install datasets)") from None
    stream = datasets.load_dataset(repo, config, split="train", streaming=True)
    yield from record_texts(stream, text_field, f"hf:{repo}")


def mix_documents(streams: list[Iterable[str]], weights: list[float], seed: int = 0) -> Iterator[str]:
    """Draw each next document from stream k with probability weights[k] (seeded);
    stop when any stream is exhausted, so the ratio holds for everything emitted."""
    if len(weights) != len(streams) or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"need one non-negative weight per input, got {weights} for {len(streams)} inputs")
    rng, its = random.Random(seed), [iter(s) for s in streams]
    while True:
        k = rng.choices(range(len(its)), weights)[0]
        doc = next(its[k], None)
        if doc is None:
            return
        yield doc


def split_documents(docs: Iterable[str], val_fraction: float) -> Iterator[tuple[str, str]]:
    """(split, text) pairs by the rule in the module docstring."""
    it = iter(docs)
    need = math.ceil(1 / val_fraction - 1e-9) if val_fraction > 0 else 1
    head = list(islice(it, need))  # too few documents -> cut each by characters
    if len(head) < need:
        for text in head:
            cut = int(len(text) * (1 - val_fraction))
            yield from ((s, part) for s, part in (("train", text[:cut]), ("val", text[cut:])) if part)
        return
    for i, text in enumerate(chain(head, it)):
        val = math.floor((i + 1) * val_fraction + 1e-9) > math.floor(i * val_fraction + 1e-9)
        yield ("val" if val else "train"), text


# ---------------------------------------------------------------- tokenizing
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def pieces(text: str, size: int | None = None) -> Iterator[str]:
    """Cut a long text where the tokenizer's pre-split regex would cut anyway."""
    start, size = 0, size or PIECE_CHARS
    while len(text) - start > size:
        m = _SAFE_CUT.search(text, start + size)
        if not m:
            break
        yield text[start:m.start()]
        start = m.start()
    yield text[start:]


def batches(docs: Iterable[tuple[str, str]], size: int | None = None) -> Iterator[tuple[str, list]]:
    """Group (piece, ends_document) of one split into batches of about `size` characters."""
    split, batch, chars, size = None, [], 0, size or PIECE_CHARS
    for doc_split, text in docs:
        for piece, last in _with_last(pieces(text, size)):
            if batch and (doc_split != split or chars >= size):
                yield split, batch
                batch, chars = [], 0
            split, chars = doc_split, chars + len(piece)
            batch.append((piece, last))
    if batch:
        yield split, batch


def _with_last(it: Iterator) -> Iterator[tuple]:
    prev = next(it)
    for x in it:
        yield prev, False
        prev = x
    yield prev, True


_enc = None


def _init_worker(encoding: str, vocab_size: int | None) -> None:
    global _enc
    _enc = get_tokenizer(encoding, vocab_size)


def _encode(job: tuple[str, list]) -> tuple[str, list]:
    """-> split, [(tokens of the piece + EOT if it ends a document, UTF-8 bytes, ends)]."""
    split, batch = job
    dtype = token_dtype(_enc.n_vocab)
    out = []
    for piece, last in batch:
        ids = _enc.encode_ordinary(piece) + ([_enc.eot_token] if last else [])
        out.append((np.array(ids, dtype=dtype), len(piece.encode("utf-8")), last))
    return split, out


def encoded(jobs: Iterator, encoding: str, vocab_size: int | None, workers: int) -> Iterator:
    """_encode over jobs, in order. A bounded window of apply_async (not Pool.imap, whose
    feeder thread would read the whole input into memory ahead of the workers)."""
    if workers <= 1:
        _init_worker(encoding, vocab_size)
        yield from map(_encode, jobs)
        return
    import multiprocessing as mp
    with mp.Pool(workers, _init_worker, (encoding, vocab_size)) as pool:
        pending = deque()
        for job in jobs:
            pending.append(pool.apply_async(_encode, (job,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


class Progress:
    """A one-line progress report on stderr, at most twice a second."""

    def __init__(self, total_bytes: int | None, enabled: bool = True):
        self.total, self.enabled, self.t0 = total_bytes, enabled, time.time()
        self.last = self.t0

    def update(self, nbytes: int, tokens: int, final: bool = False) -> None:
        now = time.time()
        if not self.enabled or (now - self.last < 0.5 and not final):
            return
        self.last, mb = now, nbytes / 1e6
        pct = f"{min(100, 100 * nbytes / self.total):3.0f}% " if self.total else ""
        sys.stderr.write(f"\r{pct}{mb:,.1f} MB, {tokens:,} tokens, {mb / max(now - self.t0, 1e-9):.1f} MB/s"
                         + ("\n" if final else ""))
        sys.stderr.flush()


# ---------------------------------------------------------------- main logic
def prepare(inputs: list[str], out_dir: str, encoding: str = "gpt2", vocab_size: int | None = None,
            val_fraction: float = 0.1, shard_tokens: int = 100_000_000, workers: int | None = None,
            overwrite: bool = False, text_field: str = "text", mix: list[float] | None = None,
            max_tokens: int | None = None, seed: int = 0, cache_dir: str = "data",
            progress: bool = True) -> dict:
    """Tokenize `inputs` into train/val shards in `out_dir`; returns the meta written there."""
    if not inputs:
        raise ValueError("no inputs given")
    if not 0 <= val_fraction < 1 or shard_tokens < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"need 0 <= val_fraction < 1, shard_tokens >= 1, max_tokens >= 1; "
                         f"got {val_fraction}, {shard_tokens}, {max_tokens}")
    enc = get_tokenizer(encoding, vocab_size)  # validate everything cheap before any work
    sources = resolve_inputs(inputs, cache_dir)
    out = Path(out_dir)
    old = _prepared_files(out)
    if old and not overwrite:
        raise ValueError(f"{out_dir}: already holds prepared data ({old[0].name}); pass --overwrite to replace it")
    for p in old:
        p.unlink()
    out.mkdir(parents=True, exist_ok=True)

    streams = [read_documents(s, text_field) for s in sources]
    if mix is not None:
        weights = mix + [1 - sum(mix)] if len(mix) == len(streams) - 1 else mix  # "--mix 0.7" for two inputs
        docs = mix_documents(streams, weights, seed)
    else:
        docs = chain.from_iterable(streams)
    dtype = token_dtype(enc.n_vocab)
    writers = {s: ShardWriter(out, s, shard_tokens, dtype) for s in ("train", "val")}
    local = [s for s in sources if os.path.isfile(s)]
    bar = Progress(sum(map(os.path.getsize, local)) if len(local) == len(sources) else None, progress)
    try:  # a failure (bad file halfway, Ctrl-C) must not leave shards behind that block the next run
        jobs = batches(split_documents(docs, val_fraction))
        _tokenize(encoded(jobs, encoding, vocab_size, workers or os.cpu_count() or 1), writers, max_tokens, bar)
        splits = {s: w.close() for s, w in writers.items()}
        if not splits["train"]["tokens"]:
            raise ValueError("no training documents (inputs empty, or --max_tokens below the first document)")
    except BaseException:
        for p in _prepared_files(out):
            p.unlink()
        raise
    meta = {"version": VERSION, "encoding": encoding, "vocab_size": enc.n_vocab, "eot_token": enc.eot_token,
            "dtype": dtype.name, "splits": splits, "sources": sources, "val_fraction": val_fraction,
            "text_field": text_field, "mix": mix, "max_tokens": max_tokens, "seed": seed}
    (out / "meta.json.tmp").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(out / "meta.json.tmp", out / "meta.json")  # last: marks the folder complete
    return meta


def _prepared_files(out: Path) -> list[Path]:
    """Files of a previous run, meta.json first so the folder stops looking complete at once."""
    found = [p for p in out.glob("*") if re.fullmatch(r"((train|val)_\d+\.bin|meta\.json)(\.tmp)?", p.name)]
    return sorted(found, key=lambda p: (p.name != "meta.json", p.name))


def _tokenize(results: Iterator, writers: dict, max_tokens: int | None, bar: Progress) -> None:
    """Hand each finished document to its split's writer; stop before exceeding the budget."""
    total = seen = 0  # tokens kept, source bytes tokenized
    doc = []  # (tokens, bytes) of the current document's pieces: the budget admits whole documents
    for split, batch in results:
        for tokens, nbytes, last in batch:
            doc.append((tokens, nbytes))
            seen += nbytes
            if not last:
                continue
            n = sum(len(t) for t, _ in doc)
            if max_tokens is not None and total + n > max_tokens:
                results.close()  # stops the pool now, not whenever the generator is collected
                bar.update(seen, total, final=True)
                return
            total += n
            writers[split].add(np.concatenate([t for t, _ in doc]), sum(b for _, b in doc))
            doc = []
        bar.update(seen, total)
    bar.update(seen, total, final=True)


def _count(s: str) -> int:
    return int(float(s))  # accepts 1e9


def _weights(s: str) -> list[float]:
    return [float(x) for x in s.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Details: the module docstring.")
    p.add_argument("inputs", nargs="+", help="files (.txt = one document, .jsonl, .parquet), folders, globs, "
                   f"'shakespeare' (downloaded), Hub datasets {', '.join(HUB)} or hf:REPO[:CONFIG]")
    p.add_argument("--out", required=True, help="output folder for train_*.bin, val_*.bin, meta.json")
    p.add_argument("--encoding", default="gpt2", help=f"tiktoken encoding (default: %(default)s): {', '.join(tiktoken.list_encoding_names())}")
    p.add_argument("--vocab_size", type=int, default=None, help="keep the first N-1 BPE ranks, EOT = N-1 (default: full)")
    p.add_argument("--val_fraction", type=float, default=0.1, help="share of documents (or characters) for val (default: %(default)s)")
    p.add_argument("--shard_tokens", type=_count, default=100_000_000, help="tokens per shard file, e.g. 1e8 (default: %(default)s)")
    p.add_argument("--text_field", default="text", help="record field holding the text in .jsonl/.parquet/Hub (default: %(default)s)")
    p.add_argument("--mix", type=_weights, default=None,
                   help="document weights per input, e.g. 0.7 (two inputs) or 0.5,0.3,0.2; default: concatenate")
    p.add_argument("--max_tokens", type=_count, default=None, help="token budget for train+val, whole documents, e.g. 1e9 (default: no limit)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --mix draws (default: %(default)s)")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="tokenizer processes; 1 = no pool (default: all cores, %(default)s)")
    p.add_argument("--cache_dir", default="data", help="where named corpora are downloaded (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace prepared data already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    a = p.parse_args(argv)
    try:
        meta = prepare(a.inputs, a.out, a.encoding, a.vocab_size, a.val_fraction, a.shard_tokens, a.workers,
                       a.overwrite, a.text_field, a.mix, a.max_tokens, a.seed, a.cache_dir, not a.quiet)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, s in meta["splits"].items():
        print(f"{name}: {s['tokens']:,} tokens, {s['documents']:,} documents, {s['bytes']:,} bytes, {len(s['shards'])} shards")
    return 0


if __name__ == "__main__":
    sys.exit(main())
