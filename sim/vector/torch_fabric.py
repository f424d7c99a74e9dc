"""The vectorized fabric model with its whole cycle on torch tensors, on the CPU or a CUDA device.

:class:`TorchFabric` is :class:`~wse.sim.vector.fabric.VectorFabric` (the same host
API, state layout and results, bit for bit and cycle for cycle) whose run steps every
router and PE with torch operations: for the run, the state of
:class:`~wse.sim.vector.state.PeState`, the code table and the routers are copied to
tensors on ``device`` (bit patterns as ``int32``), and each cycle is the sequence of the
array stepper (``VectorFabric(config, stepper="arrays")``), each step one of the torch
parts proven equal to its numba form:

1. the routers' decisions from the start-of-cycle state
   (:meth:`~wse.sim.vector.torch_routers.TorchRouters.decide`);
2. the PEs due this cycle, as index tensors: task selection
   (:mod:`~wse.sim.vector.torch_tasks`), scalar instructions run ahead of the clock
   (:mod:`~wse.sim.vector.torch_scalar`), memory vector instructions whole
   (:mod:`~wse.sim.vector.torch_decode`, :mod:`~wse.sim.vector.torch_vector`),
   ``exit``, ``send``/``recv`` attempts (:mod:`~wse.sim.vector.torch_queues`), the
   start of fabric vector instructions and one element (or ``fmacw`` chunk) of each;
3. the end of the cycle (:meth:`~wse.sim.vector.torch_routers.TorchRouters.finish`),
   the vector results due pushed to the output queues, waiting PEs woken.

Python runs per cycle (a fixed set of tensor operations, a few values read back to
decide what comes next), never per PE. When nothing moved, the clock jumps as in the
other steppers. When the run stops the state is copied back to the numpy arrays, so
the host API (memory copies, counters, edge streams) works on them as for
``VectorFabric``. A fault is found before it changes the faulting PE's state: the
state is copied back and the numpy form of the failing step raises the golden
model's message. See ``docs/vector.md`` ("On torch"). The indexed instructions
``fmacx``/``fdotx`` run the numba kernel of the other steppers
(:func:`~wse.sim.vector.vindexed.indexed_cycle`) on the PEs that run one: on the CPU on
the tensors' own memory, on a CUDA device on host copies of the arrays it changes.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from wse.config import FabricConfig
from wse.firmware.isa import BY_NAME
from wse.sim.golden.errors import FabricHang

from . import torch_decode as td
from . import vindexed
from . import torch_vector as tv
from .code import K_EXIT, K_INDEXED, K_SEND, K_VECTOR
from .fabric import VectorFabric
from .scalar import SOP_OF, scalar_fault
from .state import COUNTERS
from .torch_queues import send_recv
from .torch_routers import TorchRouters
from .torch_scalar import scalar_kernel
from .torch_tasks import select_tasks
from .vector import begin_fabric_vector, vector_memory

__all__ = ["TorchFabric"]

_SENDC = BY_NAME["sendc"].opcode
_FMACW = BY_NAME["fmacw"].opcode
#: PE state copied to tensors for a run (the queues travel with the routers).
_PE_FIELDS = ("mem", "regs", "dsd_kind", "dsd_base", "dsd_len", "dsd_stride", "entry", "bound", "blocked",
              "activated", "base", "ncode", "running", "task", "pc", "time", "waiting", "task_start", "instr_start",
              "inflight_due", "vactive", "vrow", "vi", "vn", "vacc", "vscalar", "vkind", "vbase", "vlen", "vstride",
              "xstage", "xbusy")
_QUEUES = ("rdata", "rctrl", "rhead", "rcount", "tdata", "tcolor", "tctrl", "thead", "tcount")
_CODE = ("kind", "op", "rd", "ra", "rb", "imm", "rs", "target", "task", "dd", "da", "db", "cycles", "vop",
         "vec_fmt", "has_db", "has_rs", "color")


def _to(array: np.ndarray, device: str) -> torch.Tensor:
    array = np.ascontiguousarray(array)
    if array.dtype == np.uint32:
        array = array.view(np.int32)
    return torch.from_numpy(array.copy()).to(device)


def _back(tensor: torch.Tensor, out: np.ndarray) -> None:
    value = tensor.cpu().numpy()
    out[...] = value.view(np.uint32) if out.dtype == np.uint32 and value.dtype == np.int32 else value


class _State(SimpleNamespace):
    """The PE state on the device; the queue tensors are the routers' (which replace them each cycle)."""

    def __getattr__(self, name):
        if name in _QUEUES:
            return getattr(self.routers, name)
        raise AttributeError(name)


