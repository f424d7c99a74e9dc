"""The Verilog that the co-simulation compiles.

Two exports of the same RTL blocks (``hdl/``), for two purposes:

* **The full mesh, for cocotb** (:func:`mesh_verilog`). Exporting
  :class:`wse.hdl.fabric.Fabric` as one design writes every tile as its own
  set of modules (a 4x4 mesh is 17 MB of Verilog), so compile time and
  memory grow with the mesh. Here the tile is exported once, as module
  ``wse_tile`` (:func:`probed_tile`), and the mesh top ``wse_mesh`` is the same
  :class:`~wse.hdl.fabric.Fabric` elaborated with each tile replaced by an
  instance of that module: the mesh's own links, edge ports, host-bus decode
  and run control (the RTL of ``hdl/fabric.py``, not a copy). Tiles carry no
  coordinates, so Verilator and Icarus compile one tile module for any mesh.
* **The blocks, for the verilator backend** (:func:`block_verilog`): one PE
  (``wse_pe``) and one router (``wse_router``), which ``harness/wse_mesh.cpp``
  instantiates per tile and joins as ``hdl/tile.py`` and ``hdl/fabric.py``
  join them, so that it can skip the blocks that have nothing to do.

Every exported block has flat port names (``rx_0_valid``, not
``rx__0__valid``: the same in Verilog and in Verilator's C++) and read-only
probes, which change nothing in its behaviour:

=================  ==========================================================
``probe_work``     the PE did something other than wait in the previous
                   cycle (a select cycle, or a cycle of a running task that
                   was not a stall): its ``busy`` counter moved, ``stall`` did not
``probe_running``  a task is running
``probe_reg``      register ``probe_reg_sel`` of the PE (combinational)
``probe_tx_valid`` (tile only) the PE's output queue hands a wavelet to the
                   router; ``probe_tx`` is that wavelet (38 bits)
=================  ==========================================================

The mesh top has the ports of :class:`~wse.hdl.fabric.Fabric`
(``docs/rtl.md`` section 1.3) plus ``probe_progress`` (some router sent a
wavelet, some PE emitted one or did work), ``probe_emit`` (some PE emitted a
wavelet), ``probe_reg_sel`` and, per tile ``i = y * width + x``,
``probe_tx__i``, ``probe_reg__i`` and ``probe_state__i`` (bit 0 emits, 1
running, 2 work, 3 tile idle).
"""

from __future__ import annotations

import hashlib
import re
import unittest.mock

from amaranth import ClockSignal, Instance, Module, ResetSignal, Signal, Value
from amaranth.back import verilog
from amaranth.hdl import Array
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

import wse.hdl.fabric as fabric_module
from wse.config import WAVELET_BITS, FabricConfig
from wse.hdl.fabric import EDGES, Fabric
from wse.hdl.pe import PE
from wse.hdl.router import Router
from wse.hdl.tile import MESH_PORTS, Tile

__all__ = ["TILE_MODULE", "MESH_MODULE", "ROUTER_MODULE", "PE_MODULE", "STATE_BITS", "FlatBlock",
           "probed_tile", "probed_pe", "flat_router", "CosimMesh", "mesh_verilog", "block_verilog",
           "router_verilog", "port_name", "shared_comb_variables", "verilator_config", "icarus_fixup", "digest"]

TILE_MODULE = "wse_tile"
MESH_MODULE = "wse_mesh"
ROUTER_MODULE = "wse_router"
PE_MODULE = "wse_pe"

#: Bits of ``probe_state__i``, by name.
STATE_BITS = {"emit": 0, "running": 1, "work": 2, "idle": 3}


def port_name(path) -> str:
    """The flat port name of a flattened signature path
    (``("rx", 0, "valid")`` -> ``rx_0_valid``)."""
    return "_".join(str(part) for part in path)


class FlatBlock(wiring.Component):
    """A block with its ports flattened to single-underscore names, plus probes.

    Parameters
    ----------
    inner : wiring.Component
        The block; its behaviour is unchanged.
    probes : dict
        ``name -> (member, function)``: an extra port; outputs are driven by
        ``function(module, block)`` (``block.inner`` is the inner block),
        inputs have ``None`` and are read by the output functions.
    """

    def __init__(self, inner: wiring.Component, probes: dict | None = None):
        self.inner = inner
        #: The inner block's ports: (our port name, flow, the block's signal).
        self.inner_ports = [(port_name(path), member.flow, Value.cast(value))
                            for path, member, value in inner.signature.flatten(inner)]
        self._probes = dict(probes or {})
        members = {name: (In if flow == In else Out)(len(value)) for name, flow, value in self.inner_ports}
        members.update({name: member for name, (member, _) in self._probes.items()})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = self.inner
        for name, flow, value in self.inner_ports:
            ours = getattr(self, name)
            m.d.comb += value.eq(ours) if flow == In else ours.eq(value)
        for name, (member, drive) in self._probes.items():
            if member.flow == Out:
                m.d.comb += getattr(self, name).eq(drive(m, self))
        return m


