"""The host API of a device: the contract of ``docs/architecture.md`` section 5, declared once.

A *device* is anything the host drives through these calls: the golden model
(:class:`wse.sim.golden.Fabric`), the RTL backends (:mod:`wse.sim.cosim`:
``verilator``, ``icarus``), a :class:`~wse.sim.cosim.lockstep.Lockstep` pair
of two of them, or a test double. :class:`Device` states what each call
does; :class:`RtlDevice` adds what the RTL backends offer for co-simulation.
Devices are made by name from :mod:`wse.sim.devices`.

Both are :class:`typing.Protocol` classes, checkable at run time, rather than
an abstract base class: the devices live in different layers and shapes (a
numpy model, a C++ harness behind ``ctypes``, a proxy to another process, a
wrapper around two devices, a test double wrapping another device), and none
of them has to inherit from anything or import this module to count as a
device. ``isinstance(obj, Device)`` checks that every call is there;
``tests/test_cosim.py`` checks every device class against the signatures.

Shared conventions
------------------
* ``rect`` is ``(x0, y0, width, height)`` of PEs; None is the whole mesh.
* Words are 32-bit: float32 values are sent by bit pattern, integers modulo
  2**32; what comes back is ``uint32``.
* ``edge`` is ``"N"``, ``"E"``, ``"S"`` or ``"W"`` (any case) and ``index``
  the column (N, S) or row (E, W) of the edge port.
* A mistake in the arguments raises :class:`~wse.config.UsageError` with the
  same message on every device (:mod:`wse.sim.golden.hostargs`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from wse.config import FabricConfig, Port

__all__ = ["Device", "RtlDevice", "DEVICE_CALLS", "RTL_CALLS", "calls_of"]


@runtime_checkable
class Device(Protocol):
    """The host API every device implements (``docs/architecture.md`` section 5).

    ``load``, ``set_route``/``load_routes``, ``memcpy_*``, ``stream_in`` and
    ``launch`` act between runs and take no fabric cycles; ``launch`` takes
    effect at the start of the next :meth:`run`.
    """

    #: The fabric's sizes (mesh shape, memories, colors, task slots).
    config: FabricConfig
    #: The mesh shape and the number of colors, as in :attr:`config`.
    width: int
    height: int
    colors: int
    #: The device's name in reports (``"golden"``, ``"verilator"``, ...).
    backend: str

    def load(self, program, rect=None, keep=()) -> None:
        """Write a program image (:class:`wse.firmware.image.Program`: code,
        initial data, task table) into every PE of ``rect``; every other data
        word of those PEs reads 0 afterwards, except the words of the ``keep``
        ranges ``(lo, hi)`` (``lo`` included, ``hi`` not), which keep what
        they held, and every other task slot is cleared. Raises
        :class:`~wse.config.UsageError` if the program does not fit the
        configuration, or if ``keep`` is not such ranges inside the memory or
        a data segment of the program writes a kept word."""

    def set_route(self, x: int, y: int, color: int, input, outputs) -> None:
        """Route ``color`` at router ``(x, y)``: accepted from port ``input``
        (a :class:`~wse.config.Port` or its number; None: not routed) and sent
        to every port in ``outputs``."""

    def load_routes(self, table) -> None:
        """Apply many routes: an iterable of ``(x, y, color, input, outputs)``,
        each as :meth:`set_route` takes it."""

    def route(self, x: int, y: int, color: int) -> tuple[int, tuple[Port, ...]]:
        """The route of ``color`` at ``(x, y)``: ``(input port code, output
        ports)``; the input code is 7 when the color is not routed."""

    def memcpy_h2d(self, addr: int, array, rect=None) -> None:
        """Write ``array[h, w, n]`` (float32 or integer words; ``[n]`` goes to
        every PE) into words ``addr .. addr+n-1`` of each PE of ``rect``."""

    def memcpy_d2h(self, addr: int, n: int, rect=None) -> np.ndarray:
        """Words ``addr .. addr+n-1`` of each PE of ``rect`` as ``uint32[h, w, n]``."""

    def stream_in(self, edge: str, index: int, color: int, words, ctrl=None) -> None:
        """Queue wavelets for injection at edge port ``(edge, index)`` on
        ``color``: float values (sent as float32 bits) or integer patterns;
        ``ctrl`` is None (data wavelets), one flag for all, or one per wavelet."""

    def stream_out(self, edge: str, index: int, color: int, with_ctrl: bool = False):
        """Take the wavelets that left the mesh at ``(edge, index)`` on
        ``color``, in the order they left: a ``uint32`` array of data and,
        with ``with_ctrl``, a ``uint8`` array of ctrl flags."""

    def pending_out(self) -> dict[tuple[str, int, int], int]:
        """Counts of the wavelets that left the mesh and were not taken yet,
        by ``(edge, index, color)``."""

    def launch(self, task: int, rect=None) -> None:
        """Activate local task ``task`` on the PEs of ``rect`` (default all),
        from the start of the next run. Raises
        :class:`~wse.sim.golden.ProgramFault` if a PE's program has no entry
        for it."""

    def run(self, max_cycles: int | None = None) -> int:
        """Run until the fabric is idle; returns the cycles of this run.
        Raises :class:`~wse.sim.golden.FabricHang`, with a report of what is
        stuck, if nothing can move any more or ``max_cycles`` pass first."""

    def counters(self) -> dict:
        """``cycles`` (of the last run), ``total_cycles`` and ``wavelet_hops``
        (since the counters were reset) and ``pe``: per-PE counters by name
        (``docs/architecture.md`` section 8.4) as ``int64[height, width]``."""

    def reset_counters(self) -> None:
        """Zero every counter (the per-PE ones and the totals)."""

    def registers(self, x: int, y: int) -> list[int]:
        """The scalar registers of PE ``(x, y)`` as integers (``r0`` reads 0)."""


@runtime_checkable
class RtlDevice(Device, Protocol):
    """What an RTL backend offers beyond :class:`Device`, for co-simulation
    (:class:`~wse.sim.cosim.device.RtlFabric` and its subclasses, and the
    ``icarus`` proxy)."""

    def trace_emits(self, on: bool = True) -> None:
        """Record (or stop recording) every wavelet a PE hands to its router, with its run cycle."""

    def emitted(self, x: int, y: int) -> list[tuple[int, int, int, int]]:
        """Take the recorded wavelets PE ``(x, y)`` emitted: ``(data, color, ctrl, cycle)``."""

    def outputs(self) -> tuple[dict, dict]:
        """Copies of the collected, not yet taken, edge outputs: ``({(edge,
        index, color): [(data, ctrl)]}, {(edge, index, color): [cycle]})``."""

    def stats(self) -> dict:
        """Simulation figures of the backend (clock cycles simulated, ...)."""

    def reset(self) -> None:
        """Reset the mesh (registers, queues, route tables, task tables,
        counters; memories keep their words) and forget collected outputs;
        the way out of a hung run."""

    # Faults (docs/faults.md section 3): the golden model has these calls too.
    def inject(self, x: int, y: int, addr: int, bits, cycle: int | None = None) -> None:
        """Flip code-word bits ``bits`` (0..31 data, 32..38 check) of the stored
        data-memory word ``addr`` of PE ``(x, y)``, now or armed at run cycle ``cycle``."""

    def ecc_counters(self) -> dict[str, np.ndarray]:
        """Memory ECC events per PE since ``reset_counters``: ``corrected`` and ``detected``, ``[h, w]``."""

    def inject_link(self, x: int, y: int, port, bits, cycle: int = 0) -> None:
        """Arm a flip of link code-word bits ``bits`` in the first wavelet leaving
        router ``(x, y)`` through ``port`` in run cycle ``cycle`` or later."""

    def link_ecc_counters(self) -> dict[str, np.ndarray]:
        """Link ECC events since ``reset_counters``, ``[h, w, 4]`` by sending router and port."""

    def kill(self, x: int, y: int, port=None) -> None:
        """Kill PE ``(x, y)`` (``port`` None) or the link leaving router ``(x,
        y)`` through ``port`` (both directions): a run that needs it hangs with
        a report that names it."""


def calls_of(protocol: type) -> tuple[str, ...]:
    """The calls (methods) a device protocol declares, in declaration order, its bases' first."""
    names: list[str] = []
    for klass in reversed(protocol.__mro__):
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        names += [name for name, value in vars(klass).items()
                  if callable(value) and not name.startswith("_") and name not in names]
    return tuple(names)


#: The calls of :class:`Device` and of :class:`RtlDevice`, by name.
DEVICE_CALLS: tuple[str, ...] = calls_of(Device)
RTL_CALLS: tuple[str, ...] = calls_of(RtlDevice)
