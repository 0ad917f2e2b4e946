"""Tests for convert.py on small synthetic checkpoints (the real releases cannot be downloaded here).

A native tiny model is renamed/reshaped into a released-style HF folder (BVV config.json + weights
under nanoGPT, GPT-NeoX or Llama names), converted back, and compared exactly; native -> HF -> native
must be exact; the exported GPTNeoXForCausalLM must reproduce our logits and greedy generations. The
command line is run for real (a subprocess) for what a user meets there: refusals, one-line errors,
the surviving bytes of what must not be replaced, and --layout auto's choice. Tests that need
safetensors, tokenizers or transformers (requirements-extras.txt) skip without them.
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from bincode_gpt.checkpoint import checkpoint_dict, load_checkpoint
from bincode_gpt.exits import run_main
from bincode_gpt.decode import generate
from bincode_gpt.files import LOCK_NAME
from bincode_gpt.tokenizer import get_tokenizer, load_text_codec
from model import GPT, canonical_code, code_bits, get_config
from test_sample import char_tokenizer
from tools import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's
SHAKESPEARE = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.
We know't, we know't. Let us kill him, and we'll have corn at our own price.
  Is't a verdict?   O, 'tis   a  night\t\tof 1234567 stars!!\r\n
Naïve café — “quoted” 日本語 🎉 emoji\u00a0nbsp <|endoftext|> end.
"""
TIKTOKEN_512 = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512}


