"""
torchrun's processes, one per GPU (else one): each rank's device and process group, the DDP wrapper, and the
waits for rank 0's work alone (its checkpoint writes, its data scan), on purpose and under --dist_timeout.
"""

import inspect
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bincode_gpt.devices import pick_device


def start_processes(*, device_name, dist_timeout):
    """-> rank, world size, device, distributed. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; each rank gets one
    GPU, cuda:LOCAL_RANK (an explicit --device cuda:N other than that is refused: every rank would share GPU N), and
    joins the process group, whose collectives wait `dist_timeout` minutes."""
    if not (isinstance(dist_timeout, (int, float)) and 0 < dist_timeout < math.inf):
        raise ValueError(f"dist_timeout must be a number of minutes > 0, got {dist_timeout}")
    rank, local_rank, world, distributed = launch()
    device = pick_device(device_name)
    if distributed and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # one GPU per rank
    if distributed and device.type == "cuda" and device.index != local_rank:
        raise ValueError(f"--device {device_name} under torchrun: this rank's GPU is cuda:{local_rank} (its "
                         "LOCAL_RANK), and every rank would share the one named: leave --device at auto or cuda")
    if distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=dist_timeout))
    return rank, world, device, distributed


def data_parallel(model, device, compiled=False):
    """DDP over this rank's device, without its broadcast of the buffers before every forward: this model's
    (code table, lift, rotary tables) are constants built alike on every rank (the flag is forward_sync_buffers
    in torch 2.13, broadcast_buffers in earlier releases). Over a compiled model, gradient buckets of
    bucket_cap_mb(...) megabytes."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
               bucket_cap_mb=bucket_cap_mb(weights, compiled), **{BUFFER_SYNC: False})


def bucket_cap_mb(weight_bytes, compiled):
    """DDP's gradient bucket size. Eager: DDP's default, 25 MB. Compiled: torch.compile's DDP support splits the
    model's graph at every bucket boundary and compiles each piece alone (the torch.compile FAQ, "Do you support
    Distributed code?"), so 25 MB buckets cut the paper preset's 1.9 GB of gradients into ~75 graphs, each
    unable to fuse across its ends; 8 buckets keep all-reduce overlapping backward with 8 pieces."""
    if not compiled:
        return 25
    return max(25, math.ceil(weight_bytes / 8 / 2**20))


BUFFER_SYNC = next(k for k in ("forward_sync_buffers", "broadcast_buffers") if k in inspect.signature(DDP).parameters)


def wait_for_all(distributed, device):
    """Every rank waits here for the others: after rank 0's work alone (its checkpoint writes, its data scan), a
    wait on purpose, under --dist_timeout, rather than in whichever collective comes next."""
    if distributed and device.type == "cuda":
        dist.barrier(device_ids=[device.index])  # NCCL: on this rank's GPU, not a guess
    elif distributed:
        dist.barrier()




def launch():
    """-> rank, local rank, world size, distributed, from the environment. A torchrun launch sets all three
    of RANK, LOCAL_RANK and WORLD_SIZE; some cluster shells set RANK alone: with WORLD_SIZE unset or 1 that
    is one process (said on stderr), with WORLD_SIZE > 1 an error (start the processes with torchrun)."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: os.environ[k] for k in names if k in os.environ}
    values = {}
    for k, v in env.items():
        if not (v.strip().isdigit() and (k != "WORLD_SIZE" or int(v) >= 1)):
            raise ValueError(f"the environment sets {k}={v!r}: expected a whole number (torchrun sets it)")
        values[k] = int(v)
    if len(env) == 3:
        if values["RANK"] >= values["WORLD_SIZE"]:
            raise ValueError(f"the environment sets RANK={values['RANK']} but WORLD_SIZE={values['WORLD_SIZE']}")
        return values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"], True
    if env:
        unset = ", ".join(k for k in names if k not in env)
        if values.get("WORLD_SIZE", 1) > 1:
            raise ValueError(f"the environment sets WORLD_SIZE={values['WORLD_SIZE']} but not {unset}: start "
                             "multi-process runs with torchrun")
        print(f"note: the environment sets {', '.join(f'{k}={v}' for k, v in env.items())} but not {unset}: "
              "not a torchrun launch, so this is one process", file=sys.stderr)
    return 0, 0, 1, False


