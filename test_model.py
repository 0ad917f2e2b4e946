"""Tests of model.py: the exact codes, the audit of the released checkpoint, the loss.
The affine code: tests/test_model_affine.py; generation with the KV cache: tests/test_decode.py; a model
built on the meta device and loaded: tests/test_checkpoint.py."""

import contextlib
import io
import os
from pathlib import Path

import pytest
import torch

from model import (
    GPT,
    AffineCodeInput,
    BinaryCodeInput,
    GPTConfig,
    apply_rotary,
    code_bits,
    constant_input_ids,
    get_config,
    lift_index,
    rotary_cos_sin,
)

PAPER_V, PAPER_K, PAPER_PAD = 65536, 16, 57344


def bits_by_string(t, k):
    """An independent reference: Python's binary formatting, reversed to least significant bit first."""
    return [int(c) for c in reversed(format(t, f"0{k}b"))]


def tiny(**overrides):
    torch.manual_seed(0)
    return GPT(get_config("tiny", **overrides)).eval()


# ----- the code itself ---------------------------------------------------------------------------


@pytest.mark.parametrize("V, K", [(2, 1), (3, 2), (256, 8), (257, 9), (8192, 13), (50257, 16), (65536, 16)])
def test_code_bits(V, K):
    assert code_bits(V) == K == (V - 1).bit_length()


