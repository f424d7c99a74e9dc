"""The replay's adaptive engine: every stretch of a run between two stops on
whichever of the two engines is faster there.

The reference engine (:func:`.replay._run`) and the fast one
(:func:`.replay_events.run_events`) take the same decisions and leave the
same state at every stop (``tests/test_compile_speed.py`` compares the whole
state at every op row of a watched PE), and the fast engine starts from any
state (it wakes every router with wavelets, every output queue with
wavelets and every PE not done), so a run may change engine at any stop
without changing a count: the cycles are the same whichever engine ran each
stretch (``tests/test_replay_periods.py`` checks runs that change engine
at every stop). Which engine is faster depends on the phase: the fast one
where most of the fabric waits (the streamed GEMMs' ``fwd``), the reference
where most routers grant every cycle (the weight gradients, the last
layer's ``bwd-data``), where the fast engine's wake lists cost more than
visiting everyone. :class:`AdaptiveRun` measures each engine's CPU seconds (of its thread)
per replayed cycle on the stretches it runs, runs the cheaper one, and
tries the other again after ``explore`` stretches, then after twice as many
each time (a fixed every ``explore``-th stretch gave the slower engine 18 of
the 255 stretches of the 2048-wide MLP's last ``bwd-data``, 0.2 of its 2.7
CPU s).
"""

from __future__ import annotations

import time

from .replay import _T

__all__ = ["AdaptiveRun"]


class AdaptiveRun:
    """A run function with :func:`.replay._run`'s signature that runs each call
    (a stretch up to the next stop) on one of ``engines`` (run functions of
    that signature), the one with the lowest measured CPU seconds per cycle.

    Stretches are told apart by the op row the watched PE starts them at (a
    rotation, a stream of weights, a loop of outputs cost the engines
    differently). Every engine runs one stretch first (the run's first
    stretches); from a row it has not run from, an engine's figure is its
    latest stretch's from any row, so the cheapest runs, and the
    ``explore``-th stretch from that row, the ``2 * explore``-th, the
    ``4 * explore``-th and so on go to the next engine to refresh its figure
    there (the CPU seconds over the cycles of its latest stretch from there).
    (Each engine ran one stretch from every new row first before: in the fill
    of the last layer's ``bwd-data`` on 64x994, 18 stretches of the events
    engine at four times the reference's cost, 23 of the first 5,000 cycles'
    34 CPU s.) Which engine runs a stretch is a choice
    only (both leave the same state). ``used[i]`` counts the stretches of
    engine ``i``.
    """

    def __init__(self, engines, explore: int = 16):
        self.engines = list(engines)
        self.explore = explore
        self.used = [0] * len(self.engines)
        self._rows: dict[bytes, list] = {}        # op row -> [calls, cost per engine (None: not run yet)]
        self._latest: list = [None] * len(self.engines)     # each engine's cost on its latest stretch, any row

    def pick(self, row: bytes) -> int:
        """The engine of the next stretch from op row ``row`` (its bytes)."""
        calls, costs = self._rows.setdefault(row, [0, [None] * len(self.engines)])
        known = [c if c is not None else self._latest[i] for i, c in enumerate(costs)]
        for i, c in enumerate(known):
            if c is None:           # an engine that has run no stretch of this run yet
                return i
        best = min(range(len(known)), key=lambda i: known[i])
        turn = calls // self.explore          # the explore-th call, then the 2*explore-th, 4*explore-th, ...
        refresh = calls > 0 and calls % self.explore == 0 and turn & (turn - 1) == 0
        return (best + 1) % len(self.engines) if refresh else best

    def __call__(self, routes, ports, ops, queues, cores, events, scalars, limit, watch):
        row = ops[cores.pc[watch]].tobytes() if watch >= 0 else b""
        i = self.pick(row)
        entry = self._rows[row]
        entry[0] += 1
        self.used[i] += 1
        began, cpu = int(scalars[_T]), time.thread_time()
        status = self.engines[i](routes, ports, ops, queues, cores, events, scalars, limit, watch)
        cycles = int(scalars[_T]) - began
        if cycles > 0:
            entry[1][i] = self._latest[i] = (time.thread_time() - cpu) / cycles
        return status
