"""A streamed GEMM of a spread layout computed by the cyclic kernels.

With a partial last round spread over the ring (:func:`~wse.host.compiler.layouts.feature_slots`),
feature ``k`` of a tensor lives on row ``slot(k) mod H`` at local index ``slot(k) div H``. The
kernels of :mod:`.kernels` and :mod:`.torch_kernels` know the cyclic layout only (feature ``k``
on row ``k mod H``), so :class:`GemmSlots` embeds the operands in their slots: feature ``k`` at
index ``slot(k)``, the slots without a feature (*phantoms*) filled so that they change no bit.

* A phantom input feature has ``x = +0`` and weights ``-0``: its products are ``-0``, and
  ``add(P, -0) = P`` for every ``P`` (``+0 + -0 = +0``, ``-0 + -0 = -0``, NaN stays NaN),
  so the row's partial sum is the fabric's, whose row holds no such feature. Phantoms come
  last in their row (slots grow with ``k``), after every real feature.
* A phantom output is computed and dropped.
* The sparse GEMMs' kept weights move to their slots; phantoms are never kept.

Zeros change neither :func:`~.kernels.fast_is_exact`'s decision nor any other operand, so the
embedded GEMM gives the fabric's bits (``tests/test_spread_layout.py`` checks it against the
golden model).
"""

from __future__ import annotations

import numpy as np

__all__ = ["GemmSlots", "sgemm", "sgemm_transposed", "spgemm"]


def _full(like, shape: tuple, value: float):
    """A float32 array (or a tensor on ``like``'s device) of ``shape`` filled with ``value``."""
    if isinstance(like, np.ndarray):
        return np.full(shape, value, dtype=np.float32)
    import torch
    return torch.full(shape, value, dtype=torch.float32, device=like.device)


def _index(idx: np.ndarray, like):
    """``idx`` as an index of ``like`` (a tensor index on its device for a tensor)."""
    if isinstance(like, np.ndarray):
        return idx
    import torch
    return torch.tensor(idx, device=like.device)


class GemmSlots:
    """The slots of a streamed GEMM's contracted features (``inputs``) and outputs.

    Use :meth:`of`, which returns None when both are cyclic (every slot the feature itself).
    """

    def __init__(self, inputs: np.ndarray, outputs: np.ndarray):
        self.inputs, self.outputs = np.asarray(inputs, np.int64), np.asarray(outputs, np.int64)
        self.n_in = int(self.inputs[-1]) + 1 if len(self.inputs) else 0
        self.n_out = int(self.outputs[-1]) + 1 if len(self.outputs) else 0

    @classmethod
    def of(cls, layout, x: str, y: str, n_in: int, n_out: int) -> "GemmSlots | None":
        """The slots of a GEMM reading tensor ``x`` (``n_in`` features) and writing ``y``
        (``n_out``) under ``layout`` (:meth:`~wse.host.compiler.layouts.Layout.slots`), or
        None when both are cyclic."""
        inputs, outputs = layout.slots(x, n_in), layout.slots(y, n_out)
        if (not len(inputs) or inputs[-1] == n_in - 1) and (not len(outputs) or outputs[-1] == n_out - 1):
            return None
        return cls(inputs, outputs)

    def weight(self, w, transposed: bool = False):
        """``w`` (``[outputs, inputs]``, or ``[inputs, outputs]`` if ``transposed``) in slots, phantoms ``-0``."""
        rows, cols = (self.inputs, self.outputs) if transposed else (self.outputs, self.inputs)
        out = _full(w, (self.n_in, self.n_out) if transposed else (self.n_out, self.n_in), -0.0)
        out[_index(rows, w)[:, None], _index(cols, w)[None, :]] = w
        return out

    def activations(self, x):
        """The contracted tensor ``x [inputs, B]`` in slots, phantoms ``+0``."""
        out = _full(x, (self.n_in,) + tuple(x.shape[1:]), 0.0)
        out[_index(self.inputs, x)] = x
        return out

    def bias(self, b):
        """``b [outputs]`` in slots (phantoms ``-0``, dropped anyway)."""
        out = _full(b, (self.n_out,), -0.0)
        out[_index(self.outputs, b)] = b
        return out

    def result(self, y):
        """The real outputs of ``y [slots, B]``, in feature order."""
        return y[_index(self.outputs, y)]

    def nonzeros(self, flat: np.ndarray, n_in: int) -> np.ndarray:
        """Flat indices ``o*K + k`` of kept weights (``[outputs, inputs]``) moved to the slots'
        ``slot(o)*K' + slot(k)``; ascending stays ascending."""
        flat = np.asarray(flat, dtype=np.int64)
        return self.outputs[flat // n_in] * self.n_in + self.inputs[flat % n_in]


def sgemm(kernel, layout, op, w, x, bias, height: int):
    """``kernel(w, x, bias, height)`` (a cyclic :func:`~.kernels.sgemm`) for GEMM ``op`` (its
    tensors ``op.x``, ``op.y``) under ``layout``: embedded in the slots when one is spread."""
    slots = GemmSlots.of(layout, op.x, op.y, w.shape[1], w.shape[0])
    if slots is None:
        return kernel(w, x, bias, height)
    return slots.result(kernel(slots.weight(w), slots.activations(x), None if bias is None else slots.bias(bias),
                               height))


def sgemm_transposed(kernel, layout, op, w, dy, height: int):
    """``kernel(w, dy, height)`` (a cyclic :func:`~.kernels.sgemm_transposed`, ``w [O, K]``) as :func:`sgemm`."""
    slots = GemmSlots.of(layout, op.x, op.y, w.shape[0], w.shape[1])
    if slots is None:
        return kernel(w, dy, height)
    return slots.result(kernel(slots.weight(w, transposed=True), slots.activations(dy), height))


def spgemm(kernel, layout, op, w, x, bias, nonzeros: np.ndarray, height: int):
    """``kernel(w, x, bias, nonzeros, height)`` (a cyclic :func:`~.kernels.spgemm`, ``w [outputs,
    inputs]``, ``nonzeros`` flat in ``w``) as :func:`sgemm`."""
    nonzeros = np.asarray(nonzeros, dtype=np.int64)
    slots = GemmSlots.of(layout, op.x, op.y, w.shape[1], w.shape[0])
    if slots is None:
        return kernel(w, x, bias, nonzeros, height)
    return slots.result(kernel(slots.weight(w), slots.activations(x), None if bias is None else slots.bias(bias),
                               slots.nonzeros(nonzeros, w.shape[1]), height))
