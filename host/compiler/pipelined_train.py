"""The training phases of the layer-pipelined mode: the backward pass and
the optimizer on the PEs (``docs/layer_pipelined.md`` sections 3 and 7).

:func:`check_optimizer` says which optimizers the PEs run (SGD with weight
decay, momentum, dampening and Nesterov, as ``torch.optim.SGD`` defines
them); :func:`train_memory` takes the PE memory the training phases need;
:func:`backward_routes` adds the routes of the deltas and the input-gradient
chains; :func:`backward_records` and :func:`update_records` build each PE's
records (:mod:`wse.firmware.training.pipe`).

Colors: 4 carries a chain end's delta back along its output line; 5 and 6
(even layers) or 7 and 8 (odd layers) the input-gradient chains, which run
along a region's input lines towards the previous region and end at its
chain ends (the parity keeps a chain end's own chain apart from the one
that lands on it).
"""

from __future__ import annotations

import numpy as np

from wse.config import UsageError
from wse.firmware.kernels.common import chain_routes, multicast_routes
from wse.firmware.training import pipe

__all__ = ["DELTA_COLOR", "BACK_CHAIN_COLORS", "TRAIN_COLORS_USED", "check_optimizer", "train_memory",
           "backward_routes", "backward_records", "mask_at_sender", "update_records"]

#: The color of the deltas' multicast back along an output line.
DELTA_COLOR = 4
#: The input-gradient chains' colors, by layer parity.
BACK_CHAIN_COLORS = ((5, 6), (7, 8))
#: Colors a training plan needs.
TRAIN_COLORS_USED = 9


def check_optimizer(optimizer) -> None:
    """Refuse an optimizer the PEs do not run (anything but ``sgd``), with one clear error.

    Raises
    ------
    UsageError
        For ``adam``, ``adamw`` or another name.
    """
    if optimizer.name != "sgd":
        raise UsageError(f"the layer-pipelined mode runs sgd (with momentum, dampening, Nesterov and "
                         f"weight decay) on the PEs, not {optimizer.name}; use --mode weight-streaming "
                         f"for {optimizer.name}")


def train_memory(mem, tile: int, k_max: int, o_max: int, optimizer) -> None:
    """Take the training buffers in ``mem``: the gradient and momentum tiles, the
    bias gradient and momentum, the delta, the mask scratch, the input-gradient partials."""
    momentum = optimizer.hyper["momentum"] != 0
    mem.take("g", tile, "the weight-gradient tile")
    if momentum:
        mem.take("m", tile, "the momentum tile")
    mem.take("db", o_max, "the bias gradient")
    if momentum:
        mem.take("mb", o_max, "the bias momentum")
    mem.take("dz", o_max, "the delta")
    mem.take("mk", max(o_max, k_max), "the mask")
    mem.take("dx", k_max, "the input-gradient partials")


def _back_chain(regions, l: int, q: int) -> list[tuple[int, int]]:
    """The cells of layer ``l``'s input-gradient chain on input line ``q``: from the
    far end of the line to its first PE, then the previous region's chain end."""
    region, prev = regions[l], regions[l - 1]
    return [region.pe(q, p) for p in range(region.n_out - 1, -1, -1)] + [prev.pe(prev.n_in - 1, q)]


def backward_routes(regions, along) -> list:
    """Route-table entries of the backward pass; ``along(region)`` gives
    ``(input-line port, reduction port)`` of a region's forward routes."""
    routes = []
    for l, region in enumerate(regions):
        along_in, along_out = along(region)
        for p in range(region.n_out):
            cells = [region.pe(q, p) for q in range(region.n_in - 1, -1, -1)]
            routes += multicast_routes(cells, along_out.opposite, DELTA_COLOR, from_edge=False)
        if l:
            for q in range(region.n_in):
                routes += chain_routes(_back_chain(regions, l, q), along_in.opposite, BACK_CHAIN_COLORS[l % 2],
                                       from_edge=False, to_edge=False)
    return routes


def mask_at_sender(layers, regions, l: int) -> bool:
    """Whether layer ``l - 1``'s ReLU mask is applied by layer ``l``'s input lines as
    they send the input gradient (their near ends, ``xmask``) rather than by layer
    ``l - 1``'s chain ends as they take it: where layer ``l``'s backward work per PE
    (twice its tile) is below layer ``l - 1``'s (its tile, twice but in layer 0),
    so the mask's vector instructions go to the less loaded region."""
    if l == 0 or not layers[l - 1].relu:
        return False
    return 2 * regions[l].tile < (2 if l > 1 else 1) * regions[l - 1].tile


