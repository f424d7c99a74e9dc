"""The ``verilator`` backend: the host API on the Verilator-compiled RTL.

:class:`VerilatorFabric` is an :class:`~.device.RtlFabric` whose primitives
are calls into the shared library of :func:`~.build.verilator_library`
(``harness/wse_mesh.cpp``): a mesh of Verilator models of the tile module,
stepped in C++ ``STEP`` cycles per call, with the edge-port queues and the
recorded outputs in C++. Python runs only between those calls.

::

    from wse.sim.cosim.verilator import VerilatorFabric
    fabric = VerilatorFabric(FabricConfig(width=4, height=4))
    fabric.load(program); fabric.launch(0); cycles = fabric.run()
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from wse.config import FabricConfig, UsageError

from .build import verilator_library
from .device import RtlFabric

__all__ = ["VerilatorFabric", "STEP"]

#: Cycles per call into the library while a run lasts (Python checks for
#: Ctrl-C between calls).
STEP = 1 << 16

_STEPS = 1  # the library's "step budget used, still running" status
_u32p = np.ctypeslib.ndpointer(dtype=np.uint32, flags="C_CONTIGUOUS")
_u64p = np.ctypeslib.ndpointer(dtype=np.uint64, flags="C_CONTIGUOUS")
_u8p = np.ctypeslib.ndpointer(dtype=np.uint8, flags="C_CONTIGUOUS")
_SIGNATURES = {
    "wse_new": (ctypes.c_void_p, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    "wse_free": (None, [ctypes.c_void_p]),
    "wse_reset": (None, [ctypes.c_void_p]),
    "wse_host": (None, [ctypes.c_void_p, ctypes.c_int, _u32p, _u32p, _u32p, _u32p]),
    "wse_stream_in": (None, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, _u32p, _u8p]),
    "wse_queued": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
    "wse_start": (None, [ctypes.c_void_p]),
    "wse_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
    "wse_out_count": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int]),
    "wse_out_take": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, _u64p, _u64p]),
    "wse_emit_count": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int]),
    "wse_emit_take": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, _u64p, _u64p]),
    "wse_set_trace": (None, [ctypes.c_void_p, ctypes.c_int]),
    "wse_set_threads": (None, [ctypes.c_void_p, ctypes.c_int]),
    "wse_regs": (None, [ctypes.c_void_p, ctypes.c_int, _u32p]),
    "wse_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "wse_cycle": (ctypes.c_uint64, [ctypes.c_void_p]),
    "wse_hops": (ctypes.c_uint64, [ctypes.c_void_p]),
    "wse_running": (ctypes.c_int, [ctypes.c_void_p]),
    "wse_run_cycles": (ctypes.c_uint64, [ctypes.c_void_p]),
    "wse_host_cycles": (ctypes.c_uint64, [ctypes.c_void_p]),
    "wse_evals": (ctypes.c_uint64, [ctypes.c_void_p]),
}
_LIBRARIES: dict[str, ctypes.CDLL] = {}


def _library(path) -> ctypes.CDLL:
    path = str(path)
    lib = _LIBRARIES.get(path)
    if lib is None:
        lib = ctypes.CDLL(path)
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        _LIBRARIES[path] = lib
    return lib


class VerilatorFabric(RtlFabric):
    """The host API of :class:`wse.sim.golden.Fabric` on the Verilator-compiled RTL.

    Parameters
    ----------
    config:
        The fabric; default :meth:`FabricConfig.current`. The first device of
        a configuration compiles its tile (about a minute; cached in
        ``build/cosim/verilator``).
    threads:
        Threads that evaluate the tiles (default 1, or ``WSE_COSIM_THREADS``).
        More than one helps large meshes on an otherwise idle machine only.

    Raises
    ------
    UsageError
        If ``threads`` is not a positive integer, or Verilator is missing.
    """

    backend = "verilator"

    def __init__(self, config: FabricConfig | None = None, threads: int | None = None):
        super().__init__(config)
        if threads is None:
            threads = int(os.environ.get("WSE_COSIM_THREADS", "1"))
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise UsageError(f"threads must be a positive integer, not {threads!r}")
        self._lib = _library(verilator_library(self.config))
        self._handle = self._lib.wse_new(self.width, self.height, self.colors, threads)

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.wse_free(handle)

    def close(self) -> None:
        """Free the models now (the device is unusable afterwards)."""
        self.__del__()

    # ------------------------------------------------------------------ primitives
    def _bus(self, ctl, xy, wdata):
        rdata = np.zeros(len(ctl), dtype=np.uint32)
        if len(ctl):
            self._lib.wse_host(self._handle, len(ctl), np.ascontiguousarray(ctl, dtype=np.uint32), xy, wdata, rdata)
        return rdata

    def _inject(self, port, color, data, ctrl):
        self._lib.wse_stream_in(self._handle, port, color, len(data), data, ctrl)

    def _queued(self, port, color):
        return int(self._lib.wse_queued(self._handle, port, color))

    def _execute(self, max_cycles, window):
        lib, handle = self._lib, self._handle
        lib.wse_start(handle)
        status = _STEPS
        while status == _STEPS:
            status = lib.wse_step(handle, STEP, max_cycles, window)
        return status, int(lib.wse_cycle(handle))

    def _drain(self):
        for port in range(len(self._ports)):
            n = int(self._lib.wse_out_count(self._handle, port))
            if n:
                wavelets, cycles = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
                self._lib.wse_out_take(self._handle, port, n, wavelets, cycles)
                yield port, wavelets, cycles

    def _run_hops(self):
        return int(self._lib.wse_hops(self._handle))

    def _tile_state(self, tile):
        return int(self._lib.wse_state(self._handle, tile))

    def _registers(self, tile):
        out = np.zeros(16, dtype=np.uint32)
        self._lib.wse_regs(self._handle, tile, out)
        return out.tolist()

    def _take_emits(self, tile):
        n = int(self._lib.wse_emit_count(self._handle, tile))
        wavelets, cycles = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
        if n:
            self._lib.wse_emit_take(self._handle, tile, n, wavelets, cycles)
        return wavelets, cycles

    def _trace(self, on):
        self._lib.wse_set_trace(self._handle, int(on))

    def _reset_hardware(self):
        self._lib.wse_reset(self._handle)

    # ------------------------------------------------------------------ figures
    def stats(self) -> dict:
        """Simulation figures: ``run_cycles`` and ``host_cycles`` (clock cycles
        of runs and of host-bus requests so far) and ``evals`` (block
        model evaluations; idle blocks are skipped)."""
        return {"run_cycles": int(self._lib.wse_run_cycles(self._handle)),
                "host_cycles": int(self._lib.wse_host_cycles(self._handle)),
                "evals": int(self._lib.wse_evals(self._handle))}

    def set_threads(self, threads: int) -> None:
        """Evaluate the tiles on ``threads`` threads from now on."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise UsageError(f"threads must be a positive integer, not {threads!r}")
        self._lib.wse_set_threads(self._handle, threads)
