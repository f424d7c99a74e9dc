"""The RTL processing element (``wse.hdl.pe.PE``) against the golden PE.

Both sides run the same program image with the same input wavelets and the
same output backpressure, and must agree exactly: final data memory,
registers, descriptor registers, counters, every wavelet the PE emits (data,
color, ctrl and the cycle it left) and the cycles until the PE is idle.

The golden side is the golden :class:`~wse.sim.golden.pe.PE` stepped by
:class:`GoldenBench`, which does what ``Fabric.run`` does for one PE with the
router replaced by a source (input wavelets offered per color, as the
router's RAMP output would) and a sink (a per-cycle, per-color ``ready``
pattern). :func:`test_golden_bench_matches_fabric` checks the bench against a
1x1 golden ``Fabric``.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import warnings
from collections import deque

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wse.config import FabricConfig, Port
from wse.firmware import isa
from wse.firmware.asm import assemble
from wse.firmware.image import Program, TaskEntry
from wse.hdl.decoder import DECODED_LAYOUT, FIELD_WIDTHS, Decoder, Opcode
from wse.hdl.pe import PE
from wse.hdl.pe_vector import VectorEngine
from wse.hdl.wavelet import COUNTER_NAMES, HostSpace
from wse.sim.golden import Fabric
from wse.sim.golden.pe import PE as GoldenPE
from wse.sim.golden.pe import compile_program

CFG = FabricConfig(width=1, height=1, sram_words=64, imem_words=128, colors=4, tasks=8,
                   rx_depth=2, tx_depth=3)
# Shallow queues: every send and vector output meets a full queue.
SHALLOW = CFG.replace(rx_depth=1, tx_depth=1)


# --------------------------------------------------------------------------- traffic
class Traffic:
    """What the PE's router does to it: offers input wavelets and accepts output.

    Parameters
    ----------
    config : FabricConfig
    inputs : dict
        ``color -> [(data, ctrl), ...]`` wavelets delivered in order.
    seed : int
        Seeds the offer and ready patterns.
    offer_p, ready_p : float
        Probability that a color's next input is offered / that the sink
        accepts a color, in a given cycle.
    start : int
        No input is offered before this cycle.

    Each cycle at most one input wavelet is delivered (the RAMP link carries
    one): the first color, in rotating order from ``cycle mod colors``, with a
    wavelet left, offered this cycle, and room in the PE's queue.
    """

    PERIOD = 97

    def __init__(self, config, inputs=None, seed=0, offer_p=1.0, ready_p=1.0, start=0):
        self.colors, self.start = config.colors, start
        self.queues = {c: deque(ws) for c, ws in (inputs or {}).items()}
        rng = random.Random(seed)
        self.offer = [[rng.random() < offer_p for _ in range(self.colors)] for _ in range(self.PERIOD)]
        self.ready = [[rng.random() < ready_p for _ in range(self.colors)] for _ in range(self.PERIOD)]

    def pick(self, t, has_room):
        if t < self.start:
            return None
        offer = self.offer[t % self.PERIOD]
        for k in range(self.colors):
            c = (t + k) % self.colors
            if self.queues.get(c) and offer[c] and has_room(c):
                return c
        return None

    def take(self, c):
        return self.queues[c].popleft()

    def ready_mask(self, t):
        return sum(1 << c for c, r in enumerate(self.ready[t % self.PERIOD]) if r)

    def exhausted(self):
        return not any(self.queues.values())


@dataclasses.dataclass
class Job:
    """One run: a program image, the tasks launched before it, its traffic."""
    program: object
    launches: tuple = (0,)
    inputs: dict = dataclasses.field(default_factory=dict)
    seed: int = 0
    offer_p: float = 1.0
    ready_p: float = 1.0
    start: int = 0

    def traffic(self, config):
        return Traffic(config, self.inputs, self.seed, self.offer_p, self.ready_p, self.start)


@dataclasses.dataclass
class Result:
    """What one run left behind."""
    cycles: int
    emitted: list          # (cycle, data, color, ctrl)
    mem: list
    regs: list
    dsd: list              # (kind, base, length, stride)
    counters: dict


# --------------------------------------------------------------------------- golden side
class GoldenBench:
    """Runs the golden PE the way ``Fabric.run`` does, around one PE.

    The PE calls back :meth:`schedule` and fills ``rx_pops``, ``tx_pushes``
    and ``tx_pushes_next``; pops and pushes apply at the end of each cycle.
    """

    def __init__(self, config):
        self.config = config
        self.pe = GoldenPE(self, 0, 0)
        self.scheduled = None
        self.cycle_limit = 1 << 62  # the PE's run-ahead limit (Fabric.run sets it to max_cycles)

    def schedule(self, pe, time):
        pe.time = time
        self.scheduled = time

    def _pe_idle(self, t):
        pe = self.pe
        if self.scheduled is not None and self.scheduled != t:
            return False  # running ahead through private instructions
        return not pe.running and pe.ready_task() is None

    def run(self, job: Job, max_cycles=5000) -> Result:
        cfg, pe = self.config, self.pe
        pe.load(job.program, compile_program(job.program.code, cfg.sram_words))
        for task in job.launches:
            pe.check_task(task)
            pe.activated[task] = True
        traffic = job.traffic(cfg)
        pe.reset_run_state()
        self.rx_pops, self.tx_pushes, self.tx_pushes_next = [], [], []
        due_tx, emitted = [], []
        self.schedule(pe, 0)
        t = 0
        while not (self._pe_idle(t) and traffic.exhausted() and not pe.tx and not due_tx
                   and not any(pe.rx)):
            assert t < max_cycles, f"golden PE not idle after {max_cycles} cycles: {pe.where()}"
            color = traffic.pick(t, lambda c: len(pe.rx[c]) < cfg.rx_depth)
            move = bool(pe.tx) and traffic.ready_mask(t) >> pe.tx[0][1] & 1
            if self.scheduled == t:
                self.scheduled = None
                pe.step(t)
            if color is not None:
                pe.rx[color].append(traffic.take(color))
            if move:
                data, c, ctrl = pe.tx.popleft()
                emitted.append((t, data, c, ctrl))
            for _, c in self.rx_pops:
                pe.rx[c].popleft()
            for _, wavelet in self.tx_pushes:
                pe.tx.append(wavelet)
            for _, wavelet in due_tx:
                pe.tx.append(wavelet)
            due_tx, self.tx_pushes_next = self.tx_pushes_next, []
            self.rx_pops.clear()
            self.tx_pushes.clear()
            if (color is not None or move) and pe.wait is not None and self.scheduled is None:
                pe.wait = None
                self.schedule(pe, t + 1)
            t += 1
        return Result(t, emitted, [int(w) for w in pe.mem], list(pe.regs),
                      [tuple(d) for d in pe.dsd], dict(pe.counters))


def golden_runs(config, jobs):
    bench = GoldenBench(config)
    return [bench.run(job) for job in jobs]


# --------------------------------------------------------------------------- RTL side
async def host_write(ctx, dut, space, addr, data):
    host = dut.host
    for sig, value in ((host.stb, 1), (host.we, 1), (host.sel, 1), (host.space, space),
                       (host.addr, addr), (host.wdata, data)):
        ctx.set(sig, value)
    await ctx.tick()
    ctx.set(host.stb, 0)
    ctx.set(host.we, 0)


async def host_read(ctx, dut, space, addrs):
    """Pipelined reads: one request per cycle, each answered in the next."""
    host, values = dut.host, []
    ctx.set(host.sel, 1)
    ctx.set(host.we, 0)
    ctx.set(host.space, space)
    for addr in addrs:
        ctx.set(host.stb, 1)
        ctx.set(host.addr, addr)
        await ctx.tick()
        values.append(ctx.get(host.rdata))
    ctx.set(host.stb, 0)
    return values


def task_word(task):
    return task.entry | task.data_color << 16 | task.blocked << 17 | 1 << 18


async def host_load(ctx, dut, config, program):
    """What a backend's ``load`` does: every data word, every instruction, every task slot."""
    for addr, word in enumerate(program.data_image(config.sram_words).tolist()):
        await host_write(ctx, dut, HostSpace.SRAM, addr, word)
    code = program.code.tolist()
    for addr in range(config.imem_words):
        await host_write(ctx, dut, HostSpace.IMEM, addr, code[addr] if addr < len(code) else 0)
    tasks = {t.id: t for t in program.tasks}
    for tid in range(config.tasks):
        await host_write(ctx, dut, HostSpace.TASK, tid, task_word(tasks[tid]) if tid in tasks else 0)


