"""The FPU RTL (wse.hdl.fpu) against the binary32 numerics, bit for bit.

Special classes and named cases run in Amaranth's simulator; random vectors
run through the Verilator harness of wse.hdl.fpucheck.
"""

import json
import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from wse.config import UsageError
from wse.hdl import fpucheck
from wse.hdl.fpu import FPU, FPAdd, FPLt, FPMax, FPMul, FPUOp, FToI, IToF
from wse import numerics

SPECIALS = fpucheck.SPECIALS

#: Extra ftoi operands: around 0.5, 1, the int32 limits and the truncation rule.
FTOI_SPECIALS = SPECIALS + tuple(v | s for v in (
    0x3F000000, 0x3F7FFFFF, 0x3FC00000, 0x40200000, 0x4B7FFFFF, 0x4B800000, 0x4EFFFFFF,
    0x4F000000, 0x4F000001, 0x4F800000, 0x5F000000, 0x3E800000) for s in (0, 0x80000000))

#: itof operands: signs, limits, and integers whose dropped bits are exactly one half.
ITOF_SPECIALS = tuple(v & 0xFFFFFFFF for v in (
    0, 1, -1, 2, 3, 0x7FFFFFFF, -0x7FFFFFFF, -0x80000000, 0x00FFFFFF, 0x01000000,
    0x01000001, 0x01000003, -0x01000001, -0x01000003, 0x02000006, 0x0200000A, 0x7FFFFFC0,
    0x7FFFFFBF, 0x7FFFFF40, 0x7FFFFF7F, 0x40000040, 0x40000041, 0x400000C0, 0x12345678))


def ref_eval(function, vectors):
    """The numerics' answers for a list of operand tuples."""
    return [function(*vector) for vector in vectors]


def rtl_eval(block, ports, vectors):
    """Drive a combinational block with each operand tuple; return its ``result`` values."""
    results = []

    async def testbench(ctx):
        for vector in vectors:
            for port, value in zip(ports, vector):
                ctx.set(getattr(block, port), value)
            results.append(ctx.get(block.result))

    sim = Simulator(block)
    sim.add_testbench(testbench)
    sim.run()
    return results


def assert_same(vectors, rtl, ref, what):
    bad = [(tuple(f"{v:#010x}" for v in vector), f"{r:#010x}", f"{g:#010x}")
           for vector, r, g in zip(vectors, rtl, ref) if r != g]
    assert not bad, f"{what}: {len(bad)} of {len(vectors)} differ (operands, rtl, golden): {bad[:6]}"


# Special classes, every pair, in pysim -----------------------------------------

PAIRS = [(a, b) for a in SPECIALS for b in SPECIALS]


@pytest.mark.parametrize("name, make, ports, reference", [
    ("add", FPAdd, ("a", "b"), numerics.add),
    ("mul", FPMul, ("a", "b"), numerics.mul),
    ("max", FPMax, ("a", "b"), numerics.fmax),
    ("lt", FPLt, ("a", "b"), numerics.lt),
])
def test_special_pairs(name, make, ports, reference):
    assert_same(PAIRS, rtl_eval(make(), ports, PAIRS), ref_eval(reference, PAIRS), name)


def test_special_pairs_sub():
    vectors = [(a, b, 1) for a, b in PAIRS]
    assert_same(vectors, rtl_eval(FPAdd(), ("a", "b", "sub"), vectors),
                ref_eval(numerics.sub, PAIRS), "sub")


def test_special_ftoi_itof():
    ftoi_vectors = [(a,) for a in FTOI_SPECIALS]
    assert_same(ftoi_vectors, rtl_eval(FToI(), ("a",), ftoi_vectors),
                ref_eval(numerics.ftoi, ftoi_vectors), "ftoi")
    itof_vectors = [(a,) for a in ITOF_SPECIALS]
    assert_same(itof_vectors, rtl_eval(IToF(), ("a",), itof_vectors),
                ref_eval(numerics.itof, itof_vectors), "itof")


# Hand-derived cases: the RTL and the numerics both give the written answer ------

