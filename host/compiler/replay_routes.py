"""The routes as the replay's engines read them (:mod:`.replay`, :mod:`.replay_events`):
distinct packed rows with targets relative to the router, and a row number per
router and color (:func:`pack_routes`)."""

from __future__ import annotations

import numpy as np

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
    distinct, and a router's 16 colors' row numbers (int16 where they fit) take
    one cache line instead of 16 rows (1 KiB). A neighbour router whose route
    does not take the color from this link can never accept it: its kind is
    ``_NEVER``, marked once instead of checked every cycle."""
    routers, colors = routes.input_port.shape
    table = np.zeros((routers, colors, 16), dtype=np.int32)
    table[:, :, _N] = routes.n_targets
    table[:, :, _MASK] = routes.output_mask
    table[:, :, _UP] = -2
    table[:, :, _RAMP_IN] = routes.input_port == int(Port.RAMP)
    here = np.arange(routers, dtype=np.int64)
    if upstream is not None:
        table[:, :, _UP] = np.where(upstream >= 0, 0, upstream)
        table[:, :, _UP_AT] = np.where(upstream >= 0, upstream - here[:, None], 0)
    kind = routes.target_kind.copy()
    c_index = np.broadcast_to(np.arange(colors)[None, :, None], kind.shape)
    accepts = routes.input_port[routes.target, c_index] == routes.target_port
    kind[(kind == TO_ROUTER) & ~accepts] = _NEVER
    offset = np.where((kind == TO_ROUTER) | (kind == _NEVER) | (kind == TO_PE), routes.target - here[:, None, None], 0)
    unused = np.arange(kind.shape[2])[None, None, :] >= routes.n_targets[:, :, None]
    kind[unused], offset[unused] = 0, 0          # never read: equal rows stay equal
    width = 2 * kind.shape[2]
    table[:, :, _TARGETS:_TARGETS + width:2] = kind
    table[:, :, _TARGETS + 1:_TARGETS + width:2] = offset
    rows, index = _distinct_rows(table.reshape(-1, 16))
    index = index.reshape(routers, colors).astype(np.int16 if rows.shape[0] <= 1 << 15 else np.int32)
    return np.ascontiguousarray(rows, dtype=np.int32), index


def _distinct_rows(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, inverse)``: the distinct rows of ``flat`` and each row's number among them,
    ``flat == rows[inverse]``. Grouped by a 64-bit key (a sort of integers, not of rows:
    ``np.unique(axis=0)`` takes seconds on big meshes), then checked row for row; keys that
    collide fall back to the sort of rows."""
    weights = np.random.default_rng(0).integers(1, 1 << 62, size=flat.shape[1], dtype=np.int64) | 1
    keys = (flat.astype(np.int64) * weights[None, :]).sum(axis=1)      # wraps: a hash
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rows = flat[first]
    if not np.array_equal(rows[inverse], flat):
        rows, inverse = np.unique(flat, axis=0, return_inverse=True)
    return rows, inverse.reshape(-1)
