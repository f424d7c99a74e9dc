"""The golden model of one processing element.

A :class:`PE` holds the state of section 4 of ``docs/architecture.md`` and
executes it cycle by cycle under the control of :class:`~wse.sim.golden.fabric.Fabric`.
Instructions that touch only the PE's own state (scalar instructions and
vector instructions over memory) run ahead of the global clock; the PE meets
the clock again at its next fabric access or task selection, which gives the
same cycles as stepping it every cycle.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from wse.firmware import isa
from wse.firmware.asm import format_instruction
from wse.firmware.isa import DsdKind

from wse import numerics as fp
from . import ecc, pe_indexed
from .decode import ELEMENT, FMAC_OPS, K_EXIT, K_INDEXED, K_SCALAR, K_SEND, K_VECTOR, M32, VECTOR, compile_program
from .errors import ProgramFault
from .events import pe_stall_begin, pe_stall_end

__all__ = ["PE", "compile_program"]


class PE:
    """State and execution of the PE at ``(x, y)``.

    The fabric calls :meth:`step` at the cycles the PE asked for (its
    ``time``); the PE records queue pops and pushes in the fabric's lists so
    they apply at the end of the cycle.
    """

    def __init__(self, fabric, x: int, y: int):
        cfg = fabric.config
        self.fabric, self.x, self.y = fabric, x, y
        self.index = y * cfg.width + x
        self.sram_words = cfg.sram_words
        self.rx = [deque() for _ in range(cfg.colors)]
        self.rx_depth = cfg.rx_depth
        self.tx: deque = deque()
        self.tx_depth = cfg.tx_depth
        self.mem = np.zeros(cfg.sram_words, dtype=np.uint32)
        self.code: list = []
        self.code_words = np.zeros(0, dtype=np.uint32)
        self.regs = [0] * cfg.registers
        self.dsd = [[0, 0, 0, 0] for _ in range(cfg.dsd_registers)]
        ntasks = cfg.tasks
        self.entry = [None] * ntasks
        self.bound = [False] * ntasks
        self.blocked = [False] * ntasks
        self.activated = [False] * ntasks
        self.ncolors = cfg.colors
        self.reset_run_state()
        self.counters = dict.fromkeys(("busy", "instructions", "fmac", "flops", "stall", "tasks"), 0)
        self.ecc = {"corrected": 0, "detected": 0}   # memory ECC events (wse.sim.golden.ecc)
        self.ecc_check: dict[int, int] = {}          # stored check bits of the words an injection touched
        self.dead = False                            # killed (Fabric.kill): runs nothing, takes no wavelet
        self.timed_flip = None                       # (cycle, addr, bits): a memory flip armed at a run cycle
        self.trace: list | None = None
        self.rec: list | None = None   # events while a Recorder runs (wse.sim.golden.events)

    def reset_run_state(self) -> None:
        self.running = False
        self.task = None
        self.pc = 0
        self.time = 0            # the cycle of the PE's next step
        self.task_start = 0
        self.vec = None          # state of a vector instruction in progress
        self.xvec = None         # state of an indexed one (fmacx, fdotx: wse.sim.golden.pe_indexed)
        self.wait = None         # ("rx", color) / ("tx",) / ("idle",) while waiting for the fabric
        self.instr_start = None  # cycle the current fabric instruction started (for stalls)
        self.inflight_due = -1   # cycle at whose end a vector element is pushed to tx
        self.stall_at = None     # (cycle, cause) of the stall in progress, while recording
        self.idle_since = 0      # the first cycle of the stretch without a task
        ecc.scrub_reset(self)    # pending scrubs (wse.sim.golden.ecc): none at a run's start

    # Program -------------------------------------------------------------
    def load(self, program, compiled: list) -> None:
        """Load a program image: code, initial data, task table."""
        self.code = compiled
        self.code_words = program.code
        self.mem[:] = 0
        for addr, words in program.data:
            self.mem[addr:addr + len(words)] = words
        n = len(self.entry)
        self.entry = [None] * n
        self.bound = [False] * n
        self.blocked = [False] * n
        self.activated = [False] * n
        for task in program.tasks:
            self.entry[task.id] = task.entry
            self.bound[task.id] = bool(task.data_color)
            self.blocked[task.id] = bool(task.blocked)

    # Helpers used by compiled instructions --------------------------------
    def where(self) -> str:
        task = "no task" if self.task is None else f"task {self.task}"
        return f"PE ({self.x}, {self.y}) {task} pc {self.pc}"

    def fault(self, message: str) -> ProgramFault:
        ins = ""
        if 0 <= self.pc < len(self.code) and self.code[self.pc][3] is not None:
            ins = f" ({self._disasm(self.pc)})"
        return ProgramFault(f"{self.where()}{ins}: {message}")

    def address(self, addr: int) -> int:
        addr &= M32
        if addr >= self.sram_words:
            raise self.fault(f"data address {addr} outside memory 0..{self.sram_words - 1}")
        return addr

    def check_task(self, task: int) -> None:
        if task >= len(self.entry) or self.entry[task] is None:
            raise self.fault(f"task {task} has no entry point in the program")

    def _disasm(self, pc: int) -> str:
        try:
            return format_instruction(int(self.code_words[pc]))
        except ValueError as exc:
            return str(exc)

    # Scheduling ----------------------------------------------------------
    def ready_task(self):
        """The task the scheduler would pick now, or None (start-of-cycle state)."""
        rx, bound, blocked, activated = self.rx, self.bound, self.blocked, self.activated
        for task in range(len(self.entry)):
            if blocked[task] or self.entry[task] is None:
                continue
            if (bound[task] and task < self.ncolors and rx[task]) or activated[task]:
                return task
        return None

    # Execution -----------------------------------------------------------
    def step(self, t: int) -> None:
        """Do the PE's work of cycle ``t`` and run ahead through private
        instructions; leaves the PE scheduled or waiting."""
        if self.dead:
            return
        fab = self.fabric
        self.wait = None
        if not self.running:
            task = self.ready_task()
            if self.timed_flip is not None and t >= self.timed_flip[0]:
                at = max(self.timed_flip[0], self.idle_since)   # never in a cycle that starts a task
                if at < t or task is None:
                    self.land_timed_flip(at)
            if task is None:
                self.wait = ("idle",)
                return
            if type(self.mem) is not np.ndarray:
                ecc.scrub_drain(self, t)       # pending scrubs drain in the cycles without a task
            if self.bound[task] and task < self.ncolors and self.rx[task]:
                data, ctrl = self.rx[task][0]
                fab.rx_pops.append((self, task))
                self.regs[isa.DATA_TASK_DATA_REG] = data
                self.regs[isa.DATA_TASK_CTRL_REG] = ctrl
                if self.trace is not None:
                    self.trace.append(f"{t:8d} recv  color {task} data {data:#010x} ctrl {ctrl} (task entry)")
            else:
                self.activated[task] = False
            self.running, self.task, self.pc = True, task, self.entry[task]
            self.task_start = t
            self.counters["tasks"] += 1
            if self.trace is not None:
                self.trace.append(f"{t:8d} select task {task} at pc {self.pc}")
            self.run(t + 1, t)
        elif self.vec is not None:
            self.vector_element(t)
        elif self.xvec is not None:
            pe_indexed.index_cycle(self, t)
        else:
            self.run(t, t)

    def land_timed_flip(self, at: int | None = None) -> None:
        """Apply the memory flip armed at a run cycle (:meth:`Fabric.inject
        <wse.sim.golden.fabric.Fabric.inject>` with ``cycle``): the PE runs no
        task at or after that cycle, and nothing has read its memory since.
        ``at``: the cycle it lands in (its write takes the port in the next)."""
        _, addr, bits = self.timed_flip
        self.timed_flip = None
        if at is not None and type(self.mem) is not np.ndarray:
            ecc.scrub_drain(self, at)
            self.scrub_skip = at + 1
        ecc.inject(self, addr, bits)

    def run(self, time: int, now: int) -> None:
        """Execute from cycle ``time`` (>= ``now``, the global cycle) until an
        instruction needs the fabric at a cycle after ``now``."""
        code, counters, ncode = self.code, self.counters, len(self.code)
        fab = self.fabric
        limit = fab.cycle_limit
        while True:
            if time >= limit:  # a task that never ends: let the watchdog report it
                fab.schedule(self, time)
                return
            pc = self.pc
            if not 0 <= pc < ncode:
                raise self.fault(f"instruction fetch outside the program (0..{ncode - 1})")
            kind, payload, cycles, ins = code[pc]
            if kind == K_SCALAR:
                counters["instructions"] += 1
                if self.trace is not None:
                    self.trace.append(f"{time:8d} task {self.task} pc {pc:4d} {self._disasm(pc)}")
                npc = payload(self)
                self.pc = pc + 1 if npc is None else npc
                time += cycles
                continue
            if kind is None:
                raise self.fault(payload)
            if kind == K_EXIT:
                counters["instructions"] += 1
                if self.trace is not None:
                    self.trace.append(f"{time:8d} task {self.task} pc {pc:4d} exit")
                counters["busy"] += time + 1 - self.task_start
                if self.rec is not None:
                    self.rec.append(("task", self.task_start, time + 1, self.task))
                self.running, self.task = False, None
                self.idle_since = self.scrub_from = time + 1
                fab.schedule(self, time + 1)
                return
            if kind == K_VECTOR and not self._touches_fabric(payload, ins):
                counters["instructions"] += 1
                if self.trace is not None:
                    self.trace.append(f"{time:8d} task {self.task} pc {pc:4d} {self._disasm(pc)}")
                n = self._vector_memory(payload, ins)
                if self.rec is not None:
                    self.rec.append(("vector", time, time + n + cycles, ins.name))
                self.pc = pc + 1
                time += n + cycles
                continue
            # A fabric instruction: it must happen at the global clock.
            if time > now:
                fab.schedule(self, time)
                return
            if self.instr_start is None:
                self.instr_start = time
            if kind == K_VECTOR:
                self._vector_begin(payload, ins)
                self.vector_element(time)
            elif kind == K_INDEXED:
                pe_indexed.begin(self, payload, ins)
                pe_indexed.index_cycle(self, time)
            elif kind == K_SEND:
                self.send_or_recv_attempt(time)
            else:
                self.send_or_recv_attempt(time)
            return

    # Scalar fabric instructions -------------------------------------------
    def send_or_recv_attempt(self, t: int) -> None:
        kind, f, cycles, ins = self.code[self.pc]
        fab = self.fabric
        color = f["color"]
        if color >= self.ncolors:
            raise self.fault(f"color {color} is not below colors={self.ncolors}")
        if kind == K_SEND:
            if len(self.tx) >= self.tx_depth:
                self.wait = ("tx",)
                if self.rec is not None:
                    pe_stall_begin(self, t, self.wait)
                return
            data = self.regs[f["ra"]]
            fab.tx_pushes.append((self, (data, color, 1 if ins.name == "sendc" else 0)))
            if self.trace is not None:
                self.trace.append(f"{t:8d} send  color {color} data {data:#010x} ctrl {int(ins.name == 'sendc')}")
        else:
            queue = self.rx[color]
            if not queue:
                self.wait = ("rx", color)
                if self.rec is not None:
                    pe_stall_begin(self, t, self.wait)
                return
            data, ctrl = queue[0]
            fab.rx_pops.append((self, color))
            if f["rd"]:
                self.regs[f["rd"]] = data
            if self.trace is not None:
                self.trace.append(f"{t:8d} recv  color {color} data {data:#010x} ctrl {ctrl}")
        self.counters["instructions"] += 1
        self.counters["stall"] += t - self.instr_start
        if self.stall_at is not None:
            pe_stall_end(self, t)
        self.instr_start = None
        self.pc += 1
        self.run(t + cycles, t)

    # Vector instructions ---------------------------------------------------
    def _operands(self, f: dict, ins):
        """(destination dsd or None, [source dsds], scalar register value)."""
        dsd = self.dsd
        if ins.fmt in ("VR", "VR1"):
            dst = None
            srcs = [dsd[f["da"]]] + ([dsd[f["db"]]] if "db" in f else [])
        else:
            dst = dsd[f["dd"]]
            srcs = [dsd[f["da"]]] + ([dsd[f["db"]]] if "db" in f else [])
        scalar = self.regs[f["rs"]] if "rs" in f else 0
        return dst, srcs, scalar

    def _touches_fabric(self, f: dict, ins) -> bool:
        dst, srcs, _ = self._operands(f, ins)
        if dst is not None and dst[0] != DsdKind.MEM:
            return True
        return any(s[0] != DsdKind.MEM for s in srcs)

    def _check_kinds(self, dst, srcs) -> None:
        if dst is not None and dst[0] == DsdKind.FABIN:
            raise self.fault("a fabric-in descriptor cannot be a destination")
        for s in srcs:
            if s[0] == DsdKind.FABOUT:
                raise self.fault("a fabric-out descriptor cannot be a source")
            if s[0] not in (DsdKind.MEM, DsdKind.FABIN, DsdKind.FABOUT):
                raise self.fault(f"descriptor kind {s[0]} is not mem, fabin or fabout")
        fabin = [s[1] for s in srcs if s[0] == DsdKind.FABIN]
        if len(fabin) != len(set(fabin)):
            raise self.fault("two fabric-in sources of the same color")
        for d in ([dst] if dst is not None else []) + list(srcs):
            if d[0] != DsdKind.MEM and d[1] >= self.ncolors:
                raise self.fault(f"fabric descriptor color {d[1]} is not below colors={self.ncolors}")

    def _addresses(self, d, n: int) -> np.ndarray | slice:
        base, stride = d[1], d[3]
        last = base + (n - 1) * stride
        if n and not (0 <= base < self.sram_words and 0 <= last < self.sram_words):
            raise self.fault(f"vector of {n} elements from address {base} stride {stride} "
                             f"leaves memory 0..{self.sram_words - 1}")
        if stride > 0:
            return slice(base, last + 1, stride)
        return base + stride * np.arange(n, dtype=np.int64)

    def _vector_memory(self, f: dict, ins) -> int:
        """Run a memory-only vector instruction at once; returns its length."""
        dst, srcs, scalar = self._operands(f, ins)
        self._check_kinds(dst, srcs)
        name = ins.name
        n = self._length(ins, dst, srcs)
        counters = self.counters
        if name != "fmov":
            counters["flops"] += n
        if name in FMAC_OPS:
            counters["fmac"] += n
        if n == 0:
            return 0
        mem = self.mem
        if name == "fmacw":
            self._fmacw_chunk(dst, srcs, 0, n, None)
            return n
        src_idx = [self._addresses(s, n) for s in srcs]
        checked = type(mem) is not np.ndarray     # ECC: each element's words read together, in order
        if dst is None:
            if checked:
                cols = np.array([mem[np.array([s[1] + i * s[3] for s in srcs])] for i in range(n)], dtype=np.uint32)
                src_idx = list(range(len(srcs)))
                mem = cols.T
            a = mem[src_idx[0]]
            rd = f["rd"]
            if name == "dot":
                acc = fp.seq_dot(self.regs[rd], a, mem[src_idx[1]])
            else:
                acc = fp.seq_sum(self.regs[rd], a)
            if rd:
                self.regs[rd] = acc
            return n
        dst_idx = self._addresses(dst, n)
        if checked or self._needs_sequential(dst, srcs, n):
            element = ELEMENT[name]
            for i in range(n):
                words = mem[np.array([s[1] + i * s[3] for s in srcs])].tolist()
                mem[dst[1] + i * dst[3]] = element(words[0], words[1] if len(words) > 1 else 0, scalar)
            return n
        a = mem[src_idx[0]]
        b = mem[src_idx[1]] if len(src_idx) > 1 else None
        mem[dst_idx] = VECTOR[name](a, b, scalar)
        return n

    @staticmethod
    def _needs_sequential(dst, srcs, n: int) -> bool:
        """True when a later element reads or rewrites what an earlier one
        wrote, so whole-array evaluation could differ from element order."""
        if n <= 1:
            return False
        if dst[3] == 0:
            return True
        lo_d, hi_d = sorted((dst[1], dst[1] + (n - 1) * dst[3]))
        for s in srcs:
            if s[1] == dst[1] and s[3] == dst[3]:
                continue  # element i reads exactly what element i writes
            lo_s, hi_s = sorted((s[1], s[1] + (n - 1) * s[3]))
            if lo_s <= hi_d and lo_d <= hi_s:
                return True
        return False

    def _vector_begin(self, f: dict, ins) -> None:
        dst, srcs, scalar = self._operands(f, ins)
        self._check_kinds(dst, srcs)
        n = self._length(ins, dst, srcs)
        if ins.name == "fmacw":
            self._fmacw_check(dst, srcs, n)
        else:
            if dst is not None and dst[0] == DsdKind.MEM and n:
                self._addresses(dst, n)
            for s in srcs:
                if s[0] == DsdKind.MEM and n:
                    self._addresses(s, n)
        acc = self.regs[f["rd"]] if dst is None else 0
        self.vec = [ins, f, dst, srcs, scalar, n, 0, acc]
        self.counters["instructions"] += 1
        if ins.name != "fmov":
            self.counters["flops"] += n
        if ins.name in FMAC_OPS:
            self.counters["fmac"] += n

    @staticmethod
    def _length(ins, dst, srcs) -> int:
        """Elements of a vector instruction (spec 4.5)."""
        if ins.name == "fmacw":
            return max(dst[2], srcs[0][2]) if min(dst[2], srcs[0][2]) else 0
        return (srcs[0] if dst is None else dst)[2]

    def _fmacw_check(self, dst, srcs, n: int) -> None:
        da, db = srcs
        if dst[0] != DsdKind.MEM or da[0] != DsdKind.MEM:
            raise self.fault("fmacw needs memory descriptors for dd and da")
        if n:
            self._addresses(dst, min(n, dst[2]))
            self._addresses(da, min(n, da[2]))
            if db[0] == DsdKind.MEM:
                self._addresses(db, -(-n // min(dst[2], da[2])))

    def _fmacw_chunk(self, dst, srcs, start: int, stop: int, weight) -> None:
        """Elements ``start .. stop-1`` of ``fmacw``; ``weight`` is the fabric
        weight of this chunk (None: weights come from memory)."""
        da, db = srcs
        ld, la = dst[2], da[2]
        period = min(ld, la)
        if start == 0 and weight is None:
            self._fmacw_check(dst, srcs, stop)
        mem = self.mem
        if type(mem) is not np.ndarray:      # ECC: element order, words read as the RTL's ports do
            from_memory = weight is None
            for i in range(start, stop):
                d, a = dst[1] + (i % ld) * dst[3], da[1] + (i % la) * da[3]
                first = from_memory and i % period == 0
                words = mem[np.array([a, d, db[1] + i // period * db[3]] if first else [a, d])].tolist()
                weight = words[2] if first else weight
                mem[d] = fp.add(words[1], fp.mul(words[0], weight))
            return
        i = start
        while i < stop:
            k = i // period
            m = min(period - i % period, stop - i)
            w = weight if weight is not None else int(mem[db[1] + k * db[3]])
            di = dst[1] + ((i + np.arange(m)) % ld) * dst[3]
            ai = da[1] + ((i + np.arange(m)) % la) * da[3]
            if m > 1 and (len(np.unique(di)) < m or np.intersect1d(di, ai).size):
                # A later element of the chunk reads or rewrites what an earlier
                # one wrote: evaluate in element order (spec 4.5).
                for d, a in zip(di.tolist(), ai.tolist()):
                    mem[d] = fp.add(int(mem[d]), fp.mul(int(mem[a]), w))
            else:
                mem[di] = fp.vadd(mem[di], fp.vmul(mem[ai], np.uint32(w)))
            i += m

    def vector_element(self, t: int) -> None:
        """Try to issue the next element of the vector instruction in cycle ``t``."""
        ins, f, dst, srcs, scalar, n, i, acc = self.vec
        fab = self.fabric
        if i == n:  # no elements at all: a one-cycle instruction
            self._vector_end(t, t)
            return
        if ins.name == "fmacw":
            # Only the first element of each weight's chunk needs the fabric;
            # the rest of the chunk issues in the following cycles.
            color = srcs[1][1]
            if not self.rx[color]:
                self.wait = ("rx", color)
                if self.rec is not None:
                    pe_stall_begin(self, t, self.wait)
                return
            if self.stall_at is not None:
                pe_stall_end(self, t)
            weight = self.rx[color][0][0]
            fab.rx_pops.append((self, color))
            if self.trace is not None:
                self.trace.append(f"{t:8d} recv  color {color} data {weight:#010x}")
            period = min(dst[2], srcs[0][2])
            m = min(period - i % period, n - i)
            self._fmacw_chunk(dst, srcs, i, i + m, weight)
            i += m
            self.vec[6] = i
            if i == n:
                self._vector_end(t + m, t)
            else:
                fab.schedule(self, t + m)
            return
        # Issue conditions (start-of-cycle state).
        for s in srcs:
            if s[0] == DsdKind.FABIN and not self.rx[s[1]]:
                self.wait = ("rx", s[1])
                if self.rec is not None:
                    pe_stall_begin(self, t, self.wait)
                return
        to_fabric = dst is not None and dst[0] == DsdKind.FABOUT
        if to_fabric:
            inflight = 1 if self.inflight_due == t else 0
            if len(self.tx) + inflight >= self.tx_depth:
                self.wait = ("tx",)
                if self.rec is not None:
                    pe_stall_begin(self, t, self.wait)
                return
        if self.stall_at is not None:
            pe_stall_end(self, t)
        values = []
        words = None
        if type(self.mem) is not np.ndarray:    # ECC: the element's memory words read together
            addrs = [s[1] + i * s[3] for s in srcs if s[0] != DsdKind.FABIN]
            words = iter(self.mem[np.array(addrs, dtype=np.int64)].tolist())
        for s in srcs:
            if s[0] == DsdKind.FABIN:
                values.append(self.rx[s[1]][0][0])
                fab.rx_pops.append((self, s[1]))
                if self.trace is not None:
                    self.trace.append(f"{t:8d} recv  color {s[1]} data {values[-1]:#010x}")
            else:
                values.append(next(words) if words is not None else int(self.mem[s[1] + i * s[3]]))
        name = ins.name
        if dst is None:
            product = fp.mul(values[0], values[1]) if name == "dot" else values[0]
            acc = fp.add(acc, product)
            self.vec[7] = acc
        else:
            result = ELEMENT[name](values[0], values[1] if len(values) > 1 else 0, scalar)
            if to_fabric:
                fab.tx_pushes_next.append((self, (result, dst[1], 0)))
                self.inflight_due = t + 1
                if self.trace is not None:
                    self.trace.append(f"{t + 1:8d} send  color {dst[1]} data {result:#010x} ctrl 0")
            else:
                self.mem[dst[1] + i * dst[3]] = result
        i += 1
        self.vec[6] = i
        if i == n:
            self._vector_end(t + 1, t)
        else:
            fab.schedule(self, t + 1)

    def _vector_end(self, last_write: int, now: int) -> None:
        """The last element writes in cycle ``last_write`` (the cycle before the
        instruction's last for an empty vector); continue after it."""
        if self.xvec is not None:  # one index of fmacx: its next index cycle
            pe_indexed.chunk_done(self, last_write)
            return
        ins, f, dst, srcs, scalar, n, i, acc = self.vec
        self.vec = None
        if dst is None and f["rd"]:
            self.regs[f["rd"]] = acc
        self.retire_vector(ins, last_write + 1, n + ins.cycles, now)

    def retire_vector(self, ins, end: int, busy: int, now: int) -> None:
        """A vector instruction ends in cycle ``end``: its trace line, its stall cycles (those
        beyond ``busy``), its timeline record; then the next instruction."""
        if self.trace is not None:
            self.trace.append(f"{self.instr_start:8d} task {self.task} pc {self.pc:4d} {self._disasm(self.pc)}")
        self.counters["stall"] += end - self.instr_start - busy
        if self.rec is not None:
            self.rec.append(("vector", self.instr_start, end, ins.name))
        self.instr_start = None
        self.pc += 1
        self.run(end, now)
