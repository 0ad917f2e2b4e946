"""tools/gpu_check.py's CPU dry run: the same steps as on a GPU, through the scripts' real command lines, at
tiny sizes; a failing step is a FAIL row and exit status 1."""

import os

import pytest
import torch

from tools import gpu_check


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the subprocesses' tiny models run fastest on one thread


def rows(report):
    """{check: (result, note)} of the markdown table."""
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in report.splitlines() if line.startswith("| ")]
    return {c[0]: (c[1], c[-1]) for c in cells[1:]}


def test_the_dry_run_passes_every_step(tiny_data, tmp_path, capsys):
    code = gpu_check.main(["--device", "cpu", "--data_dir", tiny_data, "--work", str(tmp_path / "work"),
                           "--out", str(tmp_path / "table.md"), "--steps", "6", "--sample_tokens", "8",
                           "--no-sample_compile"])  # sample.py --compile: tests/test_sample.py
    report = (tmp_path / "table.md").read_text()
    assert code == 0 and capsys.readouterr().out == report
    got = rows(report)
    assert list(got) == ["train (quick start)", "SIGTERM, then --resume", "--init_from", "torchrun, 2 processes",
                         "sample.py, eager", "sample.py, compiled", "sample.py, CUDA graphs"]
    assert got.pop("sample.py, compiled") == ("skipped", "skipped (--no-sample_compile)")
    assert got.pop("sample.py, CUDA graphs") == ("skipped", "skipped: CUDA only (sample.py refuses --cuda_graphs here)")
    assert all(result == "ok" for result, _ in got.values()), report
    assert got["SIGTERM, then --resume"][1].endswith("resumed to 6: log bit-identical")
    first, last = [float(w) for w in got["--init_from"][1].replace(",", "").split() if w[0].isdigit()]
    assert first == last
    assert (tmp_path / "work" / "reference" / "ckpt.pt").is_file()  # --work is kept


def test_a_failing_step_is_a_fail_row_and_exit_1(tmp_path, capsys):
    os.makedirs(tmp_path / "empty")
    code = gpu_check.main(["--device", "cpu", "--data_dir", str(tmp_path / "empty"), "--steps", "2"])
    got = rows(capsys.readouterr().out)
    assert code == 1 and got["train (quick start)"][0] == "**FAIL**" and "meta.json" in got["train (quick start)"][1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is the GPU here")
def test_auto_without_a_gpu_says_how_to_dry_run():
    with pytest.raises(ValueError, match="--device cpu runs the same steps"):
        gpu_check.main([])
