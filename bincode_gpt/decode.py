"""
Fast decoding for model.GPT: a KV cache, sampling one token from logits, and generation.

generate(model, idx, n) runs the prompt through the model once, then one token at a time. Each step
attends to the keys and values of every token before it, kept in a KVCache sized to the generation
(prompt + new tokens, rounded up to its size class; at most block_size slots, a ring once full, so decoding goes on past
block_size as a sliding window). Keys are cached already rotated at their absolute positions, and
rotary attention depends only on the distance between positions. The one-token step has fixed
shapes, so torch.compile can compile it once (compile=True); the cache is sized by class (size_class), so
that one compile serves every prompt and output length of the class. On CUDA, cuda_graphs=True records
the compiled step as CUDA graphs (mode="reduce-overhead") over a cache kept at fixed addresses. A Decoder
keeps both, the compiled step and that cache, from one generation to the next.
check_sampling refuses a setting sampling cannot use; drawable masks the ids a tokenizer cannot decode.
"""

import math

import torch

from model import GPT, GPTConfig, rotary_cos_sin

MIN_CLASS = 64  # positions of the smallest cache: short generations share one compile


def check_ids(idx, vocab_size):
    """A clear error for ids outside [0, V) where they enter (a bad id would fail deep inside an index
    op, on a GPU as a device assert, or with the affine input silently alias another token)."""
    if idx.numel() == 0:
        raise ValueError("no token ids: a prompt needs at least one token")
    lo, hi = idx.min().item(), idx.max().item()
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab_size})")


def size_class(positions):
    """The positions a KV cache is built for, for a generation reaching `positions` (prompt + new tokens):
    the next power of two, at least MIN_CLASS. Its shapes are the compiled step's, so every generation of a
    class runs one compile (64 to 1,024 positions: five classes), for at most twice the memory."""
    return max(MIN_CLASS, 1 << (positions - 1).bit_length())


