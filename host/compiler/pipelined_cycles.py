"""The static cycle model of the layer-pipelined mode: the golden model's
cycles of every phase, from the op lists alone.

Each PE's instruction stream comes from
:func:`wse.firmware.training.pipe_timing.pe_ops` and is replayed against the
routers, edge ports and queues by the same compiled replay as weight
streaming (:func:`~wse.host.compiler.replay.replay`); the host's input streams
are the injections. It also gives each PE's FMAC elements, for the
utilization and the placement picture.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.training import pipe, pipe_timing

from .cycles import op_table, with_end
from .replay import Network, replay

__all__ = ["phase_cycles", "pe_fmacs", "activation_pattern", "choose_replicas"]


def _phase_ops(plan, records, pattern=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return op_table(plan.config, lambda i, j: with_end(records[i][j]),
                    lambda words: pipe_timing.pe_ops(words, 0, pattern))


def _injections(plan, name: str) -> dict:
    inject: dict = {}
    if name == "forward":
        for regions, samples in plan.copies():
            region = regions[0]
            for q, block in enumerate(region.in_blocks()):
                inject.setdefault(("N", region.x0 + q), {})[0] = len(samples) * len(block)
    return inject


def activation_pattern(plan, x: np.ndarray, outs: list) -> list[np.ndarray]:
    """Per layer, ``[batch, features]`` booleans: the layer's input word is not +0
    (``x`` the batch, ``outs`` every layer's outputs, as the functional model gives them).
    A harvesting plan's forward cycles depend on it."""
    acts = [np.asarray(x, dtype=np.float32).reshape(len(x), -1)] + list(outs[:-1])
    return [np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) != 0 for a in acts]


def phase_cycles(plan, pattern=None) -> dict[str, int]:
    """Cycles of every phase of a layer-pipelined plan, as the golden model counts them.
    A plan that harvests activation sparsity (``plan.harvest``) needs the batch's
    ``pattern`` (:func:`activation_pattern`) for its forward phase; without one
    that phase is left out.

    Raises
    ------
    RuntimeError
        If the replay hangs (a schedule that would deadlock the fabric).
    """
    network = Network(plan.config, plan.routes)
    out = {}
    for name, (_, records) in plan.phases.items():
        if name == "forward" and any(plan.harvest) and pattern is None:
            continue
        ops, starts, ends = _phase_ops(plan, records, pattern if name == "forward" else None)
        out[name] = int(replay(network, ops, starts, ends, _injections(plan, name)))
    return out


def pe_fmacs(plan, name: str) -> np.ndarray:
    """FMAC elements of every PE in phase ``name``, ``[H, W]``: forward, ``fmuls`` of
    the first input and ``fmacw``; backward, the weight gradient's ``fmacw`` and the
    input gradient's ``dot`` (not in layer 0)."""
    cfg = plan.config
    out = np.zeros((cfg.height, cfg.width), dtype=np.int64)
    for y, row in enumerate(plan.phases[name][1]):
        for x, records in enumerate(row):
            for words in records:
                kind, f = pipe.decode(words)
                if kind in ("pfwd", "psfwd"):     # psfwd: at most this many (the zeros skipped)
                    out[y, x] += f["t"] * f["k"] * f["o"]
                elif kind == "pbwd":      # fmacw of the weight gradient, dot of the input gradient
                    out[y, x] += f["t"] * f["k"] * f["o"] * (2 if f["dx"] else 1)
    return out


def choose_replicas(graph, config, batch: int) -> tuple[int, dict[int, int]]:
    """``(replicas, {replicas: forward cycles})``: the number of copies of the pipeline
    (1, 2, 4, ... up to the mesh's width and ``batch``) whose forward pass of ``batch``
    samples takes the fewest cycles on ``config``'s mesh (the static cycle model, so
    the golden model's), the fewer copies on a tie; counts that do not fit are left out.

    Raises
    ------
    FitError
        If not even one copy fits (:func:`~.pipelined.plan`'s error).
    """
    from .pipelined import plan
    from .weight_streaming import FitError

    cycles: dict[int, int] = {}
    k = 1
    while k <= min(config.width, batch):
        try:
            cycles[k] = phase_cycles(plan(graph, config, batch, replicas=k))["forward"]
        except FitError:
            if k == 1:
                raise
        k *= 2
    return min(cycles, key=lambda n: (cycles[n], n)), cycles
