"""The host's softmax cross-entropy: the one loss every training report uses.

The fabric returns float32 logits; the host turns them into a loss in
float64 with one formula, used everywhere a loss is reported:
:class:`~wse.host.runtime.StepResult` (a training step), SwarmX's
data-parallel step (:class:`~wse.host.swarmx.DataParallelResult`, which must
equal the single system's bit for bit) and the appliance's evaluation
(:func:`wse.host.appliance.evaluate`).

The rule, per sample ``i`` with label ``y[i]``, in float64 (``z`` the float32
logits widened exactly)::

    top  = max_k z[i, k]
    lse  = log(sum_k exp(z[i, k] - top)) + top        # log-sum-exp
    loss = lse - z[i, y[i]]

Keep the operations in this order: ``(log(s) + top) - z[y]`` and the
algebraically equal ``log(s) - (z[y] - top)`` round differently in the last
bit, and the losses recorded in run histories, checkpoints and summaries are
this formula's bits. A mean is ``numpy.mean`` of the per-sample losses.
"""

from __future__ import annotations

import numpy as np

__all__ = ["cross_entropy", "mean_cross_entropy"]


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample softmax cross-entropy of ``logits [n, classes]`` and labels ``y [n]``, float64 ``[n]``.

    The log-sum-exp of each row minus the label's logit, computed in float64
    by the rule of the module notes.
    """
    z = np.asarray(logits).astype(np.float64)
    top = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]
    return lse - z[np.arange(len(y)), y]


def mean_cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    """Mean softmax cross-entropy of ``logits [n, classes]`` and labels ``y [n]`` as a Python float.

    ``numpy.mean`` of :func:`cross_entropy`: the loss of a training step.
    """
    return float(np.mean(cross_entropy(logits, y)))
