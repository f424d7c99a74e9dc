"""The backend interface shared by every runtime backend."""

from __future__ import annotations

import abc
import dataclasses
from typing import Mapping

import numpy as np

from wse.config import UsageError

__all__ = ["Backend", "HostData", "RunResult", "pool_of"]


@dataclasses.dataclass
class HostData:
    """One padded batch as the host prepares it.

    Members
    -------
    x:
        float32 ``[batch, features]`` (zeros after the real samples).
    onehot:
        float32 ``[batch, classes]``: 1.0 at each real sample's label.
    scale:
        float32 ``[batch]``: ``1/n`` for the ``n`` real samples, 0 for padding.
    n:
        Real samples.
    """
    x: np.ndarray
    onehot: np.ndarray
    scale: np.ndarray
    n: int


@dataclasses.dataclass
class RunResult:
    """What a backend returns from a phase sequence: ``logits`` float32
    ``[batch, classes]``, ``grads`` by parameter name (training only) and
    ``cycles`` per phase."""
    logits: np.ndarray
    grads: dict
    cycles: dict


def pool_of(weights: Mapping[str, np.ndarray], tensors) -> np.ndarray:
    """The stream pool: the named tensors flattened in order, then +0.0 and
    -0.0, as ``uint32`` bit patterns."""
    parts = [np.ascontiguousarray(weights[name], dtype=np.float32).ravel() for name in tensors]
    parts.append(np.array([0.0, -0.0], dtype=np.float32))
    return np.concatenate(parts).view(np.uint32)


class Backend(abc.ABC):
    """Runs an executable's phases.

    Subclasses implement :meth:`run`; device backends (anything that
    implements the fabric host API) derive from
    :class:`~wse.host.runtime.device.DeviceBackend` and only say how to make
    the device.
    """

    #: The name :class:`~wse.host.runtime.Runtime` knows the backend by.
    name = ""

    def __init__(self, executable):
        self.executable = executable

    @abc.abstractmethod
    def run(self, sequence: str, host: HostData, weights: Mapping[str, np.ndarray]) -> RunResult:
        """Run the phases of ``sequence`` (``"train"`` or ``"eval"``) on ``host``
        data with ``weights`` (float32 by parameter name)."""

    def run_shard(self, host: HostData, weights: Mapping[str, np.ndarray], starts: np.ndarray,
                  counts: np.ndarray) -> RunResult:
        """The training sequence on the tokens of a run of columns, with per-column gradients.

        ``host`` holds the tokens of the columns (``starts``/``counts``: each
        column's first token and token count within them); ``grads[name]`` of
        the result is float32 ``[columns, *shape]``: each column's partial sum
        before the row chain adds the columns (``docs/swarmx.md`` section 3).

        Raises
        ------
        UsageError
            On backends that cannot run part of a step (all but ``functional``).
        """
        raise UsageError(f"train_shard is provided by the functional backend, not the {self.name} backend")
