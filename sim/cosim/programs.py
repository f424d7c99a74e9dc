"""PE programs for co-simulation: directed ones and randomly generated ones.

A :class:`Scenario` is everything a run needs on a 1x1 mesh (one PE and its
router): the program, routes (input colors from the west edge into the PE,
the output color from the PE out of the east edge), the wavelets the host
streams in, and the task it launches. :func:`run_scenario` plays it on any
device with the host API, so the same scenario runs on the golden model and
on the RTL (usually through :class:`~.lockstep.Lockstep`, which compares
final memory, registers, counters and every emitted wavelet).

:func:`random_scenario` writes a program that cannot fault and always ends:
straight-line code (branches only skip forward over instructions that do not
touch the fabric) drawn from every instruction group of the ISA: integer and
binary32 scalar operations on random bit patterns, loads and stores,
descriptor updates, vector operations over memory (overlapping operands
included, which need element order), ``fmacw``, ``send``/``sendc``/``recv``,
vector operations that stream from and to the fabric, a data task bound to a
color (with control wavelets), a second local task activated, blocked and
unblocked. The generator tracks every descriptor and address, so all of them
stay inside the memory, and counts what the program receives, so the host
streams exactly that.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import FabricConfig, Port
from wse.firmware.asm import assemble
from wse.firmware.image import Program

__all__ = ["Scenario", "run_scenario", "random_scenario", "directed_scenarios", "COSIM_CONFIG", "PE_CONFIG"]

#: The configuration of the co-simulation tests: the default one with a
#: smaller data memory (a full memory compare is one host-bus cycle per word,
#: which matters under cocotb); 1x1 for the PE scenarios.
COSIM_CONFIG = FabricConfig(sram_words=2048)
PE_CONFIG = COSIM_CONFIG.with_mesh(1, 1)

# Colors and tasks of the generated programs.
_IN_SCALAR, _IN_VECTOR, _DATA, _OUT = 1, 2, 3, 5
_MAIN, _AUX = 20, 21
_BUF, _BUF_WORDS = 64, 96          # scratch words for scalar and vector data
_WORK_REGS = tuple(range(3, 14))   # r3..r13: random values; r1, r2 belong to the data task
_LEN_REG, _ACC_REG = 15, 14        # r15: descriptor updates; r14: the data task's running sum


@dataclasses.dataclass
class Scenario:
    """One program run on a 1x1 mesh.

    Members
    -------
    name:
        For reports.
    source:
        The assembly text.
    program:
        It assembled for ``config``.
    config:
        The fabric (1x1).
    routes:
        ``(x, y, color, input, outputs)`` entries.
    streams:
        ``(edge, index, color, words, ctrl)``: wavelets the host queues.
    launch:
        Local task ids the host launches (in this order), before the run.
    """
    name: str
    source: str
    program: Program
    config: FabricConfig
    routes: list
    streams: list
    launch: list


def run_scenario(device, scenario: Scenario, max_cycles: int = 200_000) -> int:
    """Load, route, stream, launch and run ``scenario`` on ``device``; returns the cycles."""
    device.load(scenario.program)
    device.load_routes(scenario.routes)
    for edge, index, color, words, ctrl in scenario.streams:
        device.stream_in(edge, index, color, np.asarray(words, dtype=np.uint32), ctrl=ctrl)
    for task in scenario.launch:
        device.launch(task)
    return device.run(max_cycles=max_cycles)


def _routes(inputs, outputs) -> list:
    routes = [(0, 0, c, Port.W, (Port.RAMP,)) for c in inputs]
    routes += [(0, 0, c, Port.RAMP, (Port.E,)) for c in outputs]
    return routes


def _scenario(name, source, config, inputs, outputs, streams, launch) -> Scenario:
    program = assemble(source, filename=f"{name}.s", config=config)
    return Scenario(name, source, program, config, _routes(inputs, outputs), streams, launch)


# ------------------------------------------------------------------ random programs

class _Writer:
    """Writes one random program and keeps track of what it does."""

    def __init__(self, rng: np.random.Generator, config: FabricConfig, length: int):
        self.rng, self.config, self.length = rng, config, length
        self.lines: list[str] = []
        self.labels = 0
        self.scalar_in = 0     # wavelets the program receives on _IN_SCALAR
        self.vector_in = 0     # ... and on _IN_VECTOR
        # Descriptor registers d0..d5: [kind, base, length, stride]; d6 fabric-in, d7 fabric-out.
        self.dsd: list[list[int]] = []

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def reg(self) -> str:
        return f"r{self.pick(_WORK_REGS)}"

    def src(self) -> str:
        return f"r{self.pick((0,) + _WORK_REGS)}"

    def word(self) -> int:
        """A random bit pattern, often a float of moderate size or a special value."""
        choice = self.rng.random()
        if choice < 0.5:
            return int(np.float32(self.rng.standard_normal() * 10.0 ** self.rng.integers(-3, 4)).view(np.uint32))
        if choice < 0.6:
            return self.pick((0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001, 0x807FFFFF,
                              0x7F7FFFFF, 0x00800000))
        return int(self.rng.integers(0, 1 << 32))

    def emit(self, text: str) -> None:
        self.lines.append(f"        {text}")

    # -------------------------------------------------------------- descriptors
    def mem_dsd(self) -> list[int]:
        length = int(self.rng.integers(1, 9))
        stride = self.pick((1, 1, 1, 2, -1, 0))
        base = _BUF + 16 + int(self.rng.integers(0, 48))
        return [0, base, length, stride]

    def in_range(self, d, n) -> bool:
        last = d[1] + (n - 1) * d[3]
        return n == 0 or (_BUF <= min(d[1], last) and max(d[1], last) < _BUF + _BUF_WORDS)

    def dsd_words(self) -> list[str]:
        out = []
        for i, (kind, base, length, stride) in enumerate(self.dsd):
            out.append(f"dsd{i}:  .dsd mem, base={base}, len={length}, stride={stride}")
        out.append(f"dsd6:  .dsd fabin, color={_IN_VECTOR}, len=1")
        out.append(f"dsd7:  .dsd fabout, color={_OUT}, len=1")
        return out

    # -------------------------------------------------------------- instruction groups
    def alu(self):
        op = self.pick(("add", "sub", "and", "or", "xor", "shl", "shr", "sra", "mul", "slt", "sltu"))
        self.emit(f"{op} {self.reg()}, {self.src()}, {self.src()}")

    def alu_imm(self):
        op = self.pick(("addi", "andi", "ori", "xori", "shli", "shri", "srai", "li", "lui"))
        if op == "li":
            self.emit(f"li {self.reg()}, {int(self.rng.integers(-(1 << 21), 1 << 21))}")
        elif op == "lui":
            self.emit(f"lui {self.reg()}, {int(self.rng.integers(0, 1 << 16))}")
        elif op == "addi":
            self.emit(f"addi {self.reg()}, {self.src()}, {int(self.rng.integers(-(1 << 17), 1 << 17))}")
        else:
            self.emit(f"{op} {self.reg()}, {self.src()}, {int(self.rng.integers(0, 1 << 18))}")

    def fpu(self):
        op = self.pick(("sfadd", "sfsub", "sfmul", "sfmax", "sflt", "ftoi", "itof"))
        if op in ("ftoi", "itof"):
            self.emit(f"{op} {self.reg()}, {self.src()}")
        else:
            self.emit(f"{op} {self.reg()}, {self.src()}, {self.src()}")

    def memory(self):
        addr = _BUF + int(self.rng.integers(0, _BUF_WORDS))
        if self.rng.random() < 0.5:
            self.emit(f"ld {self.reg()}, {addr}(r0)")
        else:
            self.emit(f"st {self.src()}, {addr}(r0)")

    def vector(self):
        op = self.pick(("fmov", "fadd", "fsub", "fmul", "fmax", "fmacs", "fmuls", "fadds", "fmaxs", "dot",
                        "fsum", "fmacw"))
        d = self.rng.permutation(6)
        dd, da, db = (int(v) for v in d[:3])
        if op == "fmacw":
            ld, la = self.dsd[dd][2], self.dsd[da][2]
            n = max(ld, la)
            t = min(ld, la)
            if t == 0:
                return  # a zero-length operand: nothing to stream (and no weight count to derive)
            if not (self.in_range(self.dsd[dd], ld) and self.in_range(self.dsd[da], la)
                    and self.in_range(self.dsd[db], -(-n // t))):
                return
            self.emit(f"fmacw d{dd}, d{da}, d{db}")
            return
        if op in ("dot", "fsum"):
            n = self.dsd[da][2]
            if not (self.in_range(self.dsd[da], n) and self.in_range(self.dsd[db], n)):
                return
            self.emit(f"dot {self.reg()}, d{da}, d{db}" if op == "dot" else f"fsum {self.reg()}, d{da}")
            return
        n = self.dsd[dd][2]
        if not all(self.in_range(self.dsd[k], n) for k in (dd, da, db)):
            return
        if op == "fmov":
            self.emit(f"fmov d{dd}, d{da}")
        elif op in ("fmuls", "fadds", "fmaxs"):
            self.emit(f"{op} d{dd}, d{da}, {self.src()}")
        elif op == "fmacs":
            self.emit(f"fmacs d{dd}, d{da}, d{db}, {self.src()}")
        else:
            self.emit(f"{op} d{dd}, d{da}, d{db}")

    def descriptor(self):
        k = int(self.rng.integers(6))
        d = self.dsd[k]
        what = self.pick(("setl", "setb", "addb"))
        if what == "setl":
            value = int(self.rng.integers(0, 9))
            new = [d[0], d[1], value, d[3]]
        elif what == "setb":
            value = _BUF + 16 + int(self.rng.integers(0, 48))
            new = [d[0], value, d[2], d[3]]
        else:
            value = int(self.rng.integers(-4, 5))
            new = [d[0], d[1] + value, d[2], d[3]]
        if not self.in_range(new, max(new[2], 1)):
            return
        self.emit(f"li r{_LEN_REG}, {value}")
        self.emit(f"{what} d{k}, r{_LEN_REG}")
        self.dsd[k] = new

    def fabric(self):
        choice = self.rng.random()
        if choice < 0.35:
            self.emit(f"{self.pick(('send', 'sendc'))} {self.src()}, {_OUT}")
        elif choice < 0.6:
            self.emit(f"recv {self.reg()}, {_IN_SCALAR}")
            self.scalar_in += 1
        else:
            # Stream through the vector engine: fabric in and/or out.
            n = int(self.rng.integers(1, 7))
            self.emit(f"li r{_LEN_REG}, {n}")
            self.emit(f"setl d6, r{_LEN_REG}")
            self.emit(f"setl d7, r{_LEN_REG}")
            k = int(self.rng.integers(6))
            form = self.pick(("in-out", "mem-out", "in-mem", "in-reg"))
            if form == "in-out":
                self.emit(f"fadds d7, d6, {self.src()}")
                self.vector_in += n
            elif form == "mem-out" and self.in_range(self.dsd[k], n):
                self.emit(f"fmuls d7, d{k}, {self.src()}")
            elif form == "in-mem" and self.in_range(self.dsd[k], n) and self.dsd[k][2] >= 1:
                # d{k}'s own length decides how many elements: set it to n first.
                self.emit(f"setl d{k}, r{_LEN_REG}")
                self.dsd[k][2] = n
                self.emit(f"fmax d{k}, d6, d{k}")
                self.vector_in += n
            else:
                self.emit(f"fsum {self.reg()}, d6")
                self.vector_in += n

    def branch(self):
        """A forward branch over a few instructions that do not touch the fabric."""
        label = f"skip{self.labels}"
        self.labels += 1
        self.emit(f"{self.pick(('beq', 'bne', 'blt', 'bge'))} {self.src()}, {self.src()}, {label}")
        for _ in range(int(self.rng.integers(1, 4))):
            self.pick((self.alu, self.alu_imm, self.fpu, self.memory))()
        self.lines.append(f"{label}:")

    def write(self) -> str:
        self.dsd = [self.mem_dsd() for _ in range(6)]
        words = [self.word() for _ in range(_BUF_WORDS)]
        head = [".data", f"        .org {_BUF}", "buf:"]
        head += [f"        .word {w:#010x}" for w in words]
        head += ["acc:    .word 0", "dump:   .zero 16"] + self.dsd_words()
        head += [".text", f".task {_MAIN}, main", f".task {_AUX}, aux", f".data_task {_DATA}, on_data"]
        self.lines = ["main:"]
        for i in range(6):
            self.emit(f"ldsd d{i}, dsd{i}(r0)")
        self.emit("ldsd d6, dsd6(r0)")
        self.emit("ldsd d7, dsd7(r0)")
        for r in _WORK_REGS:
            self.emit(f"ld r{r}, {_BUF + int(self.rng.integers(0, _BUF_WORDS))}(r0)")
        groups = ((self.alu, 4), (self.alu_imm, 3), (self.fpu, 4), (self.memory, 3), (self.vector, 4),
                  (self.descriptor, 1), (self.fabric, 3), (self.branch, 1))
        weights = np.array([w for _, w in groups], dtype=float)
        for _ in range(self.length):
            groups[int(self.rng.choice(len(groups), p=weights / weights.sum()))][0]()
            if self.rng.random() < 0.03:
                self.emit(f"activate {_AUX}")
            if self.rng.random() < 0.02:
                self.emit(f"block {_AUX}")
                self.emit(f"unblock {_AUX}")
        self.emit("exit")
        aux = ["aux:"]
        self.lines, main = aux, self.lines
        for _ in range(int(self.rng.integers(2, 8))):
            self.pick((self.alu, self.alu_imm, self.fpu, self.memory))()
        self.emit(f"send {self.src()}, {_OUT}")
        self.emit("exit")
        data = ["on_data:",
                f"        add r{_ACC_REG}, r{_ACC_REG}, r1",
                f"        st r{_ACC_REG}, acc(r0)",
                "        beq r2, r0, plain",
                f"        sendc r{_ACC_REG}, {_OUT}",
                "        exit",
                "plain:",
                f"        sfmul r{_ACC_REG}, r{_ACC_REG}, r1",
                "        exit"]
        return "\n".join(head + main + aux + data) + "\n"


def random_scenario(seed: int, length: int = 60, config: FabricConfig = PE_CONFIG) -> Scenario:
    """A random program of about ``length`` instruction groups on ``config``
    (1x1), and its stimulus, from ``seed``."""
    rng = np.random.default_rng(seed)
    writer = _Writer(rng, config, length)
    source = writer.write()
    data_words = int(rng.integers(1, 9))
    streams = [
        ("W", 0, _IN_SCALAR, rng.integers(0, 1 << 32, writer.scalar_in, dtype=np.uint64), None),
        ("W", 0, _IN_VECTOR, [writer.word() for _ in range(writer.vector_in)], None),
        ("W", 0, _DATA, rng.integers(0, 1 << 32, data_words, dtype=np.uint64), rng.integers(0, 2, data_words)),
    ]
    streams = [s for s in streams if len(s[3])]
    return _scenario(f"random{seed}", source, config, (_IN_SCALAR, _IN_VECTOR, _DATA), (_OUT,), streams,
                     [_MAIN])


# ------------------------------------------------------------------ directed programs

_DIRECTED = {
    # Every integer operation on chosen operands; results stored in order.
    "integer": ("""
