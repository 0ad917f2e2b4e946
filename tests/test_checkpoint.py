"""bincode_gpt/checkpoint.py's loading, and the meta-device build it rests on. A GPT built on the
meta device (weights as shapes only: no memory, nothing drawn; the config's tables built on the CPU):
the counts model.py and the tools take from it, and checkpoint loading (checkpoint.model_from_weights),
which builds there and assigns the file's weights. A training run's shape rule's refusals: an override
against the checkpoint's shape, a <pad> row on a token (checkpoint.model_config's)."""

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bincode_gpt import checkpoint
from bincode_gpt.checkpoint import checkpoint_dict, load_checkpoint, model_from_weights
from bincode_gpt.decode import generate
from model import AffineCodeInput, GPT, GPTConfig, canonical_code, get_config, lift_index, rotary_cos_sin
from test_model import PAPER_K, PAPER_PAD, PAPER_V, tiny

INPUTS = ("binary", "affine", "learned", "random", "frozen")


# ----- counting on the meta device ---------------------------------------------------------------


def paper_counts(variant):
    with torch.device("meta"):
        return GPT(get_config("paper", input=variant)).num_params()


def test_paper_preset_parameter_counts():
    binary, affine, learned = (paper_counts(v) for v in ("binary", "affine", "learned"))
    d, L, V = 1024, 32, PAPER_V
    decoder = L * (12 * d * d + 2 * d) + d + V * d  # blocks (weights + LayerNorm gains), final norm, head
    assert binary == {"trainable": decoder, "frozen": V * PAPER_K, "input": 0}
    assert binary["trainable"] == 469_828_608
    assert affine == {"trainable": decoder, "frozen": PAPER_K * PAPER_K + PAPER_K, "input": 0}
    assert learned == {"trainable": decoder + 67_108_864, "frozen": 0, "input": 67_108_864}
    assert learned["trainable"] - binary["trainable"] == 65536 * 1024


def test_flops_per_token_counts_matmuls_only():
    with torch.device("meta"):
        flops = {v: GPT(get_config("paper", input=v)).flops_per_token() for v in ("binary", "affine", "learned")}
    d, L, V, T = 1024, 32, PAPER_V, 1024
    assert flops["binary"] == flops["affine"] == flops["learned"] == 6 * (L * 12 * d * d + V * d) + 12 * L * T * d


def test_a_meta_build_holds_no_values_and_draws_nothing():
    """Every input of the paper preset builds on the meta device: its weights meta, its tables (the
    code, A and b, the lift, rotary) built on the CPU, those of a CPU build, the global generator
    untouched, the controls' counts learned's less the table."""
    before = torch.get_rng_state()
    with torch.device("meta"):
        models = {v: GPT(get_config("paper", input=v)) for v in INPUTS}
    assert torch.equal(torch.get_rng_state(), before)
    cos, sin = rotary_cos_sin(torch.arange(1024), 1024 // 32, 10000.0)
    affine = AffineCodeInput(PAPER_V, 1024)
    for v, model in models.items():
        assert all(p.is_meta for p in model.parameters()), v
        assert all(t.device.type == "cpu" for t in model.buffers()), v
        assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin), v
    assert torch.equal(models["binary"].embed.weight, canonical_code(PAPER_V, PAPER_PAD))
    assert torch.equal(models["binary"].embed.lift, lift_index(1024, PAPER_K, "tile"))
    assert all(torch.equal(getattr(models["affine"].embed, n), getattr(affine, n)) for n in ("A", "b", "lift"))
    learned = models["learned"].num_params()
    table = PAPER_V * 1024
    for v in ("random", "frozen"):
        want = {"trainable": learned["trainable"] - table, "frozen": table, "input": 0}
        assert models[v].num_params() == want


def test_the_tools_shapes_come_from_a_meta_build():
    """convert.shapes_of (names, shapes, dtypes of the native state dict) and scaling's trainable
    counts, built on the meta device, are those of a model built on the CPU."""
    from types import SimpleNamespace

    from tools import convert, scaling

    described = lambda state: {n: (t.shape, t.dtype) for n, t in state.items()}
    for v in INPUTS:
        config = get_config("tiny", input=v)
        assert described(convert.shapes_of(config)) == described(GPT(config).state_dict())
        args = SimpleNamespace(n_head=2, block_size=32)
        shape = dict(vocab_size=512, n_layer=2, n_head=2, n_embd=32, block_size=32, input=v)
        cpu = GPT(get_config("small", **shape)).num_params()["trainable"]
        assert scaling.trainable(2, 32, v, args, 512) == cpu, v


