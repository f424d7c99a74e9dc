"""Files written atomically (a reader sees the old file or the complete new one), files read
with one clear error for a missing or unreadable one, disk space reserved up front, and file-system
errors turned into one line that names the path and what is needed."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from .config import UsageError

__all__ = ["atomic_open", "read_input", "fsync_dir", "free_bytes", "allocate", "file_error", "NEEDS"]

#: What a path needs, for the errors a file system gives most often.
NEEDS = {
    errno.ENOSPC: "free space on its file system",
    errno.EDQUOT: "free space within the disk quota",
    errno.EROFS: "a writable file system",
    errno.EACCES: "write permission",
    errno.EPERM: "write permission",
    errno.ENOTDIR: "a folder where a file is",
    errno.EEXIST: "a folder where a file is",
    errno.EISDIR: "a file where a folder is",
    errno.ENOENT: "its parent folder",
}


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None):
    """Open a temporary file beside ``path`` for writing; when the ``with``
    block ends normally the file is flushed, synced and renamed over ``path``.
    If the block raises, the temporary file is removed and ``path`` is left as
    it was. The file gets the permissions of an ordinary new file (``0o666``
    less the process's umask), not the private ``0o600`` of a temporary file.

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
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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


def fsync_dir(path: str | os.PathLike) -> None:
    """Sync a folder's entries (renames into it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (or of its nearest
    existing parent); None where that cannot be told."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def allocate(fd: int, nbytes: int) -> None:
    """Give the open file ``fd`` ``nbytes`` of disk blocks now (``posix_fallocate``; zeros written where
    the platform lacks it), so that writing through a memory mapping of it cannot meet a full disk later.

    Raises ``OSError`` (``ENOSPC`` when the space is not there).
    """
    if nbytes <= 0:
        return
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, nbytes)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    block = bytes(1 << 20)
    os.lseek(fd, 0, os.SEEK_SET)
    left = nbytes
    while left > 0:
        left -= os.write(fd, block[:min(left, len(block))])
    os.fsync(fd)


def file_error(exc: OSError, action: str, path: str | os.PathLike, need: int | None = None) -> UsageError:
    """One-line :class:`UsageError` for a file-system error met while doing ``action`` on ``path``:
    ``cannot <action> '<path>': <reason>; it needs <what>`` (with ``need`` bytes for a full disk)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    where = exc.filename if isinstance(exc.filename, str) and exc.filename != str(path) else None
    text = f"cannot {action} {str(path)!r}: {reason}" + (f" ({where})" if where else "")
    needs = NEEDS.get(exc.errno)
    if needs is not None:
        if need is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            free = free_bytes(path)
            needs = f"{need:,} bytes of {needs}" + (f" ({free:,} bytes free)" if free is not None else "")
        text += f"; it needs {needs}"
    return UsageError(text)
