"""The part every kernel's static cycle mirror shares: the per-PE timing ops of
a whole mesh stacked into the arrays :func:`wse.host.compiler.replay.replay`
takes (PEs in row-major order, each PE's rows from ``starts[p]`` to ``ends[p]``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from wse.config import FabricConfig

__all__ = ["mesh_ops"]


def mesh_ops(config: FabricConfig, pe_ops: Callable[[int, int], np.ndarray]) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
    """``(ops, starts, ends)`` of ``pe_ops(x, y)`` (one PE's rows, ending with
    ``END``) for every PE of ``config``, row by row."""
    parts, starts, ends, at = [], [], [], 0
    for y in range(config.height):
        for x in range(config.width):
            rows = pe_ops(x, y)
            parts.append(rows)
            starts.append(at)
            at += len(rows)
            ends.append(at)
    return np.concatenate(parts), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)
