"""One case per class of issue 9 (bad input, malformed file, refused replacement, path traversal, unknown
option, interruption) through the scripts' real command lines: main() under common.run_main exactly as
`python X.py` runs it, a few as subprocesses. Each asserts the exact `error:` line, or the bytes that
must survive. The full hostile pass (~100 cases) is kept outside the repository; these are its cheap
representatives."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import prepare_data
import train
from common import LOCK_NAME, run_main
from tools import bench, compare, convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's


def run(main, argv, capsys):
    """(exit code, stdout, stderr) of `python X.py *argv`, in-process."""
    code = run_main(main, argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def script(*args, **kw):
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kw)


def tree(folder):
    """{relative path: bytes} of every file under folder, but the writer lock's (it holds the last writer's pid)."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files if f != LOCK_NAME}


def test_malformed_meta_json_is_one_line(tiny_data, tmp_path, capsys):
    data = shutil.copytree(tiny_data, tmp_path / "data")
    (data / "meta.json").write_text("[1, 2]")
    code, out, err = run(train.main, ["--data_dir", str(data), "--out_dir", str(tmp_path / "out"), "--device", "cpu"], capsys)
    assert (code, out) == (1, "")
    assert err == (f'error: {data / "meta.json"}: malformed: needs a positive vocab_size, an encoding and splits '
                   '{"train": {"shards": [file names], "tokens": N}, ...}; prepare the folder again\n')
    assert not (tmp_path / "out").exists()


def test_bogus_device_is_one_line(tiny_data, tmp_path, capsys):
    code, out, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(tmp_path), "--device", "bogus"], capsys)
    assert (code, out, err) == (1, "", "error: unknown device 'bogus': use auto, cpu, cuda, cuda:N or mps\n")


def test_unknown_option_value_is_refused_not_ignored(capsys):
    code, out, err = run(bench.main, ["--sections", "train,bogus"], capsys)  # once measured nothing and exited 0
    assert (code, out, err) == (1, "", "error: unknown section(s) bogus: choose from train,sample,load,prep\n")
    code, out, err = run(compare.main, ["--seeds", "0"], capsys)
    assert (code, out, err) == (1, "", "error: --seeds must be at least 1, got 0\n")


def test_bad_input_leaves_prepared_data_byte_for_byte(tiny_data, tmp_path, capsys):
    data = shutil.copytree(tiny_data, tmp_path / "data")
    before = tree(data)
    text = tmp_path / "ok.txt"
    text.write_text("fine text\n" * 50)
    missing = tmp_path / "missing.txt"
    code, out, err = run(prepare_data.main, [str(text), str(missing), "--out", str(data), "--overwrite", "--workers", "1"], capsys)
    assert (code, out) == (1, "")
    assert err == f"error: {missing}: no such file or folder (named inputs: shakespeare, fineweb-edu, cosmopedia, hf:REPO[:CONFIG])\n"
    assert tree(data) == before


def test_no_command_replaces_a_checkpoint_it_did_not_create(tiny_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ckpt.pt").write_bytes(b"a resumable checkpoint, step 60")
    (run_dir / "log.jsonl").write_text("{}\n")
    before = tree(run_dir)
    code, out, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(run_dir), "--device", "cpu"], capsys)
    assert (code, out, err) == (1, "", f"error: {run_dir / 'ckpt.pt'} exists: continue that run with --resume, or start "
                                       "afresh and replace it with --overwrite\n")
    code, out, err = run(convert.main, ["hf2native", str(tmp_path / "release"), str(run_dir)], capsys)
    assert (code, out, err) == (1, "", f"error: {run_dir} is not empty (it holds ckpt.pt, log.jsonl): pass --overwrite to "
                                       "replace its model and tokenizer files (other files are kept)\n")
    assert tree(run_dir) == before


def test_paths_from_a_config_stay_in_its_folder(tmp_path, capsys):
    release = tmp_path / "release"
    release.mkdir()
    (release / "config.json").write_text('{"vocab_size": 512, "n_embd": 32, "n_layer": 2, "n_head": 2, "block_size": 32}')
    (release / "model.safetensors.index.json").write_text('{"weight_map": {"x": "../../../../etc/passwd"}}')
    code, out, err = run(convert.main, ["hf2native", str(release), str(tmp_path / "out")], capsys)
    assert (code, out, err) == (1, "", "note: config.json gives no RoPE base; assuming 10000 (not confirmed for the release)\n"
                                       "error: model.safetensors.index.json names '../../../../etc/passwd', which is not a "
                                       f"file name inside {release}: refused\n")
    assert not (tmp_path / "out").exists()