async def rtl_run(ctx, dut, config, job, max_cycles=5000) -> Result:
    ctx.set(dut.enable, 0)
    await host_load(ctx, dut, config, job.program)
    for task in job.launches:
        await host_write(ctx, dut, HostSpace.CTRL, 0, task)
    traffic = job.traffic(config)
    ctx.set(dut.enable, 1)
    emitted, t = [], 0
    while not (ctx.get(dut.idle) and traffic.exhausted()):
        assert t < max_cycles, f"RTL PE not idle after {max_cycles} cycles (pc {ctx.get(dut.pc)})"
        rx_ready = ctx.get(dut.rx.ready)
        color = traffic.pick(t, lambda c: rx_ready >> c & 1)
        if color is not None:
            data, ctrl = traffic.take(color)
            ctx.set(dut.rx.payload, {"data": data, "color": color, "ctrl": ctrl})
        ctx.set(dut.rx.valid, color is not None)
        ready = traffic.ready_mask(t)
        ctx.set(dut.tx.ready, ready)
        if ctx.get(dut.tx.valid):
            w = ctx.get(dut.tx.payload)
            assert ready >> w.color & 1, "tx.valid for a color whose ready bit is low"
            emitted.append((t, w.data, w.color, w.ctrl))
        await ctx.tick()
        t += 1
    ctx.set(dut.rx.valid, 0)
    ctx.set(dut.enable, 0)
    mem = await host_read(ctx, dut, HostSpace.SRAM, range(config.sram_words))
    counters = await host_read(ctx, dut, HostSpace.CTRL, range(1, 1 + len(COUNTER_NAMES)))
    regs = [ctx.get(r) for r in dut.regs]
    dsd = [(ctx.get(d.kind), ctx.get(d.base), ctx.get(d.length), ctx.get(d.stride)) for d in dut.dsd]
    return Result(t, emitted, mem, regs, dsd, dict(zip(COUNTER_NAMES, counters)))


