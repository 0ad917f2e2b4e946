"""Tokenize text corpora into binary token shards for train.py.

    python prepare_data.py shakespeare        # -> data/shakespeare, what train.py reads by default
    python prepare_data.py notes/ more.jsonl --out data/mine --vocab_size 8192
    python prepare_data.py fineweb-edu cosmopedia --mix 0.7 --max_tokens 1e9 --out data/paper

Design choices:
- Inputs (bincode_gpt/inputs.py): a .txt file is one document; .jsonl / .parquet give one document
  per record (its `text_field`, empty ones skipped); folders and globs expand to their files in
  sorted order. Any of them may be gzip, bz2 or xz compressed (docs.jsonl.gz; known by its first
  bytes, so a suffix is not needed), read as a stream by the standard library; zstd (.zst) needs the
  optional zstandard package. A compressed file is read to its end before any work, so a truncated
  one writes nothing; a compressed .parquet is decompressed into memory (parquet reads its footer
  first). Named corpora: `shakespeare` is tiny Shakespeare, downloaded once into the folder
  $BCGPT_CORPUS_CACHE (default data/; an offline machine puts tinyshakespeare.txt there);
  `fineweb-edu`, `cosmopedia` and hf:REPO[:CONFIG] stream a Hugging Face dataset through the
  optional `datasets` package. A single named corpus is written to data/NAME unless --out says
  otherwise. Every document ends with end-of-text.
- Text encodings (inputs.text_encoding): UTF-8, or UTF-16 / UTF-32 with their byte-order mark, told
  by each file's first bytes (decompressed), .txt and .jsonl alike. Nothing else is read as text:
  unmarked UTF-16 / UTF-32 and 8-bit text are refused naming the likely encoding and an iconv
  command that converts the file.
- NUL (U+0000) is dropped from the text (workers.encode_batch), counted on stderr and in meta.json
  (dropped_nul): its token has id 0, the all-zero code, and NUL is no text.
- Tokenizer: any tiktoken encoding; `vocab_size=N` keeps its first N-1 BPE merge ranks (a prefix of
  the ranks is still a valid BPE) and puts <|endoftext|> at id N-1. By default the two ids whose
  codes are constant, 0 and 2^K-1, go to the bytes NUL and 0xFF (tokenizer.get_tokenizer), so
  end-of-text leaves the all-ones code of a power-of-two cut; meta.json records it (reserve_zero,
  reserve_ones). With NUL dropped and 0xFF never in UTF-8, no text reaches those ids.
  --no-reserve_zero / --no-reserve_ones give the encoding's own ids, constant codes included (data
  prepared before them had them: "!" on 0, end-of-text on all ones); meta.json and stderr count
  those tokens (constant_code_tokens).
- Train/val split: document i (0-based, input order) is val when floor((i+1)*f) > floor(i*f), i.e.
  every 10th document for f=0.1, spread over the whole corpus rather than taken from its end. If
  there are too few documents for one of them to be val (fewer than 1/f), each document is cut by
  characters instead: its first int(len*(1-f)) characters are train, the rest val (so one big .txt
  file such as tinyshakespeare gets the usual 90/10 character split). --doc_chars N first cuts
  every document at line ends into documents of about N characters, so a book yields
  chapter-sized documents and val samples the whole of it.
- Mixtures (`--mix`): documents are drawn from the inputs with the given weights by a seeded RNG (a
  document-level ratio); the mixture stops when any input runs dry (said on stderr, with what that
  leaves of --max_tokens). An input is what was named: a folder or a glob is one input (its files
  in order), whatever number of files it holds.
- Budget (`--max_tokens`): whole documents only; stop before the first document that would take
  train+val past the budget.
- Parallelism (bincode_gpt/workers.py): long documents are cut into ~256k-character pieces only
  right after "<non-space>\\n" and before a non-space, a point where the tokenizer's regex splits
  anyway, so tokens equal encoding the whole document at once. Pieces are grouped into batches that
  a process pool encodes in order: output bytes do not depend on the worker count.
- Shard files: bincode_gpt/shards.py's format (a 32-byte header, then the tokens as uint16 when
  the vocabulary fits, else uint32); meta.json indexes them.
- Nothing is lost (bincode_gpt/data_dir.py): every input is opened and its first document read
  before any work; the new shards go to OUT/.partial and replace the old ones only once all of them
  are written; meta.json comes last, written atomically. A bad input, a full disk, Ctrl-C or SIGTERM
  therefore leaves the old data byte for byte, and never a folder that looks complete. One run
  writes a folder at a time (a second is refused while the first holds OUT/.writer.lock), and only
  files this script wrote are replaced or removed: a meta.json it cannot read as prepared data, a
  shard without the shard magic or an unmarked .partial folder is refused by name, with or without
  --overwrite.
"""

# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main, stop_as_ctrl_c

import argparse
import contextlib
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from itertools import chain, islice

import numpy as np
import tiktoken

from bincode_gpt.data_dir import check_prepared, staged_data
from bincode_gpt.files import atomic_write
from bincode_gpt.inputs import check_inputs, NAMED, read_documents, resolve_input
from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.shards import PREPARED_DEFAULTS, ShardWriter, token_dtype, VERSION
from bincode_gpt.tokenizer import constant_ids, get_tokenizer
from bincode_gpt.workers import batches, encoded

# the quick start's corpus at the mini preset's vocabulary, model.MINI_VOCAB: written here, not
# imported, since importing model.py would import torch, which this script never needs (a test
# holds the two equal)
DEFAULT_VOCAB = {"shakespeare": 512}


# ---------------------------------------------------------------- documents -> splits
def mix_weights(mix: list[float], n_inputs: int) -> list[float]:
    """One weight per input; `--mix 0.7` with two inputs means 0.7, 0.3."""
    if n_inputs < 2:
        raise ValueError(f"--mix draws documents from two or more inputs, but {n_inputs} is named: "
                         "drop --mix")
    weights = mix + [1 - sum(mix)] if len(mix) == n_inputs - 1 else mix
    valid = all(math.isfinite(w) and w >= 0 for w in weights) and sum(weights) > 0
    if len(weights) != n_inputs or not valid:
        raise ValueError(f"--mix needs one non-negative weight per input (or all but the last), "
                         f"got {mix} for {n_inputs} inputs")
    return weights


def mix_documents(streams: list, weights: list[float], seed: int = 0, dry: list | None = None):
    """Draw each next document from stream k with probability weights[k] (seeded); stop when any
    stream is exhausted, so the ratio holds for everything emitted (its index goes in `dry`)."""
    rng = random.Random(seed)
    its = [iter(s) for s in streams]
    while True:
        k = rng.choices(range(len(its)), weights)[0]
        doc = next(its[k], None)
        if doc is None:
            if dry is not None:
                dry.append(k)
            return
        yield doc


def mix_shortfall(name: str, tokens: int, max_tokens: int | None) -> None:
    """Say on stderr that a mixture stopped because input `name` ran dry, and what that left of
    the budget."""
    short = ""
    if max_tokens:
        short = (f", {max_tokens - tokens:,} short of --max_tokens {max_tokens:,} "
                 f"({100 * tokens / max_tokens:.0f}%): give that input more data or a lower --mix "
                 "weight to meet the budget")
    print(f"note: the mixture stopped at {tokens:,} tokens when {name} ran dry{short} (the other "
          "inputs' remaining documents are left out, so the --mix ratio holds)", file=sys.stderr)


def cut_documents(docs, chars: int):
    """Each document cut at line ends into pieces of `chars` characters or a little more (the last
    may be shorter): a book-long .txt becomes chapter-sized documents, so every 10th one for val
    samples the whole book. 0: the documents as they are."""
    for doc in docs:
        start = 0
        while chars and len(doc) - start > chars:
            end = doc.find("\n", start + chars - 1)
            if end < 0:
                break
            yield doc[start:end + 1]
            start = end + 1
        if doc[start:]:
            yield doc[start:]


def documents(groups: list[list[str]], *, text_field: str, doc_chars: int,
              weights: list[float] | None, seed: int, dry: list):
    """The documents of the inputs (each a group of files), cut to `doc_chars`, one input after
    the other or drawn with `weights` (the input that ran dry goes in `dry`)."""
    streams = [cut_documents(chain.from_iterable(read_documents(s, text_field) for s in group),
                             doc_chars)
               for group in groups]
    if weights is None:
        return chain.from_iterable(streams)
    return mix_documents(streams, weights, seed, dry)


