"""Placement of the layer-pipelined mode: every Linear layer on its own
rectangle of PEs (its *region*), sized by its compute, adjacent layers next
to each other (``docs/layer_pipelined.md`` section 2).

A region deals the layer's input features over one of its axes and its
output features over the other, in contiguous blocks
(:func:`~wse.firmware.kernels.common.block_partition`), so each PE holds the
weight tile of one input block and one output block. The axes alternate from
layer to layer, which lays the regions out as a staircase: layer 0 takes its
inputs along its columns (from the north edge) and reduces along its rows
(eastward); layer 1 sits east of it on the same rows, takes its inputs along
those rows and reduces along its columns (southward); layer 2 sits south of
layer 1 on the same columns, and so on. The output blocks of a layer are
then exactly the input blocks of the next, PE line for PE line.

:func:`place` chooses the free sizes (layer 0's rows and columns, then one
side of every later layer) to minimise the largest per-PE tile (the
cycles per sample of the slowest region, which sets the pipeline's rate),
then the PEs used.
"""

from __future__ import annotations

import dataclasses

from wse.config import FabricConfig
from wse.firmware.kernels.common import block_partition

from .weight_streaming import FitError

__all__ = ["Region", "place", "place_replicas", "replica_width", "utilization_bounds", "pass_macs"]


