"""
The run folder (out_dir): one writer, nothing lost, and exact resume. A fresh run refuses a folder that holds an
earlier run's files; rank 0 holds out_dir's writer lock until the run ends; --resume continues a checkpoint exactly
where it stopped (optimizer, step, data position, RNG streams), on the data it was reading.
"""

import hashlib
import json
import os
import sys

from bincode_gpt.checkpoint import load_optimizer_state, set_rng_state
from bincode_gpt.cli import one_line
from bincode_gpt.files import DISK_FULL, LOCK_NAME, file_stamp, writer_lock

OUTPUTS = ("ckpt.pt", "best.pt", "log.jsonl")  # what a run writes in out_dir, and all it ever replaces or removes there


def claim_out_dir(cfg, out_lock, ckpt_stamp):
    """Make rank 0 (`out_lock`: train()'s ExitStack) out_dir's one writer until the run ends: files.writer_lock
    refuses a second run into it, even one started in the same second, and removes the temp files of a
    writer killed mid-save. What out_dir holds is checked (check_out_dir) under the lock; a folder no run
    has locked yet is checked before it too, so a refusal leaves a user's folder exactly as it was. A
    resumed run read ckpt.pt before the lock (`ckpt_stamp`: its files.file_stamp): another run may have saved it since."""
    if not os.path.exists(os.path.join(cfg.out_dir, LOCK_NAME)):
        check_out_dir(cfg)
    if out_lock is not None:
        out_lock.enter_context(writer_lock(cfg.out_dir, outputs=OUTPUTS))
        check_out_dir(cfg)
        if ckpt_stamp is not None and file_stamp(cfg.ckpt_path) != ckpt_stamp:
            raise ValueError(f"{cfg.ckpt_path} was replaced by another run while this one started: resume again")


def check_out_dir(cfg):
    """A fresh run refuses an out_dir that holds an earlier run's files: its checkpoints, or the log of a
    run that saved none (one that diverged, or was killed before its first save). --resume continues
    that run, --overwrite replaces it."""
    if cfg.resume or cfg.overwrite:
        return
    for name in OUTPUTS:
        path = os.path.join(cfg.out_dir, name)
        if os.path.exists(path) and name == "log.jsonl":
            raise ValueError(f"{path} holds the log of an earlier run, which saved no checkpoint: keep it by choosing "
                             "another out_dir, or replace it with --overwrite")
        if os.path.exists(path):
            raise ValueError(f"{path} exists: continue that run with --resume, or start afresh and replace it with "
                             "--overwrite")


def open_outputs(cfg):
    """-> log.jsonl, open for this run (rank 0, under the lock): appended to by --resume, else new. An
    --overwrite also removes the replaced run's best.pt now, so the new ckpt.pt never sits beside the best
    checkpoint of another run (its ckpt.pt stays until the first save replaces it)."""
    best = os.path.join(cfg.out_dir, "best.pt")
    if cfg.overwrite and os.path.isfile(best):
        os.remove(best)
    return LineLog(os.path.join(cfg.out_dir, "log.jsonl"), cfg.resume, cfg)


def kept_checkpoints(cfg):
    """What a run stopped by a failed write leaves to resume from, for its message."""
    kept = [p for p in (os.path.join(cfg.out_dir, n) for n in ("ckpt.pt", "best.pt")) if os.path.isfile(p)]
    return f"kept as they were: {', '.join(kept)}" if kept else "no checkpoint of this run is on disk yet"


class LineLog:
    """log.jsonl, written a whole line at a time: a line cut short (a full disk, Ctrl-C mid-write) is taken back,
    so its readers parse every line and a resumed run appends after whole lines."""

    def __init__(self, path, append, cfg):
        self.path, self.cfg = path, cfg
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC), 0o644)

    def write(self, line):
        data, end = line.encode(), os.lseek(self.fd, 0, os.SEEK_END)
        try:
            while data:  # a write may take part of it
                data = data[os.write(self.fd, data):]
        except BaseException as e:
            os.ftruncate(self.fd, end)
            if isinstance(e, OSError) and e.errno in DISK_FULL:
                raise OSError(f"{self.path}: a line not written (the disk is full: {os.strerror(e.errno)}): the log "
                              f"keeps its whole lines; {kept_checkpoints(self.cfg)}") from None
            raise

    def close(self):
        os.close(self.fd)


