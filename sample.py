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

# first, so that Ctrl-C while torch imports (seconds) exits 130 with one line
import bincode_gpt.quiet_start  # first: a Ctrl-C while torch loads is one line and exit 130

import math
import os
import stat
import sys
from dataclasses import dataclass

import torch

from bincode_gpt.checkpoint import check_finite, is_int8, load_checkpoint
from bincode_gpt.settings import config_parser, parse_settings, setting
from bincode_gpt.exits import run_main
from bincode_gpt.decode import check_cuda_graphs, stream
from bincode_gpt.devices import has_bf16, pick_device
from bincode_gpt.memory import available_memory, memory_bytes
from bincode_gpt.inputs import decode_text
from bincode_gpt.tokenizer import load_text_codec, without_nul
from model import constant_input_ids

CARD_PROMPT = "Question: What is the capital of France?\nAnswer:"  # the released models' card
PROMPT_FILE_LIMIT = 16 * 2**20  # bytes; a prompt keeps only its last block_size tokens anyway


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


def default_prompt(ckpt):
    """The text a sample continues when none is given. A converted release (its tokenizer is the
    release's tokenizer.json) continues its model card's prompt. A model trained here gets none: it
    starts from the end-of-text token that ends every document of its prepared data, i.e. at the
    start of a new document (nanoGPT starts from "\\n")."""
    entry = ckpt.get("tokenizer")
    return CARD_PROMPT if isinstance(entry, dict) and entry.get("kind") == "hf" else ""


def sample_stream(model, codec, prompt_ids, max_new_tokens, **options):
    """Yield text pieces of one continuation as tokens arrive; stops at the end-of-text token. Only
    ids the tokenizer decodes are drawn (drawable). `options`: decode.stream's (temperature, top_k,
    top_p, generator, compile, cuda_graphs)."""
    device = next(model.parameters()).device
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    decode = codec.decoder()
    eos = codec.eos_token_id
    allowed = drawable(codec, model.config.vocab_size, device)
    for nxt in stream(model, idx, max_new_tokens, eos_token_id=eos, allowed=allowed, **options):
        i = int(nxt[0, 0])
        if i == eos:
            break
        piece = decode(i)
        if piece:
            yield piece
    tail = decode()
    if tail:
        yield tail


def check_sample_settings(cfg):
    """A clear error for a sampling setting that cannot be used, before anything is read."""
    if not (math.isfinite(cfg.temperature) and cfg.temperature >= 0):
        raise ValueError(f"--temperature must be a number >= 0 (0 = greedy), got {cfg.temperature}")
    if cfg.top_p is not None and not 0 < cfg.top_p <= 1:
        raise ValueError(f"--top_p must be in (0, 1], got {cfg.top_p}")
    if not -2**63 <= cfg.seed < 2**64:  # what torch.manual_seed takes
        raise ValueError(f"--seed must be in [-2**63, 2**64), got {cfg.seed}")
    if cfg.max_new_tokens < 0 or cfg.num_samples < 1:
        raise ValueError("--max_new_tokens must be >= 0 and --num_samples >= 1")
    if cfg.top_k is not None and cfg.top_k < 0:
        raise ValueError(f"--top_k must be a count >= 1 (0 or none: no top-k cut), got {cfg.top_k}")
    if cfg.prompt and cfg.prompt_file is not None:
        raise ValueError("--prompt and --prompt_file both give the prompt: pass one of them")
    if cfg.prompt_file == "" or cfg.ckpt == "":
        flag = "ckpt" if cfg.ckpt == "" else "prompt_file"
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


def prompt_ids(codec, prompt, block):
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


def drawable(codec, vocab_size, device):
    """The ids a sample may draw, as a mask (None: all of them): those its tokenizer decodes. A
    vocabulary padded past its tokenizer (65,536 over GPT-2's 50,257, as nanoGPT pads to 50,304)
    holds ids that mean no text; the model gives them some probability all the same."""
    ids = [i for i in codec.token_ids() if i < vocab_size]
    if len(ids) == vocab_size:
        return None
    if not ids:
        raise ValueError(f"the tokenizer decodes none of the model's {vocab_size:,} ids: "
                         "it is not this model's")
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[ids] = True
    return mask.to(device)