.data
out: .zero 32
.text
.task 20, main
main:   li r3, -7
        lui r4, 0x8000
        ori r4, r4, 5
        add r5, r3, r4
        st r5, out+0(r0)
        sub r5, r3, r4
        st r5, out+1(r0)
        and r5, r3, r4
        st r5, out+2(r0)
        or r5, r3, r4
        st r5, out+3(r0)
        xor r5, r3, r4
        st r5, out+4(r0)
        li r6, 35
        shl r5, r3, r6
        st r5, out+5(r0)
        shr r5, r3, r6
        st r5, out+6(r0)
        sra r5, r3, r6
        st r5, out+7(r0)
        mul r5, r3, r4
        st r5, out+8(r0)
        slt r5, r3, r4
        st r5, out+9(r0)
        sltu r5, r3, r4
        st r5, out+10(r0)
        addi r5, r3, -131072
        andi r5, r5, 0x3ffff
        xori r5, r5, 0x15555
        shli r5, r5, 3
        shri r7, r5, 2
        srai r8, r4, 4
        st r5, out+11(r0)
        st r7, out+12(r0)
        st r8, out+13(r0)
        ld r9, out+8(r0)
        st r9, out+14(r0)
        exit
""", (), (), [], [20]),
    # Binary32 scalars, with specials: subnormals flushed, NaN, signed zeros, overflow.
    "binary32": ("""
