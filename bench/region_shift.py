"""Does a phase repeat but for a small moving region? One JSON line per phase.

The measurement behind the "periodic background, simulated active region" lead
of ``docs/weight_streaming.md`` section 9 ("What is not solved"): if every PE
outside a small region ``S(t)`` has at every cycle ``t >= t0`` the relative
state it had ``D`` cycles earlier, an exact replay could simulate only ``S(t)``
and a one-hop margin, take the rest from one recorded period, and grow ``S``
where a margin PE leaves its periodic state. This script measures the premise
and what it would save; it does not build that replay.

The reference replay (:func:`wse.host.compiler.replay._run`) is stepped one
cycle at a time (on big meshes up to ``--cycles``), and at the start of every
cycle each PE's relative state is hashed twice (two independent 64-bit
hashes; a pair is numbered once, so a PE's states at two cycles are equal when
their numbers are, but for a chance of about 2**-128). The state is
``replay_columns._features`` (cycles until free, element index, an element
entering the output queue, done; the router's FIFOs, input queues, output
queue from the head, pending writes) with the PE's op row itself in place of
its index in the list, as the period search's ``replay_periods._state_hash``
has it, and the colors the PE's edge ports still hold. Then:

- ``period``: the smallest ``D`` in ``1 .. --max-period`` whose share of PEs
  with ``state(t) == state(t - D)``, over cycles of the second half of the
  stepped ones, is within ``0.01`` of the best ``D``'s (``periods``: the five
  best; ``candidates``: the shares of ``--candidates`` and ``lcm(D, colors)``).
- ``S(t)``: the PEs whose state differs from ``D`` cycles earlier. ``runs``:
  the runs of cycles with ``|S(t)| <= --small`` of the PEs at least
  ``min(D, 512)`` long; the *stretch* goes from the first run's start
  (``t0 + D``) to the last one's end (``stretch_end``): the fill before it and
  the drain after it are not periodic; ``small_share``: its cycles with ``S``
  that small. Over the stretch: ``|S|`` max and mean, its bounding box (the
  union's, and the largest one cycle's), how its columns move (lines fitted
  to its mean and its east edge: ``columns_per_period``; ``track``: the box
  once a period, ``[cycle, first column, last column, first row, last
  row]``), ``empty_from`` (the first cycle from which ``S`` stays empty to the
  stretch's end; ``null`` if it is not empty there), and ``jumps`` (cycles at
  which a PE joined ``S`` that was neither in ``S`` nor a 4-neighbour of one a
  cycle earlier: a region grown one hop a cycle would have missed it;
  ``jumped_at``: the first, as ``[cycle, row, column]``).
- ``region_pe_cycles`` against ``full_pe_cycles``: the PE-cycles the region
  scheme would step (``|S(t)|`` plus its one-hop margin, summed over the
  stretch) against the full replay's PEs times cycles over the same stretch.
- the rotation: ``period_mod_colors``, the conflicts (grants that depended on
  the color rotation, ``_CONFLICTS``) in the stretch, and those at routers
  outside ``S(t)`` and its margin (``background_conflicts``: with none, no
  grant of the background depended on the rotation). Conflicts are counted
  per router by :func:`_router_conflicts` and checked, cycle by cycle, to sum
  to the replay's own count. ``premise_holds``: a stretch, no jumps, and the
  rotation the same ``D`` cycles earlier or no background conflicts.
- ``aligned``, when ``D`` is not a multiple of ``colors``: the same record for
  the best multiple of ``colors`` up to ``2 lcm(D, colors)`` (chosen as ``D``
  is, among the multiples: the rotation's phase is then the same a period
  earlier), where the stepped cycles reach it.

    .venv/bin/python bench/region_shift.py                              # 8x8, fwd 0
    .venv/bin/python bench/region_shift.py --mesh 16 16 --sizes 512 512 512 10 --batch 128 \\
        --phases "fwd 0" "bwd-data 4"
    .venv/bin/python bench/region_shift.py --mesh 64 64 --sizes 2048 2048 2048 10 --batch 512 \\
        --phases "fwd 0" --cycles 16000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wse.host.compiler.replay_region_steps import _port_conflicts  # noqa: E402
from wse.host.compiler.replay_region_steps import _router_conflicts as _router_conflicts_of  # noqa: E402
from wse.host.compiler.replay_state import new_events  # noqa: E402


def _router_conflicts(routes, rows, index, queues, ports, first_color, out, scratch) -> int:
    """Per router, the conflicts :func:`replay._grant_routers` and :func:`replay._grant_injections`
    count at this start-of-cycle state (an edge port's at its router), into ``out`` (the region
    replay's own counts, :mod:`wse.host.compiler.replay_region_steps`); returns their sum."""
    _router_conflicts_of(rows, index, queues, routes.router_depth, routes.rx_depth, first_color, scratch, out)
    _port_conflicts(routes, queues, ports, first_color, np.zeros(0, np.bool_), out)
    return int(out.sum())


def _state_ids(features: np.ndarray, weights, numbers: dict) -> np.ndarray:
    """Each PE's state number ``int32 [PEs]``: its two hashes, numbered in order of first sight."""
    f = features.astype(np.uint64)
    pair = np.ascontiguousarray(np.stack([f @ weights[0], f @ weights[1]], axis=1))
    keys, inverse = np.unique(pair.view(np.dtype((np.void, 16))).ravel(), return_inverse=True)
    ids = np.array([numbers.setdefault(k.tobytes(), len(numbers)) for k in keys], dtype=np.int32)
    return ids[inverse.ravel()]


def _edge_feature(ports, routers: int) -> np.ndarray:
    """Per router, the colors its edge ports still hold, as bits (port code times ``colors`` on)."""
    colors = ports.left.shape[1]
    bits = ((ports.left > 0) * (1 << np.arange(colors, dtype=np.int64))).sum(axis=1) << (colors * ports.code)
    out = np.zeros(routers, dtype=np.int64)
    np.add.at(out, ports.router, bits)
    return out


def step(network, ops, starts, inject, cycles_limit: int):
    """Step the reference replay a cycle at a time up to ``cycles_limit`` stepped cycles (or the end).

    Returns the stepped cycles ``times``, the state numbers ``[len(times), PEs]``, per-router
    conflicts as ``(t, router, count)`` rows, the total conflicts, the phase's cycles (``None``
    when stopped early) and the CPU seconds."""
    from wse.host.compiler.replay import _CONFLICTS, _FINISHED, _LAST, _OUT_OF_TIME, _T, _WRITE, _packed, _run
    from wse.host.compiler.replay_columns import _features
    from wse.host.compiler.replay_state import fresh_run
    routes, ports, ops32, queues, cores, events, scalars = fresh_run(network, ops, starts, inject)
    rows, index = _packed(routes)
    starts = np.asarray(starts, dtype=np.int64)
    pes, colors = queues.rx.shape
    rng = np.random.default_rng(0)
    weights = None
    numbers: dict = {}
    times, ids, conflicts = [], [], []
    per_router = np.zeros(pes, dtype=np.int64)
    scratch = new_events(colors)
    started, count = time.process_time(), None
    while len(times) < cycles_limit:
        t = int(scalars[_T])
        n = int(events.count[_WRITE])
        features = _features(queues, cores, (events.who[_WRITE, :n], events.color[_WRITE, :n]), starts, t)
        features = np.concatenate([ops32[cores.pc], features[:, 1:], _edge_feature(ports, pes)[:, None]], axis=1)
        if weights is None:
            weights = [rng.integers(1, 2**63, features.shape[1], dtype=np.uint64) | np.uint64(1) for _ in range(2)]
        times.append(t)
        ids.append(_state_ids(features, weights, numbers))
        expected = _router_conflicts(routes, rows, index, queues, ports, t % colors, per_router, scratch)
        before = int(scalars[_CONFLICTS])
        status = _run(routes, ports, ops32, queues, cores, events, scalars, t + 1, -1)
        if int(scalars[_CONFLICTS]) - before != expected:
            raise RuntimeError(f"cycle {t}: per-router conflicts {expected} != the replay's "
                               f"{int(scalars[_CONFLICTS]) - before}")
        for r in np.flatnonzero(per_router):
            conflicts.append((t, int(r), int(per_router[r])))
        if status == _FINISHED:
            count = int(scalars[_LAST]) + 1
            break
        if status != _OUT_OF_TIME:
            raise RuntimeError("the replay hung")
    return (np.array(times), np.stack(ids), np.array(conflicts, dtype=np.int64).reshape(-1, 3),
            int(scalars[_CONFLICTS]), count, time.process_time() - started)


def _dilate(mask: np.ndarray) -> np.ndarray:
    """``mask [n, H, W]`` and its 4-neighbours in the mesh (the one-hop margin)."""
    out = mask.copy()
    out[:, 1:, :] |= mask[:, :-1, :]
    out[:, :-1, :] |= mask[:, 1:, :]
    out[:, :, 1:] |= mask[:, :, :-1]
    out[:, :, :-1] |= mask[:, :, 1:]
    return out


def shares_of(times, ids, periods, samples: int = 400) -> dict:
    """Per ``D`` of ``periods``, the share of PEs whose state equals ``D`` cycles earlier, over up
    to ``samples`` cycles of the second half of ``times`` (those with a stepped cycle ``D`` before)."""
    at = np.full(int(times[-1]) + 1, -1)
    at[times] = np.arange(len(times))
    late = np.flatnonzero(times >= times[len(times) // 2])
    late = late[np.linspace(0, late.size - 1, min(samples, late.size)).astype(int)]
    shares = {}
    for period in periods:
        back = times[late] - period
        earlier = np.where(back >= 0, at[np.maximum(back, 0)], -1)
        ok = earlier >= 0
        if ok.any():
            shares[int(period)] = float((ids[late[ok]] == ids[earlier[ok]]).mean())
    return shares


def find_period(times, ids, max_period: int) -> tuple[int | None, dict]:
    """The smallest ``D`` in ``1 .. max_period`` whose share (:func:`shares_of`) is within 0.01 of
    the best ``D``'s, and the share of every ``D`` tried."""
    shares = shares_of(times, ids, range(1, max_period + 1))
    if not shares:
        return None, {}
    best = max(shares.values())
    return min(d for d, s in shares.items() if s >= best - 0.01), shares


def _runs(flags: np.ndarray, least: int) -> list[tuple[int, int]]:
    """The runs of true ``flags`` at least ``least`` long: (first, one past the last) indices."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2]) if b - a >= least]


def region(times, ids, conflicts, period: int, width: int, height: int, small: float) -> dict:
    """The record of ``S(t)`` for the period ``period`` (module docstring)."""
    pes = width * height
    at = np.full(int(times[-1]) + 1, -1)
    at[times] = np.arange(len(times))
    mine = np.flatnonzero(times >= period)
    earlier = at[times[mine] - period]
    mine, earlier = mine[earlier >= 0], earlier[earlier >= 0]
    if mine.size == 0:
        return {"t0": None}
    differs = ids[mine] != ids[earlier]                     # [n, PEs]: S(t)
    size = differs.sum(axis=1)
    runs = _runs(size <= small * pes, min(period, 512))
    first, last = (runs[0][0], runs[-1][1]) if runs else (None, 0)
    record = {"t0": None if first is None else int(times[mine[first]]) - period,
              "stretch_end": None if first is None else int(times[mine[last - 1]]),
              "stepped_in_stretch": 0 if first is None else last - first}
    if first is None:
        return record
    record["runs"] = [[int(times[mine[a]]), int(times[mine[b - 1]])] for a, b in runs[:16]]
    record["small_share"] = round(float((size[first:last] <= small * pes).mean()), 4)
    t = times[mine[first:last]]
    s = differs[first:last].reshape(-1, height, width)
    n = size[first:last]
    margin = _dilate(s)
    grown = s[1:] & ~margin[:-1] & (np.diff(t) == 1)[:, None, None]
    nonzero = np.flatnonzero(n)
    record.update({"S_max": int(n.max()), "S_mean": round(float(n.mean()), 2),
                   "region_pe_cycles": int(margin.sum()), "full_pe_cycles": int(pes * t.size),
                   "jumps": int(grown.any(axis=(1, 2)).sum()), "jumped_pes": int(grown.sum()),
                   "jumped_at": [[int(t[1 + k]), int(i), int(j)] for k, i, j in np.argwhere(grown)[:8]]})
    record["region_share"] = round(record["region_pe_cycles"] / record["full_pe_cycles"], 5)
    empty = np.flatnonzero(n > 0)
    record["empty_from"] = int(t[0]) if empty.size == 0 else (int(t[empty[-1] + 1]) if empty[-1] + 1 < t.size
                                                                 else None)
    if nonzero.size:
        rows_any, cols_any = s.any(axis=2), s.any(axis=1)   # [n, H], [n, W]
        k = np.arange(max(width, height))
        row_lo = np.where(rows_any, k[:height], height).min(axis=1)[nonzero]
        row_hi = np.where(rows_any, k[:height], -1).max(axis=1)[nonzero]
        col_lo = np.where(cols_any, k[:width], width).min(axis=1)[nonzero]
        col_hi = np.where(cols_any, k[:width], -1).max(axis=1)[nonzero]
        mean_col = (s[nonzero].sum(axis=1) * k[:width]).sum(axis=1) / n[nonzero]
        record["bbox"] = {"rows": [int(row_lo.min()), int(row_hi.max())], "columns": [int(col_lo.min()),
                                                                                     int(col_hi.max())],
                          "max_height": int((row_hi - row_lo).max() + 1), "max_width": int((col_hi - col_lo).max() + 1)}
        if nonzero.size > 1 and np.ptp(t[nonzero]) > 0:
            record["columns_per_period"] = {
                "mean": round(float(np.polyfit(t[nonzero], mean_col, 1)[0]) * period, 3),
                "east_edge": round(float(np.polyfit(t[nonzero], col_hi, 1)[0]) * period, 3)}
        track = [int(t[nonzero[0]])] + [int(x) for x in np.arange(t[nonzero[0]] + period, t[nonzero[-1]], period)]
        record["track"] = [[c, int(col_lo[i]), int(col_hi[i]), int(row_lo[i]), int(row_hi[i])]
                           for c in track[:64] for i in [int(np.searchsorted(t[nonzero], c))] if i < nonzero.size]
    position = np.full(len(times), -1)                      # stepped index -> index in the stretch
    position[mine[first:last]] = np.arange(last - first)
    inside = conflicts[(conflicts[:, 0] >= t[0]) & (conflicts[:, 0] <= t[-1])]
    where = position[at[inside[:, 0]]]
    inside, where = inside[where >= 0], where[where >= 0]
    record["conflicts_after_t0"] = int(inside[:, 2].sum())
    record["background_conflicts"] = int(inside[~margin.reshape(-1, pes)[where, inside[:, 1]], 2].sum())
    return record


def measure(network, ops, starts, inject, args) -> dict:
    """Step one phase and measure it: the JSON record of the module docstring."""
    cfg = network.config
    times, ids, conflicts, total, count, cpu = step(network, ops, starts, inject, args.cycles)
    period, shares = find_period(times, ids, min(args.max_period, max(1, int(times[-1]) // 2)))
    best = sorted(shares.items(), key=lambda kv: -kv[1])[:5]
    aligned = None
    if period is not None:
        lcm = period * cfg.colors // int(np.gcd(period, cfg.colors))
        shares.update(shares_of(times, ids, [d for d in set(args.candidates) | {lcm} if d not in shares]))
        multiples = shares_of(times, ids, range(cfg.colors, min(2 * lcm, int(times[-1]) // 2) + 1, cfg.colors))
        if multiples:
            top = max(multiples.values())
            aligned = min(d for d, v in multiples.items() if v >= top - 0.01)
            shares[aligned] = multiples[aligned]
    record = {"cycles": count, "stepped_cycles": int(times.size), "last_stepped": int(times[-1]),
              "step_cpu_s": round(cpu, 1), "conflicts": total, "period": period}
    if period is None:
        return record
    colors = cfg.colors
    record.update({"period_mod_colors": period % colors, "period_share": round(shares[period], 5),
                   "periods": {str(d): round(s, 5) for d, s in best},
                   "candidates": {str(d): round(shares[d], 5) for d in sorted(set(args.candidates) | {lcm})
                                  if d in shares}})
    record.update(_judged(region(times, ids, conflicts, period, cfg.width, cfg.height, args.small), period, colors))
    if aligned is not None and aligned != period:
        record["aligned"] = {"period": aligned, "share": round(shares[aligned], 5), **_judged(
            region(times, ids, conflicts, aligned, cfg.width, cfg.height, args.small), aligned, colors)}
    return record


def _judged(record: dict, period: int, colors: int) -> dict:
    """``record`` with ``premise_holds``: a stretch, no PE joining ``S`` from outside its margin, and
    the rotation the same ``D`` cycles earlier or no background grant depending on it."""
    record["premise_holds"] = bool(record.get("t0") is not None and record.get("jumps") == 0 and
                                   (record.get("background_conflicts") == 0 or period % colors == 0))
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", nargs=2, type=int, default=[8, 8], metavar=("W", "H"))
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 128, 128, 10])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--phases", nargs="*", default=["fwd 0"], help="phase names (default: fwd 0; none: all)")
    parser.add_argument("--cycles", type=int, default=1 << 40, help="step at most this many cycles of a phase")
    parser.add_argument("--max-period", type=int, default=5000, help="the largest period D searched")
    parser.add_argument("--candidates", nargs="*", type=int, default=[538], help="periods to report shares of")
    parser.add_argument("--small", type=float, default=0.05,
                        help="t0: from t0 + D on, S(t) holds at most this share of the PEs")
    args = parser.parse_args(argv)
    import torch

    from compile_speed import _model
    from wse.config import FabricConfig, UsageError
    from wse.host.compiler import cycles, trace
    from wse.host.compiler.weight_streaming import plan
    for name, value, least in (("--cycles", args.cycles, 2), ("--max-period", args.max_period, 1),
                               ("--batch", args.batch, 1)):
        if value < least:
            raise UsageError(f"{name}: {value}; expected an integer of at least {least}")
    if not 0 <= args.small <= 1:
        raise UsageError(f"--small: {args.small}; expected a share of the PEs from 0 to 1")
    torch.manual_seed(0)
    config = FabricConfig(width=args.mesh[0], height=args.mesh[1])
    the_plan = plan(trace(_model(args.sizes), torch.randn(2, args.sizes[0])), config, args.batch)
    unknown = [p for p in args.phases if p not in the_plan.phases]
    if unknown:
        raise UsageError(f"--phases: no phase {unknown[0]!r}; expected one of {', '.join(the_plan.phases)}")
    network = cycles.Network(config, the_plan.routes)
    for name, phase in the_plan.phases.items():
        if args.phases and name not in args.phases:
            continue
        ops, starts, _ = cycles.phase_ops(the_plan, phase)
        record = measure(network, ops, starts, cycles.phase_injections(phase), args)
        print(json.dumps({"mesh": f"{args.mesh[0]}x{args.mesh[1]}", "sizes": args.sizes, "batch": args.batch,
                          "phase": name, **record}), flush=True)
    return 0


if __name__ == "__main__":
    from wse.cli import run
    raise SystemExit(run(main, "region_shift.py"))
