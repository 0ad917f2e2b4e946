"""
A GPT whose input is each token id's fixed binary code: no trainable input embedding table.

arXiv 2605.09751 (Bochkov, 2026) shows a decoder-only LM learns as well when the usual trainable
V x d input table is replaced by the token id written in K = ceil(log2 V) bits, tiled to model
width. A worked example, V = 65,536 (K = 16), n_embd = 1024:

    token id 1234 = 0b0000_0100_1101_0010
    its code, bit i = (1234 >> i) & 1, least significant bit first:
        [0,1,0,0, 1,0,1,1, 0,0,1,0, 0,0,0,0]
    tiled ("tile" layout, dim j carries bit j mod 16), 64 copies side by side:
        [0,1,0,0,1,0,1,1,0,0,1,0,0,0,0,0, 0,1,0,0,1,0,1,1,0,0,1,0,0,0,0,0, ...]   (1024 values)
    "interleave" layout (bit k fills dims 64k .. 64k+63):
        [0]*64 + [1]*64 + [0]*64 + [0]*64 + [1]*64 + ...

Those 1024 zeros and ones are the residual stream's input. Nothing about them is learned.
"""

import argparse
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


def code_bits(vocab_size: int) -> int:
    """K = ceil(log2 V): the fewest bits that give every token id its own code."""
    return max(1, (vocab_size - 1).bit_length())


def binary_code(ids: torch.Tensor, bits: int) -> torch.Tensor:
    """The K-bit code of each id, least significant bit first: (...,) int -> (..., K) float 0/1."""
    return ((ids.unsqueeze(-1) >> torch.arange(bits, device=ids.device)) & 1).float()


def canonical_code(vocab_size: int, pad_token_id: int | None = None, width: int = 0):
    """The release's V x K code table: row t = the bits of t, the pad row all zeros (as released). A
    width W > K (a study) appends parity bits: bit K+j = bit j XOR bit j+1 mod K. On the CPU."""
    K = code_bits(vocab_size)
    table = binary_code(torch.arange(vocab_size, device="cpu"), K)
    j = torch.arange(max(0, width - K), device="cpu")
    parity = (table[:, j % K] + table[:, (j + 1) % K]) % 2  # (V, W - K)
    table = torch.cat([table, parity], dim=1)  # (V, K) -> (V, W)
    if pad_token_id is not None:
        table[pad_token_id] = 0.0
    return table


def lift_index(n_embd: int, bits: int, layout: str) -> torch.Tensor:
    """Which bit each model dim j carries: tile, bit j mod K (the last copy cut short); interleave,
    bit floor(j K / n_embd) (the release's repeat_interleave). Both keep all bits if n_embd >= K.
    On the CPU."""
    dims = torch.arange(n_embd, device="cpu")
    return dims % bits if layout == "tile" else dims * bits // n_embd


class BinaryCodeInput(nn.Module):
    """The paper's input: a frozen V x K table of token codes, lifted to n_embd. No parameters. The
    table is a buffer named `weight`, as in the release (the model card's audit reads it).

    The rule: no id that text can produce (end-of-text included) may enter the model as a constant
    vector: LayerNorm maps it to exactly zero, and without biases that position's stream stays
    degenerate (deep models diverge on it). Those are ids 0 and 2^K - 1: the tokenizer gives them to
    the bytes NUL and 0xFF, and prepare_data.py keeps them out of the shards (docs/zero-code.md)."""

    def __init__(self, vocab_size, n_embd, layout="tile", pad_token_id=None, width=0):
        super().__init__()
        self.register_buffer("weight", canonical_code(vocab_size, pad_token_id, width))  # (V, K)
        lift = lift_index(n_embd, self.weight.shape[1], layout)
        self.register_buffer("lift", lift, persistent=False)

    def code(self, idx):
        return self.weight[idx]  # (B, T) -> (B, T, K)

    def forward(self, idx):
        return self.code(idx).index_select(-1, self.lift)  # (B, T, K) -> (B, T, n_embd)


@dataclass
class GPTConfig:
    vocab_size: int = 50304  # token ids [0, V); the code has K = ceil(log2 V) bits
    block_size: int = 256  # context length (training sequence length)
    n_layer: int = 6  # decoder blocks
    n_head: int = 6  # attention heads
    n_embd: int = 384  # model width
    input: str = "binary"  # binary | affine | learned | random | frozen (frozen tables, controls)
    layout: str = "tile"  # tile | interleave: how K code bits are lifted to n_embd dims
    affine_seed: int = 0  # draws A and b of the affine input
    pad_token_id: int | None = None  # its code row is all zeros (binary input), as in the release
    code_width: int = 0  # binary input: 0 for K = ceil(log2 V) bits; more adds parity bits
    rope_base: float = 10000.0  # rotary base
    bias: bool = False  # biases in Linear and LayerNorm layers (never in the output head)
    dropout: float = 0.0  # dropout probability

    def __post_init__(self):
        check_config(self)  # a clear error for a shape that cannot work (checks, at the end)

    @property
    def code_bits(self):
        return self.code_width or code_bits(self.vocab_size)


