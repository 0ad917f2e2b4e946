"""
Tokenizing pieces of text in worker processes, in order, Ctrl-C and SIGTERM handled once (by the
parent, which stops the pool). Long documents are cut into pieces only where the tokenizer's
pre-split regex cuts anyway, so the tokens equal those of the whole document, and the output does
not depend on the number of workers.
"""

import multiprocessing as mp
import re
from collections import deque

import numpy as np

from bincode_gpt.exits import held_for_workers, leave_signals_to_parent
from bincode_gpt.shards import token_dtype
from bincode_gpt.tokenizer import get_tokenizer, without_nul

PIECE_CHARS = 1 << 18  # size of the units sent to workers; does not change the output
# NUL is dropped from each piece once cut (encode_batch), so it is neither side's non-space
_SAFE_CUT = re.compile(r"(?<=[^\s\0]\n)(?=[^\s\0])")


def pieces(text: str, size: int | None = None):
    """(piece, is_last) for a long text cut where the tokenizer's pre-split regex would cut
    anyway: right after "<non-space>\\n" and before a non-space."""
    size = size or PIECE_CHARS
    start = 0
    while len(text) - start > size and (m := _SAFE_CUT.search(text, start + size)):
        yield text[start:m.start()], False
        start = m.start()
    yield text[start:], True


def batches(docs, size: int | None = None):
    """(split, [(piece, ends_document), ...]) of about `size` characters, all of one split, from
    (split, text) pairs."""
    size = size or PIECE_CHARS
    split = None
    batch = []
    chars = 0
    for doc_split, text in docs:
        for piece, last in pieces(text, size):
            if batch and (doc_split != split or chars >= size):
                yield split, batch
                batch = []
                chars = 0
            split = doc_split
            chars += len(piece)
            batch.append((piece, last))
    if batch:
        yield split, batch


_enc = None  # the tokenizer of this pool worker (or of the main process when there is no pool)


def _start_worker(tok: tuple) -> None:
    global _enc
    leave_signals_to_parent()  # the parent alone stops the pool
    _enc = get_tokenizer(*tok)


def encode_batch(job: tuple) -> tuple:
    """(split, batch) -> split, [(tokens of the piece without NUL + EOT if it ends a document, its
    UTF-8 bytes, NULs dropped, ends)]."""
    split, batch = job
    dtype = token_dtype(_enc.n_vocab)
    out = []
    for piece, last in batch:
        text, nul = without_nul(piece)
        ids = _enc.encode_ordinary(text) + ([_enc.eot_token] if last else [])
        out.append((np.array(ids, dtype=dtype), len(text.encode("utf-8")), nul, last))
    return split, out


def encoded(jobs, tok: tuple, workers: int):
    """encode_batch over jobs, in order, in `workers` processes (1: this one) that each build the
    tokenizer get_tokenizer(*tok). A bounded window of apply_async (not Pool.imap, whose feeder
    thread would read the whole input into memory ahead of the workers). Closing the generator
    stops the pool at once."""
    global _enc
    if workers <= 1:
        _enc = get_tokenizer(*tok)
        yield from map(encode_batch, jobs)
        return
    with held_for_workers():  # until the pool exists
        pool = mp.Pool(workers, _start_worker, (tok,))
    with pool:  # leaving it terminates the workers
        pending = deque()
        try:
            for job in jobs:
                pending.append(pool.apply_async(encode_batch, (job,)))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
        finally:
            # Pool.terminate hangs on a task or result still in a pipe: the window's land first
            # (in under a second)
            for result in pending:
                result.wait(60)
