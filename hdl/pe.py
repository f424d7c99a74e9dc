"""The processing element (PE) in RTL.

:class:`PE` implements section 4 of ``docs/architecture.md`` with exactly the
cycles of the golden model (:mod:`wse.sim.golden.pe`) under the cycle
semantics of section 6: one instruction per cycle with no branch penalty,
``ld`` and ``ldsd`` in two cycles, a task selection cycle before each task,
and a vector engine that issues one element per cycle and writes it in the
next.

Microarchitecture
-----------------
* Fetch: the instruction memory has one synchronous read port whose address
  is the *next* pc, computed combinationally in the current cycle (branch
  outcome, task entry on a select cycle, or the same pc while an instruction
  waits), so the instruction of each cycle is ready at its start.
* Decode: :class:`~wse.hdl.decoder.Decoder`, generated from the ISA table.
* Data memory: one write port and three synchronous read ports, all
  transparent for the write port (write-first). ``ld``/``ldsd`` present their
  address in their first cycle and write the register in the second. A vector
  element *issues* (:class:`~wse.hdl.pe_vector.VectorEngine`) by presenting
  its source addresses and popping its fabric-in sources (their data is
  captured in a register); in the next cycle the floating-point blocks of
  :mod:`wse.hdl.fpu` compute its result combinationally and it is written
  (memory, output queue or accumulator register) while the next element
  issues. Transparency makes element ``i+1`` read what element ``i`` writes in
  the same cycle. The third read port serves only ``fmacw``, whose first
  element of each chunk reads three words (destination, source, weight).
* Queues: one :class:`~amaranth.lib.fifo.SyncFIFO` per color for input
  (``rx``), one for output (``tx``).

:meth:`PE.elaborate` builds these parts in order, one method each: storage,
input queues, output queue, task scheduler, decode, vector engine, floating
point, execute, data read addresses, sequencing (next pc and fetch),
counters, and the host port (:mod:`wse.hdl.pe_host`). They hand each other
their signals in small named tuples (``_Memories``, ``_InputQueues``, ...).

Where the golden model reports a program fault, the RTL does something
defined instead (a program that does not fault behaves identically):

* data addresses (``ld``, ``st``, ``ldsd``, vector elements) keep their low
  ``config.sram_addr_bits`` bits (modulo the memory size for a power-of-two
  ``sram_words``); instruction addresses keep their low
  ``config.imem_addr_bits`` bits and a fetch outside the program executes
  whatever the instruction memory holds;
* an unknown opcode executes as ``nop`` (one cycle, counted as an instruction);
* ``activate``/``block``/``unblock`` of a task with no entry point do nothing;
* a color outside ``0 .. colors-1`` (``send``, ``recv``, fabric descriptors)
  never has data or room: the instruction waits for ever (a visible hang);
* a descriptor of kind 3, a fabric-in destination or a fabric-out source is
  treated as memory, and so are ``fmacw``'s ``dd`` and ``da`` whatever their
  kind; two fabric-in sources of one color both read the same wavelet, which
  is popped once.

Counters are 32 bits and wrap.
"""

from __future__ import annotations

from functools import reduce
from typing import Callable, NamedTuple

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from wse.config import CTRL_BITS, DATA_BITS, FabricConfig
from wse.firmware import isa

from .decoder import Decoder, UnitCode, opcode
from .fpu import FPAdd, FPLt, FPMax, FPMul, FToI, IToF
from .pe_ecc import CODE_BITS, ecc_logic, ecc_storage
from .pe_host import host_port
from .pe_indexed import Indexed, indexed_control
from .pe_vector import Dsd, VectorEngine
from .wavelet import COUNTER_NAMES, HostSpace, Wavelet, host_bus_signature, link_signature

__all__ = ["PE", "Dsd"]

