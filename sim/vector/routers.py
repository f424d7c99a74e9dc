"""The routers of the vectorized model: every router's FIFOs and route tables as arrays.

The rules are those of :class:`wse.sim.golden.router.Routers` (spec section
3): one FIFO per color and router, ``router_depth`` deep, here a ring buffer
``data[r, c, slot]`` with ``head[r, c]`` and ``count[r, c]``; a route per
color (``route_in[r, c]``, ``route_mask[r, c]``). A cycle's decisions come
from the start-of-cycle state for all routers at once:

* ``ready[r, c]``: every output of the route accepts color ``c`` (the
  neighbour routes it from the facing port and has room, the PE's input
  queue has room, the mesh edge always accepts);
* the grants: colors visited in rotating order from ``first``, a candidate
  granted when none of its outputs was granted to an earlier color (atomic
  multicast). The loop is over colors, each step over every busy router.

Pushes into one FIFO never collide within a cycle (a FIFO takes from one
input port only), so the end of the cycle is a handful of scatters.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from wse.config import FabricConfig, Port, ROUTE_INPUT_NONE, route_outputs

__all__ = ["VectorRouters"]

_RAMP = int(Port.RAMP)
_OPPOSITE = np.array([int(Port(p).opposite) for p in range(4)], dtype=np.int64)
_EDGE_PORTS = {"N": Port.N, "E": Port.E, "S": Port.S, "W": Port.W}


class VectorRouters:
    """Every router of a ``width x height`` mesh as arrays (see the module text).

    ``rx`` and ``tx`` are the PEs' queues (:class:`wse.sim.vector.pe.PeQueues`):
    the RAMP output writes to ``rx``, the RAMP input reads ``tx``.
    """

    def __init__(self, config: FabricConfig, queues):
        W, H, C, D = config.width, config.height, config.colors, config.router_depth
        n = W * H
        self.width, self.height, self.colors, self.depth = W, H, C, D
        self.q = queues
        self.data = np.zeros((n, C, D), dtype=np.uint32)
        self.ctrl = np.zeros((n, C, D), dtype=np.uint8)
        self.head = np.zeros((n, C), dtype=np.int64)
        self.count = np.zeros((n, C), dtype=np.int64)
        self.route_in = np.full((n, C), ROUTE_INPUT_NONE, dtype=np.int64)
        self.route_mask = np.zeros((n, C), dtype=np.int64)
        idx = np.arange(n)
        xs, ys = idx % W, idx // W
        nbr = np.full((n, 4), -1, dtype=np.int64)
        for p in range(4):
            dx, dy = Port(p).delta
            nx, ny = xs + dx, ys + dy
            inside = (nx >= 0) & (nx < W) & (ny >= 0) & (ny < H)
            nbr[inside, p] = (ny * W + nx)[inside]
        self.nbr = nbr
        self.edge_in: dict[tuple[str, int], dict[int, deque]] = {}
        self.edge_out: dict[tuple[str, int, int], list] = {}
        self.hops = 0
        self._order = None

    # ------------------------------------------------------------------ tables
    def set_route(self, x: int, y: int, color: int, input, outputs) -> None:
        """Route ``color`` at router ``(x, y)`` (arguments checked by the caller)."""
        r = y * self.width + x
        self.route_in[r, color] = ROUTE_INPUT_NONE if input is None else int(Port(input))
        mask, _ = route_outputs(x, y, outputs, self.width, self.height)
        self.route_mask[r, color] = mask
        self._order = None

    def route(self, r: int, color: int) -> tuple[int, tuple[Port, ...]]:
        """``(input code, output ports in port order)`` of ``color`` at router ``r``."""
        mask = int(self.route_mask[r, color])
        return int(self.route_in[r, color]), tuple(Port(p) for p in range(5) if mask >> p & 1)

    def edge_port(self, edge: str, index: int) -> tuple[int, int]:
        """(boundary router, port code) of edge port ``(edge, index)``."""
        x, y = {"N": (index, 0), "S": (index, self.height - 1),
                "W": (0, index), "E": (self.width - 1, index)}[edge]
        return y * self.width + x, int(_EDGE_PORTS[edge])

    def queue_edge(self, edge: str, index: int, color: int, wavelets) -> None:
        """Queue ``(data, ctrl)`` pairs for injection at edge port ``(edge, index)``."""
        self.edge_in.setdefault((edge, index), {}).setdefault(color, deque()).extend(wavelets)

    # ------------------------------------------------------------------ decisions
    def grants(self, first: int):
        """This cycle's grants from the start-of-cycle state: ``(routers, colors)`` index arrays."""
        rows = np.flatnonzero(self.count.any(axis=1))
        if rows.size == 0:
            return rows, rows
        C, D = self.colors, self.depth
        accept, nbr = self._accepting()
        mask = self.route_mask[rows]
        cand = (self.count[rows] > 0) & (mask != 0)
        cols = np.arange(C)
        room = np.concatenate([self.count < D, np.ones((1, C), dtype=bool)])
        for p in range(4):
            has = (mask >> p & 1).astype(bool)
            cand &= ~has | (accept[p][rows] & room[nbr[rows, p]])
        has = (mask >> _RAMP & 1).astype(bool)
        cand &= ~has | (self.q.rcount[rows] < self.q.rx_depth)
        multi = cand.sum(axis=1) > 1
        granted = cand.copy()
        if multi.any():
            sub = np.flatnonzero(multi)
            used = np.zeros(sub.size, dtype=np.int64)
            order = (first + cols) % C
            for c in order:
                m = mask[sub, c]
                ok = cand[sub, c] & ((m & used) == 0)
                granted[sub, c] = ok
                used |= np.where(ok, m, 0)
        r, c = np.nonzero(granted)
        return rows[r], c

    def _accepting(self):
        """Per port ``p``: ``[r, c]`` the link leaving ``r`` by ``p`` reaches a router that routes ``c``
        from the facing port (the mesh edge always accepts); and the neighbours with the edge as row ``n``.
        Depends on the route tables only, so it is kept until a route changes."""
        if self._order is None:
            n = self.nbr.shape[0]
            nbr = np.where(self.nbr < 0, n, self.nbr)
            accept = []
            for p in range(4):
                nb = self.nbr[:, p]
                ok = self.route_in[np.maximum(nb, 0)] == _OPPOSITE[p]
                ok[nb < 0] = True
                accept.append(ok)
            self._order = (accept, nbr)
        return self._order

    def injections(self, first: int) -> list[tuple]:
        """This cycle's edge injections ``(port key, router, color)`` (spec 3.6)."""
        out = []
        C, D = self.colors, self.depth
        for key, queues in self.edge_in.items():
            r, port = self.edge_port(*key)
            for c in sorted(queues, key=lambda c: (c - first) % C):
                if self.route_in[r, c] == port and self.count[r, c] < D:
                    out.append((key, r, c))
                    break
        return out

    def from_ramp(self) -> np.ndarray:
        """The PEs whose output-queue head their router's RAMP input takes this cycle."""
        q = self.q
        senders = np.flatnonzero(q.tcount > 0)
        if senders.size == 0:
            return senders
        color = q.tcolor[senders, q.thead[senders]]
        ok = (self.route_in[senders, color] == _RAMP) & (self.count[senders, color] < self.depth)
        return senders[ok]

    # ------------------------------------------------------------------ end of the cycle
    def _push(self, r, c, data, ctrl) -> None:
        slot = (self.head[r, c] + self.count[r, c]) % self.depth
        self.data[r, c, slot] = data
        self.ctrl[r, c, slot] = ctrl
        self.count[r, c] += 1

    def apply(self, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Pop every granted head and send a copy on each output; returns the PEs given a wavelet."""
        if r.size == 0:
            return r
        h = self.head[r, c]
        data, ctrl = self.data[r, c, h], self.ctrl[r, c, h]
        self.head[r, c] = (h + 1) % self.depth
        self.count[r, c] -= 1
        mask = self.route_mask[r, c]
        hops = 0
        for p in range(4):
            sel = (mask >> p & 1).astype(bool)
            if not sel.any():
                continue
            hops += int(sel.sum())
            nb = self.nbr[r[sel], p]
            inside = nb >= 0
            if inside.any():
                self._push(nb[inside], c[sel][inside], data[sel][inside], ctrl[sel][inside])
            if not inside.all():
                edge = Port(p).name
                for rr, cc, d, k in zip(r[sel][~inside].tolist(), c[sel][~inside].tolist(),
                                        data[sel][~inside].tolist(), ctrl[sel][~inside].tolist()):
                    index = rr % self.width if p in (0, 2) else rr // self.width
                    self.edge_out.setdefault((edge, index, cc), []).append((d, k))
        sel = (mask >> _RAMP & 1).astype(bool)
        hops += int(sel.sum())
        self.hops += hops
        if sel.any():
            self.q.rx_push(r[sel], c[sel], data[sel], ctrl[sel])
        return r[sel]

    def inject(self, injections: list[tuple]) -> None:
        """Move the chosen edge-port heads into their FIFOs."""
        for key, r, c in injections:
            queues = self.edge_in[key]
            data, ctrl = queues[c].popleft()
            self._push(np.array([r]), np.array([c]), data, ctrl)
            if not queues[c]:
                del queues[c]
                if not queues:
                    del self.edge_in[key]

    def take_from_ramp(self, moves: np.ndarray) -> None:
        """Move the output-queue heads of ``moves`` into their routers' FIFOs."""
        if moves.size:
            data, color, ctrl = self.q.tx_pop(moves)
            self._push(moves, color, data, ctrl)

    # ------------------------------------------------------------------ reports
    def stuck(self) -> list[str]:
        """What holds wavelets: busy router FIFOs, then edge ports."""
        lines = []
        for r, c in zip(*np.nonzero(self.count)):
            x, y = int(r) % self.width, int(r) // self.width
            lines.append(f"router ({x}, {y}) color {int(c)}: {int(self.count[r, c])} wavelet(s) stuck")
        for (edge, index), queues in self.edge_in.items():
            for color, q in sorted(queues.items()):
                lines.append(f"edge {edge}{index}: {len(q)} wavelet(s) of color {color} not injected "
                             f"(the boundary router does not accept color {color} from {edge}, or it is full)")
        return lines
