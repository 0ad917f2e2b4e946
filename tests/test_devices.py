"""The GPU path, tested on a CPU: every tensor a checkpoint gives a model ends on the model's device (the meta
device stands in for a GPU: a tensor left on the file's device, the CPU, shows), the optimizer's state and
kernel follow the parameters, sampling never reads the optimizer state, rotary tables in the activations' dtype,
the MFU table by exact GPU names, bfloat16 where it is native. A torchrun rank on its own GPU: tests/test_ranks.py."""

import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

from bincode_gpt import checkpoint, devices, ranks
import sample
import train
from bincode_gpt.checkpoint import checkpoint_dict, load_checkpoint, load_weights, read_checkpoint
from bincode_gpt.run_dir import load_optimizer_state, OPTIMIZER_KERNEL
from bincode_gpt.devices import has_bf16, PEAK_FLOPS, peak_flops
from bincode_gpt.devices import pick_dtype
from model import GPT, apply_rotary, get_config, rotary_cos_sin
from tools import convert

META = torch.device("meta")
INPUTS = ("learned", "binary", "affine")


def tensors(model):
    """Every parameter and buffer (persistent or not) of a module, by name."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def off_device(model, device):
    return sorted(n for n, t in tensors(model).items() if t.device != device)


def saved(tmp_path, input, **extra):
    torch.manual_seed(0)
    model = GPT(get_config("tiny", input=input))
    path = tmp_path / f"{input}.pt"
    torch.save(checkpoint_dict(model, None, **extra), path)
    return model, str(path)


@pytest.mark.parametrize("input", INPUTS)
def test_load_weights_puts_every_tensor_on_the_models_device(tmp_path, input):
    """A model on another device than the file's takes each tensor there: none stays on the CPU."""
    _, path = saved(tmp_path, input)
    ckpt = read_checkpoint(path)
    model = GPT(get_config("tiny", input=input)).to(META)
    load_weights(model, ckpt["model"], path)
    assert off_device(model, META) == []
    on_cpu = GPT(get_config("tiny", input=input))  # on the file's device: the file's own tensors, not copies
    load_weights(on_cpu, ckpt["model"], path)
    assert all(on_cpu.state_dict()[k].data_ptr() == t.data_ptr() for k, t in ckpt["model"].items())


@pytest.mark.parametrize("input", INPUTS)
def test_load_checkpoint_moves_the_model_and_leaves_the_rest_in_the_file(tmp_path, input):
    """What sample.py and tools/compare.py do: the model on the device, the optimizer moments never read onto it."""
    model, path = saved(tmp_path, input, optimizer={"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": []})
    loaded, ckpt = load_checkpoint(path, META)
    assert off_device(loaded, META) == []
    assert ckpt["optimizer"]["state"][0]["exp_avg"].device.type == "cpu"
    back, _ = load_checkpoint(path, "cpu")
    assert off_device(back, torch.device("cpu")) == []
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))


def test_an_int8_checkpoint_is_a_cpu_model_and_refused_elsewhere(tmp_path):
    _, path = saved(tmp_path, "binary")
    out = str(tmp_path / "q")
    assert convert.main(["native2int8", path, out]) == 0
    model, _ = load_checkpoint(out, int8=True, pack=False)
    assert off_device(model, torch.device("cpu")) == []
    with pytest.raises(ValueError, match="CPU path"):
        load_checkpoint(out, META, int8=True)


def test_load_optimizer_state_keeps_the_kernel_of_this_device():
    """A CPU run's AdamW state (fused None) resumed where AdamW is fused stays fused, its moments equal."""
    w = torch.nn.Parameter(torch.randn(4, 4))
    cpu_run = torch.optim.AdamW([w], lr=1e-3)
    w.grad = torch.randn(4, 4)
    cpu_run.step()
    fused = torch.optim.AdamW([torch.nn.Parameter(w.detach().clone())], lr=1e-3, fused=True)
    load_optimizer_state(fused, cpu_run.state_dict())
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["lr"] == 1e-3
    assert torch.equal(fused.state[fused.param_groups[0]["params"][0]]["exp_avg"], cpu_run.state[w]["exp_avg"])
    with pytest.raises(ValueError):  # a state of another shape: torch's own refusal, not a silent zip
        load_optimizer_state(fused, {**cpu_run.state_dict(), "param_groups": cpu_run.state_dict()["param_groups"] * 2})


