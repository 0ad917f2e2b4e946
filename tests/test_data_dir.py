"""The folder prepare_data.py writes (bincode_gpt/data_dir.py): a bad input, a fault, a full disk or a kill leaves
the prepared data there byte for byte; one writer at a time; only the project's own files are replaced, and a
staging folder that is not prepare_data.py's is refused by name and kept."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import prepare_data as P
from bincode_gpt import shards, workers
from bincode_gpt.files import LOCK_NAME
from conftest import snapshot, words
from test_prepare_data import cli, main, ROOT, shard_tokens


# ---------------------------------------------------------------- bad input, faults: nothing lost
def test_bad_inputs_are_one_line_and_keep_the_old_data(tmp_path, capsys, prepared):
    out, before = prepared
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text(" \n\n")
    (tmp_path / "latin1.txt").write_bytes("ok so far ".encode() + "café".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    (tmp_path / "nofield.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    (tmp_path / "nodocs.jsonl").write_text('{"text": ""}\n\n')
    (tmp_path / "ok.txt").write_text(words(20))
    ok = tmp_path / "ok.txt"
    cases = [
        ([tmp_path / "empty.txt"], "empty.txt: empty file"),
        ([tmp_path / "blank.txt"], "blank.txt: empty file (only whitespace)"),
        ([ok, tmp_path / "latin1.txt"], "latin1.txt: not valid UTF-8 at byte offset 13"),
        ([ok, tmp_path / "bad.jsonl"], "bad.jsonl:2: invalid JSON (Expecting value)"),
        ([tmp_path / "nofield.jsonl"], "nofield.jsonl:2: record has no string field 'text' (try --text_field)"),
        ([tmp_path / "nodocs.jsonl"], "nodocs.jsonl: no documents (no record has a non-empty 'text')"),
        ([ok, "--encoding", "gpt5"], "unknown encoding 'gpt5'"),
        ([ok, "--vocab_size", "100"], "vocab_size must be in [257, 50257]"),
        ([ok, tmp_path / "missing.txt"], "missing.txt: no such file or folder"),
        ([tmp_path / "*.nothing"], "no files match"),
        ([ok, ok, "--mix", "1.5"], "--mix needs one non-negative weight per input"),
        ([ok, "--val_fraction", "1"], "need 0 <= val_fraction < 1"),
        ([ok, "--workers", "-1"], "workers must be at least 1, got -1"),
        ([ok, "--max_tokens", "1"], "the train split is empty (--val_fraction 0.1, --max_tokens 1): "
                                    "give a smaller fraction or a larger budget"),
        ([ok, "--val_fraction", "0.9999999"], "the train split is empty (--val_fraction 0.9999999): give a smaller "
                                              "fraction or a larger budget"),  # said --max_tokens, never given
        ([ok, "--mix", "0.5"], "--mix draws documents from two or more inputs, but 1 is named: drop --mix"),
    ]
    for args, msg in cases:
        rc, err = main(capsys, "--out", out, "--workers", "1", "--overwrite", *args)
        assert rc == 1 and err.startswith("error: ") and msg in err and err.count("\n") == 1, (msg, err)
        assert snapshot(out) == before, msg


def test_input_bad_halfway_keeps_the_old_data(tmp_path, prepared):
    """Through the real command line: the first records pass the up-front check, a later one is broken."""
    out, before = prepared
    src = tmp_path / "late.jsonl"
    src.write_text("".join(json.dumps({"text": words(3, seed=i)}) + "\n" for i in range(200)) + '{"text": \n')
    r = cli(src, "--out", out, "--overwrite", "--shard_tokens", "100", "--workers", "2")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"error: {src}:201: invalid JSON (Expecting value)\n"
    assert snapshot(out) == before


def test_failure_halfway_leaves_no_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "PIECE_CHARS", 200)  # so shards are written before the bad record is read
    for i in range(11):
        (tmp_path / f"{i:02d}.txt").write_text(words(100, seed=i))
    (tmp_path / "zz.jsonl").write_bytes(b'{"text": "passes the up-front check"}\n{"text": "\xff"}\n')
    written = []
    monkeypatch.setattr(shards, "write_shard", lambda path, t, made_with, w=shards.write_shard:
                        written.append(path) or w(path, t, made_with))
    with pytest.raises(ValueError, match="zz.jsonl: not valid UTF-8 at byte offset 48"):
        P.prepare([str(tmp_path)], tmp_path / "out", shard_tokens=100, workers=2, progress=False)
    assert len(written) > 10 and not (tmp_path / "out").exists()  # the folder it made goes too


def test_full_disk_keeps_the_old_data(tmp_path, capsys, monkeypatch, prepared):
    out, before = prepared
    (tmp_path / "new.txt").write_text(words(400, seed=1))
    fsync, calls = os.fsync, []

    def fills_up(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        fsync(fd)
    monkeypatch.setattr(os, "fsync", fills_up)
    rc, err = main(capsys, tmp_path / "new.txt", "--out", out, "--overwrite", "--shard_tokens", "1000",
                   "--workers", "1")
    assert (rc, err) == (1, f"error: {out}: not prepared: the disk is full (No space left on device); "
                            "the prepared data there is as it was\n")
    assert snapshot(out) == before


def test_refuses_prepared_folder_unless_overwrite(tmp_path, capsys, prepared):
    out, before = prepared
    (tmp_path / "b.txt").write_text(words(20))
    rc, err = main(capsys, tmp_path / "b.txt", "--out", out)
    assert rc == 1 and err == f"error: {out}: already holds prepared data (meta.json); pass --overwrite to replace it\n"
    assert snapshot(out) == before
    assert main(capsys, tmp_path / "b.txt", "--out", out, "--overwrite")[0] == 0
    meta = shards.load_meta(out)  # no stale shards from the bigger first run
    shard_names = [*meta["splits"]["train"]["shards"], *meta["splits"]["val"]["shards"]]
    assert sorted(os.listdir(out)) == sorted([LOCK_NAME, "meta.json", *shard_names])
    assert len(meta["splits"]["train"]["shards"]) < len([n for n in before if n.startswith("train_")])


# ---------------------------------------------------------------- one writer, and only the project's files (issue 18)
def busy_input(path):
    """~4 MB of JSONL: enough work that a run is still writing when it is paused after its first shard."""
    lines = words(2000).splitlines()
    path.write_text("".join(json.dumps({"text": "\n".join(lines[i:i + 20])}) + "\n" for i in range(0, 2000, 20)) * 40)
    return path


def wait_for(path, proc, seconds=60):
    deadline = time.time() + seconds
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()


def consistent(out):
    """meta.json agrees with the shards: every listed shard, each split's token count, ids inside the vocabulary."""
    meta = shards.load_meta(out)
    for split in ("train", "val"):
        tokens = shard_tokens(out, meta, split)
        assert len(tokens) == meta["splits"][split]["tokens"] and tokens.max() < meta["vocab_size"]
    assert sorted(os.listdir(out)) == sorted([LOCK_NAME, "meta.json", *meta["splits"]["train"]["shards"],
                                              *meta["splits"]["val"]["shards"]])
    return meta