# ----------------------------------------------------------------------------- resume: where the checkpoint stopped
def restore(run, state, ckpt, source):
    """Continue where the checkpoint stopped: optimizer, step, data position, evaluations, RNG streams (each
    rank its own, when the number of processes is the same)."""
    if ckpt.get("saved_as") == "best.pt":
        raise ValueError(f"{source} is a best.pt (step {ckpt.get('step')}'s weights, no optimizer, data position or "
                         "RNG state): --resume continues out_dir/ckpt.pt; start a run from these weights with "
                         f"--init_from {source}")
    if not {"optimizer", "step", "data", "rng"} <= ckpt.keys():
        raise ValueError(f"{source}: holds weights but no training state to resume; start from it with --init_from")
    check_training_state(ckpt, source)
    check_same_data(run, ckpt, source)  # the saved data position indexes the data it was reading
    try:
        load_optimizer_state(run.optimizer, ckpt["optimizer"])  # moments to the parameters' device, kernel kept
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
        raise ValueError(f"{source}: its optimizer state does not fit this model ({one_line(e, 120)})") from None
    state.step, state.position, state.best_val = ckpt["step"], ckpt["data"]["position"], ckpt.get("best_val_loss")
    state.eval_step, state.val_loss, state.saved_step = ckpt.get("eval_step"), ckpt.get("val_loss"), ckpt["step"]
    if len(ckpt["rng"]) == run.world:
        try:
            set_rng_state(ckpt["rng"][run.rank], run.device)
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            raise ValueError(f"{source}: its RNG state of rank {run.rank} is unreadable ({one_line(e, 120)})") from None
    elif run.rank == 0:
        print(f"note: {source} was written by {len(ckpt['rng'])} processes, not {run.world}: the data order "
              "continues exactly, but each rank's RNG stays as this run's start set it (seed + rank), so dropout "
              "draws differ from an unbroken run's")


def check_training_state(ckpt, source):
    """The entries restore reads, with the types it reads them as: a checkpoint of another writer or an
    older version is one error naming the odd entry, not a KeyError later."""
    data, rng, optimizer = ckpt["data"], ckpt["rng"], ckpt["optimizer"]
    number_or_none = (int, float, type(None))
    odd = [what for what, ok in (
        ("'step' is not a whole number >= 0", type(ckpt["step"]) is int and ckpt["step"] >= 0),
        ("'data' has no whole-number 'position' >= 0",
         isinstance(data, dict) and type(data.get("position")) is int and data["position"] >= 0),
        ("'optimizer' is not an optimizer state dict",
         isinstance(optimizer, dict) and {"state", "param_groups"} <= optimizer.keys()),
        ("'rng' is not a list of RNG states (torch, cuda, python, numpy) per process",
         isinstance(rng, list) and rng and all(
             isinstance(r, dict) and {"torch", "cuda", "python", "numpy"} <= r.keys() for r in rng)),
        ("'eval_step' is not a whole number", type(ckpt.get("eval_step")) in (int, type(None))),
        ("'val_loss' or 'best_val_loss' is not a number",
         isinstance(ckpt.get("val_loss"), number_or_none) and isinstance(ckpt.get("best_val_loss"), number_or_none)),
    ) if not ok]
    if odd:
        raise ValueError(f"{source}: cannot resume: {odd[0]} (a checkpoint of another program or version?); "
                         "start from its weights with --init_from")


def meta_identity(raw: bytes, legacy=False) -> bytes:
    """meta.json's bytes less the paths its text was read from ("inputs", "sources"), canonical: what the data is,
    wherever the text lay. legacy: the bytes as they are, paths and all (what the fingerprints hashed before)."""
    if legacy:
        return raw
    meta = {k: v for k, v in json.loads(raw).items() if k not in ("inputs", "sources")}
    return json.dumps(meta, sort_keys=True).encode()


def data_fingerprint(folder, legacy=False):
    """A short hash of meta_identity and every shard's name and size: what a checkpoint's data position indexes.
    Preparing the folder again from other text or settings changes it; from the same text at another path does not."""
    with open(os.path.join(folder, "meta.json"), "rb") as f:
        raw = f.read()
    meta = json.loads(raw)
    h = hashlib.sha256(meta_identity(raw, legacy))
    for split in sorted(meta["splits"]):
        for name in meta["splits"][split]["shards"]:
            h.update(f"\n{split}/{name}:{os.path.getsize(os.path.join(folder, name))}".encode())
    return h.hexdigest()[:16]


def check_same_data(run, ckpt, source):
    """--resume reads on at the saved position in the training order, which means the same windows only in the
    same data: other data (the folder prepared again, or another one) is refused. A checkpoint older than the
    fingerprint cannot be checked: said once."""
    saved = ckpt["data"].get("fingerprint")
    if saved is None and run.rank == 0:
        print(f"note: {source} predates data fingerprints: cannot check that {run.cfg.data_dir} holds the data it was "
              "reading", file=sys.stderr)
    elif saved is not None and saved not in (run.fingerprint, data_fingerprint(run.cfg.data_dir, legacy=True)):
        raise ValueError(f"{source} was reading other data than {run.cfg.data_dir} now holds (fingerprint {saved}, now "
                         f"{run.fingerprint}: meta.json or the shards changed): its saved position would index other "
                         "windows. Resume on the data it was reading, or start from its weights with --init_from")