def rtl_runs(config, jobs):
    """Run ``jobs`` one after another on one RTL PE."""
    dut = PE(config)
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    results = []

    async def bench(ctx):
        for job in jobs:
            results.append(await rtl_run(ctx, dut, config, job))

    sim.add_testbench(bench)
    sim.run()
    return results


def assert_same(got, want):
    """Every observable of every run equal, RTL (``got``) and golden (``want``)."""
    assert len(got) == len(want)
    for n, (r, g) in enumerate(zip(got, want)):
        for field in ("emitted", "counters", "regs", "dsd", "mem", "cycles"):
            assert getattr(r, field) == getattr(g, field), \
                f"run {n}: {field} differs\n  rtl:    {getattr(r, field)}\n  golden: {getattr(g, field)}"


def compare(config, jobs):
    """Run ``jobs`` on both sides and require identical results; returns the golden ones."""
    want = golden_runs(config, jobs)
    assert_same(rtl_runs(config, jobs), want)
    return want


def asm(source, config=CFG):
    return assemble(source, config=config)


def f32(x):
    return int(np.array(x, dtype=np.float32).view(np.uint32))


# --------------------------------------------------------------------------- construction, decoder
def test_pe_rejects_a_non_config(monkeypatch):
    """One clear error, and the rejected object is not reported later as an unused design (the
    warning amaranth turns on once anything has been elaborated in the process)."""
    monkeypatch.setattr(UnusedElaboratable, "_MustUse__silence", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match=r"config must be a FabricConfig, not 'big'"):
            PE("big")
        with pytest.raises(TypeError, match=r"config must be a FabricConfig, not 3"):
            VectorEngine(3)
        gc.collect()
    assert not [w for w in caught if "never used" in str(w.message)], [str(w.message) for w in caught]


def test_decoder_matches_isa_decode():
    rng = random.Random(7)
    words = [rng.getrandbits(32) for _ in range(200)]
    words += [ins.opcode << isa.OPCODE_SHIFT | rng.getrandbits(isa.OPCODE_SHIFT)
              for ins in isa.INSTRUCTIONS for _ in range(4)]
    words += [isa.encode("fmacs", dd=7, da=1, db=2, rs=15), isa.encode("li", rd=3, imm=-(1 << 21)),
              isa.encode("ldsd", dd=5, ra=9, imm=-3), isa.encode("send", ra=4, color=31)]
    dut = Decoder()
    sim = Simulator(dut)
    checked = set()

    async def bench(ctx):
        for word in words:
            ctx.set(dut.word, word)
            out = ctx.get(dut.decoded)
            try:
                ins, fields = isa.decode(word)
            except ValueError:
                assert not out.known
                continue
            assert out.known and out.opcode == Opcode[ins.name.upper()]
            assert out.unit.name == ins.unit.name
            for name, width in FIELD_WIDTHS.items():
                want = fields.get(name, 0) & ((1 << width) - 1)
                assert getattr(out, name) == want, (hex(word), ins.name, name)
                assert getattr(out, f"has_{name}") == (name in fields)
            checked.add(ins.name)

    sim.add_testbench(bench)
    sim.run()
    assert checked == set(isa.BY_NAME)
    assert DECODED_LAYOUT.size > len(FIELD_WIDTHS)


# --------------------------------------------------------------------------- directed programs
def test_integer_alu_and_branches():
    program = asm("""
    .task 0, main
    .text
    main:   li r1, -7
            lui r2, 0xbeef
            ori r2, r2, 0x1234
            add r3, r1, r2
            sub r4, r1, r2
            and r5, r1, r2
            or r6, r1, r2
            xor r7, r1, r2
            li r8, 35
            shl r9, r2, r8
            shr r10, r2, r8
            sra r11, r2, r8
            mul r12, r2, r1
            slt r13, r1, r2
            sltu r14, r1, r2
            addi r15, r1, -131072
            andi r3, r2, 0x3ffff
            xori r4, r1, 0x2aaaa
            shli r5, r1, 31
            shri r6, r1, 33
            srai r7, r1, 1
            add r0, r1, r1
            li r8, 0                ; a counted loop: every branch kind, taken and not
    loop:   addi r8, r8, 1
            li r9, 5
            blt r8, r9, loop
            bge r8, r9, over
            jmp main
    over:   beq r8, r9, done
            exit
    done:   bne r8, r0, fin
            exit
    fin:    st r8, 5(r0)
            exit
    """)
    compare(CFG, [Job(program)])


def test_memory_loads_stores_and_descriptors():
    program = asm("""
    .task 0, main
    .data
    buf:  .word 11, 22, 33, 44
    desc: .dsd mem, base=buf+1, len=3, stride=-1
    fin:  .dsd fabin, color=3, len=9
    .text
    main: ld r1, buf(r0)
          st r1, buf+2(r0)
          ld r2, buf+2(r0)     ; reads what the store before wrote
          li r3, 1
          ld r4, buf(r3)
          st r4, 10(r3)
          ldsd d2, desc(r0)
          ldsd d5, fin(r0)
          li r5, 40
          setb d3, r5
          li r5, 0x1fffe
          addb d2, r5          ; base wraps modulo 2**16
          setl d5, r3
          exit
    """)
    compare(CFG, [Job(program)])


