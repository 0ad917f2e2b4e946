"""
Sample text from a checkpoint, streamed as it is produced (KV-cache decoding via decode.stream).

    python sample.py                                     # out/ckpt.pt, what `python train.py` just trained
    python sample.py --ckpt out/run --prompt "ROMEO:"    # continue a prompt
    python sample.py --ckpt out/fixmin --temperature 0 --max_new_tokens 3   # a converted release: the card's prompt
    python sample.py --ckpt out/run --prompt_file p.txt --num_samples 3 --top_p 0.9 --seed 1
    python sample.py --ckpt out/fixmin --quantize int8   # int8 weights: quicker on a CPU (quantize.py)
    python sample.py --ckpt out/fixmin-int8              # an int8 checkpoint (tools.convert native2int8): 0.4x memory
    python sample.py --ckpt out/fixmin-int8 --compile --max_new_tokens 2000   # long outputs: a compiled int8 step
    python sample.py --ckpt out/run --device cuda --compile --cuda_graphs   # on a GPU: the step as CUDA graphs

Without a prompt, a checkpoint trained here starts a new document: from the end-of-text token, which
ends every document of its prepared data. A converted release continues its model card's prompt,
"Question: What is the capital of France?\\nAnswer:".

The tokenizer comes from the checkpoint: a tiktoken encoding by name (native runs) or a tokenizer.json
beside the checkpoint (converted releases; needs the `tokenizers` package). Generation stops at the
tokenizer's end-of-text token (<|endoftext|>, </s>), and never draws an id the tokenizer cannot decode
(a vocabulary padded past it, as --vocab_size=65536 on GPT-2's 50,257 tokens). A prompt longer than the context
keeps its last block_size tokens (with a notice on stderr).
"""

from bincode_gpt.cli import quiet_interrupt  # first: Ctrl-C during the imports (torch's take seconds) exits 130 with one line
quiet_interrupt(__name__)

import math
import os
import stat
import sys
from dataclasses import dataclass

import torch

from bincode_gpt.checkpoint import check_finite, is_int8, load_checkpoint
from bincode_gpt.cli import config_parser, parse_settings, run_main, setting
from bincode_gpt.decode import check_cuda_graphs, stream
from bincode_gpt.devices import pick_device
from bincode_gpt.memory import available_memory, memory_bytes
from bincode_gpt.tokenizer import load_text_codec
from model import constant_input_ids

CARD_PROMPT = "Question: What is the capital of France?\nAnswer:"  # the released models' card
PROMPT_FILE_LIMIT = 16 * 2**20  # bytes; a prompt keeps only its last block_size tokens anyway


