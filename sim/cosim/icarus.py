"""The ``icarus`` backend: the host API through cocotb, from another process.

:class:`CocotbProxyFabric` builds the full RTL mesh for a cocotb simulator
(Icarus by default, Verilator too), starts the simulator with the
:mod:`wse.sim.cocotb_tb.server_tb` test, and forwards every host-API call to
the :class:`~.cocotb_device.CocotbFabric` inside it over a local socket. It is
slow (Python in every clock cycle of an event-driven simulator) and meant for
cross-checking the other backends::

    fabric = IcarusFabric(FabricConfig(width=2, height=2))
    ...                       # the calls of wse.sim.api.RtlDevice
    fabric.close()            # or use it as a context manager
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path

from wse.config import FabricConfig, UsageError
from wse.sim.api import RTL_CALLS, RtlDevice
from wse.sim.golden import FabricHang, ProgramFault, ecc

from .build import cocotb_build

__all__ = ["CocotbProxyFabric", "IcarusFabric"]

_ERRORS = {"UsageError": UsageError, "ProgramFault": ProgramFault, "EccError": ecc.EccError,
           "LinkEccError": ecc.LinkEccError}
_CONNECT_TIMEOUT = 120.0
#: Seconds between the progress lines of a simulator that is starting or of a call still running.
PROGRESS_EVERY = 10.0


class CocotbProxyFabric:
    """The host API of an RTL device (:class:`wse.sim.api.RtlDevice`) on the
    RTL mesh under cocotb in a simulator process: every call is forwarded to
    the :class:`~.cocotb_device.CocotbFabric` there.

    Parameters
    ----------
    config:
        The fabric; default :meth:`FabricConfig.current`.
    sim:
        ``"icarus"`` (default) or ``"verilator"``.
    waves:
        Record an FST waveform (in the run folder, see :attr:`run_dir`).

    Raises
    ------
    UsageError
        For an unknown simulator or a missing one.
    RuntimeError
        If the simulator does not start or dies.

    While the simulator starts, and while a call (a ``run``) takes longer
    than :data:`PROGRESS_EVERY` seconds, a line on stderr says so every
    :data:`PROGRESS_EVERY` seconds.
    """

    def __init__(self, config: FabricConfig | None = None, sim: str = "icarus", waves: bool = False):
        self.config = config or FabricConfig.current()
        self.width, self.height, self.colors = self.config.width, self.config.height, self.config.colors
        self.backend = sim if sim == "icarus" else f"cocotb-{sim}"
        build = cocotb_build(sim, self.config, "mesh", waves=waves)
        #: Folder of the simulator's log (``sim.log``) and waveform.
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"wse-{sim}-"))
        authkey = os.urandom(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = self._listener.address
        env = {"WSE_COSIM_CONFIG": json.dumps(self.config.to_dict()), "WSE_COSIM_ADDRESS": f"{host}:{port}",
               "WSE_COSIM_AUTHKEY": authkey.hex()}
        self._failure: BaseException | None = None

        def simulate():
            try:
                build.test("wse.sim.cocotb_tb.server_tb", self.run_dir, extra_env=env)
            except BaseException as exc:  # the simulator's exit status, reported on the next call
                self._failure = exc

        self._thread = threading.Thread(target=simulate, name=f"wse-{sim}", daemon=True)
        self._thread.start()
        self._connection = self._accept()

    def _accept(self):
        result = {}

        def accept():
            try:
                result["connection"] = self._listener.accept()
            except OSError as exc:
                result["error"] = exc

        waiter = threading.Thread(target=accept, daemon=True)
        waiter.start()
        started = time.monotonic()
        waiter.join(PROGRESS_EVERY)
        while waiter.is_alive() and (self._thread.is_alive() or time.monotonic() - started < _CONNECT_TIMEOUT):
            self._say(f"starting the {self.backend} simulator", started)
            waiter.join(PROGRESS_EVERY)
        if "connection" not in result:
            self._listener.close()
            raise RuntimeError(f"the {self.backend} simulator did not start; see {self.run_dir / 'sim.log'}")
        return result["connection"]

    def _say(self, what: str, started: float) -> None:
        print(f"  ... {what}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

    def _call(self, name, *args, **kwargs):
        if self._connection is None:
            raise UsageError(f"the {self.backend} device is closed")
        try:
            self._connection.send((name, args, kwargs))
            started = time.monotonic()
            while not self._connection.poll(PROGRESS_EVERY):
                self._say(f"{self.backend} simulation ({self.width}x{self.height} mesh): {name}", started)
            answer = self._connection.recv()
        except (EOFError, OSError):
            raise RuntimeError(f"the {self.backend} simulator died ({self._failure}); "
                               f"see {self.run_dir / 'sim.log'}") from None
        if answer[0] == "ok":
            return answer[1]
        if answer[0] == "hang":
            _, message, report, cycle = answer
            raise FabricHang(message, report, cycle)
        _, kind, message = answer
        raise _ERRORS.get(kind, RuntimeError)(message)

    def close(self) -> None:
        """End the simulation."""
        if getattr(self, "_connection", None) is not None:
            try:
                self._call("close")
            finally:
                self._connection.close()
                self._connection = None
                self._listener.close()
                self._thread.join(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # the interpreter may be shutting down
            pass

    # ------------------------------------------------------------------ host API
    # Every call of wse.sim.api.RtlDevice is sent to the simulator (_remote, below the class);
    # these four first turn their iterables into lists, which travel over the connection.
    def set_route(self, x, y, color, input, outputs):
        """See :meth:`wse.sim.api.Device.set_route`."""
        return self._call("set_route", x, y, color, input, list(outputs))

    def load_routes(self, table):
        """See :meth:`wse.sim.api.Device.load_routes`."""
        return self._call("load_routes", [(x, y, c, i, list(o)) for x, y, c, i, o in table])

    def inject(self, x, y, addr, bits, cycle=None):
        """See :meth:`wse.sim.api.RtlDevice.inject`."""
        return self._call("inject", x, y, addr, _listed(bits), cycle)

    def inject_link(self, x, y, port, bits, cycle=0):
        """See :meth:`wse.sim.api.RtlDevice.inject_link`."""
        return self._call("inject_link", x, y, port, _listed(bits), cycle)

    @property
    def edge_out(self):
        """Collected, not yet taken, edge outputs (a copy)."""
        return self._call("outputs")[0]

    @property
    def edge_out_cycles(self):
        """The run cycles of :attr:`edge_out`."""
        return self._call("outputs")[1]


def _listed(values):
    """An iterable as a list (it travels over the connection); anything else as it is, for the device to refuse."""
    try:
        return list(values)
    except TypeError:
        return values


def _remote(name: str):
    """The proxy's method ``name``: the call, its arguments bound as the
    contract (:class:`wse.sim.api.RtlDevice`) declares them, defaults filled
    in, sent to the simulator process. It has the contract's signature and
    docstring."""
    template = getattr(RtlDevice, name)
    signature = inspect.signature(template)

    @functools.wraps(template)
    def method(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return self._call(name, *bound.args[1:])

    method.__module__, method.__qualname__ = __name__, f"CocotbProxyFabric.{name}"
    return method


# Every call of the contract not written out above is forwarded as it is.
for _name in RTL_CALLS:
    if _name not in vars(CocotbProxyFabric):
        setattr(CocotbProxyFabric, _name, _remote(_name))
del _name


def IcarusFabric(config: FabricConfig | None = None, waves: bool = False) -> CocotbProxyFabric:
    """The ``icarus`` backend: :class:`CocotbProxyFabric` on Icarus Verilog."""
    return CocotbProxyFabric(config, "icarus", waves)