.data
in:  .word 0x3f800000, 0x00400000, 0x7f7fffff, 0xff7fffff, 0x80000000, 0x7fc12345, 0xc0490fdb, 0x4effffff
out: .zero 32
.text
.task 20, main
main:   ld r3, in+0(r0)
        ld r4, in+1(r0)
        ld r5, in+2(r0)
        ld r6, in+3(r0)
        ld r7, in+4(r0)
        ld r8, in+5(r0)
        ld r9, in+6(r0)
        ld r10, in+7(r0)
        sfadd r11, r3, r4
        st r11, out+0(r0)
        sfadd r11, r5, r5
        st r11, out+1(r0)
        sfsub r11, r7, r7
        st r11, out+2(r0)
        sfmul r11, r9, r8
        st r11, out+3(r0)
        sfmax r11, r7, r0
        st r11, out+4(r0)
        sflt r11, r7, r0
        st r11, out+5(r0)
        ftoi r11, r10
        st r11, out+6(r0)
        ftoi r11, r9
        st r11, out+7(r0)
        itof r11, r11
        st r11, out+8(r0)
        sfmul r11, r5, r6
        st r11, out+9(r0)
        exit
""", (), (), [], [20]),
    # Vector instructions over memory, an overlapping (shifting) fmov, dot and fsum.
    "vectors": ("""