@dataclasses.dataclass(frozen=True)
class Region:
    """One layer's rectangle of PEs.

    Members
    -------
    layer:
        Index of the Linear layer.
    x0, y0, cols, rows:
        The rectangle: columns ``x0 .. x0+cols-1``, rows ``y0 .. y0+rows-1``.
    inputs_on_columns:
        True: input block ``q`` on column ``x0+q`` and output block ``p`` on
        row ``y0+p`` (reduction eastward along rows); False: the transpose
        (inputs on rows, reduction southward along columns).
    k, o:
        The layer's input and output features.
    """
    layer: int
    x0: int
    y0: int
    cols: int
    rows: int
    inputs_on_columns: bool
    k: int
    o: int

    @property
    def n_in(self) -> int:
        """PE lines the inputs are dealt over."""
        return self.cols if self.inputs_on_columns else self.rows

    @property
    def n_out(self) -> int:
        """PE lines the outputs are dealt over (the length of each reduction chain is :attr:`n_in`)."""
        return self.rows if self.inputs_on_columns else self.cols

    @property
    def pes(self) -> int:
        """PEs of the region."""
        return self.rows * self.cols

    def in_blocks(self) -> list[range]:
        """The input features of each input line, in line order."""
        return block_partition(self.k, self.n_in)

    def out_blocks(self) -> list[range]:
        """The output features of each output line, in line order."""
        return block_partition(self.o, self.n_out)

    @property
    def tile(self) -> int:
        """The largest weight tile of a PE: multiply-adds per sample of the slowest PE."""
        return -(-self.k // self.n_in) * -(-self.o // self.n_out)

    def pe(self, q: int, p: int) -> tuple[int, int]:
        """Mesh ``(x, y)`` of the PE at input line ``q`` and output line ``p``."""
        if self.inputs_on_columns:
            return self.x0 + q, self.y0 + p
        return self.x0 + p, self.y0 + q

    def cells(self):
        """``(q, p, x, y)`` of every PE of the region."""
        for q in range(self.n_in):
            for p in range(self.n_out):
                yield (q, p) + self.pe(q, p)


def _tile(k: int, o: int, n_in: int, n_out: int) -> int:
    return -(-k // n_in) * -(-o // n_out)


def place(shapes: list[tuple[int, int]], config: FabricConfig) -> list[Region]:
    """Regions for Linear layers of ``(in_features, out_features)`` on ``config``'s mesh.

    Raises
    ------
    FitError
        If the layers cannot all be placed (more layers than the staircase
        has room for on the mesh).
    """
    best: list = [None, None]   # (key, sizes)

    def keep(tiles: list[int]) -> bool:
        return best[0] is None or max(tiles, default=0) <= best[0][0]

    for sizes, tiles, used in _staircases(shapes, config, keep):
        key = (max(tiles), used)
        if best[0] is None or key < best[0]:
            best[0], best[1] = key, sizes
    if best[1] is None:
        L = len(shapes)
        raise FitError(f"a model of {L} Linear layers does not fit a {config.mesh} mesh in the layer-pipelined "
                       f"mode: its regions form a staircase that needs at least {(L + 2) // 2} columns and "
                       f"{(L + 1) // 2} rows, one PE per layer and side")
    return _regions(shapes, best[1])


def _staircases(shapes: list[tuple[int, int]], config: FabricConfig, keep=None):
    """Every staircase of ``shapes`` on ``config``'s mesh, depth first: ``(sizes, tiles, used)``
    with the free sizes (layer 0's rows and columns, then one side of every later
    layer), each layer's largest tile and the PEs used. ``keep(tiles)`` (the
    tiles of the layers placed so far) returning False prunes a branch."""
    W, H = config.width, config.height
    L = len(shapes)

    def walk(l: int, sizes: list[int], tiles: list[int], width: int, height: int, used: int):
        if keep is not None and not keep(tiles):
            return
        if l == L:
            yield list(sizes), list(tiles), used
            return
        k, o = shapes[l]
        if l == 0:
            for rows in range(1, min(H, o) + 1):
                for cols in range(1, min(W, k) + 1):
                    yield from walk(1, [rows, cols], [_tile(k, o, cols, rows)], cols, rows, rows * cols)
            return
        shared = sizes[0] if l == 1 else sizes[l]   # the side layer l shares with layer l - 1
        if l % 2:   # inputs on layer l-1's rows; a new run of columns to the east
            for cols in range(1, min(W - width, o) + 1):
                yield from walk(l + 1, sizes + [cols], tiles + [_tile(k, o, shared, cols)], width + cols, height,
                                used + shared * cols)
        else:       # inputs on layer l-1's columns; a new run of rows to the south
            for rows in range(1, min(H - height, o) + 1):
                yield from walk(l + 1, sizes + [rows], tiles + [_tile(k, o, shared, rows)], width,
                                height + rows, used + shared * rows)

    yield from walk(0, [], [], 0, 0, 0)


def pass_macs(shapes: list[tuple[int, int]]) -> tuple[int, int]:
    """Multiply-adds per sample of Linear layers ``shapes`` (``(in, out)`` each): forward ``sum(k * o)``;
    backward twice that less the first layer's input gradient (which is not computed)."""
    forward = sum(k * o for k, o in shapes)
    return forward, 2 * forward - shapes[0][0] * shapes[0][1]


def utilization_bounds(shapes: list[tuple[int, int]], config: FabricConfig) -> dict:
    """The FMAC utilization no staircase of ``shapes`` on ``config``'s mesh can exceed, even
    with no per-sample overhead at all (``docs/layer_pipelined.md`` section 6).

    A region's PE spends at least its tile's multiply-adds per sample forward and,
    training, its tile (layer 0: the weight gradient only) or twice it (every
    later layer: weight and input gradients) backward; the slowest region sets
    each pass's rate. Every staircase is enumerated (no pruning: meant for the
    shallow models of the benchmarks). Returns, over all staircases, the best
    ``forward``, ``backward`` and ``training`` (forward then backward phases:
    both passes' multiply-adds over the sum of their rates) bounds, and
    ``both``: the best of ``min(forward, backward)`` with its ``sizes``.
    """
    fwd, bwd = pass_macs(shapes)
    pes = config.width * config.height
    out = {"forward": 0.0, "backward": 0.0, "training": 0.0, "both": 0.0, "sizes": None}
    for sizes, tiles, _ in _staircases(shapes, config):
        f = max(tiles)
        b = max([tiles[0]] + [2 * t for t in tiles[1:]])
        uf, ub = fwd / (pes * f), bwd / (pes * b)
        out["forward"] = max(out["forward"], uf)
        out["backward"] = max(out["backward"], ub)
        out["training"] = max(out["training"], (fwd + bwd) / (pes * (f + b)))
        if min(uf, ub) > out["both"]:
            out["both"], out["sizes"] = min(uf, ub), sizes
    return out


def _regions(shapes: list[tuple[int, int]], sizes: list[int]) -> list[Region]:
    regions = [Region(0, 0, 0, sizes[1], sizes[0], True, *shapes[0])]
    for l in range(1, len(shapes)):
        prev = regions[-1]
        if l % 2:
            regions.append(Region(l, prev.x0 + prev.cols, prev.y0, sizes[l + 1], prev.rows, False, *shapes[l]))
        else:
            regions.append(Region(l, prev.x0, prev.y0 + prev.rows, prev.cols, sizes[l + 1], True, *shapes[l]))
    return regions


def replica_width(config: FabricConfig, replicas: int) -> int:
    """Columns of each replica's strip when ``replicas`` copies of the pipeline share ``config``'s mesh."""
    return config.width // replicas


def place_replicas(shapes: list[tuple[int, int]], config: FabricConfig, replicas: int) -> list[list[Region]]:
    """``replicas`` copies of the staircase side by side: replica ``r`` on the strip of
    columns ``r*w .. r*w+w-1`` (``w = width // replicas``, every strip touching the
    north edge, where its samples enter); each copy is :func:`place` on a
    ``w x height`` mesh, moved east. The copies have the same shapes, so they
    compute every sample in the same float order.

    Raises
    ------
    FitError
        If ``replicas`` is not between 1 and the mesh's width, or one copy does
        not fit its strip.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= config.width:
        raise FitError(f"replicas must be an integer from 1 to the mesh's width {config.width}, not {replicas!r}")
    w = replica_width(config, replicas)
    one = place(shapes, dataclasses.replace(config, width=w))
    return [[dataclasses.replace(region, x0=region.x0 + r * w) for region in one] for r in range(replicas)]