class Started(Exception):
    """Raised in place of the training loop: set-up is done, its Run is here to inspect."""

    def __init__(self, run):
        self.run = run


def started_on_meta(cfg, monkeypatch):
    """train.train(cfg) on the meta device, stopped where the loop would start -> its Run. The checkpoint is read
    on the CPU as on a GPU machine; window checks that read the model's values are recorded, not run."""
    monkeypatch.setattr(ranks, "pick_device", lambda name: META)
    seen = {}
    monkeypatch.setattr(train, "constant_input_ids", lambda model: seen.update(off=off_device(model, META)) or [])

    def loop(run, state):
        raise Started(run)

    monkeypatch.setattr(train, "loop", loop)
    with pytest.raises(Started) as started, warnings.catch_warnings():
        # a meta parameter holds no values: torch warns that copying a checkpoint's weights into it does nothing
        warnings.filterwarnings("ignore", "for .*: copying from a non-meta parameter", UserWarning)
        train.train(cfg)
    return started.value.run, seen


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    """{input: the TrainConfig of a 2-step CPU run of the tiny preset, its ckpt.pt written}."""
    threads, out, cfgs = torch.get_num_threads(), tmp_path_factory.mktemp("runs"), {}
    torch.set_num_threads(1)
    for input in INPUTS:
        cfgs[input] = train.TrainConfig(data_dir=tiny_data, out_dir=str(out / input), preset="tiny", input=input,
                                        block_size=32, batch_size=4, max_steps=2, warmup_steps=1, eval_interval=0,
                                        log_interval=1000, save_interval=0, device="cpu", seed=0)
        train.train(cfgs[input])
    torch.set_num_threads(threads)
    return cfgs


def resumed(cfg, tmp_path, how):
    """cfg's run continued (--resume, in a copy of its folder) or fine-tuned from (--init_from)."""
    if how == "init_from":
        return train.TrainConfig(**{**vars(cfg), "init_from": cfg.ckpt_path, "out_dir": str(tmp_path / "tuned")})
    shutil.copytree(cfg.out_dir, tmp_path / "run")
    return train.TrainConfig(**{**vars(cfg), "resume": True, "max_steps": 4, "out_dir": str(tmp_path / "run")})


@pytest.mark.parametrize("how", ["resume", "init_from"])
@pytest.mark.parametrize("input", INPUTS)
def test_every_tensor_of_a_resumed_run_is_on_its_device(runs, tmp_path, monkeypatch, input, how):
    """The invariant: every parameter, buffer and optimizer state of a run resumed (or started --init_from) on a
    device other than the checkpoint file's lies on that device. Torch keeps an unfused, uncapturable AdamW's step
    counts on the CPU by design: those are the one exception, and only where the kernel is neither."""
    run, seen = started_on_meta(resumed(runs[input], tmp_path, how), monkeypatch)
    assert seen["off"] == [], f"{seen['off']} left on the file's device when set-up first reads the model"
    assert off_device(run.raw_model, META) == []
    opt = run.optimizer
    for group in opt.param_groups:
        kernel_on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            assert p.device == META
            for k, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v) and not (k == "step" and not kernel_on_device):
                    assert v.device == META, f"optimizer state {k} on {v.device}"
    assert (len(opt.state) > 0) == (how == "resume")  # the resumed run did load its moments