.data
a:   .float 1.5, -2.25, 3.0, 0.5, 1e-30, -7.0, 2.0, 8.0
b:   .float 0.25, 4.0, -1.0, 3.5, 1e-20, 2.0, -0.5, 1.0
c:   .zero 16
w:   .float 2.0, -3.0
da:  .dsd mem, base=a, len=8, stride=1
db:  .dsd mem, base=b, len=8, stride=1
dc:  .dsd mem, base=c, len=8, stride=1
dr:  .dsd mem, base=a+7, len=8, stride=-1
ds:  .dsd mem, base=c+1, len=7, stride=1
dw:  .dsd mem, base=w, len=2, stride=1
dt:  .dsd mem, base=c, len=4, stride=1
.text
.task 20, main
main:   ldsd d0, da(r0)
        ldsd d1, db(r0)
        ldsd d2, dc(r0)
        ldsd d3, dr(r0)
        ldsd d4, ds(r0)
        ldsd d5, dw(r0)
        ldsd d6, dt(r0)
        lui r3, 0x4040
        fadd d2, d0, d1
        fmacs d2, d2, d3, r3
        fmov d4, d2
        fmuls d2, d2, r3
        fmax d2, d2, d3
        dot r4, d0, d1
        fsum r5, d3
        fmacw d6, d0, d5
        st r4, c+9(r0)
        st r5, c+10(r0)
        exit
