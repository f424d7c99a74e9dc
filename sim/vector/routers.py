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
  multicast).

Both are compiled loops over the routers (:mod:`wse.sim.vector.kernels`).
Pushes into one FIFO never collide within a cycle (a FIFO takes from one
input port only), so the end of the cycle can run router by router. During
a run the edge-port input queues are flat arrays (:meth:`begin_run`), put
back into ``edge_in`` by :meth:`end_run`.
"""

from __future__ import annotations

from collections import deque
from itertools import chain

import numpy as np

from wse.config import FabricConfig, Port, ROUTE_INPUT_NONE, route_outputs

from . import kernels

__all__ = ["VectorRouters"]

_NONE = np.zeros(0, dtype=np.int64)
_EDGE_PORTS = {"N": Port.N, "E": Port.E, "S": Port.S, "W": Port.W}
_PORT_NAMES = [Port(p).name for p in range(4)]


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
        self._keys = None
        self.stream_left = np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ tables
    def set_route(self, x: int, y: int, color: int, input, outputs) -> None:
        """Route ``color`` at router ``(x, y)`` (arguments checked by the caller)."""
        r = y * self.width + x
        self.route_in[r, color] = ROUTE_INPUT_NONE if input is None else int(Port(input))
        mask, _ = route_outputs(x, y, outputs, self.width, self.height)
        self.route_mask[r, color] = mask

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

    # ------------------------------------------------------------------ a run
    def begin_run(self) -> None:
        """Lay the edge-port input queues out as arrays for the compiled kernels (until :meth:`end_run`)."""
        n, C = self.count.shape[0], self.colors
        keys = list(self.edge_in)
        self._keys = keys
        self.edge_r = np.zeros(len(keys), dtype=np.int64)
        self.edge_p = np.zeros(len(keys), dtype=np.int64)
        self.edge_stream = np.full((len(keys), C), -1, dtype=np.int64)
        colors, lefts, starts, pairs = [], [], [], []
        total = 0
        for g, key in enumerate(keys):
            self.edge_r[g], self.edge_p[g] = self.edge_port(*key)
            for c, q in self.edge_in[key].items():
                self.edge_stream[g, c] = len(colors)
                colors.append(c)
                starts.append(total)
                lefts.append(len(q))
                total += len(q)
                pairs.append(np.fromiter(chain.from_iterable(q), dtype=np.int64, count=2 * len(q)))
        pairs = np.concatenate(pairs).reshape(-1, 2) if pairs else np.zeros((0, 2), dtype=np.int64)
        self.stream_color = np.array(colors, dtype=np.int64)
        self.stream_pos = np.array(starts, dtype=np.int64)
        self.stream_left = np.array(lefts, dtype=np.int64)
        self.stream_words = pairs[:, 0].astype(np.uint32)
        self.stream_flags = pairs[:, 1].astype(np.uint8)
        self._gr = np.zeros(n * C, dtype=np.int64)
        self._gc = np.zeros(n * C, dtype=np.int64)
        self._moves = np.zeros(n, dtype=np.int64)
        self._chosen = np.full(len(keys), -1, dtype=np.int64)
        self._woken = np.zeros(n * C + n, dtype=np.int64)
        self._out = np.zeros((2 * (self.width + self.height) * C + 1, 5), dtype=np.int64)
        self._pending = (0, 0, 0)

    def end_run(self) -> None:
        """Put the wavelets not injected back into the edge-port queues (``edge_in``)."""
        if self._keys is None:
            return
        left = {}
        for g, key in enumerate(self._keys):
            for c in range(self.colors):
                s = self.edge_stream[g, c]
                if s >= 0 and self.stream_left[s] > 0:
                    i = self.stream_pos[s]
                    wavelets = zip(self.stream_words[i:i + self.stream_left[s]].tolist(),
                                   self.stream_flags[i:i + self.stream_left[s]].tolist())
                    left.setdefault(key, {})[c] = deque(wavelets)
        self.edge_in.clear()
        self.edge_in.update(left)
        self.stream_left = np.zeros(0, dtype=np.int64)
        self._keys = None

    def edge_pending(self) -> bool:
        """Whether an edge port still has wavelets to inject (during a run)."""
        return bool(self.stream_left.any())

    # ------------------------------------------------------------------ a cycle
    def decide(self, first: int) -> bool:
        """This cycle's decisions from the start-of-cycle state (grants, RAMP takes, edge
        injections), kept for :meth:`finish`; returns whether anything will move."""
        q = self.q
        self._pending = kernels.decide(
            first, self.count, self.route_in, self.route_mask, self.nbr, self.depth, q.rcount, q.rx_depth,
            q.tcount, q.thead, q.tcolor, self.edge_r, self.edge_p, self.edge_stream, self.stream_left,
            self._gr, self._gc, self._moves, self._chosen)
        return any(self._pending)

    def finish(self) -> np.ndarray:
        """Carry out the decisions at the end of the cycle: granted heads popped and copied to their
        outputs, edge injections, RAMP takes. Returns the PEs whose input queue got a wavelet or whose
        output queue lost one (the waiting PEs among them wake up)."""
        grants, moves, injections = self._pending
        if not (grants or moves or injections):
            return _NONE
        q = self.q
        hops, nw, ne = kernels.apply(self._gr, self._gc, grants, self.data, self.ctrl, self.head, self.count,
                                     self.route_mask, self.nbr, q.rdata, q.rctrl, q.rhead, q.rcount,
                                     self._woken, self._out)
        self.hops += hops
        self.collect(self._out[:ne])
        if injections:
            kernels.inject(self._chosen, self.edge_r, self.stream_color, self.stream_pos, self.stream_left,
                           self.stream_words, self.stream_flags, self.data, self.ctrl, self.head, self.count)
        if moves:
            kernels.take(self._moves, moves, self.data, self.ctrl, self.head, self.count,
                         q.tdata, q.tcolor, q.tctrl, q.thead, q.tcount)
            self._woken[nw:nw + moves] = self._moves[:moves]
        return self._woken[:nw + moves]

    def collect(self, rows: np.ndarray) -> None:
        """Append wavelets that left the mesh, rows ``(port, router, color, data, ctrl)`` in order, to ``edge_out``."""
        if len(rows) == 0:
            return
        port, r, c = rows[:, 0], rows[:, 1], rows[:, 2]
        index = np.where((port == 0) | (port == 2), r % self.width, r // self.width)
        key = (port * (self.width + self.height) + index) * self.colors + c
        order = np.argsort(key, kind="stable")
        key, rows, index = key[order], rows[order], index[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        ends = np.r_[starts[1:], len(key)]
        data, ctrl = rows[:, 3].tolist(), rows[:, 4].tolist()
        for a, b in zip(starts.tolist(), ends.tolist()):
            out_key = (_PORT_NAMES[int(rows[a, 0])], int(index[a]), int(rows[a, 2]))
            self.edge_out.setdefault(out_key, []).extend(zip(data[a:b], ctrl[a:b]))

    def edge_outputs_per_cycle(self) -> int:
        """The most wavelets that can leave the mesh in one cycle (an edge output per color and edge port)."""
        return int((self.nbr < 0).sum()) * self.colors

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