class KVCache:
    """Keys and values of every layer for one generation: `size` slots per layer, a ring once full.

    size = size_class(positions), at most block_size: memory for what is generated, not for the whole
    context (a 3-token sample holds 64 slots, not 1,024); the slots past `positions` stay masked. Past
    block_size the ring slides: the newest token overwrites the oldest. One token's step reads no Python-side
    state: its position, its slot and the mask of written slots are tensors, updated in place, and every
    shape is fixed by the class, so torch.compile compiles the step once per class (Decoder(compile=True)).
    static=True marks every tensor as a fixed address for CUDA graphs (torch._dynamo.mark_static_address):
    a recorded graph reads and writes them where they are; reset() readies the cache for the next generation."""

    def __init__(self, config: GPTConfig, batch_size, positions, device, dtype, static=False):
        head_dim = config.n_embd // config.n_head
        self.reach = size_class(positions)
        self.size = min(self.reach, config.block_size)
        shape = (batch_size, config.n_head, self.size, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.written = torch.zeros(1, self.size, dtype=torch.bool, device=device)  # (1 query, size) mask: slots in use
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # tokens seen so far
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # where the current token goes: pos % size
        # rotary angles of every position the class reaches (past block_size too)
        cos, sin = rotary_cos_sin(torch.arange(self.reach), head_dim, config.rope_base)
        self.cos, self.sin = cos.to(device, dtype), sin.to(device, dtype)
        if static:
            for t in self.tensors():
                torch._dynamo.mark_static_address(t)

    def tensors(self):
        return [*self.k, *self.v, self.written, self.pos, self.slot, self.cos, self.sin]

    def reset(self):
        """Empty, for the next generation: no slot written, no token seen (the keys and values are masked)."""
        self.written.zero_()
        self.pos.zero_()

    def advance(self, T):
        """Start a forward pass over T new tokens: mark their slots, count them as seen, return their rotary
        cos/sin."""
        if T > 1:  # the prompt: slots 0 .. T-1, attending causally to itself
            if self.written.any():
                raise ValueError("the KV cache takes a multi-token chunk only at the start")
            self.written[:, :T] = True
            self.pos += T  # in place: a compiled step sees the same tensor every time
            return self.cos[:T], self.sin[:T]
        torch.remainder(self.pos, self.size, out=self.slot)
        self.written.index_fill_(1, self.slot, True)
        cos, sin = self.cos.index_select(0, self.pos), self.sin.index_select(0, self.pos)
        self.pos += 1
        return cos, sin

    def update(self, layer, k, v):
        """Store k, v (B, H, T, D) of the newest T tokens. Returns the keys, values and mask to attend
        to: a prompt, itself (causal, no mask); one token, every slot, masked to the written ones."""
        if k.shape[2] > 1:
            self.k[layer].narrow(2, 0, k.shape[2]).copy_(k)
            self.v[layer].narrow(2, 0, k.shape[2]).copy_(v)
            return k, v, None
        self.k[layer].index_copy_(2, self.slot, k)
        self.v[layer].index_copy_(2, self.slot, v)
        return self.k[layer], self.v[layer], self.written  # the mask broadcasts over (B, H, 1, size)


def check_sampling(*, temperature, top_k, top_p, seed, max_new_tokens, num_samples):
    """A clear refusal of a sampling setting sample_next or torch cannot use, before anything is read."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"--temperature must be a number >= 0 (0 = greedy), got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"--top_p must be in (0, 1], got {top_p}")
    if not -2**63 <= seed < 2**64:  # what torch.manual_seed takes
        raise ValueError(f"--seed must be in [-2**63, 2**64), got {seed}")
    if max_new_tokens < 0 or num_samples < 1:
        raise ValueError("--max_new_tokens must be >= 0 and --num_samples >= 1")
    if top_k is not None and top_k < 0:
        raise ValueError(f"--top_k must be a count >= 1 (0 or none: no top-k cut), got {top_k}")


def drawable(token_ids, vocab_size, device):
    """The ids a sample may draw, as a mask for sample_next's `allowed` (None: all of them): those of
    `token_ids` (the ids its tokenizer decodes) below vocab_size. A vocabulary padded past its tokenizer
    (65,536 over GPT-2's 50,257, as nanoGPT pads to 50,304) holds ids that mean no text; the model gives
    them some probability all the same."""
    ids = [i for i in token_ids if i < vocab_size]
    if len(ids) == vocab_size:
        return None
    if not ids:
        raise ValueError(f"the tokenizer decodes none of the model's {vocab_size:,} ids: "
                         "it is not this model's")
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[ids] = True
    return mask.to(device)


def sample_next(logits, temperature=1.0, *, top_k=None, top_p=None, generator=None, allowed=None):
    """(B, V) logits -> (B, 1) token ids: greedy at temperature 0, else top-k / nucleus sampling. `allowed`
    (V bools): the ids that may be drawn (a vocabulary padded past its tokenizer: the rest mean no text).
    A temperature below the dtype's smallest normal number (1.2e-38 in float32) cannot be divided by: greedy."""
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -float("inf"))
    if temperature < torch.finfo(logits.dtype).tiny:
        return logits.argmax(dim=-1, keepdim=True)
    # the max first, and a temperature of at most the dtype's largest number: the logits then reach -inf or 0,
    # never +inf or NaN (inf - inf, -inf / inf), at any temperature
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / min(temperature, torch.finfo(logits.dtype).max)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token once the tokens ranked above it already reach top_p (the first always stays)
        drop = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop[:, 0] = False  # even where top_p rounds to 0 in the logits' dtype
        logits = logits.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


class Decoder:
    """How one model decodes, and what it keeps for that from one generation to the next, held here and not on
    the model (neither a submodule nor in its state dict). compile=True runs the one-token step through
    torch.compile, made once here and compiled once per cache size class (worth it for long generations, not
    for a few tokens); cuda_graphs=True (CUDA, with compile) records that step as CUDA graphs
    (mode="reduce-overhead") over this decoder's one KV cache (static_cache). sample.py makes one and draws
    every sample through it; stream() and generate() below make one for a single generation."""

    def __init__(self, model: GPT, *, compile=False, cuda_graphs=False):
        check_cuda_graphs(cuda_graphs, compile, next(model.parameters()).device)
        self.model, self.cuda_graphs = model, cuda_graphs
        self.step = compiled_step(model, cuda_graphs) if compile else model
        self.cache = None  # the one KV cache of CUDA graphs (static_cache)

    @torch.inference_mode()  # cheaper per op than no_grad: no version counters, no view tracking
    def stream(self, idx, max_new_tokens, *, temperature=1.0, top_k=None, top_p=None, eos_token_id=None,
               generator=None, allowed=None):
        """Yield the next token of every sequence, (B, 1), one step at a time, with a KV cache.

        temperature 0 is greedy. A prompt longer than block_size is cropped to its last block_size
        tokens. Past block_size the cache slides: each new token sees the block_size tokens before
        it (their keys were computed in their own windows, as in any sliding-window KV cache).
        Once a sequence emits eos_token_id it keeps emitting it; all done ends the stream.
        allowed: see sample_next.
        """
        model, step, cuda_graphs = self.model, self.step, self.cuda_graphs
        check_ids(idx, model.config.vocab_size)
        idx = idx[:, -model.config.block_size :]
        p = next(model.parameters())
        positions = idx.shape[1] + max_new_tokens
        cache = (self.static_cache(idx.shape[0], positions) if cuda_graphs else
                 KVCache(model.config, idx.shape[0], positions, p.device, p.dtype))
        done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        for i in range(max_new_tokens):
            if cuda_graphs:  # a new replay: the last one's outputs (logits) are read already
                torch.compiler.cudagraph_mark_step_begin()
            logits, _ = (model if i == 0 else step)(idx, cache=cache)  # the prompt runs eagerly
            nxt = sample_next(logits[:, -1, :].float(), temperature, top_k=top_k, top_p=top_p, generator=generator,
                              allowed=allowed)
            if eos_token_id is not None:
                nxt = torch.where(done[:, None], eos_token_id, nxt)
                done |= nxt[:, 0] == eos_token_id
            yield nxt
            if eos_token_id is not None and done.all():
                return
            idx = nxt

    def generate(self, idx, max_new_tokens, **options):
        """idx (B, T) -> (B, T + new): the prompt followed by what stream() yields; `options` are stream's
        (temperature, top_k, top_p, eos_token_id, generator, allowed)."""
        new = list(self.stream(idx, max_new_tokens, **options))
        return torch.cat([idx, *new], dim=1)

    def static_cache(self, batch_size, positions):
        """The decoder's one KVCache for CUDA graphs (static=True), reset for each generation of the same batch
        size and size class: a recorded graph replays on the addresses it recorded, and a new address would make
        it record again. Another batch size or class replaces it (the old one freed first). So a decoder decodes
        one cuda_graphs generation at a time (a second stream would overwrite the first's cache)."""
        p = next(self.model.parameters())
        if self.cache is None or (self.cache.k[0].shape[0], self.cache.reach) != (batch_size, size_class(positions)):
            self.cache = None  # the old one freed first
            self.cache = KVCache(self.model.config, batch_size, positions, p.device, p.dtype, static=True)
        self.cache.reset()
        return self.cache


def stream(model: GPT, idx, max_new_tokens, *, compile=False, cuda_graphs=False, **options):
    """Decoder(model, compile=..., cuda_graphs=...).stream(idx, max_new_tokens, **options): one generation, by a
    decoder of its own (a compiled step is compiled for it alone: keep a Decoder to reuse one)."""
    return Decoder(model, compile=compile, cuda_graphs=cuda_graphs).stream(idx, max_new_tokens, **options)


def generate(model: GPT, idx, max_new_tokens, *, compile=False, cuda_graphs=False, **options):
    """idx (B, T) -> (B, T + new), as stream(): one generation, by a decoder of its own."""
    return Decoder(model, compile=compile, cuda_graphs=cuda_graphs).generate(idx, max_new_tokens, **options)


def check_cuda_graphs(cuda_graphs, compile, device):
    """Nothing, or a clear refusal of CUDA-graph decoding where it cannot run: it records and replays the compiled
    step's GPU kernels."""
    if cuda_graphs and not compile:
        raise ValueError("--cuda_graphs records the compiled one-token step (mode='reduce-overhead'): add --compile")
    if cuda_graphs and torch.device(device).type != "cuda":
        raise ValueError(f"--cuda_graphs needs a CUDA device (CUDA graphs record GPU kernels), and this run is on "
                         f"{device}: drop it (--compile alone fuses the step here)")


def compiled_step(model, cuda_graphs=False):
    """model's forward under torch.compile (a Decoder makes it once and keeps it), with the inductor options in
    `model.compile_options`, if it has them (quantize.py's int8 models do), and cuda_graphs=True adds what
    mode="reduce-overhead" sets."""
    options = {**(getattr(model, "compile_options", None) or {}),
               **(torch._inductor.list_mode_options("reduce-overhead") if cuda_graphs else {})}
    return torch.compile(model, fullgraph=True, dynamic=False, options=options or None)
