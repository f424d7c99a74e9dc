"""The golden model's event recorder: what each PE, link and host stream did, cycle by cycle.

A :class:`Recorder` attached to a :class:`~wse.sim.golden.Fabric`
(:meth:`Fabric.record <wse.sim.golden.Fabric.record>`) is fed by the very
lines of the model that move its counters, so the two agree by construction
(and ``tests/test_pictures.py`` checks that they do):

* a **task** slice per task a PE runs, from the cycle it is selected to the
  cycle after its ``exit``: the slices of a PE add up to its ``busy`` counter;
* a **stall** slice per wait of a fabric instruction (an input queue that is
  empty, an output queue that is full), nested in its task and, for a vector
  instruction, in the instruction's slice; they add up to ``stall``. The
  cause is the wait that began the stall: ``rx`` (with its color) or ``tx``;
* a **vector** slice per vector instruction, from its first cycle to its
  last, named by its mnemonic;
* **idle** slices fill the rest of each run, so that a PE's tasks and idle
  slices add up to the run's cycles;
* per router output port, the cycles it sent a wavelet (link occupancy, one
  count per wavelet copy: they add up to ``wavelet_hops``);
* per host stream (an edge port and color), the runs of cycles in which it
  injected or received wavelets;
* per chosen router, its FIFO occupancy (all colors) whenever it changes.

Each :meth:`Fabric.run` is one **run** on a global clock that continues
across runs (the fabric's ``total_cycles``); callers name runs (a training
step's phases) with :attr:`Recorder.label` before running them.

``rect`` restricts the per-PE slices to a region of the mesh and
``max_events`` bounds the slices kept in all (the trace viewer opens a few
million events); link, stream and counter data are always complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wse.config import Port

from .router import TO_EDGE

__all__ = ["Recorder", "RunRecord", "DEFAULT_MAX_EVENTS", "STALL_CAUSES", "pe_stall_begin", "pe_stall_end"]

#: Slices kept by default: a trace file of a few hundred megabytes at most,
#: about what ui.perfetto.dev opens comfortably.
DEFAULT_MAX_EVENTS = 2_000_000

#: Stall causes, in the order of the heatmaps.
STALL_CAUSES = ("rx", "tx")


@dataclass
class RunRecord:
    """One :meth:`Fabric.run`: its label, first cycle on the global clock and length."""

    label: str
    start: int
    cycles: int
    counters: dict = field(default_factory=dict)


class Recorder:
    """Events of a golden fabric's runs (see the module docstring).

    Parameters
    ----------
    fabric:
        The :class:`~wse.sim.golden.Fabric` to record; use
        :meth:`Fabric.record <wse.sim.golden.Fabric.record>` to attach one.
    rect:
        ``(x0, y0, w, h)``: the PEs whose slices are kept (default all).
    queues:
        ``(x, y)`` routers whose FIFO occupancy is recorded as a counter.
    max_events:
        The most per-PE slices kept; later ones are counted in
        :attr:`dropped` (sums per PE are kept in full regardless).
    """

    def __init__(self, fabric, rect=None, queues=(), max_events: int = DEFAULT_MAX_EVENTS):
        self.fabric = fabric
        self.width, self.height = fabric.width, fabric.height
        x0, y0, w, h = fabric._rect(rect)
        self.rect = (x0, y0, w, h)
        self.kept = {y * self.width + x for y in range(y0, y0 + h) for x in range(x0, x0 + w)}
        self.queues = [fabric._tile(x, y) for x, y in queues]
        self.max_events = int(max_events)
        self.label: str | None = None
        self.runs: list[RunRecord] = []
        #: per PE index: ``[(kind, start, end, detail), ...]`` on the global clock
        self.slices: dict[int, list] = {i: [] for i in sorted(self.kept)}
        self.events = 0
        self.dropped = 0
        n = self.width * self.height
        #: per PE, cycles: busy (tasks), stalled by cause, vector instructions
        self.busy = np.zeros(n, dtype=np.int64)
        self.stall = np.zeros((len(STALL_CAUSES), n), dtype=np.int64)
        self.fmac = np.zeros(n, dtype=np.int64)
        #: wavelets sent per router output port ``[port, router]`` (N, E, S, W, RAMP)
        self.links = np.zeros((len(Port), n), dtype=np.int64)
        #: ``{(direction, edge, index, color): [[start, end, wavelets], ...]}``
        self.streams: dict[tuple, list] = {}
        #: ``{router: [(cycle, occupancy), ...]}``
        self.occupancy: dict[int, list] = {r: [] for r in self.queues}
        self._base = 0
        self._open: dict[tuple, list] = {}

    # ------------------------------------------------------------------ fed by the fabric
    def begin_run(self) -> None:
        """Called by :meth:`Fabric.run` before its first cycle."""
        self._base = self.fabric.total_cycles
        self._fmac_before = self._pe_counter("fmac")
        self._links_before = self.links.copy()
        for pe in self.fabric.pes:
            pe.rec = [] if pe.index in self.kept else None
            pe.stall_at = None
        self._open = {}

    def _pe_counter(self, name: str) -> np.ndarray:
        return np.array([pe.counters[name] for pe in self.fabric.pes], dtype=np.int64)

    def cycle(self, t: int, grants: list, injections: list) -> None:
        """Called by :meth:`Fabric.run` each cycle in which routers move wavelets."""
        routers = self.fabric.routers
        links, targets = self.links, routers.route_targets
        for r, c in grants:
            for port, kind, tgt, _ in targets[r][c]:
                links[port, r] += 1
                if kind == TO_EDGE:
                    self._stream(("out",) + tuple(tgt), t)
        for key, r, c in injections:
            self._stream(("in",) + tuple(key) + (c,), t)
        base = self._base
        for r in self.queues:
            level = sum(len(q) for q in routers.fifo[r])
            series = self.occupancy[r]
            if not series or series[-1][1] != level:
                series.append((base + t + 1, level))

    def _stream(self, key: tuple, t: int) -> None:
        span = self._open.get(key)
        if span is not None and span[1] == t:
            span[1] = t + 1
            span[2] += 1
        else:
            span = [t, t + 1, 1]
            self._open[key] = span
            self.streams.setdefault(key, []).append(span)

    def end_run(self, cycles: int) -> None:
        """Called by :meth:`Fabric.run` when the fabric is idle after ``cycles`` cycles."""
        base = self._base
        for spans in self._open.values():
            spans[0] += base
            spans[1] += base
        self._open = {}
        for r in self.queues:
            self.occupancy[r] = [(min(c, base + cycles), v) for c, v in self.occupancy[r]]
        label = self.label or f"run {len(self.runs) + 1}"
        self.label = None
        n = self.width * self.height
        run = RunRecord(label, base, cycles, {
            "fmac": self._pe_counter("fmac") - self._fmac_before, "links": self.links - self._links_before,
            "busy": np.zeros(n, dtype=np.int64), "stall": np.zeros((len(STALL_CAUSES), n), dtype=np.int64)})
        self.runs.append(run)
        self.fmac += run.counters["fmac"]
        cause_row = {c: i for i, c in enumerate(STALL_CAUSES)}
        busy, stall = run.counters["busy"], run.counters["stall"]
        for pe in self.fabric.pes:
            events, pe.rec = pe.rec, None
            if events is None:
                continue
            out = self.slices[pe.index]
            idle_from = 0
            for kind, start, end, detail in sorted(events, key=lambda e: (e[1], -e[2])):
                if kind == "task":
                    busy[pe.index] += end - start
                    if start > idle_from:
                        self._keep(out, ("idle", base + idle_from, base + start, None))
                    idle_from = end
                elif kind == "stall":
                    stall[cause_row[detail[0]], pe.index] += end - start
                self._keep(out, (kind, base + start, base + end, detail))
            if cycles > idle_from:
                self._keep(out, ("idle", base + idle_from, base + cycles, None))
        self.busy += busy
        self.stall += stall

    def _keep(self, out: list, event: tuple) -> None:
        if self.events < self.max_events:
            out.append(event)
            self.events += 1
        else:
            self.dropped += 1

    # ------------------------------------------------------------------ views
    @property
    def total_cycles(self) -> int:
        """Cycles of every recorded run."""
        return sum(run.cycles for run in self.runs)

    def grid(self, values: np.ndarray) -> np.ndarray:
        """A per-PE vector as a ``[height, width]`` array (north row first)."""
        return np.asarray(values).reshape(self.height, self.width)

    def labels(self) -> list[str]:
        """The labels of the recorded runs, each once, in order."""
        return list(dict.fromkeys(run.label for run in self.runs))

    def totals(self, label: str | None = None) -> dict:
        """Per-PE sums of the runs labelled ``label`` (default every run).

        ``cycles`` (int), ``fmac``, ``busy`` (``[n]``), ``stall``
        (``[len(STALL_CAUSES), n]``) and ``links`` (``[5, n]``, N E S W RAMP),
        with ``n`` PEs in row-major order; ``busy`` and ``stall`` cover the
        kept PEs only (``rect``)."""
        runs = [r for r in self.runs if label is None or r.label == label]
        if not runs:
            raise KeyError(f"no run labelled {label!r}; recorded: {', '.join(self.labels())}")
        out = {"cycles": sum(r.cycles for r in runs)}
        for key in ("fmac", "busy", "stall", "links"):
            out[key] = sum(r.counters[key] for r in runs)
        return out

    def pe_sums(self, index: int) -> dict:
        """Cycles of a kept PE's slices by kind (``task``, ``idle``, ``vector``, ``stall``)."""
        sums = dict.fromkeys(("task", "idle", "vector", "stall"), 0)
        for kind, start, end, _ in self.slices[index]:
            sums[kind] += end - start
        return sums


def pe_stall_begin(pe, t: int, cause: tuple) -> None:
    """A PE's fabric instruction could not go on in cycle ``t`` (recording only)."""
    if pe.stall_at is None:
        pe.stall_at = (t, cause)


def pe_stall_end(pe, t: int) -> None:
    """A PE's stalled fabric instruction goes on in cycle ``t`` (recording only)."""
    start, cause = pe.stall_at
    pe.stall_at = None
    if t > start:
        pe.rec.append(("stall", start, t, cause))