def _pe_probes(pe_of) -> dict:
    """Probes of a PE found by ``pe_of(inner)``."""
    def work(m, block):
        pe = pe_of(block.inner)
        busy, stall = pe.counters["busy"], pe.counters["stall"]
        busy_seen, stall_seen = Signal.like(busy), Signal.like(stall)
        m.d.sync += [busy_seen.eq(busy), stall_seen.eq(stall)]
        return (busy != busy_seen) & (stall == stall_seen)

    return {
        "probe_work": (Out(1), work),
        "probe_running": (Out(1), lambda m, block: pe_of(block.inner).running),
        "probe_reg_sel": (In(4), None),
        "probe_reg": (Out(32), lambda m, block: Array(pe_of(block.inner).regs)[block.probe_reg_sel]),
    }


def probed_pe(config: FabricConfig) -> FlatBlock:
    """One :class:`~wse.hdl.pe.PE` with flat ports and the PE probes."""
    return FlatBlock(PE(config), _pe_probes(lambda pe: pe))


def flat_router(config: FabricConfig) -> FlatBlock:
    """One :class:`~wse.hdl.router.Router` with flat ports."""
    return FlatBlock(Router(config))


def probed_tile(config: FabricConfig) -> FlatBlock:
    """One :class:`~wse.hdl.tile.Tile` with flat ports, the PE probes and
    ``probe_tx_valid`` / ``probe_tx`` (the wavelet the PE hands its router)."""
    probes = _pe_probes(lambda tile: tile.pe)
    probes["probe_tx_valid"] = (Out(1), lambda m, block: block.inner.pe.tx.valid)
    probes["probe_tx"] = (Out(WAVELET_BITS), lambda m, block: block.inner.pe.tx.payload.as_value())
    return FlatBlock(Tile(config, link_ecc=MESH_PORTS), probes)


class _TileInstance(wiring.Component):
    """Stands where the mesh expects a tile (it has the tile's signature plus
    the probes): an instance of the shared tile module."""

    def __init__(self, tile_signature: wiring.Signature, probes: dict):
        members = dict(tile_signature.members)
        members.update(probes)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for path, member, value in self.signature.flatten(self):
            prefix = "i_" if member.flow == In else "o_"
            ports[prefix + port_name(path)] = Value.cast(value)
        m.submodules.tile = Instance(TILE_MODULE, **ports)
        return m


