"""``bench/cell_periods.py``: each cell's smallest period from its hashed states, and the report's
bands cover every cell of the mesh."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import cell_periods  # noqa: E402


def test_a_cells_period_is_the_smallest_lag_with_equal_states_and_shifts():
    """Cells repeating every 3 and 5 cycles (op rows moving on steadily), one that never repeats and
    one whose states repeat every 4 cycles while its op rows move on unevenly."""
    t = np.arange(41)
    hashes = np.stack([t % 3, 100 + t % 5, 1000 + t, 2000 + t % 4], axis=1).astype(np.uint64)
    pcs = np.stack([t // 3, 2 * t, t, t * t], axis=1)
    assert cell_periods.cell_periods(hashes, pcs, 20).tolist() == [3, 5, -1, -1]
    assert cell_periods.cell_periods(hashes, pcs, 4).tolist() == [3, -1, -1, -1]


def test_the_bands_hold_every_cell(capsys):
    """An 8x8 mesh, the 128-wide MLP's first GEMM: four bands of two rows, sixteen cells each, and
    after its fill rows repeat with its step (about 125 cycles)."""
    argv = ["--mesh", "8", "8", "--sizes", "100", "128", "128", "10", "--batch", "32", "--at", "1200",
            "--longest", "200", "--bands", "4"]
    assert cell_periods.main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["rows"] for line in lines] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert all(sum(line["periods"].values()) + line["none"] == 16 for line in lines)
    assert sum(sum(line["periods"].values()) for line in lines) >= 16
    assert all(100 < int(d) <= 200 for line in lines for d in line["periods"])


def test_a_cycle_too_early_is_a_usage_error():
    from wse.config import UsageError
    with pytest.raises(UsageError, match="at least twice --longest"):
        cell_periods.main(["--mesh", "8", "8", "--at", "100", "--longest", "200"])
