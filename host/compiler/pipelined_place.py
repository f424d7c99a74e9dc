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

__all__ = ["Region", "place", "place_replicas", "replica_width"]


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
    W, H = config.width, config.height
    L = len(shapes)
    best: list = [None, None]   # (key, sizes)

    def search(l: int, sizes: list[int], width: int, height: int, worst: int, used: int) -> None:
        # width/height: the extent of the staircase so far; sizes: the free size of every layer placed
        if best[0] is not None and worst > best[0][0]:
            return
        if l == L:
            key = (worst, used)
            if best[0] is None or key < best[0]:
                best[0], best[1] = key, list(sizes)
            return
        k, o = shapes[l]
        if l == 0:
            for rows in range(1, min(H, o) + 1):
                for cols in range(1, min(W, k) + 1):
                    sizes.extend((rows, cols))
                    search(1, sizes, cols, rows, _tile(k, o, cols, rows), rows * cols)
                    del sizes[-2:]
            return
        shared = sizes[0] if l == 1 else sizes[l]   # the side layer l shares with layer l - 1
        if l % 2:   # inputs on layer l-1's rows; a new run of columns to the east
            for cols in range(1, min(W - width, o) + 1):
                sizes.append(cols)
                search(l + 1, sizes, width + cols, height, max(worst, _tile(k, o, shared, cols)),
                       used + shared * cols)
                sizes.pop()
        else:       # inputs on layer l-1's columns; a new run of rows to the south
            for rows in range(1, min(H - height, o) + 1):
                sizes.append(rows)
                search(l + 1, sizes, width, height + rows, max(worst, _tile(k, o, shared, rows)),
                       used + shared * rows)
                sizes.pop()

    search(0, [], 0, 0, 0, 0)
    if best[1] is None:
        raise FitError(f"a model of {L} Linear layers does not fit a {config.mesh} mesh in the layer-pipelined "
                       f"mode: its regions form a staircase that needs at least {(L + 2) // 2} columns and "
                       f"{(L + 1) // 2} rows, one PE per layer and side")
    return _regions(shapes, best[1])


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
