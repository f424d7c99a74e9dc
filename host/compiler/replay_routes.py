"""The routes as the replay's engines read them (:mod:`.replay`, :mod:`.replay_events`):
distinct packed rows with targets relative to the router, and a row number per
router and color (:func:`pack_routes`)."""

from __future__ import annotations

import numpy as np
from numba import njit

from wse.config import Port

from .network import TO_PE, TO_ROUTER, Routes

__all__ = ["pack_routes"]

# Fields of a packed route row (pack_routes); a target kind that can never accept (beside network.TO_*).
_N, _MASK, _UP, _UP_AT, _TARGETS = 0, 1, 2, 3, 4
_NEVER = 3
# The last field of a row (after at most five target pairs): 1 if the route takes its color from the ramp.
_RAMP_IN = 15


def pack_routes(routes: Routes, upstream: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The routes packed as ``(rows, index)`` (most of a busy cycle's time goes to
    memory): router ``r``'s route of color ``c`` is the 64-byte row
    ``rows[index[r, c]]``, where ``_N`` counts its targets, ``_MASK`` holds the
    output ports, ``_UP`` where it takes its wavelets from (-2 the edge or no
    route, -1 the ramp, 0 the neighbour router ``r + row[_UP_AT]``; -2 unless
    ``upstream``, :meth:`.network.Network.upstream`, is given: :mod:`.replay_events`
    reads it), from ``_TARGETS`` a (kind, offset) pair per target (the
    router or PE ``r + offset``; 0 for the edge), and ``_RAMP_IN`` 1 if the route
    takes the color from the ramp (an output queue's head may enter: the engines
    read it beside the targets instead of the int64 ``Routes.input_port``). Targets are relative to the
    router, so the routers of one class share their rows: the rows are
    distinct, and a router's 16 colors' row numbers (int8, or int16, where they fit)
    take a quarter of a cache line instead of 16 rows (1 KiB). A neighbour router whose route
    does not take the color from this link can never accept it: its kind is
    ``_NEVER``, marked once instead of checked every cycle. Fields past a route's
    targets are 0, so equal routes give equal rows.

    Compiled, one pass over the routes into a table of the distinct rows (numpy's
    whole-table arrays and sort of every row's key took 11 s on the 750x994 mesh, for
    8 distinct rows)."""
    routers, colors = routes.input_port.shape
    has_up = upstream is not None
    up = np.ascontiguousarray(upstream if has_up else np.zeros((1, 1)), dtype=np.int64)
    rows, index = _pack(np.ascontiguousarray(routes.n_targets, dtype=np.int64),
                        np.ascontiguousarray(routes.output_mask, dtype=np.int64),
                        np.ascontiguousarray(routes.input_port, dtype=np.int64),
                        np.ascontiguousarray(routes.target_kind, dtype=np.int64),
                        np.ascontiguousarray(routes.target, dtype=np.int64),
                        np.ascontiguousarray(routes.target_port, dtype=np.int64), up, has_up, int(Port.RAMP))
    fits = [kind for kind in (np.int8, np.int16) if rows.shape[0] <= np.iinfo(kind).max + 1]
    return rows, index.astype(fits[0] if fits else np.int32)


@njit(cache=True)
def _pack(n_targets, output_mask, input_port, target_kind, target, target_port, upstream, has_up, ramp):
    """:func:`pack_routes`' rows and index: each route's row built in place and looked up by its
    64-bit hash in an open-addressing table of row numbers (rows compared in full on a hit)."""
    routers, colors = n_targets.shape
    index = np.empty((routers, colors), np.int32)
    rows = np.zeros((64, 16), np.int32)
    count = 0
    slots = np.full(256, -1, np.int64)
    row = np.zeros(16, np.int32)
    for r in range(routers):
        for c in range(colors):
            row[:] = 0
            n = n_targets[r, c]
            row[_N] = n
            row[_MASK] = output_mask[r, c]
            row[_UP] = -2
            if has_up:
                u = upstream[r, c]
                row[_UP] = 0 if u >= 0 else u
                row[_UP_AT] = u - r if u >= 0 else 0
            row[_RAMP_IN] = 1 if input_port[r, c] == ramp else 0
            for k in range(n):
                kind, to = target_kind[r, c, k], target[r, c, k]
                if kind == TO_ROUTER and input_port[to, c] != target_port[r, c, k]:
                    kind = _NEVER
                row[_TARGETS + 2 * k] = kind
                row[_TARGETS + 2 * k + 1] = to - r if kind == TO_ROUTER or kind == _NEVER or kind == TO_PE else 0
            mask = slots.shape[0] - 1
            at = np.int64(_hash16(row) & np.uint64(mask))
            while True:
                i = slots[at]
                if i < 0:           # a new row
                    if count == rows.shape[0]:
                        grown = np.zeros((2 * count, 16), np.int32)
                        grown[:count] = rows
                        rows = grown
                    rows[count] = row
                    slots[at] = count
                    index[r, c] = count
                    count += 1
                    if 2 * count > slots.shape[0]:      # rehash into twice the slots
                        slots = _rehash(rows, count, 2 * slots.shape[0])
                    break
                same = True
                for f in range(16):
                    if rows[i, f] != row[f]:
                        same = False
                        break
                if same:
                    index[r, c] = i
                    break
                at = (at + 1) & mask
    return rows[:count].copy(), index


@njit(cache=True, inline="always")
def _hash16(row):
    """A 64-bit hash of a 16-field row (FNV-style, each field's 32 bits mixed in)."""
    h = np.uint64(0x9E3779B97F4A7C15)
    for f in range(16):
        h = (h ^ np.uint64(np.int64(row[f]) & 0xFFFFFFFF)) * np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
    return h


@njit(cache=True)
def _rehash(rows, count, size):
    """Open-addressing slots of size ``size`` holding rows ``0 .. count - 1``."""
    slots = np.full(size, -1, np.int64)
    mask = size - 1
    for i in range(count):
        at = np.int64(_hash16(rows[i]) & np.uint64(mask))
        while slots[at] >= 0:
            at = (at + 1) & mask
        slots[at] = i
    return slots