TABLES = ("learned", "random", "frozen")  # the inputs that are a V x n_embd table (nn.Embedding)
# GPT-2's tokens cut for a CPU: mini is train.py's default (the quick start), small the studies'
MINI_VOCAB = 512
SMALL_VOCAB = 8192
PRESETS = {  # GPTConfig fields by name; the rest keep their defaults
    # the released checkpoints' shape: 32 x 1024, 32 heads, context 1024, V = 65,536, <pad> = 57,344
    "paper": dict(vocab_size=65536, block_size=1024, n_layer=32, n_head=32, n_embd=1024,
                  pad_token_id=57344),
    "mini": dict(vocab_size=MINI_VOCAB, block_size=128, n_layer=4, n_head=4, n_embd=128),
    "small": dict(vocab_size=SMALL_VOCAB, block_size=256, n_layer=6, n_head=6, n_embd=384),
    "tiny": dict(vocab_size=512, block_size=32, n_layer=2, n_head=2, n_embd=32),  # tests: ms a step
}


def get_config(preset: str, **overrides) -> GPTConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    return GPTConfig(**{**PRESETS[preset], **overrides})


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, base: float):
    """apply_rotary's tables, (T,) positions -> 2 x (T, head_dim): [cos, cos] and [-sin, sin], in
    float64 math (long positions stay accurate), for the precomputed table and positions past it."""
    even = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device)
    inv_freq = base ** -(even / head_dim)  # (head_dim/2,)
    angles = positions.double()[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    sin = angles.sin()
    return torch.cat([angles, angles], dim=-1).cos().float(), torch.cat([-sin, sin], dim=-1).float()


def apply_rotary(x, cos, sin):
    """Rotary position embedding, rotate-half (GPT-NeoX/Llama): a head's halves pair up as (x1[i],
    x2[i]), each pair turned by position * rope_base^(-2i/D), so q.k depends only on how far apart
    two positions are: [x1 cos - x2 sin, x2 cos + x1 sin] = x * [cos, cos] + [x2, x1] * [-sin, sin]
    (roll swaps the halves), in x's dtype (autocast's q, k stay bf16). x (.., T, D), cos (T, D)."""
    return torch.addcmul(x * cos.to(x.dtype), x.roll(x.shape[-1] // 2, -1), sin.to(x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, cache=None, layer=0):
        B, T, C = x.shape
        # (B, T, 3C) -> (B, T, 3, H, D) -> (3, B, H, T, D): q, k, v as views of one tensor
        qkv = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        qk = apply_rotary(qkv[:2], cos, sin)  # q and k in one go: fewer ops per decoded token
        q, k, v = qk[0], qk[1], qkv[2]
        # decoding: attend to the cached keys and values too (decode.KVCache)
        k, v, mask = cache.update(layer, k, v) if cache is not None else (k, v, None)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=T > 1)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), cos, sin, cache, layer)
        return x + self.mlp(self.ln_2(x))


