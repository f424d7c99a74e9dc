"""Formal properties of the router (:class:`wse.hdl.router.Router`, as built), checked with Yosys.

:class:`RouterProperties` wraps one router in a harness whose inputs are
free (the solver picks every link, ``ready`` bit, route-table write and
``first_color`` in every cycle), assumes only the link protocol of
``docs/architecture.md`` section 3.1 (a sender drives ``valid`` only for a
color whose ``ready`` bit it sees high, and only valid colors), and asserts:

* **no grant without ready**: an output link carries a wavelet only when its
  ``ready`` bit for the wavelet's color is high;
* **multicast atomic** (and routed): a color leaves only by ports of its
  route's output mask, and when it leaves by one it leaves by all of them in
  the same cycle, carrying the same wavelet;
* **no wavelet lost or duplicated, order kept**: the solver may pick any
  wavelet as it enters (one at a time, of any color) and the harness notes
  how many of its color are inside before it; after exactly that many more
  of its color have left, the next to leave carries its payload, bit for
  bit; no color leaves while none of it is inside, and never more than
  ``router_depth`` of a color are inside.

**Strengthening invariants** (``invariants=True``, asserted and so proved
along with the properties): the harness's count of a color inside equals
its FIFO's ``level``; a tracked wavelet sits in the slot ``consume + ahead``
(modulo the depth) of its color's FIFO, holding the payload the harness
kept; the harness's shadow of the route masks equals the router's table;
and the FIFO's own pointer invariants (:class:`wse.hdl.fifo.RouterFIFO`,
whose pointers and slots the harness can name). With them the properties
are 1-inductive: ``prove(..., induction=True)`` closes at ``k = 1`` and,
with the base case, proves them for every cycle of every run (unbounded).
Without them induction fails at every ``k`` tried: a state the induction
step may start from can hold in the FIFO something other than what the
scoreboard saw enter.

**The payload window.** The router never reads a payload bit to decide
anything, and each payload bit travels alone (bit ``k`` out depends only on
bit ``k`` in and on the control). :func:`payload_independent` checks both
facts on the router's own netlist (Yosys cones of influence), so a proof
with only payload bits ``[lsb, lsb + bits)`` free (the others held at zero)
proves the properties for those bits of the full router, and proofs over
windows that cover all 33 bits (32 data and ``ctrl``) prove them for the
whole wavelet. The harness's ``lsb`` and ``bits`` choose the window;
``python -m wse.hdl.formal --all-bits`` walks the windows.

**Planted bugs.** ``bug`` builds the same harness around a mutated router
(a subclass of :class:`Router`; ``hdl/router.py`` itself is untouched):
``"drop"`` loses the wavelets leaving by port N while ``first_color`` is 1,
``"duplicate"`` sends a head without popping it while ``first_color`` is 1,
``"ignore_ready"`` shows the router all-ones ``ready`` bits on port N,
``"split"`` cuts the copy on port E of a multicast while ``first_color`` is
1. Each must make the bounded check fail, with the invariants and with the
properties alone (``tests/test_formal.py``).

The harness builds the router with ``visible=True``: its FIFOs get one more
read port per slot, which only read (the logic the RTL uses is the same;
with ``visible=False`` the FIFO's Verilog is ``SyncFIFO``'s).

:func:`prove` exports the harness to Verilog (Amaranth's own Yosys), then
runs Debian's ``yosys``: by default its built-in SAT solver (``sat
-tempinduct``) for a bounded model check of ``depth`` cycles from reset and,
with ``induction``, a k-induction step for ``k`` up to ``depth``; or
``yosys-smtbmc`` with z3 (much slower here). Debian's boolector 1.5 rejects
``yosys-smtbmc``'s SMT2 (``set-option``), so it is not offered.
``python -m wse.hdl.formal`` is ``make formal`` (``docs/faults.md`` section 2).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amaranth import Cat, Const, Module, Signal
from amaranth.hdl import Assert, Assume, Elaboratable

from wse.config import COLOR_BITS, DATA_BITS, FabricConfig, UsageError

from .router import PORTS, ROUTE_BITS, Router

__all__ = ["PAYLOAD_BITS", "BUGS", "SOLVERS", "RouterProperties", "payload_independent", "prove", "tools_missing",
           "main"]

#: Payload bits of a wavelet as the router stores it: 32 data bits and ``ctrl`` (bit 32).
PAYLOAD_BITS = DATA_BITS + 1

#: The planted bugs :class:`RouterProperties` can build (see the module docstring).
BUGS = ("drop", "duplicate", "ignore_ready", "split")

#: The engines of :func:`prove`: Yosys's own SAT solver (``sat -tempinduct``) or z3 through ``yosys-smtbmc``.
SOLVERS = ("sat", "z3")


class _MutantRouter(Router):
    """A :class:`Router` with one planted bug, applied after its own elaboration."""

    def __init__(self, config: FabricConfig, bug: str):
        super().__init__(config, visible=True)
        self._bug = bug

    def elaborate(self, platform):
        m = super().elaborate(platform)
        trigger = self.first_color == 1
        if self._bug == "drop":          # the wavelet is popped but not sent on port N
            with m.If(trigger):
                m.d.comb += self.tx[0].valid.eq(0)
        elif self._bug == "split":       # a multicast loses its copy on port E
            with m.If(trigger):
                m.d.comb += self.tx[1].valid.eq(0)
        elif self._bug == "duplicate":   # the head is sent but not popped
            for fifo in self.fifos:
                with m.If(trigger):
                    m.d.comb += fifo.r_en.eq(0)
        return m


def _check_window(bits, lsb) -> None:
    for name, value, low in (("bits", bits, 1), ("lsb", lsb, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"payload window {name} must be an integer >= {low}, not {value!r}")
    if lsb + bits > PAYLOAD_BITS:
        raise UsageError(f"payload window [{lsb}, {lsb + bits}) must lie inside the {PAYLOAD_BITS} payload bits")


class RouterProperties(Elaboratable):
    """The router under free inputs, with the properties above as assertions.

    Parameters
    ----------
    config : FabricConfig
        The router's size (small ``colors`` keep the proof fast).
    bits, lsb : int
        The payload window left free: bits ``[lsb, lsb + bits)`` of the
        33-bit payload (``ctrl`` is bit 32); the other bits enter as zero.
    bug : str or None
        A planted bug from :data:`BUGS`, or None for the router as built.
    invariants : bool
        Also assert the strengthening invariants that tie the scoreboard to
        the router's state (what k-induction needs; see the module
        docstring). Without them only the properties are asserted.

    Raises
    ------
    UsageError
        If the window does not fit the payload or ``bug`` is unknown.
    """

    def __init__(self, config: FabricConfig, bits: int = PAYLOAD_BITS, lsb: int = 0, bug: str | None = None,
                 invariants: bool = True):
        self._MustUse__silence = True  # a rejected harness is not an unused one
        if not isinstance(config, FabricConfig):
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        _check_window(bits, lsb)
        if bug is not None and bug not in BUGS:
            raise UsageError(f"bug must be one of {', '.join(BUGS)}, not {bug!r}")
        self._MustUse__silence = False
        self.config, self.bits, self.lsb, self.bug = config, bits, lsb, bug
        self.invariants = bool(invariants)
        C = config.colors
        self.rx_valid = [Signal(name=f"rx{p}_valid") for p in range(PORTS)]
        self.rx_color = [Signal(COLOR_BITS, name=f"rx{p}_color") for p in range(PORTS)]
        self.rx_data = [Signal(bits, name=f"rx{p}_data") for p in range(PORTS)]
        self.tx_ready = [Signal(C, name=f"tx{p}_ready") for p in range(PORTS)]
        self.first_color = Signal(COLOR_BITS)
        self.route_we = Signal()
        self.route_color = Signal(COLOR_BITS)
        self.route_wdata = Signal(ROUTE_BITS)
        self.pick = Signal()
        self.pick_color = Signal(COLOR_BITS)

    def ports(self) -> list:
        """The free inputs, for the Verilog export."""
        return [*self.rx_valid, *self.rx_color, *self.rx_data, *self.tx_ready, self.first_color, self.route_we,
                self.route_color, self.route_wdata, self.pick, self.pick_color]

    def _payload_in(self, p: int):
        """The 33-bit payload entering port ``p``: the free window, zeros elsewhere."""
        high = PAYLOAD_BITS - self.lsb - self.bits
        parts = ([Const(0, self.lsb)] if self.lsb else []) + [self.rx_data[p]] + ([Const(0, high)] if high else [])
        return Cat(*parts)

    def _window(self, payload):
        """The free window of a 33-bit payload (data, then ``ctrl``)."""
        return payload[self.lsb:self.lsb + self.bits]

    def elaborate(self, platform):
        m = Module()
        cfg, C = self.config, self.config.colors
        router = Router(cfg, visible=True) if self.bug in (None, "ignore_ready") else _MutantRouter(cfg, self.bug)
        m.submodules.router = router
        for p in range(PORTS):
            payload = self._payload_in(p)
            ready = self.tx_ready[p]
            if self.bug == "ignore_ready" and p == 0:
                ready = Const((1 << C) - 1, C)
            m.d.comb += [router.rx[p].valid.eq(self.rx_valid[p]), router.rx[p].payload.color.eq(self.rx_color[p]),
                         router.rx[p].payload.data.eq(payload[:DATA_BITS]),
                         router.rx[p].payload.ctrl.eq(payload[DATA_BITS]),
                         router.tx[p].ready.eq(ready)]
        m.d.comb += [router.first_color.eq(self.first_color), router.route.we.eq(self.route_we),
                     router.route.color.eq(self.route_color), router.route.wdata.eq(self.route_wdata)]
        # The link protocol: valid only for a color that is ready there, and valid colors only.
        m.d.comb += Assume(self.first_color < C)
        for p in range(PORTS):
            with m.If(self.rx_valid[p]):
                m.d.comb += [Assume(self.rx_color[p] < C), Assume(router.rx[p].ready.bit_select(self.rx_color[p], 1))]

        # A shadow of the route masks, written like the router's table.
        masks = [Signal(PORTS, name=f"mask_{c}") for c in range(C)]
        with m.If(self.route_we):
            for c in range(C):
                with m.If(self.route_color == c):
                    m.d.sync += masks[c].eq(self.route_wdata[3:])
        self._grants(m, router, masks)
        self._scoreboard(m, router, masks)
        return m

    def _grants(self, m: Module, router: Router, masks: list) -> None:
        C = self.config.colors
        for p in range(PORTS):
            tx = router.tx[p]
            with m.If(tx.valid):
                m.d.comb += [Assert(self.tx_ready[p].bit_select(tx.payload.color, 1)), Assert(tx.payload.color < C)]
        for c in range(C):
            on = Cat(*(router.tx[p].valid & (router.tx[p].payload.color == c) for p in range(PORTS)))
            with m.If(on.any()):
                m.d.comb += Assert(on == masks[c])
                for p in range(PORTS):
                    for q in range(p + 1, PORTS):
                        with m.If(on[p] & on[q]):
                            m.d.comb += Assert(Cat(router.tx[p].payload.data, router.tx[p].payload.ctrl)
                                               == Cat(router.tx[q].payload.data, router.tx[q].payload.ctrl))

    def _traffic(self, m: Module, router: Router):
        """Per color: does a wavelet enter, does one leave, with which window of payload."""
        C = self.config.colors
        enter = [Signal(name=f"enter_{c}") for c in range(C)]
        leave = [Signal(name=f"leave_{c}") for c in range(C)]
        entering = [Signal(self.bits, name=f"entering_{c}") for c in range(C)]
        leaving = [Signal(self.bits, name=f"leaving_{c}") for c in range(C)]
        for c in range(C):
            for p in range(PORTS):
                with m.If(self.rx_valid[p] & (self.rx_color[p] == c)):
                    m.d.comb += [enter[c].eq(1), entering[c].eq(self.rx_data[p])]
                tx = router.tx[p]
                with m.If(tx.valid & (tx.payload.color == c)):
                    m.d.comb += [leave[c].eq(1), leaving[c].eq(self._window(Cat(tx.payload.data, tx.payload.ctrl)))]
        return enter, leave, entering, leaving

    def _scoreboard(self, m: Module, router: Router, masks: list) -> None:
        depth, C = self.config.router_depth, self.config.colors
        enter, leave, entering, leaving = self._traffic(m, router)
        # Wavelets of each color inside: never more than the FIFO holds, and none leaves from nothing.
        inside = [Signal(range(depth + 2), name=f"inside_{c}") for c in range(C)]
        for c in range(C):
            m.d.sync += inside[c].eq(inside[c] + enter[c] - leave[c])
            m.d.comb += Assert(inside[c] <= depth)
            with m.If(leave[c]):
                m.d.comb += Assert(inside[c] != 0)
        # One tracked wavelet at a time, picked freely as it enters: `ahead` of its color are inside before it.
        # After `ahead` more of its color have left, the next to leave must carry its payload.
        tracking, color = Signal(), Signal(COLOR_BITS)
        ahead, kept = Signal(range(depth + 1)), Signal(self.bits)
        with m.If(tracking):
            for c in range(C):
                with m.If((color == c) & leave[c]):
                    with m.If(ahead == 0):
                        m.d.comb += Assert(leaving[c] == kept)
                        m.d.sync += tracking.eq(0)
                    with m.Else():
                        m.d.sync += ahead.eq(ahead - 1)
        with m.Elif(self.pick):
            for c in range(C):
                with m.If((self.pick_color == c) & enter[c]):
                    m.d.sync += [tracking.eq(1), color.eq(c), kept.eq(entering[c]),
                                 ahead.eq(inside[c] - leave[c])]
        if self.invariants:
            self._invariants(m, router, masks, inside, (tracking, color, ahead, kept))

    def _invariants(self, m: Module, router: Router, masks: list, inside: list, tracker: tuple) -> None:
        """The strengthening invariants: the scoreboard's state is the router's, slot for slot."""
        depth, C = self.config.router_depth, self.config.colors
        tracking, color, ahead, kept = tracker
        for c in range(C):
            fifo = router.fifos[c]
            m.d.comb += [Assert(inside[c] == fifo.level), Assert(masks[c] == router.route_out[c])]
            with m.If(tracking & (color == c)):
                # The tracked wavelet is inside, in the slot `ahead` places behind the head.
                m.d.comb += Assert(ahead < fifo.level)
                where = fifo.consume + ahead
                for slot, data in enumerate(fifo.slots):
                    with m.If((where == slot) | (where == slot + depth)):
                        m.d.comb += Assert(self._window(data) == kept)
        with m.If(tracking):
            m.d.comb += Assert(color < C)


def tools_missing(solver: str = "sat") -> str | None:
    """None if the tools of engine ``solver`` are on ``PATH`` (``yosys``; for z3 also ``yosys-smtbmc`` and ``z3``),
    else what is missing."""
    tools = ("yosys",) if solver == "sat" else ("yosys", "yosys-smtbmc", solver)
    missing = [tool for tool in tools if shutil.which(tool) is None]
    return None if not missing else ", ".join(missing) + f" not found (apt-get install -y {' '.join(tools[::2])})"


def _data_bits(k_out: int | None) -> list[int]:
    """Payload bit numbers (data and ``ctrl``) of the router's 38-bit link payload, ``k_out`` left out."""
    bits = [*range(DATA_BITS), DATA_BITS + COLOR_BITS]
    return [b for b in bits if b != k_out]


