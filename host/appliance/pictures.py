"""Pictures of a training run's first step: heatmaps per phase and a Perfetto timeline.

When the runtime's backend runs on the golden fabric model (``--backend
golden``), the first step of a fresh run is recorded
(:mod:`wse.sim.golden.events`) and leaves in ``out/pictures/``:

* ``<phase>_fmac.png``, ``<phase>_stalls.png``, ``<phase>_links.png`` for
  each phase of the step (``docs/pictures.md``; ``fwd fc1`` is written
  ``fwd_fc1``);
* ``step1_trace.json`` (or the file of ``wse train --trace FILE``): the
  step's timeline, one slice per phase on the ``phases`` track, for
  ui.perfetto.dev.

The cycle window of every phase (for GTKWave or the timeline) goes to
``pictures/phases.json``. Other backends count no per-PE events; the run
says so in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wse.atomic import atomic_open

__all__ = ["PICTURES_DIR", "FirstStep", "file_prefix", "golden_device"]

#: The run folder's subfolder of pictures.
PICTURES_DIR = "pictures"


def golden_device(engine):
    """The golden fabric that ``engine``'s runtime drives (loaded on first use), or None for
    other backends (functional, RTL) and engines without a runtime of their own."""
    backend = getattr(getattr(engine, "runtime", None), "backend", None)
    if backend is None:
        return None
    if hasattr(backend, "fabric"):              # a layer-pipelined executable: its device is made with it
        device = backend.fabric
    elif hasattr(backend, "make_device"):       # weight streaming: the device is made on first use
        if backend.device is None:
            backend.load()
        device = backend.device
    else:
        return None
    return device if hasattr(device, "record") else None


def _hot_spots(rec, top: int = 3) -> dict:
    """Per phase: mean FMAC utilization, stall cycles by cause, the most stalled PEs, the busiest
    router outputs and the wavelets that host streams carried in and out."""
    from wse.sim.golden.events import STALL_CAUSES

    ports = ("N", "E", "S", "W", "RAMP")
    width, out = rec.width, {}
    for label in rec.labels():
        t = rec.totals(label)
        cycles = max(t["cycles"], 1)
        stall = t["stall"].sum(axis=0)
        links = t["links"]
        hottest = np.argsort(-links, axis=None, kind="stable")[:top]
        windows = [(r.start, r.start + r.cycles) for r in rec.runs if r.label == label]
        traffic = {"in": 0, "out": 0}
        for key, spans in rec.streams.items():
            traffic[key[0]] += sum(n for s, e, n in spans if any(a <= s < b for a, b in windows))
        out[label] = {
            "cycles": t["cycles"], "fmac_utilization": float(t["fmac"].mean() / cycles),
            "stall_cycles": {c: int(t["stall"][i].sum()) for i, c in enumerate(STALL_CAUSES)},
            "most_stalled_pes": [{"pe": [int(i % width), int(i // width)], "stall_cycles": int(stall[i])}
                                 for i in np.argsort(-stall, kind="stable")[:top] if stall[i]],
            "busiest_links": [{"router": [int(i % width), int(i // width)], "port": ports[p],
                               "occupancy": float(links[p, i] / cycles)}
                              for p, i in (divmod(int(k), links.shape[1]) for k in hottest) if links[p, i]],
            "host_stream_wavelets": traffic,
        }
    return out


def file_prefix(label: str) -> str:
    """``fwd fc1`` -> ``fwd_fc1_``: a phase's name as a file name prefix."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in label) + "_"


class FirstStep:
    """Records the first step of a run on a golden fabric and draws it (a no-op elsewhere).

    Parameters
    ----------
    engine:
        The system's engine (its ``runtime`` backend's device is recorded).
    out:
        The run folder; the pictures go to ``out/pictures``.
    trace:
        Where the step's timeline goes (default ``out/pictures/step1_trace.json``).
    """

    def __init__(self, engine, out: Path, trace: Path | None = None):
        self.out = Path(out) / PICTURES_DIR
        self.trace = Path(trace) if trace is not None else self.out / "step1_trace.json"
        self.device = golden_device(engine)
        self.recorder = self.device.record() if self.device is not None else None

    @property
    def active(self) -> bool:
        """Whether the step is being recorded."""
        return self.recorder is not None

    def finish(self, phases: dict) -> dict:
        """Stop recording and write the pictures; ``phases`` is the step's ``{phase: cycles}``.

        Returns ``{"trace": path, "phases": {phase: {"fmac": path, ...}}, "windows": {...}}``
        (empty when nothing was recorded)."""
        from wse.sim.golden.heatmap import mesh_pictures
        from wse.sim.golden.perfetto import write_trace

        if self.recorder is None:
            return {}
        rec = self.device.stop_recording()
        self.recorder = None
        if len(rec.runs) == len(phases):
            for run, name in zip(rec.runs, phases):
                run.label = name
        self.out.mkdir(parents=True, exist_ok=True)
        windows = {run.label: {"first_cycle": run.start, "last_cycle": run.start + run.cycles - 1,
                               "cycles": run.cycles} for run in rec.runs}
        pictures = {label: {k: str(v) for k, v in mesh_pictures(rec, self.out, label, prefix=file_prefix(label),
                                                               title=f"step 1, phase {label}").items()}
                    for label in rec.labels()}
        trace = self.trace
        write_trace(rec, trace, "training step 1")
        index = {"trace": str(trace), "phases": pictures, "windows": windows, "hot": _hot_spots(rec),
                 "note": "cycles count from the first cycle of step 1 on the golden model"}
        with atomic_open(self.out / "phases.json", "w") as fh:
            json.dump(index, fh, indent=1)
        return index
