"""The transformer's first operations on the PEs (``gelu``, ``softmax``, ``layernorm``
library kernels): bit exact against the reference operations of
``firmware/training/transformer.py`` on the golden model (1x1 up to 4x4 and
non-square meshes), the static cycle mirrors equal to golden cycles, the
other backends, and the command line's errors."""

from __future__ import annotations

import numpy as np
import pytest

from wse import numerics as fp
from wse.config import FabricConfig, UsageError
from wse.firmware import deadlock
from wse.firmware.kernels import KERNELS, get_kernel
from wse.firmware.kernels import gelu_timing, layernorm_timing, softmax_timing
from wse.firmware.training import transformer as tf
from wse.host.compiler.replay import Network, replay
from wse.sim.runner import main as kernel_main, run_kernel


def _mirror(name: str, module, cfg: FabricConfig, **sizes) -> int:
    kernel = get_kernel(name)
    plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
    routes, ops, starts, ends, inject = module.timing_ops(plan)
    return replay(Network(cfg, routes), ops, starts, ends, inject, periods=False)


GELU_CASES = [
    # width, height, tokens, features: 1x1, square, non-square, PEs with no tokens
    (1, 1, 3, 4), (2, 2, 6, 8), (3, 2, 5, 7), (4, 4, 2, 9), (2, 3, 7, 5),
]


@pytest.mark.parametrize("variant", ["none", "tanh", "backward-none", "backward-tanh"])
@pytest.mark.parametrize("width,height,tokens,features", GELU_CASES)
def test_gelu_bit_exact_and_cycle_mirror_equals_golden(width, height, tokens, features, variant):
    cfg = FabricConfig(width=width, height=height)
    sizes = dict(rows=tokens, cols=features, variant=variant)
    report = run_kernel("gelu", cfg, seed=5, **sizes)
    assert report["bit_exact"], report["mismatches"]
    assert report["max_abs_err_vs_float64"] < 1e-5
    assert report["cycles"] == _mirror("gelu", gelu_timing, cfg, **sizes)


def test_gelu_covers_every_branch_of_erf_and_tanh():
    """The random inputs reach both branches and the clamps of erf and tanh."""
    kernel = get_kernel("gelu")
    cfg = FabricConfig(width=2, height=2)
    plan = kernel.plan(cfg, kernel.resolve(cfg, {}))
    x = np.abs(kernel.inputs(plan, np.random.default_rng(0))["x"])
    assert (x < 0.6).any() and ((x > 1.3) & (x < 5.0)).any() and (x > 5.7).any()


SOFTMAX_CASES = [
    # width, height, T: one PE, one row or column, square, non-square, rows without queries
    (1, 1, 5), (2, 1, 5), (1, 2, 6), (2, 2, 9), (3, 2, 10), (4, 4, 16), (4, 3, 3), (2, 4, 11),
]


@pytest.mark.parametrize("variant", ["forward", "backward"])
@pytest.mark.parametrize("width,height,context", SOFTMAX_CASES)
def test_softmax_bit_exact_and_cycle_mirror_equals_golden(width, height, context, variant):
    cfg = FabricConfig(width=width, height=height)
    report = run_kernel("softmax", cfg, seed=2, n=context, variant=variant)
    assert report["bit_exact"], report["mismatches"]
    assert report["max_abs_err_vs_float64"] < 1e-6
    assert report["cycles"] == _mirror("softmax", softmax_timing, cfg, n=context, variant=variant)