FP_VALUES = [0, 0x80000000, f32(1.0), f32(-1.5), 0x00000001, 0x80400000, 0x7F800000, 0xFF800000,
             0x7FC00000, 0x7F812345, f32(3.4e38), 0x00800000, f32(2.5e9), f32(-2.5e9), f32(-0.75)]


def test_scalar_floating_point():
    values = ", ".join(map(str, FP_VALUES))
    program = asm(f"""
    .task 0, main
    .data
    v:    .word {values}
    .text
    main: li r12, 0
          li r13, {len(FP_VALUES)}
    loop: ld r1, v(r12)
          ld r2, v+3(r12)
          sfadd r3, r1, r2
          sfsub r4, r1, r2
          sfmul r5, r1, r2
          sfmax r6, r1, r2
          sflt r7, r1, r2
          sflt r8, r2, r1
          ftoi r9, r1
          itof r10, r1
          itof r11, r9
          sfadd r14, r3, r4
          sfmul r15, r5, r6
          st r14, 20(r12)
          st r15, 40(r12)
          addi r12, r12, 1
          blt r12, r13, loop
          exit
    """)
    compare(CFG, [Job(program)])


def test_tasks_priority_activate_block_and_data_tasks():
    program = asm("""
    .task 0, first
    .task 1, second
    .task 5, late
    .data_task 2, on_data
    .data_task 3, on_three blocked
    .data
    count: .word 0
    .text
    first:    activate 5
              activate 1
              exit
    second:   ld r3, count(r0)
              addi r3, r3, 1
              st r3, count(r0)
              li r4, 3
              bge r3, r4, stop
              activate 1           ; runs again before task 5: lower ids win
    stop:     exit
    late:     unblock 3
              block 2
              exit
    on_data:  add r6, r6, r1
              add r7, r7, r2
              exit
    on_three: add r8, r8, r1
              add r9, r9, r2
              unblock 2
              exit
    """)
    inputs = {2: [(5, 0), (6, 0), (7, 1)], 3: [(100, 0), (200, 1)]}
    compare(CFG, [Job(program, launches=(5, 0), inputs=inputs),
                  Job(program, launches=(0,), inputs=inputs, seed=3, offer_p=0.4)])


def test_send_recv_with_backpressure():
    program = asm("""
    .task 0, main
    .text
    main: li r1, 1
    again: send r1, 1
          sendc r1, 2
          addi r1, r1, 1
          li r2, 7
          blt r1, r2, again
          recv r3, 0
          recv r4, 3
          recv r0, 3
          send r3, 3
          sendc r4, 0
          exit
    """)
    inputs = {0: [(0xABCD, 1)], 3: [(0x1234, 0), (0x5678, 1)]}
    jobs = [Job(program, inputs=inputs, seed=s, offer_p=0.3, ready_p=0.35) for s in range(3)]
    compare(CFG, jobs)
    compare(SHALLOW, jobs[:2])


VECTOR_PROGRAM = """
.task 0, main
.data
a:    .float 1.5, -2.0, 3.25, 0.5, 7.0, -0.0, 1e-39, 2.0
b:    .float 0.25, 4.0, -1.0, 8.0, 3.0, 0.0, 5.0, -6.5
c:    .zero 8
ma:   .dsd mem, base=a, len=8
mb:   .dsd mem, base=b+7, len=8, stride=-1
mc:   .dsd mem, base=c, len=8
m0:   .dsd mem, base=c+3, len=4, stride=0
ov:   .dsd mem, base=a+1, len=7
in1:  .dsd fabin, color=1, len=3
in2:  .dsd fabin, color=2, len=3
out3: .dsd fabout, color=3, len=5
out0: .dsd fabout, color=0, len=4
.text
main: ldsd d0, ma(r0)
      ldsd d1, mb(r0)
      ldsd d2, mc(r0)
      lui r5, 0x4040            ; 3.0
      fadd d2, d0, d1
      fsub d2, d2, d1
      fmul d2, d0, d1
      fmax d2, d0, d1
      fmacs d2, d0, d1, r5
      fmuls d2, d2, r5
      fadds d2, d2, r5
      fmaxs d2, d1, r5
      fmov d2, d1
      dot r6, d0, d1
      fsum r7, d1
      ldsd d3, m0(r0)
      fadd d3, d3, d0           ; stride 0: accumulate into one word
      ldsd d4, ov(r0)
      fadd d4, d4, d0           ; element i reads what element i-1 wrote
      li r8, 0
      setl d2, r8
      fmov d2, d0               ; zero elements: one cycle
      ldsd d5, in1(r0)
      ldsd d6, in2(r0)
      li r8, 3
      setl d2, r8
      fmul d2, d5, d6           ; two fabric-in sources: 3 wavelets of colors 1 and 2
      ldsd d7, out3(r0)
      fmacs d7, d0, d1, r5      ; 5 elements to the fabric, through the output queue
      li r8, 2
      setl d7, r8
      fadd d7, d5, d0           ; fabric in, fabric out: 2 wavelets of color 1
      setl d5, r8
      dot r9, d5, d6            ; dot over two streams of 2 (the length of d5)
      ldsd d7, out0(r0)
      fmov d7, d2
      fsum r10, d0
      exit
"""