def test_garbage_config_json_is_one_line(tmp_path, capsys):
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "config.json").write_text("{garbage")
    code, out, err = run(convert.main, ["hf2native", str(tmp_path / "release"), str(tmp_path / "out")], capsys)
    assert (code, out, err) == (1, "", f"error: {tmp_path / 'release' / 'config.json'} is not valid JSON (Expecting property name "
                                       "enclosed in double quotes: line 1 column 2 (char 1))\n")


def test_command_lines_print_one_line_and_exit_1(tmp_path):
    """The scripts' __main__ wiring: no traceback, nothing on stdout."""
    missing = tmp_path / "missing.txt"
    p = script("prepare_data.py", str(missing), "--out", str(tmp_path / "d"))
    out, err = p.communicate(timeout=120)
    assert (p.returncode, out) == (1, "")
    assert err == f"error: {missing}: no such file or folder (named inputs: shakespeare, fineweb-edu, cosmopedia, hf:REPO[:CONFIG])\n"
    p = script("train.py", "--device", "cuda:99", "--data_dir", str(tmp_path))
    out, err = p.communicate(timeout=300)
    assert (p.returncode, out) == (1, "") and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_sigterm_mid_prepare_keeps_old_data(tiny_data, tmp_path):
    """SIGTERM while the workers encode: exit 130, one line, the old shards byte for byte, no staging left."""
    shakespeare = os.path.join(os.path.dirname(ROOT), "shared", "data", "tinyshakespeare.txt")
    text = open(shakespeare).read() if os.path.isfile(shakespeare) else "the quick brown fox jumps over the lazy dog\n" * 25_000
    big = tmp_path / "big.txt"
    big.write_text(text * 10)
    data = shutil.copytree(tiny_data, tmp_path / "data")
    before = tree(data)
    p = script("prepare_data.py", str(big), "--out", str(data), "--overwrite", "--workers", "2")
    t = time.time()
    while not (data / ".partial").exists() and p.poll() is None and time.time() - t < 120:
        time.sleep(0.02)
    assert p.poll() is None, "prepare_data.py finished before the signal: make the input bigger"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, "interrupted\n"), err
    assert tree(data) == before and not (data / ".partial").exists()


def test_a_failed_torch_save_keeps_the_old_file(tmp_path, monkeypatch):
    """torch reports a full disk as RuntimeError ('unexpected pos ...'): it becomes an OSError, the old bytes stay."""
    import torch

    from checkpoint import atomic_torch_save

    path = tmp_path / "ckpt.pt"
    atomic_torch_save({"step": 1}, path)
    before = path.read_bytes()

    def full_disk(obj, f):
        f.write(b"half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 100544 vs 100432")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=r"write failed \(.*unexpected pos .*\): '.*ckpt.pt'"):
        atomic_torch_save({"step": 2}, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.pt"]


def test_an_unreadable_checkpoint_is_one_plain_line(tmp_path, capsys):
    """weights_only refuses a pickled object with a many-line, colour-coded message: we print one plain line."""
    import datetime

    import torch

    import sample

    path = tmp_path / "ckpt.pt"
    torch.save({"model": {}, "model_config": {}, "extra": datetime.date(2026, 11, 30)}, path)
    assert run_main(sample.main, ["--ckpt", str(path), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b[" not in err and err.startswith(f"error: {path}: cannot read this checkpoint")


@pytest.mark.parametrize("value, traceback", [("0", False), ("false", False), ("", False), ("1", True), ("yes", True)])
def test_traceback_env_turns_tracebacks_on_only_when_true(tmp_path, value, traceback):
    missing = tmp_path / "missing.txt"
    p = script("prepare_data.py", str(missing), "--out", str(tmp_path / "d"), env={**os.environ, "TRACEBACK": value})
    out, err = p.communicate(timeout=120)
    assert (p.returncode, out) == (1, "")
    if traceback:
        assert err.startswith("Traceback (most recent call last):") and err.endswith(f"ValueError: {missing}: no such file "
                                                                                     "or folder (named inputs: shakespeare, "
                                                                                     "fineweb-edu, cosmopedia, hf:REPO[:CONFIG])\n")
    else:
        assert err == f"error: {missing}: no such file or folder (named inputs: shakespeare, fineweb-edu, cosmopedia, hf:REPO[:CONFIG])\n"
