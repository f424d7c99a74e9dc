"""Run checkpoints: MemoryX tensors plus the trainer's position, committed atomically.

A run folder keeps its checkpoints under ``checkpoints/``::

    checkpoints/step-00000124/memoryx/     MemoryX.save: weights and optimizer state (safetensors)
    checkpoints/step-00000124/trainer.json step, epoch, data position, RNG state, settings, history
    checkpoints/latest                     the name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder
(``.step-N.<pid>-<token>.tmp``, a name no other writer uses), synced, and
renamed into place; ``latest`` is then replaced by a renamed temporary file.
Either rename is atomic, so a crash at any point leaves ``latest`` naming a
complete checkpoint (or no ``latest`` at all before the first one): a
checkpoint is complete or absent under its final name. Older checkpoints
beyond the number kept are removed after the commit, each first renamed to a
hidden ``.step-N.<token>.old`` name, so a half-deleted one never looks like a
checkpoint. :func:`clean_checkpoints` removes what a killed run left
(hidden temporaries of every kind).

A checkpoint that cannot be written (a full or read-only disk) stops the run
with one :class:`~wse.config.UsageError` naming the folder, the bytes needed
and the checkpoint that stays intact; its temporaries are removed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from wse.atomic import atomic_open, file_error, fsync_dir
from wse.config import UsageError
from wse.host.memoryx import MemoryX

__all__ = ["CHECKPOINTS", "TRAINER_KEYS", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "clean_checkpoints", "encode_rng_state", "decode_rng_state"]

CHECKPOINTS = "checkpoints"
_LATEST = "latest"
_TRAINER = "trainer.json"
_MEMORYX = "memoryx"
_FORMAT = "wse.appliance.checkpoint"
_VERSION = 1
_NAME_RE = re.compile(r"^step-(\d{8,})$")

#: What the trainer state of a checkpoint holds.
TRAINER_KEYS = ("settings", "step", "epoch", "batches", "torch_rng", "history", "epochs", "wall_s", "phases")


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, sync, rename)."""
    with atomic_open(path, "w") as f:
        f.write(text)
    fsync_dir(path.parent)


def _remove(path: Path) -> None:
    """Remove a checkpoint folder: first out of sight (a hidden name), then its contents."""
    hidden = path.with_name(f".{path.name}.{secrets.token_hex(4)}.old")
    try:
        os.replace(path, hidden)
    except OSError:
        return
    shutil.rmtree(hidden, ignore_errors=True)


def _is_complete(folder: Path) -> bool:
    return (folder / _TRAINER).is_file() and (folder / _MEMORYX / "memoryx.json").is_file()


def clean_checkpoints(run_dir: str | os.PathLike) -> list[str]:
    """Remove the temporaries a killed run left under ``checkpoints/`` (hidden ``.tmp`` and ``.old`` entries
    and half-written ``latest`` files); the names removed. Only for a run folder this process holds."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    removed = []
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") and (path.name.endswith(".tmp") or path.name.endswith(".old")):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


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
    name = f"step-{int(trainer['step']):08d}"
    final = root / name
    tmp = root / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        memoryx.save(tmp / _MEMORYX)
        _write_text(tmp / _TRAINER, json.dumps({"format": _FORMAT, "version": _VERSION, **trainer}, indent=1) + "\n")
        fsync_dir(tmp)
    except (OSError, UsageError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _not_written(exc, root, name, memoryx) from None
    if final.exists():          # the same step written again (a resume that stops at once)
        _remove(final)
    os.replace(tmp, final)
    fsync_dir(root)
    try:
        _write_text(root / _LATEST, name + "\n")
    except OSError as exc:      # the checkpoint is in place; latest_checkpoint finds it without the pointer
        raise _not_written(exc, root, name, memoryx) from None
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _NAME_RE.match(p.name)) and p.is_dir())
    for _, path in steps[:-keep] if keep > 0 else []:
        if path != final:
            _remove(path)
    return final


def _not_written(exc: Exception, root: Path, name: str, memoryx: MemoryX) -> UsageError:
    """The one-line error of a checkpoint that could not be written: what it needs, what is kept."""
    if isinstance(getattr(exc, "cause", None), OSError):      # MemoryX.save's error, for its temporary folder
        exc = file_error(exc.cause, "write a checkpoint to", root, need=getattr(exc, "need", None))
    elif isinstance(exc, OSError):
        need = int(memoryx.store.nbytes()) if hasattr(memoryx, "store") else None
        exc = file_error(exc, "write a checkpoint to", root, need=need)
    try:
        kept = latest_checkpoint(root.parent)
    except UsageError:
        kept = None
    keeps = f"checkpoint {kept.name} is intact; resume from it with --resume" if kept is not None else \
        "no earlier checkpoint exists"
    return UsageError(f"{exc}; the run stopped before {name}: {keeps}")


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The folder of the newest complete checkpoint of a run, or ``None`` if it has none.

    ``latest`` names it; a complete checkpoint newer than the one ``latest``
    names (a run stopped between the two renames of a commit) is taken
    instead, since checkpoints are complete or absent under their final names.

    Raises :class:`UsageError` if ``latest`` names a checkpoint that is missing
    and no complete checkpoint is left.
    """
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / _LATEST
    complete = sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else ())
                      if (m := _NAME_RE.match(p.name)) and _is_complete(p))
    if not pointer.is_file():
        return complete[-1][1] if complete else None
    name = pointer.read_text(encoding="utf-8").strip()
    folder = root / name
    match = _NAME_RE.match(name)
    if match and folder.is_dir():
        newer = [p for step, p in complete if step > int(match.group(1))]
        return newer[-1] if newer else folder
    if complete:
        return complete[-1][1]
    raise UsageError(f"{str(pointer)!r} names checkpoint {name!r}, which is missing")


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
