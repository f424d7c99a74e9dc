"""Co-simulation of any program: the same host calls on two devices, compared.

:class:`Lockstep` is itself a device with the host API
(:class:`wse.sim.api.Device`): every call goes to a reference (the golden
model) and to a device under test (an RTL backend), and what comes back must
be equal bit for bit. After each ``run`` it also compares what the host can
see without taking it: the cycle count, the hop count, every wavelet that
left the mesh (by edge port and color, in order), every per-PE counter, every
PE's registers, and (optionally) every word of every PE's data memory and
every wavelet each PE emitted. Memory faults go to both devices
(:meth:`Lockstep.inject`), and once any was injected the memory ECC counters
are compared too; an uncorrectable word must stop both runs with the same
report. Link flips likewise (:meth:`Lockstep.inject_link`): the link ECC
counters are compared after every run once one was armed, and an
uncorrectable wavelet must stop both runs with the same report.

So anything that runs on the golden model runs in co-simulation::

    run_kernel("gemv", config, device=lambda cfg: Lockstep(Fabric(cfg), VerilatorFabric(cfg)))  # wse.sim.runner

On the first difference it raises :class:`Divergence`, whose report names the
first differing wavelet (PE, color, index, cycle) or memory word instead of
only saying that something failed.
"""

from __future__ import annotations

import re

import numpy as np

from wse.config import Port
from wse.sim.golden import FabricHang
from wse.sim.golden.ecc import LINK_CODE_BITS, EccError, LinkEccError

__all__ = ["Divergence", "Lockstep", "golden_emits", "router_links"]

_EDGE_PES = {"N": lambda i, w, h: (i, 0), "S": lambda i, w, h: (i, h - 1),
             "W": lambda i, w, h: (0, i), "E": lambda i, w, h: (w - 1, i)}
#: The lines of a hang report that name a dead part or a dead PE's task (both devices must give the same).
_DEAD_LINE = re.compile(r"^(PE \(\d+, \d+\) is dead|the link between routers )")
_SEND = re.compile(r"^\s*(\d+) send  color (\d+) data (0x[0-9a-f]+) ctrl (\d)")



def router_links(width: int, height: int) -> list[tuple[int, int, str]]:
    """Every link between two routers of a ``width`` x ``height`` mesh, as ``(x, y, port)`` of its sending side."""
    return [(x, y, p) for y in range(height) for x in range(width) for p in "NESW"
            if 0 <= x + Port[p].delta[0] < width and 0 <= y + Port[p].delta[1] < height]

class Divergence(AssertionError):
    """The device under test and the reference differ.

    Attributes
    ----------
    first : dict
        The first difference: ``kind`` (``"wavelet"``, ``"emitted"``,
        ``"word"``, ``"register"``, ``"counter"``, ``"cycles"``, ``"result"``
        or ``"error"``) and, as they apply, ``pe`` ``(x, y)``, ``edge``
        (``"E1"``), ``color``, ``index``, ``cycle`` (the device's run cycle),
        ``reference_cycle``, ``addr``, ``device`` and ``reference`` (the
        two values).
    report : list of str
        The lines of the message.
    """

    def __init__(self, summary: str, first: dict, details: list[str] = ()):
        self.first = first
        self.report = [summary, *details]
        super().__init__("\n".join(self.report))


def _hex(value) -> str:
    return "(none)" if value is None else f"{int(value):#010x}"


def golden_emits(fabric, x: int, y: int) -> list[tuple[int, int, int, int]]:
    """The wavelets PE ``(x, y)`` of a traced golden model sent, from its trace:
    ``(data, color, ctrl, cycle)``, the cycle being the one at whose end the
    wavelet entered the PE's output queue."""
    out = []
    for line in fabric.trace(x, y):
        match = _SEND.match(line)
        if match:
            cycle, color, data, ctrl = match.groups()
            out.append((int(data, 16), int(color), int(ctrl), int(cycle)))
    return out