def _union(patterns: list) -> str:
    """A yosys selection expression: the union of ``patterns``."""
    return " ".join([patterns[0], *(f"{p} %u" for p in patterns[1:])])


def payload_independent(config: FabricConfig, router: Router | None = None, workdir=None) -> None:
    """Check on the router's netlist that no decision reads a payload bit and each payload bit travels alone.

    With the router bit-blasted (``techmap``, every net split to bits), the
    input cone of every control output (``valid``, ``ready``, the outgoing
    color, ``idle``, ``sent``, the route read port) holds no incoming payload
    bit, and the cone of outgoing payload bit ``k`` holds no incoming payload
    bit other than ``k``. This is what makes the payload window of
    :class:`RouterProperties` a sound abstraction. ``router`` replaces the
    router built from ``config`` (a test plants a dependence this way).

    Raises
    ------
    UsageError
        If yosys is missing.
    RuntimeError
        If a cone holds a payload bit it must not (yosys names it).
    """
    from amaranth.back import verilog

    if shutil.which("yosys") is None:
        raise UsageError("the payload check needs yosys (apt-get install -y yosys)")
    color_bits = range(DATA_BITS, DATA_BITS + COLOR_BITS)
    control = ["o:tx__*__valid", "o:rx__*__ready_*", "o:idle", "o:sent_*", "o:route__rdata_*",
               *(f"o:tx__*__payload_{b}" for b in color_bits)]
    data_in = [f"i:rx__*__payload_{b}" for b in _data_bits(None)]
    lines = [f"select -assert-none {_union(control)} %ci* {_union(data_in)} %i"]
    for k in _data_bits(None):
        others = [f"i:rx__*__payload_{b}" for b in _data_bits(k)]
        lines.append(f"select -assert-none o:tx__*__payload_{k} %ci* {_union(others)} %i")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "router.v").write_text(verilog.convert(router or Router(config), name="router"))
        (work / "cones.ys").write_text("\n".join([
            "read_verilog router.v", "prep -top router -flatten", "memory_map", "opt -fast", "techmap", "opt -fast",
            "splitnets -ports -format _", "splitnets", *lines]) + "\n")
        _run(["yosys", "-q", "-s", "cones.ys"], work)