""", (), (), [], [20]),
    # Fabric: a data task handling a stream and its control wavelet, recv, sendc,
    # a vector from the fabric into the fabric, and fmacw with fabric weights.
    "fabric": ("""
.data
acc:   .zero 4
sum:   .word 0
fin:   .dsd fabin, color=2, len=4
fout:  .dsd fabout, color=5, len=4
dacc:  .dsd mem, base=acc, len=4, stride=1
win:   .dsd fabin, color=1, len=2
xs:    .float 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0
dxs:   .dsd mem, base=xs, len=8, stride=1
.text
.task 20, main
.data_task 3, on3
main:   ldsd d0, fin(r0)
        ldsd d1, fout(r0)
        ldsd d2, dacc(r0)
        ldsd d3, win(r0)
        ldsd d4, dxs(r0)
        lui r3, 0x3f00
        fmuls d1, d0, r3
        recv r4, 1
        sendc r4, 5
        fmacw d2, d4, d3
        exit
on3:    ld r5, sum(r0)
        add r5, r5, r1
        st r5, sum(r0)
        beq r2, r0, done
        send r5, 5
done:   exit
""", (1, 2, 3), (5,), [("W", 0, 2, [0x3f800000, 0x40000000, 0xbf800000, 0x3e800000], None),
                       ("W", 0, 1, [0x12345678, 0x40000000, 0xc0400000], None),
                       ("W", 0, 3, [1, 2, 3, 4, 5], [0, 0, 1, 0, 1])], [20]),
    # Task control: priorities, activate, block and unblock, a blocked data task.
    "tasks": ("""
