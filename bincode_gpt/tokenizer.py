"""
Tokenizers: text <-> token ids, the one home of every script that turns text into ids or back.

- get_tokenizer: a tiktoken encoding, optionally cut to a smaller vocabulary (what prepare_data.py
  writes shards with, and what a native checkpoint's tokenizer entry names).
- constant_ids, without_nul: the ids whose binary codes are constant, and text kept off id 0.
- tiktoken_entry: that "tokenizer" entry, which train.py saves with every checkpoint.
- check_tokenizer: a checkpoint's entry against the data's, before training it on that data.
- TiktokenText, HFText: the two text codecs sample.py decodes with, a tiktoken encoding (native runs)
  or a tokenizer.json (converted releases; needs the `tokenizers` package), each with its end-of-text id.
- load_text_codec: the codec a checkpoint's "tokenizer" entry describes.
- file_in: a file name read from a checkpoint or config must be a plain name in its folder.
"""

import codecs
import json
import os
import sys
from functools import lru_cache

import tiktoken
import tiktoken.registry  # encoding_parts

from bincode_gpt.exits import one_line

EOS_CANDIDATES = ["</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"]  # end-of-text names, most common first


@lru_cache(maxsize=8)  # building a cut encoding takes ~0.2 s
def get_tokenizer(encoding: str = "gpt2", vocab_size: int | None = None, reserve_zero: bool = False,
                  reserve_ones: bool = False) -> tiktoken.Encoding:
    """A tiktoken encoding, optionally cut to its first `vocab_size` - 1 merge ranks + EOT.

    A token whose K-bit code is constant enters a bias-free model as a constant vector, which LayerNorm
    maps to exactly zero: a window that starts with it keeps a degenerate stream and deep binary models
    diverge on it (docs/zero-code.md). So the two constant codes go to single bytes that UTF-8 text never
    contains, and the token displaced takes that byte's id:
    reserve_zero: id 0 (all zeros) goes to the NUL byte, as the paper's tokenizer gives it to U+0000.
    reserve_ones: id 2^K - 1 (all ones, K bits for the ids), when the encoding has it, goes to the byte
    0xFF; in a cut to a power of two that id is end-of-text's, which moves to 0xFF's old id (187 in
    GPT-2 and cl100k). Swapping single-byte ranks changes no merge (merges rank pairs of 2+ bytes), so
    text encodes to the same tokens, renumbered; each id's code is still exactly its bits."""
    if encoding not in tiktoken.list_encoding_names():
        raise ValueError(f"unknown encoding {encoding!r}; choose one of {tiktoken.list_encoding_names()}")
    base = encoding_parts(encoding)
    ranks = base["mergeable_ranks"]
    n_vocab = max(*ranks.values(), *base["special_tokens"].values()) + 1
    vocab_size = n_vocab if vocab_size is None else vocab_size  # 0 is a size, refused below, not 'none given'
    ones = all_ones_id(vocab_size)
    reserve_ones = reserve_ones and ones < vocab_size  # past the vocabulary: no token to move
    if vocab_size == n_vocab and not (reserve_zero or reserve_ones):
        # the encoding itself, uncut, from the parts just read (tiktoken.get_encoding would read them again)
        return tiktoken.Encoding(**base)
    # The cut keeps the 256 single bytes (so any text encodes) and adds no rank; its sizes are read from the
    # ranks, not counted: an encoding may have ids no token holds (cl100k_base: 100,256 and 100,261-100,275).
    smallest, largest = max(ranks[bytes([b])] for b in range(256)) + 2, max(ranks.values()) + 2
    if not smallest <= vocab_size <= largest and vocab_size != n_vocab:
        full = f" or {n_vocab}" if not smallest <= n_vocab <= largest else ""
        raise ValueError(f"vocab_size must be in [{smallest}, {largest}]{full} for {encoding}, got {vocab_size}")
    if vocab_size == n_vocab:  # every rank and special, on their own ids (p50k_base has ranks past end-of-text)
        kept, specials, name = dict(ranks), dict(base["special_tokens"]), encoding
    else:
        kept = {b: r for b, r in ranks.items() if r < vocab_size - 1}
        specials, name = {"<|endoftext|>": vocab_size - 1}, f"{encoding}_{vocab_size}"
    for reserved, i, byte, tag in ((reserve_zero, 0, b"\x00", "_nul0"), (reserve_ones, ones, b"\xff", "_ff1s")):
        if not reserved:
            continue
        table = kept if i in kept.values() else specials
        holder = next((t for t, r in table.items() if r == i), None)  # None: a hole, no token to move
        if holder is not None:  # `byte` takes id i; the token that had i (a merge rank or a special) takes byte's id
            table[holder], kept[byte] = kept[byte], i
            name += tag
    pat_str = base["pat_str"]
    del base, ranks  # the uncut ranks are let go before the cut is built: a process holds only the cut
    enc = tiktoken.Encoding(name=name, pat_str=pat_str, mergeable_ranks=kept, special_tokens=specials)
    # and only once: its encoder holds them (in Rust), tiktoken keeps the dict only to pickle the encoding (which now
    # fails loudly: rebuild a cut by get_tokenizer), ~7 MB at 65,536 tokens; mergeable_ranks() reads them back
    let_ranks_go(enc)
    return enc