NAMED = [
    # (op, a, b, expected, why)
    ("mul", 0x3F7FFFFF, 0x00800000, 0x00800000, "2**-126 - 2**-150 ties up to the smallest normal"),
    ("mul", 0xBF7FFFFF, 0x00800000, 0x80800000, "the same, negative"),
    ("mul", 0x3F7FFFFE, 0x00800000, 0x00000000, "2**-126 - 2**-149 is subnormal: flushed"),
    ("mul", 0x3F000000, 0x80800000, 0x80000000, "-2**-127 flushes to -0"),
    ("mul", 0x7F000000, 0x40000000, 0x7F800000, "overflow to infinity"),
    ("mul", 0x7F800000, 0x80000000, 0x7FC00000, "inf * 0 is NaN"),
    ("mul", 0xFF800001, 0x3F800000, 0x7FC00000, "a signalling NaN becomes the canonical NaN"),
    ("add", 0x3F800000, 0xBF800000, 0x00000000, "x + -x is +0"),
    ("add", 0x80000000, 0x80000000, 0x80000000, "-0 + -0 is -0"),
    ("sub", 0x80000000, 0x00000000, 0x80000000, "-0 - +0 is -0"),
    ("add", 0x007FFFFF, 0x3F800000, 0x3F800000, "a subnormal operand reads as zero"),
    ("add", 0x3F800000, 0x33800000, 0x3F800000, "1 + 2**-24 ties down to even"),
    ("add", 0x3F800001, 0x33800000, 0x3F800002, "(1 + ulp) + 2**-24 ties up to even"),
    ("add", 0x7F7FFFFF, 0x73000000, 0x7F800000, "largest + half an ulp ties up to infinity"),
    ("add", 0x7F7FFFFF, 0x72FFFFFF, 0x7F7FFFFF, "below the tie stays finite"),
    ("sub", 0x00800001, 0x00800000, 0x00000000, "a subnormal difference is flushed"),
    ("add", 0x7F800000, 0xFF800000, 0x7FC00000, "inf - inf is NaN"),
    ("max", 0x80000000, 0x00000000, 0x00000000, "+0 beats -0"),
    ("max", 0x00000001, 0x80000000, 0x00000000, "a subnormal counts as +0"),
    ("max", 0x7FC00000, 0x3F800000, 0x7FC00000, "NaN wins"),
    ("lt", 0x80000000, 0x00000000, 0, "-0 < +0 is false"),
    ("lt", 0xBF800000, 0x00000001, 1, "-1 < flushed +0"),
    ("lt", 0x7FC00000, 0x7F800000, 0, "NaN compares false"),
    ("ftoi", 0x4F000000, 0, 0x7FFFFFFF, "2**31 saturates"),
    ("ftoi", 0xCF000000, 0, 0x80000000, "-2**31 is exact"),
    ("ftoi", 0xBFC00000, 0, 0xFFFFFFFF, "-1.5 truncates to -1"),
    ("ftoi", 0xFFC00000, 0, 0x00000000, "NaN gives 0"),
    ("itof", 0x01000001, 0, 0x4B800000, "2**24 + 1 ties down to even"),
    ("itof", 0x01000003, 0, 0x4B800002, "2**24 + 3 ties up to even"),
    ("itof", 0x80000000, 0, 0xCF000000, "-2**31"),
]

_BLOCKS = {
    "add": (FPAdd, ("a", "b"), numerics.add), "sub": (FPAdd, ("a", "b", "sub"), numerics.sub),
    "mul": (FPMul, ("a", "b"), numerics.mul), "max": (FPMax, ("a", "b"), numerics.fmax),
    "lt": (FPLt, ("a", "b"), numerics.lt), "ftoi": (FToI, ("a",), numerics.ftoi),
    "itof": (IToF, ("a",), numerics.itof),
}


@pytest.mark.parametrize("op, a, b, expected, why", NAMED, ids=[case[4] for case in NAMED])
def test_named_case(op, a, b, expected, why):
    make, ports, reference = _BLOCKS[op]
    arguments = (a, b) if "b" in ports else (a,)
    assert reference(*arguments) == expected, f"numerics: {why}"
    vector = arguments + (1,) if op == "sub" else arguments
    assert rtl_eval(make(), ports, [vector]) == [expected], f"rtl: {why}"


# The pipelined FPU ---------------------------------------------------------------

def fpu_reference(op, a, b, c):
    return {FPUOp.ADD: lambda: numerics.add(a, b), FPUOp.SUB: lambda: numerics.sub(a, b),
            FPUOp.MUL: lambda: numerics.mul(a, b), FPUOp.MAC: lambda: numerics.mac(c, a, b)}[op]()


def fpu_requests(count, rng):
    def operand():
        kind = rng.random()
        if kind < 0.2:
            return rng.choice(SPECIALS)
        if kind < 0.6:
            return rng.getrandbits(32)
        return numerics.f2b(rng.uniform(-4, 4))
    return [(rng.choice(list(FPUOp)), operand(), operand(), operand()) for _ in range(count)]