def prove(config: FabricConfig, depth: int, induction: bool = False, *, bits: int = PAYLOAD_BITS, lsb: int = 0,
          bug: str | None = None, invariants: bool = True, solver: str = "sat", workdir=None) -> dict:
    """Check the properties of :class:`RouterProperties` for ``config`` and the payload window ``[lsb, lsb + bits)``.

    Returns ``{"bmc": bool, "depth": depth, "induction": bool | None, "k": int | None, "seconds": float,
    "failed": str | None, "log": str}``: ``bmc`` says no assertion fails
    within ``depth`` cycles from reset; with ``induction``, ``induction``
    says a ``k``-induction step with ``k <= depth`` closes (with Yosys's
    engine the smallest such ``k``; with z3, ``k = depth``), which together
    with the base case proves the assertions for every cycle of every run,
    unbounded. ``failed`` is the source line of the first failing assertion
    (``formal.py:N``; z3 engine only), if any. ``invariants=False`` leaves out
    the strengthening invariants (the properties alone: enough for a
    bounded check, not for induction).

    Raises
    ------
    UsageError
        If the tools are missing, ``depth`` is not a positive integer, the
        solver is unknown, or the window or ``bug`` is bad.
    """
    from amaranth.back import verilog

    if solver not in SOLVERS:
        raise UsageError(f"solver must be one of {', '.join(SOLVERS)}, not {solver!r}")
    missing = tools_missing(solver)
    if missing:
        raise UsageError(f"formal checks need yosys and {solver}: {missing}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise UsageError(f"depth must be a positive integer, not {depth!r}")
    harness = RouterProperties(config, bits=bits, lsb=lsb, bug=bug, invariants=invariants)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "router_props.v").write_text(verilog.convert(harness, name="router_props", ports=harness.ports(),
                                                             platform="formal"))
        prep = "read_verilog -formal -icells router_props.v; prep -top router_props -flatten; memory_map; opt -full; " \
               "async2sync; dffunmap"
        result = {"depth": depth, "induction": None, "k": None, "failed": None}
        if solver == "sat":
            log = _run(["yosys", "-p", f"{prep}; sat -tempinduct -tempinduct-baseonly -prove-asserts -set-assumes "
                        f"-maxsteps {depth}"], work, check=False)
            result["bmc"] = f"proved base case for {depth} steps: SUCCESS!" in log
            if induction and result["bmc"]:
                out = _run(["yosys", "-p", f"{prep}; sat -tempinduct -tempinduct-inductonly -prove-asserts "
                            f"-set-assumes -maxsteps {depth}"], work, check=False)
                result["induction"] = "Induction step proven: SUCCESS!" in out
                lengths = re.findall(r"Trying induction with length (\d+)", out)
                result["k"] = int(lengths[-1]) if result["induction"] and lengths else None
                log += out
        else:
            log = _run(["yosys", "-q", "-p", f"{prep}; opt_clean; write_smt2 -wires router_props.smt2"], work)
            out = _run(["yosys-smtbmc", "-s", solver, "--presat", "-t", str(depth), "router_props.smt2"], work,
                       check=False)
            result["bmc"] = "PASSED" in out and "FAILED" not in out
            log += out
            if induction and result["bmc"]:
                out = _run(["yosys-smtbmc", "-s", solver, "-i", "-t", str(depth), "router_props.smt2"], work,
                           check=False)
                result["induction"] = "PASSED" in out and "FAILED" not in out
                result["k"] = depth if result["induction"] else None
                log += out
            failed = re.search(r"Assert failed in \S+: \S*?(formal\.py:\d+)", log)
            result["failed"] = failed.group(1) if failed else None
    result.update(seconds=round(time.perf_counter() - start, 2), log=log)
    return result


