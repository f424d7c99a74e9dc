"""Run checkpoints: MemoryX tensors plus the trainer's position, committed atomically.

A run folder keeps its checkpoints under ``checkpoints/``::

    checkpoints/step-00000124/memoryx/     MemoryX.save: weights and optimizer state (safetensors)
    checkpoints/step-00000124/trainer.json step, epoch, data position, RNG state, settings, history
    checkpoints/latest                     the name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder, synced, and renamed
into place; ``latest`` is then replaced by a renamed temporary file. Either
rename is atomic, so a crash at any point leaves ``latest`` naming a complete
checkpoint (or no ``latest`` at all before the first one). Older checkpoints
beyond the number kept are removed after the commit.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from wse.atomic import atomic_open
from wse.config import UsageError
from wse.host.memoryx import MemoryX

__all__ = ["CHECKPOINTS", "TRAINER_KEYS", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "encode_rng_state", "decode_rng_state"]

CHECKPOINTS = "checkpoints"
_LATEST = "latest"
_TRAINER = "trainer.json"
_MEMORYX = "memoryx"
_FORMAT = "wse.appliance.checkpoint"
_VERSION = 1
_NAME_RE = re.compile(r"^step-(\d{8,})$")

#: What the trainer state of a checkpoint holds.
TRAINER_KEYS = ("settings", "step", "epoch", "batches", "torch_rng", "history", "epochs", "wall_s", "phases")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, sync, rename)."""
    with atomic_open(path, "w") as f:
        f.write(text)
    _fsync_dir(path.parent)


def encode_rng_state() -> str:
    """``torch``'s default CPU generator state as base64 text (for JSON)."""
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")


def decode_rng_state(text: str) -> None:
    """Restore ``torch``'s default CPU generator from :func:`encode_rng_state` text."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def save_checkpoint(run_dir: str | os.PathLike, memoryx: MemoryX, trainer: Mapping[str, Any],
                    keep: int = 2) -> Path:
    """Write a checkpoint of ``memoryx`` and the trainer state, atomically; return its folder.

    Parameters
    ----------
    run_dir : path
        The run folder.
    memoryx : MemoryX
        Weights and optimizer state.
    trainer : mapping
        JSON-ready trainer state with the entries :data:`TRAINER_KEYS`; its
        integer ``"step"`` names the checkpoint.
    keep : int
        Newest checkpoints kept; older ones are removed after the commit.
    """
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{int(trainer['step']):08d}"
    final, tmp, old = root / name, root / f".{name}.tmp", root / f".{name}.old"
    for stale in (tmp, old):
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()
    memoryx.save(tmp / _MEMORYX)
    _write_text(tmp / _TRAINER, json.dumps({"format": _FORMAT, "version": _VERSION, **trainer}, indent=1) + "\n")
    _fsync_dir(tmp)
    if final.exists():          # the same step written again (a resume that stops at once)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(root)
    _write_text(root / _LATEST, name + "\n")
    shutil.rmtree(old, ignore_errors=True)
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _NAME_RE.match(p.name)) and p.is_dir())
    for _, path in steps[:-keep] if keep > 0 else []:
        if path != final:
            shutil.rmtree(path, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The folder of the newest complete checkpoint of a run, or ``None`` if it has none.

    Raises :class:`UsageError` if ``latest`` names a checkpoint that is missing.
    """
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / _LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8").strip()
    folder = root / name
    if not _NAME_RE.match(name) or not folder.is_dir():
        raise UsageError(f"{str(pointer)!r} names checkpoint {name!r}, which is missing")
    return folder


def load_checkpoint(folder: str | os.PathLike) -> tuple[dict, MemoryX]:
    """Read a checkpoint written by :func:`save_checkpoint`: ``(trainer state, MemoryX)``.

    Raises
    ------
    UsageError
        If the folder is not an intact checkpoint of this format.
    """
    folder = Path(folder)
    path = folder / _TRAINER
    try:
        trainer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"checkpoint {str(folder)!r} has no readable {_TRAINER} ({exc})") from None
    if not isinstance(trainer, dict) or trainer.get("format") != _FORMAT or trainer.get("version") != _VERSION:
        raise UsageError(f"{str(path)!r} is not a {_FORMAT} version {_VERSION} file")
    missing = sorted(set(TRAINER_KEYS) - set(trainer))
    if missing:
        raise UsageError(f"{str(path)!r} lacks the entries {', '.join(missing)}")
    return trainer, MemoryX.load(folder / _MEMORYX)