def test_a_resumed_optimizer_keeps_the_kernel_of_its_device(runs, tmp_path, monkeypatch):
    """A checkpoint's param groups name the kernel of the device that wrote it (fused on a GPU, here foreach):
    resumed elsewhere, the optimizer keeps the kernel set-up chose for its own device."""
    cfg = resumed(runs["learned"], tmp_path, "resume")
    ckpt = torch.load(cfg.ckpt_path, weights_only=True)
    for group in ckpt["optimizer"]["param_groups"]:
        group.update(foreach=True, fused=False)
    torch.save(ckpt, cfg.ckpt_path)
    run, _ = started_on_meta(cfg, monkeypatch)
    fresh = run.raw_model.configure_optimizers(cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), "meta")
    assert [{k: g[k] for k in OPTIMIZER_KERNEL} for g in run.optimizer.param_groups] == \
        [{k: g[k] for k in OPTIMIZER_KERNEL} for g in fresh.param_groups]


def test_a_resumed_capturable_optimizer_has_its_steps_on_the_device_too(runs, tmp_path, monkeypatch):
    """Where this device's kernel keeps AdamW's step counts on the device (fused or capturable, as on a GPU), a
    state written by a CPU run (neither) is loaded with them there too: every state tensor on the model's device."""
    configure = GPT.configure_optimizers

    def capturable(model, *args):
        optimizer = configure(model, *args)
        for group in optimizer.param_groups:
            group["capturable"] = True
        return optimizer

    monkeypatch.setattr(GPT, "configure_optimizers", capturable)
    run, _ = started_on_meta(resumed(runs["binary"], tmp_path, "resume"), monkeypatch)
    states = [v for s in run.optimizer.state.values() for v in s.values()]
    assert len(states) == 3 * len(run.optimizer.state) > 0 and all(v.device == META for v in states)


def sampled_model(runs, monkeypatch, *flags):
    """The model sample.py (with `flags`, on the meta device) has built and moved when it sizes the KV cache."""
    monkeypatch.setattr(sample, "pick_device", lambda name: META)
    built = []
    monkeypatch.setattr(sample, "check_start", lambda model, *args: built.append(model))  # reads its values

    def check_cache_fits(config, positions, device, dtype):
        model = built[0]
        assert config is model.config and device == META and dtype == next(model.parameters()).dtype
        raise Started(model)

    monkeypatch.setattr(sample, "check_cache_fits", check_cache_fits)
    with pytest.raises(Started) as started:
        sample.main(["--ckpt", runs["binary"].out_dir, "--max_new_tokens", "2", *flags])
    return started.value.run


def test_sample_moves_the_model_and_measures_the_cache_there(runs, monkeypatch):
    """sample.py builds the model from the CPU map, then moves it: on the device when the KV cache is sized."""
    model = sampled_model(runs, monkeypatch, "--dtype", "bfloat16")
    assert off_device(model, META) == [] and next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("bf16_units, dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_sample_auto_dtype_is_bfloat16_where_the_gpu_has_its_units(runs, monkeypatch, bf16_units, dtype):
    """sample.py --dtype auto (the default): bfloat16 on a CUDA GPU with bfloat16 units, else float32."""
    monkeypatch.setattr(devices, "has_bf16", lambda device: bf16_units)  # devices.auto_dtype's question
    assert next(sampled_model(runs, monkeypatch).parameters()).dtype == dtype


def test_rotary_keeps_q_and_k_in_the_activations_dtype(monkeypatch):
    """The rotary tables are float32 buffers; under bfloat16 autocast q and k reach attention in bfloat16 (a
    float32 table would promote them to float32 in eager mode), rotated as by tables cast to bfloat16."""
    cos, sin = rotary_cos_sin(torch.arange(8), 16, 10000.0)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0)).bfloat16()
    turned = apply_rotary(x, cos, sin)
    assert cos.dtype == torch.float32 and turned.dtype == torch.bfloat16
    assert torch.equal(turned, apply_rotary(x, cos.bfloat16(), sin.bfloat16()))
    seen, attend = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: seen.append((q.dtype, k.dtype))
                        or attend(q, k, v, **kw))
    model, idx = GPT(get_config("tiny")), torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx)
    assert seen == [(torch.bfloat16, torch.bfloat16)] * model.config.n_layer
    seen.clear()
    model(idx)  # float32: the tables as they are
    assert seen == [(torch.float32, torch.float32)] * model.config.n_layer


