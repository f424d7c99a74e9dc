"""Dead PEs and dead links in the RTL (``docs/faults.md`` section 3.3): the
tile's ``DEAD`` host space in the Verilog and its twin in the Verilator
engine. The same kills give the same outcome as in the golden model, in
lockstep: a run that needs a dead part hangs on both with the same dead parts
reported (never a hang of the test), a run that needs none gives the same
bits and cycles as without the kills; a defect map on the Verilator device
is modelled dead."""

from __future__ import annotations

import numpy as np
import pytest

from wse.config import FabricConfig, UsageError
from wse.hdl.wavelet import HostSpace
from wse.sim.cosim.lockstep import Lockstep
from wse.sim.defects import defect_factory, parse_defects, plan_remap
from wse.sim.golden import Fabric, FabricHang
from wse.sim.runner import run_kernel

MESH = FabricConfig(width=2, height=2)
MESH3 = FabricConfig(width=3, height=3)


@pytest.fixture(scope="module")
def verilator_fabric():
    from wse.sim.cosim.verilator import VerilatorFabric
    return VerilatorFabric


def _killing(factory, kills, record: dict, prepare=None):
    """A device maker: golden and RTL in lockstep, ``kills`` (``kill`` arguments)
    applied before the first run, and ``prepare(pair)`` if given."""

    class Killed(Lockstep):
        def run(self, max_cycles=None):
            if "pair" not in record:
                record["pair"] = self
                for args in kills:
                    self.kill(*args)
                if prepare is not None:
                    prepare(self)
            return super().run(max_cycles)

    return lambda cfg: Killed(Fabric(cfg, trace=True), factory(cfg), check_emits=True)


def _device_report(pair) -> list[str]:
    """The RTL device's hang report after a run that hung on both (the lockstep raised the reference's)."""
    return pair.device._report()


def test_a_dead_pe_hangs_both_with_the_same_report(verilator_fabric):
    record: dict = {}
    with pytest.raises(FabricHang) as err:      # raised only when both hang with the same dead parts
        run_kernel("gemv", MESH, 0, device=_killing(verilator_fabric, [(1, 1)], record), rows=8, cols=8)
    report = _device_report(record["pair"])
    assert report[0] == "PE (1, 1) is dead" and "PE (1, 1) is dead" in err.value.report
    assert any(line.startswith("PE (1, 1) is dead: its task ") and line in err.value.report for line in report)


def test_a_dead_link_hangs_both_with_the_same_report(verilator_fabric):
    record: dict = {}
    with pytest.raises(FabricHang):
        run_kernel("broadcast", MESH, 0, device=_killing(verilator_fabric, [(0, 0, "E"), (0, 1, "E")], record),
                   variant="row", n=8)
    assert _device_report(record["pair"])[:2] == ["the link between routers (0, 0) and (1, 0) is dead",
                                                  "the link between routers (0, 1) and (1, 1) is dead"]


@pytest.mark.parametrize("config,kills", [(MESH, [(0, 0, "S"), (1, 0, "S")]),
                                          (MESH3, [(0, 0, "S"), (1, 1, "S"), (2, 1, "N")])])
def test_dead_links_that_nothing_uses_change_nothing(verilator_fabric, config, kills):
    clean = run_kernel("broadcast", config, 0, variant="row", n=8)
    record: dict = {}
    report = run_kernel("broadcast", config, 0, device=_killing(verilator_fabric, kills, record), variant="row", n=8)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]   # lockstep: same bits and cycles on both


def test_a_dead_pe_and_link_on_a_3x3_mesh_hang_both_alike(verilator_fabric):
    record: dict = {}
    with pytest.raises(FabricHang):
        run_kernel("gemv", MESH3, 1, device=_killing(verilator_fabric, [(2, 2), (0, 1, "E")], record), rows=9, cols=9)
    assert _device_report(record["pair"])[:2] == ["PE (2, 2) is dead",
                                                  "the link between routers (0, 1) and (1, 1) is dead"]


