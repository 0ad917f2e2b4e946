"""share.py: a tiny sweep over two vocabularies end to end (runs, resume, the tables and the figure from its own
results), and the fit along tokens on synthetic numbers with a known answer."""

import json
import math
import os

import pytest

from tools import share

FLAGS = ["--vocabs", "512,1024", "--steps", "4,3", "--size", "1x16", "--affine_vocabs", "512", "--depth_point",
         "512:2x16", "--width_point", "512:12", "--short_steps", "2", "--second", "", "--seeds", "2", "--evals", "2",
         "--n_head", "2", "--block_size", "16", "--batch_size", "2", "--eval_batches", "1", "--device", "cpu"]


@pytest.fixture
def corpus(tmp_path):
    from conftest import SHAKESPEARE

    text = tmp_path / "text.txt"
    text.write_text(SHAKESPEARE.read_text()[:8_000] if SHAKESPEARE.is_file() else
                    "\n".join(f"line {i}: the quick brown fox {i % 7} jumps over {i % 11} dogs" for i in range(200)))
    return str(text)


def test_tiny_sweep_resumes_and_reports_its_own_results(corpus, tmp_path):
    out = tmp_path / "sweep"
    argv = ["--corpus", corpus, "--out", str(out), *FLAGS]
    share.main(argv[:-2] + ["--device", "cpu", "--seeds", "1"])  # a first, partial sweep: one seed
    first = os.path.getmtime(out / "text-V512" / "1x16-4" / "binary-seed0" / "final.json")
    rows = share.main(argv)  # the whole sweep reuses the finished runs, trains seed 1
    assert os.path.getmtime(out / "text-V512" / "1x16-4" / "binary-seed0" / "final.json") == first
    assert (out / "text-V1024" / "1x16-3" / "learned-seed1" / "final.json").exists()

    by = {(r["point"], r["input"]): r for r in rows}
    assert set(by) == {("text-V512/1x16-4", "binary"), ("text-V512/1x16-4", "affine"), ("text-V1024/1x16-3", "binary"),
                       ("text-V512/1x16-2", "binary"), ("text-V512/2x16-4", "binary"),
                       ("text-V512/1x16-4-w12", "binary")}
    r = by["text-V512/1x16-4", "binary"]
    # the share: the learned table over the learned model's trainable parameters; learned - binary = the table
    assert r["learned_trainable"] - r["binary_trainable"] == 512 * 16
    assert r["share"] == pytest.approx(512 * 16 / r["learned_trainable"])
    assert r["tokens"] == 4 * 2 * 16 and r["tokens_per_param"] == pytest.approx(128 / r["binary_trainable"])
    assert r["K"] == 9 and by["text-V1024/1x16-3", "binary"]["K"] == 10

    # the gap of each seed is binary - learned of that seed, read from the runs' final.json
    runs = out / "text-V512" / "1x16-4"
    loss = lambda v, s: json.loads((runs / f"{v}-seed{s}" / "final.json").read_text())["val_loss"]  # noqa: E731
    gaps = [loss("binary", s) - loss("learned", s) for s in (0, 1)]
    assert r["gap_nats"] == pytest.approx(gaps)
    assert r["gap_pct"] == pytest.approx([math.exp(g) - 1 for g in gaps])
    ppl = [math.exp(loss(v, s)) for v in ("learned", "binary") for s in (0, 1)]
    spread = max((max(p) - min(p)) / (sum(p) / 2) for p in (ppl[:2], ppl[2:]))
    assert r["spread"] == pytest.approx(spread)
    assert r["inside_spread"] == (abs(sum(r["gap_pct"]) / 2) <= spread)
    assert [t for t, _ in r["curve"]] == [0, 64, 128]  # evaluated at steps 0, 2, 4: tokens = step x 2 x 16

    # the width point: its binary runs have a 12-bit code, and its gap is against its V's own learned runs
    w = by["text-V512/1x16-4-w12", "binary"]
    wide = out / "text-V512" / "1x16-4-w12"
    assert sorted(p.name for p in wide.iterdir() if p.is_dir()) == ["binary-seed0", "binary-seed1"]
    first_entry = json.loads((wide / "binary-seed0" / "log.jsonl").read_text().split("\n")[0])
    assert first_entry["model_config"]["code_width"] == 12
    wgaps = [json.loads((wide / f"binary-seed{s}" / "final.json").read_text())["val_loss"] - loss("learned", s)
             for s in (0, 1)]
    assert w["K"] == 12 and w["gap_nats"] == pytest.approx(wgaps) and w["share"] == r["share"]

    # the report and the figure come from results.json alone: a rerun redraws them byte for byte
    # the figure is drawn where matplotlib is installed (it is optional)
    figure = out / "share.png"
    report, png = (out / "results.md").read_text(), figure.read_bytes() if figure.exists() else None
    assert figure.exists() == (share.compare.pyplot() is not None)
    assert f"| text | 512 (9) | 1x16 | binary | 2 | {100 * r['share']:.1f}% |" in report
    assert f"{100 * sum(r['gap_pct']) / 2:+.1f} ± " in report
    assert "Code width moved at fixed V=512 and shape (1x16, the same learned runs): K = 9 bits" in report
    assert json.loads(json.dumps(share.main(argv))) == json.loads((out / "results.json").read_text())["rows"]
    assert (out / "results.md").read_text() == report and (figure.read_bytes() if png else None) == png


def test_a_changed_setting_is_refused_before_training(corpus, tmp_path):
    argv = ["--corpus", corpus, "--out", str(tmp_path), *FLAGS[:-2], "--device", "cpu", "--seeds", "1",
            "--short_steps", "0", "--depth_point", "", "--affine_vocabs", "", "--width_point", ""]
    share.main(argv)
    with pytest.raises(ValueError, match="lr"):
        share.main(argv + ["--lr", "1e-3"])


def test_flags_are_checked():
    for bad, match in ((["--steps", "4"], "one value per --vocabs"), (["--vocabs", "0,512"], "positive integers"),
                       (["--depth_point", "1x16"], "1024:1x128"),
                       (["--width_point", "2048:16"], "1024:16"), (["--width_point", "512"], "1024:16"),
                       (["--seeds", "0"], "at least 1")):
        with pytest.raises(ValueError, match=match):
            share.main([*FLAGS, *bad])


def test_the_power_law_fit_recovers_a_known_exponent():
    per_param = 1000
    curve = [(t, [0.5 * (t / per_param) ** -0.4 * f for f in (0.9, 1.0, 1.1)]) for t in range(100, 4100, 250)]
    fit = share.fit_tokens(curve, per_param)
    assert fit["b"] == pytest.approx(0.4)
    assert fit["at_paper"] == pytest.approx(0.5 * share.PAPER["tokens_per_param"] ** -0.4)
    assert fit["b_range"][0] == pytest.approx(0.4) and fit["b_range"][1] == pytest.approx(0.4)  # seeds scale alike
    assert share.fit_tokens([(t, [-0.1]) for t, _ in curve], per_param) is None  # no power law through a gap <= 0