class Unread(torch.Tensor):
    """A tensor that records every torch operation on it, down to reading its .device: one read would show."""
    reads = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.reads.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_sample_never_reads_the_optimizer_state(runs, monkeypatch, capsys):
    """sample.py takes the weights from the file's CPU map: AdamW's moments and steps, in the same file, are never
    touched (not moved, cast or copied), so none of them is ever read into memory or onto a GPU."""
    read, unread = checkpoint.read_checkpoint, []

    def read_spied(path, int8=False):
        ckpt = read(path, int8)
        for state in ckpt["optimizer"]["state"].values():
            unread.extend(state)
            state.update({k: v.as_subclass(Unread) for k, v in state.items()})
        return ckpt

    monkeypatch.setattr(checkpoint, "read_checkpoint", read_spied)
    Unread.reads.clear()
    assert sample.main(["--ckpt", runs["learned"].out_dir, "--max_new_tokens", "8", "--seed", "1"]) == 0
    assert len(capsys.readouterr().out) > 0 and sorted(set(unread)) == ["exp_avg", "exp_avg_sq", "step"]
    assert Unread.reads == []


# ----------------------------------------------------------------------------- the MFU table and bfloat16
# (name torch.cuda.get_device_name returns, dense bf16 peak from the datasheet; None: no MFU, not a neighbour's)
GPU_NAMES = [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA B200", 2250e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100-SXM4-40GB", 312e12), ("NVIDIA A100-PCIE-40GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12), ("NVIDIA A10", 125e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12),
    ("NVIDIA L4", 121e12), ("NVIDIA RTX A1000", None), ("NVIDIA RTX A1000 6GB Laptop GPU", None), ("NVIDIA A10G", None),
    ("Tesla V100-SXM2-16GB", None), ("Tesla T4", None), ("NVIDIA H100", None), ("NVIDIA GeForce RTX 4090", None),
]


@pytest.mark.parametrize("name, peak", GPU_NAMES)
def test_peak_flops_by_exact_gpu_name(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == peak_flops(torch.device("cuda", 0), "bfloat16") == peak
    assert peak_flops(torch.device("cuda", 0), "float32") == (PEAK_FLOPS[name][1] if peak else None)  # TF32
    assert peak_flops(torch.device("cpu")) is None and peak_flops(torch.device("cpu"), "float32") is None


def test_every_peak_is_a_dense_datasheet_figure():
    """bfloat16 from 1e14 to 3e15 FLOP/s; TF32 (a float32 run's matmuls) about half of it or less."""
    assert all(1e14 <= bf16 <= 3e15 and 0.2 * bf16 <= tf32 <= 0.51 * bf16 for bf16, tf32 in PEAK_FLOPS.values())


@pytest.mark.parametrize("capability, native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((8, 6), True),
                                                ((8, 9), True), ((9, 0), True), ((10, 0), True)])
def test_bfloat16_only_on_hardware_that_has_it(monkeypatch, capability, native):
    """V100 (7.0) and T4 (7.5) emulate bfloat16 (torch.cuda.is_bf16_supported() says yes): float32 there."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert has_bf16(torch.device("cuda", 0)) is native
    assert not has_bf16(torch.device("cpu"))
    assert pick_dtype("auto", torch.device("cuda", 0)) == ("bfloat16" if native else "float32")
    assert pick_dtype("auto", torch.device("cpu")) == "float32"


def test_sampling_casts_to_float16_or_bfloat16_anywhere_where_training_refuses_them():
    """sample.py casts the weights (pick_dtype(sampling=True)): float16 too, and bfloat16 on MPS; training
    autocasts, to float32 or bfloat16 on CUDA and CPU only."""
    cpu, mps = torch.device("cpu"), torch.device("mps")
    assert pick_dtype("auto", cpu, sampling=True) == "float32"
    assert pick_dtype("float16", cpu, sampling=True) == "float16"
    assert pick_dtype("bfloat16", mps, sampling=True) == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be auto, float32 or bfloat16, got 'float16'"):
        pick_dtype("float16", cpu)
    with pytest.raises(ValueError, match="runs on CUDA and CPU here, not on mps"):
        pick_dtype("bfloat16", mps)
