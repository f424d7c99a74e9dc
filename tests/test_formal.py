"""The router's formal properties (``hdl/formal.py``, ``docs/faults.md`` section 2).

A short bounded model check of the router as built must pass, and a
k-induction proof (unbounded) on a small configuration must close; each
planted bug must make the bounded check fail, with the properties alone too;
without the strengthening invariants induction must not close, and a wrong
invariant must fail. The payload-window abstraction's premise (no decision
reads the payload, each payload bit travels alone) is checked on the
router's netlist, and a router that breaks it is caught. The router's FIFO
must give ``SyncFIFO``'s Verilog. ``make formal`` runs the unbounded proofs
on the whole payload.
"""

import re
import shutil

import pytest
from amaranth.back import verilog
from amaranth.hdl import Assert
from amaranth.lib.fifo import SyncFIFO

from wse.config import FabricConfig, UsageError
from wse.hdl.fifo import RouterFIFO
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


def test_router_properties_proved_unbounded_by_induction():
    result = prove(CFG, 2, induction=True, bits=1, lsb=0)
    assert result["bmc"] and result["induction"], result["log"][-3000:]
    assert result["k"] == 1


def test_induction_on_ctrl_bit_three_colors_odd_depth():
    # The ctrl bit (payload bit 32) through a window, an odd number of colors, and depth 3: the FIFO's
    # pointers wrap by a compare, not by overflow.
    result = prove(FabricConfig(colors=3, router_depth=3), 2, induction=True, bits=2, lsb=PAYLOAD_BITS - 2)
    assert result["bmc"] and result["induction"] and result["k"] == 1, result["log"][-3000:]


def test_induction_needs_the_invariants():
    result = prove(CFG, 3, induction=True, bits=1, invariants=False)
    assert result["bmc"] and result["induction"] is False and result["k"] is None
    assert "Induction step failed" in result["log"]


class _WrongSlot(RouterProperties):
    """A harness whose slot invariant names the wrong slot (one behind the tracked wavelet's)."""

    def _invariants(self, m, router, masks, inside, tracker):
        tracking, color, ahead, kept = tracker
        for c, fifo in enumerate(router.fifos):
            where = fifo.consume + ahead + 1
            for slot, data in enumerate(fifo.slots):
                with m.If(tracking & (color == c) & ((where == slot) | (where == slot + fifo.depth))):
                    m.d.comb += Assert(self._window(data) == kept)


def test_a_wrong_invariant_fails(monkeypatch):
    monkeypatch.setattr("wse.hdl.formal.RouterProperties", _WrongSlot)
    result = prove(CFG, 6, bits=1)
    assert not result["bmc"]


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_fails_the_proof(bug):
    # The properties alone catch each bug (with the invariants it fails too, and sooner).
    result = prove(CFG, 10, bits=1, bug=bug, invariants=False)
    assert not result["bmc"], f"planted bug {bug!r} was not caught"
    assert "model found for base case: FAIL!" in result["log"]


def _without_sources(text: str) -> str:
    return re.sub(r"\n\s*\n", "\n", re.sub(r'\(\* src = "[^"]*" \*\) ?', "", text))


@pytest.mark.parametrize("width,depth", [(33, 2), (33, 1), (7, 3), (5, 4)])
def test_router_fifo_is_syncfifo(width, depth):
    # The router's FIFO generates SyncFIFO's logic: same ports, memory, pointers and Verilog.
    ours, theirs = RouterFIFO(width=width, depth=depth), SyncFIFO(width=width, depth=depth)
    names = ["w_data", "w_en", "w_rdy", "w_level", "r_data", "r_en", "r_rdy", "r_level", "level"]
    assert _without_sources(verilog.convert(ours, ports=[getattr(ours, n) for n in names])) == \
        _without_sources(verilog.convert(theirs, ports=[getattr(theirs, n) for n in names]))


def test_router_fifo_rejects_bad_sizes():
    with pytest.raises(TypeError, match="depth must be a positive integer"):
        RouterFIFO(width=4, depth=0)


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
