"""The indexed vector instructions ``fmacx`` and ``fdotx``: the RTL PE against the golden PE,
their results against a direct computation, their cycles, and the golden model's faults.

The benches are those of ``tests/test_pe_rtl.py`` (every observable equal: memory, registers,
descriptors, counters, emitted wavelets, cycles), with the input wavelets offered at once or
late and at random.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_pe_rtl import CFG, SHALLOW, Job, asm, compare, f32, golden_runs

from wse import numerics as fp
from wse.sim.golden import Fabric
from wse.sim.golden.errors import ProgramFault

PROGRAM = """
.task 0, main
.data
x:    .float 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -0.5, 0.25, 1e30, -3
acc:  .float 0.5, -1, 2, 0.25
dy:   .float 0.5, -2, 4, 1.5
g:    .zero 6
dacc: .dsd mem, base=acc, len=4
dx:   .dsd mem, base=0, len=4
dw:   .dsd fabin, color=1, len=0
dw2:  .dsd fabin, color=2, len=0
ddy:  .dsd mem, base=dy, len=4
dg:   .dsd mem, base=g, len=1
dg2:  .dsd mem, base=acc, len=2
.text
main: ldsd d0, dacc(r0)
      ldsd d1, dx(r0)
      ldsd d2, dw(r0)
      fmacx d0, d1, d2, 1, r3     ; pairs on color 1: acc += x[idx] * w, until a control wavelet
      ldsd d4, ddy(r0)
      ldsd d5, dg(r0)
      fdotx d5, d1, d4, 2, r4     ; indices on color 2: g[m] += x[idx] . dy, m = 0, 1, ...
      ldsd d3, dw2(r0)
      fmacx d0, d1, d3, 1, r0     ; indices on color 1, values on color 2; no index at all here
      fmacx d0, d1, d3, 1, r5     ; the same with indices
      ldsd d6, dg2(r0)
      fmacx d6, d1, d2, 1, r6     ; dd shorter than da: two weights per index
      li r7, 1
      setl d1, r7
      setl d0, r7
      fmacx d0, d1, d2, 1, r7     ; one element per index
      exit
"""

X, ACC, DY, G = 0, 16, 20, 24


def _inputs():
    """Color 1: fmacx's pairs, then fdotx's end, then the indices of the third/fourth
    instructions, then pairs again; color 2: fdotx's indices, then values."""
    c1 = [(4, 0), (f32(0.5), 0), (0, 0), (f32(-2.0), 0), (12, 0), (f32(3.0), 0), (0xFFFFFFFF, 1)]
    c1 += [(0x11, 1)]                                           # the third instruction: no index
    c1 += [(8, 0), (0, 0), (0x22, 1)]                           # the fourth: two indices
    c1 += [(0, 0), (f32(1.5), 0), (f32(-1.0), 0), (12, 0), (f32(2.0), 0), (f32(0.25), 0), (0x33, 1)]
    c1 += [(2, 0), (f32(4.0), 0), (15, 0), (f32(-1.0), 0), (0x44, 1)]
    c2 = [(0, 0), (12, 0), (4, 0), (8, 0), (0x55, 1)]
    c2 += [(f32(0.125), 0), (f32(8.0), 0)]                      # the fourth instruction's values
    return {1: c1, 2: c2}


def test_fmacx_and_fdotx_rtl_equals_golden():
    program = asm(PROGRAM)
    jobs = [Job(program, inputs=_inputs()), Job(program, inputs=_inputs(), seed=3, offer_p=0.3),
            Job(program, inputs=_inputs(), seed=5, offer_p=0.6, start=40)]
    compare(CFG, jobs)
    compare(SHALLOW, [Job(program, inputs=_inputs(), seed=7, offer_p=0.5)])


ALIASED = """
.task 0, main
.data
x:    .float 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
dy:   .float 0.5, -2, 4, 1.5
dx:   .dsd mem, base=0, len=1
ddy:  .dsd mem, base=dy, len=4
.text
main: ldsd d1, dx(r0)
      ldsd d4, ddy(r0)
      fdotx d1, d1, d4, 2, r4     ; dd and da one register: each index wins over the +1
      exit
"""


def test_fdotx_with_dd_and_da_one_register_rtl_equals_golden():
    compare(CFG, [Job(asm(ALIASED), inputs={2: [(0, 0), (8, 0), (0x55, 1)]})])


