"""SECDED ECC on PE memory words and memory fault injection in the golden model."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from wse.config import FabricConfig, UsageError
from wse.sim.golden import Fabric
from wse.sim.golden import ecc
from wse.sim.runner import run_kernel


def _flip(data: int, check: int, bits) -> tuple[int, int]:
    for b in bits:
        if b < ecc.DATA_BITS:
            data ^= 1 << b
        else:
            check ^= 1 << (b - ecc.DATA_BITS)
    return data, check


def test_encode_decode_random_words():
    rng = np.random.default_rng(1)
    words = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    check = ecc.encode(words)
    assert check.dtype == np.uint32 and int(check.max()) < 2**7
    data, c, status, syndrome = ecc.decode(words, check)
    assert np.array_equal(data, words) and np.array_equal(c, check)
    assert not status.any() and not syndrome.any()
    # The code is linear: the check bits of a XOR b are those of a XOR those of b.
    assert np.array_equal(ecc.encode(words[:-1] ^ words[1:]), check[:-1] ^ check[1:])
    # Every code word differs from every other in at least 4 bits (SECDED's minimum distance).
    one = np.uint32(1) << np.arange(32, dtype=np.uint32)
    weight = np.bitwise_count(one) + np.bitwise_count(ecc.encode(one))
    assert int(weight.min()) >= 3   # single data bit: itself plus >= 2 check bits (parity makes it even)
    assert np.all(weight % 2 == 0)


@pytest.mark.parametrize("word", [0, 0xFFFFFFFF, 0x3F800000, 0xDEADBEEF, 0x00000001])
def test_every_single_flip_is_corrected(word):
    check = int(ecc.encode(np.uint32(word)))
    flips = [_flip(word, check, [b]) for b in range(ecc.CODE_BITS)]
    data, c, status, _ = ecc.decode([f[0] for f in flips], [f[1] for f in flips])
    assert np.all(status == 1)
    assert np.all(data == word) and np.all(c == check)


@pytest.mark.parametrize("word", [0, 0xFFFFFFFF, 0x3F800000, 0xDEADBEEF])
def test_every_double_flip_is_detected(word):
    check = int(ecc.encode(np.uint32(word)))
    pairs = list(itertools.combinations(range(ecc.CODE_BITS), 2))
    flips = [_flip(word, check, p) for p in pairs]
    data, c, status, syndrome = ecc.decode([f[0] for f in flips], [f[1] for f in flips])
    assert len(pairs) == 741 and np.all(status == 2)
    assert np.all(syndrome != 0)
    # An uncorrectable word comes back as stored, never "corrected" into a wrong one.
    assert np.array_equal(data, [f[0] for f in flips]) and np.array_equal(c, [f[1] for f in flips])


def test_host_reads_and_writes_through_ecc():
    fab = Fabric(FabricConfig(width=2, height=2))
    fab.memcpy_h2d(10, np.arange(1, 9, dtype=np.uint32))
    fab.inject(1, 0, 12, [5])                # a data bit
    fab.inject(1, 0, 13, [35])               # a check bit
    fab.inject(0, 1, 14, [0, 1])             # two flips, then overwritten: never seen
    fab.memcpy_h2d(14, np.zeros(1, dtype=np.uint32), rect=(0, 1, 1, 1))
    out = fab.memcpy_d2h(10, 8)
    assert np.array_equal(out[0, 1], np.arange(1, 9))
    counts = fab.ecc_counters()
    assert counts["corrected"].tolist() == [[0, 2], [0, 0]] and not counts["detected"].any()
    # Scrubbed: a second read counts nothing more; the PE is back on its plain array.
    fab.memcpy_d2h(10, 8)
    assert fab.ecc_counters()["corrected"].sum() == 2
    assert type(fab.pe(1, 0).mem) is np.ndarray and not ecc.pending(fab.pe(1, 0))
    fab.inject(1, 1, 11, [3, 36])
    with pytest.raises(ecc.EccError, match=r"PE \(1, 1\).*data address 11.*syndrome"):
        fab.memcpy_d2h(11, 1, rect=(1, 1, 1, 1))
    assert fab.ecc_counters()["detected"].tolist() == [[0, 0], [0, 1]]
    fab.reset_counters()
    assert not fab.ecc_counters()["corrected"].any() and not fab.ecc_counters()["detected"].any()


def test_inject_rejects_bad_input():
    fab = Fabric(FabricConfig(width=2, height=2))
    for args, what in [((2, 0, 0, [1]), "outside"), ((0, 0, -1, [1]), "leaves memory"),
                       ((0, 0, 0, [39]), "bits"), ((0, 0, 0, [1, 1]), "bits"), ((0, 0, 0, []), "bits")]:
        with pytest.raises(UsageError, match=what):
            fab.inject(*args)


def _faulty(flips_per_word: int, record: dict):
    """A golden fabric that, at its first run (the kernel loaded, its data
    written), flips ``flips_per_word`` bits of the last non-zero word of
    every PE: a weight the kernel reads."""

    class Faulty(Fabric):
        injected = False

        def run(self, max_cycles=None):
            if not Faulty.injected:
                Faulty.injected = True
                record["fabric"] = self
                rng = np.random.default_rng(7)
                for pe in self.pes:
                    addr = int(np.flatnonzero(pe.mem)[-1])
                    bits = rng.choice(ecc.CODE_BITS, size=flips_per_word, replace=False).tolist()
                    self.inject(pe.x, pe.y, addr, bits)
                    record.setdefault("places", []).append((pe.x, pe.y, addr))
            return super().run(max_cycles)

    return Faulty


def test_single_flips_in_a_running_kernel_leave_it_bit_exact():
    config = FabricConfig(width=4, height=4)
    clean = run_kernel("gemv", config, seed=3, rows=24, cols=20)
    record: dict = {}
    report = run_kernel("gemv", config, seed=3, device=_faulty(1, record), rows=24, cols=20)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    counts = record["fabric"].ecc_counters()
    assert counts["corrected"].tolist() == [[1] * 4] * 4 and not counts["detected"].any()


def test_a_double_flip_in_a_running_kernel_is_reported_with_its_place():
    config = FabricConfig(width=2, height=2)
    record: dict = {}
    with pytest.raises(ecc.EccError) as err:
        run_kernel("gemv", config, seed=3, device=_faulty(2, record), rows=8, cols=8)
    message = str(err.value)
    assert "\n" not in message and "uncorrectable memory error" in message
    named = [p for p in record["places"] if f"PE ({p[0]}, {p[1]})" in message and f"address {p[2]}:" in message]
    assert len(named) == 1 and " pc " in message
    assert record["fabric"].ecc_counters()["detected"].sum() == 1


def test_kernel_command_injects_and_prints_the_counters(capsys):
    from wse.sim.runner import main, parse_inject

    assert parse_inject("sram:1,0,3,5,36") == ("sram", 1, 0, 3, [5, 36])
    assert parse_inject("random:4,9") == ("random", 4, 9)
    assert main(["gemv", "--mesh", "2x2", "--rows", "12", "--cols", "10", "--inject", "random:6,2",
                 "--inject", "sram:1,1,0,37"]) == 0
    out = capsys.readouterr().out
    assert "bit exact" in out and "memory ECC: " in out and ", 0 detected (per PE corrected/detected" in out
    corrected = int(out.split("memory ECC: ")[1].split()[0])
    assert 1 <= corrected <= 7       # a flip in a word the kernel overwrites before reading is never seen
    report = run_kernel("gemv", FabricConfig(width=2, height=2), 0, inject=[("random", 6, 2)], rows=12, cols=10)
    assert report["bit_exact"] and sum(map(sum, report["ecc"]["corrected"])) >= 1
    clean = run_kernel("gemv", FabricConfig(width=2, height=2), 0, rows=12, cols=10)
    assert report["cycles"] == clean["cycles"] and "ecc" not in clean


@pytest.mark.parametrize("spec,what", [("sram:1,1,3", "--inject must be"), ("random:0,1", "--inject must be"),
                                       ("flash:1,2", "--inject must be"), ("sram:1,1,3,x", "--inject must be"),
                                       ("sram:1,1,3,39", "bits must be"), ("sram:5,0,3,1", "outside")])
def test_kernel_command_rejects_a_bad_inject_spec(spec, what):
    from wse.sim.runner import main

    with pytest.raises(UsageError, match=what):
        main(["gemv", "--mesh", "2x2", "--inject", spec])


def test_kernel_command_reports_a_double_flip():
    from wse.sim.runner import main

    with pytest.raises(ecc.EccError, match=r"^PE \(1, 1\) task \d+ pc \d+: uncorrectable .* address 5: "):
        main(["gemv", "--mesh", "2x2", "--inject", "sram:1,1,5,2,9"])


def test_a_memory_flip_armed_at_a_cycle_lands_when_the_pe_runs_no_task():
    clean = run_kernel("gemv", FabricConfig(width=2, height=2), 3, rows=12, cols=10)
    record: dict = {}

    class Armed(Fabric):
        def run(self, max_cycles=None):
            if "fabric" not in record:
                record["fabric"] = self
                addr = int(np.flatnonzero(self.pe(0, 0).mem)[-1])
                self.inject(0, 0, addr, [3], cycle=10)                     # lands at the end of a task
                self.inject(1, 1, addr, [3, 9], cycle=clean["cycles"] + 1)  # past the run: stays armed
            return super().run(max_cycles)

    report = run_kernel("gemv", FabricConfig(width=2, height=2), 3, device=Armed, rows=12, cols=10)
    fabric = record["fabric"]
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    assert fabric.pe(0, 0).timed_flip is None                                    # landed
    assert fabric.pe(1, 1).timed_flip is not None and not fabric.pe(1, 1).ecc_check
    fabric.memcpy_d2h(0, fabric.config.sram_words)                               # every word read: counted once
    assert fabric.ecc_counters()["corrected"].tolist() == [[1, 0], [0, 0]]
    for cycle in (-1, 1.5, True):
        with pytest.raises(UsageError, match="cycle of a memory flip"):
            fabric.inject(0, 0, 1, [3], cycle=cycle)
