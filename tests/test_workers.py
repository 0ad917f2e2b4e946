"""The worker pool (bincode_gpt/workers.py): pieces cut where the tokenizer cuts anyway encode to the whole
text's tokens, the output does not depend on the number of workers, and Ctrl-C or SIGTERM mid-run is one line,
exit 130, the old data kept and no worker left running."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import prepare_data as P
from bincode_gpt import workers
from conftest import SHAKESPEARE, snapshot, words
from test_prepare_data import ROOT


def test_pieces_tokenize_like_the_whole_text(gpt2):
    # Tricky whitespace around the cut points: trailing spaces, blank lines, CRLF.
    text = words(300) + "end  \nx\n\n\ny \r\nz\t\nw" + words(300, seed=1)
    text += SHAKESPEARE.read_text()[:30000] if SHAKESPEARE.is_file() else ""
    parts = list(workers.pieces(text, 500))
    assert len(parts) > 20 and [last for _, last in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p for p, _ in parts) == text
    assert [t for p, _ in parts for t in gpt2.encode_ordinary(p)] == gpt2.encode_ordinary(text)


def test_deterministic_across_runs_and_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "PIECE_CHARS", 2000)  # many batches, so two workers really share work
    for i in range(25):
        (tmp_path / f"{i:02d}.txt").write_text(words(60 + i, seed=i))
    kw = dict(shard_tokens=3000, vocab_size=4096, progress=False)
    runs = [P.prepare([str(tmp_path / "*.txt")], tmp_path / f"out{n}", workers=w, **kw)
            for n, w in enumerate([1, 2, 2])]

    assert runs[0] == runs[1] == runs[2] and len(runs[0]["splits"]["train"]["shards"]) > 3
    for name in os.listdir(tmp_path / "out0"):
        assert len({(tmp_path / f"out{n}" / name).read_bytes() for n in range(3)}) == 1, name


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupt_is_one_line_and_keeps_the_old_data(tmp_path, prepared, how):
    """Ctrl-C reaches the whole process group (parent and workers); `kill` reaches the parent only."""
    out, before = prepared
    big = tmp_path / "big.jsonl"
    lines = words(2000).splitlines()
    records = "".join(json.dumps({"text": "\n".join(lines[i:i + 20])}) + "\n" for i in range(0, 2000, 20))
    big.write_text(records * 300)  # 30,000 documents, ~30 MB: the first shards come at once, the rest takes seconds
    proc = subprocess.Popen([sys.executable, str(ROOT / "prepare_data.py"), str(big), "--out", str(out), "--overwrite",
                             "--shard_tokens", "20000", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                # a shell's background job inherits SIGINT ignored: give the child Ctrl-C back
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not (out / ".partial" / "train_000000.bin").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()  # still working: the interrupt lands mid-run
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stdout, stderr) == (130, "", "interrupted\n")
    assert snapshot(out) == before
    for _ in range(100):  # and no worker outlives it
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("pool workers still running after the interrupt")