"""Sparse weight streaming in training, first step: static masks chosen at
compile time, the sparse forward GEMM's math operation and its functional
execution in the documented binary32 order (``docs/weight_streaming.md``
section 13)."""

import numpy as np
import pytest

from wse.config import UsageError
from wse.host.compiler import sparse
from wse.host.compiler.schedule import MathOp, SparseSgemm
from wse.host.runtime import kernels


@pytest.mark.parametrize("height", [1, 2, 3, 5])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("s", [0.0, 0.5, 0.9])
def test_functional_spgemm_equals_reference_order(height, bias, s):
    rng = np.random.default_rng(height * 10 + int(bias) + int(s * 100))
    w = rng.standard_normal((11, 13)).astype(np.float32)
    x = rng.standard_normal((13, 4)).astype(np.float32)
    b = rng.standard_normal(11).astype(np.float32) if bias else None
    mask = sparse.choose_mask(w, s, "random", seed=3)
    mask[2] = False                                   # an output with no non-zero at all
    got = kernels.spgemm(w, x, b, np.array(sparse.nonzeros(mask)), height)
    want = sparse.reference_forward(w, mask, x, b, height)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_allclose(got, (w * mask) @ x + (0 if b is None else b[:, None]), rtol=1e-4, atol=1e-5)


def test_functional_spgemm_flushes_subnormals():
    w = np.array([[1e-30, 1.0], [2.0, 3.0]], dtype=np.float32)
    x = np.array([[1e-10], [0.0]], dtype=np.float32)
    mask = np.ones((2, 2), dtype=bool)
    got = kernels.spgemm(w, x, None, np.array(sparse.nonzeros(mask)), 2)
    want = sparse.reference_forward(w, mask, x, None, 2)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[0, 0] == 0.0                           # 1e-40 is subnormal: flushed


def test_pruned_weights_are_never_multiplied():
    w = np.array([[np.inf, 2.0]], dtype=np.float32)   # inf * 0 would be NaN if it were multiplied
    x = np.array([[0.0], [1.5]], dtype=np.float32)
    got = kernels.spgemm(w, x, None, np.array([1]), 2)
    assert got[0, 0] == 3.0


def test_masks_magnitude_random_and_overrides():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 10)).astype(np.float32)
    m = sparse.choose_mask(w, 0.75, "magnitude")
    assert m.sum() == 20 and np.abs(w[m]).min() >= np.abs(w[~m]).max()
    r1, r2 = sparse.choose_mask(w, 0.5, "random", 7), sparse.choose_mask(w, 0.5, "random", 7)
    assert r1.sum() == 40 and np.array_equal(r1, r2)
    masks = sparse.layer_masks({"a.weight": w, "b.weight": w}, 0.9, overrides={"b.weight": 0.0})
    assert list(masks) == ["a.weight"] and masks["a.weight"].sum() == 8
    assert np.array_equal(sparse.mask_of(sparse.nonzeros(m), m.shape), m)


@pytest.mark.parametrize("value", [1.0, -0.1, 1.5, "0.5", True, float("nan")])
def test_bad_sparsity_is_a_usage_error(value):
    with pytest.raises(UsageError, match=r"sparsity must be a number in \[0, 1\)"):
        sparse.layer_masks({"a.weight": np.zeros((2, 2), np.float32)}, value)


def test_bad_masks_and_overrides_are_usage_errors():
    with pytest.raises(UsageError, match="mask of fc1.weight has shape"):
        sparse.check_mask("fc1.weight", np.ones((3, 2)), (2, 3))
    with pytest.raises(UsageError, match="only 0 and 1"):
        sparse.check_mask("fc1.weight", np.full((2, 3), 2), (2, 3))
    with pytest.raises(UsageError, match="no such weight"):
        sparse.layer_masks({"a.weight": np.zeros((2, 2), np.float32)}, 0.5, overrides={"c.weight": 0.5})
    with pytest.raises(UsageError, match="mask kind"):
        sparse.choose_mask(np.zeros((2, 2), np.float32), 0.5, "blocky")


def test_sparse_math_op_round_trips_through_the_manifest():
    op = SparseSgemm("fc1.weight", "fc1.bias", "act0", "act1", sparse.nonzeros(np.eye(3, dtype=bool)))
    back = MathOp.from_manifest(op.to_manifest())
    assert back == op and back.nonzeros == (0, 4, 8)


def test_the_functional_backend_runs_a_sparse_forward_phase():
    """A compiled single-layer model whose forward GEMM is swapped for a SparseSgemm: the functional
    backend's logits are the sparse reference's, bit for bit, and differ from the dense layer's."""
    import dataclasses

    import torch
    from torch import nn

    from wse.config import FabricConfig
    from wse.host.compiler import compile_model
    from wse.host.compiler.schedule import Sgemm, SparseSgemm
    from wse.host.compiler.sparse import choose_mask, nonzeros, reference_forward
    from wse.host.runtime import Runtime

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 6))
    exe = compile_model(model, torch.randn(8, 12), config=FabricConfig(width=2, height=3), batch=8)
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    mask = choose_mask(weights["0.weight"], 0.5, "random", seed=1)
    x = np.random.default_rng(2).standard_normal((8, 12)).astype(np.float32)
    dense = Runtime(exe, "functional").forward(x, weights)
    swapped = 0
    for name in exe.sequences["eval"]:
        phase = exe.phases[name]
        math = tuple(SparseSgemm(op.weight, op.bias, op.x, op.y, nonzeros(mask)) if isinstance(op, Sgemm) else op
                     for op in phase.math)
        swapped += sum(isinstance(op, SparseSgemm) for op in math)
        exe.phases[name] = dataclasses.replace(phase, math=math)
    assert swapped == 1
    got = Runtime(exe, "functional").forward(x, weights)
    want = reference_forward(weights["0.weight"], mask, x.T, weights["0.bias"], 3).T.view(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(got, dense)