def run_fpu(requests, *, stall_in, stall_out, seed):
    """Stream ``requests`` through an FPU with random gaps and back-pressure.

    Returns the results in arrival order; asserts the stream rules on ``o`` on
    every cycle (a held result keeps ``valid`` and its payload).
    """
    dut = FPU()
    results = []
    source, sink = random.Random(seed), random.Random(seed + 1)

    async def producer(ctx):
        for op, a, b, c in requests:
            while source.random() < stall_in:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.payload, {"op": op, "a": a, "b": b, "c": c})
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        held, cycles = None, 0
        while len(results) < len(requests):
            ready = sink.random() >= stall_out
            ctx.set(dut.o.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if held is not None:
                assert valid and payload == held, "o changed before it was accepted"
            held = payload if valid and not ready else None
            if valid and ready:
                results.append(payload)
            cycles += 1
            assert cycles < 10 * len(requests) + 10, "FPU stopped answering"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return results


@pytest.mark.parametrize("stall_in, stall_out", [(0.0, 0.0), (0.3, 0.4), (0.0, 0.7)])
def test_fpu_stream_matches_numerics(stall_in, stall_out):
    requests = fpu_requests(300, random.Random(11))
    results = run_fpu(requests, stall_in=stall_in, stall_out=stall_out, seed=3)
    expected = [fpu_reference(*request) for request in requests]
    assert_same([r[1:] for r in requests], results, expected, "fpu")


def test_fpu_two_stage_latency_full_throughput():
    dut = FPU()
    requests = fpu_requests(20, random.Random(4))
    seen = []

    async def testbench(ctx):
        ctx.set(dut.o.ready, 1)
        for cycle in range(len(requests) + 3):
            if cycle < len(requests):
                op, a, b, c = requests[cycle]
                ctx.set(dut.i.payload, {"op": op, "a": a, "b": b, "c": c})
            ctx.set(dut.i.valid, cycle < len(requests))
            _, _, ready, valid, payload = await ctx.tick().sample(dut.i.ready, dut.o.valid, dut.o.payload)
            assert ready, "the FPU must accept a request every cycle when its output is taken"
            if valid:
                seen.append((cycle, payload))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert [cycle for cycle, _ in seen] == [k + 2 for k in range(len(requests))]
    assert [payload for _, payload in seen] == [fpu_reference(*r) for r in requests]


def test_fpu_fills_both_stages_while_held():
    dut = FPU()
    accepted = []

    async def testbench(ctx):
        ctx.set(dut.o.ready, 0)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, {"op": FPUOp.ADD, "a": 0x3F800000, "b": 0x3F800000, "c": 0})
        for _ in range(5):
            _, _, ready = await ctx.tick().sample(dut.i.ready)
            accepted.append(ready)
        assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload) == 0x40000000

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert accepted == [1, 1, 0, 0, 0]


# Random vectors through Verilator ------------------------------------------------

def test_random_vectors():
    report = fpucheck.check_fpu(100_000, seed=2024)
    assert set(report["ops"]) == set(fpucheck.OPS)
    for op, summary in report["ops"].items():
        assert summary["count"] == 100_000
        assert summary["mismatches"] == 0, (op, summary["first"])
    assert report["evals"] == 100_000 * len(fpucheck.OPS)


@pytest.mark.slow
def test_random_vectors_ten_million():
    report = fpucheck.check_fpu(10_000_000, seed=1)
    assert report["mismatches"] == 0, {op: s["first"] for op, s in report["ops"].items()}
    assert report["evals"] == 10_000_000 * len(fpucheck.OPS)


def test_checker_reports_a_corrupted_golden():
    def corrupted_add(a, b):
        out = numerics.vadd(a, b)
        out[::97] ^= 1 << 22
        return out

    report = fpucheck.check_fpu(5_000, seed=5, ops=["add", "mul"], golden={"add": corrupted_add})
    flipped = len(range(0, 5_000, 97))
    assert report["ops"]["add"]["mismatches"] == flipped
    assert report["ops"]["mul"]["mismatches"] == 0
    assert report["mismatches"] == flipped
    first = report["ops"]["add"]["first"]
    assert len(first) == 8
    for entry in first:
        a, b, rtl, golden = (int(entry[k], 16) for k in ("a", "b", "rtl", "golden"))
        assert rtl == numerics.add(a, b) and golden == rtl ^ (1 << 22)


def test_operands_are_reproducible_and_cover_hard_cases():
    a1, b1 = fpucheck.operands("mul", 20_000, np.random.default_rng(9))
    a2, b2 = fpucheck.operands("mul", 20_000, np.random.default_rng(9))
    assert a1.dtype == np.uint32 and np.array_equal(a1, a2) and np.array_equal(b1, b2)
    # The mix reaches products in [2**-126 - 2**-150, 2**-126): the flush boundary.
    with np.errstate(all="ignore"):
        exact = np.abs(numerics.vftz(a1).view(np.float32).astype(np.float64)
                       * numerics.vftz(b1).view(np.float32).astype(np.float64))
    assert np.count_nonzero((exact >= 2.0 ** -126 - 2.0 ** -150) & (exact < 2.0 ** -126)) > 20


@pytest.mark.parametrize("kwargs, message", [
    ({"count": 0}, "count must be a positive integer, not 0"),
    ({"count": 10, "seed": -1}, "seed must be a non-negative integer, not -1"),
    ({"count": 10, "ops": ["div"]}, "ops must be a non-empty list of names from add, sub"),
    ({"count": 10, "chunk": 0}, "chunk must be a positive integer, not 0"),
])
def test_check_fpu_rejects_bad_arguments(kwargs, message):
    with pytest.raises(UsageError, match=message):
        fpucheck.check_fpu(**kwargs)


def test_command_line(capsys):
    assert fpucheck.main(["--count", "2000", "--ops", "mul,itof"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["ops"]) == ["mul", "itof"] and report["mismatches"] == 0
    assert fpucheck.main(["--count", "0"]) == 2
    assert "count must be a positive integer" in capsys.readouterr().err