def split_documents(docs, val_fraction: float):
    """(split, text) pairs by the rule in the module docstring."""
    it = iter(docs)
    need = min(math.ceil(1 / val_fraction - 1e-9), sys.maxsize) if val_fraction > 0 else 1
    head = list(islice(it, need))
    if len(head) < need:  # too few documents: cut each by characters
        for text in head:
            cut = int(len(text) * (1 - val_fraction))
            parts = (("train", text[:cut]), ("val", text[cut:]))
            yield from ((s, part) for s, part in parts if part)
        return
    for i, text in enumerate(chain(head, it)):
        val = math.floor((i + 1) * val_fraction + 1e-9) > math.floor(i * val_fraction + 1e-9)
        yield ("val" if val else "train"), text


# ---------------------------------------------------------------- tokens -> shards
def write_documents(results, writers: dict, *, constant: list[int], max_tokens: int | None,
                    total_bytes: int | None, progress: bool) -> tuple[bool, dict]:
    """Join the encoded pieces into documents and hand each to its split's writer; stop before the
    first document that would exceed the budget. -> (whether the budget stopped it, the counts of
    what was written: NULs dropped, tokens on the `constant` ids). With `progress`, a line on a
    terminal's stderr (not in logs) says how far it got."""
    seen = 0  # source bytes encoded
    kept = 0  # tokens kept
    counts = {"dropped_nul": 0, "constant_code_tokens": 0}
    doc = []  # (tokens, bytes, NULs) of the document's pieces: the budget admits whole documents
    t0 = time.time()
    shown = t0
    progress = progress and sys.stderr.isatty()
    try:
        for split, batch in results:
            for tokens, nbytes, nul, last in batch:
                doc.append((tokens, nbytes, nul))
                seen += nbytes
                if last:
                    tokens = np.concatenate([t for t, _, _ in doc])
                    if max_tokens is not None and kept + len(tokens) > max_tokens:
                        return True, counts
                    writers[split].add(tokens, sum(b for _, b, _ in doc))
                    kept += len(tokens)
                    counts["dropped_nul"] += sum(n for _, _, n in doc)
                    counts["constant_code_tokens"] += int(np.isin(tokens, constant).sum())
                    doc = []
            if progress and time.time() - shown >= 0.5:  # at most twice a second
                shown = time.time()
                mb = seen / 1e6
                pct = f"{min(100, 100 * seen / total_bytes):3.0f}% " if total_bytes else ""
                print(f"\r{pct}{mb:,.1f} MB, {mb / (shown - t0):.1f} MB/s", end="", file=sys.stderr,
                      flush=True)
        return False, counts
    finally:
        if progress and shown > t0:
            # what comes next (the summary, an error) starts a line of its own
            print(file=sys.stderr)



def say_counts(counts: dict, vocab_size: int) -> None:
    """Say on stderr what was kept off the text's tokens, and what sits on a constant code (only
    --no-reserve_zero / --no-reserve_ones put tokens there: the encoding's own ids, as data prepared
    before them had)."""
    nul = counts["dropped_nul"]
    constant = counts["constant_code_tokens"]
    if nul:
        print(f"note: dropped {nul:,} NUL character{'s' * (nul != 1)} (U+0000) from the text: NUL "
              "is no text, and by default its token has id 0, whose binary code is all zeros "
              "(meta.json: dropped_nul)", file=sys.stderr)
    if constant:
        ids = " or ".join(map(str, constant_ids(vocab_size)))
        print(f"note: {constant:,} token{'s' * (constant != 1)} on id {ids}, whose binary code is "
              "constant: the encoding's own ids, as --no-reserve_zero / --no-reserve_ones ask; a "
              "bias-free binary model reads them as a constant vector (docs/zero-code.md; "
              "meta.json: constant_code_tokens)", file=sys.stderr)


# ---------------------------------------------------------------- checks
def check_settings(inputs: list[str], *, val_fraction: float, shard_tokens: int,
                   max_tokens: int | None, doc_chars: int, workers: int) -> None:
    """A ValueError for settings no run can use (those a run finds out about cost no work)."""
    if not inputs:
        raise ValueError("no inputs given")
    too_few_tokens = max_tokens is not None and max_tokens < 1
    if not 0 <= val_fraction < 1 or shard_tokens < 1 or too_few_tokens or doc_chars < 0:
        raise ValueError(f"need 0 <= val_fraction < 1, shard_tokens >= 1, max_tokens >= 1, "
                         f"doc_chars >= 0; got {val_fraction}, {shard_tokens}, {max_tokens}, "
                         f"{doc_chars}")
    if workers < 1:  # 0 is refused, not read as "all cores"
        raise ValueError(f"workers must be at least 1, got {workers}")


