"""
Devices: which one a script runs on, whether it has bfloat16 units, and its peak FLOP/s (for MFU).
"""


# dense (no 2:4 sparsity) tensor-core peak FLOP/s of one device from the vendor's datasheet, (bfloat16, TF32): a
# float32 run's matmuls run in TF32 on CUDA (devices.set_precision), so its MFU is against the TF32 peak. By the exact
# name torch.cuda.get_device_name returns: a name not here gets no MFU (--peak_flops gives one), never a
# neighbour's figure ("NVIDIA L40" is not an L4, "NVIDIA RTX A1000" not an A100, an H100 PCIe not an SXM one)
PEAK_FLOPS = {
    "NVIDIA B200": (2250e12, 1100e12),
    "NVIDIA H200": (989e12, 494.5e12),  # SXM
    "NVIDIA H200 NVL": (835e12, 417.5e12),
    "NVIDIA GH200 480GB": (989e12, 494.5e12),
    "NVIDIA H100 80GB HBM3": (989e12, 494.5e12),  # SXM5
    "NVIDIA H100 PCIe": (756e12, 378e12),
    "NVIDIA H100 NVL": (835e12, 417.5e12),
    "NVIDIA H800": (989e12, 494.5e12),
    "NVIDIA A100-SXM4-80GB": (312e12, 156e12),
    "NVIDIA A100-SXM4-40GB": (312e12, 156e12),
    "NVIDIA A100-PCIE-40GB": (312e12, 156e12),
    "NVIDIA A100 80GB PCIe": (312e12, 156e12),
    "NVIDIA A800-SXM4-80GB": (312e12, 156e12),
    "NVIDIA A10": (125e12, 62.5e12),
    "NVIDIA A40": (149.7e12, 74.8e12),
    "NVIDIA L40S": (362e12, 183e12),
    "NVIDIA L40": (181e12, 90.5e12),
    "NVIDIA L4": (121e12, 60e12),
    "NVIDIA RTX A6000": (154.8e12, 77.4e12),
    "NVIDIA RTX 6000 Ada Generation": (364.2e12, 91.1e12),
}


def peak_flops(device, dtype="bfloat16"):
    """Peak FLOP/s of one device for a run in `dtype`, for MFU: PEAK_FLOPS's entry for this GPU's exact name (the
    bfloat16 figure, or TF32's for float32), else None (no CPU figure)."""
    import torch

    if device.type != "cuda" or torch.cuda.get_device_name(device) not in PEAK_FLOPS:
        return None
    bf16, tf32 = PEAK_FLOPS[torch.cuda.get_device_name(device)]
    return bf16 if dtype == "bfloat16" else tf32



def has_bf16(device):
    """Whether `device` is a CUDA GPU with bfloat16 tensor cores (compute capability 8.0 on: Ampere and later),
    where --dtype auto picks bfloat16. torch.cuda.is_bf16_supported() also counts emulation: a V100 or T4 would
    then pick a bfloat16 slower than its float32."""
    import torch

    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def pick_device(name="auto"):
    """'auto' -> cuda, then mps, then cpu. An explicit name must be usable here, or ValueError says why."""
    import torch  # here, not at the top: prepare_data.py needs no torch, and importing it takes seconds

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this PyTorch build sees no CUDA GPU: use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are visible")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {name!r} asked for, but MPS is not available here: use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {name!r}: use auto, cpu, cuda, cuda:N or mps")
    return device


def auto_dtype(device):
    """The one rule of --dtype auto, in training and sampling: bfloat16 on a CUDA GPU with bfloat16 units
    (has_bf16), else float32."""
    return "bfloat16" if has_bf16(device) else "float32"


def pick_dtype(name, device, *, sampling=False):
    """A run's dtype (train.py, tools/compare.py; sample.py with `sampling`): auto_dtype's for auto. Training
    autocasts to it: bfloat16 runs on CUDA and CPU; elsewhere (MPS) it is refused rather than run in float32
    under its name. -> "float32" or "bfloat16". Sampling casts the weights to it, any of sample.py's --dtype
    choices (float16 too) on any device: -> its name."""
    dtype = name
    if dtype == "auto":
        dtype = auto_dtype(device)
    if sampling:
        return dtype
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {name!r}")
    if dtype == "bfloat16" and device.type not in ("cuda", "cpu"):
        raise ValueError(f"--dtype bfloat16 runs on CUDA and CPU here, not on {device.type}: use --dtype float32")
    return dtype


def set_precision(name, device):
    """-> the run's dtype (pick_dtype); TF32 matmuls on CUDA."""
    import torch

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return pick_dtype(name, device)