class CosimMesh(wiring.Component):
    """The mesh top: :class:`~wse.hdl.fabric.Fabric` whose tiles are
    instances of the shared module ``wse_tile``, plus the probes of the
    module docstring.

    Parameters
    ----------
    config : FabricConfig
    tile : FlatBlock
        The shared tile module (:func:`probed_tile` of ``config``).
    """

    def __init__(self, config: FabricConfig, tile: FlatBlock):
        self._config = config
        probes = {name: member for name, (member, _) in tile._probes.items()}

        def make_tile(cfg, *, pe=None, link_ecc=()):
            instance = _TileInstance(tile.inner.signature, probes)
            instance.link_ecc = tile.inner.link_ecc      # the shared module codes all four ports
            return instance

        # The mesh's own elaboration (links, edges, host bus, run control) is
        # kept; only the tiles it builds are the shared module's instances.
        with unittest.mock.patch.object(fabric_module, "Tile", make_tile):
            self.fabric = Fabric(config)
        members = dict(self.fabric.signature.members)
        n = config.num_pes
        members.update({
            "probe_progress": Out(1),
            "probe_emit": Out(1),
            "probe_reg_sel": In(4),
            "probe_tx": Out(WAVELET_BITS).array(n),
            "probe_reg": Out(32).array(n),
            "probe_state": Out(len(STATE_BITS)).array(n),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        fab = self.fabric
        m.submodules.fabric = fab
        wiring.connect(m, wiring.flipped(self.host), fab.host)
        for edge in EDGES:
            for ours, theirs in zip(getattr(self, f"edge_in_{edge}"), fab.edge_in(edge)):
                wiring.connect(m, wiring.flipped(ours), theirs)
            for ours, theirs in zip(getattr(self, f"edge_out_{edge}"), fab.edge_out(edge)):
                wiring.connect(m, theirs, wiring.flipped(ours))
        m.d.comb += [
            fab.start.eq(self.start),
            fab.edge_pending.eq(self.edge_pending),
            self.running.eq(fab.running),
            self.idle.eq(fab.idle),
            self.cycle.eq(fab.cycle),
            self.hops.eq(fab.hops),
        ]
        tiles = [tile for row in fab.tiles for tile in row]
        progress, emit = 0, 0
        for i, tile in enumerate(tiles):
            m.d.comb += [
                tile.probe_reg_sel.eq(self.probe_reg_sel),
                self.probe_reg[i].eq(tile.probe_reg),
                self.probe_tx[i].eq(tile.probe_tx),
                self.probe_state[i].eq(tile.probe_tx_valid << STATE_BITS["emit"]
                                       | tile.probe_running << STATE_BITS["running"]
                                       | tile.probe_work << STATE_BITS["work"]
                                       | tile.idle << STATE_BITS["idle"]),
            ]
            progress = progress | tile.probe_tx_valid | tile.probe_work | tile.sent.any()
            emit = emit | tile.probe_tx_valid
        m.d.comb += [self.probe_progress.eq(progress), self.probe_emit.eq(emit)]
        return m


def mesh_verilog(config: FabricConfig) -> dict[str, str]:
    """The Verilog of the mesh ``config``: ``{"wse_tile.v": ..., "wse_mesh.v": ...}``.

    Both texts are written without source locations, so the same design
    gives the same text (the build cache hashes it).
    """
    if not isinstance(config, FabricConfig):
        raise TypeError(f"config must be a FabricConfig, not {config!r}")
    tile = probed_tile(config.with_mesh(1, 1))
    tile_text = verilog.convert(tile, name=TILE_MODULE, emit_src=False)
    mesh_text = verilog.convert(CosimMesh(config, tile), name=MESH_MODULE, emit_src=False)
    return {f"{TILE_MODULE}.v": tile_text, f"{MESH_MODULE}.v": mesh_text}


def block_verilog(config: FabricConfig) -> dict[str, str]:
    """The Verilog of the verilator backend's blocks for ``config``:
    ``{"wse_pe.v": ..., "wse_router.v": ...}`` (the mesh shape does not matter)."""
    if not isinstance(config, FabricConfig):
        raise TypeError(f"config must be a FabricConfig, not {config!r}")
    config = config.with_mesh(1, 1)
    return {f"{PE_MODULE}.v": verilog.convert(probed_pe(config), name=PE_MODULE, emit_src=False),
            f"{ROUTER_MODULE}.v": verilog.convert(flat_router(config), name=ROUTER_MODULE, emit_src=False)}


def router_verilog(config: FabricConfig) -> dict[str, str]:
    """The Verilog of one router of ``config`` as module ``wse_router``."""
    if not isinstance(config, FabricConfig):
        raise TypeError(f"config must be a FabricConfig, not {config!r}")
    return {f"{ROUTER_MODULE}.v": verilog.convert(Router(config), name=ROUTER_MODULE, emit_src=False)}


_IDENT = r"(\\\S+|[A-Za-z_][A-Za-z0-9_$]*)"
_LHS = re.compile(r"^\s*" + _IDENT + r"(?:\s*\[[^\]]*\])?\s*=(?!=)", re.M)
_COMB_BLOCK = re.compile(r"^  always @\* begin\n(.*?)^  end\n|^  always @\*\n(.*?;)\n", re.S | re.M)
_MODULE = re.compile(r"^module (\S+)\s*\((.*?)^endmodule", re.S | re.M)
_DUMMY = re.compile(r"^(  reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+ ) = 0;)$", re.M)


def shared_comb_variables(text: str) -> list[tuple[str, str]]:
    """``(module, variable)`` pairs of Verilog variables that combinational
    ``always @*`` blocks both read and write, or that several blocks write
    parts of.

    Yosys writes an Amaranth signal whose fields feed each other (the PE
    decoder computes its fields from its own ``opcode`` field) as one
    variable written by several blocks. Verilator orders logic by whole
    variables and then evaluates such blocks in the wrong order (stale
    fields); its ``split_var`` directive, given these pairs, makes the parts
    separate variables again.
    """
    found = []
    for module in _MODULE.finditer(text):
        writers: dict[str, int] = {}
        shared = set()
        for block in _COMB_BLOCK.finditer(module.group(2)):
            body = block.group(1) or block.group(2)
            writes = set(_LHS.findall(body))
            reads = set(re.findall(_IDENT, _LHS.sub("", body)))
            shared |= writes & reads
            for name in writes:
                writers[name] = writers.get(name, 0) + 1
        shared |= {name for name, count in writers.items() if count > 1}
        name = module.group(1).lstrip("\\")
        found += [(name, var.lstrip("\\")) for var in sorted(shared) if "dump_module" not in var]
    return found


def verilator_config(texts) -> str:
    """A Verilator configuration file for the Verilog ``texts``: ``split_var``
    for every variable of :func:`shared_comb_variables`."""
    lines = ["`verilator_config"]
    for text in texts:
        lines += [f'split_var -module "{module}" -var "{var}"' for module, var in shared_comb_variables(text)]
    return "\n".join(lines) + "\n"


def icarus_fixup(text: str) -> str:
    """The Verilog ``text`` made to start right in an event-driven simulator.

    Yosys gives every combinational block a dummy variable, initialized to
    0 in its declaration, to have each block evaluated once at time 0. Icarus
    does not count a declaration's initial value as an event, so blocks whose
    inputs never change keep X for ever (the PE's ``running`` and ``pc``
    among them). An ``initial #0`` that sets the dummy to 1 is that event.
    """
    return _DUMMY.sub(lambda m: f"{m.group(1)}\n  initial #0 {m.group(2)} = 1'b1;", text)


def digest(*parts: str) -> str:
    """A short hash of text parts (build-cache keys)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
