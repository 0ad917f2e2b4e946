"""One case per class of issue 9 (bad input, malformed file, refused replacement, path traversal, unknown
option, interruption) through the scripts' real command lines: main() under exits.run_main exactly as
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
from bincode_gpt.exits import run_main
from bincode_gpt.files import LOCK_NAME
from tools import bench, compare, convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's


def run(main, argv, capsys):
    """(exit code, stdout, stderr) of `python X.py *argv`, in-process."""
    code = run_main(main, argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def script(*args, **kw):
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kw)


def tree(folder):
    """{relative path: bytes} of every file under folder, but the writer lock's (it holds the last writer's pid)."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files if f != LOCK_NAME}


def test_malformed_meta_json_is_one_line(tiny_data, tmp_path, capsys):
    data = shutil.copytree(tiny_data, tmp_path / "data")
    (data / "meta.json").write_text("[1, 2]")
    argv = ["--data_dir", str(data), "--out_dir", str(tmp_path / "out"), "--device", "cpu"]
    code, out, err = run(train.main, argv, capsys)
    assert (code, out) == (1, "")
    assert err == (f'error: {data / "meta.json"}: malformed: needs a positive vocab_size, an encoding and splits '
                   '{"train": {"shards": [file names], "tokens": N}, ...}; prepare the folder again\n')
    assert not (tmp_path / "out").exists()


def test_bogus_device_is_one_line(tiny_data, tmp_path, capsys):
    code, out, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(tmp_path), "--device", "bogus"], capsys)
    assert (code, out, err) == (1, "", "error: unknown device 'bogus': use auto, cpu, cuda, cuda:N or mps\n")


def test_unknown_option_value_is_refused_not_ignored(capsys):
    code, out, err = run(bench.main, ["--sections", "train,bogus"], capsys)  # once measured nothing and exited 0
    assert (code, out, err) == (1, "", "error: unknown section(s) bogus: "
                                       "choose from train,sample,load,prep,compile_cache\n")
    code, out, err = run(compare.main, ["--seeds", "0"], capsys)
    assert (code, out, err) == (1, "", "error: --seeds must be at least 1, got 0\n")


def test_bad_input_leaves_prepared_data_byte_for_byte(tiny_data, tmp_path, capsys):
    data = shutil.copytree(tiny_data, tmp_path / "data")
    before = tree(data)
    text = tmp_path / "ok.txt"
    text.write_text("fine text\n" * 50)
    missing = tmp_path / "missing.txt"
    argv = [str(text), str(missing), "--out", str(data), "--overwrite", "--workers", "1"]
    code, out, err = run(prepare_data.main, argv, capsys)
    assert (code, out) == (1, "")
    assert err == (f"error: {missing}: no such file or folder "
                   "(named inputs: shakespeare, fineweb-edu, cosmopedia, hf:REPO[:CONFIG])\n")
    assert tree(data) == before


def test_no_command_replaces_a_checkpoint_it_did_not_create(tiny_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ckpt.pt").write_bytes(b"a resumable checkpoint, step 60")
    (run_dir / "log.jsonl").write_text("{}\n")
    before = tree(run_dir)
    code, out, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(run_dir), "--device", "cpu"], capsys)
    assert (code, out, err) == (1, "", f"error: {run_dir / 'ckpt.pt'} exists: continue that run with --resume, "
                                       "or start afresh and replace it with --overwrite\n")
    code, out, err = run(convert.main, ["hf2native", str(tmp_path / "release"), str(run_dir)], capsys)
    assert (code, out, err) == (1, "", f"error: {run_dir} is not empty (it holds ckpt.pt, log.jsonl): "
                                       "pass --overwrite to replace its model and tokenizer files "
                                       "(other files are kept)\n")
    assert tree(run_dir) == before


