"""The data-parallel replicas' gradient reduction on the fabric
(``docs/layer_pipelined.md`` section 6b).

``k`` copies of the pipeline sit on strips of ``w`` columns side by side, so
the PE at column ``lx`` of copy 0 and row ``y`` has its twins at columns
``lx + r*w`` of the same row, with the same tile shapes. After the last
pass's backward phase each twin holds its copy's weight gradient (and, at
the chain ends, the bias gradient). The ``reduce`` phase sums them in a
fixed order, copy 0's plus copy 1's plus ..., and gives every copy the sum:

* **east**: a stream per column ``lx`` of copy 0 (its gradient buffers in
  order: the tile, then the bias) leaves copy 0's PE, and every twin it
  reaches adds its own, ``S = add(S, G_r)``; the last copy keeps the sum in
  its buffers. The PEs between twins pass the stream on.
* **west**: the last copy's sum travels back, and every other twin stores it.

Every PE of a row is a stage of two conveyors (each hop one column, colors
alternating by column parity): east on :data:`EAST_COLORS`, west on
:data:`WEST_COLORS`. A PE handles the streams that touch it in one order,
east in descending ``lx``, west in ascending ``lx``: the order in which they
arrive on its link, with the stream that starts at the PE (copy 0's own
gradient east, the last copy's sum west) first, so every PE starts sending at
once and the conveyors cannot deadlock. A PE's steps of one conveyor are the
entries of one ``pvop`` record (:mod:`wse.firmware.training.pipe`), and a run
of streams that only cross it is one entry. Then every copy runs the
update on the same gradient and keeps the same parameters and momentum.
"""

from __future__ import annotations

import numpy as np

from wse.config import Port
from wse.numerics import as_bits, as_float, vadd
from wse.firmware.training import pipe

__all__ = ["EAST_COLORS", "WEST_COLORS", "REDUCE_COLORS_USED", "reduce_routes", "reduce_records", "conveyor_stages",
           "reduce_sum"]

#: Colors of the east conveyor (by the sending column's parity) and of the west one.
EAST_COLORS = (9, 10)
WEST_COLORS = (11, 12)
#: Colors a training plan with replicas needs.
REDUCE_COLORS_USED = 13


def _segments(copy0, layers, mem) -> dict:
    """``(x, y) -> [(address, words), ...]``: the gradient buffers of copy 0's PEs in stream order."""
    a = mem.regions
    segs = {}
    for layer, region in zip(layers, copy0):
        ins, outs = region.in_blocks(), region.out_blocks()
        for q, p, x, y in region.cells():
            k, o = len(ins[q]), len(outs[p])
            segs[(x, y)] = [(a["g"][0], k * o)] + \
                ([(a["db"][0], o)] if q == region.n_in - 1 and layer.bias is not None else [])
    return segs


def reduce_routes(copies, segs_rows) -> list:
    """Route-table entries of the two conveyors on every row ``segs_rows`` names,
    over the columns of the ``k`` strips."""
    k, w = len(copies), copies[1][0].x0 - copies[0][0].x0
    routes = []
    for y in segs_rows:
        for c in range(k * w):
            if c < k * w - 1:
                routes += [(c, y, EAST_COLORS[c % 2], Port.RAMP, (Port.E,)),
                           (c, y, WEST_COLORS[(c + 1) % 2], Port.E, (Port.RAMP,))]
            if c > 0:
                routes += [(c, y, EAST_COLORS[(c - 1) % 2], Port.W, (Port.RAMP,)),
                           (c, y, WEST_COLORS[c % 2], Port.RAMP, (Port.W,))]
    return routes


class _Conveyor:
    """One PE's entries of one conveyor, in order (one ``pvop`` record); an entry
    that only passes a stream on (``fmov`` fabric to fabric) joins the one before
    it if that one passes on the same colors, so a run of streams crossing a PE
    costs one entry: the same wavelets in the same order, one entry's control."""

    def __init__(self) -> None:
        self.items: list[list] = []

    def add(self, op: int, d, a, b=None) -> None:
        self.items.append([op, d, a, b, None])

    def pass_on(self, out: int, fin: int, n: int) -> None:
        last = self.items[-1] if self.items else None
        if last is not None and last[4] == (out, fin) and (last[1][0] >> 16) + n <= 0xFFFF:
            total = (last[1][0] >> 16) + n                               # the descriptor's length field
            last[1], last[2] = pipe.dsd_fabout(out, total), pipe.dsd_fabin(fin, total)
            return
        self.items.append([0, pipe.dsd_fabout(out, n), pipe.dsd_fabin(fin, n), None, (out, fin)])

    def records(self) -> list:
        return [pipe.encode_pvop(item[:4] for item in self.items)] if self.items else []