def run(*args, real=False):
    """convert.py's command line -> (exit code, stdout, stderr): `python -m tools.convert ARGS` in a subprocess
    when real, else its main under the same wrapper in this process (a subprocess costs an import of torch)."""
    if real:
        p = subprocess.run([sys.executable, "-m", "tools.convert", *map(str, args)], capture_output=True,
                           text=True, cwd=ROOT)
        return p.returncode, p.stdout, p.stderr
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_main(convert.main, [str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def tiny(input="binary", bias=False, layout="tile", vocab_size=256, pad_token_id=None, seed=0, **overrides):
    """A tiny model whose norms and biases are not at their init values (so mix-ups show)."""
    torch.manual_seed(seed)
    cfg = get_config("tiny", vocab_size=vocab_size, input=input, bias=bias, layout=layout,
                     pad_token_id=pad_token_id, affine_seed=seed, rope_base=500.0, **overrides)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name or name.startswith("ln_f"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_native(model, folder, tokenizer=None):
    os.makedirs(folder, exist_ok=True)
    torch.save(checkpoint_dict(model, tokenizer), os.path.join(folder, "ckpt.pt"))
    return folder


NANO = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
        "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
NEOX = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.qkv": "attention.query_key_value",
        "attn.proj": "attention.dense", "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}
LLAMA = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.proj": "self_attn.o_proj",
         "mlp.fc": "mlp.up_proj", "mlp.proj": "mlp.down_proj"}


def to_convention(model, conv, conv1d=False):
    """Our state dict under another convention's names and layouts (what a release might store)."""
    c, out = model.config, {}
    for name, t in model.state_dict().items():
        t = t.clone()
        m = re.match(r"blocks\.(\d+)\.(ln_1|ln_2|attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.(weight|bias)$", name)
        if name == "embed.weight":
            out[{"nanogpt": "transformer.wte.weight", "neox": "gpt_neox.embed_in.weight",
                 "llama": "model.embed_tokens.weight"}[conv]] = t
        elif name in ("embed.A", "embed.b"):
            prefix = {"nanogpt": "transformer.", "neox": "gpt_neox.", "llama": "model."}[conv]
            out[prefix + "input_code." + name[6:]] = t
        elif name == "lm_head.weight":
            out["embed_out.weight" if conv == "neox" else "lm_head.weight"] = t
        elif name.startswith("ln_f."):
            out[{"nanogpt": "transformer.ln_f.", "neox": "gpt_neox.final_layer_norm.", "llama": "model.norm."}[conv]
                + name[5:]] = t
        elif m:
            i, mod, kind = m.groups()
            if conv == "nanogpt":
                key = f"transformer.h.{i}.{NANO[mod]}.{kind}"
                out[key] = t.t().contiguous() if conv1d and t.dim() == 2 and mod != "ln_1" else t
            elif conv == "neox":
                key = f"gpt_neox.layers.{i}.{NEOX[mod]}.{kind}"
                out[key] = convert.to_neox_qkv(t, c.n_head) if mod == "attn.qkv" else t
            elif mod == "attn.qkv":
                for part, piece in zip("qkv", t.split(c.n_embd, dim=0)):
                    out[f"model.layers.{i}.self_attn.{part}_proj.{kind}"] = piece.contiguous()
            else:
                out[f"model.layers.{i}.{LLAMA[mod]}.{kind}"] = t
        else:
            raise AssertionError(name)
    for i in range(c.n_layer):  # non-weights a release may carry; all skipped explicitly
        if conv == "nanogpt":
            causal = torch.tril(torch.ones(c.block_size, c.block_size))
            out[f"transformer.h.{i}.attn.bias"] = causal.view(1, 1, c.block_size, c.block_size)
        elif conv == "llama":
            out[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.ones(c.n_embd // c.n_head // 2)
    return out


def bvv_config(model):
    """config.json with the BVVConfig fields PAPER.md lists."""
    c = model.config
    K = code_bits(c.vocab_size)
    model_type = {"binary": f"model_n_embed_{K}_binary_n_layer_{c.n_layer}",
                  "affine": f"model_binary_affine_code_n_layer_{c.n_layer}",
                  "learned": f"model_n_embed_{c.n_embd}_n_layer_{c.n_layer}"}[c.input]
    cfg = {"architectures": ["BVVForCausalLM"], "model_type": model_type, "vocab_size": c.vocab_size,
           "block_size": c.block_size, "n_embd": c.n_embd, "d_model": c.n_embd, "n_layer": c.n_layer,
           "n_head": c.n_head, "pad_id": c.pad_token_id, "pad_token_id": c.pad_token_id, "rope_theta": c.rope_base,
           "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
           "torch_dtype": "float32"}
    if c.input != "learned":
        cfg["n_embed"] = K
    return cfg


def write_hf(folder, tensors, config, fmt="bin", shards=1):
    """A released-style folder; fmt "bin" (pytorch_model.bin) needs nothing beyond torch."""
    os.makedirs(folder, exist_ok=True)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
    if fmt == "bin":
        torch.save(tensors, os.path.join(folder, "pytorch_model.bin"))
        return folder
    save_file = pytest.importorskip("safetensors.torch").save_file
    if shards == 1:
        save_file(tensors, os.path.join(folder, "model.safetensors"))
        return folder
    names, weight_map = sorted(tensors), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, os.path.join(folder, file))
        weight_map.update({n: file for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return folder


def assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    x = torch.randint(0, a.config.vocab_size, (2, a.config.block_size))
    with torch.no_grad():
        assert torch.equal(a(x)[0], b(x)[0])


# ------------------------------------------------------------------------------------ conversions
CASES = [  # convention, input, layout, bias, format, shards, conv1d
    ("nanogpt", "binary", "tile", False, "safetensors", 1, False),
    ("neox", "binary", "interleave", True, "safetensors", 3, False),
    ("llama", "learned", "tile", False, "safetensors", 1, False),
    ("nanogpt", "learned", "tile", True, "bin", 1, True),
    ("llama", "binary", "interleave", True, "bin", 1, False),
    ("neox", "affine", "tile", False, "bin", 1, False),
]


@pytest.mark.parametrize("conv,input,layout,bias,fmt,shards,conv1d", CASES)
def test_hf2native_conventions(tmp_path, conv, input, layout, bias, fmt, shards, conv1d):
    model = tiny(input, bias, layout, pad_token_id=200 if input == "binary" else None)
    src = write_hf(tmp_path / "hf", to_convention(model, conv, conv1d), bvv_config(model), fmt, shards)
    (src / "tokenizer.json").write_text("{}")
    args = ["hf2native", str(src), str(tmp_path / "out")] + (["--layout", layout] if input != "learned" else [])
    assert convert.main(args) == 0
    back, ckpt = load_checkpoint(str(tmp_path / "out"))
    assert back.config == model.config
    assert_same_model(model, back)
    assert ckpt["tokenizer"] == {"kind": "hf", "file": "tokenizer.json"}
    assert (tmp_path / "out" / "tokenizer.json").read_text() == "{}"


def test_code_table_pad_row(tmp_path):
    # a table that keeps the plain code on the pad row loads as pad_token_id None (same table)
    model = tiny("binary", pad_token_id=5)
    t = to_convention(model, "nanogpt")
    t["transformer.wte.weight"] = canonical_code(256)
    write_hf(tmp_path / "hf", t, bvv_config(model))
    back, _, _ = convert.hf_to_native(str(tmp_path / "hf"), "tile")
    assert back.config.pad_token_id is None and torch.equal(back.embed.weight, canonical_code(256))
    assert back.embed.weight[5].tolist() == [1, 0, 1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("input,layout,vocab_size,tokenizer", [("binary", "interleave", 256, None),
                                                               ("affine", "tile", 512, TIKTOKEN_512),
                                                               ("learned", "interleave", 512, TIKTOKEN_512)])
def test_native_hf_native_exact(tmp_path, input, layout, vocab_size, tokenizer):
    pytest.importorskip("safetensors")
    if tokenizer:
        pytest.importorskip("tokenizers")
    model = tiny(input, bias=input == "affine", layout=layout, vocab_size=vocab_size,
                 pad_token_id=7 if input == "binary" else None)
    convert.convert_native_to_hf(save_native(model, tmp_path / "native", tokenizer), str(tmp_path / "hf"))
    path, back, info = convert.convert_hf_to_native(str(tmp_path / "hf"), str(tmp_path / "again"))
    assert back.config == model.config
    assert_same_model(model, back)
    assert torch.load(path, weights_only=True)["tokenizer"] == tokenizer


def test_exported_table_is_checked(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    convert.convert_native_to_hf(str(save_native(tiny("binary"), tmp_path / "n")), str(tmp_path / "hf"))
    t = safetensors.load_file(str(tmp_path / "hf" / "model.safetensors"))
    t["gpt_neox.embed_in.weight"][3, 0] += 0.5
    safetensors.save_file(t, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(convert.ConversionError,
                       match="the stored 256 x 32 input table is not the binary code lifted with layout tile"):
        convert.hf_to_native(str(tmp_path / "hf"))


@pytest.mark.parametrize("input,bias", [("binary", False), ("binary", True), ("affine", False),
                                        ("affine", True), ("learned", False), ("learned", True)])
def test_transformers_matches(tmp_path, input, bias):
    transformers = pytest.importorskip("transformers")
    model = tiny(input, bias, "interleave" if bias else "tile", vocab_size=512,
                 pad_token_id=9 if input == "binary" else None)
    convert.convert_native_to_hf(save_native(model, tmp_path / "native", TIKTOKEN_512), str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    assert type(hf).__name__ == "GPTNeoXForCausalLM"
    x = torch.randint(0, 512, (2, model.config.block_size))
    with torch.no_grad():
        diff = (model(x)[0] - hf(x).logits).abs().max().item()
    assert diff < 1e-4, diff
    prompt = x[:1, :6]
    ours = generate(model, prompt, 20, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False,
                         attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours, theirs)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 511


@pytest.mark.parametrize("vocab_size, reserve_zero, reserve_ones",
                         [(None, False, False), (1000, False, False), (1000, True, False),
                          (512, True, True)])  # 512: end-of-text at 187, amid the ranks
def test_tokenizer_matches_tiktoken(tmp_path, vocab_size, reserve_zero, reserve_ones):
    pytest.importorskip("tokenizers")
    enc = get_tokenizer("gpt2", vocab_size, reserve_zero, reserve_ones)
    tk = convert.tiktoken_to_hf(enc)
    texts = [SHAKESPEARE, SHAKESPEARE.upper(), "  leading spaces", "a\n\n\nb", "x" * 300, "1234567890 3.14159", "",
             "Hi!\x00!"]
    for text in texts:
        want = enc.encode(text, allowed_special="all")
        assert tk.encode(text, add_special_tokens=False).ids == want
        assert tk.decode(want, skip_special_tokens=False) == text
    transformers = pytest.importorskip("transformers")
    model = tiny("learned", vocab_size=enc.n_vocab)
    save_native(model, tmp_path / "n", {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": vocab_size,
                                        "reserve_zero": reserve_zero, "reserve_ones": reserve_ones})
    convert.convert_native_to_hf(str(tmp_path / "n"), str(tmp_path / "hf"))
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert auto(SHAKESPEARE, add_special_tokens=False)["input_ids"] == enc.encode(SHAKESPEARE, allowed_special="all")
    assert auto.eos_token_id == enc.eot_token and auto.bos_token_id == enc.eot_token


def test_release_tokenizer_to_transformers(tmp_path):
    """Release-style folder (Llama names, code-point tokenizer.json with </s>) -> native -> HF -> transformers."""
    transformers = pytest.importorskip("transformers")
    model = tiny("binary", layout="interleave", vocab_size=128, pad_token_id=0)
    src = write_hf(tmp_path / "release", to_convention(model, "llama"), bvv_config(model))
    tk = char_tokenizer(str(src))
    tokenizer_config = {"eos_token": "</s>", "bos_token": "<s>", "pad_token": "<pad>", "unk_token": "<unk>",
                        "auto_map": {"AutoTokenizer": ["x.Y", None]}}
    (src / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    convert.convert_hf_to_native(str(src), str(tmp_path / "native"), "interleave")
    convert.convert_native_to_hf(str(tmp_path / "native"), str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    text = "Q: capital of France? A:"
    ids = auto(text, add_special_tokens=False)["input_ids"]
    assert ids == tk.encode(text).ids and auto.eos_token_id == 2 and auto.bos_token_id == 1 and auto.pad_token_id == 0
    x = torch.tensor([ids])
    with torch.no_grad():
        assert (model(x)[0] - hf(x).logits).abs().max().item() < 1e-4
    ours = generate(model, x, 10, temperature=0, eos_token_id=2)[0].tolist()
    theirs = hf.generate(x, max_new_tokens=10, do_sample=False)[0].tolist()

    def cut(seq):  # up to and including the first end-of-text (transformers pads after it)
        return seq[: seq.index(2, len(ids)) + 1] if 2 in seq[len(ids):] else seq

    assert cut(ours) == cut(theirs) and len(cut(ours)) > len(ids)


# ------------------------------------------------------------------------------------ cl100k_base, uncut and cut
CL100K_TEXT = SHAKESPEARE + "<|fim_prefix|>def f():<|fim_suffix|> return 1<|fim_middle|><|endofprompt|>"


@pytest.fixture(scope="module", params=[None, 65536], ids=["uncut", "cut"])
def cl100k(request, tmp_path_factory):
    """A tiny model on cl100k_base, uncut (ids to 100,276 past the holes at 100,256 and 100,261-100,275) or cut to
    65,536 (today's reserved ids), exported by `python -m tools.convert native2hf` and brought back by hf2native."""
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    cut = request.param is not None
    entry = {"kind": "tiktoken", "encoding": "cl100k_base", "vocab_size": request.param, "reserve_zero": cut,
             "reserve_ones": cut}
    enc = get_tokenizer("cl100k_base", request.param, cut, cut)
    model = tiny("binary", vocab_size=enc.n_vocab, seed=3)
    tmp = tmp_path_factory.mktemp("cl100k")
    code, out, err = run("native2hf", save_native(model, tmp / "native", entry), tmp / "hf", real=True)
    assert (code, err) == (0, ""), err
    code, out, err = run("hf2native", tmp / "hf", tmp / "back")
    assert (code, err) == (0, ""), err
    return model, enc, entry, tmp


def test_cl100k_export_comes_back_exact(cl100k):
    model, enc, entry, tmp = cl100k
    back, ckpt = load_checkpoint(str(tmp / "back"))
    assert back.config == model.config and enc.n_vocab == (65536 if entry["vocab_size"] else 100277)
    assert_same_model(model, back)
    assert ckpt["tokenizer"] == entry
    ids = enc.encode(CL100K_TEXT, allowed_special="all")
    assert load_text_codec(ckpt, str(tmp / "back")).encode(CL100K_TEXT) == ids
    assert (100276 in ids) == (entry["vocab_size"] is None)  # <|endofprompt|>: a special of the uncut encoding only
    exported = load_text_codec({"tokenizer": {"kind": "hf", "file": "tokenizer.json"}}, str(tmp / "hf"))
    assert exported.encode(CL100K_TEXT) == ids and exported.decode(ids) == CL100K_TEXT  # 1234567: 123 456 7


def test_cl100k_export_is_the_same_model_and_tokenizer_in_transformers(cl100k):
    transformers = pytest.importorskip("transformers")
    model, enc, entry, tmp = cl100k
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp / "hf"))
    ids = enc.encode(CL100K_TEXT, allowed_special="all")
    assert auto(CL100K_TEXT, add_special_tokens=False)["input_ids"] == ids
    assert auto.decode(ids) == CL100K_TEXT and auto.eos_token_id == enc.eot_token
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp / "hf"), dtype=torch.float32).eval()
    x = torch.tensor([ids[: model.config.block_size]])
    with torch.no_grad():
        assert (model(x)[0] - hf(x).logits).abs().max().item() < 1e-4
    prompt = x[:, :6]
    theirs = hf.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                         attention_mask=torch.ones_like(prompt))
    assert torch.equal(generate(model, prompt, 12, temperature=0), theirs)


# ------------------------------------------------------------------------------------ --layout auto
def trained(layout, steps=60):
    """A tiny model over a character tokenizer, fitted to the first block of convert.ENGLISH through
    `layout`: read through the other layout its input bits are scrambled."""
    model = tiny("binary", layout=layout, vocab_size=128, block_size=64, pad_token_id=0)
    ids = [4 + ord(ch) - 32 for ch in convert.ENGLISH[:65]]  # char_tokenizer's ids: 4 specials, then ASCII
    x = torch.tensor(ids)[None]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(x[:, :-1], x[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("layout", ["tile", "interleave"])
def test_layout_auto_picks_the_trained_layout(tmp_path, layout):
    model = trained(layout)
    src = write_hf(tmp_path / "hf", to_convention(model, "neox"), bvv_config(model))
    char_tokenizer(str(src))
    code, out, err = run("hf2native", src, tmp_path / "out")
    assert code == 0, err
    m = re.search(r"layout auto: next-token loss on 64 tokens of English: tile (\S+), interleave (\S+) -> (\w+)\n", out)
    assert m and m.group(3) == layout, out
    losses = {"tile": float(m.group(1)), "interleave": float(m.group(2))}
    other = "tile" if layout == "interleave" else "interleave"
    assert losses[layout] < 1.0 < 3.0 < losses[other]
    back, _ = load_checkpoint(str(tmp_path / "out"))
    assert back.config == model.config
    assert_same_model(model, back)
    # the user may still force a layout
    code, out, err = run("hf2native", src, tmp_path / "forced", "--layout", other)
    assert code == 0 and "layout auto" not in out
    assert load_checkpoint(str(tmp_path / "forced"))[0].config.layout == other


def test_layout_auto_needs_a_tokenizer(tmp_path):
    model = tiny("binary")
    src = write_hf(tmp_path / "hf", to_convention(model, "neox"), bvv_config(model))
    code, out, err = run("hf2native", src, tmp_path / "out")
    assert (code, out) == (1, "")
    assert err == ("error: --layout auto scores both layouts on English text, but the folder has no tokenizer.json: "
                   "pass --layout tile or --layout interleave\n")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------ nothing lost
def test_hf2native_never_replaces_a_checkpoint(tmp_path):
    model = tiny("binary", pad_token_id=3)
    src = write_hf(tmp_path / "hf", to_convention(model, "nanogpt"), bvv_config(model))
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"a resumable training checkpoint")
    (out / "tokenizer_config.json").write_text("stale")
    code, stdout, err = run("hf2native", src, out, "--layout", "tile", real=True)
    assert (code, stdout) == (1, "")
    assert err == (f"error: {out} is not empty (it holds ckpt.pt, tokenizer_config.json): pass --overwrite to replace "
                   "its model and tokenizer files (other files are kept)\n")
    assert (out / "ckpt.pt").read_bytes() == b"a resumable training checkpoint"
    code, stdout, err = run("hf2native", src, out, "--layout", "tile", "--overwrite", real=True)
    assert code == 0, err
    assert stdout == (f"wrote {out / 'ckpt.pt'}: binary input, layout tile, names any, nanoGPT, 32,928 trainable "
                      "parameters, 2,048 frozen values\n")
    assert_same_model(model, load_checkpoint(str(out))[0])
    assert sorted(os.listdir(out)) == [LOCK_NAME, "ckpt.pt"]  # the stale tokenizer file went, no temp file stayed


def test_native2int8_of_weights_saved_through_wrappers(tmp_path):
    model = tiny()
    save_native(model, tmp_path / "plain")
    os.makedirs(tmp_path / "wrapped")
    wrapped = {**checkpoint_dict(model, None), "model": {f"module.{k}": t for k, t in model.state_dict().items()}}
    torch.save(wrapped, tmp_path / "wrapped" / "ckpt.pt")  # DDP(model)'s
    assert run("native2int8", tmp_path / "plain", tmp_path / "a")[0] == 0
    code, _, err = run("native2int8", tmp_path / "wrapped", tmp_path / "b")
    assert code == 0 and err.startswith(f"note: {tmp_path / 'wrapped' / 'ckpt.pt'}: its weights were saved from a "
                                        "wrapped model (torch.compile, DDP): read without their 'module.' prefixes\n")
    a, b = (torch.load(tmp_path / o / "ckpt.pt", weights_only=True)["model"] for o in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_native2hf_overwrite_leaves_no_stale_files(tmp_path):
    pytest.importorskip("safetensors")
    model = tiny("binary", bias=True)
    native = save_native(model, tmp_path / "native")
    out = tmp_path / "hf"
    out.mkdir()
    old = {"model.safetensors.index.json": '{"weight_map": {"x": "model-00001-of-00002.safetensors"}}',
           "model-00001-of-00002.safetensors": "old shard", "vocab.json": "{}", "README.md": "my model card"}
    for name, text in old.items():
        (out / name).write_text(text)
    code, stdout, err = run("native2hf", native, out)
    assert (code, stdout) == (1, "")
    assert err.startswith(f"error: {out} is not empty (it holds README.md, model-00001-of-00002.safetensors, ")
    assert {name: (out / name).read_text() for name in old} == old
    code, stdout, err = run("native2hf", native, out, "--overwrite")
    assert code == 0, err
    assert err == "warning: the checkpoint names no tokenizer; none exported\n"
    assert sorted(os.listdir(out)) == [LOCK_NAME, "README.md", "config.json", "generation_config.json",
                                       "model.safetensors"]
    assert (out / "README.md").read_text() == "my model card"
    _, back, _ = convert.convert_hf_to_native(str(out), str(tmp_path / "again"))
    assert_same_model(model, back)


def files(folder):
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(folder) for f in names}


def test_out_is_never_the_source_or_around_it(tmp_path):
    """`hf2native SRC SRC --overwrite` once removed the source's tokenizer files: an OUT that is SRC, lies inside
    it or holds it is refused, naming both, and the source stays byte for byte."""
    model = tiny("binary", pad_token_id=3)
    src = write_hf(tmp_path / "hf", to_convention(model, "nanogpt"), bvv_config(model))
    for name in ("tokenizer_config.json", "vocab.json", "merges.txt"):
        (src / name).write_text(f"the release's {name}")
    before = files(tmp_path)
    for out, where in [(src, "is"), (src / "native", "is inside"), (tmp_path, "holds")]:
        code, stdout, err = run("hf2native", src, out, "--layout", "tile", "--overwrite", real=where == "is")
        assert (code, stdout, err) == (1, "", f"error: OUT {out} {where} the source {src}: write the conversion to a "
                                              "folder of its own\n")
    native = save_native(model, tmp_path / "native")
    before = files(tmp_path)
    for args, where in [((native, native), "is the source"), ((native / "ckpt.pt", native), "is the source folder of")]:
        code, stdout, err = run("native2hf", *args, "--overwrite")
        assert (code, stdout, err) == (1, "", f"error: OUT {args[1]} {where} {args[0]}: "
                                              "write the conversion to a folder of its own\n")
    assert files(tmp_path) == before


def test_a_conversion_into_an_out_being_written_is_refused(tmp_path):
    """A second writer of OUT (a real process holding files.writer_lock, as a running conversion does) -> refused."""
    model = tiny("binary", pad_token_id=3)
    src = write_hf(tmp_path / "hf", to_convention(model, "nanogpt"), bvv_config(model))
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from bincode_gpt.files import writer_lock\n"
                               f"with writer_lock({str(out)!r}): print('held', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        code, stdout, err = run("hf2native", src, out, "--layout", "tile", real=True)
        assert (code, stdout, err) == (1, "", f"error: {out} is being written by another process (pid {holder.pid}); "
                                              "wait for it to finish or choose another folder\n")
        assert os.listdir(out) == [LOCK_NAME]
    finally:
        holder.kill()
        holder.wait()
    code, stdout, err = run("hf2native", src, out, "--layout", "tile", real=True)  # the holder is gone: so is its lock
    assert code == 0, err
    assert_same_model(model, load_checkpoint(str(out))[0])


# ------------------------------------------------------------------------------------ bad inputs: one line
def test_nan_weights_are_refused(tmp_path):
    model = tiny("binary")
    t = to_convention(model, "neox")
    t["gpt_neox.layers.1.mlp.dense_4h_to_h.weight"][0, 3] = float("nan")
    src = write_hf(tmp_path / "hf", t, bvv_config(model))
    code, out, err = run("hf2native", src, tmp_path / "out", "--layout", "tile")
    assert (code, out) == (1, "")
    assert err == (f"error: {src} holds NaN or inf values in gpt_neox.layers.1.mlp.dense_4h_to_h.weight: "
                   "refusing to convert a diverged or corrupt checkpoint\n")
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[1, 1] = float("inf")
    save_native(model, tmp_path / "native")
    code, out, err = run("native2hf", tmp_path / "native", tmp_path / "hf2")
    assert (code, out) == (1, "")
    assert err == (f"error: {tmp_path / 'native'} holds NaN or inf values in blocks.0.attn.qkv.weight: "
                   "refusing to convert a diverged or corrupt checkpoint\n")
    assert not (tmp_path / "out").exists() and not (tmp_path / "hf2").exists()  # a failed conversion creates nothing


def test_a_code_wider_than_k_has_no_hf_form_and_is_refused(tmp_path):
    save_native(tiny(code_width=12), tmp_path / "native")
    code, out, err = run("native2hf", tmp_path / "native", tmp_path / "hf")
    assert (code, out) == (1, "") and "its code is 12 bits wide" in err and not (tmp_path / "hf").exists()


def test_weight_files_by_extension_in_any_case_and_a_bom_in_config_json(tmp_path):
    """MODEL.SafeTensors is a safetensors file; a config.json a Windows editor saved (byte-order mark) is JSON."""
    model = tiny("binary")
    src = write_hf(tmp_path / "hf", to_convention(model, "neox"), bvv_config(model), fmt="safetensors")
    os.rename(src / "model.safetensors", src / "MODEL.SafeTensors")
    (src / "config.json").write_bytes(b"\xef\xbb\xbf" + (src / "config.json").read_bytes())
    code, out, err = run("hf2native", src, tmp_path / "out", "--layout", "tile")
    assert code == 0, err
    assert_same_model(model, load_checkpoint(str(tmp_path / "out"))[0])


@pytest.mark.parametrize("config,message", [
    ("{not json", "is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ("[1, 2]", "holds a list, expected a JSON object"),
    ('{"vocab_size": "256", "block_size": 32, "n_head": 2}', "vocab_size must be a positive integer, got '256'"),
    ('{"vocab_size": 256.5, "block_size": 32, "n_head": 2}', "vocab_size must be a positive integer, got 256.5"),
    ('{"vocab_size": 256, "n_head": 2}', "lacks ['block_size']; it has ['n_head', 'vocab_size']"),
])
def test_garbage_config_is_one_line(tmp_path, config, message):
    model = tiny("binary")
    src = write_hf(tmp_path / "hf", to_convention(model, "neox"), None)
    (src / "config.json").write_text(config)
    code, out, err = run("hf2native", src, tmp_path / "out", "--layout", "tile")
    assert (code, out, err) == (1, "", f"error: {src / 'config.json'}{':' if 'must be' in message else ''} {message}\n")


def test_paths_stay_inside_their_folder(tmp_path):
    # a checkpoint whose tokenizer entry points outside its folder
    save_native(tiny("binary"), tmp_path / "native", {"kind": "hf", "file": "../../../../etc/passwd"})
    code, out, err = run("native2hf", tmp_path / "native", tmp_path / "hf")
    assert (code, out) == (1, "")
    assert err == (f"error: the tokenizer entry names '../../../../etc/passwd', which is not a file name inside "
                   f"{tmp_path / 'native'}: refused\n")
    assert not (tmp_path / "hf").exists()
    # a config naming its tokenizer or its weight shards outside the folder
    model = tiny("binary")
    cfg = bvv_config(model) | {"native_gpt": {"tokenizer": {"kind": "hf", "file": "/etc/passwd"}}}
    src = write_hf(tmp_path / "src", to_convention(model, "neox"), cfg)
    code, out, err = run("hf2native", src, tmp_path / "out", "--layout", "tile")
    assert (code, out, err) == (1, "", f"error: the tokenizer entry names '/etc/passwd', which is not a file name "
                                       f"inside {src}: refused\n")
    (src / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "../outside.bin"}}))
    code, out, err = run("hf2native", src, tmp_path / "out", "--layout", "tile")
    assert (code, out, err) == (1, "", "error: pytorch_model.bin.index.json names '../outside.bin', which is not a "
                                       f"file name inside {src}: refused\n")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def good():
    model = tiny("binary", pad_token_id=3)
    return model, to_convention(model, "neox"), bvv_config(model)


def test_error_no_config(tmp_path, good):
    write_hf(tmp_path / "hf", good[1], None)
    code, out, err = run("hf2native", tmp_path / "hf", tmp_path / "o", "--layout", "tile")
    assert (code, out, err) == (1, "", f"error: no config.json in {tmp_path / 'hf'}: "
                                       "is this a Hugging Face model folder?\n")


def test_error_unknown_names(tmp_path, good):
    _, t, cfg = good
    t["gpt_neox.layers.0.attention.mystery_gate.weight"] = torch.zeros(4, 4)
    write_hf(tmp_path / "hf", t, cfg)
    with pytest.raises(convert.ConversionError, match=r"mystery_gate\.weight: \(4, 4\)"):
        convert.hf_to_native(str(tmp_path / "hf"), "tile")


def test_error_missing_names(tmp_path, good):
    _, t, cfg = good
    del t["gpt_neox.layers.1.mlp.dense_4h_to_h.weight"], t["embed_out.weight"]
    write_hf(tmp_path / "hf", t, cfg)
    with pytest.raises(convert.ConversionError) as e:
        convert.hf_to_native(str(tmp_path / "hf"), "tile")
    assert "blocks.1.mlp.proj.weight: (32, 128)" in str(e.value) and "lm_head.weight: (256, 32)" in str(e.value)


def test_error_wrong_shapes(tmp_path, good):
    _, t, cfg = good
    write_hf(tmp_path / "hf", t, cfg | {"n_embd": 64, "d_model": 64})
    with pytest.raises(convert.ConversionError, match=r"gpt_neox.layers.0.attention.query_key_value.weight has shape "
                                                      r"\(96, 32\), expected first dim 3 \* 64"):
        convert.hf_to_native(str(tmp_path / "hf"), "tile")
    t["gpt_neox.layers.0.mlp.dense_h_to_4h.weight"] = torch.zeros(100, 32)
    write_hf(tmp_path / "hf2", t, cfg)
    with pytest.raises(convert.ConversionError,
                       match=r"blocks.0.mlp.fc.weight .*expected \(128, 32\), found \(100, 32\)"):

        convert.hf_to_native(str(tmp_path / "hf2"), "tile")


@pytest.mark.parametrize("fmt,shards,file", [("bin", 1, "pytorch_model.bin"),
                                             ("safetensors", 2, "model-00002-of-00002.safetensors")])
def test_error_truncated_weights(tmp_path, good, fmt, shards, file):
    write_hf(tmp_path / "hf", good[1], good[2], fmt, shards)
    path = tmp_path / "hf" / file
    path.write_bytes(path.read_bytes()[:-1000])
    code, out, err = run("hf2native", tmp_path / "hf", tmp_path / "o", "--layout", "tile")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(f"error: cannot read {path}: ") and err.endswith("(is the file truncated or corrupt?)\n")


def test_error_noncanonical_code(tmp_path, good):
    _, t, cfg = good
    t["gpt_neox.embed_in.weight"][[10, 20]] = t["gpt_neox.embed_in.weight"][[20, 10]]
    write_hf(tmp_path / "hf", t, cfg)
    with pytest.raises(convert.ConversionError) as e:
        convert.hf_to_native(str(tmp_path / "hf"), "tile")
    msg = str(e.value)
    assert "2 rows differ" in msg and "id 10: expected [0, 1, 0, 1, 0, 0, 0, 0], found [0, 0, 1, 0, 1, 0, 0, 0]" in msg


def test_error_affine_without_A_b(tmp_path):
    model = tiny("affine")
    t = {n: v for n, v in to_convention(model, "llama").items() if "input_code" not in n}
    write_hf(tmp_path / "hf", t, bvv_config(model))
    with pytest.raises(convert.ConversionError, match=r"(?s)never invented.*model\.norm\.weight: \(32,\)"):
        convert.hf_to_native(str(tmp_path / "hf"), "tile")


def test_error_affine_table_not_A_c_xor_b(tmp_path):
    model = tiny("affine")
    t = to_convention(model, "neox")
    code = torch.tensor([[(i >> k) & 1 for k in range(8)] for i in range(256)], dtype=torch.float32)
    t["gpt_neox.embed_in.weight"] = code  # the plain code, not the recoded one
    write_hf(tmp_path / "hf", t, bvv_config(model))
    with pytest.raises(convert.ConversionError, match="the stored 256 x 8 input table is not the affine code lifted"):
        convert.hf_to_native(str(tmp_path / "hf"), "tile")


def test_error_variant_mismatch(tmp_path):
    model = tiny("learned")
    cfg = bvv_config(model) | {"model_type": "model_n_embed_9_binary_n_layer_2"}
    write_hf(tmp_path / "hf", to_convention(model, "nanogpt"), cfg)
    with pytest.raises(convert.ConversionError, match="the stored 256 x 32 input table is not the binary code lifted"):
        convert.hf_to_native(str(tmp_path / "hf"), "tile")


def test_help():
    code, out, err = run("hf2native", "--help", real=True)
    assert code == 0 and "--layout {auto,tile,interleave}" in out and "--overwrite" in out