class Lockstep:
    """Two devices driven by the same host calls and compared after each.

    Parameters
    ----------
    reference:
        The reference device, normally :class:`wse.sim.golden.Fabric`
        (traced with ``trace=True`` for ``check_emits``).
    device:
        The device under test: an RTL backend (:class:`~.device.RtlFabric`).
    check_memory:
        After each run, compare every word of every PE's data memory (read
        over the host bus of the device: ``sram_words`` host cycles per PE).
    check_emits:
        After each run, compare every wavelet each PE emitted (the device
        must record them: this turns its recording on).
    check_registers:
        After each run, compare every PE's registers.

    Every call returns the reference's result once the device's equals it.

    Raises
    ------
    Divergence
        On the first difference.
    """

    backend = "lockstep"

    def __init__(self, reference, device, *, check_memory: bool = True, check_emits: bool = False,
                 check_registers: bool = True):
        if reference.config != device.config:
            raise ValueError(f"the devices have different configurations: {reference.config} and {device.config}")
        self.reference, self.device = reference, device
        self.config = reference.config
        self.width, self.height, self.colors = self.config.width, self.config.height, self.config.colors
        self.check_memory, self.check_emits, self.check_registers = check_memory, check_emits, check_registers
        self.runs = 0
        #: What the last check compared: counts by kind.
        self.compared: dict[str, int] = {}
        if check_emits:
            reference.enable_trace()
            device.trace_emits(True)
        self._emit_seen: dict[tuple[int, int], int] = {}
        self._injected = False   # memory faults injected: compare the ECC counters too
        self._link_injected = False   # link flips armed: compare the link ECC counters too

    # ------------------------------------------------------------------ forwarding
    def _both(self, name, *args, **kwargs):
        result = getattr(self.reference, name)(*args, **kwargs)  # a user's mistake raises here first
        got = getattr(self.device, name)(*args, **kwargs)
        return result, got

    def load(self, program, rect=None, keep=()):
        self._both("load", program, rect, keep)

    def set_route(self, x, y, color, input, outputs):
        outputs = list(outputs)
        self._both("set_route", x, y, color, input, outputs)

    def load_routes(self, table):
        self._both("load_routes", list(table))

    def memcpy_h2d(self, addr, array, rect=None):
        self._both("memcpy_h2d", addr, array, rect)

    def memcpy_d2h(self, addr, n, rect=None):
        expected, got = self._both("memcpy_d2h", addr, n, rect)
        x0, y0 = (0, 0) if rect is None else (int(rect[0]), int(rect[1]))
        self._compare_words(expected, got, addr, x0, y0)
        return expected

    def stream_in(self, edge, index, color, words, ctrl=None):
        self._both("stream_in", edge, index, color, words, ctrl)

    def stream_out(self, edge, index, color, with_ctrl=False):
        key = (str(edge).upper(), int(index), int(color))
        self._compare_outputs({key})
        expected, _ = self._both("stream_out", edge, index, color, with_ctrl)
        return expected

    def pending_out(self):
        expected, got = self._both("pending_out")
        self._compare_outputs(set(expected) | set(got))
        return expected

    def launch(self, task, rect=None):
        self._both("launch", task, rect)

    def reset_counters(self):
        self._both("reset_counters")

    def inject(self, x, y, addr, bits, cycle=None):
        """Flip the same stored code-word bits on both devices (now, or armed at ``cycle``)."""
        self._both("inject", x, y, addr, list(bits), cycle)
        self._injected = True

    def inject_random_timed(self, rng, cycles: int) -> int:
        """Arm one random single flip per PE, in a random non-zero word (the
        program and its data), at a random cycle below ``cycles``, on both
        devices; returns the flips armed. The reference must be the golden model."""
        armed = 0
        for y in range(self.height):
            for x in range(self.width):
                used = np.flatnonzero(self.reference.pe(x, y).mem.view(np.ndarray))
                if len(used):
                    self.inject(x, y, int(rng.choice(used)), [int(rng.integers(39))], int(rng.integers(cycles)))
                    armed += 1
        return armed

    def inject_random(self, rng, words_per_pe: int, flips: int = 1) -> int:
        """Flip ``flips`` random code-word bits in each of ``words_per_pe``
        random non-zero words (the program and its data) of every PE, on both
        devices; ``rng`` a numpy ``Generator``. Returns the words hit. The
        reference must be the golden model (its stored words pick the words)."""
        hit = 0
        for y in range(self.height):
            for x in range(self.width):
                # The reference's stored words, not read through its decoder (a read would scrub).
                used = np.flatnonzero(self.reference.pe(x, y).mem.view(np.ndarray))
                for addr in rng.choice(used, size=min(words_per_pe, len(used)), replace=False).tolist():
                    self.inject(x, y, int(addr), rng.choice(39, size=flips, replace=False).tolist())
                    hit += 1
        return hit

    def kill(self, x, y, port=None):
        """Kill the same PE (``port`` None) or link on both devices; a run that
        needs it must then hang on both with the same dead parts reported."""
        self._both("kill", x, y, port)

    def inject_link(self, x, y, port, bits, cycle=0):
        """Arm the same link flip on both devices."""
        self._both("inject_link", x, y, port, list(bits), cycle)
        self._link_injected = True

    def inject_random_links(self, rng, count: int, cycles: int, flips: int = 1, links=None,
                            first_at_zero: bool = False) -> list[tuple]:
        """Arm ``count`` flips of ``flips`` random link code-word bits on
        distinct random links between routers (of ``links``, default all:
        :func:`router_links`), each at a random cycle below ``cycles`` (the
        first at cycle 0 with ``first_at_zero``), on both devices; ``rng`` a
        numpy ``Generator``. Returns the flips armed: ``(x, y, port, bits, cycle)``."""
        links = router_links(self.width, self.height) if links is None else list(links)
        armed = []
        for i, k in enumerate(rng.choice(len(links), size=min(count, len(links)), replace=False).tolist()):
            x, y, p = links[k]
            bits = rng.choice(LINK_CODE_BITS, size=flips, replace=False).tolist()
            cycle = 0 if first_at_zero and i == 0 else int(rng.integers(cycles))
            self.inject_link(x, y, p, bits, cycle)
            armed.append((x, y, p, bits, cycle))
        return armed

    def link_ecc_counters(self):
        """Link ECC counts per link (``[h, w, 4]``); the device's must equal the reference's."""
        expected, got = self._both("link_ecc_counters")
        for name, grid in expected.items():
            self._count("counters", grid.size)
            bad = np.argwhere(np.asarray(grid) != np.asarray(got[name]))
            if bad.size:
                y, x, p = (int(v) for v in bad[0])
                raise Divergence(f"link from router ({x}, {y}) through {Port(p).name} counter link_{name}: "
                                 f"device {int(got[name][y, x, p])}, reference {int(grid[y, x, p])}",
                                 {"kind": "counter", "pe": (x, y), "name": f"link_{name}",
                                  "device": int(got[name][y, x, p]), "reference": int(grid[y, x, p])})
        return expected

    def ecc_counters(self):
        """Memory ECC counts per PE; the device's must equal the reference's."""
        expected, got = self._both("ecc_counters")
        self._compare_counters({"cycles": 0, "wavelet_hops": 0, "pe": {}},
                               {"cycles": 0, "wavelet_hops": 0, "pe": {}}, ecc=(expected, got))
        return expected

    def counters(self):
        expected, got = self._both("counters")
        self._compare_counters(expected, got)
        return expected

    def run(self, max_cycles=None):
        """Run both; the cycle counts must be equal, then :meth:`check`."""
        failures = []
        results = []
        for fabric in (self.reference, self.device):
            try:
                results.append(fabric.run(max_cycles))
                failures.append(None)
            except (FabricHang, EccError, LinkEccError) as exc:
                results.append(None)
                failures.append(exc)
        self.runs += 1
        if type(failures[0]) is not type(failures[1]):
            what = ((FabricHang, "hung"), (EccError, "stopped on a memory error"),
                    (LinkEccError, "stopped on a link error"))
            kinds = ["ran to the end" if f is None else next(w for k, w in what if isinstance(f, k)) for f in failures]
            raise Divergence(f"run {self.runs}: the reference {kinds[0]}, the device {kinds[1]}", {"kind": "error"},
                             [str(f) for f in failures if f is not None])
        if isinstance(failures[0], (EccError, LinkEccError)) and str(failures[0]) != str(failures[1]):
            raise Divergence(f"run {self.runs}: different error reports", {"kind": "error"},
                             [f"reference: {failures[0]}", f"device: {failures[1]}"])
        if isinstance(failures[0], FabricHang):
            dead = [line for line in failures[0].report if _DEAD_LINE.match(line)]
            if [line for line in failures[1].report if _DEAD_LINE.match(line)] != dead:
                raise Divergence(f"run {self.runs}: different dead parts reported", {"kind": "error"},
                                 [f"reference: {failures[0]}", f"device: {failures[1]}"])
        if self._link_injected:
            self.link_ecc_counters()
        if failures[0] is not None:
            raise failures[0]
        if results[0] != results[1]:
            raise Divergence(f"run {self.runs}: the device ran {results[1]} cycles, the reference {results[0]}",
                             {"kind": "cycles", "device": results[1], "reference": results[0]})
        self.check()
        return results[0]

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Compare everything the host can see without changing it: pending
        edge outputs, counters, registers, memories and emitted wavelets (as
        enabled). Raises :class:`Divergence` on the first difference."""
        self.compared = {}
        self._compare_outputs(set(self.reference.pending_out()) | set(self.device.pending_out()))
        ecc = (self.reference.ecc_counters(), self.device.ecc_counters()) if self._injected else None
        self._compare_counters(self.reference.counters(), self.device.counters(), ecc=ecc)
        for y in range(self.height):
            for x in range(self.width):
                if self.check_registers:
                    self._compare_registers(x, y)
                if self.check_emits:
                    self._compare_emits(x, y)
        if self.check_memory:
            words = self.config.sram_words
            self._compare_words(self.reference.memcpy_d2h(0, words), self.device.memcpy_d2h(0, words), 0, 0, 0)

    def _count(self, kind, n=1):
        self.compared[kind] = self.compared.get(kind, 0) + n

    def _compare_outputs(self, keys) -> None:
        ref_out = self.reference.edge_out
        dev_out, dev_cycles = self.device.edge_out, getattr(self.device, "edge_out_cycles", {})
        for key in sorted(keys):
            expected, got = ref_out.get(key, []), dev_out.get(key, [])
            self._count("edge wavelets", len(expected))
            if expected == got:
                continue
            edge, index, color = key
            i = next((k for k, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
            cycles = dev_cycles.get(key, [])
            pe = _EDGE_PES[edge](index, self.width, self.height)
            exp = expected[i] if i < len(expected) else None
            dev = got[i] if i < len(got) else None
            first = {"kind": "wavelet", "pe": pe, "edge": f"{edge}{index}", "color": color, "index": i,
                     "cycle": cycles[i] if i < len(cycles) else None,
                     "device": dev, "reference": exp}
            where = f"edge {edge}{index} (router of PE {pe}), color {color}, wavelet #{i}"
            when = f" (device cycle {first['cycle']})" if first["cycle"] is not None else ""
            raise Divergence(
                f"first differing wavelet: {where}{when}: device {self._wavelet(dev)}, reference {self._wavelet(exp)}",
                first, [f"  {len(got)} wavelet(s) from the device, {len(expected)} from the reference on this port"])

    @staticmethod
    def _wavelet(value) -> str:
        if value is None:
            return "(none)"
        data, ctrl = value
        return f"data {int(data):#010x} ctrl {int(ctrl)}"

    def _compare_counters(self, expected, got, ecc=None) -> None:
        if ecc is not None:
            expected = {**expected, "pe": {**expected["pe"], **{f"ecc_{k}": v for k, v in ecc[0].items()}}}
            got = {**got, "pe": {**got["pe"], **{f"ecc_{k}": v for k, v in ecc[1].items()}}}
        for name in ("cycles", "wavelet_hops"):
            self._count("counters")
            if expected[name] != got[name]:
                raise Divergence(f"counter {name}: device {got[name]}, reference {expected[name]}",
                                 {"kind": "counter", "name": name, "device": got[name], "reference": expected[name]})
        for name, grid in expected["pe"].items():
            theirs = np.asarray(got["pe"][name])
            self._count("counters", grid.size)
            bad = np.argwhere(np.asarray(grid) != theirs)
            if bad.size:
                y, x = (int(v) for v in bad[0])
                raise Divergence(f"PE ({x}, {y}) counter {name}: device {int(theirs[y, x])}, "
                                 f"reference {int(grid[y, x])}",
                                 {"kind": "counter", "pe": (x, y), "name": name, "device": int(theirs[y, x]),
                                  "reference": int(grid[y, x])})

    def _compare_registers(self, x, y) -> list[int]:
        expected = self.reference.registers(x, y)
        got = self.device.registers(x, y)
        self._count("registers", len(expected))
        for r, (a, b) in enumerate(zip(expected, got)):
            if a != b:
                raise Divergence(f"PE ({x}, {y}) register r{r}: device {_hex(b)}, reference {_hex(a)}",
                                 {"kind": "register", "pe": (x, y), "index": r, "device": b, "reference": a})
        return expected

    def _compare_emits(self, x, y) -> None:
        seen = self._emit_seen.get((x, y), 0)
        expected = golden_emits(self.reference, x, y)[seen:]
        got = self.device.emitted(x, y)
        self._emit_seen[(x, y)] = seen + len(expected)
        self._count("emitted wavelets", len(expected))
        for i in range(max(len(expected), len(got))):
            exp = expected[i] if i < len(expected) else None
            dev = got[i] if i < len(got) else None
            if exp is None or dev is None or exp[:3] != dev[:3]:
                color = (exp or dev)[1]
                first = {"kind": "emitted", "pe": (x, y), "color": color, "index": seen + i,
                         "cycle": dev[3] if dev else None, "reference_cycle": exp[3] if exp else None,
                         "device": dev[:3] if dev else None, "reference": exp[:3] if exp else None}
                raise Divergence(
                    f"first differing wavelet emitted by PE ({x}, {y}): #{seen + i}, color {color}, device "
                    f"{self._emitted(dev)} (leaves the PE in cycle {first['cycle']}), reference {self._emitted(exp)} "
                    f"(sent in cycle {first['reference_cycle']})", first)

    @staticmethod
    def _emitted(wavelet) -> str:
        return "(none)" if wavelet is None else f"color {wavelet[1]} data {wavelet[0]:#010x} ctrl {wavelet[2]}"

    def _compare_words(self, expected, got, addr, x0, y0) -> None:
        expected, got = np.asarray(expected), np.asarray(got)
        self._count("memory words", expected.size)
        bad = np.argwhere(expected != got)
        if bad.size:
            j, i, k = (int(v) for v in bad[0])
            x, y, word = x0 + i, y0 + j, addr + k
            raise Divergence(
                f"first differing memory word: PE ({x}, {y}) word {word}: device {_hex(got[j, i, k])}, "
                f"reference {_hex(expected[j, i, k])}",
                {"kind": "word", "pe": (x, y), "addr": word, "device": int(got[j, i, k]),
                 "reference": int(expected[j, i, k])},
                [f"  {len(bad)} word(s) differ in all"])

    # ------------------------------------------------------------------ reading
    def registers(self, x, y):
        """The registers of PE ``(x, y)``, compared."""
        return self._compare_registers(x, y)

    def route(self, x, y, color):
        expected, got = self._both("route", x, y, color)
        if expected[0] != got[0] or tuple(map(Port, expected[1])) != tuple(map(Port, got[1])):
            raise Divergence(f"router ({x}, {y}) color {color} route: device {got}, reference {expected}",
                             {"kind": "result", "pe": (x, y), "color": color, "device": got, "reference": expected})
        return expected
