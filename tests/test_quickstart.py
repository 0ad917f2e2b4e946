"""tools/quickstart.py: its figures come from the runs' own files (per byte from meta.json, the loop time from
log.jsonl, the word share of the saved sample), a finished configuration is read back and a changed one refused,
flags the scripts lack are refused before anything runs, and nanoGPT's recipe runs from copies of a local
checkout (when one lies beside the checkout: ../ext/nanoGPT) without touching it."""

import json
import shlex
from pathlib import Path

import pytest

from conftest import SHAKESPEARE
from bincode_gpt.shards import load_meta
from tools import quickstart

ROOT = Path(__file__).resolve().parent.parent
NANOGPT = ROOT.parent / "ext" / "nanoGPT"
TINY = "--preset tiny --max_steps 3 --eval_interval 3 --eval_steps 2 --save_interval 0"
NANO_TINY = ("--max_iters=3 --lr_decay_iters=3 --eval_interval=3 --eval_iters=2 --n_layer=1 --n_head=2 --n_embd=32 "
             "--block_size=32 --batch_size=4 --warmup_iters=1")


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A small tinyshakespeare.txt where `prepare_data.py shakespeare` looks first, so nothing downloads."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    text = SHAKESPEARE.read_text()[:20_000] if SHAKESPEARE.is_file() else \
        "\n".join(f"line {i}: the quick brown fox {i % 7} jumps over {i % 11} dogs" for i in range(500))
    (folder / "tinyshakespeare.txt").write_text(text)
    monkeypatch.setenv("BCGPT_CORPUS_CACHE", str(folder))
    return folder / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def known():
    return {s: quickstart.options(s) for s in quickstart.OWNED}


def test_words_and_share():
    assert quickstart.words("I'll go, ROMEO! x2y '' 'tis") == ["i'll", "go", "romeo", "x", "y", "'tis"]
    assert quickstart.real_share("Romeo ROMEO zzq 'tis", {"romeo", "'tis"}) == 0.75
    assert quickstart.real_share("1 2 3 !", {"romeo"}) == 0.0


def test_grid_parsing():
    text = "# a comment\n\na | --vocab_size 512 | --n_layer 4  # why\nb |  | --lr 2e-3\n"
    assert quickstart.parse_grid(text) == [("a", "--vocab_size 512", "--n_layer 4"), ("b", "", "--lr 2e-3")]
    for bad, why in [("a | --lr 1", "expected"), ("a b | | --lr 1", "plain"), ("a | | \na | | --lr 1", "taken"),
                     ("nanoGPT | | ", "taken"), ("# nothing", "no configuration")]:
        with pytest.raises(ValueError, match=why):
            quickstart.parse_grid(bad)


def test_flags_checked_against_the_scripts(known):
    quickstart.check_flags("--n_layer 4 --no-bias --dtype=bfloat16", "train.py", known["train.py"], "c")
    quickstart.check_flags("--vocab_size 512 --no-reserve_ones", "prepare_data.py", known["prepare_data.py"], "c")
    for flags, script, why in [("--threads 2", "train.py", "has no flag --threads"),
                               ("--out_dir x", "train.py", "set by the tool"),
                               ("--resume", "train.py", "set by the tool"),
                               ("--out x", "prepare_data.py", "set by the tool"),
                               ("4 --n_layer", "train.py", "start with")]:
        with pytest.raises(ValueError, match=why):
            quickstart.check_flags(flags, script, known[script], "c")


def test_shipped_grid_speaks_only_flags_the_scripts_have(known):
    configs = quickstart.parse_grid((ROOT / "tools" / "quickstart_grid.txt").read_text())
    assert 12 <= len(configs) <= 24  # two rounds of ~15 minutes each
    for name, prep, train in configs:
        quickstart.check_flags(prep, "prepare_data.py", known["prepare_data.py"], name)
        quickstart.check_flags(train, "train.py", known["train.py"], name)
    assert len({(p, t) for _, p, t in configs}) == len(configs)  # no configuration twice


def test_the_pick_is_the_best_per_byte_of_those_meeting_every_target():
    """Issue 34's targets: no slower than nanoGPT, at most 0.95x its nats/byte, at least its share of real words."""
    rec = lambda name, t, b, w: dict(name=name, train_s=t, per_byte=b, words=w)  # noqa: E731
    ref = rec("nanoGPT", 100.0, 2.0, 0.6)
    rows = [rec("slow", 101.0, 1.0, 0.9), rec("edge", 100.0, 1.9, 0.6), rec("ok", 50.0, 1.85, 0.7),
            rec("few words", 50.0, 1.5, 0.59), rec("loss", 50.0, 1.91, 0.9)]
    assert [quickstart.verdict(r, ref)[1] for r in rows] == [False, True, True, False, False]
    assert quickstart.choice(rows, ref)["name"] == "ok"
    assert quickstart.choice(rows[:1], ref) is None


def test_nanogpt_sample_text():
    out = ("Overriding: seed = 1\nnumber of parameters: 0.01M\nLoading meta from data/x/meta.pkl...\n\nROMEO:\nAy.\n"
           "---------------\n")
    assert quickstart.sample_text(out) == "\nROMEO:\nAy."


