"""A tiered tensor store: RAM up to a budget, memory-mapped files beyond it.

``--memoryx-budget SIZE`` bounds the RAM that MemoryX's weights and optimizer
state take. :class:`TieredStore` places each tensor when it is created, in
creation order (MemoryX creates the weights in streaming order, then each
tensor's optimizer state when it is first stepped): a tensor goes to RAM if
it fits in what is left of the budget, otherwise to its own file in the
store's folder, memory-mapped (``numpy.memmap``). A memmap is an ndarray, so
MemoryX and ``torch.optim`` update it in place exactly as they update RAM:
results are bit for bit those of an in-memory store.

Disk tensors are fetched layer by layer in streaming order:
:meth:`TieredStore.prefetch` asks the operating system to read a tensor's
pages ahead (``madvise(MADV_WILLNEED)``) while the previous layer is in use,
and :meth:`TieredStore.release` writes a tensor's pages back and drops them
from this process (``msync``, then ``madvise(MADV_DONTNEED)``), so the disk
tier's resident memory stays about one layer. The files are scratch space,
not checkpoints: they are deleted with their tensors and by :meth:`TieredStore.close`.

Disk space is never left to chance: every file is given its blocks when it is
created (``posix_fallocate``), so writing through a mapping cannot meet a full
disk (which would kill the process with ``SIGBUS``), and :meth:`TieredStore.reserve`
sets aside, up front, the bytes a run will need (:func:`planned_disk_bytes`);
tensors created later draw on that reservation. A disk that is too small is
one :class:`~wse.config.UsageError` naming the folder and the bytes needed.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from wse.atomic import allocate, file_error
from wse.config import UsageError

from .store import TensorStore

__all__ = ["TieredStore", "parse_size", "planned_disk_bytes", "TIERS"]

#: The file holding a store's reserved, not yet used, disk space.
RESERVE_NAME = "reserved.bin"

#: Where a tensor of a :class:`TieredStore` lives.
TIERS = ("memory", "disk")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_UNITS = {"": 1, "b": 1,
          "k": 1 << 10, "kib": 1 << 10, "kb": 10 ** 3,
          "m": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
          "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9,
          "t": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12}


def parse_size(text: str | int) -> int:
    """Bytes of a size such as ``"512MiB"``, ``"1.5GB"``, ``"64k"`` or ``4096``.

    ``K, M, G, T`` and ``KiB, MiB, GiB, TiB`` are powers of 1024; ``KB, MB,
    GB, TB`` powers of 1000; no unit or ``B`` means bytes (case-insensitive).
    Fractions are rounded down to whole bytes.

    Raises
    ------
    UsageError
        For anything else, or a negative size.
    """
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"a size must be at least 0 bytes, not {text!r}")
        return int(text)
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UsageError(f"size must be a number of bytes with an optional unit such as 512MiB, 2GB or 64k, "
                         f"not {text!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def planned_disk_bytes(sizes: Iterable[int], budget: int) -> int:
    """Bytes a :class:`TieredStore` with ``budget`` puts on disk for tensors of ``sizes`` bytes, created in
    that order (a tensor goes to RAM when it fits in what is left of the budget, else to disk)."""
    resident = disk = 0
    for size in sizes:
        size = int(size)
        if size == 0 or resident + size <= budget:
            resident += size
        else:
            disk += size
    return disk


def _advise(array: np.ndarray, advice: int) -> None:
    handle = getattr(array, "_mmap", None)
    if handle is not None and hasattr(handle, "madvise"):
        handle.madvise(advice)


class TieredStore(TensorStore):
    """A :class:`TensorStore` holding at most ``budget`` bytes in RAM; the rest memory-mapped on disk.

    Parameters
    ----------
    budget : int or str
        RAM for tensors, in bytes or as :func:`parse_size` text; ``0`` puts
        every non-empty tensor on disk.
    folder : path, optional
        Where disk tensors go: an empty or missing folder (created). By
        default a fresh temporary folder, removed by :meth:`close` or when
        the store is garbage collected.

    Raises
    ------
    UsageError
        For a bad budget, or a ``folder`` that is a file or is not empty.

    Notes
    -----
    Placement is decided once, at creation, and never changes (module
    docstring). Empty tensors always stay in RAM (they take no bytes). Keys
    map to files ``<n>.bin`` numbered in creation order.
    """

    def __init__(self, budget: int | str, folder: str | os.PathLike | None = None):
        self.budget = parse_size(budget)
        if folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="wse-memoryx-"))
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        else:
            self.folder = Path(folder)
            try:
                if self.folder.exists() and (not self.folder.is_dir() or any(self.folder.iterdir())):
                    raise UsageError(f"MemoryX disk tier folder {str(self.folder)!r} must be an empty folder")
                self.folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise file_error(exc, "create the MemoryX disk tier folder", self.folder) from None
            self._finalizer = None
        self._arrays: dict[str, np.ndarray] = {}
        self._files: dict[str, Path] = {}
        self._resident = 0
        self._counter = 0
        self._reserved = 0          # bytes of RESERVE_NAME not yet drawn on

    # ------------------------------------------------------------ TensorStore
    def create(self, key: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        if key in self._arrays:
            raise KeyError(f"tensor store already holds {key!r}")
        shape = tuple(int(n) for n in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes == 0 or self._resident + nbytes <= self.budget:
            array = np.zeros(shape, dtype=dtype)
            self._resident += nbytes
        else:
            path = self.folder / f"{self._counter}.bin"
            self._counter += 1
            self._allocate(path, nbytes)
            array = np.memmap(path, dtype=dtype, mode="r+", shape=shape)
            self._files[key] = path
        self._arrays[key] = array
        return array

    def _allocate(self, path: Path, nbytes: int) -> None:
        """Create ``path`` with ``nbytes`` zero bytes on disk, drawing first on the reservation."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise file_error(exc, "create a file in the MemoryX disk tier folder", self.folder) from None
        try:
            if self._reserved:
                self._shrink_reserve(max(0, self._reserved - nbytes))
            allocate(fd, nbytes)
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise file_error(exc, "extend the MemoryX disk tier in", self.folder, need=nbytes) from None
        os.close(fd)

    def _shrink_reserve(self, nbytes: int) -> None:
        path = self.folder / RESERVE_NAME
        if nbytes == 0:
            path.unlink(missing_ok=True)
        else:
            os.truncate(path, nbytes)
        self._reserved = nbytes

    def reserve(self, nbytes: int) -> None:
        """Set aside ``nbytes`` of disk in the folder now, for the disk tensors created later.

        Raises
        ------
        UsageError
            When the folder's file system lacks the space (the message names
            the folder, the bytes needed and the bytes free); nothing is
            then left reserved.
        """
        nbytes = int(nbytes)
        path = self.folder / RESERVE_NAME
        if nbytes <= 0:
            return
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise file_error(exc, "reserve space in the MemoryX disk tier folder", self.folder) from None
        try:
            allocate(fd, self._reserved + nbytes)
            os.ftruncate(fd, self._reserved + nbytes)
        except OSError as exc:
            os.close(fd)
            self._shrink_reserve(self._reserved)
            raise file_error(exc, "reserve the MemoryX disk tier in", self.folder, need=nbytes) from None
        os.close(fd)
        self._reserved += nbytes

    @property
    def reserved_bytes(self) -> int:
        """Reserved disk bytes not yet taken by a tensor."""
        return self._reserved

    def get(self, key: str) -> np.ndarray:
        return self._arrays[key]

    def delete(self, key: str) -> None:
        array = self._arrays.pop(key)
        path = self._files.pop(key, None)
        if path is None:
            self._resident -= array.nbytes
        else:
            path.unlink(missing_ok=True)     # the mapping stays valid for views still alive

    def keys(self) -> Iterator[str]:
        return iter(list(self._arrays))

    def __contains__(self, key: str) -> bool:
        return key in self._arrays

    def __len__(self) -> int:
        return len(self._arrays)

    # ---------------------------------------------------------------- tiers
    def tier(self, key: str) -> str:
        """``"memory"`` or ``"disk"``: where ``key`` lives (``KeyError`` if absent)."""
        if key not in self._arrays:
            raise KeyError(key)
        return "disk" if key in self._files else "memory"

    @property
    def resident_bytes(self) -> int:
        """Bytes of the tensors kept in RAM (never above :attr:`budget`)."""
        return self._resident

    @property
    def disk_bytes(self) -> int:
        """Bytes of the tensors kept on disk."""
        return sum(self._arrays[key].nbytes for key in self._files)

    def prefetch(self, keys: Iterable[str]) -> None:
        """Start reading the disk tensors among ``keys`` into memory (a hint; RAM tensors are ignored)."""
        for key in keys:
            if key in self._files:
                _advise(self._arrays[key], mmap.MADV_WILLNEED)

    def release(self, keys: Iterable[str]) -> None:
        """Write the disk tensors among ``keys`` back to their files and drop their pages from this process."""
        for key in keys:
            if key in self._files:
                array = self._arrays[key]
                array.flush()
                _advise(array, mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Delete every tensor and the reservation and, for a temporary folder, the folder itself."""
        self.clear()
        if self._reserved:
            self._shrink_reserve(0)
        if self._finalizer is not None:
            self._finalizer()

    def __repr__(self) -> str:
        return (f"TieredStore(budget={self.budget}, folder={str(self.folder)!r}, tensors={len(self)}, "
                f"resident_bytes={self._resident}, disk_bytes={self.disk_bytes})")
