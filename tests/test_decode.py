"""bincode_gpt/decode.py: the KV cache against recomputing the sequence, its size classes and dtype, the compiled
and CUDA-graph steps, sampling (greedy, seeded, top-k, top-p, end-of-text), and the ids a prompt may hold."""

import pytest
import torch

from bincode_gpt import decode
from bincode_gpt.decode import Decoder, KVCache, check_ids, generate, sample_next, size_class
from test_model import tiny


def naive_step_logits(model, seq):
    """The reference: recompute the whole (cropped) sequence at every step, no cache."""
    return model(seq[:, -model.config.block_size :])[0][:, -1, :]


@pytest.mark.parametrize("variant", ["binary", "affine", "learned"])
def test_kv_cache_matches_recomputing_the_sequence(variant):
    model = tiny(input=variant)
    prompt = torch.randint(0, 512, (3, 7))
    steps = model.config.block_size - 7  # fill the context exactly
    cached = generate(model, prompt, steps, temperature=0)
    seq = prompt
    for _ in range(steps):
        seq = torch.cat([seq, naive_step_logits(model, seq).argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, seq)
    # and the logits, step by step, to float tolerance
    cache = KVCache(model.config, 3, cached.shape[1], "cpu", torch.float32)
    step_logits = model(prompt, cache=cache)[0][:, -1]
    for t in range(7, cached.shape[1]):
        assert torch.allclose(step_logits, naive_step_logits(model, cached[:, :t]), atol=1e-5, rtol=0)
        step_logits = model(cached[:, t : t + 1], cache=cache)[0][:, -1]


def test_generation_continues_past_block_size():
    model = tiny()
    block = model.config.block_size
    prompt = torch.randint(0, 512, (2, block + 5))  # longer than the context: cropped
    out = generate(model, prompt, 3 * block, temperature=0)
    assert out.shape == (2, block + 5 + 3 * block)
    assert torch.equal(out[:, : block + 5], prompt)
    # the first new token comes from the cropped prompt, exactly as a full recompute would
    assert torch.equal(out[:, block + 5], naive_step_logits(model, prompt).argmax(-1))


def test_kv_cache_holds_the_size_class_of_the_positions_a_generation_reaches():
    """A cache of the positions' size class (the next power of two, at least 64), at most block_size slots:
    memory for what is generated, not for the whole context; its rotary tables reach the class."""
    assert [size_class(n) for n in (1, 10, 64, 65, 128, 1000, 1024, 1025)] == [64, 64, 64, 128, 128, 1024, 1024, 2048]
    config = tiny(block_size=256).config
    slots = lambda positions: KVCache(config, 2, positions, "cpu", torch.float32).k[0].shape
    assert slots(7 + 3) == (2, config.n_head, 64, config.n_embd // config.n_head)  # a 7-token prompt, 3 new tokens
    assert [slots(n)[2] for n in (64, 65, 200, 256)] == [64, 128, 256, 256]
    long = KVCache(config, 2, 5 * config.block_size, "cpu", torch.float32)  # a ring of block_size slots
    assert long.k[0].shape[2] == config.block_size and long.cos.shape[0] == 2048
    assert len(long.k) == len(long.v) == config.n_layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kv_cache_follows_the_model_dtype(dtype):
    """Half-precision weights: the cache (keys, values, rotary tables) is in that dtype too, and the
    cached greedy tokens are those of recomputing the sequence in that dtype."""
    model = tiny().to(dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(50)
    prompt = torch.randint(0, 512, (2, 5))
    cached = generate(model, prompt, 8, temperature=0)
    seq = prompt
    for _ in range(8):
        seq = torch.cat([seq, naive_step_logits(model, seq).argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, seq)
    cache = KVCache(model.config, 2, 13, "cpu", dtype)
    assert {t.dtype for t in (*cache.k, *cache.v, cache.cos, cache.sin)} == {dtype}


def compiles(fn):
    """fn()'s result and how many graphs torch.compile made while it ran."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    out = fn()
    return out, counters["stats"]["unique_graphs"] - before


def test_compiled_step_compiles_once_per_size_class_and_gives_the_eager_tokens():
    """torch.compile of the one-token step, kept by a Decoder: fixed shapes per cache size class, so another
    prompt length and output length of the class compile nothing new, one of another class compiles once; past
    block_size too, where the ring wraps. The tokens are the eager ones exactly."""
    model = tiny(n_layer=1)  # a shape no other test compiles: its first generation compiles
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # peaked logits: no near-ties a fused kernel's rounding could flip
    block, counted, decoder = model.config.block_size, [], Decoder(model, compile=True)
    for T, n in [(7, 5), (3, 20), (7, 2 * block), (5, 40)]:  # classes 64, 64, 128 (the ring wraps), 64
        prompt = torch.randint(0, 512, (2, T))
        compiled, new = compiles(lambda: decoder.generate(prompt, n, temperature=0))
        assert torch.equal(compiled, generate(model, prompt, n, temperature=0)), (T, n)
        counted.append(new)
    assert counted == [1, 0, 1, 0]
    # kept outside the model: the same modules, state dict keys and attributes as a model never compiled
    assert [n for n, _ in model.named_modules()] == [n for n, _ in tiny(n_layer=1).named_modules()]
    assert model.state_dict().keys() == tiny(n_layer=1).state_dict().keys()
    assert vars(model).keys() - vars(tiny(n_layer=1)).keys() == {"_is_torch_compile"}  # torch.compile's own mark


def test_a_generation_updates_its_cache_in_place():
    """Static addresses, as CUDA graphs need them: stepping never reassigns a cache tensor nor moves its memory."""
    model = tiny()
    cache = KVCache(model.config, 2, 20, "cpu", torch.float32)
    where = [(id(t), t.data_ptr()) for t in cache.tensors()]
    x = torch.randint(0, 512, (2, 5))
    for _ in range(4):
        x = model(x, cache=cache)[0][:, -1:].argmax(-1)
    assert [(id(t), t.data_ptr()) for t in cache.tensors()] == where and int(cache.pos) == 8 and int(cache.slot) == 7
    assert sorted(vars(cache)) == ["cos", "k", "pos", "reach", "sin", "size", "slot", "v", "written"]


def test_cuda_graphs_are_refused_on_a_cpu_and_without_compile():
    model, prompt = tiny(), torch.randint(0, 512, (1, 3))
    with pytest.raises(ValueError, match=r"^--cuda_graphs needs a CUDA device .* this run is on cpu"):
        generate(model, prompt, 2, compile=True, cuda_graphs=True)
    with pytest.raises(ValueError, match=r"^--cuda_graphs records the compiled one-token step .*: add --compile$"):
        generate(model, prompt, 2, cuda_graphs=True)


def test_the_cuda_graph_path_keeps_one_static_cache(monkeypatch):
    """What cuda_graphs=True does besides recording (which inductor skips for CPU tensors, so the refusal is
    lifted here): the step compiled with mode="reduce-overhead"'s options over one cache per decoder, marked as
    static addresses and reused by each generation of its size class (a recorded graph replays on the same
    addresses), replaced for another class; the same tokens as eager, and one compile for the class."""
    monkeypatch.setattr(decode, "check_cuda_graphs", lambda *a: None)
    model = tiny(n_layer=1, n_head=1)  # a shape of its own, as above
    with torch.no_grad():
        model.lm_head.weight.mul_(50)
    caches, counted, decoder = [], [], Decoder(model, compile=True, cuda_graphs=True)
    for T, n in [(7, 5), (3, 20), (4, 70)]:  # classes 64, 64, 128
        prompt = torch.randint(0, 512, (2, T))
        out, new = compiles(lambda: decoder.generate(prompt, n, temperature=0))
        assert torch.equal(out, generate(model, prompt, n, temperature=0)), (T, n)
        caches.append((decoder.cache, [t.data_ptr() for t in decoder.cache.tensors()]))
        counted.append(new)
        assert {getattr(t, "_dynamo_static_input_type", None) for t in decoder.cache.tensors()} == {"unguarded"}
    assert counted == [1, 0, 1]
    assert caches[0][0] is caches[1][0] and caches[0][1] == caches[1][1] and caches[2][0] is not caches[0][0]
    # the model holds none of it, only torch.compile's own mark
    assert vars(model).keys() - vars(tiny(n_layer=1, n_head=1)).keys() == {"_is_torch_compile"}


def test_greedy_and_seeded_sampling_are_deterministic():
    model = tiny()
    prompt = torch.randint(0, 512, (2, 5))
    assert torch.equal(generate(model, prompt, 20, temperature=0), generate(model, prompt, 20, temperature=0))

    def sample(seed, **kw):
        return generate(model, prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))
    greedy = generate(model, prompt, 20, temperature=0)
    assert torch.equal(sample(3, top_k=1), greedy)
    assert torch.equal(sample(4, top_p=1e-6), greedy)  # the nucleus keeps only the top token


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, 1.0, top_k=2, generator=gen).item() for _ in range(200)}
    assert draws == {0, 1}
    draws = {sample_next(logits, 1.0, top_p=0.9, generator=gen).item() for _ in range(300)}
    assert draws == {0, 1, 2}  # 0.5 + 0.3 < 0.9, so the third token is needed; the fourth is not


def test_eos_stops_a_sequence():
    model = tiny()
    prompt = torch.randint(0, 512, (1, 5))
    first = generate(model, prompt, 1, temperature=0)[0, -1].item()
    out = generate(model, prompt, 10, temperature=0, eos_token_id=first)
    assert out.shape == (1, 6) and out[0, -1] == first


@pytest.mark.parametrize("bad_id", [-1, 512, 10**6])
def test_out_of_range_ids_name_the_id_and_the_vocabulary(bad_id):
    """Checked where ids enter (a prompt), not in forward: that is the training hot path."""
    model = tiny(input="affine")  # the affine code would silently alias an id past V
    idx = torch.zeros(1, 4, dtype=torch.long)
    idx[0, 2] = bad_id
    with pytest.raises(ValueError, match=rf"token id {bad_id} .*\[0, 512\)"):
        generate(model, idx, 1)
    with pytest.raises(ValueError, match=rf"token id {bad_id} .*\[0, 512\)"):
        check_ids(idx, 512)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, idx[:, :0], 1)
