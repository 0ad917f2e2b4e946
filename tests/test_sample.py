"""End-to-end tests of sample.py on tiny checkpoints written to tmp (tiktoken-native and HF-converted)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import sample
from bincode_gpt import prompts
from bincode_gpt.checkpoint import checkpoint_dict
from bincode_gpt.exits import run_main
from bincode_gpt.decode import Decoder, generate, stream
from bincode_gpt.tokenizer import load_text_codec, TiktokenText
from model import GPT, get_config
from tools import convert


def expected_text(model, ids, n, decode, eos, allowed=None):
    out = list(stream(model, torch.tensor([ids]), n, temperature=0, eos_token_id=eos, allowed=allowed))
    out = torch.cat(out, dim=1)[0].tolist() if out else []
    if eos in out:
        out = out[: out.index(eos)]
    return decode(out)


def test_greedy_matches_generate(native, capsys):
    model, folder, enc = native
    prompt = "Question: What is the capital of France?\nAnswer:"
    assert sample.main(["--ckpt", folder, "--prompt", prompt, "--temperature", "0", "--max_new_tokens", "12",
                        "--device", "cpu"]) == 0
    want = prompt + expected_text(model, enc.encode(prompt), 12, enc.decode, enc.eot_token) + "\n"
    assert capsys.readouterr().out == want


def test_compile_flag_prints_the_same_text(native, capsys):
    """--compile prints eager's text; a second run with another prompt length and --max_new_tokens, in the same
    size class of positions (decode.size_class: 64 here), compiles nothing new."""
    from torch._dynamo.utils import counters

    _, folder, _ = native
    runs = [["--temperature", "0", "--max_new_tokens", "12", "--num_samples", "2"],
            ["--temperature", "0", "--max_new_tokens", "30", "--prompt", "Once upon a time, there"]]
    graphs = []
    for run in runs:
        args = ["--ckpt", folder, "--device", "cpu", *run]
        assert sample.main(args) == 0
        eager = capsys.readouterr().out
        before = counters["stats"]["unique_graphs"]
        assert sample.main(args + ["--compile"]) == 0  # compiled once, used by both samples
        graphs.append(counters["stats"]["unique_graphs"] - before)
        assert capsys.readouterr().out == eager
    assert graphs[1] == 0 and graphs[0] <= 1  # (0 where a test before compiled this shape already)


def test_cuda_graphs_are_refused_where_they_cannot_run(native, capsys):
    _, folder, _ = native
    for flags, why in [(["--compile"], "needs a CUDA device (CUDA graphs record GPU kernels), and this run is on cpu"),
                       ([], "records the compiled one-token step (mode='reduce-overhead'): add --compile")]:
        assert run_main(sample.main, ["--ckpt", folder, "--device", "cpu", "--cuda_graphs", *flags]) == 1
        assert capsys.readouterr().err.startswith(f"error: --cuda_graphs {why}")


def test_sampling_is_seeded(native, capsys):
    _, folder, _ = native
    args = ["--ckpt", folder, "--prompt", "Hi", "--max_new_tokens", "8", "--top_k", "50", "--top_p", "0.9",
            "--num_samples", "2", "--seed", "3"]
    sample.main(args)
    first = capsys.readouterr().out
    sample.main(args)
    assert capsys.readouterr().out == first and first.count("---------------") == 2


def test_stream_yields_incrementally(native):
    model, _, enc = native
    codec = TiktokenText(enc)
    ids = enc.encode("Hello")
    pieces = list(sample.sample_stream(Decoder(model), codec, ids, 10, temperature=0))
    assert len(pieces) > 1 and "".join(pieces) == expected_text(model, ids, 10, enc.decode, enc.eot_token)


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        sample.main(["--help"])
    assert e.value.code == 0 and "--temperature" in capsys.readouterr().out


def char_tokenizer(folder):
    """A tiny code-point tokenizer in the release's style: specials first, then characters."""
    tokenizers = pytest.importorskip("tokenizers")
    chars = [chr(c) for c in range(32, 127)] + list("\néü日本")
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + chars)}
    tk = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = tokenizers.decoders.Fuse()
    tk.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>"])
    tk.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "bos_token": "<s>", "pad_token": "<pad>", "unk_token": "<unk>"}, f)
    return tk


