"""The router step of the vectorized model on torch tensors: every router of the mesh in a
fixed number of tensor operations per cycle, on the CPU or a CUDA device.

:class:`TorchRouters` holds the state of :class:`~wse.sim.vector.routers.VectorRouters`
(FIFOs as ring buffers ``data/ctrl[r, c, slot]`` with ``head/count[r, c]``, route
tables ``route_in/route_mask[r, c]``, neighbours ``nbr[r, port]``), the PEs' queues
it touches (input queues ``rdata/rctrl/rhead/rcount``, output queues
``tdata/tcolor/tctrl/thead/tcount``, as in :class:`~wse.sim.vector.state.PeState`)
and the edge-port streams of a run, as tensors (bit patterns as ``int32``). A
cycle (:meth:`TorchRouters.step`) is the rules of spec section 3, the same as
the numba kernels' (:mod:`wse.sim.vector.kernels`):

1. **Decisions from the start-of-cycle state**, dense over ``[router, color]``:
   a route is a candidate when its FIFO holds a wavelet and every output
   accepts it (the neighbour routes the color from the facing port, fixed for
   the run, and has room: one gather of the neighbours' counts as ``[router,
   port, color]``; the PE's input queue has room; the mesh edge always accepts). Grants in rotating
   color order from ``first`` with the mask of output ports already granted
   (atomic multicast): a loop over the colors, each step a few operations
   over every router. RAMP takes (the PE's output-queue head, if its color
   is routed from RAMP and the FIFO has room) and edge injections (per edge
   port, the first stream in rotating color order whose boundary FIFO routes
   it from that port and has room) likewise.
2. **The end of the cycle**: granted heads popped; every FIFO *pulls* its
   one possible input (a FIFO takes from one input port, so at most one of a
   neighbour's grant, an injection or a RAMP take arrives, and the pushes
   never collide) and writes it at ``(head + count) mod depth`` with one
   scatter; RAMP outputs are pushed into the PEs' input queues the same way.
   Wavelets leaving the mesh are gathered at the edge routers only and kept
   per cycle on the device; :meth:`TorchRouters.edge_outputs` orders them as
   ``VectorRouters.edge_out``.

Nothing in a cycle depends on a value read back to the host, so a cycle is a
fixed sequence of kernel launches (no host synchronisation), the form that
CUDA graphs can capture. Everything is integer arithmetic, so the CPU and a
GPU give the same bits. ``tests/test_vector_torch.py`` checks the state after
every cycle against the numba kernels on random routes, FIFOs, queues and
edge streams, on square, non-square and one-row meshes.
"""

from __future__ import annotations

import numpy as np
import torch

from wse.config import Port

__all__ = ["TorchRouters"]

_RAMP = int(Port.RAMP)
_OPPOSITE = (2, 3, 0, 1)
_PORT_NAMES = [Port(p).name for p in range(4)]


def _wrap(values: torch.Tensor, size: int) -> torch.Tensor:
    """``values mod size`` for ``0 <= values < 2 size`` (a ring buffer's index)."""
    return torch.where(values >= size, values - size, values)


def _one_of(values: torch.Tensor) -> torch.Tensor:
    """``[router, port, color]`` values of which at most one port's is nonzero: that one (``[router, color]``)."""
    return values[:, 0] | values[:, 1] | values[:, 2] | values[:, 3]


def _tensor(values, device, dtype=torch.int64) -> torch.Tensor:
    array = np.ascontiguousarray(values)
    if array.dtype == np.uint32:
        array = array.view(np.int32)
    return torch.from_numpy(array.copy()).to(device=device, dtype=dtype)


