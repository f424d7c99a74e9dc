"""The route tables of the static cycle model's replay (:mod:`.replay`), as arrays."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from wse.config import ROUTE_INPUT_NONE, FabricConfig, Port, route_outputs

__all__ = ["Network", "Routes", "TO_ROUTER", "TO_PE", "TO_EDGE"]

_EDGE_PORT = {"N": Port.N, "E": Port.E, "S": Port.S, "W": Port.W}
#: Kinds of a route's target: a neighbour router, the router's own PE, the mesh edge (wavelets leave).
TO_ROUTER, TO_PE, TO_EDGE = 0, 1, 2
_MAX_TARGETS = 5


class Network:
    """Route tables as arrays for the replay.

    For router ``r`` (row-major) and color ``c``: ``input_port[r, c]`` is the
    port the route accepts from (:data:`~wse.config.ROUTE_INPUT_NONE` when
    there is no route), ``output_mask[r, c]`` its output port bit mask and
    ``n_targets[r, c]`` its distinct outputs (up to five); for each output
    ``k``, ``target_kind[r, c, k]`` (:data:`TO_ROUTER`, :data:`TO_PE`,
    :data:`TO_EDGE`), ``target[r, c, k]`` (the router or PE) and
    ``target_port[r, c, k]`` (the port a target router must route the color
    from to accept it).

    Parameters
    ----------
    config : FabricConfig
        The mesh and its queue depths.
    routes : iterable of (x, y, color, input, outputs)
        The route table entries, as a plan lists them.
    """

    def __init__(self, config: FabricConfig, routes):
        W, H, C = config.width, config.height, config.colors
        n = W * H
        self.config = config
        self.input_port = np.full((n, C), ROUTE_INPUT_NONE, dtype=np.int64)
        self.output_mask = np.zeros((n, C), dtype=np.int64)
        self.n_targets = np.zeros((n, C), dtype=np.int64)
        self.target_kind = np.zeros((n, C, _MAX_TARGETS), dtype=np.int64)
        self.target = np.zeros((n, C, _MAX_TARGETS), dtype=np.int64)
        self.target_port = np.zeros((n, C, _MAX_TARGETS), dtype=np.int64)
        # Entries alike but for where they are (the same input, outputs and mesh edges around them)
        # are written together, their targets moved with them (the wafer's 4.5 million entries took
        # 21 s one by one). Where entries set one router and color twice they are written one by
        # one, in order, so that the last one holds, as before.
        routes = routes if isinstance(routes, list) else list(routes)
        n_entries = len(routes)
        kinds: dict = {}
        kind = np.fromiter((kinds.setdefault((e[3], tuple(e[4])), len(kinds)) for e in routes), np.int64, n_entries)
        x = np.fromiter((e[0] for e in routes), np.int64, n_entries)
        y = np.fromiter((e[1] for e in routes), np.int64, n_entries)
        color = np.fromiter((e[2] for e in routes), np.int64, n_entries)
        r = y * W + x
        edges = (x == 0) + 2 * (x == W - 1) + 4 * (y == 0) + 8 * (y == H - 1)
        if len(np.unique(r * C + color)) < n_entries:
            groups = [np.array([i]) for i in range(n_entries)]
        else:
            key = kind * 16 + edges
            order = np.argsort(key, kind="stable")
            cuts = np.flatnonzero(np.diff(key[order])) + 1
            groups = np.split(order, cuts) if n_entries else []
        by_code = {code: entry for entry, code in kinds.items()}
        for members in groups:
            first = int(members[0])
            inp, outputs = by_code[int(kind[first])]
            rr, cc = r[members], color[members]
            self.input_port[rr, cc] = ROUTE_INPUT_NONE if inp is None else int(Port(inp))
            mask, outs = route_outputs(int(x[first]), int(y[first]), outputs, W, H)
            for k, (port, neighbour) in enumerate(outs):
                if port is Port.RAMP:
                    self.target_kind[rr, cc, k], self.target[rr, cc, k] = TO_PE, rr
                elif neighbour is not None:
                    self.target_kind[rr, cc, k] = TO_ROUTER
                    self.target[rr, cc, k] = rr + (neighbour - int(r[first]))
                    self.target_port[rr, cc, k] = int(port.opposite)
                else:
                    self.target_kind[rr, cc, k] = TO_EDGE
            self.output_mask[rr, cc] = mask
            self.n_targets[rr, cc] = len(outs)

    def port(self, edge: str, index: int) -> tuple[int, int]:
        """(boundary router, port code) of edge port ``(edge, index)``."""
        W, H = self.config.width, self.config.height
        x, y = {"N": (index, 0), "S": (index, H - 1), "W": (0, index), "E": (W - 1, index)}[edge]
        return y * W + x, int(_EDGE_PORT[edge])

    def upstream(self) -> np.ndarray:
        """``[routers, colors]``: where router ``r``'s route of color ``c`` takes
        its wavelets from: the neighbour router's index for a mesh port, -1 for
        the ramp (the PE's output queue), -2 for the mesh edge or no route.
        The fast replay (:mod:`.replay_events`) wakes it when that FIFO loses
        a wavelet."""
        W, H = self.config.width, self.config.height
        n = W * H
        r = np.arange(n)
        x, y = r % W, r // W
        up = np.full(self.input_port.shape, -2, dtype=np.int64)
        up[self.input_port == int(Port.RAMP)] = -1
        for port in (Port.N, Port.E, Port.S, Port.W):
            dx, dy = port.delta
            nx, ny = x + dx, y + dy
            inside = (nx >= 0) & (nx < W) & (ny >= 0) & (ny < H)
            at = (self.input_port == int(port)) & inside[:, None]
            up[at] = np.broadcast_to((ny * W + nx)[:, None], up.shape)[at]
        return up

    def routes(self) -> Routes:
        """The tables and the queue depths, as the compiled replay takes them."""
        cfg = self.config
        return Routes(self.input_port, self.output_mask, self.n_targets, self.target_kind, self.target,
                      self.target_port, cfg.router_depth, cfg.rx_depth, cfg.tx_depth)


class Routes(NamedTuple):
    """The route tables of a :class:`Network` and the fabric's queue depths (read-only)."""

    input_port: np.ndarray
    output_mask: np.ndarray
    n_targets: np.ndarray
    target_kind: np.ndarray
    target: np.ndarray
    target_port: np.ndarray
    router_depth: int
    rx_depth: int
    tx_depth: int
