"""The pending-scrub buffer of the PE's data memory (``hdl/pe_ecc.py``, the golden model's slots in
``sim/golden/ecc.py``; ``docs/architecture.md`` section 4.7): corrected words wait in
:data:`~wse.sim.golden.ecc.SCRUB_SLOTS` slots for the memory's one write port, which they get in cycles
without a task. A read of a pending word sees the corrected word and counts nothing; a write of it
cancels its slot; a correction that finds every slot taken is counted but not written back (the word
stays flipped and its next read counts it again). The golden model and the Verilator-compiled RTL give
the same bits, cycles and counts."""

from __future__ import annotations

import numpy as np
import pytest

from wse.config import FabricConfig
from wse.firmware.asm import assemble
from wse.sim.golden import Fabric, ecc

MESH = FabricConfig(width=2, height=2)

# Task 0 reads A (words 100..107) three times with fadd, which writes C every cycle, so no pending scrub
# drains during the task; between the second and the third it overwrites A[0]. Task 1 (activated by task 0,
# selected in the cycle after its exit, which drains one slot) reads A once more.
SOURCE = """
        .data
dA:     .dsd mem, base=100, len=8
dB:     .dsd mem, base=200, len=8
dC:     .dsd mem, base=300, len=8
        .org 100
        .float 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0
        .org 200
        .float 0.5, 0.25, 0.125, 1.5, 2.5, 3.5, 4.5, 5.5
        .text
first:
        ldsd    d0, dA(r0)
        ldsd    d1, dB(r0)
        ldsd    d2, dC(r0)
        fadd    d2, d0, d1
        fadd    d2, d0, d1
        st      r0, 100(r0)
        fadd    d2, d0, d1
        activate 1
        exit
second:
        ldsd    d0, dA(r0)
        ldsd    d2, dC(r0)
        fmov    d2, d0
        exit
        .task 0, first
        .task 1, second
"""

#: Counts of PE (0, 0) with single flips in A[0..5] (and one armed in A[6] at cycle 0):
#: first fadd: A0..A3 take the 4 slots, A4 and A5 find none (6); second: A0..A3 pending, not counted, A4 and
#: A5 again (8); st cancels A0's slot; third: A4 takes it, A5 finds none (10); task 1's select cycle drains
#: the lowest slot (A4's), A5 takes it (11). The flip armed at cycle 0 waits for a cycle without a task that
#: starts none: after task 1; the host's read counts it (12).
IN_RUN, AFTER_HOST_READS = 11, 12


def _prepare(device):
    program = assemble(SOURCE, filename="scrub.s", config=MESH)
    device.load(program)
    for k in range(6):
        device.inject(0, 0, 100 + k, [5 * k + 2])            # data and check bits
    device.inject(0, 0, 106, [7], cycle=0)
    device.launch(0)


def test_the_golden_model_counts_by_the_slots():
    from wse.hdl.pe_ecc import SCRUB_SLOTS

    assert SCRUB_SLOTS == ecc.SCRUB_SLOTS == 4          # the counts below are for four slots
    fabric = Fabric(MESH)
    _prepare(fabric)
    fabric.run()
    assert fabric.ecc_counters()["corrected"].tolist() == [[IN_RUN, 0], [0, 0]]
    pe = fabric.pe(0, 0)
    assert sorted(ecc.pending(pe)) == [106] and pe.timed_flip is None   # A5 scrubbed; the armed flip landed
    out = fabric.memcpy_d2h(100, 8)[0, 0].view(np.float32)
    assert out.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert fabric.ecc_counters()["corrected"].tolist() == [[AFTER_HOST_READS, 0], [0, 0]]
    assert fabric.memcpy_d2h(300, 8)[0, 0].view(np.float32).tolist() == out.tolist()