class CrossEntropy(torch.autograd.Function):
    """F.cross_entropy(logits, targets, ignore_index=-1) in the logits' memory, not 3 more (N, V)
    buffers (a CPU step's slowest part): exp(row - max) in place, then the gradient over it."""

    @staticmethod
    def forward(ctx, logits, targets):
        keep = targets != -1  # (N,)
        weight = keep / keep.sum()  # (N,) each position's share of the mean
        safe = targets.clamp(min=0)  # an ignored row reads column 0, at weight 0
        picked = logits.gather(1, safe[:, None]).squeeze(1)  # (N,) read before the logits change
        top = logits.amax(1, keepdim=True)  # (N, 1): exp never overflows below it
        e = logits.sub_(top).exp_()  # (N, V), in place
        total = e.sum(1)  # (N,)
        ctx.save_for_backward(e, total, safe, weight)
        return ((top.squeeze(1) + total.log() - picked) * weight).sum()

    @staticmethod
    def backward(ctx, grad_loss):
        e, total, safe, weight = ctx.saved_tensors
        scale = (grad_loss * weight)[:, None]  # (N, 1)
        grad = e.mul_(scale / total[:, None])  # softmax * scale, in place
        return grad.scatter_add_(1, safe[:, None], -scale), None  # minus onehot * scale


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        V = config.vocab_size
        d = config.n_embd
        if config.input == "binary":
            pad = config.pad_token_id
            self.embed = BinaryCodeInput(V, d, config.layout, pad, config.code_width)
        elif config.input == "affine":
            self.embed = AffineCodeInput(V, d, config.layout, config.affine_seed)
        else:  # given its (undrawn) weight, nn.Embedding draws nothing here: its init comes below
            frozen = config.input != "learned"  # the controls: Gaussian tables, never trained
            self.embed = nn.Embedding(V, d, _weight=torch.empty(V, d), _freeze=frozen)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(d, bias=config.bias)
        self.lm_head = nn.Linear(d, V, bias=False)
        # the tables are the config's, built on the CPU even for a model built on the meta device
        # to take a checkpoint's weights: no arithmetic there (torch's meta kernels import dynamo)
        positions = torch.arange(config.block_size, device="cpu")
        cos, sin = rotary_cos_sin(positions, d // config.n_head, config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)  # from the config: never saved
        self.register_buffer("rope_sin", sin, persistent=False)
        if self.lm_head.weight.is_meta:  # shapes only, or weights to follow: nothing to draw
            return
        # one seed, one decoder for every input: only the body draws from the global generator
        body = [(n, p) for n, p in self.named_parameters() if not n.startswith("embed.")]
        for name, p in body:
            if p.dim() == 2:  # the Linear layers' weights
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for name, p in body:
            if name.endswith("proj.weight"):  # residual projections: variance flat in depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if config.input in TABLES:
            own = torch.Generator().manual_seed(torch.initial_seed())
            # random: std sqrt(1/2), a random bit's RMS (the code's scale); frozen: learned's init
            std = 0.5**0.5 if config.input == "random" else 0.02
            nn.init.normal_(self.embed.weight, 0.0, std, generator=own)

    def forward(self, idx, targets=None, cache=None):
        """idx (B, T) token ids -> (logits (B, T, V), loss); with a cache the last position's
        logits alone; training (targets, gradients on): no logits (CrossEntropy). Ids are not
        checked here (two host syncs a step): train.py checks shards, decode.check_ids prompts."""
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        cos, sin = cache.advance(T) if cache is not None else (self.rope_cos[:T], self.rope_sin[:T])
        x = self.embed(idx)  # (B, T, n_embd)
        for layer, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache, layer)
        if cache is not None:
            x = x[:, -1:]
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        flat = logits.float().flatten(0, 1)  # (B, T, V) -> (B*T, V): one row a position
        if torch.is_grad_enabled():  # training: the logits' memory becomes their gradient
            return None, CrossEntropy.apply(flat, targets.view(-1))
        return logits, F.cross_entropy(flat, targets.view(-1), ignore_index=-1)

    def get_input_embeddings(self):  # the Hugging Face name: its .weight is the code table
        return self.embed

    def num_params(self):
        """The paper's three columns: trainable, frozen stored values (code tables, A, b), input."""
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        stored = self.state_dict(keep_vars=True).values()  # parameters and buffers
        frozen = sum(t.numel() for t in stored if not t.requires_grad)
        embed = sum(p.numel() for p in self.embed.parameters() if p.requires_grad)
        return {"trainable": trainable, "frozen": frozen, "input": embed}

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token: 6 a matmul weight (forward + backward) plus attention's
        12 * n_layer * T * n_embd, causal mask ignored (as PaLM, nanoGPT); an input is a gather."""
        c = self.config
        T = seq_len or c.block_size
        weights = self.named_parameters()
        matmul = sum(p.numel() for n, p in weights if p.dim() == 2 and not n.startswith("embed"))
        return 6 * matmul + 12 * c.n_layer * T * c.n_embd

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW; weight decay on matrices only (not biases and norm gains); fused on CUDA."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        fused = device_type == "cuda" or None
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)


def gf2_rank(matrix: torch.Tensor) -> int:
    """Rank over GF(2) of a 0/1 matrix: its rows as integers, reduced by XOR to an echelon basis."""
    basis = []  # nonzero rows with distinct leading bits, highest first
    for row in matrix.tolist():
        r = int("".join(str(int(b)) for b in row), 2)
        for b in basis:
            r = min(r, r ^ b)  # clears b's leading bit where r has it
        if r:
            basis = sorted(basis + [r], reverse=True)
    return len(basis)


class AffineCodeInput(nn.Module):
    """Table-free: c'(t) = A c(t) XOR b over GF(2), lifted like the plain code. A invertible (so
    injective) with rows of odd weight, b all 0s or all 1s: the constant codes stay on ids 0 and
    2^K - 1 (the rule above BinaryCodeInput). Stored: a checkpoint keeps the A and b it had."""

    def __init__(self, vocab_size, n_embd, layout="tile", seed=0):
        super().__init__()
        bits = code_bits(vocab_size)
        gen = torch.Generator("cpu").manual_seed(seed)  # CPU: A and b are the same on any device
        while True:  # an odd-row-weight A is invertible with probability ~0.29: few draws
            A = torch.randint(0, 2, (bits, bits), generator=gen, device="cpu")
            A[:, -1] = (A[:, :-1].sum(1) + 1) % 2  # each row's weight odd: A 1 = 1
            if gf2_rank(A) == bits:
                break
        b = torch.randint(0, 2, (1,), generator=gen, device="cpu").repeat(bits)  # all 0s or all 1s
        self.bits = bits
        self.register_buffer("A", A.float())
        self.register_buffer("b", b.float())
        self.register_buffer("lift", lift_index(n_embd, bits, layout), persistent=False)

    def code(self, idx):
        c = binary_code(idx, self.bits).to(self.A.dtype)  # (B, T, K), in the model's dtype
        # c @ A^T counts the ones each bit XORs (at most K + 1: exact even in bfloat16); mod 2: XOR
        return (c @ self.A.T + self.b) % 2

    def forward(self, idx):
        return self.code(idx).index_select(-1, self.lift)  # (B, T, K) -> (B, T, n_embd)


def check_config(c):
    """A shape that cannot work is a clear ValueError when a GPTConfig is made, not in a layer."""
    for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        if not (isinstance(getattr(c, name), int) and getattr(c, name) > 0):
            raise ValueError(f"{name} must be a positive integer, got {getattr(c, name)!r}")
    if c.n_embd % c.n_head:
        raise ValueError(f"n_embd ({c.n_embd}) must be divisible by n_head ({c.n_head})")
    if (c.n_embd // c.n_head) % 2:
        raise ValueError(f"head size n_embd/n_head = {c.n_embd // c.n_head} must be even (rotary)")
    if c.input not in ("binary", "affine", *TABLES):
        raise ValueError(f"unknown input {c.input!r}: choose binary, affine, {', '.join(TABLES)}")
    if c.layout not in ("tile", "interleave"):
        raise ValueError(f"unknown layout {c.layout!r}: choose tile or interleave")
    if c.input in ("binary", "affine") and c.n_embd < c.code_bits:
        raise ValueError(f"n_embd ({c.n_embd}) is smaller than the {c.code_bits} code bits of "
                         f"vocab_size {c.vocab_size}: some tokens would share an input")
    K = code_bits(c.vocab_size)
    width_ok = c.input == "binary" and type(c.code_width) is int and K <= c.code_width <= 2 * K
    if c.code_width and not width_ok:
        raise ValueError(f"code_width {c.code_width!r}: only the binary input takes one, "
                         f"from K = {K} to 2K = {2 * K}")
    if c.pad_token_id is not None and not 0 <= c.pad_token_id < c.vocab_size:
        raise ValueError(f"pad_token_id {c.pad_token_id} is outside [0, {c.vocab_size})")
    if not 0.0 <= c.dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {c.dropout}")
    if not (type(c.rope_base) in (int, float) and math.isfinite(c.rope_base) and c.rope_base > 1):
        raise ValueError("rope_base must be a number > 1 (the rotary base, 10000 in most models), "
                         f"got {c.rope_base!r}")


def constant_input_ids(model) -> list[int]:
    """The ids a bias-free binary or affine model reads as a constant vector (the rule above
    BinaryCodeInput); none for a table or with biases (a norm's bias makes the stream vary)."""
    c = model.config
    if c.bias or c.input in TABLES:
        return []
    codes = model.embed.code(torch.arange(c.vocab_size, device=model.embed.lift.device))  # (V, K)
    return (codes == codes[:, :1]).all(-1).nonzero().flatten().tolist()


if __name__ == "__main__":  # python model.py --preset paper: the paper's parameter table, computed
    about = "Print the parameter accounting of a preset's three input variants (the paper's)."
    parser = argparse.ArgumentParser(description=about)
    parser.add_argument("--preset", default="paper", choices=list(PRESETS), help="(default: paper)")
    args = parser.parse_args()
    print("| input | trainable params | input-interface params | frozen stored values |")
    print("|---|---:|---:|---:|")
    for variant in ("learned", "binary", "affine"):
        with torch.device("meta"):  # shapes only: the paper preset costs no memory
            n = GPT(get_config(args.preset, input=variant)).num_params()
        print(f"| {variant} | {n['trainable']:,} | {n['input']:,} | {n['frozen']:,} |")
