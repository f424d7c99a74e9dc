"""Progress of the compile steps that can take more than a few seconds.

:class:`Progress` counts the steps of one stage (the phases of the cycle
model, say). It says nothing for a stage that ends within ``after`` seconds;
past that, on a terminal it shows a tqdm bar on stderr, and otherwise (a log,
a pipe) it writes one line per step at most every ``every`` seconds, so a
long compile is never silent and a short one stays quiet.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    """Progress of a compile stage of ``total`` steps, as a context manager.

    Parameters
    ----------
    stage:
        What is being done (``"cycle model"``).
    total:
        Steps in the stage.
    enabled:
        ``False`` keeps it silent.
    after, every:
        Seconds before anything is shown; least seconds between two lines
        when stderr is not a terminal.
    stream:
        Where to write (stderr by default).
    """

    def __init__(self, stage: str, total: int, *, enabled: bool = True, after: float = 2.0, every: float = 5.0,
                 stream=None):
        self.stage, self.total, self.enabled = stage, int(total), bool(enabled)
        self.after, self.every = after, every
        self.stream = sys.stderr if stream is None else stream
        self.done = 0
        self._started = 0
        self._began = self._said = time.perf_counter()
        self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def step(self, name: str) -> None:
        """The next step, ``name``, begins (the steps before it are done)."""
        self.done = self._started
        self._started += 1
        if self._bar is not None:
            self._bar.update(self.done - self._bar.n)
        self._show(name)

    def _show(self, name: str) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._began < self.after:
            return
        if self._bar is None and getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm
            self._bar = tqdm(total=self.total, initial=self.done, desc=self.stage, file=self.stream,
                             leave=False)
        if self._bar is not None:
            self._bar.set_postfix_str(name)
        elif now - self._said >= self.every or self._said == self._began:
            self._said = now
            print(f"{self.stage}: {self._started}/{self.total} {name} ({now - self._began:.0f} s)",
                  file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.update(self.total - self._bar.n)
            self._bar.close()
