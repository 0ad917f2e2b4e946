"""Smoke test of bench.py: every section runs on the tiny preset with tiny sizes. No timed assertions."""

import json

import bench

TINY = ["--preset=tiny", "--block_size=16", "--batch_size=2", "--steps=1", "--warmup=1", "--repeats=1",
        "--sample_preset=tiny", "--prompt_len=4", "--new_tokens=4", "--sample_batches=1,2",
        "--prep_copies=1", "--matmul_n=64"]


def test_run_reports_every_section(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("It is a truth universally acknowledged.\nThat a single man in possession.\n" * 200)
    cfg = bench.BenchConfig(**vars(bench.build_parser().parse_args(TINY + [f"--corpus={corpus}", "--workers=2"])))
    res = bench.run(cfg)
    tr = res["train"]
    assert tr["preset"] == "tiny" and tr["matmul_flops"] > 0 and tr["flops_per_token"] > 0
    assert set(tr["variants"]) == {"binary", "affine", "learned"}
    for r in tr["variants"].values():
        assert r["tokens_per_s"] > 0 and r["mfu_measured"] > 0 and r["steps_timed"] == 1
        assert r["mfu_peak"] is None  # CPU: no datasheet peak
    assert set(res["sample"]["batches"]) == {1, 2}
    for r in res["sample"]["batches"].values():
        assert min(r["kv_cache"], r["recompute"], r["hf_generate"]) > 0
        assert r["same_tokens_recompute"] is True and r["same_tokens_hf"] is True
    pr = res["prep"]
    assert pr["mb"] > 0 and pr["mb_s_1"] > 0 and pr["mb_s_all"] > 0 and pr["workers"] == 2
    assert pr["python_scaling"] > 0 and pr["tiktoken_scaling"] > 0
    verdicts = {t["target"].split(" ")[0]: t["verdict"] for t in res["targets"]}
    assert len(res["targets"]) == 4 and all(v in ("PASS", "MISS", "not measured") for v in verdicts.values())
    assert res["targets"][-1]["verdict"] == "not measured"  # no H200 here
    text = bench.table(res)
    for heading in ("training:", "sampling:", "data preparation:", "| target |"):
        assert heading in text
    json.dumps(res)  # --json works


def test_main_json_one_section(capsys):
    assert bench.main(TINY + ["--sections=sample", "--sample_batches=1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["train"] is None and res["prep"] is None
    assert res["sample"]["batches"]["1"]["same_tokens_hf"] is True
