"""bincode_gpt/ranks.py, tested on a CPU with GPUs stood in for: a torchrun rank joins on its own GPU (its LOCAL_RANK)
under --dist_timeout (and computes in the dtype train.py asks devices.set_precision for on it); every rank builds the
same buffers, so DDP need not broadcast them; DDP's gradient buckets over a compiled model. Training under torchrun
itself: tests/test_train_ddp.py."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

import train
from bincode_gpt import devices, ranks
from model import GPT, get_config

INPUTS = ("learned", "binary", "affine")


def joined_on(monkeypatch, local_rank):
    """A torchrun rank's environment with GPUs stood in for: -> the list of what start_processes joins."""
    for k, v in dict(RANK="1", LOCAL_RANK=str(local_rank), WORLD_SIZE="2").items():
        monkeypatch.setenv(k, v)
    joined = []
    monkeypatch.setattr(ranks, "pick_device", lambda name: torch.device("cuda" if name == "auto" else name))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: joined.append(device))
    monkeypatch.setattr(ranks.dist, "init_process_group", lambda backend, **kw: joined.append((backend, kw)))
    # set_precision's TF32 switches, stood in for: this process's own stay as they are
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=False))
    monkeypatch.setattr(torch.backends, "cudnn", SimpleNamespace(allow_tf32=False))
    return joined


@pytest.mark.parametrize("asked", ["cuda:0", "cuda:2"])
def test_a_gpu_other_than_local_rank_is_refused_under_torchrun(monkeypatch, asked):
    """--device cuda:N under torchrun would put every rank on GPU N: refused before the rank joins, naming its own."""
    joined = joined_on(monkeypatch, local_rank=1)
    with pytest.raises(ValueError) as e:
        ranks.start_processes(device_name=asked, dist_timeout=30.0)
    assert str(e.value) == (f"--device {asked} under torchrun: this rank's GPU is cuda:1 (its LOCAL_RANK), and every "
                            "rank would share the one named: leave --device at auto or cuda")
    assert joined == []


@pytest.mark.parametrize("asked", ["auto", "cuda", "cuda:1"])
def test_each_rank_takes_its_local_rank_and_waits_dist_timeout(monkeypatch, asked):
    """... and computes in the dtype asked for, with TF32 matmuls on its GPU."""
    joined = joined_on(monkeypatch, local_rank=1)
    gpu = torch.device("cuda", 1)
    started = ranks.start_processes(device_name=asked, dist_timeout=2.5)
    assert started == (1, 2, gpu, True)
    assert joined == [gpu, ("nccl", {"timeout": timedelta(minutes=2.5)})]
    assert devices.set_precision("float32", started[2]) == "float32"  # as train.py asks on the rank's GPU
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize("minutes", [0, -1.0, float("nan"), float("inf")])
def test_a_dist_timeout_that_is_no_wait_is_refused(monkeypatch, minutes):
    joined = joined_on(monkeypatch, local_rank=1)
    with pytest.raises(ValueError) as e:
        ranks.start_processes(device_name="auto", dist_timeout=minutes)
    assert str(e.value) == f"dist_timeout must be a number of minutes > 0, got {minutes}" and joined == []


@pytest.mark.parametrize("input", INPUTS)
def test_every_rank_builds_the_same_buffers(input):
    """Why DDP need not broadcast the buffers: ranks draw their init from seed + rank, yet the buffers (code table,
    lift, rotary tables, affine A and b) come out the same, bit for bit; the parameters differ."""
    built = []
    for rank in range(2):
        torch.manual_seed(7 + rank)
        built.append(GPT(get_config("tiny", input=input)))
    one, two = (dict(m.named_buffers()) for m in built)
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert not torch.equal(built[0].lm_head.weight, built[1].lm_head.weight)


def test_compiled_ddp_cuts_the_paper_model_into_eight_buckets_not_seventy_five():
    """ranks.bucket_cap_mb: DDP's 25 MB eager; over a compiled model (its graph split at each bucket) eight buckets
    of the paper preset's float32 gradients, and never below DDP's default."""
    with torch.device("meta"):
        paper = GPT(get_config("paper"))
    weights = sum(p.numel() * p.element_size() for p in paper.parameters() if p.requires_grad)
    assert ranks.bucket_cap_mb(weights, compiled=False) == 25 and weights / 25 / 2**20 > 70
    assert ranks.bucket_cap_mb(weights, compiled=True) == 225 and 7 < weights / 225 / 2**20 <= 8
    assert ranks.bucket_cap_mb(10**6, compiled=True) == 25


def test_a_bad_setting_is_refused_before_any_process_starts(monkeypatch):
    """train() checks its settings (train.checked) first: a bad one is refused before a process group is joined,
    so no torchrun rank waits in a collective for a run that was never going to start."""
    def start_processes(**settings):
        raise AssertionError("the processes started before the settings were checked")

    monkeypatch.setattr(ranks, "start_processes", start_processes)
    with pytest.raises(ValueError, match=r"^batch_size must be at least 1, got 0$"):
        train.train(train.TrainConfig(batch_size=0))