def check_splits(splits: dict, val_fraction: float, max_tokens: int | None) -> None:
    """A ValueError when a split came out empty: the budget below the first document, or every
    character val."""
    budget = f", --max_tokens {max_tokens:,}" if max_tokens is not None else ""
    if not splits["train"]["tokens"]:
        raise ValueError(f"the train split is empty (--val_fraction {val_fraction}{budget}): give "
                         "a smaller fraction or a larger budget")
    if val_fraction > 0 and not splits["val"]["tokens"]:
        raise ValueError(f"the val split is empty (--val_fraction {val_fraction}{budget}): give a "
                         "larger fraction or budget, or --val_fraction 0 for no validation split")


def named_inputs(inputs: list[str]) -> list[str]:
    """The inputs as named, a path made absolute (what prepare_command names, from any folder)."""
    return [os.path.abspath(a) if os.path.lexists(a) or not (a in NAMED or a.startswith("hf:"))
            else a for a in inputs]


# ---------------------------------------------------------------- main logic
def prepare(inputs: list[str], out_dir: str, *, encoding: str = "gpt2",
            vocab_size: int | None = None, val_fraction: float = 0.1,
            shard_tokens: int = 100_000_000, workers: int | None = None, overwrite: bool = False,
            text_field: str = "text", mix: list[float] | None = None,
            max_tokens: int | None = None, seed: int = 0, progress: bool = True,
            reserve_zero: bool = True, reserve_ones: bool = True, doc_chars: int = 0) -> dict:
    """Tokenize `inputs` into train/val shards in `out_dir`; returns the meta written there."""
    # everything that can be checked cheaply is checked before any work and before anything is
    # removed
    if workers is None:
        workers = os.cpu_count() or 1
    check_settings(inputs, val_fraction=val_fraction, shard_tokens=shard_tokens,
                   max_tokens=max_tokens, doc_chars=doc_chars, workers=workers)
    tok = (encoding, vocab_size, reserve_zero, reserve_ones)  # get_tokenizer's, sent to the workers
    enc = get_tokenizer(*tok)
    check_prepared(out_dir, overwrite)  # fail fast; checked again as the folder's one writer
    groups = [resolve_input(a) for a in inputs]  # the files each named input stands for
    sources = [s for group in groups for s in group]
    weights = mix_weights(mix, len(groups)) if mix is not None else None
    total_bytes = check_inputs(sources, text_field)  # uncompressed, for the progress line

    with staged_data(out_dir, overwrite) as staging:  # all of the new files or none replace the old
        dry = []  # the mixture's input that ran dry, if one did
        docs = documents(groups, text_field=text_field, doc_chars=doc_chars, weights=weights,
                         seed=seed, dry=dry)
        dtype = token_dtype(enc.n_vocab)
        made_with = {"encoding": encoding, "vocab_size": enc.n_vocab, "reserve_zero": reserve_zero,
                     "reserve_ones": reserve_ones}  # what each shard's header records of meta.json
        writers = {s: ShardWriter(staging, s, shard_tokens, dtype, made_with)
                   for s in ("train", "val")}
        jobs = batches(split_documents(docs, val_fraction))
        # closing the generator stops the pool now
        with contextlib.closing(encoded(jobs, tok, workers)) as results:
            budget_met, counts = write_documents(results, writers,
                                                 constant=constant_ids(enc.n_vocab),
                                                 max_tokens=max_tokens, total_bytes=total_bytes,
                                                 progress=progress)
        splits = {s: w.close() for s, w in writers.items()}
        if dry and not budget_met:
            mix_shortfall(inputs[dry[0]], sum(s["tokens"] for s in splits.values()), max_tokens)
        check_splits(splits, val_fraction, max_tokens)
        meta = {"version": VERSION,
                "encoding": encoding,
                "vocab_size": enc.n_vocab,
                "eot_token": enc.eot_token,
                "reserve_zero": reserve_zero,
                "reserve_ones": reserve_ones,
                "dtype": dtype.name,
                "splits": splits,
                "inputs": named_inputs(inputs),
                "sources": sources,
                "val_fraction": val_fraction,
                "text_field": text_field,
                "mix": mix,
                "max_tokens": max_tokens,
                "seed": seed}
        if doc_chars:  # absent at 0, so data prepared without it keeps its identity
            meta["doc_chars"] = doc_chars
        meta |= {k: n for k, n in counts.items() if n}  # the counts too, absent at 0
        atomic_write(staging / "meta.json", json.dumps(meta, indent=2) + "\n")
    say_counts(counts, enc.n_vocab)
    return meta