def test_a_run_with_more_flips_than_slots_matches_golden():
    from wse.sim.cosim.verilator import VerilatorFabric

    devices = (Fabric(MESH), VerilatorFabric(MESH))
    for device in devices:
        _prepare(device)
    cycles = [device.run() for device in devices]
    assert cycles[0] == cycles[1]
    # Host reads of words still pending in the RTL right after the run (read before anything else clocks
    # the PE, the last slots first): the bypass gives the corrected word and counts nothing.
    for addr in (103, 102, 101, 104):
        words = [device.memcpy_d2h(addr, 1) for device in devices]
        assert np.array_equal(words[0], words[1])
    counts = [device.ecc_counters() for device in devices]
    assert counts[0]["corrected"].tolist() == counts[1]["corrected"].tolist() == [[IN_RUN, 0], [0, 0]]
    memories = [device.memcpy_d2h(0, MESH.sram_words) for device in devices]
    assert np.array_equal(memories[0], memories[1])
    counts = [device.ecc_counters() for device in devices]
    assert counts[0]["corrected"].tolist() == counts[1]["corrected"].tolist() == [[AFTER_HOST_READS, 0], [0, 0]]
    assert not counts[1]["detected"].any()
    # A second run from the same state: every slot drained before it, the same counts again.
    for device in devices:
        device.launch(0)
    assert devices[0].run() == devices[1].run()
    assert [d.ecc_counters()["corrected"].tolist() for d in devices] == [[[AFTER_HOST_READS, 0], [0, 0]]] * 2


@pytest.mark.parametrize("seed", [3, 8])
def test_many_random_flips_in_a_kernel_match_golden(seed):
    """More flipped words per PE than slots, in kernels whose vectors write every cycle."""
    from wse.sim.cosim.lockstep import Lockstep
    from wse.sim.cosim.verilator import VerilatorFabric
    from wse.sim.runner import run_kernel

    record: dict = {}

    class Faulty(Lockstep):
        def run(self, max_cycles=None):
            if "pair" not in record:
                record["pair"] = self
                record["words"] = self.inject_random(np.random.default_rng(seed), 24)
            return super().run(max_cycles)

    clean = run_kernel("gemv", MESH, 3, rows=12, cols=10)
    report = run_kernel("gemv", MESH, 3, device=lambda cfg: Faulty(Fabric(cfg), VerilatorFabric(cfg)),
                        rows=12, cols=10)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    counts = record["pair"].ecc_counters()                  # compared on both
    assert int(counts["corrected"].sum()) >= record["words"] and not counts["detected"].any()


# fmacw with memory weights (two chunks: two weights), dot, fsum, ld and fmacs on flipped words: the golden
# model's reads in the RTL's port order (a, destination, weight) decide which words get the slots.
MIXED = """
        .data
dA:     .dsd mem, base=100, len=8
dB:     .dsd mem, base=200, len=8
dC:     .dsd mem, base=300, len=4
dW:     .dsd mem, base=400, len=2
        .org 100
        .float 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0
        .org 200
        .float 0.5, 0.25, 0.125, 1.5, 2.5, 3.5, 4.5, 5.5
        .org 300
        .float 10.0, 20.0, 30.0, 40.0
        .org 400
        .float 0.75, -1.25
        .text
start:
        ldsd    d0, dA(r0)
        ldsd    d1, dB(r0)
        ldsd    d2, dC(r0)
        ldsd    d3, dW(r0)
        fmacw   d2, d0, d3
        dot     r5, d0, d1
        fsum    r6, d1
        ld      r7, 101(r0)
        fmacs   d2, d0, d1, r7
        st      r5, 500(r0)
        st      r6, 501(r0)
        exit
        .task 0, start
"""


@pytest.mark.parametrize("flipped", [[100, 101, 300, 400, 401], [100, 101, 102, 103, 104, 105, 106, 107, 200, 201,
                                                                   202, 300, 301, 400, 401]])
def test_weights_dots_and_sums_on_flipped_words_match_golden(flipped):
    from wse.sim.cosim.lockstep import Lockstep
    from wse.sim.cosim.verilator import VerilatorFabric

    pair = Lockstep(Fabric(MESH), VerilatorFabric(MESH))
    pair.load(assemble(MIXED, filename="mixed.s", config=MESH))
    for k, addr in enumerate(flipped):
        pair.inject(1, 1, addr, [(7 * k + 3) % 39])
    pair.launch(0)
    pair.run()          # bits, registers, memory, cycles and ECC counts compared
    counts = pair.ecc_counters()
    assert int(counts["corrected"][1, 1]) >= len(flipped) and int(counts["corrected"].sum()) == counts["corrected"][1, 1]
    clean = Fabric(MESH)
    clean.load(assemble(MIXED, filename="mixed.s", config=MESH))
    clean.launch(0)
    clean.run()
    assert np.array_equal(pair.memcpy_d2h(0, 512)[1, 1], clean.memcpy_d2h(0, 512)[1, 1])