# ----- loading: built on the meta device, then given the file's weights --------------------------


@pytest.mark.parametrize("layout", ["tile", "interleave"])
@pytest.mark.parametrize("variant", INPUTS)
def test_a_loaded_model_has_real_tables_and_the_saved_models_logits(tmp_path, variant, layout):
    """The tables no checkpoint holds (rotary, the input's lift) are built on the CPU, equal to the
    saved model's; the code table comes from the file; the logits are the saved model's,
    exactly."""
    pad = 5 if variant == "binary" else None
    model = tiny(input=variant, layout=layout, pad_token_id=pad)
    torch.save(checkpoint_dict(model, None), tmp_path / "ckpt.pt")
    loaded, _ = load_checkpoint(str(tmp_path / "ckpt.pt"))
    mine = dict(loaded.named_buffers())
    assert mine.keys() == dict(model.named_buffers()).keys()
    for name, b in model.named_buffers():
        assert mine[name].device.type == "cpu" and torch.equal(mine[name], b), name
    idx = torch.randint(0, 512, (3, 32))
    assert torch.equal(loaded.eval()(idx)[0], model(idx)[0])


def test_a_paper_size_model_from_stand_ins_gets_real_tables():
    """model_from_weights on the paper preset with meta stand-ins for its weights (as
    quantize.split_int8 gives them): the stand-ins stay meta, the code table is the file's, the
    rotary tables and the lift are built."""
    config = get_config("paper")
    with torch.device("meta"):
        weights = GPT(config).state_dict()
    weights["embed.weight"] = canonical_code(PAPER_V, PAPER_PAD)
    model = model_from_weights(config, weights, "paper")
    assert model.lm_head.weight.is_meta
    assert torch.equal(model.embed.weight, weights["embed.weight"])
    cos, sin = rotary_cos_sin(torch.arange(1024), 1024 // 32, 10000.0)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    assert torch.equal(model.embed.lift, lift_index(1024, PAPER_K, "tile"))


LOAD_AND_DECODE = """
import sys, torch
from bincode_gpt.checkpoint import load_checkpoint
from bincode_gpt.decode import stream
path, quantize = sys.argv[1], sys.argv[2] or None
model, _ = load_checkpoint(path, quantize=quantize, purpose="sample from")
next(stream(model.eval(), torch.zeros(1, 3, dtype=torch.long), 1, temperature=0))
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""


@pytest.mark.parametrize("quantize", ["", "int8"])
def test_loading_and_decoding_eagerly_never_imports_dynamo(tmp_path, quantize):
    """A fresh process that loads a checkpoint (built on the meta device) and decodes a token eagerly
    imports no torch._dynamo (~0.8 s of modules: torch's meta kernels import it at their first
    arithmetic, so the meta build runs none), float32 and --quantize int8 alike."""
    torch.save(checkpoint_dict(tiny(pad_token_id=5), None), tmp_path / "ckpt.pt")
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", LOAD_AND_DECODE, str(tmp_path / "ckpt.pt"), quantize], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "[]\n"


def test_checkpoint_round_trip_with_weights_only(tmp_path):
    model = tiny(input="affine", layout="interleave")
    tokenizer = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512}
    torch.save(checkpoint_dict(model, tokenizer), tmp_path / "ckpt.pt")
    torch.load(tmp_path / "ckpt.pt", weights_only=True)
    loaded, ckpt = load_checkpoint(str(tmp_path))
    idx = torch.randint(0, 512, (2, 10))
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    assert loaded.config == model.config and ckpt["tokenizer"]["encoding"] == "gpt2"


def old_load(path):
    """The loading path before issue 12: random init, a full read, then a copy into the model."""
    ckpt = torch.load(path, weights_only=True)
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model


@pytest.mark.parametrize("variant", ["binary", "affine", "learned"])
def test_fast_load_equals_the_old_path_bit_for_bit(tmp_path, variant):
    model = tiny(input=variant, bias=True, pad_token_id=3 if variant == "binary" else None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # norms and biases off their init values
    torch.save(checkpoint_dict(model, None), tmp_path / "ckpt.pt")
    fast, _ = load_checkpoint(str(tmp_path / "ckpt.pt"))
    slow = old_load(tmp_path / "ckpt.pt")
    named = lambda m: {**dict(m.named_parameters()), **dict(m.named_buffers())}  # non-persistent buffers too
    a, b = named(fast), named(slow.eval())
    assert a.keys() == b.keys() and not any(t.is_meta for t in a.values())
    for name in a:
        assert torch.equal(a[name], b[name]) and a[name].dtype == b[name].dtype, name
    assert all(p.requires_grad for p in fast.parameters())
    idx = torch.randint(0, 512, (2, 20))
    assert torch.equal(fast.eval()(idx)[0], slow(idx)[0])
    assert torch.equal(generate(fast, idx[:1], 12, temperature=0), generate(slow, idx[:1], 12, temperature=0))


def test_loaded_weights_never_write_back_to_the_file(tmp_path):
    """The checkpoint is memory-mapped copy-on-write: training the loaded model (train.py --resume)
    must leave the file it came from byte for byte."""
    torch.save(checkpoint_dict(tiny(), None), tmp_path / "ckpt.pt")
    before = (tmp_path / "ckpt.pt").read_bytes()
    model, _ = load_checkpoint(str(tmp_path))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)
    del model
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_weights_stored_in_another_dtype_are_cast(tmp_path):
    model = tiny()
    state = checkpoint_dict(model, None)
    state["model"] = {k: v.bfloat16() for k, v in state["model"].items()}
    torch.save(state, tmp_path / "ckpt.pt")
    loaded, _ = load_checkpoint(str(tmp_path))
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.bfloat16().float())


def test_truncated_and_mismatched_checkpoints_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    state = checkpoint_dict(tiny(), None)
    torch.save(state, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{path}: cannot read this checkpoint, truncated or not a PyTorch file"):
        load_checkpoint(str(path))
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'none.pt'}: no checkpoint there"):
        load_checkpoint(str(tmp_path / "none.pt"))
    wide = {**state, "model_config": {**state["model_config"], "n_embd": 64}}
    torch.save(wide, path)
    expected = (rf"{path}: weights do not fit its model_config: misshapen blocks.0.ln_1.weight: \(32,\) in the file, "
                r"\(64,\) in the model \(and 13 more misshapen\)$")
    with pytest.raises(ValueError, match=expected):
        load_checkpoint(str(path))
    torch.save({**state, "model": {k: v for k, v in state["model"].items() if k != "ln_f.weight"}}, path)
    with pytest.raises(ValueError, match=rf"{path}: weights do not fit its model_config: missing ln_f.weight$"):
        load_checkpoint(str(path))
    torch.save({**state, "model_config": {**state["model_config"], "n_experts": 4}}, path)
    with pytest.raises(ValueError, match=rf"{path}: its model_config does not fit GPTConfig"):
        load_checkpoint(str(path))


def test_an_override_must_agree_with_the_checkpoints_shape_but_for_dropout():
    theirs = {"n_layer": 2, "n_embd": 32, "dropout": 0.0}
    checkpoint.check_same_shape(theirs, {"n_layer": 2, "dropout": 0.1}, "c.pt")
    with pytest.raises(ValueError, match=re.escape("c.pt: the checkpoint has another shape than this run asks for: "
                                                   "n_embd=32 (asked 64), input=None (asked 'affine')")):
        checkpoint.check_same_shape(theirs, {"n_embd": 64, "input": "affine"}, "c.pt")


def test_a_pad_row_on_a_token_is_dropped_from_a_preset_and_refused_when_asked_for():
    meta = {"encoding": "gpt2", "vocab_size": 512}
    notes = []
    assert checkpoint.pad_off_the_tokens({"n_layer": 2}, "tiny", meta, notes.append) == {"n_layer": 2}
    assert checkpoint.pad_off_the_tokens({}, "paper", {**meta, "vocab_size": 65536}, notes.append) == {
        "pad_token_id": None}  # 57344, the released tokenizer's <pad>, is a token here: dropped
    assert notes == ["note: preset paper's pad_token_id 57344 (the released tokenizer's <pad>) is a token of this "
                     "data's tokenizer: every id keeps its own code (pad_token_id none)"]
    assert checkpoint.pad_off_the_tokens({}, "paper", meta, notes.append) == {}  # past the data's ids: kept
    with pytest.raises(ValueError, match=r"^--pad_token_id 5 is a token of the data's tokenizer \(gpt2, 512 ids\)"):
        checkpoint.pad_off_the_tokens({"pad_token_id": 5}, "tiny", meta, notes.append)


# ----- weights saved by other code ---------------------------------------------------------------
def wrapped(model, how):
    """The state dict `model` gives through real wrappers: torch.compile (keys `_orig_mod.`), DataParallel (keys
    `module.`, as DDP's), both in either order, or each block compiled on its own."""
    if how == "blocks compiled":
        model = copy.deepcopy(model)
        model.blocks = torch.nn.ModuleList(torch.compile(b) for b in model.blocks)
        return model.state_dict()
    wrap = {"compiled": torch.compile, "ddp": torch.nn.DataParallel}
    for name in how.split("+"):
        model = wrap[name](model)
    return model.state_dict()


@pytest.mark.parametrize("how,prefixes", [("compiled", "'_orig_mod.'"), ("ddp", "'module.'"),
                                          ("compiled+ddp", "'module.' and '_orig_mod.'"),
                                          ("ddp+compiled", "'_orig_mod.' and 'module.'"),
                                          ("blocks compiled", "'_orig_mod.'")])
def test_weights_saved_through_a_wrapper_load_with_one_note(tmp_path, capsys, how, prefixes):
    model = tiny(vocab_size=256)
    state = wrapped(model, how)
    assert all(k not in model.state_dict() for k in state if k.startswith(("module", "_orig_mod"))) and state
    torch.save({**checkpoint_dict(model, None), "model": state}, tmp_path / "ckpt.pt")
    loaded, _ = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(t, model.state_dict()[k]) for k, t in loaded.state_dict().items())
    assert capsys.readouterr().err == (f"note: {tmp_path / 'ckpt.pt'}: its weights were saved from a wrapped model "
                                       f"(torch.compile, DDP): read without their {prefixes} prefixes\n")


def test_other_weights_name_the_first_unexpected_and_missing_key(tmp_path):
    model = tiny(vocab_size=256)
    state, path = model.state_dict(), tmp_path / "ckpt.pt"
    keys = list(state)
    with torch.device("meta"):  # what the one-block model the message compares with holds
        one_block = list(GPT(get_config("tiny", vocab_size=256, n_layer=1)).state_dict())
    torch.save({**checkpoint_dict(model, None), "model": {"model." + k: t for k, t in state.items()}}, path)
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(path))
    assert str(e.value) == (f"{path}: its model_config says n_layer 2, but its weights hold 0 blocks: unexpected "
                            f"model.{keys[0]} (and {len(keys) - 1} more unexpected); missing {one_block[0]} (and "
                            f"{len(one_block) - 1} more missing)")
    extra = {**state, "blocks.0.attn.rope_cos": model.rope_cos}  # a buffer saved that the model builds itself
    torch.save({**checkpoint_dict(model, None), "model": extra}, path)
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(path))
    assert str(e.value) == f"{path}: weights do not fit its model_config: unexpected blocks.0.attn.rope_cos"
    twice = {**state, f"module.{keys[1]}": state[keys[1]]}
    torch.save({**checkpoint_dict(model, None), "model": twice}, path)
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(path))
    assert str(e.value) == (f"{path}: its weights hold both {keys[1]} and module.{keys[1]}, one tensor of the model "
                            "under a wrapper's prefix and not")


@pytest.mark.parametrize("saved,holds", [([1, 2], "a list"), ("weights", "a str"),
                                         ({"w": torch.zeros(2)}, "a bare state dict (1 tensor, no model_config)")])
def test_a_file_that_is_no_checkpoint_says_what_it_holds(tmp_path, saved, holds):
    torch.save(saved, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert str(e.value) == (f"{tmp_path / 'ckpt.pt'}: not a checkpoint of this project (needs 'model' and "
                            f"'model_config'; it holds {holds})")