class TorchRouters:
    """Every router of a mesh and the PE queues they touch, as tensors on ``device``.

    Parameters
    ----------
    routers:
        A :class:`~wse.sim.vector.routers.VectorRouters` whose state (tables, FIFOs,
        its queues ``routers.q``, and the edge streams of a run begun with
        ``begin_run``) is copied; :meth:`write_back` copies the state back.
    device:
        ``"cpu"`` or ``"cuda"``.
    """

    _ROUTER = ("data", "ctrl", "head", "count")
    _QUEUES = ("rdata", "rctrl", "rhead", "rcount", "tdata", "tcolor", "tctrl", "thead", "tcount")

    def __init__(self, routers, device: str = "cpu"):
        self.device = device
        self.width, self.height, self.colors, self.depth = routers.width, routers.height, routers.colors, routers.depth
        q = routers.q
        self.rx_depth = int(q.rx_depth)
        for name in self._ROUTER:
            setattr(self, name, _tensor(getattr(routers, name), device, torch.int64 if name == "head"
                                        else torch.int32))      # heads index gathers: int64
        for name in self._QUEUES:
            narrow = name in ("rdata", "rctrl", "tdata", "tctrl", "rcount", "tcount")
            setattr(self, name, _tensor(getattr(q, name), device, torch.int32 if narrow else torch.int64))
        self.route_in = _tensor(routers.route_in, device)
        self.route_mask = _tensor(routers.route_mask, device)
        self.nbr = _tensor(routers.nbr, device)
        self.hops = torch.zeros((), dtype=torch.int64, device=device)
        self._tables()
        self._streams(routers)
        self._edge_log: list[tuple] = []

    # ------------------------------------------------------------------ set-up
    def _tables(self) -> None:
        """What the route tables fix for the whole run: per port, whether each route's
        neighbour routes the color from the facing port (or the port is at the edge), and
        whether each FIFO's input port leads to a neighbour that sends it the color."""
        n = self.nbr.shape[0]
        dev = self.device
        self._nbc = self.nbr.clamp(min=0)
        self._nbc_flat = self._nbc.reshape(-1)
        self._has = self.nbr >= 0
        self._bits = [((self.route_mask >> p) & 1) == 1 for p in range(5)]
        # [router, port, color]: a route's output p needs no check (not routed there, or the edge), or
        # needs room at a neighbour that routes the color from the facing port; a FIFO pulls from the
        # neighbour behind its input port p, if that one sends the color its way.
        opposite = torch.tensor(_OPPOSITE, device=dev)[None, :, None]
        nb_in = self.route_in[self._nbc]                                  # [n, 4, C]
        nb_mask = self.route_mask[self._nbc]
        has = self._has[:, :, None]
        bits = torch.stack(self._bits[:4], dim=1)
        self._free = ~bits | ~has
        self._needs_room = bits & has & (nb_in == opposite)
        ports = torch.arange(4, device=dev)[None, :, None]
        self._pulls = (self.route_in[:, None, :] == ports) & has & (((nb_mask >> opposite) & 1) == 1)
        self._popcount = sum(((self.route_mask >> p) & 1) for p in range(5))
        self._edges = []
        for p in range(4):
            routers = torch.nonzero(~self._has[:, p]).flatten()
            self._edges.append(routers)
        self._colors = torch.arange(self.colors, device=dev)
        self._dummy = n * self.colors              # a scatter target no FIFO uses

    def _streams(self, routers) -> None:
        """The edge streams of the run ``routers`` has begun (none if it has not)."""
        dev = self.device
        if getattr(routers, "_keys", None) is None:
            self.edge_r = torch.zeros(0, dtype=torch.int64, device=dev)
            self.edge_p = torch.zeros(0, dtype=torch.int64, device=dev)
            self.edge_stream = torch.zeros((0, self.colors), dtype=torch.int64, device=dev)
            self.stream_color = self.stream_pos = self.stream_left = torch.zeros(0, dtype=torch.int64, device=dev)
            self.stream_words = torch.zeros(0, dtype=torch.int32, device=dev)
            self.stream_flags = torch.zeros(0, dtype=torch.int32, device=dev)
            return
        for name in ("edge_r", "edge_p", "edge_stream", "stream_color", "stream_pos", "stream_left"):
            setattr(self, name, _tensor(getattr(routers, name), dev))
        self.stream_words = _tensor(routers.stream_words, dev, torch.int32)
        self.stream_flags = _tensor(routers.stream_flags, dev, torch.int32)

    # ------------------------------------------------------------------ a cycle
    def _neighbours(self, values: torch.Tensor) -> torch.Tensor:
        """``values[nbr[r, p], c]`` as ``[router, port, color]`` (the router itself at the edge)."""
        return values.index_select(0, self._nbc_flat).view(self._nbc.shape + values.shape[1:])

    def _grants(self, first: int) -> torch.Tensor:
        """``[router, color]``: the routes granted this cycle."""
        count, mask = self.count, self.route_mask
        room = self._neighbours(count) < self.depth                       # [n, 4, C]
        ports = self._free | (self._needs_room & room)
        ok = ports[:, 0] & ports[:, 1] & ports[:, 2] & ports[:, 3] & (count > 0) & (mask != 0)
        ok &= ~self._bits[_RAMP] | (self.rcount < self.rx_depth)
        granted = torch.zeros_like(ok)
        used = torch.zeros(count.shape[0], dtype=torch.int64, device=self.device)
        for i in range(self.colors):
            c = (first + i) % self.colors
            g = ok[:, c] & ((mask[:, c] & used) == 0)
            used = used | torch.where(g, mask[:, c], 0)
            granted[:, c] = g
        return granted

    def _injections(self, first: int) -> torch.Tensor:
        """Per edge port, the stream it injects this cycle (-1: none)."""
        chosen = torch.full((self.edge_r.shape[0],), -1, dtype=torch.int64, device=self.device)
        if chosen.numel() == 0:
            return chosen
        left = self.stream_left
        for i in range(self.colors):
            c = (first + i) % self.colors
            s = self.edge_stream[:, c]
            ready = (s >= 0) & (left[s.clamp(min=0)] > 0) & (self.route_in[self.edge_r, c] == self.edge_p) \
                & (self.count[self.edge_r, c] < self.depth) & (chosen < 0)
            chosen = torch.where(ready, s, chosen)
        return chosen

    def step(self, first: int) -> torch.Tensor:
        """One cycle with colors granted in rotating order from ``first`` (the golden model's
        ``cycle % colors``). Returns ``[pe]`` bool: the PEs whose input queue got a wavelet or
        whose output queue lost one (those that wake up)."""
        self.decide(first)
        return self.finish()

    def decide(self, first: int) -> torch.Tensor:
        """The decisions of a cycle from the start-of-cycle state (grants, RAMP takes, edge
        injections), kept for :meth:`finish`; the PEs' step of the cycle goes between the two.
        Returns a 0-d bool tensor: whether anything moves."""
        D = self.depth
        granted = self._grants(first)
        # RAMP takes: the output-queue head's color routed from RAMP, with room (start-of-cycle counts).
        tcolor = self.tcolor.gather(1, self.thead[:, None])[:, 0]
        move = (self.tcount > 0) & (self.route_in.gather(1, tcolor[:, None])[:, 0] == _RAMP) \
            & (self.count.gather(1, tcolor[:, None])[:, 0] < D)
        chosen = self._injections(first)
        self._decided = (granted, tcolor, move, chosen)
        return granted.any() | move.any() | (chosen >= 0).any()

    def finish(self) -> torch.Tensor:
        """The end of the cycle :meth:`decide` decided (pops, pushes, RAMP outputs, edge log).
        Returns ``[pe]`` bool: the PEs whose input queue got a wavelet or whose output queue
        lost one (those that wake up)."""
        D = self.depth
        granted, tcolor, move, chosen = self._decided
        # Pop the granted heads.
        head = self.head
        out_data = self.data.gather(2, head[:, :, None])[:, :, 0]
        out_ctrl = self.ctrl.gather(2, head[:, :, None])[:, :, 0]
        self.head = torch.where(granted, _wrap(head + 1, D), head)
        self.count = self.count - granted.to(torch.int32)
        self.hops = self.hops + (granted.to(torch.int64) * self._popcount).sum()
        # Every FIFO pulls its one possible input: a neighbour's grant, an injection, a RAMP take.
        got = self._pulls & self._neighbours(granted)                     # [n, 4, C]: at most one port
        incoming = got[:, 0] | got[:, 1] | got[:, 2] | got[:, 3]
        value, flag = (_one_of(torch.where(got, self._neighbours(v), 0)) for v in (out_data, out_ctrl))
        taken_slot = self.thead
        mv = move[:, None] & (self._colors[None, :] == tcolor[:, None])
        incoming |= mv
        value = torch.where(mv, self.tdata.gather(1, taken_slot[:, None]), value)
        flag = torch.where(mv, self.tctrl.gather(1, taken_slot[:, None]), flag)
        if chosen.numel() and self.stream_words.numel():
            self._inject(chosen, incoming, value, flag)
        slot = _wrap(self.head + self.count, D)[:, :, None]
        self.data.scatter_(2, slot, torch.where(incoming, value, self.data.gather(2, slot)[:, :, 0])[:, :, None])
        self.ctrl.scatter_(2, slot, torch.where(incoming, flag, self.ctrl.gather(2, slot)[:, :, 0])[:, :, None])
        self.count = self.count + incoming.to(torch.int32)
        # RAMP outputs into the PEs' input queues; the taken output-queue heads dropped.
        ramp = granted & self._bits[_RAMP]
        rslots = self.rdata.shape[2]
        rslot = _wrap(self.rhead + self.rcount, rslots)[:, :, None]
        self.rdata.scatter_(2, rslot, torch.where(ramp, out_data, self.rdata.gather(2, rslot)[:, :, 0])[:, :, None])
        self.rctrl.scatter_(2, rslot, torch.where(ramp, out_ctrl, self.rctrl.gather(2, rslot)[:, :, 0])[:, :, None])
        self.rcount = self.rcount + ramp.to(torch.int32)
        self.thead = torch.where(move, _wrap(self.thead + 1, self.tdata.shape[1]), self.thead)
        self.tcount = self.tcount - move.to(torch.int32)
        self._log_edges(granted, out_data, out_ctrl)
        return ramp.any(1) | move

    def _inject(self, chosen: torch.Tensor, incoming: torch.Tensor, value: torch.Tensor, flag: torch.Tensor) -> None:
        """The chosen streams' next wavelets into their boundary FIFOs (in ``incoming``/``value``/``flag``)."""
        C = self.colors
        picked = chosen >= 0
        s = chosen.clamp(min=0)
        target = torch.where(picked, self.edge_r * C + self.stream_color[s], self._dummy)
        pos = self.stream_pos[s]
        flat_in = torch.zeros(self._dummy + 1, dtype=torch.bool, device=self.device)
        flat_in[target] = picked
        flat_v = torch.zeros(self._dummy + 1, dtype=torch.int32, device=self.device)
        flat_v[target] = self.stream_words[pos.clamp(max=max(0, self.stream_words.numel() - 1))]
        flat_f = torch.zeros(self._dummy + 1, dtype=torch.int32, device=self.device)
        flat_f[target] = self.stream_flags[pos.clamp(max=max(0, self.stream_flags.numel() - 1))]
        shape = incoming.shape
        got = flat_in[:-1].view(shape)
        incoming |= got
        value.copy_(torch.where(got, flat_v[:-1].view(shape), value))
        flag.copy_(torch.where(got, flat_f[:-1].view(shape), flag))
        step = picked.to(torch.int64)
        self.stream_pos = self.stream_pos.scatter_add(0, s, step)
        self.stream_left = self.stream_left.scatter_add(0, s, -step)

    def _log_edges(self, granted: torch.Tensor, out_data: torch.Tensor, out_ctrl: torch.Tensor) -> None:
        for p, routers in enumerate(self._edges):
            if routers.numel():
                sent = granted[routers] & self._bits[p][routers]
                self._edge_log.append((p, routers, sent, out_data[routers], out_ctrl[routers]))

    # ------------------------------------------------------------------ results
    def edge_outputs(self) -> dict[tuple[str, int, int], list[tuple[int, int]]]:
        """The wavelets that left the mesh since the start, ``{(edge, index, color): [(data,
        ctrl), ...]}`` in cycle order (``VectorRouters.edge_out``'s form); reads the log back."""
        out: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
        for p, routers, sent, data, ctrl in self._edge_log:
            sent_np = sent.cpu().numpy()
            if not sent_np.any():
                continue
            routers_np = routers.cpu().numpy()
            data_np = data.cpu().numpy().view(np.uint32)
            ctrl_np = ctrl.cpu().numpy()
            for i, c in zip(*np.nonzero(sent_np)):
                r = int(routers_np[i])
                index = r % self.width if p in (0, 2) else r // self.width
                out.setdefault((_PORT_NAMES[p], index, int(c)), []).append((int(data_np[i, c]), int(ctrl_np[i, c])))
        return out

    def state(self) -> dict[str, np.ndarray]:
        """Every array of the state as numpy (``data``/``rdata``/``tdata`` as ``uint32``)."""
        names = self._ROUTER + self._QUEUES + ("stream_pos", "stream_left")
        out = {}
        for name in names:
            value = getattr(self, name).cpu().numpy()
            out[name] = value.view(np.uint32) if name in ("data", "rdata", "tdata") else value
        out["hops"] = np.int64(self.hops.item())
        return out