def test_softmax_reference_is_the_attentions_and_masks_to_plus_zero():
    """The kernel's reference is the attention's own softmax: p above the diagonal
    is +0 bits, each row sums to one, and the backward's ds is the attention's."""
    rng = np.random.default_rng(1)
    q, k, v = (tf.bits(rng.standard_normal((2, 6, 4)).astype(np.float32)) for _ in range(3))
    _, saved = tf.attention(q, k, v, 0.5)
    scores = fp.vmul(tf.outer_sum(np.transpose(q, (2, 0, 1)), np.transpose(k, (2, 0, 1))), tf.bits([0.5]))
    p = tf.causal_softmax(scores)
    assert np.array_equal(p, saved["p"])
    assert np.all(p[:, np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0)
    np.testing.assert_allclose(tf.floats(p).sum(axis=-1), 1.0, rtol=1e-6)


def test_softmax_routes_need_and_pass_the_ring_proof():
    """The chain east and back west is a cycle of channels: the static check
    rejects it without the rings and proves it with them."""
    kernel = get_kernel("softmax")
    cfg = FabricConfig(width=3, height=2)
    plan = kernel.plan(cfg, kernel.resolve(cfg, {"n": 6}))
    with pytest.raises(deadlock.DeadlockError):
        deadlock.check_routes(cfg, plan.routes(), what="softmax")
    proof = deadlock.check_routes(cfg, plan.routes(), what="softmax", rings=plan.rings())
    assert len(proof.rings) == 2 * 2


LAYERNORM_CASES = [
    # width, height, tokens, features: one PE, one row or column, rows without features, columns without tokens
    (1, 1, 5, 7), (4, 1, 5, 7), (1, 4, 5, 7), (2, 2, 6, 8), (4, 4, 2, 3), (3, 5, 7, 9), (4, 4, 16, 64),
]


@pytest.mark.parametrize("width,height,tokens,features", LAYERNORM_CASES)
def test_layernorm_bit_exact_and_cycle_mirror_equals_golden(width, height, tokens, features):
    cfg = FabricConfig(width=width, height=height)
    report = run_kernel("layernorm", cfg, seed=6, rows=tokens, cols=features)
    assert report["bit_exact"], report["mismatches"]
    assert report["max_abs_err_vs_float64"] < 1e-5
    assert report["cycles"] == _mirror("layernorm", layernorm_timing, cfg, rows=tokens, cols=features)
    assert report["fpu_elements"] > 0
    assert report["fpu_utilization"] == pytest.approx(report["fpu_elements"] / (width * height * report["cycles"]))


def test_layernorm_reduces_in_the_columns_order():
    """The same data on a mesh with another height sums its features in another
    order: the kernel follows the reference's ``rows`` (bits differ, both exact)."""
    kernel = get_kernel("layernorm")
    sizes = dict(rows=4, cols=24)
    bits = []
    for height in (1, 3):
        cfg = FabricConfig(width=2, height=height)
        plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
        inputs = kernel.inputs(plan, np.random.default_rng(9))
        bits.append(kernel.reference(plan, inputs)[0])
        assert run_kernel("layernorm", cfg, seed=9, **sizes)["bit_exact"]
    assert not np.array_equal(bits[0], bits[1])


@pytest.mark.parametrize("backend", ["vector", "verilator"])
def test_other_backends_give_the_same_bits_and_cycles(backend):
    cfg = FabricConfig(width=2, height=2)
    for name, sizes in (("gelu", dict(rows=3, cols=4, variant="backward-none")),
                        ("gelu", dict(rows=3, cols=4, variant="tanh")),
                        ("softmax", dict(n=5, variant="forward")), ("softmax", dict(n=5, variant="backward")),
                        ("layernorm", dict(rows=3, cols=5))):
        report = run_kernel(name, cfg, seed=4, backend=backend, **sizes)
        golden = run_kernel(name, cfg, seed=4, **sizes)
        assert report["bit_exact"] and report["cycles"] == golden["cycles"], (name, sizes)


def test_listed_and_run_from_the_command_line(capsys):
    assert {"gelu", "softmax", "layernorm"} <= set(KERNELS)
    assert kernel_main(["gelu", "--mesh", "2x1", "--rows", "2", "--cols", "3", "--variant", "tanh"]) == 0
    assert kernel_main(["softmax", "--mesh", "1x2", "--n", "4", "--variant", "backward"]) == 0
    out = capsys.readouterr().out
    assert "gelu 2 tokens x 3 features, tanh on a 2x1 mesh" in out and "bit exact" in out
    assert "softmax T=4, backward on a 1x2 mesh" in out


@pytest.mark.parametrize("argv,message", [
    (["gelu", "--variant", "relu"], "gelu variant must be one of none, tanh, backward-none, backward-tanh, not 'relu'"),
    (["softmax", "--variant", "sideways"], "softmax variant must be one of forward, backward, not 'sideways'"),
    (["softmax", "--rows", "3"], "softmax takes --n, --variant, not --rows"),
    (["gelu", "--rows", "4000", "--cols", "64", "--mesh", "1x1"], "gelu of 4000 tokens x 64 features on a 1x1 mesh needs"),
    (["softmax", "--n", "400", "--mesh", "1x1"], "softmax of T=400 on a 1x1 mesh needs"),
    (["layernorm", "--variant", "backward"], "layernorm takes --rows, --cols, not --variant"),
    (["layernorm", "--rows", "0"], "layernorm rows must be a positive integer, not 0"),
])
def test_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kernel_main(argv)
