"""A full disk at any write leaves either everything or nothing a command wrote (issue 35), for every writer of more
than one file: convert (native2hf, native2int8, hf2native), prepare_data, train (ckpt.pt, best.pt, log.jsonl) and
the studies' results (compare, scaling and share share compare.write_results). Each command line runs in this
process with one system call (os.fsync: a file's data meets the disk; os.replace: a file or a staged folder is moved
in; os.mkdir: a staging folder; os.write: a log line) failing with ENOSPC at its k-th call, for every k until the
command succeeds: each failure is one line saying the disk is full, and leaves the output folder byte for byte as it
was; the success leaves exactly what a run without faults writes."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import prepare_data
import train
from bincode_gpt.checkpoint import checkpoint_dict
from bincode_gpt.exits import run_main
from bincode_gpt.files import LOCK_NAME
from model import GPT, get_config
from tools import compare, convert

CALLS = ("fsync", "replace", "mkdir")
TIKTOKEN_512 = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512, "reserve_zero": True, "reserve_ones": True}


def tree(folder):
    """{relative path: bytes} of every file under `folder` but the writer lock (it holds the last writer's pid)."""
    folder = Path(folder)
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def fail_at(monkeypatch, name, k, under=None):
    """os.<name> raises ENOSPC at its k-th call from now on (the others run; with `under`, only calls that make a
    folder there count: tiktoken's cache makes its own, makedirs tries folders that exist); -> the calls counted."""
    real, calls = getattr(os, name), []

    def full(*args, **kwargs):
        if under is not None and (not os.path.abspath(args[0]).startswith(str(under)) or os.path.lexists(args[0])):
            return real(*args, **kwargs)
        calls.append(args)
        if len(calls) == k:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, full)
    return calls


def sweep(monkeypatch, capsys, main, argv, out, name, *, check_failure=None):
    """Run main(argv) with os.<name> failing at call 1, 2, ... until it succeeds; each failure leaves `out` as it was
    (or as check_failure says). -> the failures seen."""
    before, k = tree(out), 0
    while True:
        k += 1
        calls = fail_at(monkeypatch, name, k, out if name == "mkdir" else None)
        rc = run_main(main, [str(a) for a in argv])
        monkeypatch.undo()
        err = capsys.readouterr().err
        if len(calls) < k:  # the fault never came: the command ran through
            assert rc == 0, err
            return k - 1
        assert (rc, err.count("\n"), err.startswith("error: ")) == (1, 1, True), (name, k, err)
        assert "the disk is full" in err, (name, k, err)
        if check_failure:
            check_failure(name, k)
        else:
            assert tree(out) == before, (name, k, err)


def saved(folder, model, tokenizer=TIKTOKEN_512):
    os.makedirs(folder, exist_ok=True)
    torch.save(checkpoint_dict(model, tokenizer), os.path.join(folder, "ckpt.pt"))
    return folder


def tiny(seed, input="binary"):
    torch.manual_seed(seed)
    return GPT(get_config("tiny", input=input))


# ----------------------------------------------------------------------------- convert
@pytest.mark.parametrize("name", CALLS)
def test_convert_writes_all_its_files_or_none(tmp_path, monkeypatch, capsys, name):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    saved(tmp_path / "src", tiny(0, "affine")), saved(tmp_path / "old", tiny(1))
    # native2hf: 6 files; hf2native: ckpt.pt and 2 tokenizer files; native2int8 of that: the same 3
    for command, first, out in (("native2hf", "src", "hf"), ("hf2native", "hf", "back"),
                                ("native2int8", "back", "int8")):
        clean = tmp_path / f"clean-{command}"
        assert run_main(convert.main, [command, str(tmp_path / first), str(clean)]) == 0
        # out holds the same conversion of another model, to be replaced
        assert run_main(convert.main, [command, str(tmp_path / f"old-{first}".replace("old-src", "old")),
                                       str(tmp_path / f"old-{out}")]) == 0
        first, out = tmp_path / first, tmp_path / out
        shutil.copytree(tmp_path / f"old-{out.name}", out)
        capsys.readouterr()
        failures = sweep(monkeypatch, capsys, convert.main, [command, first, out, "--overwrite"], out, name)
        files = len(tree(clean))
        # each file is synced once and renamed twice (into the staging folder, then in), old files are moved aside;
        # the staging folder is made
        assert {"fsync": failures == files, "replace": failures > 2 * files, "mkdir": failures == 1}[name], failures
        assert tree(out) == tree(clean), command


def test_convert_into_a_new_folder_leaves_no_folder(tmp_path, monkeypatch, capsys):
    src = saved(tmp_path / "src", tiny(0))
    for name in CALLS:
        out = tmp_path / f"int8-{name}"
        sweep(monkeypatch, capsys, convert.main, ["native2int8", src, out], out, name)


# ----------------------------------------------------------------------------- prepare_data
def words(n, seed):
    return "\n".join(f"line {i} of {seed}: the king and the queen walk over the hill" for i in range(n)) + "\n"