@dataclass
class SampleConfig:
    ckpt: str = setting("out/ckpt.pt", "a checkpoint .pt file, or a folder holding ckpt.pt")
    prompt: str = setting("", "text to continue (default: none; a native checkpoint then starts a new document, a "
                              "converted release continues its model card's prompt)")
    prompt_file: str | None = setting(None, "read the prompt from this UTF-8 file instead of --prompt")
    num_samples: int = setting(1, "how many continuations")
    max_new_tokens: int = setting(100, "tokens per continuation (fewer if end-of-text comes)")
    temperature: float = setting(0.8, "softmax temperature; 0 = greedy (so is one below 1.2e-38, too small to "
                                      "divide by)")
    top_k: int | None = setting(None, "sample only among the k most likely tokens")
    top_p: float | None = setting(None, "nucleus sampling: the smallest set with this much probability")
    seed: int = setting(1337, "random seed")
    device: str = setting("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    dtype: str = setting("float32", "weights and activations", choices=["float32", "bfloat16", "float16"])
    compile: bool = setting(False, "torch.compile the one-token decoding step: tens of seconds once per size class of "
                                   "prompt + new tokens (64, 128, ... positions), then faster tokens (long outputs); "
                                   "int8 weights then multiply float activations (quantize.py)")
    quantize: str | None = setting(None, "int8: the linear layers' weights in int8 (CPU): a quarter of the bytes per "
                                         "token, faster decoding (quantize.py)", choices=["int8"])
    cuda_graphs: bool = setting(False, "with --compile on CUDA: record the step as CUDA graphs (mode="
                                       "'reduce-overhead', the KV cache at fixed addresses): fewer kernel launches "
                                       "a token; refused elsewhere")
    verbose: bool = setting(False, "say on stderr which int8 kernel this CPU got and why (quantize.py)")


def default_prompt(ckpt):
    """The text a sample continues when none is given. A converted release (its tokenizer is the
    release's tokenizer.json) continues its model card's prompt. A model trained here gets none: it
    starts from the end-of-text token that ends every document of its prepared data, i.e. at the
    start of a new document (nanoGPT starts from "\\n")."""
    entry = ckpt.get("tokenizer")
    return CARD_PROMPT if isinstance(entry, dict) and entry.get("kind") == "hf" else ""


def sample_stream(model, codec, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None,
                  compile=False, cuda_graphs=False):
    """Yield text pieces of one continuation as tokens arrive; stops at the end-of-text token. Only ids the
    tokenizer decodes are drawn (drawable)."""
    device = next(model.parameters()).device
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    decode = codec.decoder()
    eos = codec.eos_token_id
    allowed = drawable(codec, model.config.vocab_size, device)
    for nxt in stream(model, idx, max_new_tokens, temperature, top_k, top_p, eos, generator, compile, allowed,
                      cuda_graphs):
        i = int(nxt[0, 0])
        if i == eos:
            break
        piece = decode(i)
        if piece:
            yield piece
    tail = decode()
    if tail:
        yield tail


def check_settings(cfg):
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
        raise ValueError(f"--{'ckpt' if cfg.ckpt == '' else 'prompt_file'} is '' (empty): name a file")


def read_prompt_file(path):
    """A regular UTF-8 file of at most PROMPT_FILE_LIMIT bytes: /dev/zero, a FIFO or a folder is refused by
    name, not read until memory runs out."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise OSError(f"{path}: cannot read the prompt file ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise ValueError(f"{path}: the prompt file is {kind}: give a text file")
    if st.st_size > PROMPT_FILE_LIMIT:
        raise ValueError(f"{path}: the prompt file is {st.st_size:,} bytes, over the {PROMPT_FILE_LIMIT:,}-byte limit "
                         "(a prompt keeps only its last block_size tokens)")
    with open(path, "rb") as f:
        data = f.read(PROMPT_FILE_LIMIT + 1)
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (Windows editors write one) is not text
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def prompt_ids(codec, prompt, block):
    """The prompt's token ids, and the prompt as printed: an empty one starts from end-of-text (a
    document boundary); a long one keeps its last `block` tokens."""
    ids = codec.encode(prompt)
    if not ids:
        if codec.eos_token_id is None:
            raise ValueError("the prompt is empty and the tokenizer has no end-of-text token to start from")
        ids = [codec.eos_token_id]
    if len(ids) > block:
        print(f"note: the prompt is {len(ids)} tokens, longer than the context ({block}): keeping its last {block}",
              file=sys.stderr)
        ids = ids[-block:]
        prompt = codec.decode(ids)
    return ids, prompt


def drawable(codec, vocab_size, device):
    """The ids a sample may draw, as a mask (None: all of them): those its tokenizer decodes. A vocabulary
    padded past its tokenizer (65,536 over GPT-2's 50,257, as nanoGPT pads to 50,304) holds ids that mean
    no text; the model gives them some probability all the same."""
    ids = [i for i in codec.token_ids() if i < vocab_size]
    if len(ids) == vocab_size:
        return None
    if not ids:
        raise ValueError(f"the tokenizer decodes none of the model's {vocab_size:,} ids: it is not this model's")
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[ids] = True
    return mask.to(device)


def check_cache_fits(model, positions, device):
    """Refuse up front a generation whose KV cache and rotary tables (decode.memory_bytes) cannot fit in the
    device's free memory, naming the numbers, instead of failing in the allocator."""
    p = next(model.parameters())
    need, free = memory_bytes(model.config, 1, positions, p.dtype), available_memory(device)
    if free is not None and need > free:
        raise ValueError(f"prompt + --max_new_tokens = {positions:,} positions need {need / 2**30:,.1f} GiB for the KV "
                         f"cache and rotary tables, but {free / 2**30:,.1f} GiB is free on {device}: ask for fewer "
                         "tokens")


def check_start(model, codec, ids):
    """Say once when the first token is one this model reads as a constant vector (model.constant_input_ids):
    its logits there are exactly 0 whatever the weights. A checkpoint trained on data prepared before
    end-of-text left the all-ones code starts every unprompted sample so (docs/zero-code.md)."""
    if ids[0] in constant_input_ids(model):
        name = " (end-of-text)" if ids[0] == codec.eos_token_id else ""
        print(f"note: the start token {ids[0]}{name} enters this model (no biases, {model.config.input} input) as a "
              "constant vector: the logits after it are exactly 0, so a sample from it alone draws its first token "
              "uniformly (greedy: id 0). Give a --prompt, or train on data prepared with today's defaults "
              "(docs/zero-code.md)", file=sys.stderr)


def main(argv=None):
    description, epilog = __doc__.strip().split("\n\n", 1)
    cfg = parse_settings(config_parser(SampleConfig, description, epilog), argv)
    check_settings(cfg)
    prompt = read_prompt_file(cfg.prompt_file) if cfg.prompt_file is not None else cfg.prompt
    device = pick_device(cfg.device)
    check_cuda_graphs(cfg.cuda_graphs, cfg.compile, device)  # before reading the checkpoint
    if cfg.quantize:
        from bincode_gpt.quantize import check_quantize, quantize_int8  # int8 only: float sampling never loads quantize.py

        check_quantize(cfg.quantize, device, getattr(torch, cfg.dtype))  # before reading the checkpoint
    torch.manual_seed(cfg.seed)
    # an int8 checkpoint (python -m tools.convert native2int8) too; compiled, its layers stay on their rows
    # built on the CPU from the file's map, then moved: only the weights reach the device, each cast on its way
    model, ckpt = load_checkpoint(cfg.ckpt, "cpu", int8=True, pack=not cfg.compile)
    if is_int8(ckpt):  # int8 weights: what --quantize int8 cannot do, this cannot either
        from bincode_gpt.quantize import check_quantize

        check_quantize("int8", device, getattr(torch, cfg.dtype))
    check_finite(model.state_dict(), cfg.ckpt, "sample from")  # a diverged model would print "!!!!!!" greedily
    if not is_int8(ckpt):  # int8 layers are float32 between their matmuls, and a thread may be packing them now:
        model = model.to(device, getattr(torch, cfg.dtype))  # Module.to would write back each rows tensor it read
    model = model.eval()
    if cfg.quantize and not is_int8(ckpt):  # an int8 checkpoint is int8 already
        model = quantize_int8(model, pack=not cfg.compile)
    if cfg.verbose:  # which int8 kernel this CPU got (quantize.py), or that there is none
        from bincode_gpt.quantize import kernel_line

        int8 = cfg.quantize or is_int8(ckpt)
        print(kernel_line(model, cfg.compile) if int8 else f"no int8 weights: {cfg.dtype} matmuls", file=sys.stderr)
    codec = load_text_codec(ckpt, cfg.ckpt)
    if not (cfg.prompt_file is not None or prompt):
        prompt = default_prompt(ckpt)
    ids, prompt = prompt_ids(codec, prompt, model.config.block_size)
    check_start(model, codec, ids)
    check_cache_fits(model, len(ids) + cfg.max_new_tokens, device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)

    for n in range(cfg.num_samples):
        sys.stdout.write(prompt)
        sys.stdout.flush()
        top_k = cfg.top_k or None  # 0: no top-k cut
        for piece in sample_stream(model, codec, ids, cfg.max_new_tokens, cfg.temperature, top_k, cfg.top_p, generator,
                                   cfg.compile, cfg.cuda_graphs):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n" + ("---------------\n" if cfg.num_samples > 1 else ""))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