def test_a_reset_keeps_the_pending_scrubs_as_it_keeps_the_memory():
    from wse.hdl.wavelet import HostSpace
    from wse.sim.cosim.verilator import VerilatorFabric

    device = VerilatorFabric(MESH)
    device.memcpy_h2d(0, np.arange(1, 9, dtype=np.uint32))
    device.inject(0, 0, 5, [4])
    device.inject(0, 0, 6, [36])
    # Bus requests to PE (0, 0) alone: two reads correct words 5 and 6; in the next two cycles their scrubs
    # take slots, and a host write keeps the second cycle from draining one: two pending at the reset (its
    # cycle drains one through the write port; the other must survive it).
    assert device._read(HostSpace.SRAM, [5, 6], 0, 0).tolist() == [6, 7]
    device._write(HostSpace.SRAM, [0], 1, 0, 0)
    device.reset()                                      # counters zeroed, memory and pending scrubs kept
    assert device.memcpy_d2h(0, 8)[0, 0].tolist() == list(range(1, 9))
    assert not device.ecc_counters()["corrected"].any()


# Task 0 reads a double-flipped word (an EccError); six single flips in the words after it are not read.
AFTER_DETECT = """
        .data
        .org 100
        .word 1, 2, 3, 4, 5, 6, 7, 8
        .text
start:
        ld      r5, 100(r0)
        exit
        .task 0, start
"""


def test_host_reads_after_a_run_stopped_by_an_ecc_error_scrub_at_once():
    """Slots are taken only inside a run: after a run that raised, a host read of more flipped words than
    slots corrects and counts each once, and a second read counts nothing."""
    from wse.sim.cosim.verilator import VerilatorFabric

    devices = (Fabric(MESH), VerilatorFabric(MESH))
    for device in devices:
        device.load(assemble(AFTER_DETECT, filename="detect.s", config=MESH))
        for k in range(6):
            device.inject(0, 0, 101 + k, [k + 1])
        device.inject(0, 0, 100, [3, 9])
        device.launch(0)
        with pytest.raises(ecc.EccError):
            device.run()
    for device in devices:
        for _ in range(2):
            assert device.memcpy_d2h(101, 7)[0, 0].tolist() == [2, 3, 4, 5, 6, 7, 8]
            assert device.ecc_counters()["corrected"].tolist() == [[6, 0], [0, 0]]
        assert device.ecc_counters()["detected"].tolist() == [[1, 0], [0, 0]]
    messages = []
    for device in devices:           # the host's read names the PE alone: no task runs
        with pytest.raises(ecc.EccError) as error:
            device.memcpy_d2h(100, 1)
        messages.append(str(error.value))
    assert messages[0] == messages[1] and messages[0].startswith("PE (0, 0): uncorrectable")
    pe = devices[0].pe(0, 0)
    assert pe.scrub == [None] * ecc.SCRUB_SLOTS and list(ecc.pending(pe)) == [100]   # only the bad word left


# PE (0, 0): task 0 reads A[0..3] (their scrubs take the 4 slots: fmov writes every cycle), then it idles
# until PE (1, 0)'s wavelet, about 80 cycles later, starts task 1, which reads A[4..7]. The idle gap drains
# the slots, so task 1's corrections find free ones.
IDLE_GAP_0 = """
        .data
dA:     .dsd mem, base=100, len=4
dB:     .dsd mem, base=104, len=4
dC:     .dsd mem, base=300, len=4
        .text
first:
        ldsd    d0, dA(r0)
        ldsd    d2, dC(r0)
        fmov    d2, d0
        exit
second:
        ldsd    d0, dB(r0)
        ldsd    d2, dC(r0)
        fmov    d2, d0
        exit
        .task 0, first
        .data_task 2, second
"""
IDLE_GAP_1 = """
        .text
start:
        li      r1, 40
loop:
        addi    r1, r1, -1
        bne     r1, r0, loop
        li      r3, 7
        send    r3, 2
        exit
        .task 0, start
"""


