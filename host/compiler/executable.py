"""The compiled executable: everything a runtime needs to train or evaluate a
model on the fabric, without the model's code.

An :class:`Executable` holds the PE program, the route table, the static PE
memory (op lists), the per-step host transfers (index maps between host
tensors and PE memory), the phases (:class:`~.schedule.Phase`: weight streams
in, gradient streams out, what each computes, its FMAC count and cycles), the
phase sequences of a training step and of an evaluation, and the execution
mode's layout (:class:`~.layouts.Layout`).

File format (version :data:`VERSION`): one ``.npz`` archive (written
atomically) with ``manifest`` (UTF-8 JSON: format, version, config, batch,
mode, graph, routes, phases without their arrays, sequences, regions,
layout), ``program`` (the program image bytes, :mod:`wse.firmware.image`) and
the arrays named in the manifest. A file of another version is refused with
a :class:`~wse.config.UsageError` naming both versions; bump :data:`VERSION`
whenever what a manifest field means changes.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from wse.atomic import atomic_open, read_input
from wse.config import FabricConfig, UsageError
from wse.firmware.image import Program

from .ir import Graph
from .layouts import Layout
from .schedule import Phase

__all__ = ["Executable", "FORMAT", "VERSION"]

#: Identifies an executable file.
FORMAT = "wse-executable"
#: The file format version this code writes and reads (2: the weight-streaming ``sgemm`` record
#: ends with ``e_step``, the last round's counter step, and its layout may spread a last round).
VERSION = 2


class Executable:
    """A compiled model (see the module docstring for what it holds).

    Members
    -------
    graph:
        The layer IR (:class:`~wse.host.compiler.ir.Graph`).
    config:
        The fabric it was compiled for.
    batch:
        Samples per step.
    mode:
        ``"weight_streaming"`` (``"pipelined"`` later).
    program:
        The PE program image (the same on every PE).
    routes:
        ``(x, y, color, input port or None, output ports)`` entries.
    static:
        ``[(address, uint32 [H, W, n])]`` PE memory written once at load.
    transfers:
        ``{name: (address, int64 [H, W, n])}`` index maps of the per-step copies.
    phases:
        ``{name: Phase}`` (:class:`~.schedule.Phase`).
    sequences:
        ``{"train": [...], "eval": [...]}`` phase names in order.
    regions:
        ``{name: (address, words)}``: the PE memory map.
    layout:
        The mode's layout (a :class:`~.layouts.Layout` of the same ``mode``).
    """

    def __init__(self, *, graph: Graph, config: FabricConfig, batch: int, mode: str, program: Program,
                 routes: list, static: list, transfers: dict, phases: dict[str, Phase], sequences: dict,
                 regions: dict, layout: Layout):
        if not isinstance(layout, Layout) or layout.mode != mode:
            raise UsageError(f"layout must be the {mode!r} mode's Layout, not {layout!r}")
        self.graph, self.config, self.batch, self.mode = graph, config, int(batch), mode
        self.program, self.routes, self.static = program, routes, static
        self.transfers, self.phases, self.sequences = transfers, phases, sequences
        self.regions, self.layout = regions, layout

    # -- queries ---------------------------------------------------------
    def parameters(self) -> dict[str, tuple[int, ...]]:
        """PyTorch ``state_dict`` names -> shapes, in streaming order."""
        return dict(self.graph.parameters())

    def cycles(self, sequence: str = "train") -> int:
        """Fabric cycles of one run of ``sequence`` (``"train"`` or ``"eval"``)."""
        return sum(self.phases[name].cycles for name in self.sequences[sequence])

    def summary(self) -> str:
        """A table of the layout, memory map and schedule, for humans."""
        cfg = self.config
        lines = [f"{self.graph.name}: {self.mode} on a {cfg.mesh} mesh, batch {self.batch}, "
                 f"{len(self.program.code)} instructions per PE"]
        lines += self.layout.describe()
        lines.append("memory per PE (words):")
        for name, (addr, words) in sorted(self.regions.items(), key=lambda item: item[1][0]):
            lines.append(f"  {addr:6d}  {words:6d}  {name}")
        lines.append(f"  program data {self.program.data_end} words; sram_words {cfg.sram_words}")
        header = f"{'phase':28s} {'group':16s} {'cycles':>9s} {'FMACs':>11s} {'util':>6s}"
        lines += ["schedule (one training step):", header, "-" * len(header)]
        pes = cfg.num_pes
        for name in self.sequences["train"]:
            phase = self.phases[name]
            util = phase.fmacs / (pes * phase.cycles) if phase.cycles else 0.0
            lines.append(f"{name:28s} {phase.group:16s} {phase.cycles:9d} {phase.fmacs:11d} {util:6.3f}")
        total = self.cycles("train")
        fmacs = sum(self.phases[n].fmacs for n in self.sequences["train"])
        lines.append(f"{'total':28s} {'':16s} {total:9d} {fmacs:11d} {fmacs / (pes * total) if total else 0:6.3f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Executable({self.graph.name!r}, mode={self.mode!r}, mesh={self.config.mesh}, batch={self.batch})"

    # -- files -----------------------------------------------------------
    def save(self, path) -> None:
        """Write the executable to ``path`` atomically (the file is either the
        complete new executable or untouched)."""
        path = Path(path)
        arrays: dict[str, np.ndarray] = {}

        def keep(array) -> str:
            key = f"a{len(arrays)}"
            arrays[key] = np.asarray(array)
            return key

        phases = {name: phase.to_manifest(keep) for name, phase in self.phases.items()}
        manifest = {
            "format": FORMAT, "version": VERSION, "config": self.config.to_dict(), "batch": self.batch,
            "mode": self.mode, "graph": self.graph.to_dict(),
            "routes": [[x, y, c, None if i is None else int(i), [int(p) for p in outs]]
                       for x, y, c, i, outs in self.routes],
            "static": [[int(addr), keep(words)] for addr, words in self.static],
            "transfers": {name: [int(addr), keep(index)] for name, (addr, index) in self.transfers.items()},
            "phases": phases, "sequences": self.sequences,
            "regions": {name: [int(a), int(w)] for name, (a, w) in self.regions.items()},
            "layout": self.layout.to_dict(),
        }
        arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode("utf-8"), dtype=np.uint8)
        arrays["program"] = np.frombuffer(self.program.to_bytes(), dtype=np.uint8)
        with atomic_open(path) as out:
            np.savez_compressed(out, **arrays)

    @classmethod
    def load(cls, path) -> "Executable":
        """Read an executable written by :meth:`save`.

        Raises
        ------
        UsageError
            If the file is missing, is not a valid executable, or is one of
            another format version (the message names the version found and
            the version expected).
        """
        path = Path(path)
        blob = read_input(path)
        try:
            with np.load(io.BytesIO(blob), allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
            manifest = json.loads(arrays["manifest"].tobytes().decode("utf-8"))
        except (ValueError, KeyError, OSError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            raise UsageError(f"{path} is not a waferscale executable ({type(exc).__name__}: {exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
            raise UsageError(f"{path} is not a waferscale executable (format {found!r}, expected {FORMAT!r})")
        if manifest.get("version") != VERSION:
            raise UsageError(f"{path} is a waferscale executable of format version {manifest.get('version')!r}, "
                             f"but this version of wse reads format version {VERSION}; compile the model again")
        layout = Layout.for_mode(manifest.get("mode"))
        try:
            return cls(
                graph=Graph.from_dict(manifest["graph"]), config=FabricConfig.from_dict(manifest["config"]),
                batch=manifest["batch"], mode=manifest["mode"],
                program=Program.from_bytes(arrays["program"].tobytes(), str(path)),
                routes=[(x, y, c, i, tuple(outs)) for x, y, c, i, outs in manifest["routes"]],
                static=[(addr, arrays[key]) for addr, key in manifest["static"]],
                transfers={name: (addr, arrays[key]) for name, (addr, key) in manifest["transfers"].items()},
                phases={name: Phase.from_manifest(name, phase, arrays) for name, phase in manifest["phases"].items()},
                sequences=manifest["sequences"],
                regions={name: tuple(v) for name, v in manifest["regions"].items()},
                layout=layout.from_dict(manifest["layout"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{path} is a damaged waferscale executable ({type(exc).__name__}: {exc})") from None