def _vector_inputs():
    rng = np.random.default_rng(5)
    words = lambda n: [(int(w), 0) for w in rng.normal(size=n).astype(np.float32).view(np.uint32)]
    return {1: words(7), 2: words(5)}


def test_vector_instructions():
    program = asm(VECTOR_PROGRAM)
    inputs = _vector_inputs()
    compare(CFG, [Job(program, inputs=inputs),
                  Job(program, inputs=inputs, seed=1, offer_p=0.5, ready_p=0.4)])


def test_checker_catches_a_late_wavelet():
    """The same program under two backpressure patterns: the comparison must see
    that wavelets left in other cycles."""
    program = asm("""
    .task 0, main
    .text
    main: send r0, 1
          send r0, 2
          exit
    """)
    want = golden_runs(CFG, [Job(program, seed=0, ready_p=1.0)])
    got = rtl_runs(CFG, [Job(program, seed=0, ready_p=0.3)])
    with pytest.raises(AssertionError, match="emitted differs"):
        assert_same(got, want)


def test_vector_instructions_shallow_queues():
    program = asm(VECTOR_PROGRAM, SHALLOW)
    compare(SHALLOW, [Job(program, inputs=_vector_inputs(), seed=2, offer_p=0.6, ready_p=0.5)])


FMACW_PROGRAM = """
.task 0, main
.data
x:    .float 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
acc:  .float 0.5, -1, 2, 0.25
w:    .float 0.5, -2.0, 3.0
g:    .zero 12
dacc: .dsd mem, base=acc, len=4
dx:   .dsd mem, base=x, len=12
dw:   .dsd mem, base=w, len=3
dwf:  .dsd fabin, color=1, len=3
dg:   .dsd mem, base=g+11, len=12, stride=-1
dy:   .dsd mem, base=acc, len=4
dal:  .dsd mem, base=acc+1, len=2
.text
main: ldsd d0, dacc(r0)
      ldsd d1, dx(r0)
      ldsd d2, dw(r0)
      fmacw d0, d1, d2          ; acc += w[k] * x[k]: weights from memory, T = 4, n = 12
      ldsd d3, dwf(r0)
      fmacw d0, d1, d3          ; the same, weights from the fabric
      ldsd d4, dg(r0)
      ldsd d5, dy(r0)
      fmacw d4, d5, d3          ; g[k] += w[k] * y: dd longer than da
      li r1, 5
      setl d1, r1
      fmacw d0, d1, d2          ; n = 5, T = 4: a short last chunk
      li r1, 1
      setl d0, r1
      fmacw d0, d1, d3          ; T = 1: every element takes a new weight
      li r1, 4
      setl d0, r1
      li r1, 8
      setl d1, r1
      ldsd d6, dal(r0)
      fmacw d0, d1, d6          ; weights that are words of dd: each read once, with its chunk's first element
      li r1, 0
      setl d0, r1
      fmacw d0, d1, d3          ; no elements
      exit
"""


def test_fmacw():
    program = asm(FMACW_PROGRAM)
    inputs = {1: [(f32(v), 0) for v in (0.5, -1.25, 2.0, 4.0, -0.5, 1.5, 3.0, -2.0, 0.75, 1.0, 2.5)]}
    compare(CFG, [Job(program, inputs=inputs), Job(program, inputs=inputs, seed=6, offer_p=0.3)])


def test_golden_bench_matches_fabric():
    """The bench around the golden PE gives what a 1x1 golden fabric gives, where
    the fabric's router behaves like the bench's source and sink: each input
    color from its own edge (so its router FIFO holds a wavelet from cycle 1
    on) and each output color to its own edge (so RAMP is always ready)."""
    program = asm(VECTOR_PROGRAM)
    inputs = _vector_inputs()
    fabric = Fabric(CFG)
    fabric.load(program)
    fabric.load_routes([(0, 0, 1, Port.W, [Port.RAMP]), (0, 0, 2, Port.N, [Port.RAMP]),
                        (0, 0, 3, Port.RAMP, [Port.E]), (0, 0, 0, Port.RAMP, [Port.S])])
    fabric.stream_in("W", 0, 1, [d for d, _ in inputs[1]])
    fabric.stream_in("N", 0, 2, [d for d, _ in inputs[2]])
    fabric.launch(0)
    cycles = fabric.run()
    [bench] = golden_runs(CFG, [Job(program, inputs=inputs, start=1)])
    pe = fabric.pe(0, 0)
    assert bench.mem == pe.mem.tolist() and bench.regs == pe.regs and bench.counters == pe.counters
    for edge, color in (("E", 3), ("S", 0)):
        data, ctrl = fabric.stream_out(edge, 0, color, with_ctrl=True)
        assert [(d, c) for _, d, col, c in bench.emitted if col == color] == list(zip(data.tolist(), ctrl.tolist()))
    assert len(bench.emitted) == 11
    assert cycles == max(bench.cycles, bench.emitted[-1][0] + 2)


WIDE = CFG.replace(colors=32, tasks=64, rx_depth=3, tx_depth=5, sram_words=128)