def reduce_records(config, layers, copies, mem) -> tuple[list, list]:
    """``([H][W] lists of the reduce phase's pvop records, the rows with gradients)``
    for ``copies`` (from :func:`~.pipelined_place.place_replicas`, two or more)."""
    k, w = len(copies), copies[1][0].x0 - copies[0][0].x0
    segs = _segments(copies[0], layers, mem)
    rows = sorted({y for _, y in segs})
    records = [[[] for _ in range(config.width)] for _ in range(config.height)]
    span = (k - 1) * w
    for y in rows:
        streams = [lx for lx in range(w) if segs.get((lx, y))]
        for c in range(k * w):
            pe = east = _Conveyor()
            out, fin = EAST_COLORS[c % 2], EAST_COLORS[(c - 1) % 2]
            for lx in (s for s in reversed(streams) if s <= c <= s + span):  # east, descending
                for addr, n in segs[(lx, y)]:
                    g, send, take = pipe.dsd_mem(addr, n), pipe.dsd_fabout(out, n), pipe.dsd_fabin(fin, n)
                    if c == lx:
                        pe.add(0, send, g)                                   # copy 0: S = G_0
                    elif (c - lx) % w:
                        pe.pass_on(out, fin, n)                              # pass it on
                    elif c < lx + span:
                        pe.add(1, send, take, g)                             # S = add(S, G_r), on
                    else:
                        pe.add(1, g, take, g)                                # the last copy keeps S
            pe = west = _Conveyor()
            out, fin = WEST_COLORS[c % 2], WEST_COLORS[(c + 1) % 2]
            for lx in (s for s in streams if s <= c <= s + span):           # west, ascending
                for addr, n in segs[(lx, y)]:
                    g, send, take = pipe.dsd_mem(addr, n), pipe.dsd_fabout(out, n), pipe.dsd_fabin(fin, n)
                    if c == lx + span:
                        pe.add(0, send, g)                                   # the sum leaves
                    elif (c - lx) % w:
                        pe.pass_on(out, fin, n)
                    else:
                        pe.add(0, g, take)                                   # a copy stores it
                        if c > lx:
                            pe.add(0, send, g)                               # and passes it on
            records[y][c] = east.records() + west.records()
    return records, rows


def conveyor_stages(grid) -> tuple[list, list]:
    """The reduce phase's ``[H][W]`` record lists split into ``(east, west)``: the
    records that move an east stream and those that move a west one. Every PE runs
    all its east records before its west ones, and the east conveyor alone (each
    PE taking from its west neighbour and giving to its east one) never waits on
    the west one, so the east streams all finish, then the west ones: the phase
    cannot deadlock if neither conveyor can on its own. The static deadlock check
    (:func:`~.route_check.check_pipelined`) is given the two stages as phases of
    their own; on the whole phase at once it would see each PE's two queues wait
    on each other, which the order of its records rules out."""
    from wse.firmware.isa import DsdKind

    east = [[[] for _ in row] for row in grid]
    west = [[[] for _ in row] for row in grid]
    for y, row in enumerate(grid):
        for x, records in enumerate(row):
            for words in records:
                _, fields = pipe.decode(words)[:2]
                colors = [v[1] for v in fields.values()
                          if isinstance(v, tuple) and v[0] in (DsdKind.FABIN, DsdKind.FABOUT)]
                (east if colors and colors[0] in EAST_COLORS else west)[y][x].append(words)
    return east, west


def reduce_sum(grads: list[dict]) -> dict:
    """The fixed-order sum of the copies' gradients as the reduce phase forms it,
    ``S = G_0; S = add(S, G_r)`` for ``r = 1 .. k-1``, in binary32 with the fabric's
    flushing and canonical NaN (:func:`wse.numerics.vadd`)."""
    out = {}
    for name, first in grads[0].items():
        s = np.asarray(first, dtype=np.float32)
        for g in grads[1:]:
            s = as_float(vadd(as_bits(s), as_bits(np.asarray(g[name], dtype=np.float32)))).reshape(s.shape)
        out[name] = np.ascontiguousarray(s, dtype=np.float32)
    return out