@pytest.mark.parametrize("kernel,sizes", [("gemv", dict(rows=12, cols=10)), ("reduce", dict(variant="column", n=8))])
def test_a_defect_map_on_the_verilator_device_is_modelled_dead(verilator_fabric, kernel, sizes):
    remap = plan_remap(parse_defects("1,1", 3, 3))
    perfect = FabricConfig(width=remap.width, height=remap.height)
    pairs = []

    def lockstep(cfg):
        pairs.append(Lockstep(Fabric(cfg), verilator_fabric(cfg)))
        return pairs[-1]

    clean = run_kernel(kernel, perfect, 2, **sizes)
    report = run_kernel(kernel, perfect, 2, device=defect_factory(lockstep, remap), **sizes)
    assert report["bit_exact"] and clean["bit_exact"]
    rtl = pairs[0].device
    assert int(rtl._read(HostSpace.DEAD, [0], 1, 1)[0]) == 1 << 4     # the PE is dead in the RTL, not merely unused


def test_kills_read_back_and_survive_a_reset(verilator_fabric):
    fab = verilator_fabric(MESH)
    fab.kill(1, 0)
    fab.kill(0, 0, "S")

    def masks():
        return {(x, y): int(fab._read(HostSpace.DEAD, [0], x, y)[0]) for y in range(2) for x in range(2)}

    expected = {(0, 0): 1 << 2, (1, 0): 1 << 4, (0, 1): 1 << 0, (1, 1): 0}
    assert masks() == expected
    fab.reset()
    assert masks() == expected


def test_kill_rejects_bad_input_like_golden(verilator_fabric):
    fab, golden = verilator_fabric(MESH), Fabric(MESH)
    for args in [(2, 0), (0, 0, "N"), (1, 0, "E"), (0, 0, "RAMP"), (0, 0, "Q")]:
        with pytest.raises(UsageError) as want:
            golden.kill(*args)
        with pytest.raises(UsageError) as got:
            fab.kill(*args)
        assert str(got.value) == str(want.value)


@pytest.mark.slow
def test_the_full_rtl_mesh_under_icarus_kills_like_golden():
    """The tile's DEAD register in the Verilog (hdl/tile.py), through the icarus
    device's proxy: a dead PE and a dead link hang both alike (the same dead
    parts reported),
    an unused dead link changes nothing, and a memory flip and a link flip
    pass through the proxy, corrected and counted alike."""
    from wse.sim.cosim.icarus import IcarusFabric

    with IcarusFabric(MESH) as icarus:
        with pytest.raises(FabricHang):
            run_kernel("gemv", MESH, 0, device=_killing(lambda cfg: icarus, [(1, 1)], {}), rows=8, cols=8)
    with IcarusFabric(MESH) as icarus:
        with pytest.raises(FabricHang, match=r"the link between routers \(0, 1\) and \(1, 1\) is dead"):
            run_kernel("broadcast", MESH, 0, device=_killing(lambda cfg: icarus, [(0, 1, "E")], {}),
                       variant="row", n=8)
    with IcarusFabric(MESH) as icarus:
        clean = run_kernel("broadcast", MESH, 0, variant="row", n=8)
        record: dict = {}
        report = run_kernel("broadcast", MESH, 0, device=_killing(lambda cfg: icarus, [(0, 0, "S"), (1, 0, "S")],
                                                                   record), variant="row", n=8)
        assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    with IcarusFabric(MESH) as icarus:
        record = {}

        def flips(pair):
            pair.inject_random(np.random.default_rng(5), 4)      # memory flips: counters compared in every check
            pair.inject_link(0, 0, "E", [7])

        report = run_kernel("broadcast", MESH, 0, device=_killing(lambda cfg: icarus, [(0, 0, "S")], record, flips),
                            variant="row", n=8)
        assert report["bit_exact"] and report["cycles"] == clean["cycles"]
        assert int(record["pair"].link_ecc_counters()["corrected"][0, 0, 1]) == 1


def test_kernel_command_kills_a_link_on_the_verilator_backend(verilator_fabric):
    from wse.sim.runner import main

    with pytest.raises(FabricHang, match=r"^the fabric stopped making progress at cycle \d+ before becoming idle\n"
                                         r"  the link between routers \(0, 0\) and \(1, 0\) is dead\n"):
        main(["broadcast", "--variant", "row", "--mesh", "2x2", "--n", "8", "--backend", "verilator",
              "--inject", "dead:0,0,E"])
