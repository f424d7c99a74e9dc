"""Progress lines of long golden-model runs: what runs, the cycle reached, the time spent and left.

A :class:`CycleProgress` is a :attr:`Fabric.progress <wse.sim.golden.Fabric.progress>`
callback. The fabric calls it every few thousand cycles of a run (nothing
is called when no callback is set); it prints a line at most every
``every`` seconds, so a run shorter than that prints nothing::

    golden model, step 1: cycle 61,440 of about 195,629 (31 %), 30 s, about 66 s left

Cycles count from the moment the callback is attached (across the
fabric's runs: a training step's phases), so ``expected`` can be a whole
step's cycles from the static cycle model.
"""

from __future__ import annotations

import contextlib
import sys
import time

__all__ = ["CycleProgress", "reporting"]


class CycleProgress:
    """Prints ``what: cycle C [of about E (P %)], S s[, about L s left]`` every ``every`` seconds.

    Parameters
    ----------
    fabric:
        The :class:`~wse.sim.golden.Fabric` whose cycles are counted (its
        ``total_cycles`` when the object is made is cycle 0).
    what:
        The first words of each line.
    expected:
        The cycles the whole job should take (the static cycle model), for
        the percentage and the time left; None when unknown.
    every:
        Seconds between lines.
    stream:
        Where the lines go (default ``sys.stderr``).
    """

    def __init__(self, fabric, what: str, expected: int | None = None, every: float = 10.0, stream=None):
        self.fabric, self.what, self.expected, self.every = fabric, what, expected, float(every)
        self.stream = stream
        self.base = fabric.total_cycles
        self.started = time.monotonic()
        self.next_line = self.started + self.every
        self.lines = 0

    def line(self, cycle: int, spent: float) -> str:
        """The progress line for ``cycle`` cycles done after ``spent`` seconds."""
        text = f"{self.what}: cycle {cycle:,}"
        if self.expected:
            text += f" of about {self.expected:,} ({min(100 * cycle // self.expected, 99)} %)"
        text += f", {spent:.0f} s"
        if self.expected and 0 < cycle < self.expected:
            text += f", about {spent * (self.expected - cycle) / cycle:.0f} s left"
        return text

    def __call__(self, t: int) -> None:
        now = time.monotonic()
        if now < self.next_line:
            return
        self.next_line = now + self.every
        self.lines += 1
        cycle = self.fabric.total_cycles - self.base + t
        print(self.line(cycle, now - self.started), file=self.stream or sys.stderr, flush=True)


@contextlib.contextmanager
def reporting(fabric, what: str, expected: int | None = None, every: float = 10.0, stream=None):
    """Attach a :class:`CycleProgress` to ``fabric`` for the block (a no-op for a fabric
    without the ``progress`` hook, such as an RTL device); yields it, or None."""
    if fabric is None or not hasattr(fabric, "progress"):
        yield None
        return
    before = fabric.progress
    fabric.progress = CycleProgress(fabric, what, expected, every, stream)
    try:
        yield fabric.progress
    finally:
        fabric.progress = before