class TorchFabric(VectorFabric):
    """A ``config.width x config.height`` mesh whose runs step on torch tensors (see the module text).

    Parameters
    ----------
    config:
        Sizes of the fabric; default :meth:`FabricConfig.current`.
    device:
        The torch device of a run's tensors: ``"cpu"`` or ``"cuda"`` (``"cuda:N"``).
    """

    backend = "vector-torch"

    def __init__(self, config: FabricConfig | None = None, device: str = "cpu"):
        super().__init__(config, stepper="arrays")
        self.stepper = "torch"
        self.device = str(device)
        self.T: _State | None = None

    # ------------------------------------------------------------------ boundary
    def _to_device(self) -> None:
        """Copy the state, the code table and the routers (with the run's edge streams) to tensors."""
        s, dev = self.s, self.device
        routers = TorchRouters(self.routers, dev)
        routers.rcount, routers.tcount = routers.rcount.long(), routers.tcount.long()
        T = _State(routers=routers, **{name: _to(getattr(s, name), dev) for name in _PE_FIELDS})
        T.counters = {k: _to(s.counters[k], dev) for k in COUNTERS}
        code = {name: _to(getattr(self.code, name), dev) for name in _CODE}
        code["sop"] = _to(SOP_OF, dev)
        self.K = SimpleNamespace(**code)
        self.T = T
        self._empty = torch.zeros(0, dtype=torch.int64, device=dev)

    def _to_host(self) -> None:
        """Copy the run's state back to the numpy arrays (and the routers' FIFOs, hops, streams, edge outputs)."""
        T, s, r = self.T, self.s, self.routers
        if T is None:
            return
        self.T = None
        for name in _PE_FIELDS:
            _back(getattr(T, name), getattr(s, name))
        for k in COUNTERS:
            _back(T.counters[k], s.counters[k])
        tr = T.routers
        for name in _QUEUES:
            _back(getattr(tr, name), getattr(s, name))
        for name in ("data", "ctrl", "head", "count"):
            _back(getattr(tr, name), getattr(r, name))
        r.hops += int(tr.hops.item())
        if r.stream_left.size:
            _back(tr.stream_pos, r.stream_pos)
            _back(tr.stream_left, r.stream_left)
        for key, wavelets in tr.edge_outputs().items():
            r.edge_out.setdefault(key, []).extend(wavelets)

    # ------------------------------------------------------------------ simulation
    def run(self, max_cycles: int | None = None) -> int:
        """Run until the fabric is idle; returns the cycles this run took (as :meth:`VectorFabric.run`).

        Raises :class:`FabricHang` if nothing can move before the fabric is
        idle, or after ``max_cycles`` cycles (default 50 million)."""
        limit = 50_000_000 if max_cycles is None else int(max_cycles)
        self.cycle_limit = limit
        self.s.reset_run_state()
        self.routers.begin_run()
        try:
            self._to_device()
            try:
                t = self._loop_torch(limit)
            finally:
                self._to_host()
        finally:
            self.routers.end_run()
        t = max(t - 1, 0)
        self.cycle = t
        self.total_cycles += t
        return t

    def _hang(self, t: int, what: str) -> FabricHang:
        self.cycle = t
        self._to_host()
        self.routers.end_run()
        return FabricHang(f"the fabric {what}", self._report(), t)

    def _loop_torch(self, limit: int) -> int:
        """The cycles of a run on tensors, one cycle per iteration; returns the cycle after the last one."""
        T, C = self.T, self.colors
        tr = T.routers
        due_tx: list = []
        self._next_tx = []
        t = 0
        while True:
            if t >= limit:
                raise self._hang(t, f"did not become idle within {limit} cycles")
            moving = tr.decide(t % C)
            self.moved = 0
            self._step_pes(t)
            woken = tr.finish()
            for pes, data, color in due_tx:
                self._tx_push(pes, data, color)
            progress = bool(moving) or self.moved or due_tx
            due_tx, self._next_tx = self._next_tx, []
            w = woken & T.waiting
            T.time = torch.where(w, t + 1, T.time)
            T.waiting &= ~w
            t += 1
            if progress or due_tx:
                continue
            live = ~T.waiting
            if bool(live.any()):
                t = max(t, int(T.time[live].min()))
                continue
            if bool(tr.count.any() | T.tcount.any() | T.running.any() | T.rcount.any()) or \
                    bool((tr.stream_left > 0).any()):
                raise self._hang(t, f"stopped making progress at cycle {t} before becoming idle")
            return t

    def _tx_push(self, pes, data, color) -> None:
        T = self.T
        slot = (T.thead[pes] + T.tcount[pes]) % T.tdata.shape[1]
        T.tdata[pes, slot] = data.to(T.tdata.dtype)
        T.tcolor[pes, slot] = color.to(T.tcolor.dtype)
        T.tctrl[pes, slot] = 0
        T.tcount[pes] = T.tcount[pes] + 1

    def _step_pes(self, t: int) -> None:
        """The PEs' work of cycle ``t`` (as ``VectorFabric._step_pes``)."""
        T = self.T
        due = torch.nonzero((T.time == t) & ~T.waiting).flatten()
        if due.numel() == 0:
            return
        running = T.running[due]
        started, moved = select_tasks(T, due[~running], t, self.colors)
        self.moved += moved
        busy = due[running]
        active = T.vactive[busy]
        indexed = busy[T.xstage[busy] > 0]
        vec, rest = busy[active], busy[~active & (T.xstage[busy] == 0)]
        now = self._run_ahead(torch.cat([started, rest]), t)
        cont, begun = self._fabric(now, t)
        indexed = torch.cat([indexed, now[T.xstage[now] == 3]])
        if indexed.numel():
            self._indexed(indexed, t)
        if begun.numel():
            vec = torch.cat([vec, begun])
        ended = self._vector_elements(vec, t) if vec.numel() else self._empty
        more = torch.cat([cont, ended])
        if more.numel():
            self._run_ahead(more, t)

    def _run_ahead(self, pes: torch.Tensor, t: int) -> torch.Tensor:
        """Private instructions of ``pes`` ahead of the clock; returns the PEs at a fabric instruction due at ``t``."""
        T, K = self.T, self.K
        now = []
        while pes.numel():
            group = pes
            j, kind, value, pes = scalar_kernel(
                group, self.cycle_limit, T.base, T.ncode, K.kind, K.sop, K.op, K.rd, K.ra, K.rb, K.imm, K.rs,
                K.target, K.task, K.dd, K.cycles, T.regs, T.mem, T.dsd_kind, T.dsd_base, T.dsd_len, T.dsd_stride,
                T.activated, T.blocked, T.entry, T.pc, T.time, T.counters["instructions"])
            if j >= 0:
                pe = int(group[j])
                self._to_host()
                raise scalar_fault(self, pe, kind, value)
            rows = T.base[pes] + T.pc[pes]
            kinds = K.kind[rows]
            private = torch.zeros(pes.shape[0], dtype=torch.bool, device=pes.device)
            vec = kinds == K_VECTOR
            if bool(vec.any()):
                private[vec] = ~td.touches_fabric(pes[vec], rows[vec], K.dd, K.da, K.db, K.vec_fmt, K.has_db,
                                                  T.dsd_kind)
            if bool(private.any()):
                p, r = pes[private], rows[private]
                n = self._vector_memory(p, r)
                T.pc[p] = T.pc[p] + 1
                T.time[p] = T.time[p] + n + K.cycles[r]
            exits = kinds == K_EXIT
            if bool(exits.any()):
                self._exit(pes[exits])
            f = pes[~private & ~exits]
            now.append(f[T.time[f] == t])
            pes = pes[private]
        return torch.cat(now) if now else self._empty

    def _vector_memory(self, pes: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Memory-only vector instructions run whole (``vector.vector_memory``); returns the element counts."""
        T, K = self.T, self.K
        kind, base, ln, stride, scalar, n = td.decode_operands(
            pes, rows, K.vop, K.dd, K.da, K.db, K.vec_fmt, K.has_db, K.has_rs, K.rs, T.dsd_kind, T.dsd_base,
            T.dsd_len, T.dsd_stride, T.regs)
        vop = K.vop[rows]
        if td.any_fault(vop, kind, base, ln, stride, n, self.colors, self.s.sram_words, False):
            self._to_host()                  # the array checks raise the golden model's message
            vector_memory(self, pes.cpu().numpy(), rows.cpu().numpy())
            raise AssertionError("the torch checks found a fault that the array checks do not")
        c = T.counters
        td.count(pes, vop, n, c["instructions"], c["flops"], c["fmac"])
        fm = vop == 11
        if bool(fm.any()):
            tv.memory_fmacw(pes[fm], base[fm], ln[fm], stride[fm], n[fm], T.mem)
            keep = ~fm
            pes, rows, vop, kind, base, stride, scalar, count = (a[keep] for a in (pes, rows, vop, kind, base,
                                                                                  stride, scalar, n))
        else:
            count = n
        if pes.numel():
            tv.memory_elements(pes, vop, kind, base, stride, count, scalar, K.rd[rows], T.mem, T.regs)
        return n

    def _exit(self, pes: torch.Tensor) -> None:
        T = self.T
        c = T.counters
        c["instructions"][pes] = c["instructions"][pes] + 1
        c["busy"][pes] = c["busy"][pes] + T.time[pes] + 1 - T.task_start[pes]
        T.running[pes] = False
        T.task[pes] = -1
        T.time[pes] = T.time[pes] + 1

    def _fabric(self, pes: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fabric instructions reached in cycle ``t`` (``VectorFabric._fabric``): ``(went on, began a vector)``."""
        empty = self._empty
        if pes.numel() == 0:
            return empty, empty
        T, K, C = self.T, self.K, self.colors
        start = T.instr_start[pes]
        T.instr_start[pes] = torch.where(start < 0, t, start)
        rows = T.base[pes] + T.pc[pes]
        kind = K.kind[rows]
        vec = kind == K_VECTOR
        begun = pes[vec]
        if begun.numel():
            self._begin_vector(begun, rows[vec])
        x = kind == K_INDEXED
        if bool(x.any()):           # fmacx, fdotx: their first cycle follows (_step_pes)
            c = T.counters["instructions"]
            c[pes[x]] = c[pes[x]] + 1
            T.xstage[pes[x]], T.xbusy[pes[x]] = 3, 0
        keep = ~vec & ~x
        pes, rows, kind = pes[keep], rows[keep], kind[keep]
        if pes.numel() == 0:
            return empty, begun
        color = K.color[rows]
        bad = torch.nonzero(color >= C).flatten()
        if bad.numel():
            k = int(bad[0])
            pe, c = int(pes[k]), int(color[k])
            self._to_host()
            raise self.fault(pe, f"color {c} is not below colors={C}")
        went = send_recv(pes, rows, t, kind == K_SEND, _SENDC, K.op, K.ra, K.rd, K.color, K.cycles, T.regs, T.rdata,
                         T.rhead, T.rcount, T.tdata, T.tcolor, T.tctrl, T.thead, T.tcount, self.s.tx_depth,
                         T.waiting, T.counters["instructions"], T.counters["stall"], T.instr_start, T.pc, T.time)
        self.moved += int(went.numel())
        return went, begun

    def _indexed(self, pes: torch.Tensor, t: int) -> None:
        """Cycle ``t`` of the ``fmacx``/``fdotx`` of ``pes`` (:func:`.vindexed.indexed_cycle` on the arrays).
        On the CPU the arrays share the tensors' memory; on another device only the rows of ``pes`` are
        copied to the host and back."""
        T, K, c = self.T, self.K, self.T.counters
        names = ("rdata", "rctrl", "rhead", "rcount", "mem", "regs", "dsd_base", "xstage", "xbusy", "vi", "vn",
                 "instr_start", "time", "waiting", "pc")
        tensors = [getattr(T, n) for n in names] + [c["stall"], c["fmac"], c["flops"]]
        fixed = [T.base, T.dsd_kind, T.dsd_len, T.dsd_stride]
        host = T.mem.device.type == "cpu"
        if host:
            arrays = [x.numpy() for x in tensors]
            fixed = [x.numpy() for x in fixed]
            ids = pes.numpy()
        else:                                                # the rows of pes, renumbered 0 .. len(pes) - 1
            arrays = [x[pes].cpu().numpy() for x in tensors]
            fixed = [x[pes].cpu().numpy() for x in fixed]
            ids = np.arange(pes.numel(), dtype=np.int64)
        for i in (0, 4, 5):                                  # bit patterns: int32 tensors, uint32 arrays
            arrays[i] = arrays[i].view(np.uint32)
        rdata, rctrl, rhead, rcount, mem, regs, dsd_base, xstage, xbusy, vi, vn, start, time, waiting, pc, \
            stall, fmac, flops = arrays
        code = [x.cpu().numpy() for x in (K.op, K.rd, K.dd, K.da, K.db, K.color)]
        fault = np.zeros(3, dtype=np.int64)
        self.moved += vindexed.indexed_cycle(
            ids, t, self.colors, *code, fixed[0], pc, rdata, rctrl, rhead, rcount, mem, regs, fixed[1],
            dsd_base, fixed[2], fixed[3], xstage, xbusy, vi, vn, start, time, waiting, stall, fmac, flops, fault)
        if not host:
            for x, a in zip(tensors, arrays):
                x[pes] = torch.from_numpy(a.view(np.int32) if a.dtype == np.uint32 else a).to(x.device)
        if fault[1]:
            pe = int(fault[0]) if host else int(pes[int(fault[0])])
            self._to_host()
            raise self.indexed_fault(pe, int(fault[1]), int(fault[2]))

    def _begin_vector(self, pes: torch.Tensor, rows: torch.Tensor) -> None:
        """Start fabric vector instructions (``vector.begin_fabric_vector``)."""
        T, K = self.T, self.K
        kind, base, ln, stride, scalar, n = td.decode_operands(
            pes, rows, K.vop, K.dd, K.da, K.db, K.vec_fmt, K.has_db, K.has_rs, K.rs, T.dsd_kind, T.dsd_base,
            T.dsd_len, T.dsd_stride, T.regs)
        vop = K.vop[rows]
        if td.any_fault(vop, kind, base, ln, stride, n, self.colors, self.s.sram_words, True):
            self._to_host()
            begin_fabric_vector(self, pes.cpu().numpy(), rows.cpu().numpy())
            raise AssertionError("the torch checks found a fault that the array checks do not")
        c = T.counters
        td.count(pes, vop, n, c["instructions"], c["flops"], c["fmac"])
        td.begin(pes, rows, kind, base, ln, stride, scalar, n, K.rd, T.regs, T.vacc, T.vactive, T.vrow, T.vi, T.vn,
                 T.vscalar, T.vkind, T.vbase, T.vlen, T.vstride)

    def _vector_elements(self, pes: torch.Tensor, t: int) -> torch.Tensor:
        """The next element of each PE's fabric vector instruction (``vector.vector_elements``); returns the
        PEs whose instruction ended."""
        T, K = self.T, self.K
        stall = T.counters["stall"]
        ended = []
        empty = T.vn[pes] == 0
        if bool(empty.any()):
            ended.append(self._end(pes[empty], t + 1))
            pes = pes[~empty]
        fm = K.op[T.vrow[pes]] == _FMACW
        if bool(fm.any()):
            done, moved = tv.fabric_fmacw(pes[fm], t, T.rdata, T.rhead, T.rcount, T.mem, T.vbase, T.vstride,
                                          T.vlen, T.vi, T.vn, T.vrow, T.vkind, T.vacc, K.rd, K.cycles, T.regs,
                                          stall, T.instr_start, T.pc, T.vactive, T.time, T.waiting)
            self.moved += int(moved)
            ended.append(done)
        pes = pes[~fm]
        if pes.numel():
            done, (out_pe, out_data, out_color), moved = tv.fabric_elements(
                pes, t, K.vop, T.rdata, T.rhead, T.rcount, T.tcount, self.s.tx_depth, T.inflight_due, T.mem,
                T.vbase, T.vstride, T.vi, T.vn, T.vrow, T.vkind, T.vacc, T.vscalar, K.rd, K.cycles, T.regs, stall,
                T.instr_start, T.pc, T.vactive, T.time, T.waiting)
            self.moved += int(moved)
            if out_pe.numel():
                self._next_tx.append((out_pe, out_data, out_color))
            ended.append(done)
        return torch.cat(ended) if ended else self._empty

    def _end(self, pes: torch.Tensor, end: int) -> torch.Tensor:
        """Finish the vector instructions of ``pes``; the next instruction runs at cycle ``end``."""
        T, K = self.T, self.K
        rows = T.vrow[pes]
        rd = K.rd[rows]
        reg = (T.vkind[pes, 0] < 0) & (rd != 0)
        T.regs[pes[reg], rd[reg]] = T.vacc[pes[reg]]
        stall = T.counters["stall"]
        stall[pes] = stall[pes] + end - T.instr_start[pes] - (T.vn[pes] + K.cycles[rows])
        T.instr_start[pes] = -1
        T.pc[pes] = T.pc[pes] + 1
        T.vactive[pes] = False
        T.time[pes] = end
        return pes
