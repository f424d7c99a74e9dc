"""Atomic on-disk checkpoints: tensors in safetensors, everything else in JSON.

A checkpoint is a folder holding two files:

- ``tensors-<token>.safetensors``: every tensor, under its store key;
- ``memoryx.json``: the manifest (whatever the caller describes, plus the
  name, size and SHA-256 of the tensors file it belongs to).

Writing is crash safe. The tensors go to a hidden temporary file that is
flushed, synced and renamed to a fresh ``tensors-<token>`` name; the manifest
is then written the same way and renamed over ``memoryx.json``. That rename is
the commit: before it, the folder still describes the previous checkpoint
(whose tensors file is untouched); after it, the new one. Superseded tensors
files are removed only after the commit. One writer per folder at a time.

A checkpoint that does not fit (the file system is full, read-only, ...)
is one :class:`~wse.config.UsageError` naming the folder and the bytes it
needs; the temporaries are removed and the previous checkpoint stays. When
the file system says up front that the bytes are not free, nothing is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import safetensors
import safetensors.numpy

from wse.atomic import file_error, free_bytes
from wse.config import UsageError

__all__ = ["MANIFEST_NAME", "write_checkpoint", "read_checkpoint", "checkpoint_bytes"]

MANIFEST_NAME = "memoryx.json"
_TENSORS_GLOB = "tensors-*.safetensors"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_bytes(tensors: Mapping[str, np.ndarray]) -> int:
    """About the bytes a checkpoint of ``tensors`` takes on disk (tensor data, headers and manifest)."""
    return sum(int(np.asarray(t).nbytes) + 128 + len(name) for name, t in tensors.items()) + 4096


def _as_os_error(exc: Exception) -> OSError:
    """The ``OSError`` behind a safetensors error (which reports I/O failures as text)."""
    if isinstance(exc, OSError):
        return exc
    text = str(exc)
    match = re.search(r"(?:code: |os error )(\d+)", text)
    code = int(match.group(1)) if match else errno.EIO
    return OSError(code, os.strerror(code))


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:             # some platforms cannot open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(path: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest`` as JSON to ``path`` (a temporary name) and sync it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def write_checkpoint(folder: str | os.PathLike, manifest: Mapping[str, Any],
                     tensors: Mapping[str, np.ndarray]) -> Path:
    """Write ``tensors`` and ``manifest`` atomically into ``folder`` (created if needed).

    Parameters
    ----------
    folder : path
        The checkpoint folder; an existing checkpoint there is replaced.
    manifest : mapping
        JSON-serializable description; the key ``"tensors"`` is reserved.
    tensors : mapping of str to numpy.ndarray
        C-contiguous arrays to store (0-d arrays allowed).

    Returns
    -------
    pathlib.Path
        The path of the written manifest.

    Raises
    ------
    UsageError
        If ``folder`` exists and is not a folder, or the checkpoint cannot be
        written there (no space, read-only, ...): the message names the
        folder and the bytes needed; the previous checkpoint stays intact.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"checkpoint path {str(folder)!r} must be a folder, not a file")
    need = checkpoint_bytes(tensors)
    free = free_bytes(folder)
    try:
        if free is not None and free < need:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _write(folder, manifest, tensors)
    except (OSError, safetensors.SafetensorError) as exc:
        cause = _as_os_error(exc)
        error = file_error(cause, "write a checkpoint to", folder, need=need)
        error.cause, error.need = cause, need      # for callers that name another folder
        raise error from None


def _write(folder: Path, manifest: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"tensors-{secrets.token_hex(8)}.safetensors"
    tensors_tmp = folder / f".{name}.tmp"
    manifest_tmp = folder / f".{MANIFEST_NAME}.tmp"
    committed = False
    try:
        safetensors.numpy.save_file(dict(tensors), str(tensors_tmp))
        _fsync_file(tensors_tmp)
        os.replace(tensors_tmp, folder / name)
        full = dict(manifest)
        full["tensors"] = {"file": name, "bytes": (folder / name).stat().st_size,
                           "sha256": _sha256(folder / name)}
        _write_manifest(manifest_tmp, full)
        os.replace(manifest_tmp, folder / MANIFEST_NAME)
        committed = True
        _fsync_dir(folder)
    finally:
        leftovers = [tensors_tmp, manifest_tmp] + ([] if committed else [folder / name])
        for path in leftovers:
            path.unlink(missing_ok=True)
    for old in folder.glob(_TENSORS_GLOB):
        if old.name != name:
            old.unlink(missing_ok=True)
    return folder / MANIFEST_NAME


def read_checkpoint(folder: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a checkpoint written by :func:`write_checkpoint`.

    Returns
    -------
    manifest : dict
        The manifest, including the ``"tensors"`` entry.
    tensors : dict of str to numpy.ndarray
        Every stored tensor, as writable arrays.

    Raises
    ------
    UsageError
        If the folder or a file is missing, the manifest is not valid JSON, or
        the tensors file does not match its recorded size and SHA-256 or is not
        a safetensors file.
    """
    folder = Path(folder)
    manifest_path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise UsageError(f"checkpoint folder {str(folder)!r} does not exist")
    if not manifest_path.is_file():
        raise UsageError(f"checkpoint folder {str(folder)!r} has no {MANIFEST_NAME}; "
                         "expected a folder written by MemoryX.save")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"checkpoint manifest {str(manifest_path)!r} is not valid JSON ({exc})") from None
    entry = manifest.get("tensors") if isinstance(manifest, dict) else None
    if not isinstance(entry, dict) or not {"file", "bytes", "sha256"} <= set(entry) \
            or not isinstance(entry["file"], str) or Path(entry["file"]).name != entry["file"]:
        raise UsageError(f"checkpoint manifest {str(manifest_path)!r} must name its tensors file "
                         "as {'tensors': {'file', 'bytes', 'sha256'}}")
    tensors_path = folder / entry["file"]
    if not tensors_path.is_file():
        raise UsageError(f"checkpoint tensors file {str(tensors_path)!r} is missing")
    size = tensors_path.stat().st_size
    if size != entry["bytes"] or _sha256(tensors_path) != entry["sha256"]:
        raise UsageError(f"checkpoint tensors file {str(tensors_path)!r} is corrupt: its size or SHA-256 "
                         f"differs from the manifest ({size} bytes, expected {entry['bytes']})")
    try:
        tensors = safetensors.numpy.load_file(str(tensors_path))
    except Exception as exc:  # safetensors raises its own error types for malformed headers
        raise UsageError(f"checkpoint tensors file {str(tensors_path)!r} is not a valid safetensors "
                         f"file ({exc})") from None
    return manifest, tensors