# ---------------------------------------------------------------- the command line
def parse_weights(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


@dataclass
class PrepareConfig:
    inputs: list[str] = setting(help="files (.txt = one document, .jsonl, .parquet), folders, "
                                     f"globs, the named corpora {', '.join(NAMED)}, or "
                                     "hf:REPO[:CONFIG]",
                                positional=True, nargs="+")
    out: str | None = setting(None, "output folder for train_*.bin, val_*.bin, meta.json (default "
                                    "for one named corpus: data/NAME)")
    encoding: str = setting("gpt2", "tiktoken encoding: "
                                    f"{', '.join(tiktoken.list_encoding_names())}")
    vocab_size: int | None = setting(None, "keep the first N-1 BPE ranks, EOT = N-1 (default: "
                                           f"{DEFAULT_VOCAB['shakespeare']} for shakespeare, else "
                                           "the full encoding)")
    reserve_zero: bool = setting(True, "give id 0 (the all-zero binary code) to the NUL byte, "
                                       "which text does not contain; without it the ids are the "
                                       "encoding's own")
    reserve_ones: bool = setting(True, "give id 2^K-1 (the all-ones binary code; end-of-text's in "
                                       "a cut to a power of two) to the byte 0xFF, which UTF-8 "
                                       "text never contains; without it that id keeps its token")
    val_fraction: float = setting(PREPARED_DEFAULTS["val_fraction"],
                                  "share of documents (or characters) for val")
    shard_tokens: int = setting(100_000_000, "tokens per shard file, e.g. 1e8")
    text_field: str = setting(PREPARED_DEFAULTS["text_field"],
                              "record field holding the text in .jsonl/.parquet/Hub")
    mix: list[float] | None = setting(None, "document weights per named input (a folder is one), "
                                            "e.g. 0.7 (two inputs) or 0.5,0.3,0.2 (default: "
                                            "concatenate)", type=parse_weights)
    max_tokens: int | None = setting(PREPARED_DEFAULTS["max_tokens"],
                                     "token budget for train+val, whole documents, e.g. 1e9 "
                                     "(default: no limit)")
    seed: int = setting(PREPARED_DEFAULTS["seed"], "seed of the --mix draws")
    doc_chars: int = setting(PREPARED_DEFAULTS["doc_chars"], "cut each document at line ends into "
                             "documents of about this many characters (a book into chapter-sized "
                             "ones; 0: as they are)")
    workers: int | None = setting(None, "tokenizer processes; 1 = no pool (default: one per CPU "
                                        "core)")
    overwrite: bool = setting(False, "replace prepared data already in --out")


def parse_config(argv: list[str] | None = None) -> PrepareConfig:
    """The settings of a command line, with the defaults of a single named corpus (its --out, its
    --vocab_size)."""
    description = __doc__.split("\n\n")[0]
    p = config_parser(PrepareConfig, description, epilog="Details: the module docstring.")
    a = parse_settings(p, argv)
    if a.out is None:
        if len(a.inputs) != 1 or a.inputs[0] not in NAMED:
            p.error(f"--out is needed (only a single named corpus, {', '.join(NAMED)}, has a "
                    "default)")
        a.out = os.path.join("data", a.inputs[0])
    if a.vocab_size is None and len(a.inputs) == 1:
        a.vocab_size = DEFAULT_VOCAB.get(a.inputs[0])
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_config(argv)
    options = {k: v for k, v in vars(a).items() if k not in ("inputs", "out")}  # prepare's keywords
    meta = prepare(a.inputs, a.out, **options)
    for name, s in meta["splits"].items():
        print(f"{name}: {s['tokens']:,} tokens, {s['documents']:,} documents, "
              f"{s['bytes']:,} bytes, {len(s['shards'])} shards")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    stop_as_ctrl_c()  # `kill` too: the pool ends, the old data stays
    sys.exit(run_main(main))