def test_paths_from_a_config_stay_in_its_folder(tmp_path, capsys):
    release = tmp_path / "release"
    release.mkdir()
    config = '{"vocab_size": 512, "n_embd": 32, "n_layer": 2, "n_head": 2, "block_size": 32}'
    (release / "config.json").write_text(config)
    (release / "model.safetensors.index.json").write_text('{"weight_map": {"x": "../../../../etc/passwd"}}')
    code, out, err = run(convert.main, ["hf2native", str(release), str(tmp_path / "out")], capsys)
    assert (code, out) == (1, "")
    assert err == ("note: config.json gives no RoPE base; assuming 10000 (not confirmed for the release)\n"
                   "error: model.safetensors.index.json names '../../../../etc/passwd', which is not a "
                   f"file name inside {release}: refused\n")
    assert not (tmp_path / "out").exists()


def test_garbage_config_json_is_one_line(tmp_path, capsys):
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "config.json").write_text("{garbage")
    code, out, err = run(convert.main, ["hf2native", str(tmp_path / "release"), str(tmp_path / "out")], capsys)
    assert (code, out, err) == (1, "", f"error: {tmp_path / 'release' / 'config.json'} is not valid JSON "
                                       "(Expecting property name enclosed in double quotes: "
                                       "line 1 column 2 (char 1))\n")


def test_command_lines_print_one_line_and_exit_1(tmp_path):
    """The scripts' __main__ wiring: no traceback, nothing on stdout."""
    missing = tmp_path / "missing.txt"
    p = script("prepare_data.py", str(missing), "--out", str(tmp_path / "d"))
    out, err = p.communicate(timeout=120)
    assert (p.returncode, out) == (1, "")
    assert err == (f"error: {missing}: no such file or folder "
                   "(named inputs: shakespeare, fineweb-edu, cosmopedia, hf:REPO[:CONFIG])\n")
    p = script("train.py", "--device", "cuda:99", "--data_dir", str(tmp_path))
    out, err = p.communicate(timeout=300)
    assert (p.returncode, out) == (1, "")
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_sigterm_mid_prepare_keeps_old_data(tiny_data, tmp_path):
    """SIGTERM while the workers encode: exit 130, one line, the old shards byte for byte, no staging left."""
    shakespeare = os.path.join(os.path.dirname(ROOT), "shared", "data", "tinyshakespeare.txt")
    text = (open(shakespeare).read() if os.path.isfile(shakespeare)
            else "the quick brown fox jumps over the lazy dog\n" * 25_000)
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

    from bincode_gpt.checkpoint import atomic_torch_save

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
    no_such = (f"{missing}: no such file or folder "
               "(named inputs: shakespeare, fineweb-edu, cosmopedia, hf:REPO[:CONFIG])\n")
    if traceback:
        assert err.startswith("Traceback (most recent call last):") and err.endswith(f"ValueError: {no_such}")
    else:
        assert err == f"error: {no_such}"


# ----------------------------------------------------------------------------- issue 25: round three
def shard_text(folder, split="train", vocab_size=512):
    import numpy as np

    from bincode_gpt.shards import read_shard
    from bincode_gpt.tokenizer import get_tokenizer

    names = [f for f in sorted(os.listdir(folder)) if f.startswith(split)]
    ids = np.concatenate([read_shard(os.path.join(folder, f)) for f in names])
    return get_tokenizer("gpt2", vocab_size, True).decode(ids.tolist())


def test_file_types_by_extension_in_any_case_and_no_byte_order_mark(tmp_path, capsys):
    """notes.JSONL is records, not one text; a byte-order mark (Windows editors) is no token, in .txt and .jsonl."""
    import json

    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    src = tmp_path / "src"
    src.mkdir()
    records = [{"text": f"record {i} of thirty"} for i in range(30)]
    (src / "notes.JSONL").write_bytes(b"\xef\xbb\xbf" + "\n".join(map(json.dumps, records)).encode())
    (src / "b.Jsonl").write_text(json.dumps({"text": "\ufeffa document that starts with a BOM"}) + "\n")
    (src / "c.TXT").write_bytes(b"\xef\xbb\xbfFirst Citizen:\nBefore we proceed any further, hear me speak.\n")
    pq.write_table(pyarrow.table({"text": ["from a parquet file", None, "another"]}), src / "d.Parquet")
    (src / "e.md").write_text("not read: only .txt, .jsonl and .parquet in any case are")
    argv = [str(src), "--out", str(tmp_path / "d"), "--vocab_size", "512", "--workers", "1"]
    code, out, err = run(prepare_data.main, argv, capsys)
    assert (code, err) == (0, "")
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["sources"] == [str(src / n) for n in ("b.Jsonl", "c.TXT", "d.Parquet", "notes.JSONL")]
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 1 + 1 + 2 + 30
    text = shard_text(tmp_path / "d") + shard_text(tmp_path / "d", "val")
    assert "\ufeff" not in text and '"text"' not in text and "First Citizen:" in text and "record 29 of thirty" in text


