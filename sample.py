"""
Sample text from a checkpoint, streamed as it is produced (KV-cache decoding via model.stream).

    python sample.py                                     # out/ckpt.pt, what `python train.py` just trained
    python sample.py --ckpt out/run                      # the card's prompt, greedy-free sampling
    python sample.py --ckpt out/fixmin --temperature 0 --max_new_tokens 3
    python sample.py --ckpt out/run --prompt_file p.txt --num_samples 3 --top_p 0.9 --seed 1

The tokenizer comes from the checkpoint: a tiktoken encoding by name (native runs) or a tokenizer.json
beside the checkpoint (converted releases; needs the `tokenizers` package). Generation stops at the
tokenizer's end-of-text token (<|endoftext|>, </s>). A prompt longer than the context keeps its last
block_size tokens (with a notice on stderr).
"""

import argparse
import math
import os
import sys

import torch

from checkpoint import load_checkpoint
from common import pick_device, run_main
from tokenizer import load_text_codec

DEFAULT_PROMPT = "Question: What is the capital of France?\nAnswer:"


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
    torch.manual_seed(args.seed)
    model, ckpt = load_checkpoint(args.ckpt, device)
    model = model.to(getattr(torch, args.dtype)).eval()
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
