"""Compile speed of weight streaming at scale: one JSON line per model and mesh.

Each line gives the seconds of every compile stage (trace, plan, op images,
cycle model, the rest of code generation), the total, the cycles of every
phase, PEs x layers and the seconds per million PE-layers (compile time that
grows at most linearly in PEs x layers keeps that figure flat; the growth
lines compare the CPU-second figures, which a busy machine disturbs less, against
the first case and against the previous one: at most 1 is at most linear). With
``--baseline`` the cycle model also runs as the full replay (no skipped
periods, every phase replayed even when an earlier one had the same inputs) in the same process: ``speedup`` is its time over the fast path's,
and ``same_cycles`` says the counts agree. With ``--engines`` the cycle
model also runs with the reference engine (every router and PE visited every
cycle; the same skipped periods and memo): ``engine_speedup`` is its time
over the default engine's (``same_cycles_both_engines``). With ``--columns``
it also runs as before the reduced replay of the first columns
(``wse.host.compiler.replay_columns``), the round-aligned stops of the
period search (``replay_periods.ROUND_ALIGNED``) and the int8 queue counts
(``replay_state.QUEUE_COUNTS``), everything else the same:
``columns_speedup_cpu`` is its CPU time over the default's
(``same_cycles_without_columns``). ``cpu_s`` figures are the process's CPU seconds
(steadier than wall seconds on a shared machine; the cycle model's distinct phase replays run on one thread
per CPU, so its wall seconds can be fewer than its CPU seconds). The cycle cache
(``wse.host.compiler.cycle_cache``) is off, so every figure is a cold compile's, unless
``--warm``: then each case's cycle model runs twice against a fresh, empty cache folder, a cold
run that fills it and a warm one that reads it (the in-process memo emptied before each):
``warm_cycle_model_cpu_s`` and ``warm_cycle_model_s`` are the warm run's CPU and wall seconds,
``warm_speedup_cpu`` the cold CPU seconds over the warm ones, ``same_cycles_warm`` says the
counts agree and ``cycle_cache_entries`` how many replays were stored. With ``--regions`` the cycle
model also runs without the region replay (``wse.host.compiler.replay_region``; the same plan, in the same
process): ``regions_speedup_cpu`` is its CPU time over the default's (``same_cycles_without_regions``).
With ``--cyclic`` the cycle model also runs on the case planned with every activation's features
cyclic (``weight_streaming.SPREAD`` off: rows ``0 .. E-1`` hold a partial last round's ``E`` features,
as before the spread layout of ``docs/weight_streaming.md`` section 3): ``cyclic_speedup_cpu`` is its
CPU time over the spread plan's, ``cyclic_step_cycles`` its step's cycles (the fabric time the
spread layout costs or saves). ``max_rss_gb`` is the process's peak memory so far. ``replay_cpu_s``
gives each distinct replay's CPU seconds (of the thread that ran it) by the first phase that needed
it (phases of equal inputs take its count: ``docs/weight_streaming.md`` section 9 item 4).

    .venv/bin/python bench/compile_speed.py                   # the sizes below that fit a few minutes
    .venv/bin/python bench/compile_speed.py --cases mlp1024 --baseline
    .venv/bin/python bench/compile_speed.py --cases mlp1024 --engines
    .venv/bin/python bench/compile_speed.py --cases mlp2048 --columns
    .venv/bin/python bench/compile_speed.py --cases wafer --cycles-only
    .venv/bin/python bench/compile_speed.py --warm
    .venv/bin/python bench/compile_speed.py --cases mlp2048 mlp4096 --cycles-only --regions
    .venv/bin/python bench/compile_speed.py --cases wafer_rows --cycles-only --cyclic

Cases: ``fc_mnist`` (784-256-256-10, 16x16, batch 64), ``mlp1024``
(1024-1024-1024-10, 32x32, batch 256), ``mlp2048`` (2048-2048-2048-10,
64x64, batch 512), ``mlp4096`` (4096-4096-4096-10, 128x128, batch 1024),
``wafer`` (4096-4096-4096-10 on 750x994, batch 6000: the WSE-2's mesh; with ``--cycles-only`` about 70
minutes and 17 GB on 2 cores), ``wafer_rows`` (the same
model on the wafer's 994 rows and 64 columns, batch 512: its rows' features and a column's tokens, at a
twelfth of its PEs), ``wafer_rows16`` (the same on 16 columns, batch 128: 8 tokens a column as on the
wafer), ``wafer_rows_even`` and ``wafer_even`` (the same meshes and batches with a
3976-wide MLP: 4 features on every one of the 994 rows, where 4096 puts a fifth on rows 0 to 119 only;
``docs/weight_streaming.md`` section 9, "Uneven rows").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {
    "fc_mnist": ((784, 256, 256, 10), (16, 16), 64),
    "mlp1024": ((1024, 1024, 1024, 10), (32, 32), 256),
    "mlp2048": ((2048, 2048, 2048, 10), (64, 64), 512),
    "mlp4096": ((4096, 4096, 4096, 10), (128, 128), 1024),
    "wafer": ((4096, 4096, 4096, 10), (750, 994), 6000),
    "wafer_rows": ((4096, 4096, 4096, 10), (64, 994), 512),
    "wafer_rows16": ((4096, 4096, 4096, 10), (16, 994), 128),
    "wafer_rows_even": ((3976, 3976, 3976, 10), (64, 994), 512),
    "wafer_even": ((3976, 3976, 3976, 10), (750, 994), 6000),
}
DEFAULT = ("fc_mnist", "mlp1024", "mlp2048")


def _model(sizes):
    from torch import nn
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def phase_arguments(parser, mesh, batch: int, png: str | None) -> None:
    """The arguments of a one-phase measurement (``bench/region_replay.py``, ``bench/row_pace.py``,
    ``bench/replay_stretches.py``): ``--mesh``, ``--sizes``, ``--batch``, ``--phase``, ``--layout`` and,
    for a measurement that draws (``png``: what it draws), ``--png``."""
    parser.add_argument("--mesh", nargs=2, type=int, default=list(mesh), metavar=("W", "H"))
    parser.add_argument("--sizes", nargs="+", type=int, default=[4096, 4096, 4096, 10])
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--phase", default="fwd 0")
    parser.add_argument("--layout", choices=("spread", "cyclic"), default="spread",
                        help="a partial last round of features spread over the ring (default) or cyclic")
    if png:
        parser.add_argument("--png", help=png)


def planned_phase(args):
    """``(config, plan, phase)`` of :func:`phase_arguments`' arguments; a
    :class:`~wse.config.UsageError` for a mesh, sizes or batch that are not positive, a ``--png``
    not ending in .png or a phase the plan lacks."""
    import torch

    from wse.config import FabricConfig, UsageError
    from wse.host.compiler import trace, weight_streaming
    from wse.host.compiler.weight_streaming import plan
    bad = ([f"--mesh {args.mesh[0]} {args.mesh[1]}"] if min(args.mesh) < 1 else []) + \
        ([f"--sizes {' '.join(map(str, args.sizes))}"] if len(args.sizes) < 2 or min(args.sizes) < 1 else []) + \
        ([f"--batch {args.batch}"] if args.batch < 1 else [])
    if bad:
        raise UsageError(f"{', '.join(bad)}: expected positive integers (--mesh W H, --sizes of two or more)")
    png = getattr(args, "png", None)
    if png and not png.endswith(".png"):
        raise UsageError(f"--png: {png!r}; expected a file name ending in .png")
    torch.manual_seed(0)
    config = FabricConfig(width=args.mesh[0], height=args.mesh[1])
    with _settings((weight_streaming, "SPREAD", getattr(args, "layout", "spread") == "spread")):
        the_plan = plan(trace(_model(args.sizes), torch.randn(2, args.sizes[0])), config, args.batch)
    if args.phase not in the_plan.phases:
        raise UsageError(f"--phase: no phase {args.phase!r}; expected one of {', '.join(the_plan.phases)}")
    return config, the_plan, the_plan.phases[args.phase]


@contextlib.contextmanager
def figure(path: str, size: tuple[float, float]):
    """A matplotlib figure and axes ``(fig, ax)`` of ``size`` inches for the block, written to ``path``
    as a PNG after it, whole or not at all (:func:`wse.atomic.atomic_open`; a file-system error is a
    one-line :class:`~wse.config.UsageError`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wse.atomic import atomic_open, file_error
    fig, ax = plt.subplots(figsize=size)
    try:
        yield fig, ax
        fig.tight_layout()
        try:
            with atomic_open(path, "wb") as fh:
                fig.savefig(fh, format="png", dpi=120)
        except OSError as exc:
            raise file_error(exc, "write", path) from None
    finally:
        plt.close(fig)


def _timed(fn):
    """``(result, wall seconds, CPU seconds)`` of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


@contextlib.contextmanager
def _settings(*changes):
    """Each ``(module, name, value)`` set for the block, the values before restored after."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in changes]
    try:
        for module, name, value in changes:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _without(what: str, the_plan, changes, counts, cycle_cpu: float, record: dict) -> None:
    """The cycle model again (the memo emptied) with ``changes`` (:func:`_settings`): adds its CPU and
    wall seconds, its CPU time over ``cycle_cpu`` and whether its counts equal ``counts`` to ``record``."""
    from wse.host.compiler import cycles
    cycles.MEMO = cycles.ReplayMemo()
    with _settings(*changes):
        same, wall, cpu = _timed(lambda: cycles.phase_cycles(the_plan, progress=False))
    record[f"without_{what}_cycle_model_cpu_s"] = round(cpu, 3)
    record[f"without_{what}_cycle_model_s"] = round(wall, 3)
    record[f"{what}_speedup_cpu"] = round(cpu / cycle_cpu, 2)
    record[f"same_cycles_without_{what}"] = same == counts


@contextlib.contextmanager
def _cycle_cache(folder: str | None):
    """The cycle cache in ``folder`` for the block, or off with None (the environment restored after)."""
    saved = {k: os.environ.get(k) for k in ("WSE_CYCLE_CACHE", "WSE_CACHE_DIR")}
    if folder is None:
        os.environ["WSE_CYCLE_CACHE"] = "0"
    else:
        os.environ.pop("WSE_CYCLE_CACHE", None)
        os.environ["WSE_CACHE_DIR"] = folder
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _warm_cycle_model(the_plan, record: dict) -> dict[str, int]:
    """The cycle model cold then warm against a fresh cache folder (the memo emptied before each);
    adds the cold and warm figures to ``record`` and returns the cold counts."""
    from wse.host.compiler import cycles
    with tempfile.TemporaryDirectory(prefix="wse-cycle-cache-") as folder, _cycle_cache(folder):
        cycles.MEMO = cycles.ReplayMemo()
        counts, record["cycle_model"], record["cycle_cpu"] = _timed(
            lambda: cycles.phase_cycles(the_plan, progress=False))
        cycles.MEMO = cycles.ReplayMemo()
        warm, wall, cpu = _timed(lambda: cycles.phase_cycles(the_plan, progress=False))
        record.update(warm_cycle_model_s=round(wall, 3), warm_cycle_model_cpu_s=round(cpu, 3),
                      same_cycles_warm=warm == counts,
                      cycle_cache_entries=sum(f.endswith(".cyc") for f in os.listdir(folder)))
    return counts


def run_case(name: str, baseline: bool, cycles_only: bool, engines: bool = False, columns: bool = False,
             warm: bool = False, progress: bool = False, regions: bool = False, cyclic: bool = False) -> dict:
    """Compile one case stage by stage (the cycle cache off; with ``warm`` the cycle model also
    against a fresh cache, cold then warm: :func:`_warm_cycle_model`); the JSON record."""
    import torch

    from wse.config import FabricConfig
    from wse.firmware.training import training_program
    from wse.host.compiler import trace
    from wse.host.compiler import codegen, cycle_cache, cycles, weight_streaming
    from wse.host.compiler.weight_streaming import plan

    sizes, (width, height), batch = CASES[name]
    torch.manual_seed(0)
    stages = {}
    cpu_began = time.process_time()
    began = time.perf_counter()
    graph = trace(_model(sizes), torch.randn(2, sizes[0]))
    stages["trace"] = time.perf_counter() - began
    t = time.perf_counter()
    config = FabricConfig(width=width, height=height)
    the_plan = plan(graph, config, batch)
    stages["plan"] = time.perf_counter() - t
    cycles.MEMO = cycles.ReplayMemo()      # nothing carried over from an earlier case
    cycle_cache.TALLY.replay_cpu_s.clear()
    warm_figures = {}
    if warm:
        counts = _warm_cycle_model(the_plan, warm_figures)
        stages["cycle_model"], cycle_cpu = warm_figures.pop("cycle_model"), warm_figures.pop("cycle_cpu")
        warm_figures["warm_speedup_cpu"] = round(cycle_cpu / max(warm_figures["warm_cycle_model_cpu_s"], 1e-6), 1)
    else:
        counts, stages["cycle_model"], cycle_cpu = _timed(
            lambda: cycles.phase_cycles(the_plan, training_program(config), progress=progress))
    replay_cpu = {phase: round(cpu, 2) for phase, cpu in cycle_cache.TALLY.replay_cpu_s.items()}
    if not cycles_only:
        t = time.perf_counter()
        codegen.generate(the_plan, cycles=False, progress=False)
        stages["codegen_without_cycles"] = time.perf_counter() - t
    total = sum(stages.values())
    cpu_total = time.process_time() - cpu_began - warm_figures.get("warm_cycle_model_cpu_s", 0)    # a cold compile's
    pe_layers = width * height * (len(sizes) - 1)
    record = {"case": name, "sizes": list(sizes), "mesh": f"{width}x{height}", "batch": batch,
              "stages_s": {k: round(v, 3) for k, v in stages.items()}, "compile_s": round(total, 3),
              "pe_layers": pe_layers, "s_per_million_pe_layers": round(total / pe_layers * 1e6, 3),
              "cycle_model_cpu_s": round(cycle_cpu, 3), "compile_cpu_s": round(cpu_total, 3),
              "cpu_s_per_million_pe_layers": round(cpu_total / pe_layers * 1e6, 3),
              "step_cycles": int(sum(counts[n] for n in the_plan.phases)), "phase_cycles": counts,
              "replay_cpu_s": replay_cpu,
              "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2), **warm_figures}
    if engines:
        cycles.MEMO = cycles.ReplayMemo()
        same, _, cpu = _timed(lambda: cycles.phase_cycles(the_plan, progress=False, engine="reference"))
        record["reference_engine_cycle_model_cpu_s"] = round(cpu, 3)
        record["engine_speedup"] = round(cpu / cycle_cpu, 2)
        record["same_cycles_both_engines"] = same == counts
    if columns:      # the cycle model without the reduced replay, the round-aligned stops, int8 counts
        import numpy as np

        from wse.host.compiler import replay, replay_periods, replay_state
        _without("columns", the_plan, [(replay, "COLUMNS", False), (replay_periods, "ROUND_ALIGNED", False),
                                       (replay_state, "QUEUE_COUNTS", np.int32)], counts, cycle_cpu, record)
    if regions:      # the cycle model without the region replay (wse.host.compiler.replay_region)
        from wse.host.compiler import replay_region
        _without("regions", the_plan, [(replay_region, "REGION", False)], counts, cycle_cpu, record)
    if cyclic:       # the same case planned cyclic (no spread last rounds)
        cycles.MEMO = cycles.ReplayMemo()
        with _settings((weight_streaming, "SPREAD", False)):
            cyclic_plan = plan(graph, config, batch)
        cyclic_counts, wall, cpu = _timed(lambda: cycles.phase_cycles(cyclic_plan, progress=progress))
        record["cyclic_cycle_model_cpu_s"] = round(cpu, 3)
        record["cyclic_cycle_model_s"] = round(wall, 3)
        record["cyclic_speedup_cpu"] = round(cpu / cycle_cpu, 2)
        record["cyclic_step_cycles"] = int(sum(cyclic_counts[n] for n in cyclic_plan.phases))
        record["cyclic_phase_cycles"] = cyclic_counts
    if baseline:
        t = time.perf_counter()
        full = cycles.phase_cycles(the_plan, training_program(config), periods=False, progress=False,
                                   reuse=False, engine="reference")
        record["baseline_cycle_model_s"] = round(time.perf_counter() - t, 3)
        record["speedup"] = round(record["baseline_cycle_model_s"] / stages["cycle_model"], 2)
        record["same_cycles"] = full == counts
    return record


def _warm_up() -> None:
    """Load the compiled replay (numba's cache) before anything is timed."""
    import torch

    from wse.config import FabricConfig
    from wse.host.compiler import cycles, trace
    from wse.host.compiler.weight_streaming import plan
    the_plan = plan(trace(_model((4, 24, 3)), torch.randn(2, 4)), FabricConfig(width=2, height=2), 4)
    for periods in (True, False):
        for engine in ("adaptive", "events", "reference"):
            cycles.phase_cycles(the_plan, periods=periods, progress=False, engine=engine, reuse=False)
    wide = plan(trace(_model((5, 96, 64, 3)), torch.randn(2, 5)), FabricConfig(width=12, height=4), 24)
    cycles.phase_cycles(wide, progress=False, reuse=False)      # the reduced replay of the first columns
    import numpy as np

    from wse.host.compiler import replay_state
    with _settings((replay_state, "QUEUE_COUNTS", np.int32)):   # the queue counts of --columns' comparison
        cycles.phase_cycles(the_plan, progress=False, reuse=False)
    from wse.host.compiler import replay_region              # the region replay, its tries made eager
    eager = {"MIN_CELLS": 1, "MIN_PERIOD": 2, "QUIET_STOPS": 1, "FIRST_ROUND_ONLY": False}
    with _settings(*[(replay_region, k, v) for k, v in eager.items()]):
        small = plan(trace(_model((100, 128, 128, 10)), torch.randn(2, 100)), FabricConfig(width=8, height=8), 32)
        cycles.phase_cycles(small, progress=False, reuse=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(DEFAULT))
    parser.add_argument("--baseline", action="store_true", help="also time the full replay (no skipped periods)")
    parser.add_argument("--cycles-only", action="store_true", help="skip code generation (huge meshes)")
    parser.add_argument("--engines", action="store_true", help="also time the reference engine of the replay")
    parser.add_argument("--columns", action="store_true",
                        help="also time the cycle model as before the reduced replay, aligned stops, int8 counts")
    parser.add_argument("--warm", action="store_true",
                        help="also run the cycle model cold then warm against a fresh cycle cache")
    parser.add_argument("--regions", action="store_true",
                        help="also time the cycle model without the region replay (same process, same plan)")
    parser.add_argument("--cyclic", action="store_true",
                        help="also time the cycle model of the case planned cyclic (no spread last rounds)")
    parser.add_argument("--progress", action="store_true",
                        help="report the cycle model's phases on stderr as they finish (long runs)")
    args = parser.parse_args(argv)
    records = []
    with _cycle_cache(None):        # cold compiles: the cycle cache only where --warm gives it a fresh folder
        _warm_up()
        for name in args.cases:
            records.append(run_case(name, args.baseline, args.cycles_only, args.engines, args.columns, args.warm,
                                    args.progress, args.regions, args.cyclic))
            print(json.dumps(records[-1]), flush=True)
    if len(records) > 1:       # growth: CPU seconds per PE-layer against the first case and the previous one
        first = records[0]["cpu_s_per_million_pe_layers"]
        print(json.dumps({"growth_vs_" + records[0]["case"]: {
            r["case"]: round(r["cpu_s_per_million_pe_layers"] / first, 2) for r in records[1:]}}), flush=True)
        print(json.dumps({"growth_vs_previous_row": {   # <= 1: at most linear in PEs x layers from row to row
            b["case"]: round(b["cpu_s_per_million_pe_layers"] / a["cpu_s_per_million_pe_layers"], 2)
            for a, b in zip(records, records[1:])}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
