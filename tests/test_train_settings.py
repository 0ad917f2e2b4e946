"""Tests of train.py's refusals before anything is written: data, shards, devices, settings that cannot work,
memory, the model's shape (preset < checkpoint < overrides: checkpoint.model_config), the settings' own checks
(train.checked), the command line."""

import json
import math
import re
from dataclasses import fields, replace

import pytest
import torch

import train
from bincode_gpt.checkpoint import model_config
from bincode_gpt.exits import run_main
from bincode_gpt.shards import ShardError
from model import GPTConfig, canonical_code
# the run's helpers, and its autouse fixture one_thread (one thread a process)
from test_train import cli, config, copy_data, expect_error, flags, one_thread  # noqa: F401 (one_thread)


def test_bad_data_dirs_name_the_file(data_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    expect_error(config(empty, tmp_path / "o"), str(empty))  # no meta.json
    assert "meta.json" in expect_error(config(tmp_path / "nowhere", tmp_path / "o"), "nowhere")
    # meta.json listing no shards / no val shards / a missing shard
    d = copy_data(data_dir, tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    for splits, what in [({"train": {"shards": []}, "val": {"shards": []}}, "malformed"),
                         ({**meta["splits"], "val": {"shards": [], "tokens": 0}}, "no val shards"),
                         ({**meta["splits"], "val": {"shards": ["val_000009.bin"], "tokens": 1}}, "val_000009.bin")]:
        (d / "meta.json").write_text(json.dumps({**meta, "splits": splits}))
        expect_error(config(d, tmp_path / "o"), what)
        assert str(d) in expect_error(config(d, tmp_path / "o"), "")


@pytest.mark.parametrize("damage", ["magic", "truncated"])
def test_bad_shards_name_the_file(data_dir, tmp_path, damage):
    d = copy_data(data_dir, tmp_path)
    shard = d / "train_000000.bin"
    raw = shard.read_bytes()
    shard.write_bytes(b"NOTTOKEN" + raw[8:] if damage == "magic" else raw[:-100])
    with pytest.raises(ShardError, match=str(shard)):
        train.train(config(d, tmp_path / "o"))


def test_tokens_beyond_the_vocabulary_name_the_shard(data_dir, tmp_path):
    msg = expect_error(config(data_dir, tmp_path, vocab_size=300), str(data_dir / "train_000000.bin"))
    assert "vocab_size 300" in msg and "meta.json" in msg


def test_bad_devices_are_one_error_line(data_dir, tmp_path, capsys):
    assert run_main(train.main, flags(data_dir, tmp_path, device="bogus")) == 1
    assert capsys.readouterr().err == "error: unknown device 'bogus': use auto, cpu, cuda, cuda:N or mps\n"
    if not torch.cuda.is_available():  # a CPU build
        assert run_main(train.main, flags(data_dir, tmp_path, device="cuda")) == 1
        assert capsys.readouterr().err == ("error: device 'cuda' asked for, but this PyTorch build sees no CUDA GPU: "
                                           "use --device cpu\n")
    assert not tmp_path.joinpath("ckpt.pt").exists()


@pytest.mark.parametrize("name", ["max_steps", "eval_interval", "save_interval", "warmup_steps"])
def test_negative_counts_are_refused_not_read_as_never(data_dir, tmp_path, capsys, name):
    assert run_main(train.main, flags(data_dir, tmp_path, **{name: -1})) == 1
    assert capsys.readouterr().err == f"error: {name} must be 0 or more, got -1\n"
    assert not tmp_path.joinpath("ckpt.pt").exists()


def test_the_default_data_dir_says_how_to_make_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main(train.main, ["--device=cpu"]) == 1
    assert capsys.readouterr().err == ("error: data/shakespeare: no meta.json; prepare the data first "
                                       "(`python prepare_data.py shakespeare` writes the default, data/shakespeare)\n")


@pytest.mark.parametrize("argv, message", [
    (["--grad_clip=nan"], "grad_clip must be a finite number >= 0 (0: no clipping), got nan"),
    (["--grad_clip=-1"], "grad_clip must be a finite number >= 0 (0: no clipping), got -1.0"),
    (["--lr=inf"], "lr must be a finite number >= 0, got inf"),
    (["--lr=1e39"], "lr must be a finite number >= 0, got 1e+39"),  # past float32, which AdamW's update uses
    (["--beta2=1"], "beta2 must be in [0, 1), got 1.0"),
    (["--min_lr=1e-2"], "min_lr 0.01 is above lr 0.003: the cosine decays from lr down to min_lr"),
    (["--resume", "--init_from=x.pt"], "--resume continues out_dir's ckpt.pt and --init_from starts afresh from "
                                       "another checkpoint's weights: pass one of them"),
    (["--init_from="], "--init_from is '' (empty): name a file"),
    # failed mid-run: numpy's order takes no negative seed
    (["--seed=-1"], "seed must be in [0, 2**63), got -1"),
    (["--rope_base=0"], "preset 'tiny' with vocab_size 512 (from {meta} unless --vocab_size): rope_base must be a "
                        "number > 1 (the rotary base, 10000 in most models), got 0.0"),
    (["--rope_base=-5"], "preset 'tiny' with vocab_size 512 (from {meta} unless --vocab_size): rope_base must be a "
                         "number > 1 (the rotary base, 10000 in most models), got -5.0"),
])
def test_settings_that_cannot_work_are_refused_not_turned_off(data_dir, tmp_path, capsys, argv, message):
    assert run_main(train.main, flags(data_dir, tmp_path / "out") + argv) == 1
    assert capsys.readouterr().err == f"error: {message.format(meta=data_dir / 'meta.json')}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, counts, advice", [
    ("--n_layer=1000000000", "12,288,000,016,384 parameters", "train a smaller model"),
    ("--batch_size=1000000000", "logits of 1,000,000,000 x 32 tokens", r"--batch_size [\d]+ fits \(--grad_accum keeps "
                                                                       r"the tokens a step\)")])
def test_a_run_that_cannot_fit_is_refused_before_building(data_dir, tmp_path, capsys, flag, counts, advice):
    """A billion layers built for hours; a billion sequences ended in the OOM killer (exit -9). The refusal names
    the largest micro-batch that fits (memory.largest_batch)."""
    assert run_main(train.main, flags(data_dir, tmp_path) + [flag]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(rf"error: this run needs about [\d,.]+ GiB \(.*{counts}.*\), but [\d,.]+ GiB is free on cpu: "
                        rf"{advice}\n", err), err
    assert not tmp_path.joinpath("ckpt.pt").exists()


def test_a_grad_clip_of_nan_is_refused_on_the_command_line(data_dir, tmp_path):
    assert cli(*flags(data_dir, tmp_path, grad_clip="nan")) == (
        1, "", "error: grad_clip must be a finite number >= 0 (0: no clipping), got nan\n")


def test_command_line(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    for f in train.TrainConfig.__dataclass_fields__:
        assert f"--{f}" in help_text
    cfg = train.parse_config(["--compile", "--no-resume", "--bias=false", "--dropout=0.1", "--max_steps=5e3",
                              "--pad_token_id=none", "--peak_flops=1e12", "--init_from=x.pt"])
    assert cfg == replace(train.TrainConfig(), compile=True, resume=False, bias=False, dropout=0.1, max_steps=5000,
                          peak_flops=1e12, init_from="x.pt")
    assert train.parse_config(["--compile=false", "--resume=true"]).resume is True
    with pytest.raises(SystemExit):
        train.parse_config(["--compile=maybe"])


def test_preset_that_does_not_fit_the_data_says_why(data_dir, tmp_path):
    # the paper preset's <pad> id 57344 does not exist in a 512-token vocabulary taken from meta.json
    msg = expect_error(config(data_dir, tmp_path, preset="paper", block_size=None), "pad_token_id 57344")
    assert str(data_dir / "meta.json") in msg


def test_no_pad_row_on_a_token_the_data_can_produce(data_dir, tmp_path, monkeypatch, capsys):
    """An all-zeros <pad> row on an id the data's tokenizer produces would feed that token in as a constant
    vector (the rule above model.BinaryCodeInput). A tiktoken vocabulary has no <pad>, so a preset's <pad>
    (the paper preset's 57344, the released tokenizer's) is dropped with a note, an explicit one is refused,
    and one past the data's ids (a model vocabulary larger than the data's) stays."""
    meta = json.loads((data_dir / "meta.json").read_text())
    paper = config(data_dir, tmp_path, preset="paper", block_size=None)
    def shape(cfg, meta):  # the model's shape as train.py asks for it (train.train: the overrides)
        asked = {f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}
        return model_config(cfg.preset, asked, meta=meta, meta_path="m", ckpt=None, source="x")

    assert shape(paper, {**meta, "vocab_size": 65536}).pad_token_id is None
    assert shape(replace(paper, vocab_size=65536), meta).pad_token_id == 57344  # past id 511
    expect_error(config(data_dir, tmp_path, pad_token_id=5), "--pad_token_id 5 is a token of the data's tokenizer")
    monkeypatch.setitem(train.PRESETS, "tiny", {**train.PRESETS["tiny"], "pad_token_id": 5})
    train.train(config(data_dir, tmp_path, max_steps=1, eval_interval=1))
    out = capsys.readouterr().out
    assert "preset tiny's pad_token_id 5 (the released tokenizer's <pad>) is a token of this data's tokenizer" in out
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["model_config"]["pad_token_id"] is None
    assert torch.equal(ckpt["model"]["embed.weight"], canonical_code(512))


@pytest.mark.parametrize("changes, message", [
    (dict(batch_size=0), "batch_size must be at least 1, got 0"),
    (dict(save_interval=-1), "save_interval must be 0 or more, got -1"),
    (dict(weight_decay=math.nan), "weight_decay must be a finite number >= 0, got nan"),
    (dict(beta1=1.0), "beta1 must be in [0, 1), got 1.0"),
    (dict(lr_decay_steps=0), "lr_decay_steps must be at least 1 (or none: max_steps), got 0"),
    (dict(peak_flops=0.0), "peak_flops must be a finite number > 0 (or none), got 0.0"),
    (dict(resume=True, overwrite=True), "--resume continues the checkpoint in out_dir and --overwrite replaces it"),
    (dict(out_dir=""), "--out_dir is '' (empty): name a folder"),
])
def test_settings_that_cannot_work_are_refused(changes, message):
    """TrainConfig's own checks (train.checked): the defaults pass, with min_lr's default filled in (lr / 10) on a
    copy, the caller's config left as it was; a value the run cannot use is refused with its name."""
    cfg = train.TrainConfig()
    assert train.checked(cfg) == replace(cfg, min_lr=cfg.lr / 10) and cfg.min_lr is None
    with pytest.raises(ValueError, match=re.escape(message)):
        train.checked(replace(cfg, **changes))