def encoding_parts(encoding: str) -> dict:
    """A tiktoken encoding's parts (name, pat_str, mergeable_ranks, special_tokens, ...), read afresh without
    building it: tiktoken.get_encoding keeps each encoding it builds for the life of the process, and a cut
    needs only the ranks (an uncut cl100k_base held beside its cut: ~57 MiB more peak memory in sample.py)."""
    tiktoken.list_encoding_names()  # finds the constructors, once
    return tiktoken.registry.ENCODING_CONSTRUCTORS[encoding]()


# tiktoken's private fields (Encoding._pat_str, _mergeable_ranks, _special_tokens): what an encoding was built
# from, which no public API returns. These two functions alone touch them.
def encoding_fields(enc: tiktoken.Encoding) -> dict:
    """{"pat_str": the split regex, "mergeable_ranks": token bytes -> rank (None for a cut: let_ranks_go),
    "special_tokens": text -> id} of a built encoding."""
    return {"pat_str": enc._pat_str, "mergeable_ranks": enc._mergeable_ranks, "special_tokens": enc._special_tokens}


def let_ranks_go(enc: tiktoken.Encoding):
    """Drop the Python dict of `enc`'s ranks, which tiktoken keeps only to pickle it: its encoder holds them."""
    enc._mergeable_ranks = None


def mergeable_ranks(enc: tiktoken.Encoding) -> dict:
    """Token bytes -> rank of an encoding: tiktoken's own dict, or, for a cut (get_tokenizer lets its dict go), read
    back from its encoder token by token, not id by id: a cut to an encoding's full size keeps its holes."""
    ranks = encoding_fields(enc)["mergeable_ranks"]
    if ranks is not None:
        return ranks
    return {token: enc.encode_single_token(token) for token in enc.token_byte_values()}


def token_ids(enc: tiktoken.Encoding) -> set:
    """Every id `enc` decodes, its ranks' and its special tokens': not every id below n_vocab (cl100k_base has
    none at 100,256 nor at 100,261-100,275)."""
    return {*mergeable_ranks(enc).values(), *encoding_fields(enc)["special_tokens"].values()}


def all_ones_id(vocab_size: int) -> int:
    """2^K - 1, the id whose K = ceil(log2 V) bits are all ones (model.code_bits; torch-free here)."""
    return (1 << (vocab_size - 1).bit_length()) - 1


def constant_ids(vocab_size: int) -> list[int]:
    """The ids whose K-bit codes are constant: 0 (all zeros), and 2^K - 1 (all ones) where the vocabulary
    holds it (a cut to a power of two, where it is end-of-text's unless reserve_ones gives it to 0xFF)."""
    ones = all_ones_id(vocab_size)
    return [0, ones] if 0 < ones < vocab_size else [0]


