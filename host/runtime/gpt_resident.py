"""The device of a resident GPT step (``docs/transformer.md`` section 11, *Resident values*).

A resident step runs every phase on ONE device. :class:`ResidentDevice` wraps it for the phase
drivers of :mod:`.gpt_fabric`, which were written for a fresh device per phase: before each phase the
driver sets the phase's word ranges (:func:`wse.host.compiler.gpt_moves.with_moves`): every ``load``
keeps the ``keep`` ranges (the memory plan's live slots, the attention round's region, the phase's
input ports; a relayout's span, :meth:`ResidentDevice.add_ranges`), and a ``memcpy_h2d`` inside a
``resident`` range is not written: those words are the device's, put there by the move programs (or
by the phase before, within an attention round), so a phase computes on what the fabric left, never on
the host's copy. Everything else passes through: programs, parameters, tables, op lists, MemoryX's
weights and rows, the loss's delta. Every load also zeroes the counters, so a phase's ``fmac`` count
is its own.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ResidentDevice", "gemm_image", "gemm_matrix"]


class ResidentDevice:
    """A device whose loads keep, and whose host writes skip, the current phase's ranges (see the module)."""

    def __init__(self, device):
        self.device = device
        self.keep: list[tuple[int, int]] = []
        self.resident: list[tuple[int, int]] = []
        self.per_pe: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.skipped = 0

    def __getattr__(self, name):
        return getattr(self.device, name)

    def set_ranges(self, keep, resident, per_pe=None) -> None:
        """The ranges of the phase about to run (``per_pe``: resident ranges of single PEs)."""
        self.keep, self.resident = _merged(keep), _merged(resident)
        self.per_pe = {pe: _merged(r) for pe, r in (per_pe or {}).items()}

    def add_ranges(self, keep, resident) -> None:
        """More ranges for the phase (a relayout's spans)."""
        self.set_ranges(self.keep + list(keep), self.resident + list(resident), self.per_pe)

    def load(self, program, rect=None, keep=()) -> None:
        """Load ``program`` keeping the phase's ranges (and ``keep``); zero the counters."""
        self.device.load(program, rect, _merged(self.keep + [tuple(r) for r in keep]))
        self.device.reset_counters()

    def memcpy_h2d(self, addr: int, array, rect=None) -> None:
        """Write ``array`` unless its words lie in a resident range (the device holds them)."""
        n = np.asarray(array).shape[-1]
        ranges = list(self.resident)
        if rect is not None and tuple(rect[2:]) == (1, 1):
            ranges += self.per_pe.get((int(rect[0]), int(rect[1])), [])
        elif not any(lo <= addr and addr + n <= hi for lo, hi in ranges) and \
                any(addr < hi and lo < addr + n for r in self.per_pe.values() for lo, hi in r):
            raise AssertionError(f"a host write of words {addr}..{addr + n - 1} to several PEs meets resident words")
        for lo, hi in ranges:
            if lo <= addr and addr + n <= hi:
                self.skipped += 1
                return
            if addr < hi and lo < addr + n:
                raise AssertionError(f"a host write of words {addr}..{addr + n - 1} crosses the resident "
                                     f"words {lo}..{hi - 1}")
        self.device.memcpy_h2d(addr, array, rect)


def _merged(ranges) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((int(lo), int(hi)) for lo, hi in ranges if hi > lo):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def gemm_image(config, blocks, matrix: np.ndarray, words: int) -> np.ndarray:
    """``uint32 [H, W, words]``: ``matrix [N, F]`` in the streamed GEMM's layout, feature-major per PE."""
    image = np.zeros((config.height, config.width, words), dtype=np.uint32)
    start = 0
    for x, count in enumerate(blocks):
        for y in range(config.height):
            flat = matrix[start:start + count][:, y::config.height].T.ravel()
            image[y, x, :flat.size] = flat
        start += count
    return image


def gemm_matrix(config, blocks, image: np.ndarray, features: int) -> np.ndarray:
    """The ``[N, F]`` matrix of :func:`gemm_image`'s ``image``."""
    out = np.zeros((sum(blocks), features), dtype=np.uint32)
    start = 0
    for x, count in enumerate(blocks):
        for y in range(config.height):
            feats = np.arange(y, features, config.height)
            out[start:start + count, feats] = image[y, x, :len(feats) * count].reshape(len(feats), count).T
        start += count
    return out
