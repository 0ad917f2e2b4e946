"""
Starting processes: one per GPU under torchrun (DDP), else one; its device and its precision.
"""

import os
import sys

import torch
import torch.distributed as dist

from common import has_bf16, pick_device


def start_processes(cfg):
    """-> rank, world size, device, distributed. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; each rank
    gets one GPU (cuda:LOCAL_RANK unless --device names one) and joins the process group."""
    rank, local_rank, world, distributed = launch()
    device = pick_device(cfg.device)
    if distributed and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # one GPU per rank
    if distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device, distributed


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


def pick_dtype(cfg, device):
    """--dtype auto: bfloat16 on a CUDA GPU with bfloat16 units (common.has_bf16), else float32. bfloat16 is
    autocast on CUDA and CPU; elsewhere (MPS) it is refused rather than run in float32 under its name."""
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if has_bf16(device) else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {cfg.dtype!r}")
    if dtype == "bfloat16" and device.type not in ("cuda", "cpu"):
        raise ValueError(f"--dtype bfloat16 runs on CUDA and CPU here, not on {device.type}: use --dtype float32")
    return dtype


def set_precision(cfg, device):
    """-> the run's dtype (pick_dtype); TF32 matmuls on CUDA."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return pick_dtype(cfg, device)

