"""The layer-pipelined functional model's compiled loops against a scalar
reference built from :mod:`wse.numerics` (the fabric's binary32 rules, one
operation at a time), on operands that make subnormal results, overflow,
infinities and NaNs."""

from __future__ import annotations

import numpy as np
import pytest

from wse import numerics as nm
from wse.host.compiler.pipelined_place import Region
from wse.host.runtime import pipelined_kernels as pk


def _b(v) -> int:
    return int(np.float32(v).view(np.uint32))


def _f(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def _operands(rng, shape, scale):
    """float32 values of ``scale`` magnitude, with zeros, subnormals, infinities and NaNs mixed in; flushed."""
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    pick = rng.random(shape)
    a[pick < 0.15] = 0.0
    a[(pick >= 0.15) & (pick < 0.2)] = -0.0
    a[(pick >= 0.2) & (pick < 0.23)] = np.float32(3e-39)      # subnormal: the fabric reads it as zero
    if scale > 1e10:
        a[(pick >= 0.23) & (pick < 0.24)] = np.inf
        a[(pick >= 0.24) & (pick < 0.25)] = np.nan
    bits = a.view(np.uint32)
    bits[(bits & 0x7F800000) == 0] &= np.uint32(0x80000000)
    return a


def _ref_forward(region, w, b, relu, act):
    out = np.zeros((act.shape[0], w.shape[0]), dtype=np.float32)
    for s in range(act.shape[0]):
        for o in range(w.shape[0]):
            y = None
            blocks = region.in_blocks()
            for q, ins in enumerate(blocks):
                part = nm.mul(_b(w[o, ins[0]]), _b(act[s, ins[0]]))
                if b is not None and q == len(blocks) - 1:      # the chain end starts at the bias
                    part = nm.add(_b(b[o]), part)
                for k in ins[1:]:
                    part = nm.add(part, nm.mul(_b(w[o, k]), _b(act[s, k])))
                y = part if y is None else nm.add(y, part)
            if relu:
                y = nm.fmax(y, 0)
            out[s, o] = _f(y)
    return out


def _ref_backward(region, w, dz, x, g, db):
    g, db = g.copy(), db.copy()
    for o in range(w.shape[0]):
        for s in range(dz.shape[0]):
            g[o] = [_f(nm.add(_b(g[o, k]), nm.mul(_b(dz[s, o]), _b(x[s, k])))) for k in range(w.shape[1])]
            db[o] = _f(nm.add(_b(db[o]), _b(dz[s, o])))
    dx = np.zeros((dz.shape[0], w.shape[1]), dtype=np.float32)
    for s in range(dz.shape[0]):
        for k in range(w.shape[1]):
            y = None
            for block in reversed(region.out_blocks()):
                part = 0
                for o in block:
                    part = nm.add(part, nm.mul(_b(w[o, k]), _b(dz[s, o])))
                y = part if y is None else nm.add(y, part)
            dx[s, k] = _f(y)
    return g, db, dx


def _same(a, b):
    return np.array_equal(np.asarray(a, dtype=np.float32).view(np.uint32), np.asarray(b, dtype=np.float32).view(np.uint32))


@pytest.mark.parametrize("k, o, cols, rows, scale", [
    (7, 5, 3, 2, 1.0), (9, 4, 2, 3, 1e-19), (6, 6, 1, 4, 1e20), (5, 3, 5, 3, 1e-30),
])
def test_forward_and_backward_equal_the_scalar_fabric_rules(k, o, cols, rows, scale):
    rng = np.random.default_rng(k * o + cols)
    region = Region(layer=0, x0=0, y0=0, cols=cols, rows=rows, inputs_on_columns=True, k=k, o=o)
    w, act = _operands(rng, (o, k), scale), _operands(rng, (4, k), scale)
    b = _operands(rng, (o,), scale)
    for relu in (False, True):
        with np.errstate(all="ignore"):
            got = pk.forward(region, w, b if relu else None, relu, act)
        assert _same(got, _ref_forward(region, w, b if relu else None, relu, act)), relu
    dz, g, db = _operands(rng, (4, o), scale), _operands(rng, (o, k), scale), _operands(rng, (o,), scale)
    g_ref, db_ref, dx_ref = _ref_backward(region, w, dz, act, g, db)
    with np.errstate(all="ignore"):
        pk.weight_gradients(dz, act, g, db)
        dx = pk.input_gradient(region, w, dz)
    assert _same(g, g_ref) and _same(db, db_ref) and _same(dx, dx_ref)


@pytest.mark.parametrize("hyper", [
    {"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False},
    {"lr": 0.05, "momentum": 0.8, "dampening": 0.0, "weight_decay": 0.01, "nesterov": True},
    {"lr": 0.05, "momentum": 0.5, "dampening": 0.25, "weight_decay": 0.001, "nesterov": False},
])
@pytest.mark.parametrize("scale", [1.0, 1e-37])
def test_sgd_update_equals_the_scalar_fabric_rules(hyper, scale):
    rng = np.random.default_rng(3)
    w, g, buf = (_operands(rng, (3, 5), scale) for _ in range(3))
    f = {key: _b(np.float32(v)) for key, v in (("wd", hyper["weight_decay"]), ("mu", hyper["momentum"]),
                                               ("damp", 1 - hyper["dampening"]), ("mlr", -hyper["lr"]))}
    for first in (True, False):
        expect_w, expect_buf = w.copy().ravel(), buf.copy().ravel()
        for i in range(w.size):
            gi = _b(g.ravel()[i])
            if hyper["weight_decay"]:
                gi = nm.add(gi, nm.mul(_b(w.ravel()[i]), f["wd"]))
            if hyper["momentum"]:
                bi = gi if first else nm.add(nm.mul(_b(buf.ravel()[i]), f["mu"]), nm.mul(gi, f["damp"]))
                expect_buf[i] = _f(bi)
                gi = nm.add(gi, nm.mul(bi, f["mu"])) if hyper["nesterov"] else bi
            expect_w[i] = _f(nm.add(_b(w.ravel()[i]), nm.mul(gi, f["mlr"])))
        mine = w.copy()
        new = pk.sgd_update(mine, g, buf, hyper, first)
        assert _same(mine.ravel(), expect_w)
        if hyper["momentum"]:
            assert new.shape == w.shape and _same(new.ravel(), expect_buf)
        else:
            assert new is None
