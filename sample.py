"""
Sample text from a checkpoint, streamed as it is produced (KV-cache decoding via model.stream).

    python sample.py                                     # out/ckpt.pt, what `python train.py` just trained
    python sample.py --ckpt out/run                      # the card's prompt, greedy-free sampling
    python sample.py --ckpt out/fixmin --temperature 0 --max_new_tokens 3
    python sample.py --ckpt out/run --prompt_file p.txt --num_samples 3 --top_p 0.9 --seed 1
    python sample.py --ckpt out/fixmin --quantize int8   # int8 weights: quicker on a CPU

The tokenizer comes from the checkpoint: a tiktoken encoding by name (native runs) or a tokenizer.json
beside the checkpoint (converted releases; needs the `tokenizers` package). Generation stops at the
tokenizer's end-of-text token (<|endoftext|>, </s>). A prompt longer than the context keeps its last
block_size tokens (with a notice on stderr).
"""

import argparse
import codecs
import json
import math
import os
import sys

import torch

from common import pick_device, run_main
from model import load_checkpoint
from prepare_data import get_tokenizer
from quantize import QUANTIZE, check_quantize, quantize_int8

DEFAULT_PROMPT = "Question: What is the capital of France?\nAnswer:"
EOS_CANDIDATES = ["</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"]  # end-of-text names, most common first


class TiktokenText:
    """A tiktoken encoding; decodes token bytes incrementally, so a character split across tokens
    is printed once complete."""

    def __init__(self, enc):
        self.enc, self.eos_token_id = enc, enc.eot_token

    def encode(self, text):
        return self.enc.encode(text, allowed_special="all")

    def decode(self, ids):
        return self.enc.decode(ids)

    def decoder(self):
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def decode(i=None):
            if i is not None and i >= self.enc.n_vocab:  # a model with more ids than its tokenizer: say so, no KeyError
                raise ValueError(f"the model produced token id {i}, but its tokenizer has {self.enc.n_vocab:,} tokens: "
                                 "the checkpoint's tokenizer does not match its model")
            return utf8.decode(b"" if i is None else self.enc.decode_single_token_bytes(i), final=i is None)
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
            with open(cfg, encoding="utf-8") as f:
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

    def decoder(self):
        ids, shown = [], [""]

        def step(i=None):
            if i is not None:
                ids.append(i)
            text = self.decode(ids)
            if i is not None and text.endswith("\ufffd"):
                return ""
            new = text[len(shown[0]):] if text.startswith(shown[0]) else text[len(os.path.commonprefix([text, shown[0]])):]
            shown[0] = text
            return new

        return step


def load_text_codec(ckpt, ckpt_path):
    entry = ckpt.get("tokenizer")
    if not entry:
        raise ValueError(f"{ckpt_path} names no tokenizer: cannot turn text into tokens")
    if not isinstance(entry, dict):
        raise ValueError(f"{ckpt_path}: unknown tokenizer entry {entry!r}")
    if entry.get("kind") == "tiktoken":
        return TiktokenText(get_tokenizer(entry.get("encoding", "gpt2"), entry.get("vocab_size")))
    if entry.get("kind") == "hf":
        folder = ckpt_path if os.path.isdir(ckpt_path) else os.path.dirname(os.path.abspath(ckpt_path))
        name = entry.get("file", "tokenizer.json")
        # the name comes from the checkpoint: a plain file name in its folder, never a path out of it
        # (convert.file_in makes the same check; convert.py imports this module, so it cannot be imported here)
        if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name or "\\" in name:
            raise ValueError(f"{ckpt_path}: the tokenizer entry names {name!r}, which is not a file name inside {folder}: refused")
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"the checkpoint's tokenizer {path} is missing")
        return HFText(path)
    raise ValueError(f"{ckpt_path}: unknown tokenizer entry {entry!r}")


def sample_stream(model, codec, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None,
                  compile=False):
    """Yield text pieces of one continuation as tokens arrive; stops at the end-of-text token."""
    device = next(model.parameters()).device
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    decode = codec.decoder()
    eos = codec.eos_token_id
    for nxt in model.stream(idx, max_new_tokens, temperature, top_k, top_p, eos, generator, compile):
        i = int(nxt[0, 0])
        if i == eos:
            break
        piece = decode(i)
        if piece:
            yield piece
    tail = decode()
    if tail:
        yield tail


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(), epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default="out/ckpt.pt", help="a checkpoint .pt file, or a folder holding ckpt.pt")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to continue (default: the model card's %(default)r)")
    p.add_argument("--prompt_file", default=None, help="read the prompt from this UTF-8 file instead")
    p.add_argument("--num_samples", type=int, default=1, help="how many continuations")
    p.add_argument("--max_new_tokens", type=int, default=100, help="tokens per continuation (fewer if end-of-text comes)")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 = greedy")
    p.add_argument("--top_k", type=int, default=None, help="sample only among the k most likely tokens")
    p.add_argument("--top_p", type=float, default=None, help="nucleus sampling: the smallest set with this much probability")
    p.add_argument("--seed", type=int, default=1337, help="random seed")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights and activations")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the one-token decoding step: tens of seconds once, then faster tokens (long outputs)")
    p.add_argument("--quantize", default=None, choices=QUANTIZE,
                   help="int8: the linear layers' weights in int8 (CPU): a quarter of the bytes per token, faster decoding (quantize.py)")
    args = p.parse_args(argv)
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a number >= 0 (0 = greedy), got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top_p must be in (0, 1], got {args.top_p}")
    if args.max_new_tokens < 0 or args.num_samples < 1:
        raise ValueError("--max_new_tokens must be >= 0 and --num_samples >= 1")
    if args.top_k is not None and args.top_k <= 0:
        args.top_k = None  # 0 means no top-k cut

    prompt = args.prompt
    if args.prompt_file:
        with open(args.prompt_file, "rb") as f:
            data = f.read()
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{args.prompt_file}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    device = pick_device(args.device)
    check_quantize(args.quantize, device, getattr(torch, args.dtype), args.compile)  # before reading the checkpoint
    torch.manual_seed(args.seed)
    model, ckpt = load_checkpoint(args.ckpt, device)
    model = model.to(getattr(torch, args.dtype)).eval()
    if args.quantize:
        model = quantize_int8(model)
    codec = load_text_codec(ckpt, args.ckpt)

    ids = codec.encode(prompt)
    if not ids:  # an empty prompt starts from end-of-text, as a document boundary
        if codec.eos_token_id is None:
            raise ValueError("the prompt is empty and the tokenizer has no end-of-text token to start from")
        ids = [codec.eos_token_id]
    block = model.config.block_size
    if len(ids) > block:
        print(f"note: the prompt is {len(ids)} tokens, longer than the context ({block}): keeping its last {block}",
              file=sys.stderr)
        ids = ids[-block:]
        prompt = codec.decode(ids)
    generator = torch.Generator(device=device).manual_seed(args.seed)

    for n in range(args.num_samples):
        sys.stdout.write(prompt)
        sys.stdout.flush()
        for piece in sample_stream(model, codec, ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p, generator,
                                   args.compile):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n" + ("---------------\n" if args.num_samples > 1 else ""))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
