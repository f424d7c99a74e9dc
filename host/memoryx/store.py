"""Tensor storage behind MemoryX.

MemoryX keeps every weight and every optimizer-state tensor in a
:class:`TensorStore`: a flat mapping from a string key to a writable,
C-contiguous numpy array that MemoryX updates in place (``torch.optim`` works
on ``torch.from_numpy`` views of the same memory, so no copy is made per step).

The interface is deliberately small so other tiers can plug in:

- :class:`InMemoryStore` (here) keeps arrays in RAM.
- A disk tier returns ``numpy.memmap`` arrays from :meth:`TensorStore.create`
  and :meth:`TensorStore.get`; since a memmap is an ndarray, MemoryX and
  ``torch.from_numpy`` use it unchanged, and the operating system pages tensors
  in and out as weight streaming walks the layers in order.
- A shard of a sharded MemoryX is a MemoryX whose store holds one slice of
  every tensor (and of its optimizer state); the optimizers are elementwise, so
  shards stepping their slices give exactly the unsharded result.
"""

from __future__ import annotations

import abc
from typing import Iterator

import numpy as np

__all__ = ["TensorStore", "InMemoryStore"]


class TensorStore(abc.ABC):
    """Named, writable, C-contiguous numpy arrays that MemoryX updates in place.

    Keys are strings chosen by MemoryX (a weight's name, or
    ``"<name>::<slot>"`` for optimizer state). Arrays returned by
    :meth:`create` and :meth:`get` must stay valid, and keep sharing memory
    with the store, until the key is deleted.
    """

    @abc.abstractmethod
    def create(self, key: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """Allocate a zero-filled array under a new ``key`` and return it.

        Raises
        ------
        KeyError
            If ``key`` already exists.
        """

    @abc.abstractmethod
    def get(self, key: str) -> np.ndarray:
        """The array stored under ``key`` (the stored memory, not a copy).

        Raises
        ------
        KeyError
            If ``key`` does not exist.
        """

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Forget ``key`` and release its memory; a missing key raises ``KeyError``."""

    @abc.abstractmethod
    def keys(self) -> Iterator[str]:
        """All keys, in creation order."""

    def __contains__(self, key: str) -> bool:
        return key in set(self.keys())

    def clear(self) -> None:
        """Delete every key."""
        for key in list(self.keys()):
            self.delete(key)

    def nbytes(self) -> int:
        """Total bytes held."""
        return sum(self.get(key).nbytes for key in self.keys())


class InMemoryStore(TensorStore):
    """A :class:`TensorStore` that keeps its arrays in RAM."""

    def __init__(self):
        self._arrays: dict[str, np.ndarray] = {}

    def create(self, key: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        if key in self._arrays:
            raise KeyError(f"tensor store already holds {key!r}")
        array = np.zeros(tuple(int(n) for n in shape), dtype=dtype)
        self._arrays[key] = array
        return array

    def get(self, key: str) -> np.ndarray:
        return self._arrays[key]

    def delete(self, key: str) -> None:
        del self._arrays[key]

    def keys(self) -> Iterator[str]:
        return iter(list(self._arrays))

    def __contains__(self, key: str) -> bool:
        return key in self._arrays

    def __len__(self) -> int:
        return len(self._arrays)
