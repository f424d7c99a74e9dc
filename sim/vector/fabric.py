"""The vectorized fabric model: every router and PE of the mesh stepped together, cycle by cycle.

:class:`VectorFabric` implements the host API (:class:`wse.sim.api.Device`)
with the cycle semantics of ``docs/architecture.md`` sections 2-8, bit for
bit and cycle for cycle equal to the golden model
(:class:`wse.sim.golden.Fabric`). Its state is arrays
(:class:`~.state.PeState`, :class:`~.routers.VectorRouters`); one cycle is

1. the routers' decisions for every router from the start-of-cycle state
   (grants, edge injections, RAMP takes from the PEs' output queues);
2. the PEs due this cycle, split into groups by what they do (task
   selection, scalar instructions by opcode, memory vector instructions,
   send/recv, vector elements) and each group done with array operations.
   As in the golden model, instructions that touch only a PE's own state run
   ahead of the clock, so a PE meets the clock only at fabric accesses and
   task selection;
3. the end of the cycle: pops and pushes of the routers, queues filled.

When nothing moves, the clock jumps to the next cycle at which a PE has work.
See ``docs/vector.md``.
"""

from __future__ import annotations


import numpy as np

from wse.config import FabricConfig
from wse.firmware.asm import format_instruction
from wse.firmware.isa import BY_NAME, BY_OPCODE
from wse.sim.golden.errors import FabricHang, ProgramFault
from wse.sim.golden.hostargs import HostArgs, Rect, keep_ranges, stream_words

from . import loop
from .code import K_BAD, K_EXIT, K_INDEXED, K_SEND, K_VECTOR, CodeTable
from .routers import VectorRouters
from .scalar import run_scalars, scalar_fault
from .state import COUNTERS, PeState
from . import veck, vindexed
from .vector import begin_fabric_vector, vector_elements, vector_memory

__all__ = ["VectorFabric"]

_EMPTY = np.zeros(0, dtype=np.int64)
_SENDC = BY_NAME["sendc"].opcode


