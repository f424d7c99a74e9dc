"""Dead PEs and dead links in the golden model (``docs/faults.md`` section 3):
a run that needs them ends with a report naming them, never a hang; a run
that does not need them is unchanged."""

from __future__ import annotations

import pytest

from wse.config import FabricConfig, UsageError
from wse.sim.golden import Fabric, FabricHang
from wse.sim.runner import run_kernel

MESH = FabricConfig(width=2, height=2)


def _killing(*kills):
    """A golden fabric with ``kills`` (``Fabric.kill`` arguments) applied before its first run."""

    class Killed(Fabric):
        def run(self, max_cycles=None):
            for args in kills:
                self.kill(*args)
            return super().run(max_cycles)

    return Killed


def test_a_dead_pe_ends_the_run_with_a_report_naming_it():
    with pytest.raises(FabricHang) as err:
        run_kernel("gemv", MESH, 0, device=_killing((1, 1)), rows=8, cols=8)
    assert "PE (1, 1) is dead" in err.value.report


def test_a_dead_link_ends_the_run_with_a_report_naming_it():
    with pytest.raises(FabricHang) as err:
        run_kernel("broadcast", MESH, 0, device=_killing((0, 0, "E"), (0, 1, "E")), variant="row", n=8)
    text = str(err.value)
    assert "the link between routers (0, 0) and (1, 0) is dead" in text
    assert "the link to router (1, 0) is dead" in text or "waits for a wavelet" in text


def test_a_dead_link_that_nothing_uses_changes_nothing():
    clean = run_kernel("broadcast", MESH, 0, variant="row", n=8)
    report = run_kernel("broadcast", MESH, 0, device=_killing((0, 0, "S"), (1, 0, "S")), variant="row", n=8)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]


def test_kill_rejects_bad_input():
    fab = Fabric(MESH)
    for args, what in [((2, 0), "outside"), ((0, 0, "N"), "toward a neighbour"), ((1, 0, "E"), "toward a neighbour"),
                       ((0, 0, "RAMP"), "toward a neighbour"), ((0, 0, "Q"), "toward a neighbour")]:
        with pytest.raises(UsageError, match=what):
            fab.kill(*args)


def test_kernel_command_kills_a_link_and_reports_it():
    from wse.sim.runner import main

    with pytest.raises(FabricHang, match=r"the link between routers \(0, 0\) and \(1, 0\) is dead"):
        main(["broadcast", "--variant", "row", "--mesh", "2x2", "--n", "8", "--inject", "dead:0,0,E"])
    with pytest.raises(UsageError, match="--inject needs a device with fault injection .golden, verilator, icarus., not vector"):
        main(["broadcast", "--mesh", "2x2", "--backend", "vector", "--inject", "dead:1,1"])
