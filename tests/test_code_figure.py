"""tools/code_figure.py: the figure shows exactly the inputs the model computes, and replaces only its own file."""

import pytest
import torch

from bincode_gpt.exits import run_main
from tools import code_figure


def test_panels_are_the_code_and_its_two_lifts():
    (code, code_cols), (tile, tile_cols), (inter, inter_cols) = code_figure.panels(16, 16).values()
    t, j = torch.arange(16)[:, None], torch.arange(16)[None, :]
    assert torch.equal(code, ((t >> torch.arange(4)) & 1).float())  # row t: the bits of t, least significant first
    assert torch.equal(tile, ((t >> (j % 4)) & 1).float()) and tile_cols.tolist() == [0, 1, 2, 3] * 4
    assert torch.equal(inter, ((t >> (j // 4)) & 1).float())
    assert inter_cols.tolist() == [k for k in range(4) for _ in range(4)]
    assert code_cols.tolist() == [0, 1, 2, 3]


def test_writes_its_png_and_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "code.png"
    assert run_main(code_figure.main, ["--out", str(out), "--vocab_size", "8", "--n_embd", "6", "--token", "5"]) == 0
    first = out.read_bytes()
    assert first.startswith(b"\x89PNG") and code_figure.MARK.encode() in first[:4096]
    assert run_main(code_figure.main, ["--out", str(out), "--vocab_size", "8", "--n_embd", "6", "--token", "5"]) == 0
    assert out.read_bytes() == first  # the same picture again, byte for byte
    theirs = tmp_path / "theirs.png"
    theirs.write_bytes(b"\x89PNG a user's picture")
    capsys.readouterr()
    assert run_main(code_figure.main, ["--out", str(theirs)]) == 1
    assert capsys.readouterr().err == (f"error: {theirs} exists and this tool did not write it: it is left alone; "
                                       "choose another --out\n")
    assert theirs.read_bytes() == b"\x89PNG a user's picture"
