"""The result of one system's share of a data-parallel step (:meth:`wse.host.runtime.Runtime.train_shard`).

The runtime defines it and SwarmX, the caller of ``train_shard``, consumes it
(``wse.host.swarmx`` re-exports it); see ``docs/swarmx.md`` section 3.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["ShardResult"]


@dataclasses.dataclass
class ShardResult:
    """What a system returns for its share of a global batch (the runtime hook's result).

    Members
    -------
    logits : float32 ``[m, classes]``
        Logits of the ``m`` real samples given, in order.
    grad_partials : dict of str to float32 ``[len(columns), *shape]``
        For every parameter (PyTorch names and shapes) and every column ``j``
        of ``columns``, in order: the column's partial weight-gradient sum
        ``+0 + g(t0) + g(t0 + 1) + ...`` over its tokens (padding included) in
        the fabric's order, before the row chain adds the columns together.
    cycles : int
        Fabric cycles this system spent on the step.
    """

    logits: np.ndarray
    grad_partials: dict
    cycles: int