@pytest.mark.parametrize("name", CALLS)
def test_prepare_data_replaces_all_its_files_or_none(tmp_path, monkeypatch, capsys, name):
    (tmp_path / "old.txt").write_text(words(300, 0))
    (tmp_path / "new.txt").write_text(words(500, 1))
    argv = ["--vocab_size", "512", "--workers", "1", "--shard_tokens", "2000"]
    out, clean = tmp_path / "out", tmp_path / "clean"
    assert run_main(prepare_data.main, [str(tmp_path / "old.txt"), "--out", str(out), *argv]) == 0
    assert run_main(prepare_data.main, [str(tmp_path / "new.txt"), "--out", str(clean), *argv]) == 0
    capsys.readouterr()
    failures = sweep(monkeypatch, capsys, prepare_data.main, [tmp_path / "new.txt", "--out", out, *argv, "--overwrite"],
                     out, name)
    assert failures >= (1 if name == "mkdir" else 4)
    assert tree(out) == tree(clean) and len(tree(out)) > 3


# ----------------------------------------------------------------------------- train
def run_flags(data, out, **kw):
    settings = dict(data_dir=data, out_dir=out, preset="tiny", block_size=32, batch_size=4, max_steps=4,
                    warmup_steps=1, eval_interval=2, eval_steps=1, save_interval=2, device="cpu", seed=3, **kw)
    return [f"--{k}={v}" for k, v in settings.items()]


@pytest.mark.parametrize("name", ["fsync", "replace", "write"])
def test_training_keeps_whole_files_and_resumes_to_the_same_weights(tiny_data, tmp_path, monkeypatch, capsys, name):
    """A full disk at a save of ckpt.pt or best.pt, or at a line of log.jsonl: the run stops with one line, every file
    in out_dir is whole (no temp file, each checkpoint loads, each log line parses), and --resume from what is left
    ends with the weights of a run the disk never stopped."""
    assert run_main(train.main, run_flags(tiny_data, tmp_path / "clean")) == 0
    want = torch.load(tmp_path / "clean" / "ckpt.pt", weights_only=True)["model"]

    def whole_and_resumable(name, k):
        out = tmp_path / f"run{k}"
        assert sorted(p.name for p in out.iterdir() if p.name not in ("ckpt.pt", "best.pt")) == [LOCK_NAME, "log.jsonl"]
        [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        for f in ("ckpt.pt", "best.pt"):
            if (out / f).exists():
                torch.load(out / f, weights_only=True)
        again = ["--resume"] if (out / "ckpt.pt").exists() else ["--overwrite"]
        assert run_main(train.main, run_flags(tiny_data, out) + again) == 0
        got = torch.load(out / "ckpt.pt", weights_only=True)["model"]
        assert all(torch.equal(got[n], t) for n, t in want.items()), (name, k)

    ks = {"fsync": [1, 2, 3, 4], "replace": [1, 4], "write": [1, 6]}[name]  # saves: best 2, ckpt 2, best 4, ckpt 4
    for k in ks:
        out = tmp_path / f"run{k}"
        calls = fail_at(monkeypatch, name, k)
        rc = run_main(train.main, run_flags(tiny_data, out))
        monkeypatch.undo()
        err = capsys.readouterr().err
        assert len(calls) >= k and (rc, err.count("\n")) == (1, 1) and "the disk is full" in err, (k, err)
        if name == "write":
            assert err.startswith(f"error: {out / 'log.jsonl'}: a line not written (the disk is full: "), err
        whole_and_resumable(name, k)
        capsys.readouterr()


# ----------------------------------------------------------------------------- the studies' results
@pytest.mark.parametrize("name", CALLS)
def test_study_results_are_replaced_all_or_none(tiny_data, tmp_path, monkeypatch, capsys, name):
    """compare.write_results (compare, scaling and share write through it): results.md, results.json and the figure
    of the earlier study stay together, or all three are the new ones."""
    argv = ["--data", tiny_data, "--out", str(tmp_path), "--variants", "binary", "--preset", "tiny", "--n_layer", "1",
            "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "4", "--steps", "2", "--evals",
            "1", "--eval_batches", "1", "--seeds", "1", "--device", "cpu"]
    assert run_main(compare.main, argv) == 0
    results = {f: (tmp_path / f).read_bytes() for f in ("results.md", "results.json", "val_loss.png")
               if (tmp_path / f).exists()}
    old = {"results.md": b"the earlier report\n", "results.json": b'{"rows": [], "runs": []}',
           "val_loss.png": b"the earlier figure"}
    for f, data in old.items():
        (tmp_path / f).write_bytes(data)
    capsys.readouterr()

    def kept(name, k):
        assert {f: (tmp_path / f).read_bytes() for f in old} == old, (name, k)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".staging")]

    failures = sweep(monkeypatch, capsys, compare.main, argv, tmp_path, name, check_failure=kept)
    assert failures >= (1 if name == "mkdir" else 2)
    assert {f: (tmp_path / f).read_bytes() for f in results} == results