def test_the_idle_gap_after_a_reset_drains_the_slots():
    """Flips injected before a device reset survive it with the memory: the PE still drains its slots in
    cycles without a task, so every flipped word is counted once, as in a fabric that was never reset."""
    from wse.config import Port
    from wse.sim.cosim.verilator import VerilatorFabric

    first, second = (assemble(s, filename=f"gap{k}.s", config=MESH) for k, s in enumerate((IDLE_GAP_0, IDLE_GAP_1)))
    results = []
    for device in (Fabric(MESH), VerilatorFabric(MESH)):
        device.load(first, rect=(0, 0, 1, 1))
        device.load(second, rect=(1, 0, 1, 1))
        device.memcpy_h2d(100, np.arange(1, 9, dtype=np.uint32).reshape(1, 1, 8), rect=(0, 0, 1, 1))
        for k in range(8):
            device.inject(0, 0, 100 + k, [k + 1])
        if isinstance(device, VerilatorFabric):
            device.reset()                              # memory, flips and pending scrubs kept
            device.load(first, rect=(0, 0, 1, 1), keep=[(100, 108)])
            device.load(second, rect=(1, 0, 1, 1))
        device.set_route(1, 0, 2, Port.RAMP, [Port.W])
        device.set_route(0, 0, 2, Port.E, [Port.RAMP])
        device.launch(0, rect=(0, 0, 2, 1))
        cycles = device.run()
        in_run = int(device.ecc_counters()["corrected"][0, 0])
        words = device.memcpy_d2h(100, 8)[0, 0].tolist()
        results.append((cycles, in_run, int(device.ecc_counters()["corrected"][0, 0]), words))
    assert results[0] == results[1]
    assert results[0][1:] == (8, 8, list(range(1, 9)))


# fadd reads A[0] on port 0 and B[0] on port 1 in the same cycle.
SAME_CYCLE = """
        .data
dA:     .dsd mem, base=100, len=4
dB:     .dsd mem, base=200, len=4
dC:     .dsd mem, base=300, len=4
        .org 100
        .float 1.0, 2.0, 3.0, 4.0
        .org 200
        .float 0.5, 0.25, 0.125, 1.5
        .text
start:
        ldsd    d0, dA(r0)
        ldsd    d1, dB(r0)
        ldsd    d2, dC(r0)
        fadd    d2, d0, d1
        exit
        .task 0, start
"""


@pytest.mark.parametrize("bits, corrected", [([[3, 9], [5]], 0), ([[5], [3, 9]], 1)])
def test_an_uncorrectable_word_stops_the_corrections_of_the_later_ports(bits, corrected):
    """An uncorrectable word stops the read at its port: a correctable word on a later port of the same
    cycle is not counted (nor scrubbed); one on an earlier port is."""
    from wse.sim.cosim.verilator import VerilatorFabric

    devices = (Fabric(MESH), VerilatorFabric(MESH))
    for device in devices:
        device.load(assemble(SAME_CYCLE, filename="same.s", config=MESH))
        device.inject(0, 0, 100, bits[0])
        device.inject(0, 0, 200, bits[1])
        device.launch(0)
        with pytest.raises(ecc.EccError):
            device.run()
        counts = device.ecc_counters()
        assert (int(counts["corrected"][0, 0]), int(counts["detected"][0, 0])) == (corrected, 1)


def test_ld_to_r0_reads_and_corrects_its_word():
    """``ld r0`` discards the word but reads it: a flipped word is corrected and counted, as in the RTL."""
    from wse.sim.cosim.verilator import VerilatorFabric

    source = AFTER_DETECT.replace("ld      r5, 100(r0)", "ld      r0, 100(r0)\n        ld      r0, 101(r0)")
    for device in (Fabric(MESH), VerilatorFabric(MESH)):
        device.load(assemble(source, filename="ldr0.s", config=MESH))
        device.inject(0, 0, 100, [4])
        device.inject(0, 0, 101, [35])
        device.launch(0)
        device.run()
        assert device.ecc_counters()["corrected"].tolist() == [[2, 0], [0, 0]]
        assert device.registers(0, 0)[0] == 0
