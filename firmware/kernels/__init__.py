"""The kernel library: PE programs (``*.s``) with the host-side drivers that
lay data out over any mesh, route it, run it and check it bit for bit.

Each kernel documents the order of its float operations; its reference
computes exactly that order with :mod:`wse.numerics`, so a run is
either bit exact or wrong.

=============  ================================================================
``gemv``       y = W x, weights stationary (:mod:`.gemv`)
``axpy``       y = a x + y, x streamed through the mesh (:mod:`.axpy`)
``dot``        x . y, x streamed, scalars reduced to one (:mod:`.dot`)
``broadcast``  copy a vector along every row or column (:mod:`.lines`)
``reduce``     sum the vectors of every row or column (:mod:`.lines`)
=============  ================================================================
"""

from __future__ import annotations

from typing import Callable

from wse.config import FabricConfig, UsageError

from .common import BACKENDS, Kernel, run
from .gemv import Gemv
from .axpy import Axpy
from .dot import Dot
from .lines import Broadcast, Reduce

__all__ = ["KERNELS", "BACKENDS", "Kernel", "get_kernel", "run_kernel"]

#: Every library kernel by name.
KERNELS: dict[str, Kernel] = {k.name: k for k in (Gemv(), Axpy(), Dot(), Broadcast(), Reduce())}


def get_kernel(name: str) -> Kernel:
    """The kernel called ``name``; raises :class:`UsageError` for an unknown name."""
    kernel = KERNELS.get(name)
    if kernel is None:
        raise UsageError(f"unknown kernel {name!r}; expected one of {', '.join(KERNELS)}")
    return kernel


def run_kernel(name: str, config: FabricConfig, seed: int = 0, backend: str = "golden",
               device: Callable[[FabricConfig], object] | None = None, **sizes) -> dict:
    """Run a library kernel on random data from ``seed`` and check it.

    Parameters
    ----------
    name:
        A key of :data:`KERNELS`.
    config:
        The fabric, mesh shape included.
    seed:
        Seed of the random inputs (standard normal float32).
    backend:
        Name of the device in :data:`BACKENDS` (``"golden"``), used unless
        ``device`` is given.
    device:
        A factory ``config -> device`` implementing the host API (load,
        set_route/load_routes, memcpy_h2d/d2h, stream_in/out, launch, run,
        counters): how other backends plug in.
    **sizes:
        ``rows`` and ``cols`` (gemv), ``n`` (the others), ``variant``
        (``"row"`` or ``"column"`` for broadcast and reduce); defaults as in
        ``KERNELS[name].defaults``.

    Returns
    -------
    dict
        JSON-able: ``kernel``, ``mesh`` (``"WxH"``), ``backend``, ``sizes``,
        ``seed``, ``bit_exact`` (the device's bits equal the reference's),
        ``mismatches`` (result words that differ), ``words`` (result words), ``max_abs_err_vs_float64``,
        ``cycles``, ``fmac_elements``, ``fmac_utilization`` (fmac elements
        / (PEs x cycles)), ``utilization`` (per PE, ``[height][width]``) and
        ``seconds`` (host time of the device run).

    Raises
    ------
    UsageError
        For an unknown kernel or backend, sizes that are not positive
        integers, or data that does not fit in the PE memory.
    """
    return run(get_kernel(name), config, seed, backend, device, **sizes)
