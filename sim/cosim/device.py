"""The host API of ``docs/architecture.md`` section 5 over the RTL mesh.

:class:`RtlFabric` implements every call of an RTL device
(:class:`wse.sim.api.RtlDevice`: the host API of every device, load,
set_route/load_routes, memcpy_h2d/d2h, stream_in/stream_out, pending_out,
launch, run, counters, reset_counters, registers, and the co-simulation
extras) on top of a few primitives that each RTL backend provides: a batch
of host-bus requests, edge queues, and a run until the mesh is idle. The host
bus is used as ``docs/rtl.md`` section 3 says (requests only between runs;
broadcast writes for whole-mesh loads); nothing is written into the RTL's
state any other way.

Memory words are written only where they can differ from what the program or
the data needs: a fresh mesh's memories are zero (the RTL's initial value),
so :meth:`load` writes only the words a run or a copy may have changed, plus
the program's non-zero data.
"""

from __future__ import annotations

import abc
from typing import Iterable

import numpy as np

from wse.config import FabricConfig, Port, UsageError
from wse.hdl.link_ecc import LINK_REGS, PORT_STRIDE
from wse.hdl.pe_ecc import ECC_ADDRS, SCRUB_SLOTS
from wse.hdl.router import encode_route, decode_route
from wse.hdl.wavelet import COUNTER_NAMES, HostSpace
from wse.sim.golden import FabricHang, ProgramFault, ecc
from wse.sim.golden.hostargs import EDGE_NAMES, HostArgs, keep_ranges, kept_words, stream_words

__all__ = ["RtlFabric", "EDGE_NAMES", "edge_ports", "STATUS_IDLE", "STATUS_CYCLE_LIMIT", "STATUS_NO_PROGRESS"]

#: Outcomes of :meth:`RtlFabric._execute`.
STATUS_IDLE, STATUS_CYCLE_LIMIT, STATUS_NO_PROGRESS = 0, 2, 3

#: Run cycles with nothing moving (no hop, no injection, no wavelet leaving a
#: PE, no PE doing anything but wait) after which a run is declared stuck. A
#: mesh in that state stays in it: every running PE waits for the fabric and
#: no router can grant (the fixed point is reached within two cycles).
PROGRESS_WINDOW = 256

_DEFAULT_LIMIT = 50_000_000

#: The PE's bit in a tile's ``DEAD`` mask (bits 0..3: the links by N, E, S, W).
_DEAD_PE = 1 << 4


def edge_ports(config: FabricConfig) -> list[tuple[str, int]]:
    """Edge ports in the backends' numbering: N[0..W-1], E[0..H-1], S[0..W-1], W[0..H-1]."""
    ports = []
    for edge in EDGE_NAMES:
        count = config.width if edge in ("N", "S") else config.height
        ports += [(edge, index) for index in range(count)]
    return ports