@pytest.mark.parametrize("argv, message", [
    (["--vocab_size", "0"], "vocab_size must be in [257, 50257] for gpt2, got 0"),  # was the full 50,257 tokens, exit 0
    (["--vocab_size", "-3"], "vocab_size must be in [257, 50257] for gpt2, got -3"),
    (["--workers", "0"], "workers must be at least 1, got 0"),  # was read as "all cores"
    (["--val_fraction", "1e-300"], "the val split is empty (--val_fraction 1e-300): give a larger fraction or budget, "
                                   "or --val_fraction 0 for no validation split"),
])
def test_prepare_settings_read_as_something_else_are_refused(tmp_path, capsys, argv, message):
    (tmp_path / "t.txt").write_text("some text to tokenize\n" * 20)
    code, out, err = run(prepare_data.main, [str(tmp_path / "t.txt"), "--out", str(tmp_path / "d"), *argv], capsys)
    assert (code, out, err) == (1, "", f"error: {message}\n")
    assert not (tmp_path / "d" / "meta.json").exists()
    with pytest.raises(SystemExit) as e:
        run(prepare_data.main, [str(tmp_path / "t.txt"), "--out", str(tmp_path / "d"), "--vocab_size", "many"], capsys)
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("argument --vocab_size: expected an integer, got 'many'\n")


def test_native2hf_refuses_a_value_float16_cannot_hold(tmp_path, capsys):
    pytest.importorskip("safetensors")
    import torch

    from bincode_gpt.checkpoint import checkpoint_dict
    from model import GPT, get_config

    model = GPT(get_config("tiny"))
    with torch.no_grad():
        model.lm_head.weight[7, 3] = 1e6
    torch.save(checkpoint_dict(model, None), tmp_path / "ckpt.pt")
    export = ["native2hf", str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"), "--dtype"]
    code, out, err = run(convert.main, [*export, "float16"], capsys)
    assert (code, out, err) == (1, "", "error: embed_out.weight (1e+06): beyond float16's largest value 65504, "
                                       "so written as inf: export with --dtype float32 or bfloat16\n")
    assert not (tmp_path / "hf").exists()
    code, out, err = run(convert.main, [*export, "bfloat16"], capsys)
    assert code == 0, err


def test_files_that_are_not_files_say_what_they_are(tiny_data, tmp_path, capsys):
    """A meta.json in a symlink loop is not 'no meta.json'; a model.safetensors that links to /dev/zero is named."""
    data = shutil.copytree(tiny_data, tmp_path / "data")
    os.remove(data / "meta.json")
    os.symlink("meta.json", data / "meta.json")
    argv = ["--data_dir", str(data), "--out_dir", str(tmp_path / "out"), "--device", "cpu"]
    code, out, err = run(train.main, argv, capsys)
    assert (code, out, err) == (1, "", f"error: {data / 'meta.json'}: a symlink loop (it resolves to itself); "
                                       "prepare the data again, or point at the folder it is in\n")
    release = tmp_path / "release"
    release.mkdir()
    config = '{"vocab_size": 512, "n_embd": 32, "n_layer": 2, "n_head": 2, "block_size": 32}'
    (release / "config.json").write_text(config)
    os.symlink("/dev/zero", release / "model.safetensors")
    code, out, err = run(convert.main, ["hf2native", str(release), str(tmp_path / "o")], capsys)
    assert (code, out) == (1, "") and err.endswith(f"error: {release / 'model.safetensors'}: a symlink to "
                                                   "/dev/zero, a device, FIFO or socket, not a regular file\n")


@pytest.mark.parametrize("main, argv, message", [
    (bench.main, ["--repeats", "0"], "--repeats must be at least 1, got 0"),  # was "no median for empty data"
    (bench.main, ["--sections", "prep", "--prep_copies", "0"], "--prep_copies must be at least 1, got 0"),
    (bench.main, ["--sample_batches", "1,0"], "--sample_batches must be batch sizes >= 1, comma-separated, got '1,0'"),
    (bench.main, ["--block_size", "0"], "--block_size must be at least 1, got 0"),  # was read as the default
    (train.main, ["--out_dir", ""], "--out_dir is '' (empty): name a folder"),
    (train.main, ["--data_dir", ""], "--data_dir is '' (empty): name a folder"),
    (convert.main, ["native2hf", "", "no-such-folder"],
     "the checkpoint is '' (empty): name a .pt file or a folder holding ckpt.pt"),
])
def test_flags_are_named_in_their_refusals(main, argv, message, capsys):
    assert run(main, argv, capsys) == (1, "", f"error: {message}\n")


def test_a_full_disk_under_torch_save_says_the_disk_is_full(tmp_path, monkeypatch):
    """torch.save turns the file's ENOSPC into 'unexpected pos': the OSError it hides is what is reported."""
    import errno

    import torch

    from bincode_gpt.checkpoint import atomic_torch_save

    def full_disk(obj, f):
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError) as e:
        atomic_torch_save({"step": 1}, tmp_path / "best.pt")
    assert str(e.value) == (f"{tmp_path / 'best.pt'}: not written: the disk is full: No space left on device; "
                            "nothing was replaced")
    assert e.value.errno == errno.ENOSPC and os.listdir(tmp_path) == []


