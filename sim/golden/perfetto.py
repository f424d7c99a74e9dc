"""A recorder's events as a Chrome trace-event JSON file, the format ui.perfetto.dev opens.

One microsecond of the timeline is one fabric cycle. The file has three
processes (``docs/pictures.md`` shows how to read them):

* **PEs**: one track per recorded PE, ``PE (x, y)``, with ``task N`` slices,
  the ``vector`` instructions (named by mnemonic) and ``stall`` slices
  (``stall rx color C``, ``stall tx``) nested in them, and ``idle`` slices
  between tasks;
* **host**: a ``phases`` track with one slice per run (a training step's
  phase, a kernel's run), and one track per host stream (``in N0 color 2``:
  the cycles the edge port injected wavelets; ``out E1 color 1``: the cycles
  wavelets left the mesh there);
* **links**: a counter per chosen router, its FIFO occupancy in wavelets.

The events are written with complete (``X``), counter (``C``) and metadata
(``M``) phases; every event carries ``ph``, ``ts``, ``pid`` and ``tid``.
"""

from __future__ import annotations

import json
import os

from wse.atomic import atomic_open

from .events import Recorder

__all__ = ["trace_events", "write_trace"]

PID_PES, PID_HOST, PID_LINKS = 1, 2, 3


def _name(kind: str, detail) -> str:
    if kind == "task":
        return f"task {detail}"
    if kind == "stall":
        return "stall tx" if detail[0] == "tx" else f"stall rx color {detail[1]}"
    if kind == "vector":
        return str(detail)
    return kind


def _meta(pid: int, tid: int, what: str, name: str) -> dict:
    return {"ph": "M", "ts": 0, "pid": pid, "tid": tid, "name": what, "args": {"name": name}}


def _stream_name(key: tuple) -> str:
    direction, edge, index, color = key
    return f"{direction} {edge}{index} color {color}"


def trace_events(recorder: Recorder, title: str = "wse golden model") -> list[dict]:
    """The trace events of ``recorder`` as dictionaries (see the module docstring)."""
    width = recorder.width
    events = [_meta(PID_PES, 0, "process_name", f"{title}: PEs"), _meta(PID_HOST, 0, "process_name", "host"),
              _meta(PID_LINKS, 0, "process_name", "links")]
    for pid, order in ((PID_HOST, 0), (PID_PES, 1), (PID_LINKS, 2)):
        events.append({"ph": "M", "ts": 0, "pid": pid, "tid": 0, "name": "process_sort_index",
                       "args": {"sort_index": order}})
    for index, slices in recorder.slices.items():
        tid = index + 1
        events.append(_meta(PID_PES, tid, "thread_name", f"PE ({index % width}, {index // width})"))
        events.append({"ph": "M", "ts": 0, "pid": PID_PES, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})
        for kind, start, end, detail in slices:
            events.append({"ph": "X", "ts": start, "dur": end - start, "pid": PID_PES, "tid": tid,
                           "name": _name(kind, detail), "cat": kind})
    events.append(_meta(PID_HOST, 1, "thread_name", "phases"))
    for run in recorder.runs:
        events.append({"ph": "X", "ts": run.start, "dur": run.cycles, "pid": PID_HOST, "tid": 1,
                       "name": run.label, "cat": "phase", "args": {"cycles": run.cycles}})
    for tid, (key, spans) in enumerate(sorted(recorder.streams.items(), key=lambda kv: str(kv[0])), start=2):
        events.append(_meta(PID_HOST, tid, "thread_name", f"stream {_stream_name(key)}"))
        for start, end, count in spans:
            events.append({"ph": "X", "ts": start, "dur": end - start, "pid": PID_HOST, "tid": tid,
                           "name": _stream_name(key), "cat": "stream", "args": {"wavelets": count}})
    for tid, (router, series) in enumerate(recorder.occupancy.items(), start=1):
        name = f"FIFO ({router % width}, {router // width})"
        events.append(_meta(PID_LINKS, tid, "thread_name", name))
        for cycle, level in series:
            events.append({"ph": "C", "ts": cycle, "pid": PID_LINKS, "tid": tid, "name": name,
                           "args": {"wavelets": level}})
    return events


def write_trace(recorder: Recorder, path: str | os.PathLike, title: str = "wse golden model") -> int:
    """Write the trace of ``recorder`` to ``path`` (atomically); returns the number of events.

    The file is ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``;
    ``otherData`` says that one microsecond is one cycle and how many slices
    were dropped by ``max_events``."""
    events = trace_events(recorder, title)
    other = {"time_unit": "1 us of the timeline = 1 fabric cycle", "cycles": recorder.total_cycles,
             "mesh": f"{recorder.width}x{recorder.height}", "region": list(recorder.rect),
             "dropped_slices": recorder.dropped}
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write('{"displayTimeUnit": "ns", "otherData": ')
        fh.write(json.dumps(other))
        fh.write(', "traceEvents": [\n')
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        fh.write(",\n".join(map(dumps, events)))
        fh.write("\n]}\n")
    return len(events)
