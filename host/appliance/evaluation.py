"""Evaluation: the mean loss and the accuracy of a model's weights over a whole split.

Evaluation covers every sample: the last batch is padded with zero rows
whose logits are ignored. The loss is the host's softmax cross-entropy
(:func:`wse.host.runtime.loss.cross_entropy`), the same formula as a
training step's.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from wse.host.runtime.loss import cross_entropy

__all__ = ["evaluate"]


def evaluate(runtime: Any, weights: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray,
             batch: int) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of ``runtime.forward`` over all of ``(x, y)``.

    The samples go through in batches of ``batch``; the last one is padded
    with zero rows whose logits are dropped. The mean is the sum of every
    batch's per-sample losses (:func:`~wse.host.runtime.loss.cross_entropy`),
    added batch by batch in float64, divided by the sample count.
    """
    losses, correct = 0.0, 0
    for start in range(0, len(x), batch):
        xb, yb = x[start:start + batch], y[start:start + batch]
        if len(xb) < batch:
            xb = np.concatenate([xb, np.zeros((batch - len(xb),) + xb.shape[1:], dtype=np.float32)])
        logits = np.asarray(runtime.forward(np.ascontiguousarray(xb, dtype=np.float32), weights))[:len(yb)]
        losses += float(cross_entropy(logits, yb).sum())
        correct += int((logits.argmax(axis=1) == yb).sum())
    return losses / len(x), correct / len(x)