def test_check_finite_finds_nan_and_inf_anywhere_in_any_dtype():
    """check_finite makes no temporary of a tensor's size (aminmax; float8 2**20 values at a time), and
    still sees one bad value at any position, of any float dtype, in any block."""
    import torch

    from bincode_gpt.checkpoint import all_finite, check_finite

    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        for shape in ((5,), (3000, 1000), (1, 2**20 + 3)):
            t = torch.zeros(shape).to(dtype)
            assert all_finite(t) and all_finite(t.t() if t.dim() == 2 else t)
            n = t.numel()
            for pos in (0, n // 2, n - 1, 2**20 - 1 if n > 2**20 else n - 2):
                for bad in (float("nan"),) + ((float("inf"), -float("inf")) if dtype != torch.float8_e4m3fn else ()):
                    u = t.clone()  # (float8_e4m3fn has no inf: it saturates to 448)
                    u.view(-1)[pos] = bad
                    assert not all_finite(u) and not all_finite(u.t() if u.dim() == 2 else u), (dtype, shape, pos, bad)
    good, bad = torch.ones(4), torch.tensor([1.0, float("nan")])
    with pytest.raises(ValueError, match=r"^x.pt holds NaN or inf values in b: refusing to sample from a diverged or "
                                         r"corrupt checkpoint$"):
        check_finite({"a": good, "b": bad, "ids": torch.arange(3)}, "x.pt", "sample from")


def test_quantize_refuses_a_nan_checkpoint_naming_the_tensor(tiny_data, tmp_path, capsys):
    """It printed 'validation loss ... float32 nan, int8 nan (nan%)' and exit 0."""
    import torch

    from bincode_gpt.checkpoint import checkpoint_dict
    from model import GPT, get_config
    from tools import quantize_quality

    model = GPT(get_config("tiny"))
    with torch.no_grad():
        model.blocks[0].mlp.proj.weight[2, 2] = float("inf")
    codec = {"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 512, "reserve_zero": True}
    torch.save(checkpoint_dict(model, codec), tmp_path / "ckpt.pt")
    assert run(quantize_quality.main, ["--ckpt", str(tmp_path / "ckpt.pt"), "--data_dir", tiny_data], capsys) == (
        1, "", f"error: {tmp_path / 'ckpt.pt'} holds NaN or inf values in blocks.0.mlp.proj.weight: "
               "refusing to measure a diverged or corrupt checkpoint\n")


def test_a_folder_holding_one_file_of_a_run_is_read_or_named(tiny_data, tmp_path, capsys):
    """Each file a run or a conversion leaves, alone in a folder, given to every command that reads checkpoints
    (issue 53): best.pt is read where weights are all a command needs, and said so; --resume refuses it naming
    it and --init_from; a log, a Hugging Face folder or a checkpoint named beside best.pt are refused naming
    what is there and what to do."""
    import sample

    tiny = ["--preset", "tiny", "--n_layer", "1", "--n_head", "1", "--n_embd", "32", "--block_size", "16",
            "--batch_size", "2", "--eval_steps", "1", "--device", "cpu"]
    code, _, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(tmp_path / "run"), "--max_steps", "2",
                                    "--eval_interval", "2", *tiny], capsys)
    assert code == 0, err
    best, log, hf = (tmp_path / name for name in ("best", "log", "hf"))
    for folder, name in ((best, "best.pt"), (log, "log.jsonl")):
        folder.mkdir()
        shutil.copy(tmp_path / "run" / name, folder / name)
    hf.mkdir()
    (hf / "config.json").write_text("{}")  # what native2hf writes first

    read = (f"note: {best} holds no ckpt.pt: reading {best / 'best.pt'}, "
            "the weights of the run's best evaluation (step 2)\n")
    code, out, err = run(sample.main, ["--ckpt", str(best), "--max_new_tokens", "2", "--device", "cpu"], capsys)
    assert (code, err) == (0, read) and out
    code, _, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(tmp_path / "tuned"), "--init_from",
                                    str(best), "--max_steps", "1", "--eval_interval", "0", *tiny], capsys)
    assert code == 0 and err.startswith(read), err
    code, out, err = run(convert.main, ["native2int8", str(best), str(tmp_path / "int8")], capsys)
    assert (code, err) == (0, read) and out.startswith(f"wrote {tmp_path / 'int8' / 'ckpt.pt'}")
    code, _, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(best), "--resume", *tiny], capsys)
    assert (code, err) == (1, f"error: {best / 'ckpt.pt'}: no checkpoint there to resume; {best / 'best.pt'} holds "
                              "weights only (no optimizer, data position or RNG state): start a run from them with "
                              f"--init_from {best / 'best.pt'}\n")
    code, _, err = run(convert.main, ["hf2native", str(best), str(tmp_path / "back")], capsys)
    assert (code, err) == (1, f"error: no config.json in {best}: it holds a native checkpoint (best.pt), not a Hugging "
                              "Face model (native2hf converts a native checkpoint to one)\n")

    beside = (f"; {best / 'best.pt'} (the weights of the run's best evaluation) is there: "
              f"name that file, or the folder {best}")
    logged = (f"; {log} holds a run's log.jsonl but neither of its checkpoints (ckpt.pt, best.pt): "
              "they were removed, or the run stopped before its first save")

    converted = (f"; {hf} holds a Hugging Face model (config.json): convert it to a native checkpoint first: python -m "
                 f"tools.convert hf2native {hf} OUT")
    for path, hint in ((best / "ckpt.pt", beside), (log, logged), (hf, converted)):
        file = path if path.suffix else path / "ckpt.pt"
        refusal = f"error: {file}: no checkpoint there{hint}\n"
        for main, argv in ((sample.main, ["--ckpt", str(path), "--device", "cpu"]),
                           (train.main, ["--data_dir", tiny_data, "--out_dir", str(tmp_path / "o"), "--init_from",
                                         str(path), *tiny]),
                           (convert.main, ["native2hf", str(path), str(tmp_path / "o")])):
            assert run(main, argv, capsys) == (1, "", refusal), (path, argv)
    code, _, err = run(train.main, ["--data_dir", tiny_data, "--out_dir", str(log), "--resume", *tiny], capsys)
    assert (code, err) == (1, f"error: {log / 'ckpt.pt'}: no checkpoint there{logged}\n")