def test_a_second_writer_is_refused_while_the_first_runs(tmp_path, prepared):
    """Two real processes into one --out: the second is refused with one line while the first holds the folder
    (paused with SIGSTOP, so the overlap is certain); the first then finishes with meta.json matching its shards."""
    out, _ = prepared
    first = subprocess.Popen([sys.executable, str(ROOT / "prepare_data.py"), str(busy_input(tmp_path / "big.jsonl")),
                              "--out", str(out), "--overwrite", "--shard_tokens", "20000", "--workers", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(out / ".partial" / "train_000000.bin", first)
        first.send_signal(signal.SIGSTOP)
        (tmp_path / "small.txt").write_text(words(50, seed=3))
        second = cli(tmp_path / "small.txt", "--out", out, "--overwrite", "--workers", "1")
        assert (second.returncode, second.stdout) == (1, "")
        assert second.stderr == (f"error: {out} is being written by another process (pid {first.pid}); wait for it "
                                 "to finish or choose another folder\n")
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=120)
    assert (first.returncode, stderr) == (0, ""), stderr
    assert consistent(out)["sources"] == [str(tmp_path / "big.jsonl")]


def test_a_writer_killed_with_sigkill_leaves_no_lock_and_its_staging_goes(tmp_path, prepared):
    out, before = prepared
    first = subprocess.Popen([sys.executable, str(ROOT / "prepare_data.py"), str(busy_input(tmp_path / "big.jsonl")),
                              "--out", str(out), "--overwrite", "--shard_tokens", "20000", "--workers", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(out / ".partial" / "train_000000.bin", first)
    first.kill()
    first.communicate(timeout=60)
    assert (out / ".partial").is_dir() and {n: b for n, b in tree(out).items() if "/" not in n} == before
    (tmp_path / "small.txt").write_text(words(50, seed=3))
    r = cli(tmp_path / "small.txt", "--out", out, "--overwrite", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert consistent(out)["sources"] == [str(tmp_path / "small.txt")]


def test_user_files_in_the_output_folder_are_refused_by_name_and_kept(tmp_path):
    (tmp_path / "a.txt").write_text(words(50))
    corpus = tmp_path / "corpus"  # a folder with a meta.json of its own: not prepared data
    corpus.mkdir()
    (corpus / "meta.json").write_text('{"title": "my corpus", "license": "CC-BY"}\n')
    staged = tmp_path / "staged"  # a user's folder that happens to be called .partial
    (staged / ".partial").mkdir(parents=True)
    (staged / ".partial" / "notes.txt").write_text("my notes\n")
    shard = tmp_path / "shard"  # a user's file with a shard's name
    shard.mkdir()
    (shard / "train_000000.bin").write_bytes(b"my own binary file")
    for folder, msg in [(corpus, f"{corpus / 'meta.json'} is not a meta.json of prepared data (prepare_data.py did not "
                                 "write it): it is left alone; choose another --out"),
                        (staged, f"{staged / '.partial'} exists and prepare_data.py did not make it (it has no "
                                 ".prepare_data mark): it is left alone; move it away or choose another --out"),
                        (shard, f"{shard / 'train_000000.bin'} is not a token shard (prepare_data.py did not "
                                "write it): it is left alone; choose another --out")]:
        before = tree(folder)
        for overwrite in ([], ["--overwrite"]):
            r = cli(tmp_path / "a.txt", "--out", folder, "--workers", "1", *overwrite)
            assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: {msg}\n")
            assert tree(folder) == before


def test_a_marked_staging_folder_with_a_user_file_inside_is_refused(tmp_path, prepared):
    out, before = prepared
    (out / ".partial").mkdir()
    (out / ".partial" / ".prepare_data").write_text("mark\n")
    (out / ".partial" / "train_000000.bin").write_bytes(b"left by a killed run")
    (out / ".partial" / "keep.txt").write_text("mine\n")
    (tmp_path / "a.txt").write_text(words(50))
    r = cli(tmp_path / "a.txt", "--out", out, "--overwrite", "--workers", "1")
    assert (r.returncode, r.stderr) == (1, f"error: {out / '.partial'} holds files prepare_data.py did not write "
                                           "(keep.txt): they are left alone; move them away or choose another --out\n")
    assert (out / ".partial" / "keep.txt").read_text() == "mine\n"
    assert {n: b for n, b in tree(out).items() if "/" not in n} == before


def tree(folder):
    """{relative path: bytes} of every file under folder, but the writer lock's (it holds the last writer's pid)."""
    files = (p for p in Path(folder).rglob("*") if p.is_file() and p.name != LOCK_NAME)
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


def test_bad_inputs_of_every_kind_are_one_line_naming_them(tmp_path):
    (tmp_path / "nested.jsonl").write_text('{"text": "fine"}\n' + "[" * 100_000 + "\n")
    (tmp_path / "surrogate.jsonl").write_text('{"text": "fine"}\n{"text": "half a pair \\ud800 here"}\n')
    os.symlink("/dev/zero", tmp_path / "zero.txt")
    os.mkfifo(tmp_path / "pipe.txt")
    ok = tmp_path / "ok.txt"
    ok.write_text(words(20))
    o = tmp_path / "o"
    cases = [
        ([ok], "", "the output folder is '' (empty): name one, e.g. --out data/mine"),
        ([ok], ok, f"{ok} is a file, not a folder: name a folder to write into"),
        ([ok, tmp_path / "nested.jsonl"], o,
         f"{tmp_path / 'nested.jsonl'}:2: JSON nested too deeply to read (not a text record)"),
        ([tmp_path / "surrogate.jsonl"], o,
         f"{tmp_path / 'surrogate.jsonl'}:2: 'text' holds a lone surrogate (\\ud800) at character 12, "
         "which is not Unicode text"),
        ([ok, tmp_path / "zero.txt"], o,
         f"{tmp_path / 'zero.txt'}: a symlink to /dev/zero, a character device, not a file: "
         "give a text file, a folder or a named corpus"),
        ([tmp_path], o,
         f"{tmp_path / 'pipe.txt'}: a named pipe (FIFO), not a file: give a text file, a folder or a named corpus"),
    ]
    for named, out, msg in cases:
        r = cli(*named, "--out", out, "--workers", "1")
        assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: {msg}\n"), msg
    # the records past the first were read as the folder's writer, which removes the folder it made
    assert not o.exists()

