"""The affine, table-free input (model.AffineCodeInput): c' = A c XOR b over GF(2), A invertible
(gf2_rank), its constant codes kept on ids 0 and 2^K - 1, A and b stored with a checkpoint."""

import pytest
import torch

from bincode_gpt.checkpoint import checkpoint_dict, load_checkpoint
from model import AffineCodeInput, BinaryCodeInput, constant_input_ids, gf2_rank
from test_model import PAPER_K, PAPER_V, tiny


def pack(bits):
    """(N, K) 0/1 -> (N,) integers."""
    return (bits.long() << torch.arange(bits.shape[1])).sum(dim=1)


def test_affine_code_is_injective_on_all_ids():
    embed = AffineCodeInput(PAPER_V, PAPER_K, seed=0)  # n_embd = K, tile: the lifted vector IS the code
    codes = embed(torch.arange(PAPER_V)[None])[0]  # (V, K)
    assert set(codes.unique().tolist()) == {0.0, 1.0}
    assert pack(codes).unique().numel() == PAPER_V  # a bijection of the 65,536 codes
    # and it is the affine map it claims to be: c' = A c XOR b
    c = BinaryCodeInput(PAPER_V, PAPER_K).weight
    assert torch.equal(codes, ((c.long() @ embed.A.long().T + embed.b.long()) % 2).float())
    assert not torch.equal(codes, c)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_affine_code_is_exact_in_half_precision(dtype):
    """A model cast to bfloat16 or float16 (sample.py --dtype) recodes every id as float32 does."""
    embed = AffineCodeInput(PAPER_V, PAPER_K, seed=1)
    ids = torch.arange(PAPER_V)[None]
    assert torch.equal(embed.to(dtype)(ids).float(), AffineCodeInput(PAPER_V, PAPER_K, seed=1)(ids))
    logits, _ = tiny(input="affine").to(dtype)(torch.randint(0, 512, (2, 8)))
    assert logits.dtype == dtype and logits.isfinite().all()


@pytest.mark.parametrize("seed", range(5))
def test_affine_matrix_is_invertible_over_gf2(seed):
    A = AffineCodeInput(PAPER_V, 64, seed=seed).A
    assert A.shape == (PAPER_K, PAPER_K)
    assert gf2_rank(A) == PAPER_K
    assert round(torch.linalg.det(A.double()).item()) % 2 == 1  # det over Z is odd <=> invertible mod 2


def test_gf2_rank():
    assert gf2_rank(torch.eye(4)) == 4
    assert gf2_rank(torch.tensor([[1, 1], [1, 1]])) == 1
    assert gf2_rank(torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 1]])) == 2  # rows sum to 0 mod 2, det 2 over R


def test_affine_stores_nothing_vocab_sized_and_follows_its_seed():
    a, b, c = (AffineCodeInput(PAPER_V, 1024, seed=s) for s in (0, 0, 1))
    assert all(t.numel() <= PAPER_K * PAPER_K for t in a.state_dict().values())
    assert torch.equal(a.A, b.A) and torch.equal(a.b, b.b)
    assert not (torch.equal(a.A, c.A) and torch.equal(a.b, c.b))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("K", [9, 13, 16, 17])
def test_affine_keeps_its_constant_codes_on_ids_0_and_all_ones(K, seed):
    """c' = A c XOR b is constant at c = A^-1 b and A^-1 (b XOR 1): with every row of A of odd weight
    and b all zeros or all ones, those are ids 0 and 2^K - 1, whatever the seed."""
    embed = AffineCodeInput(2**K, K, seed=seed)
    assert set(embed.A.sum(1).remainder(2).tolist()) == {1.0} and embed.b.unique().numel() == 1
    codes = embed(torch.arange(2**K))  # n_embd = K, tile: the lifted vector is the code
    assert pack(codes).unique().numel() == 2**K  # still a bijection
    assert (codes == codes[:, :1]).all(1).nonzero().flatten().tolist() == [0, 2**K - 1]


def test_an_affine_checkpoint_keeps_the_A_and_b_it_was_drawn_with(tmp_path):
    """A and b are stored: a checkpoint drawn before the constant codes were kept on 0 and 2^K - 1 loads
    its own A and b, not today's draw for its seed."""
    model = tiny(input="affine")
    old_A = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0, 0]] + [[0] * i + [1] + [0] * (8 - i) for i in range(1, 9)]).float()
    model.embed.A.copy_(old_A)  # an even-weight row: not today's kind of draw
    model.embed.b.copy_(torch.tensor([1, 0, 1, 0, 0, 0, 0, 0, 1]).float())
    torch.save(checkpoint_dict(model, None), tmp_path / "ckpt.pt")
    loaded, _ = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert torch.equal(loaded.embed.A, old_A) and torch.equal(loaded.embed.b, model.embed.b)
    assert constant_input_ids(loaded) == constant_input_ids(model) != [0, 511]
