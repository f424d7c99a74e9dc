"""Files written atomically (a reader sees the old file or the complete new one), and files read
with one clear error for a missing or unreadable one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .config import UsageError

__all__ = ["atomic_open", "read_input"]


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None):
    """Open a temporary file beside ``path`` for writing; when the ``with``
    block ends normally the file is flushed, synced and renamed over ``path``.
    If the block raises, the temporary file is removed and ``path`` is left as
    it was.

    Parameters
    ----------
    path:
        The file to write.
    mode:
        ``"wb"`` or ``"w"``.
    encoding:
        Text encoding for ``"w"`` (default UTF-8).
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', not {mode!r}")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_input(path: str | os.PathLike) -> bytes:
    """The bytes of a file a user named.

    Raises
    ------
    UsageError
        ``"<path>: no such file"`` when it is missing, ``"cannot read <path>: <reason>"``
        when it cannot be read.
    """
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
