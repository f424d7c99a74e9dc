"""The golden fabric model: a mesh of routers and PEs, wavelet by wavelet.

:class:`Fabric` implements ``docs/architecture.md`` sections 2-8 and the host
API of section 5, which the RTL backends implement too: the routers and edge
ports of :class:`~wse.sim.golden.router.Routers` joined to the PEs of
:class:`~wse.sim.golden.pe.PE`. It is event driven: only routers holding
wavelets, edge ports with data to inject, PEs with something to do at the
current cycle and output queues with wavelets are looked at, and when nothing
can move the clock jumps to the next cycle at which a PE has work. Cycle
counts are those of stepping everything every cycle.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Iterable

import numpy as np

from wse.config import FabricConfig, Port, UsageError

from . import ecc
from .decode import compile_program
from .errors import FabricHang
from .events import DEFAULT_MAX_EVENTS, Recorder
from .hostargs import HostArgs, Rect, keep_ranges, stream_words
from .pe import PE
from .router import Routers

__all__ = ["Fabric", "Rect"]


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
        #: The routers and edge ports.
        self.routers = Routers(cfg, rx=[pe.rx for pe in self.pes], tx=[pe.tx for pe in self.pes])
        self.cycle = 0
        self.cycle_limit = 0
        self.total_cycles = 0
        #: True while :meth:`run` runs (a PE's corrections take pending-scrub slots only then).
        self.in_run = False
        self._compiled_cache: dict[int, tuple] = {}
        #: The :class:`~wse.sim.golden.events.Recorder` fed by :meth:`run`, or None.
        self.recorder: Recorder | None = None
        #: Called as ``progress(cycle)`` every :attr:`progress_every` cycles of a :meth:`run`
        #: (None: never; the check shares the cycle-limit test, so it costs nothing when off).
        self.progress: Callable[[int], None] | None = None
        self.progress_every = 256
        if trace:
            for pe in self.pes:
                pe.trace = []

    @property
    def edge_in(self) -> dict[tuple[str, int], dict[int, deque]]:
        """Wavelets still to inject: ``{(edge, index): {color: deque of (data, ctrl)}}``."""
        return self.routers.edge_in

    @property
    def edge_out(self) -> dict[tuple[str, int, int], list]:
        """Wavelets that left the mesh: ``{(edge, index, color): [(data, ctrl), ...]}`` in order."""
        return self.routers.edge_out

    @property
    def wavelet_hops(self) -> int:
        """Router hops (wavelet copies sent by routers) since the last :meth:`reset_counters`."""
        return self.routers.hops

    @wavelet_hops.setter
    def wavelet_hops(self, value: int) -> None:
        self.routers.hops = value

    # ------------------------------------------------------------------ host API
    def _pes_in(self, rect: Rect | None) -> Iterable[PE]:
        x0, y0, w, h = self._rect(rect)
        for y in range(y0, y0 + h):
            for x in range(x0, x0 + w):
                yield self.pes[y * self.width + x]

    def pe(self, x: int, y: int) -> PE:
        """The PE model at ``(x, y)``."""
        return self.pes[self._tile(x, y)]

    def registers(self, x: int, y: int) -> list[int]:
        """The 16 scalar registers of PE ``(x, y)`` (``r0`` reads 0)."""
        return [int(v) for v in self.pe(x, y).regs]

    def load(self, program, rect: Rect | None = None, keep=()) -> None:
        """Load a program image (``wse.firmware.image.Program``) into every PE of ``rect``; the data words
        of the ``keep`` ranges ``(lo, hi)`` stay as they are, stored bits and check bits: a kept word with an
        injected flip is not decoded by the load, it is corrected (or refused) when a program reads it."""
        cfg = self.config
        program.check_fits(cfg)
        ranges = keep_ranges(keep, program, cfg.sram_words)
        key = id(program)
        cached = self._compiled_cache.get(key)
        if cached is None or cached[0] is not program:
            cached = (program, compile_program(program.code, cfg.sram_words))
            self._compiled_cache[key] = cached
        for pe in self._pes_in(rect):
            raw = pe.mem.view(np.ndarray)
            saved = [raw[lo:hi].copy() for lo, hi in ranges]
            checks = {a: c for a, c in pe.ecc_check.items() if any(lo <= a < hi for lo, hi in ranges)}
            pe.load(program, cached[1])
            raw = pe.mem.view(np.ndarray)
            for (lo, hi), words in zip(ranges, saved):
                raw[lo:hi] = words
            if checks:                           # the kept suspect words stay suspect, still undecoded
                pe.ecc_check.update(checks)
                pe.mem = raw.view(ecc.EccMemory)
                pe.mem.pe = pe

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
        self.routers.queue_edge(*key, color, zip(arr.tolist(), flags.tolist()))

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

    def inject(self, x: int, y: int, addr: int, bits: Iterable[int], cycle: int | None = None) -> None:
        """Flip code-word bits ``bits`` of the data-memory word at ``addr`` of PE
        ``(x, y)`` as stored (the RTL devices too): 0..31 are the data
        bits, 32..38 the check bits (:mod:`wse.sim.golden.ecc`). The next read
        corrects one flip (counted in :meth:`ecc_counters`) and reports two
        with :class:`~wse.sim.golden.ecc.EccError`; a write first forgets them.

        With ``cycle`` the flip is armed instead: it lands in the first cycle
        of a run at or after ``cycle`` in which the PE runs no task and
        starts none (a flip during a task waits for the task's end; one armed flip per PE, arming
        again replaces it; ``docs/architecture.md`` section 4.7)."""
        pe = self.pe(x, y)
        self._check_span("inject", addr, 1)
        flips = ecc.flip_bits(bits)
        if cycle is None:
            ecc.inject(pe, addr, flips)
            return
        if isinstance(cycle, bool) or not isinstance(cycle, (int, np.integer)) or cycle < 0:
            raise UsageError(f"inject: the cycle of a memory flip must be an integer >= 0, not {cycle!r}")
        pe.timed_flip = (int(cycle), int(addr), flips)

    def inject_link(self, x: int, y: int, port, bits: Iterable[int], cycle: int = 0) -> None:
        """Arm a flip of link code-word bits ``bits`` (one or two of 0..37 the
        wavelet, 38..44 its check bits) in the first wavelet that crosses the
        link leaving router ``(x, y)`` through ``port`` (toward a neighbour)
        in run cycle ``cycle`` or later (the RTL devices too; one armed flip
        per link: a second replaces it). The receiving router corrects one
        flip (counted in :meth:`link_ecc_counters`); two stop the run with
        :class:`~wse.sim.golden.ecc.LinkEccError` (``docs/architecture.md`` 3.7)."""
        p, _, _ = ecc.link_target(self.width, self.height, x, y, port)
        word, check = ecc.link_masks(ecc.link_flip_bits(bits))
        if not isinstance(cycle, (int, np.integer)) or cycle < 0:
            raise UsageError(f"inject: the cycle of a link flip must be an integer >= 0, not {cycle!r}")
        self.routers.link_flips[(y * self.width + x, p)] = (int(cycle), word, check)

    def link_ecc_counters(self) -> dict[str, np.ndarray]:
        """Link ECC events since :meth:`reset_counters`, as ``[h, w, 4]``
        arrays: ``[y, x, p]`` counts the wavelets on the link leaving router
        ``(x, y)`` by port ``p`` (N, E, S, W) with a corrected flip
        (``corrected``) or an uncorrectable error (``detected``)."""
        out = {}
        for k, counts in self.routers.link_ecc.items():
            a = np.zeros((self.height, self.width, 4), dtype=np.int64)
            for (r, p), n in counts.items():
                a[r // self.width, r % self.width, p] = n
            out[k] = a
        return out

    def kill(self, x: int, y: int, port: Port | int | str | None = None) -> None:
        """Kill PE ``(x, y)`` (``port`` None) or the link leaving router ``(x,
        y)`` through ``port`` (N, E, S or W, toward a neighbour: both
        directions die). A dead PE runs no task and takes no wavelet; a dead
        link carries none. A run that needs them stops with a
        :class:`FabricHang` whose report names them (``docs/faults.md``)."""
        pe = self.pe(x, y)
        if port is None:
            pe.dead = True
            self.routers.kill(pes=[pe.index])
            return
        try:
            p = Port[port.upper()] if isinstance(port, str) else Port(port)
        except (KeyError, ValueError):
            p = None
        dx, dy = {Port.N: (0, -1), Port.S: (0, 1), Port.E: (1, 0), Port.W: (-1, 0)}.get(p, (None, None))
        if dx is None or not (0 <= x + dx < self.width and 0 <= y + dy < self.height):
            raise UsageError(f"kill: port must be N, E, S or W toward a neighbour of router ({x}, {y}), not {port!r}")
        other = (y + dy) * self.width + x + dx
        self.routers.kill(links=[(pe.index, int(p)), (other, int(p.opposite))])

    def _dead_parts(self) -> list[str]:
        """One line per dead PE and dead link."""
        lines = [f"PE ({i % self.width}, {i // self.width}) is dead" for i in sorted(self.routers.dead_pes)]
        for r, port in sorted(self.routers.dead_links):
            if Port(port) in (Port.E, Port.S):
                x, y = r % self.width, r // self.width
                nx, ny = (x + 1, y) if Port(port) is Port.E else (x, y + 1)
                lines.append(f"the link between routers ({x}, {y}) and ({nx}, {ny}) is dead")
        return lines

    def ecc_counters(self) -> dict[str, np.ndarray]:
        """Memory ECC events per PE since :meth:`reset_counters`, as ``[h, w]``
        arrays: ``corrected`` (single flips) and ``detected`` (uncorrectable
        words); the RTL devices count the same (``docs/faults.md`` section 3)."""
        return {k: np.array([[self.pes[y * self.width + x].ecc[k] for x in range(self.width)]
                             for y in range(self.height)], dtype=np.int64) for k in ("corrected", "detected")}

    def reset_counters(self) -> None:
        """Zero every counter."""
        for pe in self.pes:
            for k in pe.counters:
                pe.counters[k] = 0
            pe.ecc["corrected"] = pe.ecc["detected"] = 0
        for counts in self.routers.link_ecc.values():
            counts.clear()
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

    def record(self, rect: Rect | None = None, queues=(), max_events: int = DEFAULT_MAX_EVENTS) -> Recorder:
        """Record the events of the following runs (timelines, heatmaps; see
        :mod:`wse.sim.golden.events`) and return the :class:`Recorder`.

        ``rect`` limits the per-PE slices to a region, ``queues`` names the
        ``(x, y)`` routers whose FIFO occupancy is recorded, ``max_events``
        bounds the slices kept. Cycle counts and results do not change."""
        self.recorder = Recorder(self, rect, queues, max_events)
        return self.recorder

    def stop_recording(self) -> Recorder | None:
        """Stop recording; returns the recorder that was attached (or None)."""
        recorder, self.recorder = self.recorder, None
        return recorder

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
        self.in_run = True
        try:
            return self._run(max_cycles)
        finally:           # a run that raised (EccError, ProgramFault, FabricHang) is over too
            self.in_run = False

    def _run(self, max_cycles: int | None) -> int:
        limit = 50_000_000 if max_cycles is None else int(max_cycles)
        self.cycle_limit = limit
        pes, routers, ncolors = self.pes, self.routers, self.colors
        self._heap: list = []
        self._scheduled: list = [None] * len(pes)
        self.rx_pops: list = []
        self.tx_pushes: list = []
        self.tx_pushes_next: list = []
        due_tx: list = []
        for pe in pes:
            pe.reset_run_state()
            self.schedule(pe, 0)
        rec = self.recorder
        if rec is not None:
            rec.begin_run()
        senders = {pe.index for pe in pes if pe.tx}  # PEs whose output queue holds wavelets
        t = 0
        heap, scheduled = self._heap, self._scheduled
        report, every = self.progress, max(int(self.progress_every), 1)
        check = min(limit, every) if report is not None else limit     # the next cycle that needs a look
        while True:
            if t >= check:
                if t >= limit:
                    self.cycle = t
                    raise FabricHang(f"the fabric did not become idle within {limit} cycles", self._report(), t)
                report(t)
                check = min(limit, (t // every + 1) * every)
            # 1. Decisions from the start-of-cycle state: router grants, edge
            #    injections, output-queue heads taken by the routers; then the
            #    PEs' own steps (their pops and pushes are recorded, not done).
            first = t % ncolors
            grants = routers.grants(first)
            injections = routers.injections(first)
            ramp_moves = routers.from_ramp(senders)
            for pe in self._due(t):
                pe.step(t)
            progress = bool(grants or injections or ramp_moves or self.rx_pops or self.tx_pushes or due_tx)
            # 2. The end of the cycle: apply every pop and push (a link flip armed for now fires).
            if routers.link_flips:
                routers.now = t
            pushed_rx = routers.apply(grants)
            routers.inject(injections)
            routers.take_from_ramp(ramp_moves, senders)
            due_tx = self._apply_pe_queues(due_tx, senders)
            routers.retire()
            if rec is not None:
                rec.cycle(t, grants, injections)
            # Wake PEs whose wait may be over.
            for idx in pushed_rx:
                self._wake(pes[idx], t + 1)
            for idx in ramp_moves:
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
            if routers.active or senders or routers.edge_in or any(pe.running for pe in pes) \
                    or any(q for pe in pes for q in pe.rx) \
                    or any(pe.dead and pe.ready_task() is not None for pe in pes):
                self.cycle = t
                raise FabricHang(f"the fabric stopped making progress at cycle {t} before becoming idle",
                                 self._report(), t)
            break
        # Cycles 0 .. t-2 ran; cycle t-1 found every PE idle and nothing to move.
        t = max(t - 1, 0)
        self.cycle = t
        for pe in pes:      # memory flips armed for a cycle the run reached (its PEs idle then)
            if pe.timed_flip is not None and pe.timed_flip[0] <= t and not pe.dead:
                pe.land_timed_flip()
        if rec is not None:
            rec.end_run(t)
        self.total_cycles += t
        for pe in pes:
            pe.wait = None
        return t

    def _due(self, t: int) -> list[PE]:
        """The PEs scheduled to step in cycle ``t`` (taken off the schedule), in index order."""
        heap, scheduled, pes = self._heap, self._scheduled, self.pes
        stepping = []
        while heap and heap[0][0] == t:
            _, idx = heapq.heappop(heap)
            if scheduled[idx] == t:
                scheduled[idx] = None
                stepping.append(pes[idx])
        return stepping

    def _apply_pe_queues(self, due_tx: list, senders: set) -> list:
        """The end of the cycle for the PEs' queues: the recorded input-queue
        pops, output-queue pushes, and vector results due now (``due_tx``).
        Returns the vector results due at the end of the next cycle."""
        for pe, c in self.rx_pops:
            pe.rx[c].popleft()
        self.rx_pops.clear()
        for pe, wavelet in self.tx_pushes:
            pe.tx.append(wavelet)
            senders.add(pe.index)
        self.tx_pushes.clear()
        for pe, wavelet in due_tx:
            pe.tx.append(wavelet)
            senders.add(pe.index)
        due_tx, self.tx_pushes_next = self.tx_pushes_next, []
        return due_tx

    # ------------------------------------------------------------------ reports
    def _report(self) -> list[str]:
        lines = self._dead_parts()
        for pe in self.pes:
            where = f"PE ({pe.x}, {pe.y})"
            if pe.dead and pe.ready_task() is not None:
                lines.append(f"{where} is dead: its task {pe.ready_task()} never runs")
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
                if self.routers.route_in[pe.index][color] != int(Port.RAMP):
                    lines.append(f"{where} output queue holds {len(pe.tx)} wavelet(s); color {color} is not routed "
                                 f"from RAMP at its router")
        lines += self.routers.stuck()
        return lines or ["(nothing is visibly stuck)"]
