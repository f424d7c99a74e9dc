"""The instruction stream of ``layernorm_bwd.s`` as timing ops, for the static cycle model.

A PE's control flow depends only on its features ``f`` and tokens ``t``
and its place in the column and row chains, all fixed by the plan:
``BUSY`` cycles between the vector instructions that read or write the
fabric (the feature sums south and ``[a, c]`` back north, the token sums
east). :func:`wse.host.compiler.replay.replay` replays them against the
routes; ``tests/test_layernorm_bwd_kernel.py`` checks the count against the
golden model's. The mirror follows the listing block by block and must
change with ``layernorm_bwd.s``.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.timing_ops import VEC, OpRows

from .common import chain_color_grids, mesh_coordinates
from .gelu import TokenPlan
from .layernorm import BACK_COLORS, CHAIN_COLORS, column_routes
from .layernorm_bwd import ROW_COLORS, feature_token_sizes, row_routes, used_columns
from .mirrors import mesh_ops

__all__ = ["timing_ops", "pe_ops"]


def _vec(ops: OpRows, n: int, c_in: int = -1, c_out: int = -1) -> None:
    """A vector instruction on the fabric (one cycle and no wavelet when empty)."""
    if n == 0:
        ops.busy(1)
    else:
        ops.op(VEC, n, c_in, -1, c_out)


def _column_chain(ops: OpRows, t: int, first: bool, last: bool, colors: tuple[int, int, int, int]) -> None:
    """Down the column with ``P`` (``2t``) and back north with ``[a, c]``."""
    c_in, c_out, b_in, b_out = colors
    n = 2 * t
    ops.busy(10 + 1)
    if not first:
        ops.busy(5 + 1)
        if not last:
            ops.busy(6)
            _vec(ops, n, c_in, c_out)
            ops.busy(1 + 5)
            _vec(ops, n, b_in)
            ops.busy(1 + 6)
            _vec(ops, n, -1, b_out)
        else:
            _vec(ops, n, c_in)
            ops.busy(1 + 2 + n + 1 + 1 + 6)
            _vec(ops, n, -1, b_out)
            ops.busy(1)
    elif not last:
        ops.busy(1 + 6)
        _vec(ops, n, -1, c_out)
        ops.busy(1 + 5)
        _vec(ops, n, b_in)
        ops.busy(1)
    else:
        ops.busy(1 + n + 1 + 2 + n + 1 + 1)


def pe_ops(plan: TokenPlan, x: int, y: int) -> np.ndarray:
    """The timing ops of PE ``(x, y)``, ending with ``END``."""
    cfg = plan.config
    feats, tokens = feature_token_sizes(plan)
    f, t = int(feats[y, x]), int(tokens[y, x])
    n = f * t
    ops = OpRows()
    ops.busy(1 + 2 + 1)                              # select, ld, beq
    if t == 0:
        return ops.end()
    ops.busy(5 + 9 + 8 + 2 + f * (t + 8))            # setup, g = mul(dy, gamma)
    ops.busy(18 + n + 1)                             # gx
    ops.busy(10 + 2 * t + 1 + 16 + f * (2 * t + 6) + 1)     # P
    column, row = mesh_coordinates(cfg)
    grids = chain_color_grids(row, CHAIN_COLORS) + chain_color_grids(cfg.height - 1 - row, BACK_COLORS)
    _column_chain(ops, t, y == 0, y == cfg.height - 1, tuple(int(g[y, x]) for g in grids))
    ops.busy(32 + f * (4 * t + 10))                  # dx
    ops.busy(18 + n + 1 + 2 + 5 + f * (2 * t + 12))  # the token sums
    r_in, r_out = (int(g[y, x]) for g in chain_color_grids(column, ROW_COLORS))
    ops.busy(9)
    if x == 0:
        ops.busy(2 + 2 + 2 * f + 1 + 1)
    else:
        ops.busy(5)
        _vec(ops, 2 * f, r_in)
    ops.busy(6 + 2 * f + 1 + 2 + 1)
    if x != used_columns(plan) - 1:
        ops.busy(6)
        _vec(ops, 2 * f, -1, r_out)
    return ops.end()


def timing_ops(plan: TokenPlan):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`."""
    ops, starts, ends = mesh_ops(plan.config, lambda x, y: pe_ops(plan, x, y))
    routes = column_routes(plan.config) + row_routes(plan)
    return routes, ops, starts, ends, {}
