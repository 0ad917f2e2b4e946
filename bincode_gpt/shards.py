"""
The token shard format that prepare_data.py writes and training reads, meta.json (the folder's index), the
windows that training and evaluation read from the shards (Split, with its warning for windows that start on a
token the model reads as a constant vector), and the data's fingerprint (what a saved position in the training
order indexes).

Shard file (little-endian): 32-byte header = b"BCGPTTOK", uint32 version (1), uint32 token width in bytes
(2 or 4), uint64 token count, uint32 vocab_size and uint32 tokenizer tag (tokenizer_tag: the tokenizer that
made the ids; both 0 in shards written before the header carried them); then the tokens (uint16 when the
vocabulary fits, else uint32). load_meta holds every header to its meta.json, so a meta.json edited, kept
from an older preparation or copied from another folder is refused before any work.
"""

import hashlib
import json
import os
import shlex
import struct
import zlib
from pathlib import Path

import numpy as np

from bincode_gpt.exits import say
from bincode_gpt.files import atomic_open, file_problem
from bincode_gpt.inputs import HUB
from bincode_gpt.tokenizer import all_ones_id, tiktoken_entry

# prepare_data.py's defaults of the settings meta.json records, which prepare_command leaves out
PREPARED_DEFAULTS = {"val_fraction": 0.1, "text_field": "text", "max_tokens": None, "seed": 0, "doc_chars": 0}

MAGIC, VERSION, HEADER = b"BCGPTTOK", 1, struct.Struct("<8sIIQII")  # 32 bytes
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class ShardError(ValueError):
    """A shard file or a prepared data folder is missing, malformed or truncated."""


def token_dtype(n_vocab: int) -> np.dtype:
    return DTYPES[2] if n_vocab <= 1 << 16 else DTYPES[4]


def tokenizer_tag(meta: dict) -> int:
    """A 32-bit tag of the tokenizer a meta.json names (encoding, vocab_size, the reserved ids): what each
    shard's header carries, so that a shard and a meta.json of other preparations are told apart."""
    made_with = [meta["encoding"], meta["vocab_size"], meta.get("reserve_zero", False), meta.get("reserve_ones", False)]
    return zlib.crc32(json.dumps(made_with).encode())


def write_shard(path, tokens: np.ndarray, made_with: dict | None = None) -> None:
    """Write 1-d `tokens` atomically to `path`; uint16/uint32 are kept, other integers narrowed. `made_with`:
    the tokenizer's part of meta.json (encoding, vocab_size, reserve_zero, reserve_ones), for the header;
    None leaves it unrecorded."""
    tokens = np.asarray(tokens)
    if tokens.dtype not in (np.uint16, np.uint32):
        if tokens.dtype.kind not in "ui" or tokens.size and (tokens.min() < 0 or tokens.max() >= 1 << 32):
            raise ValueError(f"{path}: token ids must be integers in [0, 2**32), got {tokens.dtype}")
        tokens = tokens.astype(token_dtype(int(tokens.max(initial=0)) + 1))
    tokens = np.ascontiguousarray(tokens.ravel(), DTYPES[tokens.itemsize])  # little-endian on any host
    with atomic_open(path) as f:
        vocab_size, tag = (made_with["vocab_size"], tokenizer_tag(made_with)) if made_with else (0, 0)
        f.write(HEADER.pack(MAGIC, VERSION, tokens.itemsize, tokens.size, vocab_size, tag))
        f.write(tokens.data)


