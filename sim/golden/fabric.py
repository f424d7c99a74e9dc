"""The golden fabric model: a mesh of routers and PEs, wavelet by wavelet.

:class:`Fabric` implements ``docs/architecture.md`` sections 2-8 and the host
API of section 5, which the RTL backends implement too. It is event driven:
only routers holding wavelets, edge ports with data to inject, PEs with
something to do at the current cycle and output queues with wavelets are
looked at, and when nothing can move the clock jumps to the next cycle at
which a PE has work. Cycle counts are those of stepping everything every cycle.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterable

import numpy as np

from wse.config import FabricConfig, Port, ROUTE_INPUT_NONE, route_outputs

from .errors import FabricHang
from .hostargs import HostArgs, Rect, stream_words
from .pe import PE, compile_program

__all__ = ["Fabric", "Rect"]

_EDGE_PORTS = {"N": Port.N, "E": Port.E, "S": Port.S, "W": Port.W}
_T_ROUTER, _T_PE, _T_EDGE = 0, 1, 2


class Fabric(HostArgs):
    """A ``config.width x config.height`` mesh.

    Parameters
    ----------
    config:
        Sizes of the fabric; default :meth:`FabricConfig.current`.
    trace:
        Record an instruction and wavelet trace for every PE (see :meth:`trace`).
    """

    backend = "golden"

    def __init__(self, config: FabricConfig | None = None, trace: bool = False):
        cfg = config or FabricConfig.current()
        self.config = cfg
        W, H, C = cfg.width, cfg.height, cfg.colors
        self.width, self.height, self.colors = W, H, C
        self.pes = [PE(self, x, y) for y in range(H) for x in range(W)]
        n = W * H
        self.fifo = [[deque() for _ in range(C)] for _ in range(n)]
        self.route_in = [[ROUTE_INPUT_NONE] * C for _ in range(n)]
        self.route_mask = [[0] * C for _ in range(n)]
        self.route_targets: list[list[tuple]] = [[()] * C for _ in range(n)]
        self.busy_colors = [set() for _ in range(n)]
        self.active_routers: set[int] = set()
        # Edge ports: (edge letter, index) -> {color: deque of (data, ctrl)} to inject.
        self.edge_in: dict[tuple[str, int], dict[int, deque]] = {}
        self.edge_out: dict[tuple[str, int, int], list] = {}
        self._edge_router: dict[tuple[str, int], tuple[int, int]] = {}
        self.cycle = 0
        self.cycle_limit = 0
        self.total_cycles = 0
        self.wavelet_hops = 0
        self._compiled_cache: dict[int, tuple] = {}
        if trace:
            for pe in self.pes:
                pe.trace = []

    # ------------------------------------------------------------------ host API
    def _pes_in(self, rect: Rect | None) -> Iterable[PE]:
        x0, y0, w, h = self._rect(rect)
        for y in range(y0, y0 + h):
            for x in range(x0, x0 + w):
                yield self.pes[y * self.width + x]

    def pe(self, x: int, y: int) -> PE:
        """The PE model at ``(x, y)``."""
        return self.pes[self._tile(x, y)]

    def load(self, program, rect: Rect | None = None) -> None:
        """Load a program image (``wse.firmware.image.Program``) into every PE of ``rect``."""
        cfg = self.config
        program.check_fits(cfg)
        key = id(program)
        cached = self._compiled_cache.get(key)
        if cached is None or cached[0] is not program:
            cached = (program, compile_program(program.code, cfg.sram_words))
            self._compiled_cache[key] = cached
        for pe in self._pes_in(rect):
            pe.load(program, cached[1])

    def set_route(self, x: int, y: int, color: int, input: Port | int | None, outputs: Iterable[Port | int]) -> None:
        """Route ``color`` at router ``(x, y)``: accepted from ``input`` (None: not
        routed), sent to every port in ``outputs``."""
        r = self.pe(x, y).index
        self._check_color(color)
        in_code = ROUTE_INPUT_NONE if input is None else int(Port(input))
        mask, outs = route_outputs(x, y, outputs, self.width, self.height)
        targets = []
        for port, neighbour in outs:
            if port is Port.RAMP:
                targets.append((port, _T_PE, r, None))
            elif neighbour is not None:
                targets.append((port, _T_ROUTER, neighbour, int(port.opposite)))
            else:
                index = x if port in (Port.N, Port.S) else y
                targets.append((port, _T_EDGE, (port.name, index, color), None))
        self.route_in[r][color] = in_code
        self.route_mask[r][color] = mask
        self.route_targets[r][color] = tuple(targets)

    def load_routes(self, table: Iterable[tuple]) -> None:
        """Apply many routes: an iterable of ``(x, y, color, input, outputs)``."""
        for x, y, color, input, outputs in table:
            self.set_route(x, y, color, input, outputs)

    def route(self, x: int, y: int, color: int) -> tuple[int, tuple[Port, ...]]:
        """The route of ``color`` at ``(x, y)``: (input code, output ports)."""
        r = self.pe(x, y).index
        return self.route_in[r][color], tuple(t[0] for t in self.route_targets[r][color])

    def memcpy_h2d(self, addr: int, array, rect: Rect | None = None) -> None:
        """Write ``array`` (shape ``[h, w, n]`` for ``rect``, float32 or uint32;
        ``[n]`` is sent to every PE) to words ``addr .. addr+n-1`` of each PE."""
        (x0, y0, w, h), arr = self._h2d_array(array, rect)
        n = arr.shape[2]
        self._check_span("memcpy_h2d", addr, n)
        for j in range(h):
            for i in range(w):
                self.pes[(y0 + j) * self.width + x0 + i].mem[addr:addr + n] = arr[j, i]

    def memcpy_d2h(self, addr: int, n: int, rect: Rect | None = None) -> np.ndarray:
        """Read words ``addr .. addr+n-1`` of each PE of ``rect`` as ``uint32[h, w, n]``."""
        x0, y0, w, h = self._rect(rect)
        self._check_span("memcpy_d2h", addr, n)
        out = np.empty((h, w, n), dtype=np.uint32)
        for j in range(h):
            for i in range(w):
                out[j, i] = self.pes[(y0 + j) * self.width + x0 + i].mem[addr:addr + n]
        return out

    def stream_in(self, edge: str, index: int, color: int, words, ctrl=None) -> None:
        """Queue wavelets for injection at edge port ``(edge, index)``.

        ``words`` are float32 values or uint32 patterns; ``ctrl`` is None (all
        data wavelets), one flag for all, or one flag per wavelet."""
        key = self._edge_key(edge, index)
        self._check_color(color)
        arr, flags = stream_words(words, ctrl)
        self._edge_router[key] = self._boundary_router(*key)
        queue = self.edge_in.setdefault(key, {}).setdefault(color, deque())
        queue.extend(zip(arr.tolist(), flags.tolist()))

    def _boundary_router(self, edge: str, index: int) -> tuple[int, int]:
        x, y = {"N": (index, 0), "S": (index, self.height - 1),
                "W": (0, index), "E": (self.width - 1, index)}[edge]
        return y * self.width + x, int(_EDGE_PORTS[edge])

    def launch(self, task: int, rect: Rect | None = None) -> None:
        """Activate local task ``task`` on the PEs of ``rect`` (default all)."""
        for pe in self._pes_in(rect):
            pe.check_task(task)
            pe.activated[task] = True

    def counters(self) -> dict:
        """Cycle count of the last run, totals, and per-PE counters as ``[h, w]`` arrays."""
        per = {k: np.array([[self.pes[y * self.width + x].counters[k] for x in range(self.width)]
                            for y in range(self.height)], dtype=np.int64)
               for k in self.pes[0].counters}
        return {"cycles": self.cycle, "total_cycles": self.total_cycles, "wavelet_hops": self.wavelet_hops, "pe": per}

    def reset_counters(self) -> None:
        """Zero every counter."""
        for pe in self.pes:
            for k in pe.counters:
                pe.counters[k] = 0
        self.total_cycles = self.wavelet_hops = 0

    def trace(self, x: int, y: int) -> list[str]:
        """The trace lines of PE ``(x, y)`` (enable with ``Fabric(trace=True)``
        or :meth:`enable_trace`)."""
        pe = self.pe(x, y)
        return list(pe.trace or [])

    def enable_trace(self, rect: Rect | None = None) -> None:
        """Start recording traces for the PEs of ``rect``."""
        for pe in self._pes_in(rect):
            if pe.trace is None:
                pe.trace = []

    # ------------------------------------------------------------------ simulation
    def schedule(self, pe: PE, time: int) -> None:
        """Step ``pe`` at cycle ``time`` (called by PEs)."""
        pe.time = time
        heapq.heappush(self._heap, (time, pe.index))
        self._scheduled[pe.index] = time

    def _wake(self, pe: PE, time: int) -> None:
        if pe.wait is not None and self._scheduled[pe.index] is None:
            pe.wait = None
            self.schedule(pe, time)

    def run(self, max_cycles: int | None = None) -> int:
        """Run until the fabric is idle; returns the cycles this run took.

        Raises :class:`FabricHang` if nothing can move before the fabric is
        idle, or after ``max_cycles`` cycles (default 50 million)."""
        limit = 50_000_000 if max_cycles is None else int(max_cycles)
        self.cycle_limit = limit
        pes, fifo = self.pes, self.fifo
        route_in, route_mask, route_targets = self.route_in, self.route_mask, self.route_targets
        busy_colors, active_routers = self.busy_colors, self.active_routers
        depth, rx_depth, ncolors = self.config.router_depth, self.config.rx_depth, self.colors
        edge_in, edge_out = self.edge_in, self.edge_out
        ramp = int(Port.RAMP)

        self._heap: list = []
        self._scheduled: list = [None] * len(pes)
        self.rx_pops: list = []
        self.tx_pushes: list = []
        self.tx_pushes_next: list = []
        due_tx: list = []
        for pe in pes:
            pe.reset_run_state()
            self.schedule(pe, 0)
        active_tx = {pe.index for pe in pes if pe.tx}
        t = 0
        heap, scheduled = self._heap, self._scheduled
        while True:
            if t >= limit:
                self.cycle = t
                raise FabricHang(f"the fabric did not become idle within {limit} cycles", self._report(), t)
            stepping = []
            while heap and heap[0][0] == t:
                _, idx = heapq.heappop(heap)
                if scheduled[idx] == t:
                    scheduled[idx] = None
                    stepping.append(pes[idx])
            # 1. Router grants (start-of-cycle state).
            grants = []
            if active_routers:
                s = t % ncolors
                for r in active_routers:
                    busy = busy_colors[r]
                    order = busy if len(busy) == 1 else sorted(busy, key=lambda c: (c - s) % ncolors)
                    used = 0
                    for c in order:
                        mask = route_mask[r][c]
                        if not mask or mask & used:
                            continue
                        for port, kind, tgt, opp in route_targets[r][c]:
                            if kind == _T_ROUTER:
                                if route_in[tgt][c] != opp or len(fifo[tgt][c]) >= depth:
                                    break
                            elif kind == _T_PE:
                                if len(pes[tgt].rx[c]) >= rx_depth:
                                    break
                        else:
                            used |= mask
                            grants.append((r, c))
            # 2. Edge injections: per port, the first color in rotating order
            #    whose head the boundary router accepts.
            injections = []
            if edge_in:
                s = t % ncolors
                for key, queues in edge_in.items():
                    r, port = self._edge_router[key]
                    for c in sorted(queues, key=lambda c: (c - s) % ncolors):
                        if route_in[r][c] == port and len(fifo[r][c]) < depth:
                            injections.append((key, r, c))
                            break
            # 3. Output queues toward the routers, then the PEs' own steps.
            tx_moves = []
            for idx in active_tx:
                data, color, ctrl = pes[idx].tx[0]
                if route_in[idx][color] == ramp and len(fifo[idx][color]) < depth:
                    tx_moves.append(idx)
            for pe in stepping:
                pe.step(t)
            progress = bool(grants or injections or tx_moves or self.rx_pops or self.tx_pushes or due_tx)
            # 4. Apply pops and pushes.
            pushed_rx = []
            for r, c in grants:
                q = fifo[r][c]
                wavelet = q.popleft()
                if not q:
                    busy_colors[r].discard(c)
                for port, kind, tgt, opp in route_targets[r][c]:
                    self.wavelet_hops += 1
                    if kind == _T_ROUTER:
                        fifo[tgt][c].append(wavelet)
                        busy_colors[tgt].add(c)
                        active_routers.add(tgt)
                    elif kind == _T_PE:
                        pes[tgt].rx[c].append(wavelet)
                        pushed_rx.append(tgt)
                    else:
                        edge_out.setdefault(tgt, []).append(wavelet)
            for key, r, color in injections:
                queues = edge_in[key]
                fifo[r][color].append(queues[color].popleft())
                if not queues[color]:
                    del queues[color]
                    if not queues:
                        del edge_in[key]
                busy_colors[r].add(color)
                active_routers.add(r)
            tx_popped = []
            for idx in tx_moves:
                data, color, ctrl = pes[idx].tx.popleft()
                fifo[idx][color].append((data, ctrl))
                busy_colors[idx].add(color)
                active_routers.add(idx)
                tx_popped.append(idx)
                if not pes[idx].tx:
                    active_tx.discard(idx)
            for pe, c in self.rx_pops:
                pe.rx[c].popleft()
            self.rx_pops.clear()
            for pe, wavelet in self.tx_pushes:
                pe.tx.append(wavelet)
                active_tx.add(pe.index)
            self.tx_pushes.clear()
            for pe, wavelet in due_tx:
                pe.tx.append(wavelet)
                active_tx.add(pe.index)
            due_tx, self.tx_pushes_next = self.tx_pushes_next, []
            for r in [r for r in active_routers if not busy_colors[r]]:
                active_routers.discard(r)
            # Wake PEs whose wait may be over.
            for idx in pushed_rx:
                self._wake(pes[idx], t + 1)
            for idx in tx_popped:
                self._wake(pes[idx], t + 1)
            t += 1
            if progress or due_tx:
                continue
            # Nothing moved, so nothing will until a PE's next scheduled step.
            while heap and scheduled[heap[0][1]] != heap[0][0]:
                heapq.heappop(heap)
            if heap:
                t = max(t, heap[0][0])
                continue
            if active_routers or active_tx or edge_in or any(pe.running for pe in pes) \
                    or any(q for pe in pes for q in pe.rx):
                self.cycle = t
                raise FabricHang(f"the fabric stopped making progress at cycle {t} before becoming idle", self._report(), t)
            break
        # Cycles 0 .. t-2 ran; cycle t-1 found every PE idle and nothing to move.
        t = max(t - 1, 0)
        self.cycle = t
        self.total_cycles += t
        for pe in pes:
            pe.wait = None
        return t

    # ------------------------------------------------------------------ reports
    def _report(self) -> list[str]:
        lines = []
        for pe in self.pes:
            where = f"PE ({pe.x}, {pe.y})"
            if pe.running:
                what = "running"
                if pe.wait and pe.wait[0] == "rx":
                    what = f"waits for a wavelet on color {pe.wait[1]}"
                elif pe.wait and pe.wait[0] == "tx":
                    what = f"waits for room in its output queue (head color {pe.tx[0][1] if pe.tx else '?'})"
                ins = pe._disasm(pe.pc) if 0 <= pe.pc < len(pe.code) and pe.code[pe.pc][3] else "?"
                lines.append(f"{where} task {pe.task} pc {pe.pc} ({ins}) {what}")
            for c, q in enumerate(pe.rx):
                if q and not pe.running:
                    why = "no task is bound to it" if not pe.bound[c] or pe.entry[c] is None else "its task is blocked"
                    lines.append(f"{where} has {len(q)} wavelet(s) on color {c} that nothing takes ({why})")
            if pe.tx:
                data, color, _ = pe.tx[0]
                if self.route_in[pe.index][color] != int(Port.RAMP):
                    lines.append(f"{where} output queue holds {len(pe.tx)} wavelet(s); color {color} is not routed from RAMP at its router")
        for r, busy in enumerate(self.busy_colors):
            x, y = r % self.width, r // self.width
            for c in sorted(busy):
                blocked = []
                if not self.route_mask[r][c]:
                    blocked.append("the route has no outputs")
                for port, kind, tgt, opp in self.route_targets[r][c]:
                    if kind == _T_ROUTER:
                        tx, ty = tgt % self.width, tgt // self.width
                        if self.route_in[tgt][c] != opp:
                            blocked.append(f"{port.name} -> router ({tx}, {ty}) does not accept color {c} from {Port(opp).name}")
                        elif len(self.fifo[tgt][c]) >= self.config.router_depth:
                            blocked.append(f"{port.name} -> router ({tx}, {ty}) is full")
                    elif kind == _T_PE and len(self.pes[tgt].rx[c]) >= self.config.rx_depth:
                        blocked.append("RAMP -> PE input queue full")
                lines.append(f"router ({x}, {y}) color {c}: {len(self.fifo[r][c])} wavelet(s) stuck"
                             + (f" ({'; '.join(blocked)})" if blocked else ""))
        for (edge, index), queues in self.edge_in.items():
            for color, q in sorted(queues.items()):
                lines.append(f"edge {edge}{index}: {len(q)} wavelet(s) of color {color} not injected "
                             f"(the boundary router does not accept color {color} from {edge}, or it is full)")
        return lines or ["(nothing is visibly stuck)"]