def test_widest_color_and_task_fields():
    """32 colors, 64 tasks, queue depths that are not powers of two."""
    program = asm("""
    .task 63, main
    .task 40, other
    .data_task 31, on_data
    .data
    d:    .dsd fabin, color=30, len=4
    o:    .dsd fabout, color=31, len=4
    m:    .dsd mem, base=100, len=4
    .text
    main:    activate 40
             ldsd d1, d(r0)
             ldsd d2, o(r0)
             ldsd d3, m(r0)
             fmov d3, d1
             fadd d2, d3, d3
             exit
    other:   send r0, 29
             exit
    on_data: send r1, 31
             sendc r2, 30
             exit
    """, WIDE)
    inputs = {30: [(f32(i + 0.5), 0) for i in range(4)], 31: [(7, 1), (8, 0)]}
    compare(WIDE, [Job(program, launches=(63,), inputs=inputs, seed=4, offer_p=0.5, ready_p=0.5)])


# --------------------------------------------------------------------------- host port, RTL-only behaviour
def test_host_port():
    seen = {}
    pe = PE(CFG)
    sim = Simulator(pe)
    sim.add_clock(1e-6)

    async def host(ctx):
        ctx.set(pe.enable, 1)
        await host_write(ctx, pe, HostSpace.SRAM, 5, 0xDEADBEEF)
        ctx.set(pe.host.bcast, 1)
        ctx.set(pe.host.sel, 0)
        for sig, value in ((pe.host.stb, 1), (pe.host.we, 1), (pe.host.space, HostSpace.SRAM),
                           (pe.host.addr, 6), (pe.host.wdata, 66)):
            ctx.set(sig, value)
        await ctx.tick()
        ctx.set(pe.host.bcast, 0)
        ctx.set(pe.host.addr, 7)     # neither selected nor broadcast: ignored
        await ctx.tick()
        ctx.set(pe.host.stb, 0)
        seen["sram"] = await host_read(ctx, pe, HostSpace.SRAM, [5, 6, 7])
        await host_write(ctx, pe, HostSpace.IMEM, 9, isa.encode("exit"))
        seen["imem"] = await host_read(ctx, pe, HostSpace.IMEM, [9, 8])
        await host_write(ctx, pe, HostSpace.TASK, 3, 9 | 1 << 18)
        await host_write(ctx, pe, HostSpace.TASK, 2, 5 | 1 << 16 | 1 << 17 | 1 << 18)
        seen["task"] = await host_read(ctx, pe, HostSpace.TASK, [3, 2, 1, 200])
        await host_write(ctx, pe, HostSpace.CTRL, 0, 1)    # task 1 has no entry: nothing happens
        await ctx.tick().repeat(3)
        seen["idle_after_bad_launch"] = ctx.get(pe.idle)
        await host_write(ctx, pe, HostSpace.CTRL, 0, 3)    # runs "exit" at 9: 2 cycles
        seen["idle_at_launch"] = ctx.get(pe.idle)
        await ctx.tick().repeat(3)
        seen["idle_after"] = ctx.get(pe.idle)
        seen["counters"] = await host_read(ctx, pe, HostSpace.CTRL, range(1, 1 + len(COUNTER_NAMES)))
        await host_write(ctx, pe, HostSpace.CTRL, 1, 1000)
        seen["busy"] = await host_read(ctx, pe, HostSpace.CTRL, [1, 0, 99])

    sim.add_testbench(host)
    sim.run()
    assert seen["sram"] == [0xDEADBEEF, 66, 0]
    assert seen["imem"] == [isa.encode("exit"), 0]
    assert seen["task"] == [9 | 1 << 18, 5 | 1 << 16 | 1 << 17 | 1 << 18, 0, 0]
    assert seen["idle_after_bad_launch"] == 1
    assert seen["idle_at_launch"] == 0 and seen["idle_after"] == 1
    assert dict(zip(COUNTER_NAMES, seen["counters"])) == {
        "busy": 2, "instructions": 1, "fmac": 0, "flops": 0, "stall": 0, "tasks": 1}
    assert seen["busy"] == [1000, 0, 0]


def _words_program(words, tasks=((0, 0),)):
    return Program(code=np.array(words, dtype=np.uint32),
                   tasks=[TaskEntry(t, entry, False, False) for t, entry in tasks])


def test_rtl_defines_what_the_golden_model_reports_as_faults():
    """Unknown opcodes run as nop, data addresses wrap, activating a task with
    no entry point does nothing (the golden model raises ProgramFault for each)."""
    code = [
        63 << isa.OPCODE_SHIFT,                                   # unknown opcode: nop
        isa.encode("li", rd=2, imm=0x55),
        isa.encode("st", rs=2, ra=0, imm=CFG.sram_words + 10),    # stores to word 10
        isa.encode("ld", rd=3, ra=0, imm=-CFG.sram_words + 10),   # loads word 10
        isa.encode("activate", task=5),                           # task 5 has no entry
        isa.encode("exit"),
    ]
    [result] = rtl_runs(CFG, [Job(_words_program(code))])
    assert result.mem[10] == 0x55 and result.regs[3] == 0x55
    assert result.counters == {"busy": 8, "instructions": 6, "fmac": 0, "flops": 0, "stall": 0, "tasks": 1}
    assert result.cycles == 8