def read_header(path) -> tuple[int, int, int, int]:
    """(token width, token count, vocab_size, tokenizer tag) of a shard; ShardError if it is malformed."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise ShardError(f"{path}: truncated header ({size} bytes)")
    magic, version, width, count, vocab_size, tag = HEADER.unpack(head)
    if magic != MAGIC:
        raise ShardError(f"{path}: not a token shard (magic {magic!r})")
    if version != VERSION or width not in DTYPES:
        raise ShardError(f"{path}: unsupported shard version {version} / token width {width}")
    body = size - HEADER.size
    if body != count * width:
        what = "truncated" if body < count * width else "longer than its header says"
        raise ShardError(f"{path}: {what}: header says {count} tokens ({count * width} bytes), body has {body}")
    return width, count, vocab_size, tag


def read_shard(path) -> np.ndarray:
    """A read-only memmap of the tokens in a shard; ShardError if it is malformed."""
    width, count, _, _ = read_header(path)
    if count == 0:  # np.memmap cannot map zero bytes
        empty = np.zeros(0, DTYPES[width])
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=DTYPES[width], mode="r", offset=HEADER.size, shape=(count,))


def load_meta(folder) -> dict:
    """meta.json of a prepared folder; ShardError naming the file if it is missing, lacks what its
    readers use (vocab_size, encoding, the splits' shards and token counts) or lists missing shards."""
    path = Path(folder) / "meta.json"
    if not os.fspath(folder):  # else meta.json would be looked for in the current folder
        raise ValueError("--data_dir is '' (empty): name a folder")
    problem = file_problem(path)
    if problem == "no such file":
        raise ShardError(f"{folder}: no meta.json; prepare the data first "
                         "(`python prepare_data.py shakespeare` writes the default, data/shakespeare)")
    if problem:
        raise ShardError(f"{path}: {problem}; prepare the data again, or point at the folder it is in")
    try:
        meta = json.loads(path.read_bytes())
    except ValueError as e:  # not JSON, or not UTF-8
        raise ShardError(f"{path}: not valid JSON ({e})") from None
    if not is_meta(meta):
        raise ShardError(f"{path}: malformed: needs a positive vocab_size, an encoding and splits "
                         '{"train": {"shards": [file names], "tokens": N}, ...}; prepare the folder again')
    missing = [s for split in meta["splits"].values() for s in split["shards"] if not (Path(folder) / s).is_file()]
    if missing:
        raise ShardError(f"{folder}: missing shards {missing[:3]}")
    check_headers(folder, meta)
    return meta


OTHER_PREPARATION = ": the two come from different preparations; prepare the folder again"


def check_headers(folder, meta: dict) -> None:
    """A ShardError naming the file and both values where a shard's header disagrees with meta.json: its
    vocab_size or tokenizer (where the header records them), its token width (meta.json's dtype), or the
    token count of its split. Reads 32 bytes a shard."""
    meta_path = Path(folder) / "meta.json"
    tag = tokenizer_tag(meta)
    widths = {d.name: d.itemsize for d in DTYPES.values()}  # meta.json's dtype: "uint16", "uint32"
    width = widths.get(meta["dtype"]) if isinstance(meta.get("dtype"), str) else None
    for split, info in meta["splits"].items():
        count = 0
        for name in info["shards"]:
            path = Path(folder) / name
            their_width, n, vocab_size, their_tag = read_header(path)
            count += n
            if vocab_size and vocab_size != meta["vocab_size"]:
                raise ShardError(f"{path}: its header says vocab_size {vocab_size}, but {meta_path} says "
                                 f"{meta['vocab_size']}{OTHER_PREPARATION}")
            if vocab_size and their_tag != tag:
                raise ShardError(f"{path}: its header says tokenizer {tokenizer_named(their_tag, meta)}, but "
                                 f"{meta_path} says {tokenizer_named(tag, meta)}{OTHER_PREPARATION}")
            if width and their_width != width:
                raise ShardError(f"{path}: its header says {their_width}-byte tokens, but {meta_path} says dtype "
                                 f"{meta['dtype']}{OTHER_PREPARATION}")
        if count != info["tokens"]:
            raise ShardError(f"{meta_path}: says the {split} split holds {info['tokens']:,} tokens, but the headers "
                             f"of its shards say {count:,}{OTHER_PREPARATION}")


def tokenizer_named(tag: int, meta: dict) -> str:
    """The tokenizer a header's tag stands for at meta.json's vocab_size, told where it is meta.json's encoding or
    one tiktoken knows, with any reservation of ids; else the tag itself."""
    encodings = [meta["encoding"]]
    try:  # only to name another encoding: reading shards never needs tiktoken
        import tiktoken

        encodings += tiktoken.list_encoding_names()
    except ImportError:
        pass
    for encoding in encodings:
        for zero in (True, False):
            for ones in (True, False):
                made_with = {**meta, "encoding": encoding, "reserve_zero": zero, "reserve_ones": ones}
                if tokenizer_tag(made_with) == tag:
                    return f"{encoding} at vocab_size {meta['vocab_size']}, reserve_zero {zero}, reserve_ones {ones}"
    return f"tag {tag:08x} (an encoding tiktoken does not know here)"


def is_meta(meta) -> bool:
    """Whether parsed JSON is a prepared folder's meta.json (what its readers use is there and well-formed)."""
    splits = meta.get("splits") if isinstance(meta, dict) else None
    return bool(isinstance(splits, dict) and all(map(_is_split, splits.values()))
                and splits.get("train", {}).get("shards")
                and type(meta.get("vocab_size")) is int and meta["vocab_size"] > 0
                and isinstance(meta.get("encoding"), str)
                and isinstance(meta.get("reserve_zero", False), bool)
                and isinstance(meta.get("reserve_ones", False), bool))


def _is_split(split) -> bool:
    """{"shards": [names], "tokens": N, ...}; a name is a plain file name, so it cannot reach outside the folder."""
    return (isinstance(split, dict) and type(split.get("tokens")) is int and isinstance(split.get("shards"), list)
            and all(isinstance(s, str) and s == Path(s).name and s not in ("", "..") for s in split["shards"]))


class ShardWriter:
    """Buffers one split's tokens and writes them out in shards of exactly `shard_tokens`."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int, dtype: np.dtype, made_with: dict | None = None):
        self.out_dir, self.split, self.size, self.dtype = out_dir, split, shard_tokens, dtype
        self.made_with = made_with  # the tokenizer's part of meta.json, for each header (write_shard)
        self.buf, self.buffered, self.shards = [], 0, []
        self.tokens = self.bytes = self.documents = 0

    def add(self, tokens: np.ndarray, nbytes: int) -> None:
        """One whole document (its tokens end with EOT) and its UTF-8 size."""
        self.buf.append(tokens)
        self.buffered += len(tokens)
        self.tokens, self.bytes, self.documents = self.tokens + len(tokens), self.bytes + nbytes, self.documents + 1
        if self.buffered >= self.size:
            flat = np.concatenate(self.buf)
            full = len(flat) - len(flat) % self.size
            for i in range(0, full, self.size):
                self._write(flat[i:i + self.size])
            self.buf, self.buffered = [flat[full:]], len(flat) - full

    def _write(self, tokens: np.ndarray) -> None:
        name = f"{self.split}_{len(self.shards):06d}.bin"
        write_shard(self.out_dir / name, tokens.astype(self.dtype, copy=False), self.made_with)
        self.shards.append(name)

    def close(self) -> dict:
        if self.buffered:
            self._write(np.concatenate(self.buf))
        return {"shards": self.shards, "tokens": self.tokens, "bytes": self.bytes, "documents": self.documents}


def prepared_from(meta: dict) -> list[str] | None:
    """The inputs `meta`'s data was prepared from, named so that they are found from any folder: those it
    records as named (absolute paths), else the files it records (`sources`) if they are found from here
    (they may be relative to the folder it was prepared from); None if unknown."""
    if isinstance(meta.get("inputs"), list) and meta["inputs"]:
        return meta["inputs"]
    sources = meta.get("sources")
    found = isinstance(sources, list) and sources and all(
        isinstance(s, str) and (os.path.isabs(s) or os.path.exists(s) or s in HUB or s.startswith("hf:"))
        for s in sources)
    return sources if found else None


def prepare_command(meta: dict, out: str, shard_tokens: int | None = None) -> str:
    """The command line that prepares the inputs `meta` (a meta.json) names again into `out`, as it was
    prepared but with the default ids: what train.py prints for data prepared with other ids."""
    inputs = prepared_from(meta) or ["<INPUTS: unknown, its meta.json does not record them>"]
    flags = [*inputs, "--out", out, "--encoding", meta["encoding"], "--vocab_size", str(meta["vocab_size"])]
    for name, default in PREPARED_DEFAULTS.items():
        if meta.get(name, default) != default:
            flags += [f"--{name}", str(meta[name])]
    if meta.get("mix") is not None:
        flags += ["--mix", ",".join(map(str, meta["mix"]))]
    if shard_tokens is not None:
        flags += ["--shard_tokens", str(shard_tokens)]
    return shlex.join(["python", "prepare_data.py", *flags, "--overwrite"])


class Split:
    """The windows of block_size+1 tokens of one split, at stride block_size, inside each shard."""

    def __init__(self, folder, meta, split, block_size, vocab_size):
        names = meta["splits"].get(split, {}).get("shards", [])
        meta_path = os.path.join(folder, "meta.json")
        if not names:
            raise ShardError(f"{meta_path}: no {split} shards listed")
        self.folder, self.meta, self.block = folder, meta, block_size
        # nats per token x tokens per byte = nats per byte, comparable across vocabularies
        info = meta["splits"][split]
        self.tokens_per_byte = None
        if info.get("bytes") and info.get("tokens"):
            self.tokens_per_byte = info["tokens"] / info["bytes"]
        self.paths = [os.path.join(folder, n) for n in names]
        self.shards = [read_shard(path) for path in self.paths]  # ShardError names a bad file
        for path, tokens in zip(self.paths, self.shards):
            top = int(tokens.max()) if len(tokens) else -1  # one pass over the data, once
            if top >= vocab_size:
                raise ValueError(f"{path}: holds token id {top}, beyond the model's vocab_size "
                                 f"{vocab_size} ({meta_path} says vocab_size {meta['vocab_size']})")
        counts = [max(0, (len(t) - 1) // block_size) for t in self.shards]
        self.starts = np.cumsum([0] + counts)  # index of each shard's first window
        self.n = int(self.starts[-1])
        if self.n == 0:
            raise ShardError(f"{folder}: the {split} split has no shard of block_size+1 = "
                             f"{block_size + 1} tokens")

    def batch(self, windows, device):
        """(B,) window ids -> inputs, targets: two (B, block_size) int64 tensors on device."""
        import torch  # here, not at the top: prepare_data.py writes shards without importing torch

        shard = np.searchsorted(self.starts, windows, side="right") - 1
        offset = (windows - self.starts[shard]) * self.block
        rows = [self.shards[s][o : o + self.block + 1] for s, o in zip(shard, offset)]
        rows = np.stack(rows).astype(np.int64)
        x = torch.from_numpy(rows[:, :-1].copy())
        y = torch.from_numpy(rows[:, 1:].copy())
        if device.type == "cuda":  # pinned, so the copy to the GPU overlaps the work before it
            x = x.pin_memory().to(device, non_blocking=True)
            y = y.pin_memory().to(device, non_blocking=True)
            return x, y
        return x.to(device), y.to(device)

    def check_window_starts(self, constant: list[int], model_input: str):
        """Warn, before the first step, when a bias-free binary or affine model would read training windows
        that start with a token it reads as a constant vector (`constant`: model.constant_input_ids, on a model
        of `model_input` input): a deep model diverges on a step that holds one (docs/zero-code.md). A warning,
        not a refusal: shallow models train on such data, and data prepared before the tokenizer kept text off
        the constant codes must still train and resume as it did. Names the count and, where the tokenizer's
        ids are the cause, the command that prepares the data again with the ids that keep text off them."""
        if not constant:
            return
        firsts = np.concatenate([t[: n * self.block : self.block] for t, n in zip(self.shards, np.diff(self.starts))])
        hit = np.isin(firsts, constant)
        if not hit.any():
            return
        found = np.unique(firsts[hit]).tolist()
        meta = self.meta
        entry = tiktoken_entry(meta)
        reserved = {0: entry["reserve_zero"], all_ones_id(meta["vocab_size"]): entry["reserve_ones"]}
        # text sits there only because the data predates a default
        if all(reserved.get(i) is False for i in found):
            shard = len(self.shards[0]) if len(self.shards) > 1 else None
            fix = ("; prepare the data with the ids that keep text off them: "
                   f"{prepare_command(meta, self.folder, shard)}")
        else:
            fix = ("; the model's input puts them there (its pad_token_id row, or an affine A and b drawn before the "
                   "affine input kept its constant codes on ids 0 and 2^K - 1)")
        names = [f"{i} (end-of-text)" if i == meta.get("eot_token") else str(i) for i in found]
        say(f"warning: {int(hit.sum()):,} of {self.n:,} training windows start with token id {', '.join(names)}, "
            f"which this model (no biases, {model_input} input) reads as a constant vector: a deep model diverges "
            f"on them (docs/zero-code.md){fix}")


def meta_identity(raw: bytes, legacy=False) -> bytes:
    """meta.json's bytes less the paths its text was read from ("inputs", "sources"), canonical:
    what the data is, wherever the text lay. legacy: the bytes as they are, paths and all (what the
    fingerprints hashed before)."""
    if legacy:
        return raw
    meta = {k: v for k, v in json.loads(raw).items() if k not in ("inputs", "sources")}
    return json.dumps(meta, sort_keys=True).encode()


def data_fingerprint(folder, legacy=False):
    """A short hash of meta_identity and every shard's name and size: what a checkpoint's data
    position indexes. Preparing the folder again from other text or settings changes it; from the
    same text at another path does not."""
    with open(os.path.join(folder, "meta.json"), "rb") as f:
        raw = f.read()
    meta = json.loads(raw)
    h = hashlib.sha256(meta_identity(raw, legacy))
    for split in sorted(meta["splits"]):
        for name in meta["splits"][split]["shards"]:
            h.update(f"\n{split}/{name}:{os.path.getsize(os.path.join(folder, name))}".encode())
    return h.hexdigest()[:16]
