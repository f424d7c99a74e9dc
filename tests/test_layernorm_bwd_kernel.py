"""LayerNorm's backward pass on the PEs (the ``layernorm_bwd`` library
kernel): ``dx``, ``dgamma``, ``dbeta`` bit exact against
``firmware/training/transformer.py``'s ``layernorm_backward`` on the golden
model (1x1 up to 4x4 and non-square meshes, rows without features, columns
without tokens), the static cycle mirror equal to golden cycles, the other
backends and the command line."""

from __future__ import annotations

import numpy as np
import pytest

from wse.config import FabricConfig, UsageError
from wse.firmware import deadlock
from wse.firmware.kernels import KERNELS, get_kernel, layernorm_bwd_timing
from wse.firmware.kernels.layernorm import column_rings, column_routes
from wse.firmware.kernels.layernorm_bwd import row_routes
from wse.host.compiler.replay import Network, replay
from wse.sim.devices import make_device
from wse.sim.runner import main as kernel_main, run_kernel


def _mirror(cfg: FabricConfig, **sizes) -> int:
    kernel = get_kernel("layernorm_bwd")
    plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
    routes, ops, starts, ends, inject = layernorm_bwd_timing.timing_ops(plan)
    return replay(Network(cfg, routes), ops, starts, ends, inject, periods=False)


CASES = [
    # width, height, tokens, features: one PE, one row or column, rows without features, columns without tokens
    (1, 1, 5, 7), (4, 1, 5, 7), (1, 4, 5, 7), (2, 2, 6, 8), (4, 4, 2, 3), (3, 5, 7, 9), (4, 4, 16, 64),
    (2, 3, 1, 2),
]


@pytest.mark.parametrize("width,height,tokens,features", CASES)
def test_layernorm_backward_bit_exact_and_cycle_mirror_equals_golden(width, height, tokens, features):
    cfg = FabricConfig(width=width, height=height)
    report = run_kernel("layernorm_bwd", cfg, seed=6, rows=tokens, cols=features)
    assert report["bit_exact"], report["mismatches"]
    assert report["max_abs_err_vs_float64"] < 1e-5
    assert report["cycles"] == _mirror(cfg, rows=tokens, cols=features)
    assert report["fpu_elements"] > 0


def test_reduces_in_the_meshs_orders():
    """The same data on meshes of other heights and widths sums its features and
    tokens in other orders: the kernel follows the reference's ``rows`` and
    ``blocks`` (bits differ, each run exact)."""
    kernel = get_kernel("layernorm_bwd")
    sizes = dict(rows=6, cols=24)
    one = FabricConfig(width=1, height=1)
    inputs = kernel.inputs(kernel.plan(one, kernel.resolve(one, sizes)), np.random.default_rng(9))
    bits = []
    for width, height in ((1, 1), (1, 3), (3, 1)):
        cfg = FabricConfig(width=width, height=height)
        plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
        bits.append(kernel.reference(plan, inputs)[0])
        got, _ = kernel.execute(make_device("golden", cfg), plan, inputs)
        assert np.array_equal(got, bits[-1])
    n_dx = 6 * 24
    assert not np.array_equal(bits[0][:n_dx], bits[1][:n_dx])          # dx: the feature sums' order
    assert not np.array_equal(bits[0][n_dx:], bits[2][n_dx:])          # dgamma, dbeta: the token sums' order


def test_routes_need_and_pass_the_ring_proof():
    kernel = get_kernel("layernorm_bwd")
    cfg = FabricConfig(width=3, height=2)
    plan = kernel.plan(cfg, kernel.resolve(cfg, dict(rows=6, cols=4)))
    routes = column_routes(cfg) + row_routes(plan)
    with pytest.raises(deadlock.DeadlockError):
        deadlock.check_routes(cfg, routes, what="layernorm_bwd")
    deadlock.check_routes(cfg, routes, what="layernorm_bwd", rings=column_rings(cfg))


@pytest.mark.parametrize("backend", ["vector", "verilator"])
def test_other_backends_give_the_same_bits_and_cycles(backend):
    cfg = FabricConfig(width=2, height=2)
    sizes = dict(rows=3, cols=5)
    report = run_kernel("layernorm_bwd", cfg, seed=4, backend=backend, **sizes)
    golden = run_kernel("layernorm_bwd", cfg, seed=4, **sizes)
    assert report["bit_exact"] and report["cycles"] == golden["cycles"]


def test_listed_and_run_from_the_command_line(capsys):
    assert "layernorm_bwd" in KERNELS
    assert kernel_main(["layernorm_bwd", "--mesh", "3x2", "--rows", "5", "--cols", "7"]) == 0
    out = capsys.readouterr().out
    assert "layernorm_bwd 5 tokens x 7 features on a 3x2 mesh" in out and "bit exact" in out


@pytest.mark.parametrize("argv,message", [
    (["layernorm_bwd", "--variant", "forward"], "layernorm_bwd takes --rows, --cols, not --variant"),
    (["layernorm_bwd", "--cols", "0"], "layernorm_bwd cols must be a positive integer, not 0"),
    (["layernorm_bwd", "--rows", "4000", "--cols", "64", "--mesh", "1x1"],
     "layernorm_bwd of 4000 tokens x 64 features on a 1x1 mesh needs"),
])
def test_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        kernel_main(argv)