class RtlFabric(HostArgs, abc.ABC):
    """The host API on an RTL mesh (a base class; see :mod:`.verilator` and
    :mod:`.cocotb_device`).

    Parameters
    ----------
    config:
        The fabric; default :meth:`FabricConfig.current`.

    Beyond the host API of every device (:class:`wse.sim.api.Device`; here
    :meth:`registers` reads a PE's scalar registers through a read-only
    probe), an RTL device offers :meth:`emitted` (the wavelets each PE
    handed to its router, with their cycles, once :meth:`trace_emits` is
    on), :meth:`outputs`, :meth:`stats` and :meth:`reset`
    (:class:`wse.sim.api.RtlDevice`).
    """

    backend = "rtl"

    def __init__(self, config: FabricConfig | None = None):
        cfg = config or FabricConfig.current()
        if not isinstance(cfg, FabricConfig):
            raise TypeError(f"config must be a FabricConfig, not {cfg!r}")
        self.config = cfg
        self.width, self.height, self.colors = cfg.width, cfg.height, cfg.colors
        self._ports = edge_ports(cfg)
        self._port_index = {key: i for i, key in enumerate(self._ports)}
        self.edge_out: dict[tuple[str, int, int], list] = {}
        self.edge_out_cycles: dict[tuple[str, int, int], list] = {}
        self.cycle = 0
        self.total_cycles = 0
        self.wavelet_hops = 0
        self._programs: list = [None] * cfg.num_pes
        # Words that may be non-zero in each PE's data memory.
        self._dirty = np.zeros((cfg.num_pes, cfg.sram_words), dtype=bool)
        self._hung = False
        # PEs with injected faults since the last reset: only they can stop on an uncorrectable word.
        self._faulty: set[tuple[int, int]] = set()
        # A link flip was armed since the last reset: a run may stop on an uncorrectable wavelet.
        self._link_armed = False
        # Dead parts (kill): each tile's DEAD mask (bit p port p, bit 4 the PE), rewritten after a reset.
        self._dead: dict[tuple[int, int], int] = {}
        # Tasks launched since the last run (kept for dead PEs, which never run them), for the hang report.
        self._launched: dict[tuple[int, int], set[int]] = {}

    # ------------------------------------------------------------------ primitives
    @abc.abstractmethod
    def _bus(self, ctl: np.ndarray, xy: np.ndarray, wdata: np.ndarray) -> np.ndarray:
        """Issue host-bus requests, one per cycle; ``ctl`` = ``addr | space << 16
        | we << 19 | bcast << 20``, ``xy`` = ``x | y << 8``. Returns the read
        data of every request (0 for writes)."""

    @abc.abstractmethod
    def _inject(self, port: int, color: int, data: np.ndarray, ctrl: np.ndarray) -> None:
        """Queue wavelets at edge port ``port``."""

    @abc.abstractmethod
    def _queued(self, port: int, color: int) -> int:
        """Wavelets still queued at an edge port."""

    @abc.abstractmethod
    def _execute(self, max_cycles: int, window: int) -> tuple[int, int]:
        """Start a run and run it until the mesh is idle, ``max_cycles`` run
        cycles pass, or nothing moves for ``window`` cycles; returns
        ``(status, cycles)`` with the mesh's ``cycle`` counter."""

    @abc.abstractmethod
    def _drain(self) -> Iterable[tuple[int, np.ndarray, np.ndarray]]:
        """Take the recorded edge outputs: ``(port, wavelets, cycles)``."""

    @abc.abstractmethod
    def _run_hops(self) -> int:
        """Router hops of the last run (the mesh's ``hops``)."""

    @abc.abstractmethod
    def _tile_state(self, tile: int) -> int:
        """A tile's ``probe_state`` bits (emit, running, work, idle)."""

    @abc.abstractmethod
    def _registers(self, tile: int) -> list[int]:
        """A PE's 16 registers through the probe."""

    @abc.abstractmethod
    def _take_emits(self, tile: int) -> tuple[np.ndarray, np.ndarray]:
        """Recorded wavelets the PE emitted: ``(wavelets, cycles)``."""

    @abc.abstractmethod
    def _trace(self, on: bool) -> None:
        """Record emitted wavelets (or stop)."""

    @abc.abstractmethod
    def _reset_hardware(self) -> None:
        """Pulse the reset: registers, queues and route tables to their
        initial values (memories keep their contents)."""

    # ------------------------------------------------------------------ host bus helpers
    def _requests(self, space, addrs, wdata=None, x=0, y=0, we=False, bcast=False):
        addrs = np.asarray(addrs, dtype=np.uint32)
        n = addrs.size
        ctl = addrs | np.uint32(HostSpace(space).value << 16 | int(we) << 19 | int(bcast) << 20)
        xy = np.broadcast_to(np.asarray(x, dtype=np.uint32) | np.asarray(y, dtype=np.uint32) << 8, (n,))
        data = np.zeros(n, dtype=np.uint32) if wdata is None else np.broadcast_to(
            np.asarray(wdata, dtype=np.uint32), (n,))
        return ctl, np.ascontiguousarray(xy, dtype=np.uint32), np.ascontiguousarray(data, dtype=np.uint32)

    def _write(self, space, addrs, wdata, x=0, y=0, bcast=False) -> None:
        self._check_usable()
        self._bus(*self._requests(space, addrs, wdata, x, y, we=True, bcast=bcast))

    def _read(self, space, addrs, x=0, y=0) -> np.ndarray:
        self._check_usable()
        return self._bus(*self._requests(space, addrs, None, x, y))

    def _check_usable(self) -> None:
        if self._hung:
            raise UsageError(f"the {self.backend} mesh hung in its last run and is still running; "
                             "call reset() or make a new device")

    # ------------------------------------------------------------------ host API
    def _cells(self, rect):
        x0, y0, w, h = self._rect(rect)
        return [(x, y) for y in range(y0, y0 + h) for x in range(x0, x0 + w)]

    def _whole(self, rect) -> bool:
        return self._rect(rect) == (0, 0, self.width, self.height)

    def load(self, program, rect=None, keep=()) -> None:
        """Load a program image into every PE of ``rect`` over the host bus:
        its code, its data (the rest of the data memory zero, but the
        ``keep`` ranges ``(lo, hi)``, which are not written) and its task
        table (every other task slot cleared)."""
        cfg = self.config
        program.check_fits(cfg)
        kept = kept_words(keep_ranges(keep, program, cfg.sram_words), cfg.sram_words)
        cells = self._cells(rect)
        image = program.data_image(cfg.sram_words)
        tasks = np.zeros(cfg.tasks, dtype=np.uint32)
        for task in program.tasks:
            tasks[task.id] = task.entry | int(task.data_color) << 16 | int(task.blocked) << 17 | 1 << 18
        indices = [y * self.width + x for x, y in cells]
        # Words to write: the image's non-zero words and whatever may be non-zero now.
        dirty = (self._dirty[indices].any(axis=0) | (image != 0)) & ~kept
        addrs = np.flatnonzero(dirty).astype(np.uint32)
        code_addrs = np.arange(program.code.size, dtype=np.uint32)
        task_addrs = np.arange(cfg.tasks, dtype=np.uint32)
        targets = [(0, 0, True)] if self._whole(rect) else [(x, y, False) for x, y in cells]
        for x, y, bcast in targets:
            self._write(HostSpace.SRAM, addrs, image[addrs], x, y, bcast)
            self._write(HostSpace.IMEM, code_addrs, program.code, x, y, bcast)
            self._write(HostSpace.TASK, task_addrs, tasks, x, y, bcast)
        for i in indices:
            self._dirty[i] = (image != 0) | (self._dirty[i] & kept)
            self._programs[i] = program

    def set_route(self, x: int, y: int, color: int, input, outputs) -> None:
        """Route ``color`` at router ``(x, y)``: accepted from ``input`` (None:
        not routed), sent to every port in ``outputs``."""
        self._tile(x, y)
        self._check_color(color)
        word = encode_route(None if input is None else Port(input), [Port(p) for p in outputs])
        self._write(HostSpace.ROUTE, [color], word, x, y)

    def load_routes(self, table) -> None:
        """Apply many routes: an iterable of ``(x, y, color, input, outputs)``."""
        for x, y, color, input, outputs in table:
            self.set_route(x, y, color, input, outputs)

    def route(self, x: int, y: int, color: int) -> tuple[int, tuple[Port, ...]]:
        """The route of ``color`` at ``(x, y)`` read back over the host bus:
        (input code, output ports)."""
        self._tile(x, y)
        code, mask = decode_route(int(self._read(HostSpace.ROUTE, [color], x, y)[0]))
        return code, tuple(Port(p) for p in range(len(Port)) if mask >> p & 1)

    def memcpy_h2d(self, addr: int, array, rect=None) -> None:
        """Write ``array[h, w, n]`` (or ``[n]`` to every PE) at words
        ``addr .. addr+n-1`` of each PE of ``rect``."""
        (x0, y0, w, h), arr = self._h2d_array(array, rect)
        n = arr.shape[2]
        self._check_span("memcpy_h2d", addr, n)
        addrs = np.arange(addr, addr + n, dtype=np.uint32)
        if (w, h) == (self.width, self.height) and n and (arr == arr[:1, :1]).all():
            self._write(HostSpace.SRAM, addrs, arr[0, 0], bcast=True)
        else:
            for j in range(h):
                for i in range(w):
                    self._write(HostSpace.SRAM, addrs, arr[j, i], x0 + i, y0 + j)
        for j in range(h):
            for i in range(w):
                self._dirty[(y0 + j) * self.width + x0 + i, addr:addr + n] = True

    def memcpy_d2h(self, addr: int, n: int, rect=None) -> np.ndarray:
        """Read words ``addr .. addr+n-1`` of each PE of ``rect`` as ``uint32[h, w, n]``."""
        x0, y0, w, h = self._rect(rect)
        self._check_span("memcpy_d2h", addr, n)
        out = np.empty((h, w, n), dtype=np.uint32)
        addrs = np.arange(addr, addr + n, dtype=np.uint32)
        for j in range(h):
            for i in range(w):
                out[j, i] = self._read(HostSpace.SRAM, addrs, x0 + i, y0 + j)
                if (x0 + i, y0 + j) in self._faulty:
                    self._raise_ecc_fault([(x0 + i, y0 + j)])
        return out

    def stream_in(self, edge: str, index: int, color: int, words, ctrl=None) -> None:
        """Queue wavelets for injection at edge port ``(edge, index)`` (float32
        values or uint32 patterns; ``ctrl`` None, one flag, or one per wavelet)."""
        key = self._edge_key(edge, index)
        self._check_color(color)
        arr, flags = stream_words(words, ctrl)
        if len(arr):
            self._inject(self._port_index[key], int(color), arr, flags)

    def stream_out(self, edge: str, index: int, color: int, with_ctrl: bool = False):
        """Take the wavelets that left the mesh at ``(edge, index)`` on ``color`` (and their cycles)."""
        self.edge_out_cycles.pop((*self._edge_key(edge, index), color), None)
        return super().stream_out(edge, index, color, with_ctrl)

    def launch(self, task: int, rect=None) -> None:
        """Activate local task ``task`` on the PEs of ``rect`` (default all):
        a ``CTRL`` write per PE, taking effect at the start of the next run."""
        cells = self._cells(rect)
        for x, y in cells:
            program = self._programs[y * self.width + x]
            if not (0 <= task < self.config.tasks) or program is None or \
                    not any(t.id == task for t in program.tasks):
                raise ProgramFault(f"PE ({x}, {y}): task {task} has no entry point in the program")
        for cell in cells:
            self._launched.setdefault(cell, set()).add(task)
        if self._whole(rect):
            self._write(HostSpace.CTRL, [0], task, bcast=True)
        else:
            for x, y in cells:
                self._write(HostSpace.CTRL, [0], task, x, y)

    def run(self, max_cycles: int | None = None) -> int:
        """Run until the fabric is idle; returns the cycles this run took.

        Raises :class:`~wse.sim.golden.FabricHang` after ``max_cycles``
        cycles (default 50 million), or when nothing has moved for
        :data:`PROGRESS_WINDOW` cycles before the mesh became idle. The mesh
        is then still running: :meth:`reset` it (or make a new device)."""
        self._check_usable()
        limit = _DEFAULT_LIMIT if max_cycles is None else int(max_cycles)
        if self._faulty:    # every PE's pending scrubs drain before the run (hdl/pe_ecc.py)
            self._write(HostSpace.CTRL, [ECC_ADDRS["flip_data"]] * (SCRUB_SLOTS + 1), 0, bcast=True)
        status, cycles = self._execute(limit, PROGRESS_WINDOW)
        self._launched = {cell: tasks for cell, tasks in self._launched.items() if self._dead.get(cell, 0) & _DEAD_PE}
        self._dirty[:] = True  # programs may have written anywhere
        self._collect()
        self.cycle = cycles
        if self._faulty:
            self._hung = status != STATUS_IDLE
            self._raise_ecc_fault()
        if self._link_armed:
            self._raise_link_fault()
        if status == STATUS_IDLE:
            self.total_cycles += cycles
            self.wavelet_hops += self._run_hops()
            return cycles
        self._hung = True
        if status == STATUS_CYCLE_LIMIT:
            raise FabricHang(f"the fabric did not become idle within {limit} cycles", self._report(), cycles)
        raise FabricHang(f"the fabric stopped making progress at cycle {cycles - PROGRESS_WINDOW} before "
                         f"becoming idle", self._report(), cycles)

    def _collect(self) -> None:
        colors_mask = (1 << 5) - 1
        for port, wavelets, cycles in self._drain():
            edge, index = self._ports[port]
            for word, cycle in zip(np.asarray(wavelets, dtype=np.uint64).tolist(), np.asarray(cycles).tolist()):
                color = (word >> 32) & colors_mask
                key = (edge, index, color)
                self.edge_out.setdefault(key, []).append((word & 0xFFFFFFFF, (word >> 37) & 1))
                self.edge_out_cycles.setdefault(key, []).append(cycle)

    def _report(self) -> list[str]:
        lines = self._dead_parts()
        for y in range(self.height):
            for x in range(self.width):
                state = self._tile_state(y * self.width + x)
                if self._dead.get((x, y), 0) & _DEAD_PE and self._launched.get((x, y)) and not state & 8:
                    lines.append(f"PE ({x}, {y}) is dead: its task {min(self._launched[(x, y)])} never runs")
                elif state & 2:
                    lines.append(f"PE ({x}, {y}) has a task running that waits for the fabric")
                elif not state & 8:
                    lines.append(f"tile ({x}, {y}) is not idle: wavelets wait in its router or PE queues")
        for port, (edge, index) in enumerate(self._ports):
            for color in range(self.colors):
                left = self._queued(port, color)
                if left:
                    lines.append(f"edge {edge}{index}: {left} wavelet(s) of color {color} not injected "
                                 f"(the boundary router does not accept color {color} from {edge}, or it is full)")
        return lines or ["(nothing is visibly stuck)"]

    def counters(self) -> dict:
        """Cycle count of the last run, totals, and per-PE counters as
        ``[h, w]`` arrays read over the host bus."""
        per = {name: np.zeros((self.height, self.width), dtype=np.int64) for name in COUNTER_NAMES}
        addrs = np.arange(1, len(COUNTER_NAMES) + 1, dtype=np.uint32)
        for y in range(self.height):
            for x in range(self.width):
                values = self._read(HostSpace.CTRL, addrs, x, y)
                for name, value in zip(COUNTER_NAMES, values.tolist()):
                    per[name][y, x] = value
        return {"cycles": self.cycle, "total_cycles": self.total_cycles, "wavelet_hops": self.wavelet_hops,
                "pe": per}

    def reset_counters(self) -> None:
        """Zero every counter (broadcast writes of the counter addresses), the
        memory ECC counters included."""
        self._write(HostSpace.CTRL, [*range(1, len(COUNTER_NAMES) + 1), ECC_ADDRS["corrected"],
                                     ECC_ADDRS["detected"]], 0, bcast=True)
        self._write(HostSpace.LINK, [p * PORT_STRIDE + LINK_REGS[k] for p in range(4)
                                     for k in ("corrected", "detected")], 0, bcast=True)
        self.total_cycles = self.wavelet_hops = 0

    # ------------------------------------------------------------------ memory ECC and injection
    def inject(self, x: int, y: int, addr: int, bits: Iterable[int], cycle: int | None = None) -> None:
        """Flip code-word bits ``bits`` (0..31 data, 32..38 check bits) of the
        data-memory word at ``addr`` of PE ``(x, y)`` as stored: host-bus
        writes (the data mask, then the address and check mask), which the PE
        turns into a read and a write of the raw code word
        (``docs/architecture.md`` section 4.7). With ``cycle``, a write of
        ``flip_at`` first arms the flip for the first cycle of a run at or
        after ``cycle`` in which the PE runs no task and starts none."""
        self._tile(x, y)
        self._check_span("inject", addr, 1)
        data, check = ecc.flip_masks(ecc.flip_bits(bits))
        if cycle is not None:
            if isinstance(cycle, bool) or not isinstance(cycle, (int, np.integer)) or cycle < 0:
                raise UsageError(f"inject: the cycle of a memory flip must be an integer >= 0, not {cycle!r}")
            self._write(HostSpace.CTRL, [ECC_ADDRS["flip_at"]], int(cycle), x, y)
        # The flip is written in the PE's next cycle, through the memory's one write port: a harmless write
        # of flip_data again keeps a host SRAM write off that cycle.
        self._write(HostSpace.CTRL, [ECC_ADDRS["flip_data"], ECC_ADDRS["flip"], ECC_ADDRS["flip_data"]],
                    [data, int(addr) | check << 16, data], x, y)
        self._dirty[y * self.width + x, addr] = True
        self._faulty.add((x, y))

    def ecc_counters(self) -> dict[str, np.ndarray]:
        """Memory ECC events per PE since :meth:`reset_counters`: ``corrected``
        and ``detected`` as ``[h, w]`` arrays, read over the host bus (also
        after a run that stopped on an uncorrectable word)."""
        out = {k: np.zeros((self.height, self.width), dtype=np.int64) for k in ("corrected", "detected")}
        addrs = [ECC_ADDRS["corrected"], ECC_ADDRS["detected"]]
        for y in range(self.height):
            for x in range(self.width):
                values = self._bus(*self._requests(HostSpace.CTRL, addrs, None, x, y))
                out["corrected"][y, x], out["detected"][y, x] = (int(v) for v in values)
        return out

    def _raise_ecc_fault(self, cells=None) -> None:
        """Raise :class:`~wse.sim.golden.ecc.EccError` with the report that the
        first stopped PE (of ``cells``, default those with injected faults)
        latched, in the golden model's words (once: the report is cleared)."""
        # ``where`` twice: a host read's report is latched in the cycle after its word is decoded, so the
        # first read, right after a memcpy_d2h, may be a cycle early; the second is not.
        addrs = [ECC_ADDRS["where"], ECC_ADDRS["where"], ECC_ADDRS["stored"], ECC_ADDRS["syndrome"]]
        for x, y in sorted(cells or self._faulty, key=lambda c: (c[1], c[0])):
            _, where, stored, syndrome = (int(v) for v in self._bus(*self._requests(HostSpace.CTRL, addrs, None, x, y)))
            if where >> 31:
                # Writing the detected counter (with its value) clears the report: it is raised once.
                detected = self._bus(*self._requests(HostSpace.CTRL, [ECC_ADDRS["detected"]], None, x, y))
                self._bus(*self._requests(HostSpace.CTRL, [ECC_ADDRS["detected"]], detected, x, y, we=True))
                place = f"PE ({x}, {y}) task {where >> 16 & 0xFF} pc {syndrome >> 16}" if where >> 24 & 1 \
                    else f"PE ({x}, {y})"
                raise ecc.EccError(ecc.report(place, where & 0xFFFF, stored, syndrome & 0x7F, syndrome >> 8 & 0x3F))

    # ------------------------------------------------------------------ link ECC and injection
    def inject_link(self, x: int, y: int, port, bits: Iterable[int], cycle: int = 0) -> None:
        """Arm a flip of link code-word bits ``bits`` (one or two of 0..37 the
        wavelet, 38..44 the check bits) in the first wavelet leaving router
        ``(x, y)`` through ``port`` in run cycle ``cycle`` or later: three
        ``LINK`` writes at the sending tile (``docs/architecture.md`` 3.7)."""
        p, _, _ = ecc.link_target(self.width, self.height, x, y, port)
        word, check = ecc.link_masks(ecc.link_flip_bits(bits))
        if not isinstance(cycle, (int, np.integer)) or cycle < 0:
            raise UsageError(f"inject: the cycle of a link flip must be an integer >= 0, not {cycle!r}")
        base = p * PORT_STRIDE
        self._write(HostSpace.LINK, [base + LINK_REGS["flip_word"], base + LINK_REGS["flip_high"],
                                     base + LINK_REGS["flip_at"]],
                    [word & 0xFFFFFFFF, word >> 32 | check << 6, int(cycle)], x, y)
        self._link_armed = True

    def _links(self):
        """Every link between routers: ``(x, y, port, neighbour x, neighbour y)``."""
        for y in range(self.height):
            for x in range(self.width):
                for p in (Port.N, Port.E, Port.S, Port.W):
                    nx, ny = x + p.delta[0], y + p.delta[1]
                    if 0 <= nx < self.width and 0 <= ny < self.height:
                        yield x, y, p, nx, ny

    def link_ecc_counters(self) -> dict[str, np.ndarray]:
        """Link ECC events since :meth:`reset_counters`, as ``[h, w, 4]``
        arrays indexed by the sending router and port (the golden model's
        layout), read over the host bus from the receiving tiles."""
        out = {k: np.zeros((self.height, self.width, 4), dtype=np.int64) for k in ("corrected", "detected")}
        for x, y, p, nx, ny in self._links():
            base = int(p.opposite) * PORT_STRIDE
            values = self._bus(*self._requests(HostSpace.LINK, [base + LINK_REGS["corrected"],
                                                                base + LINK_REGS["detected"]], None, nx, ny))
            out["corrected"][y, x, int(p)], out["detected"][y, x, int(p)] = (int(v) for v in values)
        return out

    def _raise_link_fault(self) -> None:
        """Raise :class:`~wse.sim.golden.ecc.LinkEccError` with the report of the
        first link (in row-major order of the receiving router) whose receiver
        latched an uncorrectable wavelet, in the golden model's words; the
        write of its ``detected`` register clears the report and the fault."""
        regs = [LINK_REGS["report_data"], LINK_REGS["report_bits"], LINK_REGS["report_cycle"], LINK_REGS["detected"]]
        for x, y, p, nx, ny in sorted(self._links(), key=lambda link: (link[4], link[3], int(link[2].opposite))):
            base = int(p.opposite) * PORT_STRIDE
            data, bits, cycle, detected = (int(v) for v in self._bus(*self._requests(
                HostSpace.LINK, [base + r for r in regs], None, nx, ny)))
            if bits >> 31:
                self._bus(*self._requests(HostSpace.LINK, [base + LINK_REGS["detected"]], detected, nx, ny, we=True))
                word = data | (bits & 0x3F) << 32
                raise ecc.LinkEccError(ecc.link_report(x, y, p.name, nx, ny, cycle, word, bits >> 6 & 0x7F,
                                                       bits >> 13 & 0x3F))

    # ------------------------------------------------------------------ dead parts
    def kill(self, x: int, y: int, port=None) -> None:
        """Kill PE ``(x, y)`` (``port`` None) or the link leaving router ``(x,
        y)`` through ``port`` (N, E, S or W, toward a neighbour: both
        directions die), as the golden model's ``kill`` does: a ``DEAD`` write
        at each tile concerned (``docs/faults.md`` section 3.3). A dead PE
        runs no task and takes no wavelet; a dead link carries none; a run
        that needs them ends in :class:`~wse.sim.golden.FabricHang` whose
        report starts with the dead parts, in the golden model's words."""
        self._tile(x, y)
        if port is None:
            self._set_dead(x, y, _DEAD_PE)
            return
        try:
            p = Port[port.upper()] if isinstance(port, str) else Port(port)
        except (KeyError, ValueError):
            p = None
        if p not in (Port.N, Port.E, Port.S, Port.W) or not (0 <= x + p.delta[0] < self.width
                                                               and 0 <= y + p.delta[1] < self.height):
            raise UsageError(f"kill: port must be N, E, S or W toward a neighbour of router ({x}, {y}), not {port!r}")
        self._set_dead(x, y, 1 << int(p))
        self._set_dead(x + p.delta[0], y + p.delta[1], 1 << int(p.opposite))

    def _set_dead(self, x: int, y: int, bits: int) -> None:
        mask = self._dead.get((x, y), 0) | bits
        self._write(HostSpace.DEAD, [0], mask, x, y)
        self._dead[(x, y)] = mask

    def _dead_parts(self) -> list[str]:
        """One line per dead PE and dead link, in the golden model's order and words."""
        lines = [f"PE ({x}, {y}) is dead" for (x, y), mask in sorted(self._dead.items(), key=lambda c: c[0][::-1])
                 if mask & _DEAD_PE]
        for (x, y), mask in sorted(self._dead.items(), key=lambda c: c[0][::-1]):
            for p in (Port.E, Port.S):
                if mask >> int(p) & 1:
                    nx, ny = x + p.delta[0], y + p.delta[1]
                    lines.append(f"the link between routers ({x}, {y}) and ({nx}, {ny}) is dead")
        return lines

    # ------------------------------------------------------------------ RTL extras
    def registers(self, x: int, y: int) -> list[int]:
        """The 16 scalar registers of PE ``(x, y)`` (``r0`` reads 0)."""
        return [int(v) for v in self._registers(self._tile(x, y))]

    def trace_emits(self, on: bool = True) -> None:
        """Record every wavelet a PE hands to its router, with its run cycle."""
        self._trace(bool(on))

    def emitted(self, x: int, y: int) -> list[tuple[int, int, int, int]]:
        """Take the recorded wavelets PE ``(x, y)`` emitted: ``(data, color, ctrl, cycle)``."""
        wavelets, cycles = self._take_emits(self._tile(x, y))
        return [(w & 0xFFFFFFFF, (w >> 32) & 31, (w >> 37) & 1, c)
                for w, c in zip(np.asarray(wavelets, dtype=np.uint64).tolist(), np.asarray(cycles).tolist())]

    def outputs(self) -> tuple[dict, dict]:
        """Copies of the collected, not yet taken, edge outputs: ``({(edge,
        index, color): [(data, ctrl)]}, {(edge, index, color): [cycle]})``."""
        return ({k: list(v) for k, v in self.edge_out.items()},
                {k: list(v) for k, v in self.edge_out_cycles.items()})

    def stats(self) -> dict:
        """Simulation figures of the backend (clock cycles simulated...)."""
        return {}

    def reset(self) -> None:
        """Reset the mesh (registers, queues, route tables, task tables,
        counters; memories keep their words) and forget collected outputs."""
        self._reset_hardware()
        self._hung = False
        self._link_armed = False
        self._launched.clear()
        for (x, y), mask in self._dead.items():   # the DEAD registers reset to 0; the parts stay dead
            self._write(HostSpace.DEAD, [0], mask, x, y)
        self._dirty[:] = True
        self._programs = [None] * self.config.num_pes
        self.edge_out.clear()
        self.edge_out_cycles.clear()
        self.cycle = self.total_cycles = self.wavelet_hops = 0