def test_converted_hf_checkpoint_samples(tmp_path, capsys):
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    torch.manual_seed(1)
    model = GPT(get_config("tiny", vocab_size=128, pad_token_id=0)).eval()
    src = tmp_path / "release"
    src.mkdir()
    tk = char_tokenizer(str(src))
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
             "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    outside_blocks = {"embed.weight": "transformer.wte.weight", "ln_f.weight": "transformer.ln_f.weight"}
    tensors = {}
    for name, t in model.state_dict().items():
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            mod, kind = rest.rsplit(".", 1)
            name = f"transformer.h.{i}.{names[mod]}.{kind}"
        tensors[outside_blocks.get(name, name)] = t.clone()
    save_file(tensors, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({
        "model_type": "model_n_embed_7_binary_n_layer_2", "vocab_size": 128, "block_size": 32, "n_embd": 32,
        "d_model": 32, "n_layer": 2, "n_head": 2, "pad_id": 0, "pad_token_id": 0}))
    assert convert.main(["hf2native", str(src), str(tmp_path / "out"), "--layout", "tile"]) == 0
    capsys.readouterr()

    prompt = "Question: café 日本?\nAnswer:"
    sample.main(["--ckpt", str(tmp_path / "out"), "--prompt", prompt, "--temperature", "0", "--max_new_tokens", "15"])
    ids = tk.encode(prompt, add_special_tokens=False).ids
    assert tk.decode(ids) == prompt
    decode = lambda x: tk.decode(x, skip_special_tokens=False)  # noqa: E731
    # the model's 128 ids outnumber the tokenizer's 105: the other 23 are never drawn
    allowed = torch.arange(128) < tk.get_vocab_size(with_added_tokens=True)
    want = expected_text(model, ids, 15, decode, tk.token_to_id("</s>"), allowed)
    assert capsys.readouterr().out == prompt + want + "\n"
    # with no prompt, a converted release continues its model card's prompt
    sample.main(["--ckpt", str(tmp_path / "out"), "--temperature", "0", "--max_new_tokens", "15"])
    card = "Question: What is the capital of France?\nAnswer:"
    ids = tk.encode(card, add_special_tokens=False).ids[-32:]  # one token a character; the context is 32
    out = capsys.readouterr()
    assert prompts.CARD_PROMPT == card and "keeping its last 32" in out.err
    assert out.out == card[-32:] + expected_text(model, ids, 15, decode, tk.token_to_id("</s>"), allowed) + "\n"


# ----- bad input through the real command line: one `error:` line, exit 1, no traceback -----------


def run_sample(*args, cwd=None):
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample.py")
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_bad_input_ends_in_one_error_line(native, tmp_path, capsys):
    _, folder, _ = native
    corrupt = tmp_path / "corrupt.pt"
    with open(os.path.join(folder, "ckpt.pt"), "rb") as f:
        corrupt.write_bytes(f.read()[:5000])  # a truncated copy
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait".encode("latin-1"))
    no_gpu = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"  # never usable here
    cases = [
        (["--ckpt", str(tmp_path / "none")], f"error: {tmp_path / 'none'}: no checkpoint there"),
        (["--ckpt", str(corrupt)], f"error: {corrupt}: cannot read this checkpoint, truncated or not a PyTorch file"),
        (["--ckpt", folder, "--top_p", "0"], "error: --top_p must be in (0, 1], got 0.0"),
        (["--ckpt", folder, "--temperature", "nan"],
         "error: --temperature must be a number >= 0 (0 = greedy), got nan"),
        (["--ckpt", folder, "--device", no_gpu], f"error: device '{no_gpu}' asked for, but"),
        (["--ckpt", folder, "--prompt_file", str(tmp_path / "missing.txt")],
         f"error: {tmp_path / 'missing.txt'}: cannot read the prompt file (No such file or directory)"),
        (["--ckpt", folder, "--prompt_file", str(latin1)],
         f"error: {latin1}: not valid UTF-8 at byte offset 3: it looks like 8-bit text, Latin-1 or Windows-1252: "
         "convert it to UTF-8"),
    ]
    r = run_sample(*cases[0][0])  # the command line itself, once (a subprocess costs seconds)
    assert r.returncode == 1 and r.stdout == "" and r.stderr == cases[0][1] + "\n"
    for args, message in cases:  # the rest through main's wrapper, as `python sample.py` runs it
        assert run_main(sample.main, args) == 1, args
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and out.err.startswith(message), (args, out.err)