def test_fmacx_and_fdotx_results_and_cycles():
    program = asm(PROGRAM)
    (run,) = golden_runs(CFG, [Job(program, inputs=_inputs())])
    x = np.array(program.data[0][1][:16], dtype=np.uint32)
    mem = np.array(run.mem, dtype=np.uint32)

    def axpy(acc, idx, w):
        return [fp.add(int(a), fp.mul(int(x[idx + i]), w)) for i, a in enumerate(acc)]
    acc = [f32(v) for v in (0.5, -1, 2, 0.25)]
    for idx, w in ((4, 0.5), (0, -2.0), (12, 3.0)):
        acc = axpy(acc, idx, f32(w))
    for idx, w in ((8, 0.125), (0, 8.0)):
        acc = axpy(acc, idx, f32(w))
    dg2 = [acc[0], acc[1]]
    for idx, ws in ((0, (1.5, -1.0)), (12, (2.0, 0.25))):  # dd of 2 words, da of 4: a weight per 2 elements
        for i in range(4):
            dg2[i % 2] = fp.add(dg2[i % 2], fp.mul(int(x[idx + i]), f32(ws[i // 2])))
    acc[0], acc[1] = dg2
    acc[0] = fp.add(acc[0], fp.mul(int(x[2]), f32(4.0)))
    acc[0] = fp.add(acc[0], fp.mul(int(x[15]), f32(-1.0)))
    assert mem[ACC:ACC + 4].tolist() == acc
    dy = [f32(v) for v in (0.5, -2, 4, 1.5)]
    for m, idx in enumerate((0, 12, 4, 8)):
        g = 0
        for i in range(4):
            g = fp.add(g, fp.mul(int(x[idx + i]), dy[i]))
        assert int(mem[G + m]) == g
    assert run.regs[3:8] == [0xFFFFFFFF, 0x55, 0x22, 0x33, 0x44]
    assert run.dsd[5][1] == G + 4                      # fdotx: dd.base past its last word
    assert run.dsd[1][1] == 15                         # da.base: the last index
    # No waiting: per index its elements + 1, per instruction + 1 (the control wavelet).
    fmacx = 3 * 5 + 1 + 1 + 2 * 5 + 1 + 2 * 5 + 1 + 2 * 2 + 1
    fdotx = 4 * 5 + 1
    other = 1 + 7 * 2 + 1 + 2 + 1     # select, 7 ldsd, li, 2 setl, exit
    assert run.counters["busy"] == fmacx + fdotx + other
    assert run.counters["stall"] == 0
    assert run.counters["fmac"] == 4 * 3 + 4 * 2 + 4 * 2 + 4 * 4 + 2
    assert run.counters["instructions"] == 7 + 6 + 3 + 1      # ldsd, indexed, li and setl, exit


@pytest.mark.parametrize("source, message", [
    ("ldsd d0, dm(r0)\n ldsd d2, dm(r0)\n fmacx d0, d0, d2, 1, r0", "fmacx needs a fabric-in descriptor"),
    ("ldsd d0, dm(r0)\n ldsd d2, df(r0)\n fdotx d0, d0, d2, 1, r0", "fdotx needs a memory descriptor"),
    ("ldsd d0, df(r0)\n ldsd d2, df(r0)\n fmacx d0, d0, d2, 1, r0", "needs memory descriptors for dd and da"),
    ("ldsd d0, dz(r0)\n ldsd d1, dz(r0)\n ldsd d2, df(r0)\n fmacx d0, d1, d2, 1, r0", "no elements per index"),
    ("ldsd d0, dm(r0)\n ldsd d1, dm(r0)\n ldsd d2, df(r0)\n fmacx d0, d1, d2, 1, r0", "leaves memory"),
])
def test_golden_faults(source, message):
    program = asm(f"""
.task 0, main
.data
dm: .dsd mem, base=0, len=4
dz: .dsd mem, base=0, len=0
df: .dsd fabin, color=1, len=0
.text
main: {source}
      exit
""")
    fab = Fabric(CFG)
    fab.load(program)
    fab.launch(0)
    fab.pe(0, 0).rx[1].extend([(62, 0), (f32(1.0), 0)])
    with pytest.raises(ProgramFault, match=message):
        fab.run(max_cycles=200)
