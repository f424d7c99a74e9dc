"""The ``golden`` backend: the golden fabric model (:class:`wse.sim.golden.Fabric`)."""

from __future__ import annotations

from wse.sim.golden import Fabric

from .device import DeviceBackend

__all__ = ["GoldenBackend"]


class GoldenBackend(DeviceBackend):
    """Every phase runs wavelet by wavelet on the golden model; cycles are its counts."""

    name = "golden"

    def make_device(self, config):
        return Fabric(config)
