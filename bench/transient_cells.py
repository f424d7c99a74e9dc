"""The cells of a phase that no recorded period holds, as the mesh grows in rows: the work that keeps
compile time from growing linearly with PEs x layers (``docs/weight_streaming.md`` section 9, "Why
growth stays above linear").

For each ``--rows`` H, plans an MLP about ``--per-row`` features wide a row (default 4.12: four on
every row and a fifth on 12% of them, spread, as the 4096-wide MLP on the wafer's 994 rows) on a
``--columns`` x H mesh at ``--tokens`` tokens a column, replays ``--phase`` on the reference engine a
cycle at a time and hashes every cell's relative state each cycle (the region replay's per-cell hash,
``RegionSearch._signature``, of the period search's snapshot: queues, output queue from its head,
cycles until free, element index, an element entering the output queue, a pending write, done). A cell is *periodic* at cycle ``t`` when its state equals
its state ``D`` cycles before and its op rows moved as many rows in the last ``D`` cycles as in the
``D`` before (``D``: ``--period``, the phase's steady period: 106 cycles for 8 tokens and four or five
features a row). The others are the cells a replay that takes the rest of the mesh from a recorded
period must step (the region replay, section 9 item 6), and while any exist the whole state does not
repeat, so the period search's skips and jumps take nothing: their count over the phase (the
*aperiodic cell-cycles*) bounds that kind of replay's work from below (two states that hash alike
count as equal, so a collision can only lower the count). One JSON line per H: the
phase's cycles, the aperiodic cell-cycles in all and per cell, those of the fill (up to the first
cycle at which every cell is periodic) and of the rest (the round boundaries and the last round), the
fraction of cells periodic at the phase's middle (a check on ``D``), and the CPU seconds of the cycle
model's replay of the phase (``replay.run_replay``, the default engine and every rule).

``--png`` draws each row count's aperiodic cycles a cell, the fill's and the rest's, beside the
least-squares line ``a + b H`` through them.

``--skew S`` starts row ``i``'s PEs ``round(S * (H - 1 - i))`` cycles late, as if their op lists began
with that many private cycles (an experiment on the fabric's schedule, not what the compiler emits):
the column ring's steady state has each row about 2.4 cycles ahead of the row before it, and a start
already skewed so skips most of the fill, at the price of a later end. The replay's CPU seconds are
then left out (``null``).

    .venv/bin/python bench/transient_cells.py --png docs/img/transient_cells.png   # H = 128, 256, 512, 994 on 8 columns: about 8 minutes
    .venv/bin/python bench/transient_cells.py --rows 994 --skew 2.4   # the same start, skewed
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def off_period(hashes: np.ndarray, pcs: np.ndarray, t: int, period: int) -> np.ndarray:
    """Which cells are not periodic with ``period`` at cycle ``t`` (module docstring), from ring buffers
    ``hashes`` and ``pcs`` (``[2 * period + 1, cells]``, cycle ``u`` at row ``u mod`` their length) holding
    cycles ``t - 2 * period`` to ``t``: the state differs from ``period`` cycles before, or the op rows
    moved a different number of rows over the last ``period`` cycles than over the ``period`` before."""
    keep = hashes.shape[0]
    k, a, b = t % keep, (t - period) % keep, (t - 2 * period) % keep
    return (hashes[k] != hashes[a]) | (pcs[k] - pcs[a] != pcs[a] - pcs[b])


def aperiodic_cells(routes, ports, ops, queues, cores, events, scalars, period: int):
    """Step the reference replay a cycle at a time until every PE has reached the end of its op list:
    ``(the phase's cycles, per-cycle counts of the cells not periodic with ``period``)`` (module
    docstring; every cell counts before ``2 * period``; the last PEs' closing private cycles are not
    stepped)."""
    from wse.host.compiler.replay import _FINISHED, _LAST, _OUT_OF_TIME, _run
    from wse.host.compiler.replay_periods import _snapshot
    from wse.host.compiler.replay_region import RegionSearch
    cells, colors = queues.router_fifo.shape
    keep = 2 * period + 1
    hashes = np.zeros((keep, cells), np.uint64)
    pcs = np.zeros((keep, cells), np.int64)
    counts, t = [], 0
    while True:
        t += 1
        status = _run(routes, ports, ops, queues, cores, events, scalars, t, -1)
        if status == _FINISHED:
            return int(scalars[_LAST] + 1), np.array(counts)
        if status != _OUT_OF_TIME:
            raise RuntimeError("the cycle model's replay hung: the schedule would not finish on the fabric")
        k = t % keep
        hashes[k] = RegionSearch._signature(_snapshot(queues, cores, events, ports, t, colors, scalars))
        pcs[k] = cores.pc
        if t < 2 * period:
            counts.append(cells)
            continue
        counts.append(int(off_period(hashes, pcs, t, period).sum()))


def measure(rows: int, args) -> dict:
    """The JSON line of one row count (module docstring)."""
    from compile_speed import planned_phase

    from wse.host.compiler import cycles, replay
    from wse.host.compiler.replay_state import fresh_run
    width = round(args.per_row * rows)
    case = argparse.Namespace(mesh=[args.columns, rows], sizes=[width, width, width, 10],
                              batch=args.columns * args.tokens, phase=args.phase, layout="spread")
    config, plan, phase = planned_phase(case)
    ops, starts, ends = cycles.phase_ops(plan, phase)
    network = cycles.Network(config, plan.routes)
    inject = cycles.phase_injections(phase)
    replay_cpu = None
    if not args.skew:
        began = time.process_time()
        replay.run_replay(network, ops, starts, ends, inject)
        replay_cpu = round(time.process_time() - began, 2)
    state = fresh_run(network, ops, starts, inject)
    cores = state[4]
    if args.skew:
        row = np.arange(cores.pc.shape[0]) // config.width
        cores.free_at[:] = np.round(args.skew * (rows - 1 - row)).astype(np.int64)
    count, per_cycle = aperiodic_cells(*state, args.period)
    cells = config.width * config.height
    settled = np.flatnonzero(per_cycle[2 * args.period:] == 0)
    fill_end = int(settled[0]) + 2 * args.period if settled.size else len(per_cycle)
    return {"mesh": f"{config.width}x{config.height}", "sizes": case.sizes, "batch": case.batch,
            "phase": args.phase, "skew": args.skew, "period": args.period, "cycles": count,
            "aperiodic_cell_cycles": int(per_cycle.sum()),
            "aperiodic_cycles_per_cell": round(float(per_cycle.sum()) / cells, 1),
            "fill_cycles": fill_end, "fill_aperiodic_per_cell": round(float(per_cycle[:fill_end].sum()) / cells, 1),
            "rest_aperiodic_per_cell": round(float(per_cycle[fill_end:].sum()) / cells, 1),
            "periodic_at_middle": round(1 - float(per_cycle[len(per_cycle) // 2]) / cells, 4),
            "replay_cpu_s": replay_cpu}


def _picture(path: str, lines: list) -> None:
    """The aperiodic cycles a cell per row count, the fill's under the rest's, and the fitted line."""
    from compile_speed import figure
    rows = np.array([int(line["mesh"].split("x")[1]) for line in lines])
    fill = np.array([line["fill_aperiodic_per_cell"] for line in lines])
    rest = np.array([line["rest_aperiodic_per_cell"] for line in lines])
    width = 0.6 * min(np.diff(np.sort(rows)).min() if len(rows) > 1 else rows[0], rows.min())
    with figure(path, (7, 4.2)) as (fig, ax):
        ax.bar(rows, fill, width, label="the fill", color="#4c72b0")
        ax.bar(rows, rest, width, bottom=fill, label="round boundaries and the last round", color="#dd8452")
        if len(rows) > 1:
            b, a = np.polyfit(rows, fill + rest, 1)
            span = np.array([0, rows.max() * 1.05])
            ax.plot(span, a + b * span, "k--", lw=1, label=f"{a:,.0f} + {b:.1f} x rows")
        ax.set_xlabel("rows of the mesh")
        ax.set_ylabel("cycles a cell off the period")
        first = lines[0]
        ax.set_title(f"cells no {first['period']}-cycle period holds, {first['phase']}, "
                     f"{first['mesh'].split('x')[0]} columns", fontsize=10)
        ax.legend(fontsize=8)


def main(argv=None) -> int:
    from wse.config import UsageError
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[128, 256, 512, 994])
    parser.add_argument("--columns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8, help="tokens a column (the batch is columns x tokens)")
    parser.add_argument("--per-row", type=float, default=4.12, help="the MLP's width over the rows")
    parser.add_argument("--phase", default="fwd 0")
    parser.add_argument("--period", type=int, default=106, help="the phase's steady period D, cycles")
    parser.add_argument("--skew", type=float, default=0.0, help="start row i this many cycles a row late")
    parser.add_argument("--png", help="draw the aperiodic cycles a cell per row count into this PNG file")
    args = parser.parse_args(argv)
    if args.png and not args.png.endswith(".png"):
        raise UsageError(f"--png: {args.png!r}; expected a file name ending in .png")
    bad = [f"--{k} {v}" for k, v in (("rows", min(args.rows)), ("columns", args.columns), ("tokens", args.tokens),
                                       ("period", args.period)) if v < 1]
    bad += [f"--{k} {v}" for k, v in (("per-row", args.per_row), ("skew", args.skew)) if v < 0]
    if bad or round(args.per_row * min(args.rows)) < 1:
        raise UsageError(f"{', '.join(bad) or f'--per-row {args.per_row}'}: expected positive rows, columns, "
                         "tokens and period, a width of at least one feature and a skew of 0 or more")
    lines = []
    for rows in args.rows:
        lines.append(measure(rows, args))
        print(json.dumps(lines[-1]), flush=True)
    if args.png:
        _picture(args.png, lines)
    return 0


if __name__ == "__main__":
    from wse.cli import run
    raise SystemExit(run(main, "transient_cells.py"))