def test_refused_before_anything_runs(tmp_path, corpus):
    grid = tmp_path / "grid.txt"
    grid.write_text("ok | | --max_steps 2\nbad | | --threads 2\n")
    with pytest.raises(ValueError, match="needs --work"):
        quickstart.main(["--grid", str(grid)])
    with pytest.raises(ValueError, match="drop --prepare_flags"):
        quickstart.main(["--grid", str(grid), "--work", str(tmp_path / "w"), "--train_flags", "--lr 1"])
    with pytest.raises(ValueError, match="bad: train.py has no flag --threads"):
        quickstart.main(["--grid", str(grid), "--work", str(tmp_path / "w")])
    with pytest.raises(ValueError, match="no such folder"):
        quickstart.main(["--nanogpt", str(tmp_path / "none"), "--work", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()


def test_measure_figures_resume_and_refusal(tmp_path, corpus, capsys):
    work = tmp_path / "work"
    grid = tmp_path / "grid.txt"
    grid.write_text(f"a | --vocab_size 300 --workers 1 | {TINY}\nb | --vocab_size 300 --workers 1 | {TINY} --lr 2e-3\n")
    args = ["--grid", str(grid), "--work", str(work), "--sample_tokens", "30", "--seed", "3"]
    first = quickstart.main(args)["records"]
    lines = (work / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["name"] for x in lines] == ["a", "b"]
    for r in first:
        run = work / "runs" / r["name"]
        (data,) = [str(p.parent) for p in (work / "data").glob("*/meta.json")]  # one prepare for both
        val = load_meta(data)["splits"]["val"]
        assert r["per_byte"] == r["val_loss"] * val["tokens"] / val["bytes"]
        end = [json.loads(x) for x in (run / "out" / "log.jsonl").read_text().splitlines()][-1]
        assert (r["loop_s"], r["steps"], r["own_val_loss"]) == (end["wall_s"], 3, end["final_val_loss"])
        assert r["train_s"] > r["loop_s"] > 0
        sample = (run / "sample.txt").read_text()
        assert r["sample"] == sample and r["sample_chars"] == len(sample)
        text = corpus.read_text()[:18_000]  # the 90% character split's training text
        assert quickstart.train_text(data, load_meta(data)) == text
        assert r["words"] == quickstart.real_share(sample, set(quickstart.words(text)))
    report = (work / "quickstart.md").read_text()
    assert "| a | `--vocab_size 300 --workers 1` |" in report and "| b | `--vocab_size 300 --workers 1` |" in report

    # a killed search: its torn last line is left out and that configuration measured again (train.py --overwrite)
    (work / "results.jsonl").write_text(lines[0] + "\n" + lines[1][:40])
    log = work / "runs" / "a" / "train.log"
    before = log.stat().st_mtime_ns
    again = quickstart.main(args)["records"]
    assert again[0] == first[0] and log.stat().st_mtime_ns == before  # read back, not retrained
    assert again[1]["val_loss"] == pytest.approx(first[1]["val_loss"], abs=1e-6)  # same seed: same run
    assert again[1]["sample"] == first[1]["sample"]
    assert "a: read back" in capsys.readouterr().out

    with pytest.raises(ValueError, match=r"a in results.jsonl was measured with other settings \("):
        quickstart.main(["--grid", str(grid), "--work", str(work), "--sample_tokens", "31"])
    grid.write_text(f"a | --vocab_size 300 --workers 1 | {TINY} --lr 5e-4\n")
    with pytest.raises(ValueError, match=r"a in results.jsonl was measured with other train_flags \("):
        quickstart.main(args)


def test_temporary_work_is_removed(tmp_path, corpus, monkeypatch):
    monkeypatch.setattr(quickstart.tempfile, "tempdir", str(tmp_path))
    r = quickstart.main(["--prepare_flags", "--vocab_size 300 --workers 1", "--train_flags", TINY,
                         "--sample_tokens", "10"])["records"][0]
    assert r["name"] == "quickstart" and r["steps"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]


@pytest.mark.skipif(not (NANOGPT / "train.py").is_file(), reason="no nanoGPT checkout at ../ext/nanoGPT")
def test_nanogpt_side_by_side(tmp_path, corpus):
    listing = sorted(str(p) for p in NANOGPT.rglob("*"))
    work = tmp_path / "work"
    res = quickstart.main(["--work", str(work), "--prepare_flags", "--vocab_size 300 --workers 1", "--train_flags",
                           TINY, "--sample_tokens", "20", "--nanogpt", str(NANOGPT), "--nanogpt_flags", NANO_TINY])
    ours, ref = res["records"][0], res["nanogpt"]
    assert sorted(str(p) for p in NANOGPT.rglob("*")) == listing  # the checkout is only read
    folder = work / "nanogpt"
    assert (folder / "data/shakespeare_char/input.txt").read_text() == corpus.read_text()
    assert ref["ckpt_iter"] == 3 and ref["own_val_step"] == 3
    assert ref["per_byte"] == ref["val_loss"]  # ASCII: a character is a byte
    assert 0 < ref["val_loss"] < 5 and ref["own_val_loss"] == pytest.approx(ref["val_loss"], abs=0.3)
    assert ref["train_flags"] == shlex.join(shlex.split(quickstart.NANOGPT_FLAGS) + shlex.split(NANO_TINY))
    assert ref["sample"] == (folder / "sample.txt").read_text() and len(ref["sample"]) == ours["sample_chars"] + 1
    report = (work / "quickstart.md").read_text()
    ratio = f"{ours['per_byte'] / ref['per_byte']:.3f}"
    assert f"| {ratio} |" in report and "quickstart against nanoGPT's CPU recipe:" in report
    assert report.count(quickstart.machine()) == 3  # the line above the table, and each row

    # no evaluation after iteration 0: nanoGPT's train.py saves no checkpoint, and the tool says why
    (work / "results.jsonl").write_text((work / "results.jsonl").read_text().splitlines()[0] + "\n")
    with pytest.raises(RuntimeError, match="saved no checkpoint"):
        quickstart.main(["--work", str(work), "--prepare_flags", "--vocab_size 300 --workers 1", "--train_flags",
                         TINY, "--sample_tokens", "20", "--nanogpt", str(NANOGPT),
                         "--nanogpt_flags", NANO_TINY + " --max_iters=2 --eval_interval=250"])