.data
log:  .zero 16
n:    .word 0
.text
.task 20, first
.task 22, second
.task 21, third
.data_task 4, on4 blocked
first:  li r3, 1
        jmp note
second: li r3, 2
        unblock 4
        jmp note
third:  li r3, 3
        activate 22
        jmp note
note:   ld r4, n(r0)
        st r3, log(r4)
        addi r4, r4, 1
        st r4, n(r0)
        li r5, 21
        bne r3, r5, out
out:    exit
on4:    li r3, 4
        ld r4, n(r0)
        st r1, log(r4)
        addi r4, r4, 1
        st r4, n(r0)
        exit
""", (4,), (), [("W", 0, 4, [100, 101], None)], [22, 21, 20]),
    # Indexed vectors: fmacx (index/value pairs on color 1 until a control wavelet) and fdotx
    # (indices on color 2, weights in memory, one result word per index); the last fmacx has dd shorter
    # than da (dd 2 words, da 4): two weights per index.
    "indexed": ("""
.data
xs:    .float 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, -0.5, 0.25, 3.0, -2.0
acc:   .float 0.5, -1.0, 2.0, 0.25
dys:   .float 0.5, -2.0, 4.0, 1.5
g:     .zero 4
dacc:  .dsd mem, base=acc, len=4, stride=1
dx:    .dsd mem, base=0, len=4, stride=1
win:   .dsd fabin, color=1, len=0
ddy:   .dsd mem, base=dys, len=4, stride=1
dg:    .dsd mem, base=g, len=1, stride=1
dg2:   .dsd mem, base=acc, len=2, stride=1
.text
.task 20, main
main:   ldsd d0, dacc(r0)
        ldsd d1, dx(r0)
        ldsd d2, win(r0)
        ldsd d3, ddy(r0)
        ldsd d4, dg(r0)
        fmacx d0, d1, d2, 1, r3
        fdotx d4, d1, d3, 2, r4
        fmacx d0, d1, d2, 1, r5
        ldsd d5, dg2(r0)
        fmacx d5, d1, d2, 1, r6
        exit
""", (1, 2), (), [("W", 0, 1, [4, 0x3f000000, 0, 0xc0000000, 8, 0x40400000, 0xffffffff, 7,
                              0, 0x3fc00000, 0xbf800000, 4, 0x40000000, 0x3e800000, 9],
                        [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1]),
                  ("W", 0, 2, [0, 8, 4, 0xfffffffe], [0, 0, 0, 1])], [20]),
}


def directed_scenarios(config: FabricConfig = PE_CONFIG) -> list[Scenario]:
    """The directed programs: integer, binary32, vectors, fabric, tasks and indexed vectors."""
    return [_scenario(name, source, config, inputs, outputs, streams, launch)
            for name, (source, inputs, outputs, streams, launch) in _DIRECTED.items()]
