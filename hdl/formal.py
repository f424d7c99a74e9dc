"""Formal properties of the router (:class:`wse.hdl.router.Router`, unchanged), checked with Yosys and z3.

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
* **no wavelet lost or duplicated, order kept**: for a tracked color and a
  tracked position ``n`` (both chosen freely by the solver once), the
  ``n``-th wavelet of that color to leave the router is the ``n``-th to
  enter it, bit for bit, and never leaves before it entered; the number
  inside never exceeds ``router_depth``.

:func:`prove` exports the harness to Verilog (Amaranth's own Yosys), then
runs Debian's ``yosys`` to build an SMT2 model and ``yosys-smtbmc`` (z3) for
a bounded model check of ``depth`` cycles and, with ``induction``, a
``k``-induction attempt. ``python -m wse.hdl.formal`` is ``make formal``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth import Cat, Module, Signal
from amaranth.hdl import Assert, Assume, Elaboratable

from wse.config import COLOR_BITS, DATA_BITS, FabricConfig, UsageError

from .router import PORTS, ROUTE_BITS, Router

__all__ = ["RouterProperties", "prove", "tools_missing", "main"]

#: Width of the harness's wavelet counters: the tracked position is below 2**(COUNT_BITS - 1).
COUNT_BITS = 5


class RouterProperties(Elaboratable):
    """The router under free inputs, with the properties above as assertions.

    Parameters
    ----------
    config : FabricConfig
        The router's size (small ``colors`` keep the proof fast).
    """

    def __init__(self, config: FabricConfig):
        if not isinstance(config, FabricConfig):
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        self.config = config
        C = config.colors
        self.rx_valid = [Signal(name=f"rx{p}_valid") for p in range(PORTS)]
        self.rx_color = [Signal(COLOR_BITS, name=f"rx{p}_color") for p in range(PORTS)]
        self.rx_data = [Signal(DATA_BITS + 1, name=f"rx{p}_data") for p in range(PORTS)]
        self.tx_ready = [Signal(C, name=f"tx{p}_ready") for p in range(PORTS)]
        self.first_color = Signal(COLOR_BITS)
        self.route_we = Signal()
        self.route_color = Signal(COLOR_BITS)
        self.route_wdata = Signal(ROUTE_BITS)
        self.pick_color = Signal(COLOR_BITS)
        self.pick_index = Signal(COUNT_BITS - 1)

    def ports(self) -> list:
        """The free inputs, for the Verilog export."""
        return [*self.rx_valid, *self.rx_color, *self.rx_data, *self.tx_ready, self.first_color, self.route_we,
                self.route_color, self.route_wdata, self.pick_color, self.pick_index]

    def elaborate(self, platform):
        m = Module()
        cfg, C = self.config, self.config.colors
        m.submodules.router = router = Router(cfg)
        for p in range(PORTS):
            m.d.comb += [router.rx[p].valid.eq(self.rx_valid[p]), router.rx[p].payload.color.eq(self.rx_color[p]),
                         router.rx[p].payload.data.eq(self.rx_data[p][:DATA_BITS]),
                         router.rx[p].payload.ctrl.eq(self.rx_data[p][DATA_BITS]),
                         router.tx[p].ready.eq(self.tx_ready[p])]
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
        self._scoreboard(m, router)
        return m

    def _grants(self, m: Module, router: Router, masks: list) -> None:
        C = self.config.colors
        for p in range(PORTS):
            tx = router.tx[p]
            with m.If(tx.valid):
                m.d.comb += [Assert(tx.ready.bit_select(tx.payload.color, 1)), Assert(tx.payload.color < C)]
        for c in range(C):
            on = Cat(*(router.tx[p].valid & (router.tx[p].payload.color == c) for p in range(PORTS)))
            with m.If(on.any()):
                m.d.comb += Assert(on == masks[c])
                for p in range(PORTS):
                    for q in range(p + 1, PORTS):
                        with m.If(on[p] & on[q]):
                            m.d.comb += Assert(Cat(router.tx[p].payload.data, router.tx[p].payload.ctrl)
                                               == Cat(router.tx[q].payload.data, router.tx[q].payload.ctrl))

    def _scoreboard(self, m: Module, router: Router) -> None:
        cfg = self.config
        started = Signal()
        color = Signal(COLOR_BITS)
        index = Signal(COUNT_BITS - 1)
        m.d.sync += started.eq(1)
        with m.If(~started):            # the tracked color and position: chosen once, in cycle 0
            m.d.sync += [color.eq(self.pick_color), index.eq(self.pick_index)]
        track_color = Signal(COLOR_BITS)
        track_index = Signal(COUNT_BITS - 1)
        m.d.comb += [track_color.eq(color), track_index.eq(index)]
        with m.If(~started):
            m.d.comb += [track_color.eq(self.pick_color), track_index.eq(self.pick_index)]

        came, went = Signal(COUNT_BITS), Signal(COUNT_BITS)
        kept, have = Signal(DATA_BITS + 1), Signal()
        enters = Signal()
        entering = Signal(DATA_BITS + 1)
        for p in range(PORTS):
            with m.If(self.rx_valid[p] & (self.rx_color[p] == track_color)):
                m.d.comb += [enters.eq(1), entering.eq(self.rx_data[p])]
        leaves = Signal()
        leaving = Signal(DATA_BITS + 1)
        for p in range(PORTS):
            tx = router.tx[p]
            with m.If(tx.valid & (tx.payload.color == track_color)):
                m.d.comb += [leaves.eq(1), leaving.eq(Cat(tx.payload.data, tx.payload.ctrl))]
        with m.If(enters):
            m.d.sync += came.eq(came + 1)
            with m.If(came == track_index):
                m.d.sync += [kept.eq(entering), have.eq(1)]
        with m.If(leaves):
            m.d.sync += went.eq(went + 1)
            with m.If(went == track_index):
                m.d.comb += [Assert(have), Assert(leaving == kept)]
        m.d.comb += [Assert(went <= came), Assert(came - went <= cfg.router_depth)]
        # Stop counting before the counters wrap: the bound covers the positions that matter.
        m.d.comb += Assume(came < (1 << COUNT_BITS) - 1)


def tools_missing() -> str | None:
    """None if ``yosys``, ``yosys-smtbmc`` and ``z3`` are on ``PATH``, else what is missing."""
    missing = [tool for tool in ("yosys", "yosys-smtbmc", "z3") if shutil.which(tool) is None]
    return None if not missing else ", ".join(missing) + " not found (apt-get install -y yosys z3)"


def prove(config: FabricConfig, depth: int, induction: bool = False, workdir=None) -> dict:
    """Check the properties of :class:`RouterProperties` for ``config``.

    Returns ``{"bmc": bool, "depth": depth, "induction": bool | None, "log": str}``:
    whether no assertion fails within ``depth`` cycles from reset and, with
    ``induction``, whether ``depth``-induction proves them for every cycle.

    Raises
    ------
    UsageError
        If the tools are missing or ``depth`` is not a positive integer.
    """
    from amaranth.back import verilog

    missing = tools_missing()
    if missing:
        raise UsageError(f"formal checks need yosys and z3: {missing}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise UsageError(f"depth must be a positive integer, not {depth!r}")
    harness = RouterProperties(config)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "router_props.v").write_text(verilog.convert(harness, name="router_props", ports=harness.ports()))
        script = ("read_verilog -formal router_props.v; prep -top router_props -flatten; memory_map; opt -fast; "
                  "async2sync; dffunmap; write_smt2 -wires router_props.smt2")
        log = _run(["yosys", "-q", "-p", script], work)
        result = {"depth": depth, "induction": None}
        out = _run(["yosys-smtbmc", "-s", "z3", "--presat", "-t", str(depth), "router_props.smt2"], work, check=False)
        result["bmc"] = "PASSED" in out and "FAILED" not in out
        log += out
        if induction:
            out = _run(["yosys-smtbmc", "-s", "z3", "-i", "-t", str(depth), "router_props.smt2"], work, check=False)
            result["induction"] = "PASSED" in out and "FAILED" not in out
            log += out
        result["log"] = log
    return result


def _run(cmd: list, cwd: Path, check: bool = True) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def main(argv=None) -> int:
    """``make formal``: bounded model check (and k-induction) of the router properties."""
    parser = argparse.ArgumentParser(prog="python -m wse.hdl.formal", description=main.__doc__)
    parser.add_argument("--depth", type=int, default=24, help="cycles of the bounded model check (default 24)")
    parser.add_argument("--colors", type=int, default=3, help="router colors (default 3)")
    parser.add_argument("--router-depth", type=int, default=2, help="FIFO depth (default 2)")
    parser.add_argument("--induction", action="store_true", help="also try k-induction with k = depth")
    args = parser.parse_args(argv)
    try:
        cfg = FabricConfig(colors=args.colors, router_depth=args.router_depth)
        result = prove(cfg, args.depth, args.induction)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ind = {None: "not tried", True: "proved", False: "did not close"}[result["induction"]]
    print(f"router properties, colors={args.colors} router_depth={args.router_depth}: bounded model check "
          f"to {args.depth} cycles {'PASSED' if result['bmc'] else 'FAILED'}; {args.depth}-induction {ind}")
    if not result["bmc"]:
        print(result["log"][-4000:])
    return 0 if result["bmc"] and result["induction"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
