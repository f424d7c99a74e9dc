"""The state of every PE of the vectorized model, as arrays indexed by PE (row-major).

Queues are ring buffers: the input queues ``rdata[pe, color, slot]`` with
``rhead``/``rcount`` per ``(pe, color)``, the output queue ``tdata``,
``tcolor``, ``tctrl`` ``[pe, slot]`` with ``thead``/``tcount``. The rest
mirrors the golden PE (:class:`wse.sim.golden.pe.PE`): registers
``regs[pe, r]``, descriptors ``dsd_kind/base/len/stride[pe, d]``, the task
table ``entry/bound/blocked/activated[pe, task]``, data memory ``mem[pe,
word]``, the scheduling state (``running``, ``task``, ``pc``, ``time``: the
cycle of the PE's next action) and the state of a vector instruction in
progress (``v*`` columns), and the counters of section 8.4.
"""

from __future__ import annotations

import numpy as np

from wse.config import FabricConfig

__all__ = ["PeState", "COUNTERS"]

#: Per-PE counter names, in the golden model's order.
COUNTERS = ("busy", "instructions", "fmac", "flops", "stall", "tasks")


class PeState:
    """Every PE's state (see the module text)."""

    def __init__(self, cfg: FabricConfig):
        n, C = cfg.width * cfg.height, cfg.colors
        i64 = np.int64
        self.n, self.colors, self.width = n, C, cfg.width
        self.sram_words, self.ntasks = cfg.sram_words, cfg.tasks
        self.rx_depth, self.tx_depth = cfg.rx_depth, cfg.tx_depth
        self.rdata = np.zeros((n, C, cfg.rx_depth + 1), dtype=np.uint32)
        self.rctrl = np.zeros((n, C, cfg.rx_depth + 1), dtype=np.uint8)
        self.rhead = np.zeros((n, C), dtype=i64)
        self.rcount = np.zeros((n, C), dtype=i64)
        slots = cfg.tx_depth + 2
        self.tdata = np.zeros((n, slots), dtype=np.uint32)
        self.tcolor = np.zeros((n, slots), dtype=i64)
        self.tctrl = np.zeros((n, slots), dtype=np.uint8)
        self.thead = np.zeros(n, dtype=i64)
        self.tcount = np.zeros(n, dtype=i64)
        self.mem = np.zeros((n, cfg.sram_words), dtype=np.uint32)
        self.regs = np.zeros((n, cfg.registers), dtype=np.uint32)
        d = cfg.dsd_registers
        self.dsd_kind, self.dsd_base = np.zeros((n, d), dtype=i64), np.zeros((n, d), dtype=i64)
        self.dsd_len, self.dsd_stride = np.zeros((n, d), dtype=i64), np.zeros((n, d), dtype=i64)
        T = cfg.tasks
        self.entry = np.full((n, T), -1, dtype=i64)
        self.bound = np.zeros((n, T), dtype=bool)
        self.blocked = np.zeros((n, T), dtype=bool)
        self.activated = np.zeros((n, T), dtype=bool)
        self.base = np.zeros(n, dtype=i64)      # the PE's program in the code table
        self.ncode = np.zeros(n, dtype=i64)
        self.program: list = [None] * n
        self.counters = {k: np.zeros(n, dtype=i64) for k in COUNTERS}
        self.reset_run_state()

    def reset_run_state(self) -> None:
        """What a run starts from: no task running, every PE due at cycle 0."""
        n, i64 = self.n, np.int64
        self.running = np.zeros(n, dtype=bool)
        self.task = np.full(n, -1, dtype=i64)
        self.pc = np.zeros(n, dtype=i64)
        self.time = np.zeros(n, dtype=i64)
        self.waiting = np.zeros(n, dtype=bool)
        self.task_start = np.zeros(n, dtype=i64)
        self.instr_start = np.full(n, -1, dtype=i64)
        self.inflight_due = np.full(n, -1, dtype=i64)
        # The vector instruction in progress: row, element index, length, accumulator.
        self.vactive = np.zeros(n, dtype=bool)
        self.vrow = np.zeros(n, dtype=i64)
        self.vi = np.zeros(n, dtype=i64)
        self.vn = np.zeros(n, dtype=i64)
        self.vacc = np.zeros(n, dtype=np.uint32)
        self.vscalar = np.zeros(n, dtype=np.uint32)
        # Descriptors of the instruction in progress: [pe, slot] with slots dst, a, b.
        self.vkind = np.zeros((n, 3), dtype=i64)
        self.vbase = np.zeros((n, 3), dtype=i64)
        self.vlen = np.zeros((n, 3), dtype=i64)
        self.vstride = np.zeros((n, 3), dtype=i64)
        # fmacx, fdotx in progress (wse.sim.vector.vindexed): stage, cycles without waiting.
        self.xstage = np.zeros(n, dtype=i64)
        self.xbusy = np.zeros(n, dtype=i64)

    # ------------------------------------------------------------------ queues
    def rx_push(self, pe, color, data, ctrl) -> None:
        """Append wavelets to input queues (no two to the same queue)."""
        slot = (self.rhead[pe, color] + self.rcount[pe, color]) % self.rdata.shape[2]
        self.rdata[pe, color, slot] = data
        self.rctrl[pe, color, slot] = ctrl
        self.rcount[pe, color] += 1

    def rx_head(self, pe, color):
        """``(data, ctrl)`` at the head of the input queues ``(pe, color)``."""
        h = self.rhead[pe, color]
        return self.rdata[pe, color, h], self.rctrl[pe, color, h]

    def rx_pop(self, pe, color) -> None:
        """Drop the heads of the input queues ``(pe, color)``."""
        self.rhead[pe, color] = (self.rhead[pe, color] + 1) % self.rdata.shape[2]
        self.rcount[pe, color] -= 1

    def tx_push(self, pe, data, color, ctrl) -> None:
        """Append one wavelet to each output queue of ``pe`` (distinct PEs)."""
        slot = (self.thead[pe] + self.tcount[pe]) % self.tdata.shape[1]
        self.tdata[pe, slot] = data
        self.tcolor[pe, slot] = color
        self.tctrl[pe, slot] = ctrl
        self.tcount[pe] += 1

    def tx_pop(self, pe):
        """Take the output-queue heads of ``pe``: ``(data, color, ctrl)``."""
        h = self.thead[pe]
        out = self.tdata[pe, h], self.tcolor[pe, h], self.tctrl[pe, h]
        self.thead[pe] = (h + 1) % self.tdata.shape[1]
        self.tcount[pe] -= 1
        return out