def without_nul(text: str) -> tuple[str, int]:
    """`text` without U+0000 (NUL), and how many it held. NUL is no text (a binary file's, a C string's end),
    and reserve_zero gives its byte id 0, the all-zero code: dropped, no text puts that id in the model's input."""
    clean = text.replace("\0", "")
    return clean, len(text) - len(clean)


def tiktoken_entry(meta: dict) -> dict:
    """The checkpoint's "tokenizer" entry for data prepared as `meta` (prepare_data.py's meta.json) says.
    A key that data or a checkpoint predates reads False: the ids it was made with. reserve_ones is False
    where it moves nothing (2^K - 1 past the vocabulary), so equal entries mean equal tokenizers."""
    return {"kind": "tiktoken", "encoding": meta["encoding"], "vocab_size": meta["vocab_size"],
            "reserve_zero": meta.get("reserve_zero", False),
            "reserve_ones": meta.get("reserve_ones", False) and all_ones_id(meta["vocab_size"]) < meta["vocab_size"]}


def reserved_note(entry: dict) -> str:
    """How a tiktoken entry's ids differ from its encoding's, for messages: ", ids 0 and 8191 reserved"."""
    ids = ["0"] if entry["reserve_zero"] else []
    ids += [str(all_ones_id(entry["vocab_size"]))] if entry["reserve_ones"] else []
    return f", id{'s' * (len(ids) > 1)} {' and '.join(ids)} reserved" if ids else ""


def check_tokenizer(ckpt, meta, source, data_dir):
    """A token id means what the checkpoint's tokenizer says: the data must come from the same one. Data
    prepared here is tiktoken's, so a converted release (its tokenizer a tokenizer.json) is refused."""
    theirs, meta_path = ckpt.get("tokenizer"), os.path.join(data_dir, "meta.json")
    if theirs is None:
        print(f"note: {source} names no tokenizer: its token ids are taken to mean what {meta_path} says",
              file=sys.stderr)
        return
    if not isinstance(theirs, dict) or theirs.get("kind") not in ("tiktoken", "hf"):
        raise ValueError(f"{source}: unknown tokenizer entry {one_line(repr(theirs), 80)}")
    if theirs["kind"] == "hf":
        raise ValueError(f"{source}: its tokenizer is a tokenizer.json ({one_line(repr(theirs.get('file')), 80)}), but "
                         f"{meta_path} says the data was made with tiktoken's {meta['encoding']}: the same ids would "
                         "mean other text. prepare_data.py writes tiktoken data only, so this model cannot be trained "
                         "on it here")
    theirs, ours = tiktoken_entry(theirs), tiktoken_entry(meta)  # an old entry's missing keys: the ids it had
    if theirs != ours:
        moves = [k for k in ("reserve_zero", "reserve_ones")
                 if not theirs[k] and tiktoken_entry({**theirs, k: True})[k]]
        flags = f"--encoding {theirs['encoding']} --vocab_size {theirs['vocab_size']}" + "".join(  # a reservation
            f" --no-{k}" for k in moves)  # that would move something
        raise ValueError(f"{source}: trained on {theirs['encoding']} tokens at vocab_size {theirs['vocab_size']}"
                         f"{reserved_note(theirs)}, but {os.path.join(data_dir, 'meta.json')} "
                         f"says {ours['encoding']} at vocab_size {ours['vocab_size']}{reserved_note(ours)}: "
                         f"prepare the data with {flags}")


def file_in(folder, name, what):
    """The path of `name` in `folder`; `name` comes from a config or checkpoint, so it must be a plain
    file name (no directories, no ..): a file outside the folder is never read or copied."""
    if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name or "\\" in name:
        raise ValueError(f"{what} names {name!r}, which is not a file name inside {folder}: refused")
    return os.path.join(folder, name)


