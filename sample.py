"""
Sample text from a checkpoint, streamed as it is produced (KV-cache decoding via decode.stream).

    python sample.py                                    # out/ckpt.pt: what train.py just trained
    python sample.py --ckpt out/run --prompt "ROMEO:"   # continue a prompt
    python sample.py --ckpt out/fixmin --temperature 0 --max_new_tokens 3  # a release's card prompt
    python sample.py --ckpt out/run --prompt_file p.txt --num_samples 3 --top_p 0.9 --seed 1
    python sample.py --ckpt out/fixmin --quantize int8  # int8 weights: quicker on a CPU
    python sample.py --ckpt out/fixmin-int8             # tools.convert native2int8: 0.4x memory
    python sample.py --ckpt out/fixmin-int8 --compile --max_new_tokens 2000  # long outputs
    python sample.py --ckpt out/run --device cuda --compile --cuda_graphs    # as CUDA graphs

Without a prompt, a checkpoint trained here starts a new document: from the end-of-text token, which
ends every document of its prepared data. A converted release continues its model card's prompt,
"Question: What is the capital of France?\\nAnswer:".

The tokenizer comes from the checkpoint: a tiktoken encoding by name (native runs) or a
tokenizer.json beside the checkpoint (converted releases; needs the `tokenizers` package).
Generation stops at the tokenizer's end-of-text token (<|endoftext|>, </s>), and never draws an id
the tokenizer cannot decode (a vocabulary padded past it, as --vocab_size=65536 on GPT-2's 50,257
tokens). A prompt longer than the context keeps its last block_size tokens (with a notice on
stderr).
"""

# first: its import makes a Ctrl-C while torch loads one line and exit 130
from bincode_gpt.exits import run_main

import sys
from dataclasses import dataclass

import torch

from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.decode import Decoder, check_cuda_graphs, check_sampling, drawable
from bincode_gpt.devices import pick_device, pick_dtype
from bincode_gpt.memory import check_cache_fits
from bincode_gpt.prompts import (check_sources, check_start, default_prompt, prompt_ids,
                                 read_prompt_file)
from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.tokenizer import Text, load_text_codec


@dataclass
class SampleConfig:
    ckpt: str = setting("out/ckpt.pt", "a checkpoint .pt file, or a folder holding ckpt.pt (else "
                                       "best.pt)")
    prompt: str = setting("", "text to continue (default: none; a native checkpoint then starts a "
                              "new document, a converted release continues its model card's "
                              "prompt)")
    prompt_file: str | None = setting(None, "read the prompt from this text file instead of "
                                            "--prompt (UTF-8, or UTF-16/32 with a byte-order mark)")
    num_samples: int = setting(1, "how many continuations")
    max_new_tokens: int = setting(100, "tokens per continuation (fewer if end-of-text comes)")
    temperature: float = setting(0.8, "softmax temperature; 0 = greedy (so is one below 1.2e-38, "
                                      "too small to divide by)")
    top_k: int | None = setting(None, "sample only among the k most likely tokens")
    top_p: float | None = setting(None, "nucleus sampling: the smallest set with this much "
                                        "probability")
    seed: int = setting(1337, "random seed")
    device: str = setting("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    dtype: str = setting("auto", "weights and activations; auto: bfloat16 on a CUDA GPU with "
                                 "bfloat16 units, else float32",
                         choices=["auto", "float32", "bfloat16", "float16"])
    compile: bool = setting(False, "torch.compile the one-token decoding step: tens of seconds "
                                   "once per size class of prompt + new tokens (64, 128, ... "
                                   "positions), then faster tokens (long outputs); int8 weights "
                                   "then multiply float activations (quantize.py)")
    quantize: str | None = setting(None, "int8: the linear layers' weights in int8 (CPU): a "
                                         "quarter of the bytes per token, faster decoding "
                                         "(quantize.py)",
                                   choices=["int8"])
    cuda_graphs: bool = setting(False, "with --compile on CUDA: record the step as CUDA graphs "
                                       "(mode='reduce-overhead', the KV cache at fixed addresses): "
                                       "fewer kernel launches a token; refused elsewhere")
    verbose: bool = setting(False, "say on stderr which int8 kernel this CPU got and why "
                                   "(quantize.py)")


def sample_stream(decoder: Decoder, codec: Text, prompt_ids, max_new_tokens, **options):
    """Yield text pieces of one continuation as tokens arrive; stops at the end-of-text token. Only
    ids the tokenizer decodes are drawn (decode.drawable). `options`: Decoder.stream's
    (temperature, top_k, top_p, generator)."""
    model = decoder.model
    device = next(model.parameters()).device
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    decode = codec.decoder()
    eos = codec.eos_token_id
    allowed = drawable(codec.token_ids(), model.config.vocab_size, device)
    for nxt in decoder.stream(idx, max_new_tokens, eos_token_id=eos, allowed=allowed, **options):
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
    description, epilog = __doc__.strip().split("\n\n", 1)
    cfg = parse_settings(config_parser(SampleConfig, description, epilog), argv)
    check_sampling(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=cfg.seed,
                   max_new_tokens=cfg.max_new_tokens, num_samples=cfg.num_samples)
    check_sources(ckpt=cfg.ckpt, prompt=cfg.prompt, prompt_file=cfg.prompt_file)
    prompt = cfg.prompt if cfg.prompt_file is None else read_prompt_file(cfg.prompt_file)
    device = pick_device(cfg.device)
    dtype = getattr(torch, pick_dtype(cfg.dtype, device, sampling=True))
    check_cuda_graphs(cfg.cuda_graphs, cfg.compile, device)  # before reading the checkpoint
    torch.manual_seed(cfg.seed)
    # NaN or inf weights refused; int8 weights (--quantize int8, an int8 checkpoint): CPU only,
    # left unpacked for a compiled step
    model, ckpt = load_checkpoint(cfg.ckpt, device, dtype=dtype, quantize=cfg.quantize, int8=True,
                                  pack=not cfg.compile, purpose="sample from")
    model = model.eval()
    if cfg.verbose:  # imported here: float sampling never loads quantize.py otherwise
        from bincode_gpt.quantize import kernel_line

        print(kernel_line(model, cfg.compile), file=sys.stderr)

    codec = load_text_codec(ckpt, cfg.ckpt)
    if cfg.prompt_file is None and not prompt:
        prompt = default_prompt(ckpt.get("tokenizer"))
    ids, prompt = prompt_ids(codec, prompt, model.config.block_size)
    check_start(model, codec, ids)

    check_cache_fits(model.config, len(ids) + cfg.max_new_tokens, device, dtype)
    # one decoder for every sample: its compiled step (--compile) is compiled once
    decoder = Decoder(model, compile=cfg.compile, cuda_graphs=cfg.cuda_graphs)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    for _ in range(cfg.num_samples):
        sys.stdout.write(prompt)
        sys.stdout.flush()
        pieces = sample_stream(decoder, codec, ids, cfg.max_new_tokens,
                               temperature=cfg.temperature,
                               top_k=cfg.top_k or None,  # 0: no top-k cut
                               top_p=cfg.top_p,
                               generator=generator)
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n" + ("---------------\n" if cfg.num_samples > 1 else ""))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
