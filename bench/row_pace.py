"""Each row's pace through a weight-streaming phase: one JSON line, and a heatmap with ``--png``.

The measurement behind "Uneven rows" in ``docs/weight_streaming.md`` section 9. The
reference replay (:func:`wse.host.compiler.replay._run`) runs the phase in strides of
``--every`` cycles; after each stride the first PE of every row reports how many op rows it
moved on in the stride (a row's PEs move together: the row's weight multicast ties them).
A row's *pace* in a stride is that count over the stride's cycles. The line gives the
phase's cycles (when the strides reach its end), the strides, the slowest pace (the median of
the slowest tenth of the rows over the middle stride) and, every tenth stride, how many rows
moved within 10% of it (``rows_at_slow_pace``; a stride counts whole op rows). With 4096
features on 994 rows and ``--layout cyclic``, rows 0 to 119 hold five features and set that pace,
and the count grows stride by stride as the boundary between the two paces moves down the column
ring; with the spread layout (the default: the five-feature rows every 8 or 9 rows), or a width
that gives every row the same features, every row is at it within a few strides.

    .venv/bin/python bench/row_pace.py --layout cyclic --png docs/img/row_pace.png   # 16x994, fwd 0: about 3 minutes
    .venv/bin/python bench/row_pace.py --png docs/img/row_pace_spread.png           # the spread layout (default)
    .venv/bin/python bench/row_pace.py --sizes 3976 3976 3976 10             # every row four features
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def row_paces(network, ops, starts, ends, inject, every: int, until: int | None):
    """``(paces [strides, rows], cycles or None)``: op rows a cycle of each row's first PE per stride of
    ``every`` cycles, up to the phase's end or ``until`` cycles; its cycles if the run finished."""
    from wse.host.compiler.replay import _FINISHED, _LAST, _OUT_OF_TIME, _run
    from wse.host.compiler.replay_state import fresh_run

    width, height = network.config.width, network.config.height
    routes, ports, ops, queues, cores, events, scalars = fresh_run(network, ops, starts, inject)
    first = np.arange(height) * width
    seen, paces, t = cores.pc[first].copy(), [], 0
    while until is None or t < until:
        t += every
        status = _run(routes, ports, ops, queues, cores, events, scalars, t, -1)
        now = cores.pc[first].copy()
        paces.append((now - seen) / every)
        seen = now
        if status == _FINISHED:
            return np.array(paces), int(scalars[_LAST] + 1)
        if status != _OUT_OF_TIME:
            raise RuntimeError("the cycle model's replay hung: the schedule would not finish on the fabric")
    return np.array(paces), None


def summary(paces: np.ndarray, every: int) -> dict:
    """The slowest pace and, every tenth stride, the rows within 10% of it (module docstring)."""
    rows = paces.shape[1]
    middle = np.sort(paces[paces.shape[0] // 2])      # a full stride (the last may end with the phase)
    slow = float(np.median(middle[:max(1, rows // 10)]))
    near = np.abs(paces - slow) <= 0.1 * slow
    return {"slow_pace": round(slow, 4),
            "rows_at_slow_pace": [[(i + 1) * every, int(near[i].sum())] for i in range(9, paces.shape[0], 10)]}


def _picture(path: str, paces: np.ndarray, every: int, title: str) -> None:
    from compile_speed import figure
    with figure(path, (9, 4.5)) as (fig, ax):
        image = ax.imshow(paces.T, aspect="auto", origin="lower", interpolation="nearest", cmap="viridis",
                          extent=(0, paces.shape[0] * every, 0, paces.shape[1]))
        fig.colorbar(image, ax=ax, label="op rows a cycle (row's first PE)")
        ax.set_xlabel("cycle")
        ax.set_ylabel("row")
        ax.set_title(title, fontsize=10)


def main(argv=None) -> int:
    from compile_speed import phase_arguments, planned_phase
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    phase_arguments(parser, (16, 994), 128, "draw every row's pace per stride into this PNG file")
    parser.add_argument("--every", type=int, default=1000, help="cycles a stride")
    parser.add_argument("--until", type=int, default=None, help="stop after this many cycles (default: the end)")
    args = parser.parse_args(argv)
    from wse.config import UsageError
    bad = [f"--{k} {v}" for k, v in (("every", args.every), ("until", args.until)) if v is not None and v < 1]
    if bad:
        raise UsageError(f"{', '.join(bad)}: expected a positive number of cycles")
    from wse.host.compiler import cycles
    config, the_plan, phase = planned_phase(args)
    ops, starts, ends = cycles.phase_ops(the_plan, phase)
    network = cycles.Network(config, the_plan.routes)
    paces, count = row_paces(network, ops, starts, ends, cycles.phase_injections(phase), args.every, args.until)
    mesh = f"{config.width}x{config.height}"
    record = {"mesh": mesh, "sizes": args.sizes, "batch": args.batch, "phase": args.phase, "cycles": count,
              "every": args.every, "strides": int(paces.shape[0]), **summary(paces, args.every)}
    if args.png:
        _picture(args.png, paces, args.every, f"each row's pace, {args.phase}, {'-'.join(map(str, args.sizes))} MLP "
                                              f"on {mesh}, batch {args.batch}")
        record["png"] = args.png
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    from wse.cli import run
    raise SystemExit(run(main, "row_pace.py"))
