"""Link ECC in the golden model (``docs/architecture.md`` section 3.7): the
wavelet's SECDED code, flips armed on a link at a cycle, corrections counted
per link, an uncorrectable wavelet reported with link, color and cycle, and
bad input refused in one line."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from wse.config import FabricConfig, Port, UsageError
from wse.sim.golden import Fabric, ecc
from wse.sim.runner import run_kernel

MESH = FabricConfig(width=2, height=2)


def test_the_wavelet_code_corrects_one_flip_and_detects_two():
    rng = np.random.default_rng(1)
    words = [int(w) for w in rng.integers(0, 1 << ecc.WAVELET_BITS, size=64, dtype=np.int64)] + [0, (1 << 38) - 1]
    for word in words:
        check = ecc.wavelet_check(word)
        assert ecc.wavelet_decode(word, check) == (word, 0, 0)
        for bit in range(ecc.LINK_CODE_BITS):
            m, c = ecc.link_masks([bit])
            fixed, status, _ = ecc.wavelet_decode(word ^ m, check ^ c)
            assert (fixed, status) == (word, 1), bit
    for word in words[:4]:
        check = ecc.wavelet_check(word)
        for pair in itertools.combinations(range(ecc.LINK_CODE_BITS), 2):   # all 990 double flips
            m, c = ecc.link_masks(pair)
            fixed, status, syndrome = ecc.wavelet_decode(word ^ m, check ^ c)
            assert status == 2 and fixed == word ^ m, pair


def test_the_memory_code_is_the_wavelet_code_on_32_bits():
    words = np.random.default_rng(2).integers(0, 1 << 32, size=256, dtype=np.int64).astype(np.uint32)
    assert [ecc.wavelet_check(int(w)) for w in words] == ecc.encode(words).tolist()


def _pipe(cycle: int, bits, n: int = 6) -> Fabric:
    """A 2x2 golden fabric streaming ``n`` wavelets from edge W0 through
    routers (0, 0) and (1, 0) to edge E0 on color 2, a flip armed on the link
    (0, 0) -> (1, 0)."""
    fabric = Fabric(MESH)
    fabric.set_route(0, 0, 2, Port.W, [Port.E])
    fabric.set_route(1, 0, 2, Port.W, [Port.E])
    fabric.stream_in("W", 0, 2, np.arange(100, 100 + n, dtype=np.uint32), ctrl=[0, 1] * (n // 2))
    fabric.inject_link(0, 0, "E", bits, cycle)
    return fabric


@pytest.mark.parametrize("bit", [0, 17, 31, 32, 36, 37, 38, 44])
def test_a_single_flip_on_a_link_is_corrected_and_counted(bit):
    fabric = _pipe(3, [bit])
    cycles = fabric.run()
    data, ctrl = fabric.stream_out("E", 0, 2, with_ctrl=True)
    assert data.tolist() == list(range(100, 106)) and ctrl.tolist() == [0, 1] * 3
    counts = fabric.link_ecc_counters()
    assert counts["corrected"][0, 0].tolist() == [0, 1, 0, 0] and counts["corrected"].sum() == 1
    assert not counts["detected"].any()
    assert cycles == _clean_cycles()
    assert set(fabric.counters()) == {"cycles", "total_cycles", "wavelet_hops", "pe"}
    fabric.reset_counters()
    assert not fabric.link_ecc_counters()["corrected"].any()


def _clean_cycles() -> int:
    fabric = Fabric(MESH)
    fabric.set_route(0, 0, 2, Port.W, [Port.E])
    fabric.set_route(1, 0, 2, Port.W, [Port.E])
    fabric.stream_in("W", 0, 2, np.arange(100, 106, dtype=np.uint32), ctrl=[0, 1] * 3)
    return fabric.run()


@pytest.mark.parametrize("cycle", [0, 1, 4, 6])
def test_a_double_flip_stops_the_run_naming_link_color_and_cycle(cycle):
    fabric = _pipe(cycle, [0, 40])
    with pytest.raises(ecc.LinkEccError) as err:
        fabric.run()
    # Wavelet k is injected at W0 in cycle k and crosses the link in cycle k + 1.
    crossed = max(cycle, 1)
    data = (100 + crossed - 1) ^ 1
    message = str(err.value)
    assert message == (f"the link from router (0, 0) through E to router (1, 0): uncorrectable wavelet error "
                       f"(two or more flipped bits) at cycle {crossed}: received color 2 (as received), "
                       f"data {data:#010x}, ctrl {(crossed - 1) % 2}, check bits "
                       f"{ecc.wavelet_check((100 + crossed - 1) | 2 << 32 | ((crossed - 1) % 2) << 37) ^ 4:#04x}, "
                       f"syndrome {err.value.args[0].rsplit('syndrome ', 1)[1]}")
    assert isinstance(err.value, UsageError) and "\n" not in message
    assert fabric.link_ecc_counters()["detected"][0, 0].tolist() == [0, 1, 0, 0]


def test_a_flip_armed_after_the_last_wavelet_never_fires():
    fabric = _pipe(50, [3])
    fabric.run()
    assert not fabric.link_ecc_counters()["corrected"].any()
    assert fabric.routers.link_flips          # still armed for a later run


def test_link_flips_on_every_link_leave_a_kernel_bit_exact():
    clean = run_kernel("gemv", MESH, 3, rows=12, cols=10)
    record: dict = {}

    class Faulty(Fabric):
        def run(self, max_cycles=None):
            if "fabric" not in record:
                record["fabric"] = self
                for x, y, port in [(0, 0, "E"), (0, 0, "S"), (1, 0, "W"), (1, 0, "S"), (0, 1, "N"), (0, 1, "E"),
                                   (1, 1, "N"), (1, 1, "W")]:
                    self.inject_link(x, y, port, [int(Port[port]) * 7 + x + 2 * y], cycle=5)
            return super().run(max_cycles)

    report = run_kernel("gemv", MESH, 3, device=Faulty, rows=12, cols=10)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    fabric = record["fabric"]
    fired = 8 - len(fabric.routers.link_flips)
    assert fired > 0 and fabric.link_ecc_counters()["corrected"].sum() == fired


@pytest.mark.parametrize("call,message", [
    (lambda f: f.inject_link(1, 0, "E", [3]), "toward a neighbour"),
    (lambda f: f.inject_link(0, 0, "RAMP", [3]), "toward a neighbour"),
    (lambda f: f.inject_link(0, 0, "Q", [3]), "toward a neighbour"),
    (lambda f: f.inject_link(5, 0, "E", [3]), "toward a neighbour"),
    (lambda f: f.inject_link(0, 0, "E", [1, 2, 3]), "one or two distinct"),
    (lambda f: f.inject_link(0, 0, "E", [45]), "one or two distinct"),
    (lambda f: f.inject_link(0, 0, "E", [4, 4]), "one or two distinct"),
    (lambda f: f.inject_link(0, 0, "E", []), "one or two distinct"),
    (lambda f: f.inject_link(0, 0, "E", [4], cycle=-1), "integer >= 0"),
])
def test_bad_link_injections_are_one_line(call, message):
    with pytest.raises(UsageError) as err:
        call(Fabric(MESH))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_kernel_command_arms_link_and_timed_memory_flips(capsys):
    from wse.sim.runner import main, parse_inject

    assert parse_inject("link:0,1,n,7,3,40") == ("link", 0, 1, "N", 7, [3, 40])
    assert parse_inject("sram@12:1,0,3,5") == ("sram", 1, 0, 3, [5], 12)
    assert main(["gemv", "--mesh", "2x2", "--rows", "12", "--cols", "10", "--inject", "link:0,0,E,5,7",
                 "--inject", "link:1,0,S,0,40", "--inject", "sram@30:1,1,3,5"]) == 0
    out = capsys.readouterr().out
    assert "bit exact" in out and "link ECC: 2 corrected, 0 detected (per link X,Y,PORT corrected/detected: " \
        "0,0,E 1/0; 1,0,S 1/0)" in out
    with pytest.raises(ecc.LinkEccError, match=r"^the link from router \(0, 0\) through E to router \(1, 0\): "):
        main(["gemv", "--mesh", "2x2", "--rows", "12", "--cols", "10", "--inject", "link:0,0,E,5,7,41"])


@pytest.mark.parametrize("spec,what", [("link:0,0,E,5", "link:X,Y"), ("link:0,0,Q,5,1", "link:X,Y"),
                                       ("link:0,0,E,-5,1", "link:X,Y"), ("sram@:0,0,1,1", "sram"),
                                       ("link:1,0,E,5,1", "toward a neighbour"),
                                       ("link:0,0,E,5,1,2,3", "link:X,Y")])
def test_kernel_command_rejects_a_bad_link_spec(spec, what):
    from wse.sim.runner import main

    with pytest.raises(UsageError, match=what):
        main(["gemv", "--mesh", "2x2", "--inject", spec])
