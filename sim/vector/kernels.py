"""Compiled (numba) kernels of the vectorized model's router cycle.

The router rules of :mod:`wse.sim.vector.routers` (spec section 3) as loops
over every router, compiled once and cached on disk: :func:`decide` takes a
cycle's decisions from the start-of-cycle state (grants, RAMP takes from the
PEs' output queues, edge injections) and :func:`apply` / :func:`take` /
:func:`inject` carry them out at the end of the cycle. A loop over the
routers costs a few nanoseconds per idle router, so the idle ones are not
worth skipping separately; the loops do the same integer operations as the
array form, so the decisions are the golden model's.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["decide", "apply", "take", "inject"]

_RAMP = 4
#: The port facing each of N, E, S, W (``wse.config.Port.opposite``).
_OPPOSITE = np.array([2, 3, 0, 1], dtype=np.int64)


@njit(fastmath=False, cache=True)
def decide(first, count, route_in, route_mask, nbr, depth, rcount, rx_depth,
           tcount, thead, tcolor, edge_r, edge_port, edge_stream, stream_left,
           out_r, out_c, out_moves, out_inject):
    """One cycle's decisions; returns ``(grants, moves, injections)``, the counts written to
    ``out_r``/``out_c`` (granted router, color), ``out_moves`` (PEs whose output-queue head
    their router takes) and ``out_inject`` (the stream each edge port injects, -1: none)."""
    n, C = count.shape
    k = 0
    for r in range(n):
        held = 0
        for c in range(C):      # no early exit: a vectorized scan of the counts
            held |= count[r, c]
        if held == 0:
            continue
        ncand = 0
        cand = 0
        for c in range(C):
            m = route_mask[r, c]
            if count[r, c] == 0 or m == 0:
                continue
            ok = True
            for p in range(4):
                if m >> p & 1:
                    nb = nbr[r, p]
                    if nb >= 0 and (route_in[nb, c] != _OPPOSITE[p] or count[nb, c] >= depth):
                        ok = False
                        break
            if ok and (m >> _RAMP & 1) and rcount[r, c] >= rx_depth:
                ok = False
            if ok:
                ncand += 1
                cand |= 1 << c
        if ncand == 1:
            for c in range(C):
                if cand >> c & 1:
                    out_r[k], out_c[k] = r, c
                    k += 1
        elif ncand > 1:
            used = 0
            for i in range(C):
                c = (first + i) % C
                m = route_mask[r, c]
                if cand >> c & 1 and (m & used) == 0:
                    used |= m
                    out_r[k], out_c[k] = r, c
                    k += 1
    moves = 0
    for r in range(n):
        if tcount[r] > 0:
            c = tcolor[r, thead[r]]
            if route_in[r, c] == _RAMP and count[r, c] < depth:
                out_moves[moves] = r
                moves += 1
    injections = 0
    for g in range(edge_r.size):
        r, port = edge_r[g], edge_port[g]
        out_inject[g] = -1
        for i in range(C):
            c = (first + i) % C
            s = edge_stream[g, c]
            if s >= 0 and stream_left[s] > 0 and route_in[r, c] == port and count[r, c] < depth:
                out_inject[g] = s
                injections += 1
                break
    return k, moves, injections


@njit(inline="always")
def _push(data, ctrl, head, count, r, c, d, k):
    depth = data.shape[2]
    slot = (head[r, c] + count[r, c]) % depth
    data[r, c, slot] = d
    ctrl[r, c, slot] = k
    count[r, c] += 1


@njit(fastmath=False, cache=True)
def apply(gr, gc, k, data, ctrl, head, count, route_mask, nbr, rdata, rctrl, rhead, rcount,
          woken, edge_out):
    """Pop the ``k`` granted heads and copy each to its outputs; returns ``(hops, woken PEs,
    edge outputs)``: the PEs given a wavelet are written to ``woken``, the wavelets leaving the
    mesh to ``edge_out`` rows ``(port, router, color, data, ctrl)``."""
    depth = data.shape[2]
    rslots = rdata.shape[2]
    hops = 0
    nw = 0
    ne = 0
    for j in range(k):
        r, c = gr[j], gc[j]
        h = head[r, c]
        d, f = data[r, c, h], ctrl[r, c, h]
        head[r, c] = (h + 1) % depth
        count[r, c] -= 1
        m = route_mask[r, c]
        for p in range(4):
            if m >> p & 1:
                hops += 1
                nb = nbr[r, p]
                if nb >= 0:
                    _push(data, ctrl, head, count, nb, c, d, f)
                else:
                    edge_out[ne, 0], edge_out[ne, 1], edge_out[ne, 2] = p, r, c
                    edge_out[ne, 3], edge_out[ne, 4] = d, f
                    ne += 1
        if m >> _RAMP & 1:
            hops += 1
            slot = (rhead[r, c] + rcount[r, c]) % rslots
            rdata[r, c, slot] = d
            rctrl[r, c, slot] = f
            rcount[r, c] += 1
            woken[nw] = r
            nw += 1
    return hops, nw, ne


@njit(fastmath=False, cache=True)
def take(moves, nmoves, data, ctrl, head, count, tdata, tcolor, tctrl, thead, tcount):
    """Move the output-queue heads of the first ``nmoves`` PEs of ``moves`` into their routers' FIFOs."""
    slots = tdata.shape[1]
    for j in range(nmoves):
        r = moves[j]
        h = thead[r]
        _push(data, ctrl, head, count, r, tcolor[r, h], tdata[r, h], tctrl[r, h])
        thead[r] = (h + 1) % slots
        tcount[r] -= 1


@njit(fastmath=False, cache=True)
def inject(chosen, edge_r, stream_color, stream_pos, stream_left, words, flags, data, ctrl, head, count):
    """Push the next wavelet of each chosen stream (``chosen[g]`` >= 0) into its boundary router."""
    for g in range(chosen.size):
        s = chosen[g]
        if s < 0:
            continue
        i = stream_pos[s]
        _push(data, ctrl, head, count, edge_r[g], stream_color[s], words[i], flags[i])
        stream_pos[s] += 1
        stream_left[s] -= 1
