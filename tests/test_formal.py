"""The router's formal properties (``hdl/formal.py``, ``docs/faults.md`` section 2).

A short bounded model check of the router as built must pass; each planted
bug must make the same check fail; the payload-window abstraction's
premise (no decision reads the payload, each payload bit travels alone) is
checked on the router's netlist, and a router that breaks it is caught.
``make formal`` runs the deeper check over every payload bit.
"""

import shutil

import pytest

from wse.config import FabricConfig, UsageError
from wse.hdl.formal import BUGS, PAYLOAD_BITS, RouterProperties, main, payload_independent, prove, tools_missing
from wse.hdl.router import Router

pytestmark = pytest.mark.skipif(shutil.which("yosys") is None,
                                reason="yosys is not installed (apt-get install -y yosys; `make formal` installs it)")

CFG = FabricConfig(colors=2, router_depth=2)
#: The default suite's bound: about 3 s with Yosys's SAT solver on one payload bit.
SHORT = 12


def test_router_properties_hold_to_short_bound():
    result = prove(CFG, SHORT, bits=1, lsb=0)
    assert result["bmc"], result["log"][-3000:]


def test_router_properties_hold_on_ctrl_bit_and_three_colors():
    # The ctrl bit (payload bit 32) through a window, and a router with an odd number of colors.
    result = prove(FabricConfig(colors=3, router_depth=1), 8, bits=2, lsb=PAYLOAD_BITS - 2)
    assert result["bmc"], result["log"][-3000:]


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_fails_the_proof(bug):
    result = prove(CFG, 10, bits=1, bug=bug)
    assert not result["bmc"], f"planted bug {bug!r} was not caught"
    assert "model found for base case: FAIL!" in result["log"]


def test_payload_is_never_read_and_bits_travel_alone():
    payload_independent(CFG)


class _PeekingRouter(Router):
    """A router whose port N stalls when data bit 5 of its input on port N is set: control reads the payload."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.rx[0].payload.data[5]):
            m.d.comb += self.tx[0].valid.eq(0)
        return m


def test_payload_check_catches_a_router_that_reads_data():
    with pytest.raises(RuntimeError, match="rx__0__payload_5"):
        payload_independent(CFG, router=_PeekingRouter(CFG))


def test_bad_arguments_are_usage_errors(capsys):
    with pytest.raises(UsageError, match="payload window"):
        RouterProperties(CFG, bits=4, lsb=PAYLOAD_BITS - 2)
    with pytest.raises(UsageError, match="bug must be one of"):
        RouterProperties(CFG, bug="melt")
    with pytest.raises(UsageError, match="depth must be a positive integer"):
        prove(CFG, 0)
    with pytest.raises(UsageError, match="solver must be one of"):
        prove(CFG, 4, solver="minisat")
    assert main(["--bits", "40", "--depth", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: payload window")


def test_tools_missing_names_the_tool():
    assert tools_missing("sat") is None
    missing = tools_missing("z3")
    assert missing is None or "not found" in missing