# Scalar integer instructions: result from (ra, second operand), where the
# second operand is rb for register formats and the extended immediate otherwise.
_ALU = {
    "li": lambda a, b: b,
    "lui": lambda a, b: b << 16,
    "add": lambda a, b: a + b, "addi": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "and": lambda a, b: a & b, "andi": lambda a, b: a & b,
    "or": lambda a, b: a | b, "ori": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b, "xori": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b[:5], "shli": lambda a, b: a << b[:5],
    "shr": lambda a, b: a >> b[:5], "shri": lambda a, b: a >> b[:5],
    "sra": lambda a, b: a.as_signed() >> b[:5], "srai": lambda a, b: a.as_signed() >> b[:5],
    "mul": lambda a, b: a * b,
    "slt": lambda a, b: a.as_signed() < b.as_signed(),
    "sltu": lambda a, b: a < b,
}
# Scalar binary32 instructions: which floating-point block gives the result.
_FPU = {"sfadd": "add", "sfsub": "add", "sfmul": "mul", "sfmax": "max", "sflt": "lt",
        "ftoi": "ftoi", "itof": "itof"}
# Vector instructions: where an element's result comes from ("a": the first source).
_VECTOR = {"fmov": "a", "fadd": "add", "fsub": "add", "fmul": "mul", "fmax": "max", "fmacs": "add", "fmuls": "mul",
           "fadds": "add", "fmaxs": "max", "dot": "add", "fsum": "add", "fmacw": "add", "fmacx": "add", "fdotx": "add"}
_FMAC = ("fmacs", "dot", "fmacw") + isa.INDEXED  # vector instructions counted by the fmac counter
_BRANCH = {
    "jmp": lambda a, b: 1,
    "beq": lambda a, b: a == b,
    "bne": lambda a, b: a != b,
    "blt": lambda a, b: a.as_signed() < b.as_signed(),
    "bge": lambda a, b: a.as_signed() >= b.as_signed(),
}
_TWO_CYCLE = ("ld", "ldsd")
_OTHER = ("nop", "exit", "activate", "block", "unblock", "ld", "st", "ldsd", "setb", "addb", "setl",
          "send", "sendc", "recv")


def _check_isa() -> None:
    """Every instruction of the table has semantics here, at the table's cost."""
    implemented = set(_ALU) | set(_FPU) | set(_VECTOR) | set(_BRANCH) | set(_OTHER)
    missing = sorted(set(isa.BY_NAME) - implemented)
    if missing:
        raise AssertionError(f"the PE has no semantics for {', '.join(missing)}: the ISA table grew")
    for ins in isa.INSTRUCTIONS:
        expected = 2 if ins.name in _TWO_CYCLE else 1
        if ins.cycles != expected:
            raise AssertionError(f"the PE takes {expected} for {ins.name}, the ISA table says {ins.cycles}")


_check_isa()


class _Memories(NamedTuple):
    """The memory ports: data memory write and three reads, instruction memory write and read."""

    sram_wr: object
    sram_rd: list
    imem_wr: object
    imem_rd: object
    ecc: object


class _InputQueues(NamedTuple):
    """The input queues as the rest of the PE sees them: ``has`` (bit c: queue c
    is not empty) and two pop ports, each popping queue ``color`` when ``pop``
    is high and showing its head."""

    has: Signal
    pop_a: Signal
    color_a: Signal
    head_a: Signal
    pop_b: Signal
    color_b: Signal
    head_b: Signal


class _OutputQueue(NamedTuple):
    """The output FIFO and its push port."""

    queue: SyncFIFO
    push: Signal
    push_data: Signal


class _Tasks(NamedTuple):
    """The task table (``entry`` points and per-task flag bits) and the scheduler's
    choice: ``select`` is a select cycle for task ``sel``, which pops a wavelet
    if ``sel_pops``."""

    entry: list
    valid: Signal
    bound: Signal
    blocked: Signal
    activated: Signal
    sel: Signal
    select: Signal
    sel_pops: Signal


