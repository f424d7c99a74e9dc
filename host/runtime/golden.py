"""The ``golden`` backend: every phase on the golden fabric model (:class:`wse.sim.golden.Fabric`),
wavelet by wavelet; cycles are its counts. It is the device backend of :mod:`.rtl` on the
registry's ``golden`` device."""

from __future__ import annotations

from .rtl import device_backend

__all__ = ["GoldenBackend"]

#: The runtime backend on the golden model.
GoldenBackend = device_backend("golden")