def test_code_table_exact_on_all_rows():
    table = BinaryCodeInput(PAPER_V, 1024, pad_token_id=PAPER_PAD).weight
    assert table.shape == (PAPER_V, PAPER_K) and table.dtype == torch.float32
    ids = torch.arange(PAPER_V)
    # arithmetic reference, independent of shifts: bit i = floor(t / 2^i) mod 2
    expected = torch.stack([(ids // 2**i) % 2 for i in range(PAPER_K)], dim=1).float()
    expected[PAPER_PAD] = 0
    assert torch.equal(table, expected)
    for t in (0, 1, 2, 1234, 40000, 57343, 65535):
        assert table[t].int().tolist() == bits_by_string(t, PAPER_K)
    assert table[PAPER_PAD].sum() == 0
    assert BinaryCodeInput(PAPER_V, 16).weight[PAPER_PAD].sum() == 3  # 57344 = 2^15+2^14+2^13


def test_worked_example_of_the_docstring():
    embed = BinaryCodeInput(PAPER_V, 1024)
    code = [0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0]
    assert bits_by_string(1234, 16) == code
    x = embed(torch.tensor([[1234]]))[0, 0]
    assert x.shape == (1024,) and x.tolist() == code * 64
    x = BinaryCodeInput(PAPER_V, 1024, layout="interleave")(torch.tensor([[1234]]))[0, 0]
    assert x.tolist() == [float(b) for b in code for _ in range(64)]


@pytest.mark.parametrize("n_embd, K", [(1024, 16), (100, 13), (16, 16), (40, 16), (32, 9)])
def test_layouts(n_embd, K):
    V = 2**K
    ids = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(1))
    code = BinaryCodeInput(V, n_embd).weight[ids]  # (3, 5, K)
    tile = BinaryCodeInput(V, n_embd, layout="tile")(ids)
    inter = BinaryCodeInput(V, n_embd, layout="interleave")(ids)
    assert tile.shape == inter.shape == (3, 5, n_embd)
    for j in range(n_embd):
        assert torch.equal(tile[..., j], code[..., j % K])  # the last copy is cut short
        assert torch.equal(inter[..., j], code[..., j * K // n_embd])  # bit k: dims [k n_embd/K, (k+1) n_embd/K)
    widths = torch.bincount(lift_index(n_embd, K, "interleave"), minlength=K)
    assert widths.min() == n_embd // K and widths.max() == -(-n_embd // K)  # every bit kept, evenly
    if n_embd % K == 0:  # the release's repeat_interleave; both layouts carry each bit equally often
        assert torch.equal(inter, code.repeat_interleave(n_embd // K, dim=-1))
        assert torch.equal(tile.sort(dim=-1).values, inter.sort(dim=-1).values)


@pytest.mark.parametrize("layout", ["tile", "interleave"])
@pytest.mark.parametrize("input", ["binary", "affine"])
def test_every_accepted_config_gives_every_token_its_own_input(input, layout):
    """Issue 9: interleave with r = ceil(n_embd/K) dropped the last bits (V=512, n_embd=64: 256 inputs)."""
    for V in (2, 3, 100, 512, 513, 4096):
        for n_embd in (*range(2, 20, 2), 24, 32, 36, 40, 48, 64):
            try:
                cfg = GPTConfig(vocab_size=V, n_embd=n_embd, n_head=1, n_layer=1, block_size=4, input=input,
                                layout=layout)
            except ValueError as e:
                assert n_embd < code_bits(V) and "some tokens would share an input" in str(e)
                continue
            embed = BinaryCodeInput(V, n_embd, layout) if input == "binary" else AffineCodeInput(V, n_embd, layout)
            inputs = embed(torch.arange(V)[None])[0]  # (V, n_embd)
            assert inputs.unique(dim=0).shape[0] == V, (V, n_embd, cfg.layout)


def test_pad_row_is_the_only_shared_input():
    embed = BinaryCodeInput(512, 32, "interleave", pad_token_id=7)
    inputs = embed(torch.arange(512)[None])[0]
    assert inputs.unique(dim=0).shape[0] == 511 and torch.equal(inputs[7], inputs[0])  # both all zeros, as released


def test_a_wider_code_appends_parity_bits_and_stays_injective():
    """code_width W > K (the width study): bits K.. are bit j XOR bit j+1 mod K of the plain code."""
    embed = BinaryCodeInput(1024, 128, width=16)  # K = 10
    assert embed.weight.shape == (1024, 16) and embed.lift.max() == 15
    t = 0b1100100101  # 805
    bits = [(t >> i) & 1 for i in range(10)]
    assert embed.weight[t].tolist() == bits + [bits[j] ^ bits[(j + 1) % 10] for j in range(6)]
    assert embed(torch.arange(1024)[None])[0].unique(dim=0).shape[0] == 1024
    model = tiny(vocab_size=1024, n_embd=32, code_width=16)
    assert model.config.code_bits == 16 and constant_input_ids(model) == [0]  # all ones gets parity zeros
    assert tiny().config.code_bits == 9 and tiny(code_width=9).embed.weight.shape == (512, 9)


@pytest.mark.parametrize("config", [dict(code_width=8), dict(code_width=19), dict(code_width=12, input="learned"),
                                    dict(code_width=12, input="affine"), dict(code_width=12.0)])
def test_a_code_width_the_model_cannot_use_is_refused(config):
    with pytest.raises(ValueError, match="code_width"):
        tiny(**config)


def test_binary_input_has_no_parameters():
    model = tiny()
    assert list(model.embed.parameters()) == []
    assert "embed.weight" in model.state_dict()  # stored, like the release's frozen nn.Embedding


@pytest.mark.parametrize("seed", [0, 7])
def test_one_seed_gives_every_input_the_same_decoder_and_head(seed):
    """Paired inits: only the input interface differs between the inputs of one seed."""
    body = {}
    for variant in ("learned", "binary", "affine", "random", "frozen"):
        torch.manual_seed(seed)
        state = GPT(get_config("tiny", input=variant)).state_dict()
        body[variant] = {k: t for k, t in state.items() if not k.startswith("embed.")}
    assert len(body["learned"]) == len(body["binary"]) > 0
    for variant in ("binary", "affine", "random", "frozen"):
        assert all(torch.equal(body[variant][k], t) for k, t in body["learned"].items()), variant
    torch.manual_seed(seed + 1)  # and another seed draws another decoder
    other = GPT(get_config("tiny", input="learned")).state_dict()
    assert not torch.equal(other["lm_head.weight"], body["learned"]["lm_head.weight"])


def test_random_input_is_a_frozen_gaussian_table_drawn_from_the_seed():
    model = tiny(input="random")
    table = model.state_dict()["embed.weight"]  # stored, so a checkpoint carries it
    assert not any(p.requires_grad for p in model.embed.parameters()) and model.num_params()["input"] == 0
    optimized = {id(p) for g in model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
                 for p in g["params"]}
    assert id(model.embed.weight) not in optimized  # AdamW never sees it (weight decay included)
    assert model.num_params()["frozen"] == 512 * 32
    assert abs(table.std().item() - 0.5 ** 0.5) < 0.02 and abs(table.mean().item()) < 0.02
    assert torch.equal(tiny(input="random").embed.weight, table)  # the same seed, the same table
    idx = torch.tensor([[3, 5]])
    assert torch.equal(model.embed(idx), table[idx])
    model.train()
    model(idx, idx)[1].backward()
    assert model.embed.weight.grad is None  # never trained


def test_frozen_input_is_the_learned_tables_init_never_trained():
    """The control that separates learning from scale: learned vs frozen differ only in training the table."""
    model, learned = tiny(input="frozen"), tiny(input="learned")
    assert torch.equal(model.embed.weight, learned.embed.weight)  # the same rows, std 0.02
    assert not model.embed.weight.requires_grad and model.num_params()["input"] == 0
    assert model.num_params()["trainable"] == learned.num_params()["trainable"] - 512 * 32


def test_model_card_audit_runs_unchanged():
    """Everything after the card's loading lines, verbatim, on a binary model of the paper's
    vocabulary and <pad> (a decoder of 1 x 32: the paper preset's code table, a few MB)."""
    model = GPT(get_config("paper", n_layer=1, n_head=2, n_embd=32))
    audit = '''
embedding = model.get_input_embeddings()
weight = embedding.weight.detach()

vocab_size, code_bits = weight.shape
ids = torch.arange(vocab_size, dtype=torch.long)
positions = torch.arange(code_bits, dtype=torch.long)

expected = ((ids[:, None] >> positions[None, :]) & 1).float()
expected[model.config.pad_token_id].zero_()

print("shape:", tuple(weight.shape))
print("unique values:", torch.unique(weight).tolist())
print("all entries binary:", bool(torch.all((weight == 0) | (weight == 1))))
print("exact canonical-code match:", bool(torch.equal(weight, expected)))
print("mismatching entries:", int((weight != expected).sum().item()))

assert tuple(weight.shape) == (65536, 16)
assert torch.all((weight == 0) | (weight == 1))
assert torch.equal(weight, expected)
'''
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(audit, {"torch": torch, "model": model})
    assert out.getvalue() == (
        "shape: (65536, 16)\n"
        "unique values: [0.0, 1.0]\n"
        "all entries binary: True\n"
        "exact canonical-code match: True\n"
        "mismatching entries: 0\n"
    )


# ----- constant inputs: the rule above BinaryCodeInput ------------------------------------------------
SHARED = Path(__file__).resolve().parent.parent / "shared"
if (SHARED / "tiktoken-cache").is_dir():  # offline: the checked-in BPE files unless CI already chose
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken-cache"))
UTF8_NEVER = {0xC0, 0xC1, *range(0xF5, 0x100)}  # bytes no UTF-8 text contains


@pytest.mark.parametrize("config, want", [
    (dict(input="binary"), [0, 511]), (dict(input="binary", vocab_size=500), [0]),
    (dict(input="binary", pad_token_id=7, layout="interleave"), [0, 7, 511]),
    (dict(input="affine", affine_seed=3), [0, 511]),
    (dict(input="binary", bias=True), []), (dict(input="affine", bias=True), []), (dict(input="learned"), [])])
def test_constant_input_ids(config, want):
    """The ids a bias-free binary or affine model reads as a constant vector (as the decoder reads them:
    the lifted input); none for a learned table or a model with biases."""
    model = tiny(**config)
    assert constant_input_ids(model) == want
    if want:
        lifted = model.embed(torch.arange(model.config.vocab_size))
        assert (lifted == lifted[:, :1]).all(1).nonzero().flatten().tolist() == want


@pytest.mark.parametrize("encoding, vocab_size", [("gpt2", 512), ("gpt2", 8192), ("gpt2", None), ("cl100k_base", 512),
                                                  ("cl100k_base", 8192), ("cl100k_base", 65536), ("cl100k_base", None)])
def test_no_token_text_can_produce_enters_the_model_as_a_constant_vector(encoding, vocab_size):
    """The rule, by enumeration: every id of every tokenizer prepare_data.py builds by default, through
    the binary input (both layouts) and the affine input (several seeds, both layouts), read as the
    decoder reads it (the lifted vector): an id whose input is constant is a byte UTF-8 text never holds,
    NUL, or past the tokenizer; end-of-text never is."""
    from bincode_gpt.tokenizer import get_tokenizer
    enc = get_tokenizer(encoding, vocab_size, reserve_zero=True, reserve_ones=True)
    V, K = enc.n_vocab, code_bits(enc.n_vocab)
    ids = torch.arange(V)
    n_embd = 2 * K + 1  # not a multiple of K: the tile's last copy is cut short
    inputs = [BinaryCodeInput(V, n_embd, layout) for layout in ("tile", "interleave")]
    inputs += [AffineCodeInput(V, n_embd, layout, seed) for seed in range(4) for layout in ("tile", "interleave")]
    text_free = UTF8_NEVER | {0x00}
    for embed in inputs:
        lifted = embed(ids)
        constant = (lifted == lifted[:, :1]).all(1).nonzero().flatten().tolist()
        assert enc.eot_token not in constant
        for i in constant:
            token = enc.decode_single_token_bytes(i)
            assert len(token) == 1 and token[0] in text_free, (encoding, vocab_size, embed, i, token)
    assert enc.decode_single_token_bytes(0) == b"\x00"
    if 2**K == V:  # a power-of-two cut: the all-ones id is inside it, and 0xFF holds it
        assert enc.decode_single_token_bytes(V - 1) == b"\xff" and enc.eot_token == 187


# ----- the optimizer ------------------------------------------------------------------------------


def test_optimizer_groups():
    model = tiny(input="learned", bias=True)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert model.embed.weight in decay["params"]


# ----- forward and gradients -----------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["binary", "affine", "learned"])
@pytest.mark.parametrize("bias", [False, True])
def test_gradients_reach_every_trainable_parameter_and_never_the_code(variant, bias):
    model = tiny(input=variant, bias=bias).train()
    idx = torch.randint(0, 512, (2, 16))
    _, loss = model(idx, targets=torch.roll(idx, -1, 1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    if variant != "learned":
        assert sum(p.numel() for p in model.embed.parameters()) == 0


def test_loss_ignores_minus_one_and_starts_near_log_vocab():
    model = tiny()
    idx = torch.randint(0, 512, (4, 32))
    targets = idx.clone()
    _, full = model(idx, targets)
    assert abs(full.item() - torch.log(torch.tensor(512.0)).item()) < 0.5
    targets[:, 16:] = -1
    _, half = model(idx, targets)
    logits, _ = model(idx)
    expected = torch.nn.functional.cross_entropy(logits[:, :16].reshape(-1, 512), idx[:, :16].reshape(-1))
    assert torch.allclose(half, expected)


def cross_entropy_reference(model, idx, targets):
    """The loss of GPT.forward as F.cross_entropy computes it, from the logits of a forward without targets."""
    logits = model(idx)[0].float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)


def gradients(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("variant", ["binary", "learned"])
def test_the_training_loss_and_its_gradients_are_cross_entropys(variant, scale):
    """While training, GPT.forward's loss is model.CrossEntropy (its gradient written over the logits):
    the loss and every parameter's gradient equal F.cross_entropy's, targets of -1 ignored (a whole row of them
    too), and a scaled loss (grad_accum divides it) scales them."""
    model = tiny(input=variant).train()
    idx = torch.randint(0, 512, (4, 32))
    targets = torch.roll(idx, -1, 1)
    targets[:, :5] = -1
    targets[2] = -1
    logits, loss = model(idx, targets)
    assert logits is None  # their memory held the gradient
    ours = gradients(model, loss * scale)
    reference = cross_entropy_reference(model, idx, targets)
    theirs = gradients(model, reference * scale)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-8, msg=name)


def test_the_training_loss_under_bfloat16_autocast_is_cross_entropys():
    model = tiny().train()
    idx = torch.randint(0, 512, (4, 32))
    targets = torch.roll(idx, -1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx, targets)
        reference = cross_entropy_reference(model, idx, targets)
    ours, theirs = gradients(model, loss), gradients(model, reference)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)  # the same bfloat16 logits, in float32
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-3, atol=1e-6, msg=name)


def test_the_compiled_training_loss_and_gradients_are_the_eager_ones():
    """torch.compile traces CrossEntropy (an autograd.Function that writes over its input) into the same numbers.
    aot_eager: dynamo and AOT autograd, which take the function apart, without inductor's minute of C++ codegen
    (the GPU check's dry run trains with inductor)."""
    model = tiny().train()
    idx = torch.randint(0, 512, (2, 16))
    targets = torch.roll(idx, -1, 1)
    eager = model(idx, targets)[1]
    compiled = torch.compile(model, backend="aot_eager")(idx, targets)[1]
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=0)
    ours, theirs = gradients(model, compiled), gradients(model, eager)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-8, msg=name)


def test_the_loss_with_no_target_is_nan_as_cross_entropys():
    model = tiny().train()
    idx = torch.randint(0, 512, (2, 8))
    targets = torch.full_like(idx, -1)
    assert model(idx, targets)[1].isnan() and cross_entropy_reference(model, idx, targets).isnan()


def test_evaluation_returns_the_logits_beside_the_loss():
    """Without gradients (evaluation, sampling's callers) the logits are returned, and the loss is the training
    path's."""
    model = tiny()
    idx = torch.randint(0, 512, (2, 16))
    targets = torch.roll(idx, -1, 1)
    with torch.no_grad():
        logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, 512)
    torch.testing.assert_close(loss, model(idx, targets)[1].detach(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_apply_rotary_is_the_plain_rotation_of_the_two_halves(dtype, atol):
    """The model's three-op rotary (roll + addcmul) equals the rotation written out on the halves x1, x2 (to
    rounding: 1e-12 in float64, a float32 step in float32), which turns each pair (x1[i], x2[i]) by
    position * base^(-2i/D), computed here independently as a complex multiplication."""
    D, T = 16, 300
    cos, sin = rotary_cos_sin(torch.arange(T), D, 10000.0)
    x = torch.randn(2, 3, T, D, generator=torch.Generator().manual_seed(0)).to(dtype)
    fast = apply_rotary(x, cos.to(dtype), sin.to(dtype))
    c, s = cos[:, : D // 2].to(dtype), sin[:, D // 2 :].to(dtype)
    x1, x2 = x.chunk(2, dim=-1)
    plain = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    torch.testing.assert_close(fast, plain, rtol=0, atol=atol)
    inv_freq = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
    x1, x2 = x.double().chunk(2, dim=-1)
    turned = torch.complex(x1, x2) * torch.polar(torch.ones_like(angles), angles)
    # to the rounding of the float32 tables
    torch.testing.assert_close(plain.double(), torch.cat([turned.real, turned.imag], dim=-1), rtol=0, atol=2e-6)


def test_token_zero_at_a_window_start_keeps_a_zero_residual_stream():
    """Token id 0's code is all zeros. With no biases, a window that starts with it keeps an exactly zero
    residual stream at that position through every layer (attention there sees only itself, and
    LayerNorm(0) = 0), so its logits are all zero; and LayerNorm's gradient at a zero input is its gain
    times 1/sqrt(eps) (~316), at both norms of every block. The scaling study's 9-layer binary model
    diverged on this (its gradient at such a position grew ~1e5 per layer, to inf); a learned table
    gives token 0 a nonzero vector, so nothing of the kind."""
    model = tiny(bias=False)
    idx = torch.tensor([[0, 5, 7, 9]])
    first = []  # the residual stream at position 0 after each block
    for block in model.blocks:
        block.register_forward_hook(lambda m, inp, out: first.append(out[0, 0]))
    logits, _ = model(idx)
    assert len(first) == model.config.n_layer and all(torch.equal(x, torch.zeros_like(x)) for x in first)
    assert torch.equal(logits[0, 0], torch.zeros(model.config.vocab_size)) and logits[0, 1:].abs().min() > 0
    ln = model.blocks[0].ln_1
    x = torch.zeros(1, model.config.n_embd, requires_grad=True)
    g = torch.randn(1, model.config.n_embd)
    ln(x).backward(g)
    assert torch.allclose(x.grad, (g * ln.weight - (g * ln.weight).mean()) / (ln.eps ** 0.5), rtol=1e-4)
    learned = tiny(bias=False, input="learned")
    assert learned(idx)[0][0, 0].abs().max() > 0


# ----- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_embd": 30, "n_head": 4}, "divisible by n_head"),
        ({"n_layer": 0}, "n_layer must be a positive integer"),
        ({"vocab_size": -5}, "vocab_size must be a positive integer"),
        ({"block_size": 0}, "block_size must be a positive integer"),
        ({"n_embd": 24, "n_head": 8}, "must be even"),
        ({"input": "onehot"}, "unknown input 'onehot'"),
        ({"layout": "spiral"}, "unknown layout 'spiral'"),
        ({"pad_token_id": 512}, "pad_token_id 512 is outside"),
        ({"rope_base": 0.0}, r"rope_base must be a number > 1 \(the rotary base, 10000 in most models\), got 0.0"),
        ({"rope_base": -10000.0}, "rope_base must be a number > 1"),
        ({"rope_base": float("nan")}, "rope_base must be a number > 1"),
    ],
)
def test_bad_config_is_refused_clearly(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_config("tiny", **overrides)


def test_unknown_preset_and_too_long_sequence():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        get_config("huge")
    model = tiny()
    with pytest.raises(ValueError, match="exceeds block_size 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_presets_are_valid_configs():
    assert get_config("paper") == GPTConfig(
        vocab_size=65536, block_size=1024, n_layer=32, n_head=32, n_embd=1024, pad_token_id=57344
    )
    assert get_config("paper").code_bits == 16 and get_config("small").code_bits == 13
    assert torch.equal(lift_index(1024, 16, "interleave"), torch.arange(16).repeat_interleave(64))