class VectorFabric(HostArgs):
    """A ``config.width x config.height`` mesh held as arrays (see the module text).

    Parameters
    ----------
    config:
        Sizes of the fabric; default :meth:`FabricConfig.current`.
    stepper:
        ``"compiled"`` (default): the whole cycle loop is one compiled function
        (:func:`wse.sim.vector.loop.run_cycles`) that returns to Python only when
        the run stops; ``"arrays"``: the loop in Python, each cycle's PEs grouped
        with numpy index arrays and handed to the same compiled kernels (the form
        the data-parallel versions follow). Both give the same bits and cycles.
    """

    backend = "vector"
    STEPPERS = ("compiled", "arrays")

    def __init__(self, config: FabricConfig | None = None, stepper: str = "compiled"):
        cfg = config or FabricConfig.current()
        if stepper not in self.STEPPERS:
            raise ValueError(f"stepper {stepper!r}: expected one of {', '.join(self.STEPPERS)}")
        self.stepper = stepper
        self.config = cfg
        self.width, self.height, self.colors = cfg.width, cfg.height, cfg.colors
        self.s = PeState(cfg)
        self.code = CodeTable()
        self.routers = VectorRouters(cfg, self.s)
        self.cycle = 0
        self.cycle_limit = 0
        self.total_cycles = 0
        self.moved = 0
        self._next_tx: list = []

    @property
    def edge_out(self) -> dict:
        """Wavelets that left the mesh: ``{(edge, index, color): [(data, ctrl), ...]}`` in order."""
        return self.routers.edge_out

    @property
    def edge_in(self) -> dict:
        """Wavelets still to inject: ``{(edge, index): {color: deque of (data, ctrl)}}``."""
        return self.routers.edge_in

    @property
    def wavelet_hops(self) -> int:
        """Router hops since the last :meth:`reset_counters`."""
        return self.routers.hops

    # ------------------------------------------------------------------ host API
    def _pe_index(self, rect) -> np.ndarray:
        x0, y0, w, h = self._rect(rect)
        ys, xs = np.meshgrid(np.arange(y0, y0 + h), np.arange(x0, x0 + w), indexing="ij")
        return (ys * self.width + xs).ravel()

    def registers(self, x: int, y: int) -> list[int]:
        """The scalar registers of PE ``(x, y)`` (``r0`` reads 0)."""
        return [int(v) for v in self.s.regs[self._tile(x, y)]]

    def load(self, program, rect: Rect | None = None, keep=()) -> None:
        """Load a program image (``wse.firmware.image.Program``) into every PE of ``rect``; the data words
        of the ``keep`` ranges ``(lo, hi)`` stay as they are."""
        program.check_fits(self.config)
        ranges = keep_ranges(keep, program, self.config.sram_words)
        base, n = self.code.add(program)
        s, pes = self.s, self._pe_index(rect)
        s.base[pes], s.ncode[pes] = base, n
        for p in pes.tolist():
            s.program[p] = program
        saved = [s.mem[pes, lo:hi].copy() for lo, hi in ranges]
        s.mem[pes] = 0
        for (lo, hi), words in zip(ranges, saved):
            s.mem[pes, lo:hi] = words
        for addr, words in program.data:
            s.mem[pes, addr:addr + len(words)] = np.asarray(words, dtype=np.uint32)
        s.entry[pes], s.bound[pes], s.blocked[pes], s.activated[pes] = -1, False, False, False
        for task in program.tasks:
            s.entry[pes, task.id] = task.entry
            s.bound[pes, task.id] = bool(task.data_color)
            s.blocked[pes, task.id] = bool(task.blocked)

    def memcpy_h2d(self, addr: int, array, rect: Rect | None = None) -> None:
        """Write ``array[h, w, n]`` (or ``[n]`` for every PE) to words ``addr .. addr+n-1`` of each PE of ``rect``."""
        (x0, y0, w, h), arr = self._h2d_array(array, rect)
        n = arr.shape[2]
        self._check_span("memcpy_h2d", addr, n)
        mem = self.s.mem.reshape(self.height, self.width, -1)
        mem[y0:y0 + h, x0:x0 + w, addr:addr + n] = arr

    def memcpy_d2h(self, addr: int, n: int, rect: Rect | None = None) -> np.ndarray:
        """Words ``addr .. addr+n-1`` of each PE of ``rect`` as ``uint32[h, w, n]``."""
        x0, y0, w, h = self._rect(rect)
        self._check_span("memcpy_d2h", addr, n)
        mem = self.s.mem.reshape(self.height, self.width, -1)
        return mem[y0:y0 + h, x0:x0 + w, addr:addr + n].copy()

    def stream_in(self, edge: str, index: int, color: int, words, ctrl=None) -> None:
        """Queue wavelets for injection at edge port ``(edge, index)`` on ``color``."""
        key = self._edge_key(edge, index)
        self._check_color(color)
        arr, flags = stream_words(words, ctrl)
        self.routers.queue_edge(*key, color, zip(arr.tolist(), flags.tolist()))

    def launch(self, task: int, rect: Rect | None = None) -> None:
        """Activate local task ``task`` on the PEs of ``rect`` (default all)."""
        pes = self._pe_index(rect)
        self.check_task(pes, np.full(pes.size, task))
        self.s.activated[pes, task] = True

    def counters(self) -> dict:
        """Cycle count of the last run, totals, and per-PE counters as ``[h, w]`` arrays."""
        shape = (self.height, self.width)
        per = {k: self.s.counters[k].reshape(shape).copy() for k in COUNTERS}
        return {"cycles": self.cycle, "total_cycles": self.total_cycles, "wavelet_hops": self.wavelet_hops,
                "pe": per}

    def reset_counters(self) -> None:
        """Zero every counter."""
        for v in self.s.counters.values():
            v[:] = 0
        self.total_cycles = 0
        self.routers.hops = 0

    # ------------------------------------------------------------------ faults
    def fault(self, pe: int, message: str) -> ProgramFault:
        """A :class:`ProgramFault` naming PE ``pe``, its task, pc and instruction."""
        s = self.s
        task = int(s.task[pe])
        where = f"PE ({pe % self.width}, {pe // self.width}) {'no task' if task < 0 else f'task {task}'} " \
                f"pc {int(s.pc[pe])}"
        pc = int(s.pc[pe])
        ins = ""
        if 0 <= pc < s.ncode[pe] and self.code.kind[s.base[pe] + pc] != K_BAD:
            try:
                ins = f" ({format_instruction(int(self.code.words[s.base[pe] + pc]))})"
            except ValueError as exc:
                ins = f" ({exc})"
        return ProgramFault(f"{where}{ins}: {message}")

    def indexed_fault(self, pe: int, kind: int, value: int) -> ProgramFault:
        """The fault ``kind`` (:mod:`.vindexed`) of PE ``pe``'s ``fmacx``/``fdotx``."""
        name = BY_OPCODE[int(self.code.op[self.s.base[pe] + self.s.pc[pe]])].name
        return self.fault(pe, vindexed.fault_message(kind, value, name, self.colors, self.s.mem.shape[1]))

    def check_task(self, pes: np.ndarray, task: np.ndarray) -> None:
        """Fault unless every PE's program has an entry for its ``task``."""
        ok = task < self.s.ntasks
        ok[ok] = self.s.entry[pes[ok], task[ok]] >= 0
        if not ok.all():
            k = int(np.flatnonzero(~ok)[0])
            raise self.fault(int(pes[k]), f"task {int(task[k])} has no entry point in the program")

    def push_next(self, pes, data, color) -> None:
        """Vector results for the output queues, pushed at the end of the next cycle."""
        self._next_tx.append((pes, data, color))

    # ------------------------------------------------------------------ simulation
    def run(self, max_cycles: int | None = None) -> int:
        """Run until the fabric is idle; returns the cycles this run took.

        Raises :class:`FabricHang` if nothing can move before the fabric is
        idle, or after ``max_cycles`` cycles (default 50 million)."""
        limit = 50_000_000 if max_cycles is None else int(max_cycles)
        self.cycle_limit = limit
        routers = self.routers
        self.s.reset_run_state()
        routers.begin_run()
        try:
            t = self._loop_compiled(limit) if self.stepper == "compiled" else self._loop(limit)
        finally:
            routers.end_run()
        t = max(t - 1, 0)
        self.cycle = t
        self.total_cycles += t
        return t

    def _loop_compiled(self, limit: int) -> int:
        """The cycles of a run in the compiled loop (see :meth:`run`); returns the cycle after the last one."""
        s, routers = self.s, self.routers
        S, K, R = loop.pack(self)
        W = loop.scratch(self)
        edge_max = routers.edge_outputs_per_cycle()
        P = (self.colors, limit, s.tx_depth, s.rx_depth, routers.depth, edge_max)
        ctl = np.zeros(4, dtype=np.int64)
        out = np.zeros((max(8 * edge_max, 1 << 14), 5), dtype=np.int64)
        while True:
            code, a, b, c = loop.run_cycles(S, K, R, P, W, ctl, out)
            routers.hops += int(ctl[2])
            routers.collect(out[:ctl[3]])
            t = int(ctl[0])
            if code == loop.DRAIN:
                continue
            if code == loop.IDLE:
                return t
            if code in (loop.LIMIT, loop.HANG):
                self.cycle = t
                routers.end_run()
                what = f"did not become idle within {limit} cycles" if code == loop.LIMIT else \
                    f"stopped making progress at cycle {t} before becoming idle"
                raise FabricHang(f"the fabric {what}", self._report(), t)
            if code == loop.F_SCALAR:
                raise scalar_fault(self, int(a), int(b), int(c))
            if code == loop.F_COLOR:
                raise self.fault(int(a), f"color {int(b)} is not below colors={self.colors}")
            if code == loop.F_INDEXED:
                raise self.indexed_fault(int(a), int(b), int(c))
            pes = W[0][loop.GROUP, :a].copy()      # a vector fault: the group's array checks raise it
            rows = s.base[pes] + s.pc[pes]
            (vector_memory if code == loop.F_VMEM else begin_fabric_vector)(self, pes, rows)
            raise AssertionError(f"the compiled loop found a fault (code {code}) that the array checks do not")

    def _loop(self, limit: int) -> int:
        """The cycles of a run in Python, one cycle per iteration (see :meth:`run`); returns the cycle after
        the last one."""
        s, routers, C = self.s, self.routers, self.colors
        due_tx: list = []
        self._next_tx = []
        t = 0
        while True:
            if t >= limit:
                self.cycle = t
                routers.end_run()
                raise FabricHang(f"the fabric did not become idle within {limit} cycles", self._report(), t)
            moving = routers.decide(t % C)
            self.moved = 0
            self._step_pes(t)
            progress = moving or self.moved or due_tx
            woken = routers.finish()
            for pes, data, color in due_tx:
                s.tx_push(pes, data, color, 0)
            due_tx, self._next_tx = self._next_tx, []
            if woken.size:
                w = woken[s.waiting[woken]]
                s.waiting[w] = False
                s.time[w] = t + 1
            t += 1
            if progress or due_tx:
                continue
            live = ~s.waiting
            if live.any():
                t = max(t, int(s.time[live].min()))
                continue
            if routers.count.any() or s.tcount.any() or routers.edge_pending() or s.running.any() \
                    or s.rcount.any():
                self.cycle = t
                routers.end_run()
                raise FabricHang(f"the fabric stopped making progress at cycle {t} before becoming idle",
                                 self._report(), t)
            return t

    def _step_pes(self, t: int) -> None:
        """The PEs' work of cycle ``t``."""
        s = self.s
        due = np.flatnonzero(s.time == t)
        if due.size:
            due = due[~s.waiting[due]]
        if due.size == 0:
            return
        running = s.running[due]
        started = self._select_tasks(due[~running], t)
        busy = due[running]
        vec = busy[s.vactive[busy]]
        indexed = busy[s.xstage[busy] > 0]
        rest = busy[~s.vactive[busy] & (s.xstage[busy] == 0)]
        now = self._run_ahead(np.concatenate([started, rest]) if started.size else rest, t)
        cont, begun = self._fabric(now, t)
        indexed = np.concatenate([indexed, now[s.xstage[now] == 3]])
        if indexed.size:
            self._indexed(indexed, t)
        if begun.size:
            vec = np.concatenate([vec, begun])
        ended = vector_elements(self, vec, t) if vec.size else _EMPTY
        more = np.concatenate([cont, ended])
        if more.size:
            self._run_ahead(more, t)

    def _select_tasks(self, pes: np.ndarray, t: int) -> np.ndarray:
        """Task selection of the idle PEs ``pes`` (spec 4.3); returns the PEs that started a task."""
        if pes.size == 0:
            return pes
        s, C = self.s, self.colors
        T = s.ntasks
        has_data = np.zeros((pes.size, T), dtype=bool)
        has_data[:, :C] = s.rcount[pes] > 0
        data = s.bound[pes] & has_data
        ready = ~s.blocked[pes] & (s.entry[pes] >= 0) & (data | s.activated[pes])
        found = ready.any(axis=1)
        s.waiting[pes[~found]] = True
        pes, ready, data = pes[found], ready[found], data[found]
        if pes.size == 0:
            return pes
        task = ready.argmax(axis=1)
        by_data = data[np.arange(pes.size), task]
        if by_data.any():
            p, c = pes[by_data], task[by_data]
            d, k = s.rx_head(p, c)
            s.rx_pop(p, c)
            self.moved += p.size
            s.regs[p, 1] = d
            s.regs[p, 2] = k
        s.activated[pes[~by_data], task[~by_data]] = False
        s.running[pes], s.task[pes], s.pc[pes] = True, task, s.entry[pes, task]
        s.task_start[pes] = t
        s.counters["tasks"][pes] += 1
        s.time[pes] = t + 1
        return pes

    def _run_ahead(self, pes: np.ndarray, t: int) -> np.ndarray:
        """Run private instructions (scalar, exit, memory vector) of ``pes`` ahead of the clock, below
        the run's cycle limit; returns the PEs at a fabric instruction due in cycle ``t``."""
        s, code = self.s, self.code
        now = []
        while pes.size:
            pes = run_scalars(self, pes)     # the PEs now at a vector, exit or fabric instruction
            rows = s.base[pes] + s.pc[pes]
            kind = code.kind[rows]
            private = np.zeros(pes.size, dtype=bool)
            vec = np.flatnonzero(kind == K_VECTOR)
            if vec.size:
                private[vec] = ~self._touches_fabric(pes[vec], rows[vec])
            if private.any():
                p, r = pes[private], rows[private]
                n = vector_memory(self, p, r)
                s.pc[p] += 1
                s.time[p] += n + code.cycles[r]
            exits = kind == K_EXIT
            if exits.any():
                self._exit(pes[exits])
            fabric = ~private & ~exits
            f = pes[fabric]
            now.append(f[s.time[f] == t])
            pes = pes[private]
        return np.concatenate(now) if now else _EMPTY

    def _indexed(self, pes: np.ndarray, t: int) -> None:
        """Cycle ``t`` of the ``fmacx``/``fdotx`` of ``pes`` (:func:`.vindexed.indexed_cycle`)."""
        s, code, c = self.s, self.code, self.s.counters
        fault = np.zeros(3, dtype=np.int64)
        self.moved += vindexed.indexed_cycle(
            pes, t, self.colors, code.op, code.rd, code.dd, code.da, code.db, code.color, s.base, s.pc, s.rdata,
            s.rctrl, s.rhead, s.rcount, s.mem, s.regs, s.dsd_kind, s.dsd_base, s.dsd_len, s.dsd_stride, s.xstage,
            s.xbusy, s.vi, s.vn, s.instr_start, s.time, s.waiting, c["stall"], c["fmac"], c["flops"], fault)
        if fault[1]:
            raise self.indexed_fault(int(fault[0]), int(fault[1]), int(fault[2]))

    def _touches_fabric(self, pes, rows) -> np.ndarray:
        s, code = self.s, self.code
        out = np.empty(pes.size, dtype=bool)
        veck.touches_fabric(pes, rows, code.dd, code.da, code.db, code.vec_fmt, code.has_db, s.dsd_kind, out)
        return out

    def _exit(self, pes) -> None:
        s = self.s
        s.counters["instructions"][pes] += 1
        s.counters["busy"][pes] += s.time[pes] + 1 - s.task_start[pes]
        s.running[pes], s.task[pes] = False, -1
        s.time[pes] += 1

    def _fabric(self, pes: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Fabric instructions reached in cycle ``t``: send and recv attempts, vector starts.
        Returns ``(PEs that go on, PEs that started a fabric vector instruction)``."""
        if pes.size == 0:
            return _EMPTY, _EMPTY
        s, code, C = self.s, self.code, self.colors
        s.instr_start[pes] = np.where(s.instr_start[pes] < 0, t, s.instr_start[pes])
        rows = s.base[pes] + s.pc[pes]
        kind = code.kind[rows]
        vec = kind == K_VECTOR
        begun = pes[vec]
        if begun.size:
            begin_fabric_vector(self, begun, rows[vec])
        x = kind == K_INDEXED
        if x.any():                 # fmacx, fdotx: their first cycle follows (_step_pes)
            s.counters["instructions"][pes[x]] += 1
            s.xstage[pes[x]], s.xbusy[pes[x]] = 3, 0
        vec |= x
        pes, rows, kind = pes[~vec], rows[~vec], kind[~vec]
        if pes.size == 0:
            return _EMPTY, begun
        color = code.color[rows]
        if (color >= C).any():
            k = int(np.flatnonzero(color >= C)[0])
            raise self.fault(int(pes[k]), f"color {int(color[k])} is not below colors={C}")
        went = np.empty(pes.size, dtype=np.int64)
        k = veck.send_recv(pes, rows, t, kind == K_SEND, _SENDC, code.op, code.ra, code.rd, code.color, code.cycles,
                           s.regs, s.rdata, s.rhead, s.rcount, s.tdata, s.tcolor, s.tctrl, s.thead,
                           s.tcount, s.tx_depth, s.waiting, s.counters["instructions"], s.counters["stall"],
                           s.instr_start, s.pc, s.time, went)
        pes = went[:k]
        self.moved += k
        return pes, begun

    # ------------------------------------------------------------------ reports
    def _report(self) -> list[str]:
        s = self.s
        lines = []
        for pe in np.flatnonzero(s.running).tolist():
            what = "waits" if s.waiting[pe] else "running"
            lines.append(f"PE ({pe % self.width}, {pe // self.width}) task {int(s.task[pe])} "
                         f"pc {int(s.pc[pe])} {what}")
        for pe, c in zip(*np.nonzero(s.rcount * ~s.running[:, None])):
            lines.append(f"PE ({pe % self.width}, {pe // self.width}) has {int(s.rcount[pe, c])} wavelet(s) "
                         f"on color {int(c)} that nothing takes")
        for pe in np.flatnonzero(s.tcount).tolist():
            lines.append(f"PE ({pe % self.width}, {pe // self.width}) output queue holds {int(s.tcount[pe])} "
                         f"wavelet(s)")
        return lines + self.routers.stuck()


