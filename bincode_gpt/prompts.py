"""
A prompt, from text or a file, to checked token ids: what sample.py continues.

- check_sources: the flags naming what sample.py reads (one prompt source, no empty file name).
- read_prompt_file: a regular text file of bounded size, read as prepare_data.py reads text.
- default_prompt: the text continued when none is given (a converted release's model card prompt).
- prompt_ids: the prompt's ids, NULs dropped, an empty one starting from end-of-text, a long one
  cropped.
- check_start: a note when the first token is one the model reads as a constant vector.
"""

import os
import stat
import sys

from bincode_gpt.inputs import decode_text
from bincode_gpt.tokenizer import Text, without_nul
from model import GPT, constant_input_ids

CARD_PROMPT = "Question: What is the capital of France?\nAnswer:"  # the released models' card
PROMPT_FILE_LIMIT = 16 * 2**20  # bytes; a prompt keeps only its last block_size tokens anyway


def check_sources(ckpt, prompt, prompt_file):
    """The flags naming what sample.py reads, before anything is read: the prompt from --prompt or
    --prompt_file, not both, and no file named '' (empty), --ckpt's said first."""
    if prompt and prompt_file is not None:
        raise ValueError("--prompt and --prompt_file both give the prompt: pass one of them")
    if prompt_file == "" or ckpt == "":
        flag = "ckpt" if ckpt == "" else "prompt_file"
        raise ValueError(f"--{flag} is '' (empty): name a file")


def read_prompt_file(path):
    """A regular text file of at most PROMPT_FILE_LIMIT bytes, read as prepare_data.py reads text
    (UTF-8; UTF-16 or UTF-32 with a byte-order mark): /dev/zero, a FIFO or a folder is refused by
    name, not read until memory runs out."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise OSError(f"{path}: cannot read the prompt file ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode)
                else "not a regular file (a device, FIFO or socket)")
        raise ValueError(f"{path}: the prompt file is {kind}: give a text file")
    if st.st_size > PROMPT_FILE_LIMIT:
        raise ValueError(f"{path}: the prompt file is {st.st_size:,} bytes, over the "
                         f"{PROMPT_FILE_LIMIT:,}-byte limit (a prompt keeps only its last "
                         "block_size tokens)")
    with open(path, "rb") as f:
        return decode_text(f.read(PROMPT_FILE_LIMIT + 1), path)


def default_prompt(entry):
    """The text a sample continues when none is given, by the checkpoint's tokenizer entry. A
    converted release (its tokenizer is the release's tokenizer.json) continues its model card's
    prompt. A model trained here gets none: it starts from the end-of-text token that ends every
    document of its prepared data, i.e. at the start of a new document (nanoGPT starts from
    "\\n")."""
    return CARD_PROMPT if isinstance(entry, dict) and entry.get("kind") == "hf" else ""


def prompt_ids(codec: Text, prompt, block):
    """The prompt's token ids, and the prompt as printed: its NULs dropped, as prepare_data.py drops
    them from text (NUL's id is 0, the all-zero code); an empty one starts from end-of-text (a
    document boundary); a long one keeps its last `block` tokens."""
    prompt, nul = without_nul(prompt)
    if nul:
        print(f"note: dropped {nul} NUL character{'s' * (nul != 1)} (U+0000) from the prompt, as "
              "prepare_data.py drops them from the text models train on", file=sys.stderr)
    ids = codec.encode(prompt)
    if not ids:
        if codec.eos_token_id is None:
            raise ValueError("the prompt is empty and the tokenizer has no end-of-text token to "
                             "start from")
        ids = [codec.eos_token_id]
    if len(ids) > block:
        print(f"note: the prompt is {len(ids)} tokens, longer than the context ({block}): "
              f"keeping its last {block}", file=sys.stderr)
        ids = ids[-block:]
        prompt = codec.decode(ids)
    return ids, prompt


def check_start(model: GPT, codec: Text, ids):
    """Say once when the first token is one this model reads as a constant vector
    (model.constant_input_ids): its logits there are exactly 0 whatever the weights. A model whose
    end-of-text has the all-ones code (data prepared with --no-reserve_ones) starts every unprompted
    sample so (docs/zero-code.md)."""
    if ids[0] in constant_input_ids(model):
        name = " (end-of-text)" if ids[0] == codec.eos_token_id else ""
        print(f"note: the start token {ids[0]}{name} enters this model (no biases, "
              f"{model.config.input} input) as a constant vector: the logits after it are exactly "
              "0, so a sample from it alone draws its first token uniformly (greedy: id 0). Give a "
              "--prompt, or train on data prepared with today's defaults (docs/zero-code.md)",
              file=sys.stderr)