class _Decoded(NamedTuple):
    """The decoded running instruction: ``dec`` (the decoder's fields),
    ``is_(*names)`` (its opcode is one of ``names``), ``is_vec``, the register
    operands ``ra rb rs rd``, the second ALU operand, the data address
    ``ra + imm``, the descriptor operands ``vd va vb`` and the register write
    port ``reg_we``/``reg_data``."""

    dec: object
    is_: Callable
    is_vec: Signal
    ra: Signal
    rb: Signal
    rs: Signal
    rd: Signal
    operand2: object
    mem_addr: Signal
    vd: Signal
    va: Signal
    vb: Signal
    reg_we: Signal
    reg_data: Signal


class PE(wiring.Component):
    """One processing element.

    Parameters
    ----------
    config : FabricConfig
        Sizes (memories, colors, queue depths, tasks).

    Members
    -------
    rx : ``In(link_signature(config))``
        Wavelets from the router's RAMP output into the per-color input
        queues; ``rx.ready[c]`` is high while queue ``c`` holds fewer than
        ``config.rx_depth`` wavelets (registered state only).
    tx : ``Out(link_signature(config))``
        The head of the output queue; ``tx.valid`` is asserted only when
        ``tx.ready[head.color]`` is high, and then the head moves.
    host : ``In(host_bus_signature(config, select_tile=False))``
        Host access while idle. ``SRAM``/``IMEM`` words, ``TASK`` entries
        (``entry | bound << 16 | blocked << 17 | valid << 18``; a write also
        clears the task's activated flag); ``CTRL`` address 0: a write
        activates task ``wdata`` (if it has an entry point); ``CTRL`` addresses
        1.. read the counters in :data:`~wse.hdl.wavelet.COUNTER_NAMES` order, and
        a write there sets the counter; then the memory ECC registers
        (:data:`~wse.hdl.pe_ecc.ECC_ADDRS`). A request is a cycle with ``stb`` and
        ``sel`` (writes also with ``bcast``); reads return ``rdata`` in the next
        cycle; other addresses read 0.
    idle : ``Out(1)``
        No task running or ready, input and output queues empty.
    enable : ``In(1)``, init 1
        While low, no task is selected. The host holds it low while it loads
        programs and launches tasks on several PEs, and raises it on every PE
        in the cycle the run starts, so that all start together
        (``docs/architecture.md`` section 5: a launch takes effect at the start
        of the next run). Tied high, the PE starts a task as soon as one is ready.
    clock : ``In(32)``
        The run cycle (from the mesh), for memory flips armed at a cycle (:mod:`.pe_ecc`).

    Attributes
    ----------
    regs, dsd, pc, running, task, counters
        Architectural state (signals), for testbenches and traces; ``regs[0]``
        is never written.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`~wse.config.FabricConfig`.
    """

    def __init__(self, config: FabricConfig):
        if not isinstance(config, FabricConfig):
            self._MustUse__silence = True  # a rejected design is not an unused one
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        self.config = config
        super().__init__({
            "rx": In(link_signature(config)),
            "tx": Out(link_signature(config)),
            "host": In(host_bus_signature(config, select_tile=False)),
            "idle": Out(1),
            "enable": In(1, init=1), "clock": In(32),
        })
        self.regs = [Signal(32, name=f"r{i}") for i in range(config.registers)]
        self.dsd = [Signal(Dsd, name=f"d{i}") for i in range(config.dsd_registers)]
        self.pc = Signal(config.imem_addr_bits)
        self.running = Signal()
        self.task = Signal(config.task_bits)
        self.counters = {name: Signal(32, name=f"count_{name}") for name in COUNTER_NAMES}
        self.ecc_counters = {name: Signal(32, name=f"ecc_{name}") for name in ("corrected", "detected")}

    def elaborate(self, platform):
        """The PE's hardware, part by part (see the module's docstring). The order
        of the parts fixes the numbering of the generated Verilog's internal wires."""
        m = Module()
        mem = self._storage(m)
        rx = self._input_queues(m)
        tx = self._output_queue(m)
        tasks = self._task_scheduler(m, rx, tx)
        d = self._decode(m, mem)
        vec, x = self._vector_engine(m, mem, rx, tx, d)
        fp_result = self._floating_point(m, d, vec)
        advance, stalled, taken, phase = self._execute(m, mem, rx, tx, tasks, d, vec, x, fp_result)
        self._data_read_addresses(m, mem, d, vec)
        self._sequencing(m, mem, rx, tasks, d, advance, taken)
        self._counters(m, tasks, d, vec, advance, stalled)
        # Memory ECC (hdl/pe_ecc.py): the reads whose words an instruction or the host takes.
        host = self.host
        first_cycle = self.running & ~phase
        used = [(host.stb & ~host.we & host.sel & (host.space == HostSpace.SRAM))
                | (first_cycle & d.is_(*_TWO_CYCLE)) | vec.reads[0],
                (first_cycle & d.is_("ldsd")) | vec.reads[1], vec.reads[2]]
        ecc_reads = ecc_logic(m, self, mem.ecc, used, tasks.select)
        host_port(m, self, mem, tasks, ecc_reads)
        return m

    # ---------------------------------------------------------------- storage

    def _storage(self, m) -> _Memories:
        """The data memory (one write port, three read ports transparent for it;
        39-bit code words behind 32-bit ports, :mod:`.pe_ecc`) and the
        instruction memory."""
        cfg = self.config
        m.submodules.sram = sram = Memory(shape=CODE_BITS, depth=cfg.sram_words, init=[])
        sram_wr, sram_rd, ecc_ports = ecc_storage(m, sram)
        m.submodules.imem = imem = Memory(shape=32, depth=cfg.imem_words, init=[])
        imem_wr = imem.write_port()
        imem_rd = imem.read_port()
        return _Memories(sram_wr, sram_rd, imem_wr, imem_rd, ecc_ports)

    # ---------------------------------------------------------------- input queues

    def _input_queues(self, m) -> _InputQueues:
        """One FIFO per color, filled from ``rx``; two pop ports."""
        cfg = self.config
        rx_queues = []
        for c in range(cfg.colors):
            queue = SyncFIFO(width=DATA_BITS + CTRL_BITS, depth=cfg.rx_depth)
            m.submodules[f"rx_queue_{c}"] = queue
            rx_queues.append(queue)
            m.d.comb += [
                queue.w_data.eq(Cat(self.rx.payload.data, self.rx.payload.ctrl)),
                queue.w_en.eq(self.rx.valid & (self.rx.payload.color == c)),
                self.rx.ready[c].eq(queue.w_rdy),
            ]
        rx_has = Signal(64)  # bit c: input queue c is not empty (0 beyond the colors)
        m.d.comb += rx_has.eq(Cat(q.r_rdy for q in rx_queues))
        rx_heads = Array(q.r_data for q in rx_queues)
        pop_a, color_a = Signal(), Signal(16)  # first pop port: select, recv, vector source a
        pop_b, color_b = Signal(), Signal(16)  # second pop port: vector source b
        head_a, head_b = Signal(DATA_BITS + CTRL_BITS), Signal(DATA_BITS + CTRL_BITS)
        m.d.comb += [head_a.eq(rx_heads[color_a]), head_b.eq(rx_heads[color_b])]
        for c, queue in enumerate(rx_queues):
            m.d.comb += queue.r_en.eq((pop_a & (color_a == c)) | (pop_b & (color_b == c)))
        return _InputQueues(rx_has, pop_a, color_a, head_a, pop_b, color_b, head_b)

    # ---------------------------------------------------------------- output queue

    def _output_queue(self, m) -> _OutputQueue:
        """The output FIFO; its head leaves on ``tx`` when the router is ready for its color."""
        m.submodules.tx_queue = tx_queue = SyncFIFO(width=Wavelet.as_shape().size, depth=self.config.tx_depth)
        tx_head = Wavelet(tx_queue.r_data)
        tx_ready = Signal(32)
        tx_leave = Signal()
        tx_push = Signal()
        tx_push_data = Signal(Wavelet)
        m.d.comb += [
            tx_ready.eq(self.tx.ready),
            tx_leave.eq(tx_queue.r_rdy & tx_ready.bit_select(tx_head.color, 1)),
            self.tx.valid.eq(tx_leave),
            self.tx.payload.eq(tx_head),
            tx_queue.r_en.eq(tx_leave),
            tx_queue.w_en.eq(tx_push),
            tx_queue.w_data.eq(tx_push_data),
        ]
        return _OutputQueue(tx_queue, tx_push, tx_push_data)

    # ---------------------------------------------------------------- task table, scheduler

    def _task_scheduler(self, m, rx: _InputQueues, tx: _OutputQueue) -> _Tasks:
        """The task table and the selection of the lowest ready task; ``idle``."""
        cfg = self.config
        colors, ntasks = cfg.colors, cfg.tasks
        rx_has, running = rx.has, self.running
        entry = [Signal(cfg.imem_addr_bits, name=f"task{t}_entry") for t in range(ntasks)]
        t_valid, t_bound = Signal(ntasks), Signal(ntasks)
        t_blocked, t_activated = Signal(ntasks), Signal(ntasks)
        task_ready = Signal(ntasks)
        for t in range(ntasks):
            waiting = (t_bound[t] & rx_has[t]) if t < colors else 0
            m.d.comb += task_ready[t].eq(t_valid[t] & ~t_blocked[t] & (t_activated[t] | waiting))
        sel = Signal(cfg.task_bits)
        for t in reversed(range(ntasks)):  # the last assignment wins: the lowest ready id
            with m.If(task_ready[t]):
                m.d.comb += sel.eq(t)
        select = Signal()   # a select cycle
        sel_pops = Signal()  # ... of a data task with a waiting wavelet
        m.d.comb += [
            select.eq(self.enable & ~running & task_ready.any()),
            sel_pops.eq(t_bound.bit_select(sel, 1) & rx_has.bit_select(sel, 1)),
            self.idle.eq(~running & ~task_ready.any() & ~rx_has.any() & ~tx.queue.r_rdy),
        ]
        return _Tasks(entry, t_valid, t_bound, t_blocked, t_activated, sel, select, sel_pops)

    # ---------------------------------------------------------------- decode, operands

    def _decode(self, m, mem: _Memories) -> _Decoded:
        """Decode the fetched word; read the register and descriptor operands; the register write port."""
        cfg = self.config
        m.submodules.decoder = decoder = Decoder()
        m.d.comb += decoder.word.eq(mem.imem_rd.data)
        dec = decoder.decoded

        def is_(*names):
            return reduce(lambda x, y: x | y, (dec.opcode == opcode(n) for n in names))

        regs = Array(self.regs)
        ra, rb, rs, rd = Signal(32), Signal(32), Signal(32), Signal(32)
        m.d.comb += [ra.eq(regs[dec.ra]), rb.eq(regs[dec.rb]), rs.eq(regs[dec.rs]), rd.eq(regs[dec.rd])]
        operand2 = Mux(dec.has_rb, rb, dec.imm)
        mem_addr = Signal(cfg.sram_addr_bits)
        m.d.comb += mem_addr.eq(ra + dec.imm)

        dsds = Array(self.dsd)
        vd, va, vb = Signal(Dsd), Signal(Dsd), Signal(Dsd)
        m.d.comb += [vd.eq(dsds[dec.dd]), va.eq(dsds[dec.da]), vb.eq(dsds[dec.db])]

        # Register write port of the running instruction (the select cycle writes r1, r2 itself).
        reg_we, reg_data = Signal(), Signal(32)
        for i in range(1, len(self.regs)):
            with m.If(reg_we & (dec.rd == i)):
                m.d.sync += self.regs[i].eq(reg_data)
        is_vec = Signal()
        m.d.comb += is_vec.eq(dec.unit == UnitCode.VEC)
        return _Decoded(dec, is_, is_vec, ra, rb, rs, rd, operand2, mem_addr, vd, va, vb, reg_we, reg_data)

    # ---------------------------------------------------------------- vector engine

    def _vector_engine(self, m, mem: _Memories, rx: _InputQueues, tx: _OutputQueue, d: _Decoded):
        """The vector engine and the index cycles of ``fmacx``/``fdotx`` (:mod:`.pe_indexed`)."""
        sram_rd, dec = mem.sram_rd, d.dec
        m.submodules.vector = vec = VectorEngine(self.config)
        x = indexed_control(m, self, d, rx, vec)
        m.d.comb += [
            vec.active.eq(self.running & d.is_vec & (~x.is_x | x.in_chunk)), vec.weighted.eq(d.is_("fmacw", *isa.INDEXED)),
            vec.has_dd.eq(dec.has_dd), vec.has_db.eq(dec.has_db),
            vec.dd.eq(d.vd), vec.da.eq(d.va), vec.db.eq(d.vb),
            vec.rx_has.eq(rx.has), vec.tx_level.eq(tx.queue.level),
            vec.head_a.eq(rx.head_a[:DATA_BITS]), vec.head_b.eq(rx.head_b[:DATA_BITS]),
            [vec.read_data[k].eq(sram_rd[k].data) for k in range(3)],
        ]
        return vec, x

    # ---------------------------------------------------------------- floating point

    def _floating_point(self, m, d: _Decoded, vec: VectorEngine) -> dict:
        """The binary32 blocks and their operands: scalar registers, or the element
        being written (a, then b or the scalar rs; fmacw: a times the weight b,
        added to the destination word acc). Returns the result of each unit."""
        is_, is_vec, ra, rb, rs, rd = d.is_, d.is_vec, d.ra, d.rb, d.rs, d.rd
        m.submodules.fp_add = fp_add = FPAdd()
        m.submodules.fp_mul = fp_mul = FPMul()
        m.submodules.fp_max = fp_max = FPMax()
        m.submodules.fp_lt = fp_lt = FPLt()
        m.submodules.fp_ftoi = fp_ftoi = FToI()
        m.submodules.fp_itof = fp_itof = IToF()
        op_a, op_b = Signal(32), Signal(32)
        m.d.comb += [
            op_a.eq(Mux(is_vec, vec.a, ra)),
            op_b.eq(Mux(is_vec, Mux(d.dec.has_db, vec.b, rs), rb)),
            fp_mul.a.eq(Mux(is_("fmacs"), op_b, op_a)),
            fp_mul.b.eq(Mux(is_("fmacs"), rs, op_b)),
            fp_add.a.eq(Mux(is_("dot", "fsum"), rd, Mux(is_("fmacw", *isa.INDEXED), vec.acc, op_a))),
            fp_add.b.eq(Mux(is_(*_FMAC), fp_mul.result, Mux(is_("fsum"), op_a, op_b))),
            fp_add.sub.eq(is_("sfsub", "fsub")),
            fp_max.a.eq(op_a), fp_max.b.eq(op_b),
            fp_lt.a.eq(ra), fp_lt.b.eq(rb),
            fp_ftoi.a.eq(ra), fp_itof.a.eq(ra),
        ]
        return {"a": op_a, "add": fp_add.result, "mul": fp_mul.result, "max": fp_max.result,
                "lt": fp_lt.result, "ftoi": fp_ftoi.result, "itof": fp_itof.result}

    # ---------------------------------------------------------------- execute

    def _execute(self, m, mem: _Memories, rx: _InputQueues, tx: _OutputQueue, tasks: _Tasks, d: _Decoded,
                 vec: VectorEngine, x: Indexed, fp_result: dict):
        """The running instruction: its effects, the input-queue pops, and whether
        it completes (``advance``), waits for the fabric (``stalled``) or branches
        (``taken``) this cycle. Returns ``(advance, stalled, taken, phase)``
        (``phase``: the second cycle of ``ld``/``ldsd``)."""
        cfg = self.config
        running = self.running
        sram_wr, sram_rd = mem.sram_wr, mem.sram_rd
        dec, is_, is_vec, ra, rb, rs, vd = d.dec, d.is_, d.is_vec, d.ra, d.rb, d.rs, d.vd
        reg_we, reg_data, operand2, mem_addr = d.reg_we, d.reg_data, d.operand2, d.mem_addr
        tx_push, tx_push_data = tx.push, tx.push_data
        t_valid, t_blocked, t_activated = tasks.valid, tasks.blocked, tasks.activated
        phase = Signal()     # second cycle of ld / ldsd
        advance = Signal()   # the running instruction completes this cycle
        stalled = Signal()   # ... waits for the fabric this cycle
        taken = Signal()     # ... branches
        can_send = (tx.queue.level < cfg.tx_depth) & (dec.color < cfg.colors)
        can_recv = rx.has.bit_select(dec.color, 1)
        task_ok = (dec.task < cfg.tasks) & t_valid.bit_select(dec.task, 1)
        m.d.sync += phase.eq(running & is_(*_TWO_CYCLE) & ~phase)
        m.d.comb += [
            rx.pop_a.eq(Mux(tasks.select, tasks.sel_pops, (running & is_("recv") & can_recv) | vec.pop_a | x.pop)),
            rx.color_a.eq(Mux(tasks.select, tasks.sel, Mux(is_vec & ~x.is_x, vec.color_a, dec.color))),
            rx.pop_b.eq(vec.pop_b),
            rx.color_b.eq(vec.color_b),
        ]
        with m.If(running):
            m.d.comb += advance.eq(1)
            with m.Switch(dec.opcode):
                for name, fn in _ALU.items():
                    with m.Case(opcode(name)):
                        m.d.comb += [reg_we.eq(1), reg_data.eq(fn(ra, operand2))]
                for name, unit in _FPU.items():
                    with m.Case(opcode(name)):
                        m.d.comb += [reg_we.eq(1), reg_data.eq(fp_result[unit])]
                for name, fn in _BRANCH.items():
                    with m.Case(opcode(name)):
                        m.d.comb += taken.eq(fn(ra, rb))
                with m.Case(opcode("exit")):
                    m.d.sync += running.eq(0)
                for name in ("activate", "block", "unblock"):
                    with m.Case(opcode(name)):
                        with m.If(task_ok):
                            bits = {"activate": t_activated, "block": t_blocked, "unblock": t_blocked}[name]
                            m.d.sync += bits.bit_select(dec.task, 1).eq(name != "unblock")
                with m.Case(opcode("ld")):
                    m.d.comb += [advance.eq(phase), reg_we.eq(phase), reg_data.eq(sram_rd[0].data)]
                with m.Case(opcode("st")):
                    m.d.comb += [sram_wr.addr.eq(mem_addr), sram_wr.data.eq(rs), sram_wr.en.eq(1)]
                with m.Case(opcode("ldsd")):
                    m.d.comb += advance.eq(phase)
                    with m.If(phase):
                        self._write_dsd(m, dec.dd, kind=sram_rd[1].data[:2], base=sram_rd[0].data[:16],
                                        length=sram_rd[0].data[16:], stride=sram_rd[1].data[16:])
                with m.Case(opcode("setb")):
                    self._write_dsd(m, dec.dd, base=ra[:16])
                with m.Case(opcode("addb")):
                    self._write_dsd(m, dec.dd, base=vd.base + ra[:16])
                with m.Case(opcode("setl")):
                    self._write_dsd(m, dec.dd, length=ra[:16])
                for name in ("send", "sendc"):
                    with m.Case(opcode(name)):
                        m.d.comb += [
                            advance.eq(can_send), stalled.eq(~can_send), tx_push.eq(can_send),
                            tx_push_data.data.eq(ra), tx_push_data.color.eq(dec.color),
                            tx_push_data.ctrl.eq(name == "sendc"),
                        ]
                with m.Case(opcode("recv")):
                    m.d.comb += [advance.eq(can_recv), stalled.eq(~can_recv),
                                 reg_we.eq(can_recv), reg_data.eq(rx.head_a[:32])]
                for name, unit in _VECTOR.items():
                    with m.Case(opcode(name)):
                        m.d.comb += [advance.eq(Mux(x.is_x, x.end, vec.done)), stalled.eq(vec.stalled | x.stall)]
                        with m.If(vec.wb_valid):
                            with m.If(vec.wb_fabout):
                                m.d.comb += [tx_push.eq(1), tx_push_data.data.eq(fp_result[unit]),
                                             tx_push_data.color.eq(vd.base)]
                            with m.Elif(dec.has_dd):
                                m.d.comb += [sram_wr.addr.eq(vec.wb_addr), sram_wr.data.eq(fp_result[unit]),
                                             sram_wr.en.eq(1)]
                            with m.Else():
                                m.d.comb += [reg_we.eq(1), reg_data.eq(fp_result[unit])]
        return advance, stalled, taken, phase

    # ---------------------------------------------------------------- memory read ports

    def _data_read_addresses(self, m, mem: _Memories, d: _Decoded, vec: VectorEngine) -> None:
        """Data memory read addresses: ld / ldsd, or the issuing vector element."""
        sram_rd = mem.sram_rd
        with m.If(d.is_vec):
            m.d.comb += [sram_rd[k].addr.eq(vec.read_addr[k]) for k in range(3)]
        with m.Else():
            m.d.comb += [sram_rd[0].addr.eq(d.mem_addr), sram_rd[1].addr.eq(d.mem_addr + 1)]

    # ---------------------------------------------------------------- sequencing

    def _sequencing(self, m, mem: _Memories, rx: _InputQueues, tasks: _Tasks, d: _Decoded, advance, taken) -> None:
        """The next pc (task entry on a select cycle, branch target, pc + 1, or the
        same pc while an instruction waits), which is also the fetch address; a
        select cycle starts the task and takes its wavelet."""
        pc, running = self.pc, self.running
        next_pc = Signal(self.config.imem_addr_bits)
        with m.If(tasks.select):
            m.d.comb += next_pc.eq(Array(tasks.entry)[tasks.sel])
            m.d.sync += [running.eq(1), self.task.eq(tasks.sel)]
            with m.If(tasks.sel_pops):
                m.d.sync += [self.regs[isa.DATA_TASK_DATA_REG].eq(rx.head_a[:32]),
                             self.regs[isa.DATA_TASK_CTRL_REG].eq(rx.head_a[32])]
            with m.Else():
                m.d.sync += tasks.activated.bit_select(tasks.sel, 1).eq(0)
        with m.Elif(running & advance):
            m.d.comb += next_pc.eq(Mux(taken, d.dec.target, pc + 1))
        with m.Else():
            m.d.comb += next_pc.eq(pc)
        m.d.sync += pc.eq(next_pc)
        m.d.comb += mem.imem_rd.addr.eq(next_pc)

    def _counters(self, m, tasks: _Tasks, d: _Decoded, vec: VectorEngine, advance, stalled) -> None:
        """The performance counters (32 bits, wrapping)."""
        count, is_, running, select = self.counters, d.is_, self.running, tasks.select
        m.d.sync += [
            count["busy"].eq(count["busy"] + (select | running)),
            count["instructions"].eq(count["instructions"] + (running & advance)),
            count["fmac"].eq(count["fmac"] + (vec.issue & is_(*_FMAC))),
            count["flops"].eq(count["flops"] + (vec.issue & ~is_("fmov"))),
            count["stall"].eq(count["stall"] + (running & stalled)),
            count["tasks"].eq(count["tasks"] + select),
        ]

    def _write_dsd(self, m, index, **fields):
        """Update ``fields`` of descriptor register ``index`` at the end of the cycle."""
        with m.Switch(index):
            for i, dsd in enumerate(self.dsd):
                with m.Case(i):
                    m.d.sync += [getattr(dsd, name).eq(value) for name, value in fields.items()]
