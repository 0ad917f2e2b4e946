"""
The run folder (out_dir): one writer, nothing lost, and the same data on resume. A fresh run refuses a folder that
holds an earlier run's files; rank 0 holds out_dir's writer lock until the run ends; --resume reads on only in the
data it was reading (data_fingerprint; checkpoint.restore puts back the rest: optimizer, step, RNG streams).
"""

import hashlib
import json
import os
import sys

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
        if ckpt_stamp is not None and file_stamp(cfg.ckpt_path) != ckpt_stamp:
            raise ValueError(f"{cfg.ckpt_path} was replaced by another run while this one started: resume again")
        check_out_dir(cfg)


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


def check_same_data(ckpt, source, data_dir, fingerprint, *, rank):
    """--resume reads on at the saved position in the training order, which means the same windows only in the
    same data: other data (the folder prepared again, or another one; `fingerprint`: data_dir's) is refused. A
    checkpoint older than the fingerprint cannot be checked: said once (rank 0)."""
    saved = ckpt["data"].get("fingerprint")
    if saved is None and rank == 0:
        print(f"note: {source} predates data fingerprints: cannot check that {data_dir} holds the data it was "
              "reading", file=sys.stderr)
    elif saved is not None and saved not in (fingerprint, data_fingerprint(data_dir, legacy=True)):
        raise ValueError(f"{source} was reading other data than {data_dir} now holds (fingerprint {saved}, now "
                         f"{fingerprint}: meta.json or the shards changed): its saved position would index other "
                         "windows. Resume on the data it was reading, or start from its weights with --init_from")

