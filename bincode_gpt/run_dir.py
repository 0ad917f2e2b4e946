"""
The run folder (out_dir): one writer, nothing lost, and the same data on resume. A fresh run refuses
a folder that holds an earlier run's files; rank 0 holds out_dir's writer lock until the run ends;
--resume reads on only in the data it was reading (data_fingerprint; checkpoint.restore puts back
the optimizer and RNG streams).
"""

import hashlib
import json
import os
import sys

from bincode_gpt.checkpoint import atomic_torch_save
from bincode_gpt.files import LOCK_NAME, file_stamp, writer_lock

# what a run writes in out_dir, and all it ever replaces or removes there
OUTPUTS = ("ckpt.pt", "best.pt", "log.jsonl")


def claim_out_dir(out_dir, lock, *, stamp, resume, overwrite):
    """Make rank 0 (`lock`: train()'s ExitStack; None on the other ranks) out_dir's one writer until
    the run ends: files.writer_lock refuses a second run into it, even one started in the same
    second, and removes the temp files of a writer killed mid-save. What out_dir holds is checked
    (check_out_dir) under the lock; a folder no run has locked yet is checked before it too, so a
    refusal leaves a user's folder exactly as it was. A resumed run read ckpt.pt before the lock
    (`stamp`: its files.file_stamp): another run may have saved it since."""
    if not os.path.exists(os.path.join(out_dir, LOCK_NAME)):
        check_out_dir(out_dir, resume=resume, overwrite=overwrite)
    if lock is not None:
        lock.enter_context(writer_lock(out_dir, outputs=OUTPUTS))
        ckpt_path = os.path.join(out_dir, "ckpt.pt")
        if stamp is not None and file_stamp(ckpt_path) != stamp:
            raise ValueError(f"{ckpt_path} was replaced by another run while this one started: "
                             "resume again")
        check_out_dir(out_dir, resume=resume, overwrite=overwrite)


def check_out_dir(out_dir, *, resume, overwrite):
    """A fresh run refuses an out_dir that holds an earlier run's files: its checkpoints, or the log
    of a run that saved none (one that diverged, or was killed before its first save). --resume
    continues that run, --overwrite replaces it."""
    if resume or overwrite:
        return
    for name in OUTPUTS:
        path = os.path.join(out_dir, name)
        if os.path.exists(path) and name == "log.jsonl":
            raise ValueError(f"{path} holds the log of an earlier run, which saved no checkpoint: "
                             "keep it by choosing another out_dir, or replace it with --overwrite")
        if os.path.exists(path):
            raise ValueError(f"{path} exists: continue that run with --resume, or start afresh and "
                             "replace it with --overwrite")


def remove_replaced_best(out_dir):
    """An --overwrite removes the replaced run's best.pt as the new run starts (rank 0, under the
    lock), so its ckpt.pt never sits beside the best checkpoint of another run (the old ckpt.pt
    stays until the first save replaces it)."""
    best = os.path.join(out_dir, "best.pt")
    if os.path.isfile(best):
        os.remove(best)


def save_checkpoint(ckpt, out_dir, name):
    """Write out_dir/name atomically (checkpoint.atomic_torch_save): a crash, Ctrl-C or full disk
    mid-write keeps the old file, and a failed write says what the folder still holds."""
    path = os.path.join(out_dir, name)
    try:
        atomic_torch_save(ckpt, path)
    except OSError as e:  # e.g. a full disk: atomic_open left the previous files as they were
        kept = kept_checkpoints(out_dir)
        raise OSError(f"{path}: not written ({e.strerror or e}); {kept}") from None


def kept_checkpoints(out_dir):
    """What a run stopped by a failed write leaves to resume from, for its message."""
    paths = [os.path.join(out_dir, name) for name in ("ckpt.pt", "best.pt")]
    kept = [path for path in paths if os.path.isfile(path)]
    if not kept:
        return "no checkpoint of this run is on disk yet"
    return f"kept as they were: {', '.join(kept)}"


def meta_identity(raw: bytes, legacy=False) -> bytes:
    """meta.json's bytes less the paths its text was read from ("inputs", "sources"), canonical:
    what the data is, wherever the text lay. legacy: the bytes as they are, paths and all (what the
    fingerprints hashed before)."""
    if legacy:
        return raw
    meta = {k: v for k, v in json.loads(raw).items() if k not in ("inputs", "sources")}
    return json.dumps(meta, sort_keys=True).encode()


def data_fingerprint(folder, legacy=False):
    """A short hash of meta_identity and every shard's name and size: what a checkpoint's data
    position indexes. Preparing the folder again from other text or settings changes it; from the
    same text at another path does not."""
    with open(os.path.join(folder, "meta.json"), "rb") as f:
        raw = f.read()
    meta = json.loads(raw)
    h = hashlib.sha256(meta_identity(raw, legacy))
    for split in sorted(meta["splits"]):
        for name in meta["splits"][split]["shards"]:
            h.update(f"\n{split}/{name}:{os.path.getsize(os.path.join(folder, name))}".encode())
    return h.hexdigest()[:16]


def check_same_data(ckpt, source, data_dir, fingerprint, *, rank):
    """--resume reads on at the saved position in the training order, which means the same windows
    only in the same data: other data (the folder prepared again, or another one; `fingerprint`:
    data_dir's) is refused. A checkpoint older than the fingerprint cannot be checked: said once
    (rank 0)."""
    saved = ckpt["data"].get("fingerprint")
    if saved is None and rank == 0:
        print(f"note: {source} predates data fingerprints: cannot check that {data_dir} holds the "
              "data it was reading", file=sys.stderr)
    elif saved is not None and saved not in (fingerprint, data_fingerprint(data_dir, legacy=True)):
        raise ValueError(f"{source} was reading other data than {data_dir} now holds (fingerprint "
                         f"{saved}, now {fingerprint}: meta.json or the shards changed): its saved "
                         "position would index other windows. Resume on the data it was reading, "
                         "or start from its weights with --init_from")