def backward_records(config, layers, regions, mem, batch: int, zero: int, first: bool) -> list:
    """``[H][W]`` lists of the backward phase's records (``first``: the batch's
    first pass, which starts the gradients at +0; later passes accumulate)."""
    records = [[[] for _ in range(config.width)] for _ in range(config.height)]
    a = mem.regions
    last_layer = len(layers) - 1
    nothing = pipe.dsd_mem(0, 0)
    for l, (layer, region) in enumerate(zip(layers, regions)):
        ins, outs = region.in_blocks(), region.out_blocks()
        colors = BACK_CHAIN_COLORS[l % 2]
        for q, p, x, y in region.cells():
            k, o = len(ins[q]), len(outs[p])
            end = q == region.n_in - 1
            if end and l < last_layer:
                nxt = regions[l + 1]
                dyin = pipe.dsd_fabin(BACK_CHAIN_COLORS[(l + 1) % 2][nxt.n_out % 2], o)
            else:
                dyin = nothing
            m = region.n_out - 1 - p        # position on the input-gradient chain
            records[y][x].append(pipe.encode("pbwd", dict(
                t=batch, k=k, o=o, xbase=a["xs"][0], ybase=a["ys"][0], dxbase=a["dx"][0], zero=int(first), end=int(end),
                host=int(end and l == last_layer),
                mask=int(end and l < last_layer and layer.relu and not mask_at_sender(layers, regions, l + 1)),
                bias=int(end and layer.bias is not None), mcast=int(end and region.n_in > 1), dx=int(l > 0),
                dxfirst=int(m == 0), xmask=int(p == 0 and mask_at_sender(layers, regions, l)),
                g=pipe.dsd_mem(a["g"][0], k * o), zg=pipe.dsd_mem(zero, k * o, 0), db=pipe.dsd_mem(a["db"][0], o),
                zo=pipe.dsd_mem(zero, o, 0), dz=pipe.dsd_mem(a["dz"][0], o), ys=pipe.dsd_mem(0, o), dyin=dyin,
                mk=pipe.dsd_mem(a["mk"][0], o), dzout=pipe.dsd_fabout(DELTA_COLOR, o),
                dzin=pipe.dsd_fabin(DELTA_COLOR, o), wrow=pipe.dsd_mem(a["w"][0], o),
                dxv=pipe.dsd_mem(a["dx"][0], k),
                bin=pipe.dsd_fabin(colors[m % 2], k) if l else nothing,
                bout=pipe.dsd_fabout(colors[(m + 1) % 2], k) if l else nothing,
                xg=pipe.dsd_mem(0, k), xmk=pipe.dsd_mem(a["mk"][0], k))))
    return records


def _f32(value: float) -> int:
    return int(np.float32(value).view(np.uint32))


def update_records(config, layers, regions, mem, optimizer, first: bool) -> list:
    """``[H][W]`` lists of the update phase's records (``first``: the step that
    creates the momentum buffers, as ``torch.optim.SGD``'s first step does)."""
    records = [[[] for _ in range(config.width)] for _ in range(config.height)]
    a = mem.regions
    h = optimizer.hyper
    momentum = h["momentum"] != 0
    for layer, region in zip(layers, regions):
        ins, outs = region.in_blocks(), region.out_blocks()
        for q, p, x, y in region.cells():
            k, o = len(ins[q]), len(outs[p])
            bias = q == region.n_in - 1 and layer.bias is not None
            mom = (lambda name, n: pipe.dsd_mem(a[name][0], n)) if momentum else (lambda name, n: pipe.dsd_mem(0, 0))
            records[y][x].append(pipe.encode("pupd", dict(
                params=2 if bias else 1, wd=int(h["weight_decay"] != 0), mom=int(momentum), first=int(first),
                nest=int(h["nesterov"]), rwd=_f32(h["weight_decay"]), rmu=_f32(h["momentum"]),
                rdamp=_f32(1 - h["dampening"]), rlr=_f32(-h["lr"]),
                w=pipe.dsd_mem(a["w"][0], k * o), g=pipe.dsd_mem(a["g"][0], k * o), m=mom("m", k * o),
                b=pipe.dsd_mem(a["b"][0], o), db=pipe.dsd_mem(a["db"][0], o), mb=mom("mb", o))))
    return records