def check_cache_fits(model, positions, device):
    """Refuse up front a generation whose KV cache and rotary tables (memory.memory_bytes) cannot
    fit in the device's free memory, naming the numbers, instead of failing in the allocator."""
    dtype = next(model.parameters()).dtype
    need = memory_bytes(model.config, 1, positions, dtype)
    free = available_memory(device)
    if free is not None and need > free:
        raise ValueError(f"prompt + --max_new_tokens = {positions:,} positions need "
                         f"{need / 2**30:,.1f} GiB for the KV cache and rotary tables, but "
                         f"{free / 2**30:,.1f} GiB is free on {device}: ask for fewer tokens")


def check_start(model, codec, ids):
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


def main(argv=None):
    description, epilog = __doc__.strip().split("\n\n", 1)
    cfg = parse_settings(config_parser(SampleConfig, description, epilog), argv)
    check_sample_settings(cfg)
    prompt = cfg.prompt if cfg.prompt_file is None else read_prompt_file(cfg.prompt_file)
    device = pick_device(cfg.device)
    if cfg.dtype == "auto":
        cfg.dtype = "bfloat16" if has_bf16(device) else "float32"
    dtype = getattr(torch, cfg.dtype)
    check_cuda_graphs(cfg.cuda_graphs, cfg.compile, device)  # before reading the checkpoint
    if cfg.quantize:
        # imported here: float sampling never loads quantize.py
        from bincode_gpt.quantize import check_quantize, quantize_int8

        check_quantize(cfg.quantize, device, dtype)  # before reading the checkpoint
    torch.manual_seed(cfg.seed)
    # built on the CPU, then only the weights move to the device; an int8 checkpoint
    # (tools.convert native2int8) too, its layers left unpacked for a compiled step
    model, ckpt = load_checkpoint(cfg.ckpt, "cpu", int8=True, pack=not cfg.compile)
    int8 = is_int8(ckpt)
    if int8:  # int8 weights: what --quantize int8 cannot do, this cannot either
        from bincode_gpt.quantize import check_quantize

        check_quantize("int8", device, dtype)
    # a diverged model would print "!!!!!!" greedily
    check_finite(model.state_dict(), cfg.ckpt, "sample from")
    # int8 layers are float32 between their matmuls, and a thread may be packing them now
    # (Module.to would write back each tensor it read): only a float model is cast
    if not int8:
        model = model.to(device, dtype)
    model = model.eval()
    if cfg.quantize and not int8:  # an int8 checkpoint is int8 already
        model = quantize_int8(model, pack=not cfg.compile)
    if cfg.verbose:  # which int8 kernel this CPU got (quantize.py), or that there is none
        from bincode_gpt.quantize import kernel_line

        line = f"no int8 weights: {cfg.dtype} matmuls"
        if cfg.quantize or int8:
            line = kernel_line(model, cfg.compile)
        print(line, file=sys.stderr)
    codec = load_text_codec(ckpt, cfg.ckpt)
    if cfg.prompt_file is None and not prompt:
        prompt = default_prompt(ckpt)
    ids, prompt = prompt_ids(codec, prompt, model.config.block_size)
    check_start(model, codec, ids)
    check_cache_fits(model, len(ids) + cfg.max_new_tokens, device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)

    for _ in range(cfg.num_samples):
        sys.stdout.write(prompt)
        sys.stdout.flush()
        pieces = sample_stream(model, codec, ids, cfg.max_new_tokens,
                               temperature=cfg.temperature,
                               top_k=cfg.top_k or None,  # 0: no top-k cut
                               top_p=cfg.top_p,
                               generator=generator,
                               compile=cfg.compile,
                               cuda_graphs=cfg.cuda_graphs)
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n" + ("---------------\n" if cfg.num_samples > 1 else ""))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
