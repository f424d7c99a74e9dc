"""``bench/transient_cells.py``: its phase ends at the cycle model's count, and a cell counts as
aperiodic exactly when its state (the region replay's per-cell hash) or its op rows' pace differs
from a period before."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import transient_cells  # noqa: E402
from compile_speed import planned_phase  # noqa: E402


def _phase(mesh=(4, 64), width=264, batch=32, phase="fwd 0"):
    from wse.host.compiler import cycles
    case = argparse.Namespace(mesh=list(mesh), sizes=[width, width, width, 10], batch=batch, phase=phase,
                              layout="spread")
    config, plan, the_phase = planned_phase(case)
    ops, starts, ends = cycles.phase_ops(plan, the_phase)
    return cycles.Network(config, plan.routes), ops, starts, ends, cycles.phase_injections(the_phase)


def test_a_cell_is_off_the_period_when_its_state_or_its_pace_differs():
    """Cells repeating every 3 and 5 cycles with op rows moving steadily, one that never repeats, and
    one whose states repeat every 4 cycles while its op rows speed up: at every cycle, periods 15 and
    30 hold for the first two, 3 for the first only, 4 and 2 for neither, and none for the last two."""
    t = np.arange(200)
    hashes = np.stack([t % 3, 100 + t % 5, 1000 + t, 2000 + t % 4], axis=1).astype(np.uint64)
    pcs = np.stack([t // 3, 2 * t, t, t * t], axis=1)
    for period, expected in [(15, [0, 0, 1, 1]), (30, [0, 0, 1, 1]), (3, [0, 1, 1, 1]), (4, [1, 1, 1, 1]),
                             (2, [1, 1, 1, 1])]:
        keep = 2 * period + 1
        for now in range(2 * period, 200):
            ring_h, ring_p = np.zeros((keep, 4), np.uint64), np.zeros((keep, 4), np.int64)
            for u in range(now - 2 * period, now + 1):
                ring_h[u % keep], ring_p[u % keep] = hashes[u], pcs[u]
            assert transient_cells.off_period(ring_h, ring_p, now, period).astype(int).tolist() == expected, \
                (period, now)


def test_the_phase_ends_at_the_cycle_models_count_and_cells_settle():
    """4x64, four or five features a row: the stepped phase's cycles are the cycle model's count, every
    cell counts before two periods, none beyond the mesh, and after the fill every cell is periodic
    for a while (the steady 106-cycle step)."""
    from wse.host.compiler import replay
    from wse.host.compiler.replay_state import fresh_run
    network, ops, starts, ends, inject = _phase()
    count, per_cycle = transient_cells.aperiodic_cells(*fresh_run(network, ops, starts, inject), 106)
    assert count == replay.run_replay(network, ops, starts, ends, inject)[0]
    assert count - 400 < len(per_cycle) < count      # the last PEs' private cycles end it
    assert (per_cycle[:211] == 256).all() and per_cycle.max() <= 256
    assert (per_cycle == 0).sum() > 5000


def test_a_cell_off_its_pace_is_aperiodic(monkeypatch):
    """With the period wrong by one cycle almost no cell is periodic after the fill; with hashes that
    never change, only the op rows' pace decides."""
    from wse.host.compiler.replay_state import fresh_run
    network, ops, starts, _, inject = _phase()
    _, right = transient_cells.aperiodic_cells(*fresh_run(network, ops, starts, inject), 106)
    _, wrong = transient_cells.aperiodic_cells(*fresh_run(network, ops, starts, inject), 105)
    assert (wrong == 0).sum() < (right == 0).sum() // 10
    from wse.host.compiler.replay_region import RegionSearch
    monkeypatch.setattr(RegionSearch, "_signature", staticmethod(lambda now: np.zeros(len(now["pc"]), np.uint64)))
    _, pace = transient_cells.aperiodic_cells(*fresh_run(network, ops, starts, inject), 106)
    assert (pace <= right).all()        # equal hashes everywhere: only a cell whose pace changed counts
    assert pace[212:].sum() > 0 and (pace[212:] == 0).sum() > 0


def test_one_line_per_row_count_and_a_skewed_start(capsys, tmp_path):
    """Two row counts, then the second with a skewed start: the fields, a replay time only without
    the skew, the skewed start's later end, and the picture."""
    argv = ["--rows", "32", "64", "--columns", "4", "--png", str(tmp_path / "cells.png")]
    assert transient_cells.main(argv) == 0
    assert (tmp_path / "cells.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert transient_cells.main(["--rows", "64", "--columns", "4", "--skew", "2.4"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["mesh"] for line in lines] == ["4x32", "4x64", "4x64"]
    plain, skewed = lines[1], lines[2]
    assert plain["replay_cpu_s"] is not None and skewed["replay_cpu_s"] is None
    assert skewed["skew"] == 2.4 and skewed["cycles"] > plain["cycles"]
    for line in lines:
        cells = 4 * int(line["mesh"].split("x")[1])
        assert line["aperiodic_cell_cycles"] <= cells * line["cycles"]
        assert line["fill_aperiodic_per_cell"] + line["rest_aperiodic_per_cell"] == \
            pytest.approx(line["aperiodic_cycles_per_cell"], abs=0.2)


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--columns", "0"], ["--period", "0"], ["--skew", "-1"],
                                  ["--per-row", "0.001", "--rows", "8"]])
def test_bad_arguments_are_usage_errors(argv):
    from wse.config import UsageError
    with pytest.raises(UsageError, match="expected positive rows"):
        transient_cells.main(argv)


def test_a_picture_not_named_png_is_a_usage_error(tmp_path):
    from wse.config import UsageError
    with pytest.raises(UsageError, match="ending in .png"):
        transient_cells.main(["--rows", "8", "--png", str(tmp_path / "cells.jpg")])
    assert not list(tmp_path.iterdir())
