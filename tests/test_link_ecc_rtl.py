"""Link ECC and link fault injection in the RTL devices against the golden
model (``docs/architecture.md`` section 3.7): random flips armed on random
links at random cycles over library kernels and weight-streaming training
phases give the same bits, cycles and link ECC counters on the golden model
and the Verilator mesh, in lockstep; a double flip stops both runs with the
same report; the full RTL mesh (``hdl/fabric.py`` with ``hdl/link_ecc.py``,
under Icarus) does the same."""

from __future__ import annotations

import numpy as np
import pytest
from test_ecc_rtl import training_step_in_lockstep

from wse.config import FabricConfig, Port, UsageError
from wse.host.runtime.device import DeviceBackend
from wse.sim.cosim.lockstep import Lockstep
from wse.sim.golden import Fabric, ecc
from wse.sim.runner import run_kernel

MESH = FabricConfig(width=2, height=2)


@pytest.fixture(scope="module")
def verilator_fabric():
    from wse.sim.cosim.verilator import VerilatorFabric
    return VerilatorFabric


def _armed_lockstep(factory, record: dict, count: int, cycles: int, flips: int = 1, seed: int = 3):
    """A device maker: golden and RTL in lockstep, random link flips armed before the first run."""

    class Armed(Lockstep):
        def run(self, max_cycles=None):
            if "pair" not in record:
                record["pair"] = self
                record["armed"] = self.inject_random_links(np.random.default_rng(seed), count, cycles, flips)
            return super().run(max_cycles)

    return lambda cfg: Armed(Fabric(cfg, trace=True), factory(cfg), check_emits=True)


@pytest.mark.parametrize("kernel,sizes,seed", [("gemv", dict(rows=12, cols=10), 3), ("axpy", dict(n=24), 4),
                                               ("gemv", dict(rows=12, cols=10), 9)])
def test_random_link_flips_in_a_kernel_match_golden(verilator_fabric, kernel, sizes, seed):
    clean = run_kernel(kernel, MESH, 3, **sizes)
    record: dict = {}
    report = run_kernel(kernel, MESH, 3, device=_armed_lockstep(verilator_fabric, record, 8, clean["cycles"],
                                                                seed=seed), **sizes)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    pair = record["pair"]
    counts = pair.link_ecc_counters()          # compared after every run and here: golden and RTL count alike
    fired = len(record["armed"]) - len(pair.reference.routers.link_flips)
    assert int(counts["corrected"].sum()) == fired and not counts["detected"].any()


def test_a_double_flip_on_a_link_stops_both_runs_with_the_same_report(verilator_fabric):
    record: dict = {}
    with pytest.raises(ecc.LinkEccError) as err:       # raised only when both runs stop with the same report
        run_kernel("gemv", MESH, 3, device=_armed_lockstep(verilator_fabric, record, 8, 40, flips=2),
                   rows=12, cols=10)
    message = str(err.value)
    assert message.startswith("the link from router (") and " at cycle " in message and "\n" not in message
    assert int(record["pair"].link_ecc_counters()["detected"].sum()) == 1


def test_link_flips_through_the_host_bus(verilator_fabric):
    pair = Lockstep(Fabric(MESH), verilator_fabric(MESH))
    for x in range(2):
        pair.set_route(x, 0, 1, Port.W, [Port.E])
    pair.stream_in("W", 0, 1, np.arange(1, 9, dtype=np.uint32))
    pair.inject_link(0, 0, "E", [37], cycle=4)          # the ctrl bit of the fourth wavelet: corrected
    assert pair.run() == 10 and pair.stream_out("E", 0, 1).tolist() == list(range(1, 9))
    assert pair.link_ecc_counters()["corrected"][0, 0].tolist() == [0, 1, 0, 0]
    pair.reset_counters()
    assert not pair.link_ecc_counters()["corrected"].any()
    pair.stream_in("W", 0, 1, np.arange(1, 9, dtype=np.uint32))
    pair.inject_link(0, 0, "E", [33, 44], cycle=6)      # color bit and parity bit: detected
    with pytest.raises(ecc.LinkEccError) as err:
        pair.run()
    assert "at cycle 6: received color 3 (as received), data 0x00000006" in str(err.value)


def test_inject_link_rejects_bad_input_like_golden(verilator_fabric):
    rtl, golden = verilator_fabric(MESH), Fabric(MESH)
    for args in [(1, 0, "E", [1]), (0, 0, "RAMP", [1]), (0, 0, "E", [45]), (0, 0, "E", [1, 2, 3]),
                 (0, 0, "S", [1], -2)]:
        messages = []
        for device in (golden, rtl):
            with pytest.raises(UsageError) as err:
                device.inject_link(*args)
            messages.append(str(err.value))
        assert messages[0] == messages[1]


class _ArmedTraining(DeviceBackend):
    """Every phase on golden and Verilator in lockstep, random link flips
    armed on both before each phase at cycles within the phase."""

    factory = None
    rng = None
    fired = 0

    def make_device(self, config):
        return Lockstep(Fabric(config), self.factory(config))

    def run_phase(self, name, weights, grads):
        self.device.inject_random_links(self.rng, 4, max(self.executable.phases[name].cycles, 1))
        pending = self.device.reference.routers.link_flips     # a flip armed again on its link replaces it
        before = len(pending)
        cycles = super().run_phase(name, weights, grads)
        _ArmedTraining.fired += before - len(pending)
        return cycles


def test_random_link_flips_over_training_phases_match_golden(verilator_fabric):
    _ArmedTraining.factory, _ArmedTraining.rng = verilator_fabric, np.random.default_rng(12)
    pair = training_step_in_lockstep(_ArmedTraining)
    counts = pair.link_ecc_counters()
    fired = _ArmedTraining.fired
    assert fired > 0 and int(counts["corrected"].sum()) == fired and not counts["detected"].any()


@pytest.mark.slow
def test_the_full_rtl_mesh_corrects_and_reports_link_flips_like_golden(tmp_path):
    """The link cases of the fault testbench on the full RTL mesh (cocotb on Verilator)."""
    from wse.sim.cosim.regress import run_suite
    cases = ["random_link_flips/kernel=gemv", "random_link_flips/kernel=reduce", "link_double_flip_stops_the_run"]
    rows = run_suite("faults", "verilator", MESH, tmp_path, params={"SIZE": 12}, testcase=cases)
    assert len(rows) == len(cases) and all(row[1] == "PASS" for row in rows), rows
