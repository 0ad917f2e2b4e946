"""bincode_gpt/prompts.py through sample.py: a prompt from text or a file to checked token ids (NULs dropped, a long
one cropped, a byte-order mark not prompt, contradicting flags and files that are not text refused, a start token
the model reads as a constant named)."""

import os

import torch

import sample
from bincode_gpt.checkpoint import checkpoint_dict
from bincode_gpt.exits import run_main
from bincode_gpt.prompts import prompt_ids
from bincode_gpt.tokenizer import load_text_codec
from model import GPT, get_config
from test_sample import expected_text


def test_long_prompt_is_cropped(native, capsys, tmp_path):
    _, folder, _ = native
    (tmp_path / "p.txt").write_text("to be or not to be " * 40, encoding="utf-8")
    sample.main(["--ckpt", folder, "--prompt_file", str(tmp_path / "p.txt"), "--max_new_tokens", "3",
                 "--temperature", "0"])
    err = capsys.readouterr().err
    assert "longer than the context (32)" in err and "last 32" in err


def test_a_prompt_never_feeds_a_nul_and_is_read_in_utf16(native, tmp_path, capsys):
    """NUL's id is 0 (the all-zero code, reserve_zero): dropped from a prompt as prepare_data.py drops it from
    text, with a note. A prompt file is read as prepare_data.py reads text: UTF-16 with its mark too."""
    codec = load_text_codec({"tokenizer": {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512,
                                           "reserve_zero": True}}, "new.pt")
    assert codec.encode("\0") == [0]
    ids, shown = prompt_ids(codec, "\0ROMEO:\0 hi\0", 64)
    assert (ids, shown) == (codec.encode("ROMEO: hi"), "ROMEO: hi") and 0 not in ids
    assert capsys.readouterr().err == ("note: dropped 3 NUL characters (U+0000) from the prompt, as prepare_data.py "
                                       "drops them from the text models train on\n")
    model, folder, enc = native
    prompt = tmp_path / "p.txt"
    prompt.write_bytes("ROMEO:\0".encode("utf-16"))  # with its byte-order mark, as Windows tools write it
    assert run_main(sample.main, ["--ckpt", folder, "--prompt_file", str(prompt), "--temperature", "0",
                                  "--max_new_tokens", "3"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("ROMEO:") and out.err.startswith("note: dropped 1 NUL character")


def test_prompt_flags_that_contradict_are_refused_and_a_bom_is_not_prompt(native, tmp_path, capsys):
    model, folder, enc = native
    prompt = tmp_path / "p.txt"
    prompt.write_bytes("\ufeffROMEO:".encode("utf-8"))  # Notepad's UTF-8
    assert run_main(sample.main, ["--ckpt", folder, "--prompt_file", str(prompt), "--temperature", "0",
                                  "--max_new_tokens", "5"]) == 0
    want = "ROMEO:" + expected_text(model, enc.encode("ROMEO:"), 5, enc.decode, enc.eot_token,
                                    torch.arange(50304) < enc.n_vocab) + "\n"
    assert capsys.readouterr() == (want, "")
    for argv, message in [(["--prompt", "x", "--prompt_file", str(prompt)],
                           "--prompt and --prompt_file both give the prompt: pass one of them"),
                          (["--prompt_file", ""], "--prompt_file is '' (empty): name a file"),
                          (["--ckpt", ""], "--ckpt is '' (empty): name a file")]:
        assert run_main(sample.main, ["--ckpt", folder, *argv]) == 1
        assert capsys.readouterr() == ("", f"error: {message}\n")


def test_a_start_token_with_a_constant_input_is_named_once(tmp_path, capsys):
    """A checkpoint trained on data prepared before end-of-text left the all-ones code (no reserve_ones in
    its tokenizer entry, end-of-text = 511 at V = 512) starts an unprompted sample from a constant input,
    after which its logits are exactly 0 whatever the weights: sample.py says so once, on stderr. Today's
    default (end-of-text = 187) and a prompt: nothing to say."""
    torch.manual_seed(0)
    model = GPT(get_config("tiny")).eval()
    assert torch.equal(model(torch.tensor([[511]]))[0], torch.zeros(1, 1, 512))
    old = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512, "reserve_zero": True}
    for name, entry in (("old", old), ("new", {**old, "reserve_ones": True})):
        (tmp_path / name).mkdir()
        torch.save(checkpoint_dict(model, entry), tmp_path / name / "ckpt.pt")
    args = ["--max_new_tokens", "3", "--num_samples", "2", "--device", "cpu"]
    assert sample.main(["--ckpt", str(tmp_path / "old"), *args]) == 0
    assert capsys.readouterr().err == (
        "note: the start token 511 (end-of-text) enters this model (no biases, binary input) as a constant vector: the "
        "logits after it are exactly 0, so a sample from it alone draws its first token uniformly (greedy: id 0). Give "
        "a --prompt, or train on data prepared with today's defaults (docs/zero-code.md)\n")
    assert sample.main(["--ckpt", str(tmp_path / "old"), "--prompt", "Dear", *args]) == 0
    assert sample.main(["--ckpt", str(tmp_path / "new"), *args]) == 0
    assert capsys.readouterr().err == ""


def test_a_prompt_file_that_is_not_text_or_too_big_is_refused(native, tmp_path, capsys):
    """A prompt file bigger than the machine, or one that is no file of text: one line, at once (no MemoryError,
    no read of /dev/zero until memory runs out)."""
    _, folder, _ = native
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "huge.txt").touch()
    os.truncate(tmp_path / "huge.txt", 17 * 2**20)  # sparse: no disk used
    (tmp_path / "zero").symlink_to("/dev/zero")
    for path, what in [("/dev/zero", "is not a regular file (a device, FIFO or socket): give a text file"),
                       (tmp_path / "zero", "is not a regular file (a device, FIFO or socket): give a text file"),
                       (tmp_path / "fifo", "is not a regular file (a device, FIFO or socket): give a text file"),
                       (tmp_path, "is a folder: give a text file"),
                       (tmp_path / "huge.txt", "is 17,825,792 bytes, over the 16,777,216-byte limit (a prompt keeps "
                                               "only its last block_size tokens)")]:
        assert run_main(sample.main, ["--ckpt", folder, "--device", "cpu", "--prompt_file", str(path)]) == 1
        assert capsys.readouterr() == ("", f"error: {path}: the prompt file {what}\n")