class TiktokenText:
    """A tiktoken encoding; decodes token bytes incrementally, so a character split across tokens
    is printed once complete."""

    def __init__(self, enc):
        self.enc, self.eos_token_id = enc, enc.eot_token

    def encode(self, text):
        return self.enc.encode(text, allowed_special="all")

    def decode(self, ids):
        return self.enc.decode(ids)

    def token_ids(self):
        """Every id this encoding decodes."""
        return token_ids(self.enc)

    def decoder(self):
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def decode(i=None):
            try:
                token = b"" if i is None else self.enc.decode_single_token_bytes(i)
            except KeyError:  # an id past the tokenizer, or one of its holes: say so, no KeyError
                raise ValueError(f"the model produced token id {i}, but its tokenizer has {self.enc.n_vocab:,} "
                                 "tokens and none of them has that id: the checkpoint's tokenizer does not match "
                                 "its model") from None
            return utf8.decode(token, final=i is None)
        return decode


class HFText:
    """A `tokenizers` tokenizer.json; decodes the whole continuation and prints what is new, holding
    back a trailing U+FFFD (bytes of a character still to come)."""

    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError("this checkpoint's tokenizer is a tokenizer.json: pip install tokenizers") from None
        try:
            self.tk = Tokenizer.from_file(path)
        except Exception as e:  # the Rust library raises a bare Exception for unreadable or malformed files
            raise ValueError(f"{path}: not a readable tokenizer.json ({e})") from None
        eos = None
        cfg = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        if os.path.isfile(cfg):
            with open(cfg, encoding="utf-8-sig") as f:  # a Windows editor's byte-order mark is no JSON
                try:
                    eos = json.load(f)
                except ValueError as e:
                    raise ValueError(f"{cfg}: not valid JSON ({e})") from None
            eos = eos.get("eos_token") if isinstance(eos, dict) else None
            eos = eos.get("content") if isinstance(eos, dict) else eos
        names = ([eos] if isinstance(eos, str) else []) + EOS_CANDIDATES
        self.eos_token_id = next((self.tk.token_to_id(n) for n in names if self.tk.token_to_id(n) is not None), None)

    def encode(self, text):
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tk.decode(ids, skip_special_tokens=False)

    def token_ids(self):
        """Every id this tokenizer decodes."""
        return set(self.tk.get_vocab(with_added_tokens=True).values())

    def decoder(self):
        ids, shown = [], [""]

        def step(i=None):
            if i is not None:
                ids.append(i)
            text = self.decode(ids)
            if i is not None and text.endswith("\ufffd"):
                return ""
            same = len(shown[0]) if text.startswith(shown[0]) else len(os.path.commonprefix([text, shown[0]]))
            new = text[same:]
            shown[0] = text
            return new

        return step


# a checkpoint's text codec (load_text_codec): what sampling encodes prompts and decodes ids with
Text = TiktokenText | HFText


def load_text_codec(ckpt, ckpt_path):
    """The text codec of a checkpoint's "tokenizer" entry: {"kind": "tiktoken", "encoding", "vocab_size",
    "reserve_zero", "reserve_ones"} or {"kind": "hf", "file"}, a tokenizer.json in the checkpoint's folder."""
    entry = ckpt.get("tokenizer")
    if not entry:
        raise ValueError(f"{ckpt_path} names no tokenizer: cannot turn text into tokens")
    if not isinstance(entry, dict):
        raise ValueError(f"{ckpt_path}: unknown tokenizer entry {entry!r}")
    if entry.get("kind") == "tiktoken":
        return TiktokenText(get_tokenizer(entry.get("encoding", "gpt2"), entry.get("vocab_size"),
                                          bool(entry.get("reserve_zero")), bool(entry.get("reserve_ones"))))
    if entry.get("kind") == "hf":
        folder = ckpt_path if os.path.isdir(ckpt_path) else os.path.dirname(os.path.abspath(ckpt_path))
        path = file_in(folder, entry.get("file", "tokenizer.json"), f"{ckpt_path}: the tokenizer entry")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"the checkpoint's tokenizer {path} is missing")
        return HFText(path)
    raise ValueError(f"{ckpt_path}: unknown tokenizer entry {entry!r}")


if __name__ == "__main__":
    from bincode_gpt.exits import not_a_command
    sys.exit(not_a_command("bincode_gpt/tokenizer.py", "tokenize a corpus by `python prepare_data.py --help` "
                                                        "(--encoding, --vocab_size); sample.py decodes a checkpoint's "
                                                        "tokens"))