def test_nonfinite_weights_are_refused_naming_the_tensor(native, tmp_path):
    model, _, _ = native
    state = checkpoint_dict(model, {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": None})
    state["model"] = {k: v.clone() for k, v in state["model"].items()}
    state["model"]["blocks.1.mlp.proj.weight"][3, 5] = float("nan")
    torch.save(state, tmp_path / "ckpt.pt")
    r = run_sample("--ckpt", str(tmp_path), "--temperature", "0", "--device", "cpu")
    assert (r.returncode, r.stdout) == (1, "")  # not "hi!!!!!!!!"
    assert r.stderr == (f"error: {tmp_path} holds NaN or inf values in blocks.1.mlp.proj.weight: refusing to "
                        "sample from a diverged or corrupt checkpoint\n")


def test_sizes_that_cannot_fit_are_refused_up_front(native, tmp_path, capsys):
    """A generation or a model_config bigger than the machine: one line with the number, at once (no
    allocator error, no hour building a billion blocks); a prompt file too: tests/test_prompts.py."""
    model, folder, _ = native
    r = run_sample("--ckpt", folder, "--device", "cpu", "--max_new_tokens", "1000000000")
    assert (r.returncode, r.stdout) == (1, "")
    # the rotary tables of the size class, 2**30 positions x 32 bytes x head_dim 16: 512 GiB
    assert re.fullmatch(r"error: prompt \+ --max_new_tokens = 1,000,000,001 positions need 512\.0 GiB for the "
                        r"KV cache and rotary tables, but [\d,.]+ GiB is free on cpu: ask for fewer tokens\n",
                        r.stderr), r.stderr
    for name, value, message in [
        ("n_layer", 10**9, "its model_config says n_layer 1,000,000,000, but its weights hold 2 blocks: missing "
                    r"blocks.2.ln_1.weight \(and 5 more missing\)"),
        ("block_size", 10**12, r"its model_config \(block_size 1,000,000,000,000, vocab_size 50,304, n_embd 32\) needs "
                               r"476,837\.2 GiB of tables besides its weights; [\d,.]+ GiB is free")]:
        state = checkpoint_dict(model, {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": None})
        state["model_config"][name] = value
        torch.save(state, tmp_path / "big.pt")
        assert run_main(sample.main, ["--ckpt", str(tmp_path / "big.pt"), "--device", "cpu"]) == 1
        out = capsys.readouterr()
        big = re.escape(str(tmp_path / "big.pt"))
        assert out.out == "" and re.fullmatch(rf"error: {big}: {message}\n", out.err), out.err


def test_weights_saved_from_a_compiled_ddp_model_sample_the_same_text(native, tmp_path, capsys):
    _, folder, _ = native
    ckpt = torch.load(os.path.join(folder, "ckpt.pt"), weights_only=True)
    ckpt["model"] = {f"module._orig_mod.{k}": t for k, t in ckpt["model"].items()}  # DDP(torch.compile(model))'s
    torch.save(ckpt, tmp_path / "ckpt.pt")
    args = ["--prompt", "The", "--temperature", "0", "--max_new_tokens", "8", "--device", "cpu"]
    assert run_main(sample.main, ["--ckpt", folder, *args]) == 0
    plain = capsys.readouterr()
    assert run_main(sample.main, ["--ckpt", str(tmp_path / "ckpt.pt"), *args]) == 0
    out = capsys.readouterr()
    assert out.out == plain.out and len(plain.out) > len("The\n")
    assert out.err == (f"note: {tmp_path / 'ckpt.pt'}: its weights were saved from a wrapped model (torch.compile, "
                       f"DDP): read without their 'module.' and '_orig_mod.' prefixes\n{plain.err}")


def test_no_arguments_samples_what_train_py_just_wrote(native, tmp_path):
    """train.py's default out_dir is `out`: `python sample.py` alone must sample out/ckpt.pt. With no
    prompt, a native checkpoint starts a new document: from the end-of-text token, nothing printed before."""
    model, folder, enc = native
    (tmp_path / "out").mkdir()
    with open(os.path.join(folder, "ckpt.pt"), "rb") as f:
        (tmp_path / "out" / "ckpt.pt").write_bytes(f.read())
    r = run_sample("--temperature", "0", "--max_new_tokens", "5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected_text(model, [enc.eot_token], 5, enc.decode, enc.eot_token) + "\n"


@pytest.fixture
def hf_ckpt(tmp_path):
    """A tiny checkpoint in tmp_path/run whose tokenizer entry names `file` (set by the test)."""
    def make(name):
        torch.manual_seed(0)
        model = GPT(get_config("tiny", vocab_size=128)).eval()
        (tmp_path / "run").mkdir(exist_ok=True)
        torch.save(checkpoint_dict(model, {"kind": "hf", "file": name}), tmp_path / "run" / "ckpt.pt")
        return str(tmp_path / "run")
    return make


@pytest.mark.parametrize("name", ["../tokenizer.json", "/etc/passwd", "../../../../etc/passwd", "sub/tokenizer.json",
                                  ".."])
def test_tokenizer_path_stays_in_checkpoint_folder(hf_ckpt, tmp_path, capsys, name):
    """A path from a checkpoint never leaves its folder, even when a valid tokenizer waits outside it."""
    folder = hf_ckpt(name)
    char_tokenizer(str(tmp_path))  # tmp_path/tokenizer.json is readable: only the check keeps it out
    assert run_main(sample.main, ["--ckpt", folder, "--max_new_tokens", "1", "--device", "cpu"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"error: {folder}: the tokenizer entry names {name!r}, which is not a file "
                                         f"name inside {folder}: refused\n")


@pytest.mark.parametrize("data", [b"{bad json", b"", b"[1, 2]", b"\x00\xff" * 10])
def test_corrupt_tokenizer_json_is_one_error_line(hf_ckpt, capsys, data):
    pytest.importorskip("tokenizers")
    folder = hf_ckpt("tokenizer.json")
    with open(os.path.join(folder, "tokenizer.json"), "wb") as f:
        f.write(data)
    assert run_main(sample.main, ["--ckpt", folder, "--max_new_tokens", "1", "--device", "cpu"]) == 1
    out = capsys.readouterr()
    path = os.path.join(folder, "tokenizer.json")
    assert (out.out == "" and out.err.startswith(f"error: {path}: not a readable tokenizer.json (")
            and out.err.count("\n") == 1)


def test_corrupt_tokenizer_config_is_one_error_line(hf_ckpt, capsys):
    folder = hf_ckpt("tokenizer.json")
    char_tokenizer(folder)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        f.write("{not json")
    assert run_main(sample.main, ["--ckpt", folder, "--max_new_tokens", "1", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    path = os.path.join(folder, "tokenizer_config.json")
    assert err.startswith(f"error: {path}: not valid JSON (") and err.count("\n") == 1


# ----- issue 25: a vocabulary wider than its tokenizer, extreme settings, a closed pipe ----------
def padded(tmp_path, vocab_size, tokenizer, hot):
    """A tiny model over `vocab_size` ids whose output head favours the ids in `hot` by far (ids its tokenizer
    cannot decode), saved with `tokenizer`: unmasked, every greedy token would be one of them."""
    torch.manual_seed(0)
    model = GPT(get_config("tiny", vocab_size=vocab_size)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(0.01)
        model.lm_head.weight[hot] *= 1e4
    torch.save(checkpoint_dict(model, tokenizer), tmp_path / "ckpt.pt")
    return model, str(tmp_path / "ckpt.pt")


@pytest.mark.parametrize("encoding, vocab_size, model_vocab", [("gpt2", 512, 2048), ("cl100k_base", None, 100277)])
def test_ids_the_tokenizer_cannot_decode_are_never_drawn(tmp_path, capsys, encoding, vocab_size, model_vocab):
    """train.py --vocab_size 2048 on 512-token data (the paper's 65,536 over GPT-2), and the gaps of an uncut
    cl100k_base (ids 100,261-100,275 decode to nothing): greedy, hot and near-zero temperatures draw only
    ids the tokenizer decodes."""
    codec = load_text_codec({"tokenizer": {"kind": "tiktoken", "encoding": encoding, "vocab_size": vocab_size}}, "x")
    decodable = torch.zeros(model_vocab, dtype=torch.bool)
    decodable[[i for i in codec.token_ids() if i < model_vocab]] = True
    assert not decodable.all()
    model, ckpt = padded(tmp_path, model_vocab, {"kind": "tiktoken", "encoding": encoding, "vocab_size": vocab_size},
                         ~decodable)
    ids = codec.encode("ROMEO:")
    # the test's teeth: unmasked, the greedy pick is an id outside the tokenizer
    assert int(generate(model, torch.tensor([ids]), 1, temperature=0)[0, -1]) not in codec.token_ids()
    greedy = "ROMEO:" + expected_text(model, ids, 20, codec.decode, codec.eos_token_id, decodable.clone()) + "\n"
    for temperature in ("0", "1e-45", "1e-30"):  # below 1.2e-38 greedy by definition; 1e-30 divides without inf - inf
        argv = ["--ckpt", ckpt, "--prompt", "ROMEO:", "--max_new_tokens", "20", "--temperature", temperature]
        assert run_main(sample.main, argv) == 0
        assert capsys.readouterr() == (greedy, "")
    for argv in (["--temperature", "2"], ["--temperature", "1e300"], ["--top_p", "1e-300"], ["--top_k", "1000000"]):
        assert run_main(sample.main, ["--ckpt", ckpt, *argv, "--num_samples", "3", "--max_new_tokens", "30"]) == 0
        out = capsys.readouterr()
        assert out.err == "" and out.out.count("---------------\n") == 3


def test_a_reader_that_closes_the_pipe_is_not_an_error(native):
    """python sample.py ... | head -c 20: quiet, exit 0, as cat and python -c users expect."""
    _, folder, _ = native
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample.py")
    p = subprocess.Popen([sys.executable, script, "--ckpt", folder, "--max_new_tokens", "100000", "--num_samples", "50",
                          "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(p.stdout.read(20)) == 20
    p.stdout.close()  # head has had enough
    assert p.wait(timeout=300) == 0 and p.stderr.read() == b""