def test_invalid_color_waits_for_ever():
    """``send`` to a color beyond ``colors`` never finds room: the PE stays busy
    and counts stall cycles (the golden model reports a fault)."""
    code = [isa.encode("send", ra=0, color=CFG.colors + 1), isa.encode("exit")]
    pe = PE(CFG)
    sim = Simulator(pe)
    sim.add_clock(1e-6)
    seen = {}

    async def bench(ctx):
        ctx.set(pe.enable, 0)
        await host_load(ctx, pe, CFG, _words_program(code))
        await host_write(ctx, pe, HostSpace.CTRL, 0, 0)
        ctx.set(pe.enable, 1)
        ctx.set(pe.tx.ready, (1 << CFG.colors) - 1)
        await ctx.tick().repeat(30)
        seen["idle"], seen["pc"], seen["valid"] = ctx.get(pe.idle), ctx.get(pe.pc), ctx.get(pe.tx.valid)
        seen["stall"] = (await host_read(ctx, pe, HostSpace.CTRL, [1 + COUNTER_NAMES.index("stall")]))[0]

    sim.add_testbench(bench)
    sim.run()
    assert seen == {"idle": 0, "pc": 0, "valid": 0, "stall": 29}


# --------------------------------------------------------------------------- random programs
MEM_DATA = 40          # words 0..39: data the random programs read and write
TABLE = 40             # words 40..63: descriptors (12 of them)

_R_OPS = ["add", "sub", "and", "or", "xor", "shl", "shr", "sra", "mul", "slt", "sltu",
          "sfadd", "sfsub", "sfmul", "sfmax", "sflt"]
_I_OPS = {"addi": True, "andi": False, "ori": False, "xori": False, "shli": False, "shri": False, "srai": False}
_V3 = ["fadd", "fsub", "fmul", "fmax"]
_VS = ["fmuls", "fadds", "fmaxs"]
_SPECIAL = [0, 0x80000000, 0x3F800000, 0xBFC00000, 0x00000003, 0x7F800000, 0xFF800000,
            0x7FC00000, 0x7F7FFFFF, 0x00800000, 0x4B000001]

words_st = st.one_of(st.sampled_from(_SPECIAL), st.integers(0, 2**32 - 1),
                     st.floats(-1e6, 1e6, width=32).map(f32))
reg_st = st.integers(0, 15)


