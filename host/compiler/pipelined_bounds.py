"""Upper bounds on the layer-pipelined mode's FMAC utilization over *every* partition of
the mesh into per-layer regions, not only the staircases :func:`~.pipelined_place.place`
builds (``docs/layer_pipelined.md`` section 6).

The staircase makes a layer's output lines the next layer's input lines, so
adjacent layers share a side; :func:`~.pipelined_place.utilization_bounds`
bounds it. Here that constraint is dropped: layer ``l`` may take any grid of
``a`` output lines by ``b`` input lines (``a * b`` PEs, a tile of
``ceil(k/b) * ceil(o/a)`` multiply-adds) anywhere, as if the activations
could be redistributed between layers for free, and the only constraint left
is that the regions' PEs add up to at most the mesh's. What a PE must spend
per sample besides its multiply-adds is one of three cost models, each a
lower bound of what any program on this PE spends (it retires at most one
vector element a cycle, ``docs/architecture.md`` section 6):

``"none"``
    nothing: the multiply-adds alone.
``"outputs"``
    every element a PE produces for another PE leaves it in an element of
    its own: forward the tile's ``ot`` partial sums, backward (every layer
    but the first) the ``kt`` partial input gradients.
``"intake"``
    ``"outputs"`` plus, forward, the ``kt`` inputs written to memory: the
    weight gradient is formed in place from the sample's inputs, so each
    input is kept (one element each; a vector instruction has one
    destination, so the write is not part of a multiply-add).

Backward, the first layer forms its weight gradient only (``tile``), every
later layer its weight and input gradients (``2 * tile``).
"""

from __future__ import annotations

from fractions import Fraction

from wse.config import FabricConfig, UsageError

from .pipelined_place import pass_macs

__all__ = ["COSTS", "region_bounds"]

COSTS = ("none", "outputs", "intake")


def _options(layer: int, k: int, o: int, pes: int, costs: str) -> list[tuple[int, int, int, int, int]]:
    """Every grid of layer ``layer`` on at most ``pes`` PEs not dominated by another:
    ``(PEs, forward cycles, backward cycles, output lines, input lines)``."""
    grids = []
    for a in range(1, min(o, pes) + 1):
        for b in range(1, min(k, pes // a) + 1):
            kt, ot = -(-k // b), -(-o // a)
            tile = kt * ot
            fwd = tile + (ot if costs != "none" else 0) + (kt if costs == "intake" else 0)
            bwd = tile if layer == 0 else 2 * tile + (kt if costs != "none" else 0)
            grids.append((a * b, fwd, bwd, a, b))
    grids.sort()
    kept: list[tuple[int, int, int, int, int]] = []
    for g in grids:
        if not any(q[0] <= g[0] and q[1] <= g[1] and q[2] <= g[2] for q in kept):
            kept.append(g)
    return kept


def region_bounds(shapes: list[tuple[int, int]], config: FabricConfig, costs: str = "none") -> dict:
    """The best ``min(forward, backward)`` FMAC utilization of Linear layers ``shapes``
    (``(in, out)`` each) over every partition of ``config``'s PEs into one region per
    layer, under cost model ``costs`` (see the module docstring).

    Utilization is the model's multiply-adds per sample over all the mesh's PEs
    times the slowest region's cycles per sample, per pass (forward: ``sum(k*o)``;
    backward: twice that less the first layer's input gradient). Returns
    ``both`` (the best minimum), the ``forward`` and ``backward`` figures of that
    partition, and its ``regions``: per layer ``(PEs, output lines, input lines)``.
    Exact: the feasible utilizations are searched by bisection over every value
    a grid can give (as fractions: no rounding decides a comparison), each tested
    by taking every layer's fewest PEs that meet it.
    """
    if costs not in COSTS:
        raise UsageError(f"costs must be one of {', '.join(COSTS)}, not {costs!r}")
    if not shapes:
        raise UsageError("shapes must list at least one Linear layer's (in, out), not []")
    pes = config.width * config.height
    fwd_macs, bwd_macs = pass_macs(shapes)
    options = [_options(layer, k, o, pes, costs) for layer, (k, o) in enumerate(shapes)]

    def fewest(u: Fraction):
        """Per layer the grid with the fewest PEs whose passes both reach ``u``, or None."""
        chosen = []
        num, den = u.numerator * pes, u.denominator
        for grids in options:
            fit = [g for g in grids if fwd_macs * den >= num * g[1] and bwd_macs * den >= num * g[2]]
            if not fit:
                return None
            chosen.append(min(fit))
        return chosen if sum(g[0] for g in chosen) <= pes else None

    values = sorted({Fraction(fwd_macs, pes * g[1]) for grids in options for g in grids}
                    | {Fraction(bwd_macs, pes * g[2]) for grids in options for g in grids})
    lo, hi = 0, len(values) - 1
    if fewest(values[0]) is None:
        return {"both": 0.0, "forward": 0.0, "backward": 0.0, "regions": None}
    while lo < hi:                      # the largest value some partition reaches
        mid = (lo + hi + 1) // 2
        if fewest(values[mid]) is not None:
            lo = mid
        else:
            hi = mid - 1
    chosen = fewest(values[lo])
    forward = fwd_macs / (pes * max(g[1] for g in chosen))
    backward = bwd_macs / (pes * max(g[2] for g in chosen))
    return {"both": min(forward, backward), "forward": forward, "backward": backward,
            "regions": [(g[0], g[3], g[4]) for g in chosen]}