def _run(cmd: list, cwd: Path, check: bool = True) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def main(argv=None) -> int:
    """``make formal``: bounded model check (and k-induction) of the router properties."""
    parser = argparse.ArgumentParser(prog="python -m wse.hdl.formal", description=main.__doc__)
    parser.add_argument("--depth", type=int, default=20, help="cycles of the bounded model check (default 20)")
    parser.add_argument("--colors", type=int, default=2, help="router colors (default 2)")
    parser.add_argument("--router-depth", type=int, default=2, help="FIFO depth (default 2)")
    parser.add_argument("--bits", type=int, default=1, help="payload bits left free per check (default 1)")
    parser.add_argument("--lsb", type=int, default=0, help="lowest free payload bit (default 0)")
    parser.add_argument("--all-bits", action="store_true", help="walk windows of --bits over all 33 payload bits")
    parser.add_argument("--solver", default="sat", help=f"one of {', '.join(SOLVERS)} (default sat: yosys's own)")
    parser.add_argument("--bug", default=None, help=f"plant a bug, one of {', '.join(BUGS)} (the check must fail)")
    parser.add_argument("--induction", action="store_true", help="also prove by k-induction (unbounded), k up to --depth")
    args = parser.parse_args(argv)
    ok = True
    try:
        cfg = FabricConfig(colors=args.colors, router_depth=args.router_depth)
        _check_window(args.bits, 0 if args.all_bits else args.lsb)
        if args.bug is not None and args.bug not in BUGS:
            raise UsageError(f"--bug must be one of {', '.join(BUGS)}, not {args.bug!r}")
        if args.solver not in SOLVERS:
            raise UsageError(f"--solver must be one of {', '.join(SOLVERS)}, not {args.solver!r}")
        start = time.perf_counter()
        payload_independent(cfg)
        print(json.dumps({"check": "payload_independent", "colors": args.colors, "passed": True,
                          "seconds": round(time.perf_counter() - start, 2)}), flush=True)
        windows = range(0, PAYLOAD_BITS, args.bits) if args.all_bits else [args.lsb]
        for lsb in windows:
            bits = min(args.bits, PAYLOAD_BITS - lsb)
            result = prove(cfg, args.depth, args.induction, bits=bits, lsb=lsb, bug=args.bug, solver=args.solver)
            ok &= result["bmc"] and result["induction"] is not False
            print(json.dumps({"check": "router_properties", "colors": args.colors, "router_depth": args.router_depth,
                              "payload_bits": [lsb, lsb + bits], "bug": args.bug, "solver": args.solver,
                              "depth": args.depth, "bmc": result["bmc"], "induction": result["induction"],
                              "k": result["k"], "failed": result["failed"], "seconds": result["seconds"]}),
                  flush=True)
            if not result["bmc"] and args.bug is None:
                print(result["log"][-4000:])
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
