"""Evaluation: the mean loss and the accuracy of a model's weights over a whole split.

Evaluation covers every sample: the last batch is padded with zero rows
whose logits are ignored. The loss is the host's softmax cross-entropy
(:func:`wse.host.runtime.loss.cross_entropy`), the same formula as a
training step's. An evaluation that takes more than ``every`` seconds
prints a progress line that often (samples done, time spent and left).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Mapping

import numpy as np

from wse.host.runtime.loss import cross_entropy

__all__ = ["evaluate"]


def evaluate(runtime: Any, weights: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray,
             batch: int, *, what: str = "evaluation", every: float = 10.0, stream=None) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of ``runtime.forward`` over all of ``(x, y)``.

    The samples go through in batches of ``batch``; the last one is padded
    with zero rows whose logits are dropped. The mean is the sum of every
    batch's per-sample losses (:func:`~wse.host.runtime.loss.cross_entropy`),
    added batch by batch in float64, divided by the sample count.

    Every ``every`` seconds (not before) a line ``{what}: 320/1,000 samples,
    12 s, about 25 s left`` goes to ``stream`` (default stderr).
    """
    losses, correct = 0.0, 0
    started = time.monotonic()
    next_line = started + every
    for start in range(0, len(x), batch):
        xb, yb = x[start:start + batch], y[start:start + batch]
        if len(xb) < batch:
            xb = np.concatenate([xb, np.zeros((batch - len(xb),) + xb.shape[1:], dtype=np.float32)])
        logits = np.asarray(runtime.forward(np.ascontiguousarray(xb, dtype=np.float32), weights))[:len(yb)]
        losses += float(cross_entropy(logits, yb).sum())
        correct += int((logits.argmax(axis=1) == yb).sum())
        now, done = time.monotonic(), start + len(yb)
        if now >= next_line and done < len(x):
            next_line = now + every
            spent = now - started
            print(f"{what}: {done:,}/{len(x):,} samples, {spent:.0f} s, about "
                  f"{spent * (len(x) - done) / done:.0f} s left", file=stream or sys.stderr, flush=True)
    return losses / len(x), correct / len(x)