@st.composite
def random_program(draw, config=CFG):
    """A fault-free straight-line program: scalar, memory, descriptor, vector
    and fabric instructions; returns ``(source, inputs)``."""
    colors = config.colors
    data = draw(st.lists(words_st, min_size=MEM_DATA, max_size=MEM_DATA))
    table = []          # descriptors: (kind, base, length, stride)
    lines = [".task 0, main", ".text", "main:"]
    inputs = {c: [] for c in range(colors)}
    dsd = [None] * 8    # what the program's descriptor registers hold (None: unknown)

    def mem_desc(n, lo=0, hi=MEM_DATA, strides=(1, 1, -1, 2, 0)):
        """A memory descriptor of length ``n`` whose elements lie in ``lo .. hi-1``."""
        stride = draw(st.sampled_from(strides))
        span = (n - 1) * abs(stride) if n else 0
        first = draw(st.integers(lo, hi - 1 - span))
        return (0, first + span if stride < 0 else first, n, stride)

    def load_desc(reg, desc):
        """Put ``desc`` in d``reg``; False if the descriptor table has no room for it."""
        if dsd[reg] == desc:
            return True
        if desc not in table:
            if len(table) < (config.sram_words - TABLE) // 2:
                table.append(desc)
            else:  # the table is full: adjust a stored descriptor of the same kind and stride
                similar = [d for d in table if (d[0], d[3]) == (desc[0], desc[3])]
                if not similar:
                    return False
                lines.append(f"ldsd d{reg}, {TABLE + 2 * table.index(similar[0])}(r0)")
                for op, value in (("setb", desc[1]), ("setl", desc[2])):
                    lines.extend([f"li r14, {value}", f"{op} d{reg}, r14"])
                dsd[reg] = desc
                return True
        lines.append(f"ldsd d{reg}, {TABLE + 2 * table.index(desc)}(r0)")
        dsd[reg] = desc
        return True

    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["r", "r", "i", "li", "mem", "fp1", "dsd", "vec", "vec", "vec",
                                     "fmacw", "send", "recv"]))
        if kind == "r":
            lines.append(f"{draw(st.sampled_from(_R_OPS))} r{draw(reg_st)}, r{draw(reg_st)}, r{draw(reg_st)}")
        elif kind == "i":
            op, signed = draw(st.sampled_from(sorted(_I_OPS.items())))
            imm = draw(st.integers(-(1 << 17), (1 << 17) - 1) if signed else st.integers(0, (1 << 18) - 1))
            lines.append(f"{op} r{draw(reg_st)}, r{draw(reg_st)}, {imm}")
        elif kind == "li":
            op = draw(st.sampled_from(["li", "lui"]))
            imm = draw(st.integers(-(1 << 21), (1 << 21) - 1) if op == "li" else st.integers(0, 0xFFFF))
            lines.append(f"{op} r{draw(reg_st)}, {imm}")
        elif kind == "mem":
            if draw(st.booleans()):
                lines.append(f"ld r{draw(reg_st)}, {draw(st.integers(0, config.sram_words - 1))}(r0)")
            else:
                lines.append(f"st r{draw(reg_st)}, {draw(st.integers(0, MEM_DATA - 1))}(r0)")
        elif kind == "fp1":
            lines.append(f"{draw(st.sampled_from(['ftoi', 'itof']))} r{draw(reg_st)}, r{draw(reg_st)}")
        elif kind == "dsd":
            reg = draw(st.integers(0, 7))
            load_desc(reg, mem_desc(draw(st.integers(0, 4))))
        elif kind == "send":
            lines.append(f"{draw(st.sampled_from(['send', 'sendc']))} r{draw(reg_st)}, {draw(st.integers(0, colors - 1))}")
        elif kind == "fmacw":
            # dd and da in disjoint halves of the data, dd's elements distinct: the golden
            # model evaluates each weight's chunk at once, which is sequential only then.
            ld, la = draw(st.integers(0, 5)), draw(st.integers(0, 5))
            n = max(ld, la) if min(ld, la) else 0
            weights = -(-n // min(ld, la)) if n else 0
            half = draw(st.booleans())
            halves = [(0, MEM_DATA // 2), (MEM_DATA // 2, MEM_DATA)]
            # The golden model checks da and a memory db over all n elements when nothing
            # comes from the fabric, so their first n elements stay inside memory too.
            dest = mem_desc(ld, *halves[half], strides=(1, -1, 2) if ld > 1 else (1, 0))
            src = mem_desc(max(n, la), *halves[not half])
            src = src[:2] + (la,) + src[3:]
            consumed = []
            if draw(st.booleans()):
                color = draw(st.integers(0, colors - 1))
                weight = (1, color, draw(st.integers(0, 4)), 0)
                consumed = [(color, draw(words_st)) for _ in range(weights)]
            else:
                weight = mem_desc(max(n, weights))
                weight = weight[:2] + (weights,) + weight[3:]
            regs = draw(st.permutations(range(8)))
            if all(load_desc(r, d) for r, d in zip(regs, (dest, src, weight))):
                lines.append(f"fmacw d{regs[0]}, d{regs[1]}, d{regs[2]}")
                for color, word in consumed:
                    inputs[color].append((word, 0))
        elif kind == "recv":
            color = draw(st.integers(0, colors - 1))
            inputs[color].append((draw(words_st), draw(st.integers(0, 1))))
            lines.append(f"recv r{draw(reg_st)}, {color}")
        else:
            op = draw(st.sampled_from(["fmov", "fmacs", "dot", "fsum"] + _V3 + _VS))
            n = draw(st.integers(0, 4))
            regs = draw(st.permutations(range(8)))
            fmt = isa.BY_NAME[op].fmt
            nsrc = 2 if fmt in ("V3", "VM", "VR") else 1
            fabin_colors = draw(st.permutations(range(colors)))
            operands, consumed = [], {}
            for k in range(nsrc):
                if draw(st.integers(0, 3)) == 0:
                    color = fabin_colors[k]
                    desc = (1, color, n if k == 0 else draw(st.integers(0, 4)), draw(st.integers(-3, 3)))
                    consumed[color] = [(draw(words_st), 0) for _ in range(n)]
                else:
                    desc = mem_desc(n)
                    if k:  # only the destination's (dot, fsum: the first source's) length counts
                        desc = desc[:2] + (draw(st.integers(0, 4)),) + desc[3:]
                if not load_desc(regs[1 + k], desc):
                    break
                operands.append(f"d{regs[1 + k]}")
            if len(operands) < nsrc:
                continue
            if fmt in ("VR", "VR1"):
                # dot / fsum: the first source's length is n
                head = f"r{draw(reg_st)}"
            else:
                if draw(st.integers(0, 3)) == 0:
                    dest = (2, draw(st.integers(0, colors - 1)), n, draw(st.integers(-2, 2)))
                else:
                    dest = mem_desc(n)
                if not load_desc(regs[0], dest):
                    continue
                head = f"d{regs[0]}"
            scalar = [f"r{draw(reg_st)}"] if fmt in ("VS", "VM") else []
            lines.append(f"{op} " + ", ".join([head] + operands + scalar))
            for color, wavelets in consumed.items():
                inputs[color] += wavelets
    lines.append("exit")
    lines += [".data", ".word " + ", ".join(map(str, data))]
    if table:
        lines.append(f".org {TABLE}")
        for kind, base, length, stride in table:
            lines.append(f".word {base | length << 16}, {kind | (stride & 0xFFFF) << 16}")
    return "\n".join(lines), {c: ws for c, ws in inputs.items() if ws}


def _random_jobs(programs, seed):
    rng = random.Random(seed)
    return [Job(asm(src), inputs=inputs, seed=rng.randrange(1000), offer_p=rng.choice([1.0, 0.5, 0.2]),
                ready_p=rng.choice([1.0, 0.6, 0.3])) for src, inputs in programs]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(random_program(), min_size=3, max_size=3), st.integers(0, 1000))
def test_random_programs(programs, seed):
    compare(CFG, _random_jobs(programs, seed))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(random_program(SHALLOW), min_size=4, max_size=4), st.integers(0, 1000), st.booleans())
def test_random_programs_long(programs, seed, shallow):
    config = SHALLOW if shallow else CFG
    compare(config, _random_jobs(programs, seed))
