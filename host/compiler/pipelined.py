"""The layer-pipelined mapping: every layer resident on its own region of
the fabric (:mod:`.pipelined_place`), weights stationary in PE memory,
samples streaming through (``docs/layer_pipelined.md``).

:func:`plan` returns a :class:`PipelinedPlan`: the regions, the memory map
(the same addresses on every PE), the routes, each phase's per-PE op records
(:mod:`wse.firmware.training.pipe`), where every weight tile lives, how the
samples enter and where the logits are left.

Colors: 0 and 1 carry a region's inputs (alternating by layer: a region's
last PEs send the next region's inputs while their router still takes their
own inputs); 2 and 3 the reduction chains (alternating along a chain).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import FabricConfig, Port, UsageError
from wse.firmware.kernels.common import block_partition, chain_routes, multicast_routes
from wse.firmware.training import pipe

from .ir import Graph
from .pipelined_place import Region, place_replicas
from .pipelined_reduce import REDUCE_COLORS_USED, reduce_records, reduce_routes
from .pipelined_train import (TRAIN_COLORS_USED, backward_records, backward_routes, check_optimizer,
                              train_memory, update_records)
from .weight_streaming import FitError, MemoryFitError, WSLayer, _lower, _Memory

__all__ = ["INPUT_COLORS", "CHAIN_COLORS", "COLORS_USED", "PipelinedPlan", "plan"]

#: Colors of the regions' input multicasts (by layer parity) and of the reduction chains.
INPUT_COLORS = (0, 1)
CHAIN_COLORS = (2, 3)
COLORS_USED = 4


@dataclasses.dataclass
class PipelinedPlan:
    """The layer-pipelined mapping of one model, batch and fabric.

    Members
    -------
    config, batch, graph:
        What was mapped.
    optimizer:
        The :class:`~wse.host.memoryx.optim.OptimizerConfig` the PEs run at
        the end of each batch, or None for a plan that only evaluates.
    layers:
        The Linear layers in order, with their ReLU flags.
    regions:
        One :class:`~.pipelined_place.Region` per layer.
    memory:
        Name -> (address, words) of every buffer in PE memory.
    owners:
        Words per PE by what needs them (for the plan's report and fit errors).
    routes:
        Route-table entries ``(x, y, color, input, outputs)``.
    phases:
        Phase name -> ``(ops address, [H][W] lists of record word arrays)``.
    sequences:
        The phases of an evaluation pass (``"eval"``) and, with an optimizer,
        of a training step: a batch of ``n`` samples runs in passes of
        ``batch`` samples, ``"first_pass"`` (its gradients start at +0) then
        ``"pass"`` (they accumulate), and ends with ``"update"`` (or
        ``"first_update"`` on a run's first step, which creates the momentum buffers),
        with replicas preceded by ``"reduce"`` (the copies' gradients summed on the fabric).
    """
    config: FabricConfig
    batch: int
    graph: Graph
    optimizer: object
    layers: list
    regions: list
    memory: dict
    owners: dict
    routes: list
    phases: dict
    sequences: dict
    harvest: tuple = ()
    replica_regions: tuple = ()
    shards: tuple = ()

    @property
    def replicas(self) -> int:
        """Copies of the pipeline on the mesh (data-parallel: each takes a shard of every pass)."""
        return max(1, len(self.replica_regions))

    def copies(self) -> list:
        """``(regions, samples)`` of every replica: its regions and the range of a pass's samples it takes."""
        if not self.replica_regions:
            return [(self.regions, range(self.batch))]
        return list(zip(self.replica_regions, self.shards))

    def addr(self, name: str) -> int:
        """Address of buffer ``name``."""
        return self.memory[name][0]

    def describe(self) -> list[str]:
        """The plan in lines a person reads: every layer's region and tile, and PE memory."""
        lines = [f"layer-pipelined on a {self.config.mesh} mesh, batch {self.batch}"]
        if self.replicas > 1:
            sizes = ", ".join(str(len(s)) for s in self.shards)
            lines.append(f"  replicas: {self.replicas} copies of the pipeline side by side, "
                         f"{self.config.width // self.replicas} columns each "
                         f"(replica 0's regions below, the others moved east), shards of {sizes} samples")
        for layer, region in zip(self.layers, self.regions):
            axis = "columns" if region.inputs_on_columns else "rows"
            lines.append(f"  {layer.name} {layer.k}->{layer.o}: columns {region.x0}-{region.x0 + region.cols - 1}, "
                         f"rows {region.y0}-{region.y0 + region.rows - 1} ({region.pes} PEs, inputs along "
                         f"{axis}), largest tile {region.tile} multiply-adds per sample")
        used = max(addr + words for addr, words in self.memory.values())
        detail = ", ".join(f"{owner} {words}" for owner, words in self.owners.items())
        lines.append(f"  memory per PE: {used} of {self.config.sram_words} words ({detail})")
        return lines

    def weight_tiles(self, weights, tile: str = "w", bias: str = "b") -> list[tuple[int, int, int, np.ndarray]]:
        """``(x, y, address, uint32 words)`` writes that place every layer's
        weight tiles (``Wt[k][o]``, k-major) and biases (at the chain ends) in PE
        memory; ``tile`` and ``bias`` name the buffers (``"m"``, ``"mb"``: the momentum)."""
        writes = []
        for layer, region in ((layer, regions[l]) for regions, _ in self.copies()
                              for l, layer in enumerate(self.layers)):
            w = np.ascontiguousarray(weights[layer.weight], dtype=np.float32)
            for q, p, x, y, ins, outs in self._tiles(region):
                writes.append((x, y, self.addr(tile), np.ascontiguousarray(w[np.ix_(outs, ins)].T).ravel().view(np.uint32)))
                if layer.bias is not None and q == region.n_in - 1:
                    b = np.asarray(weights[layer.bias], dtype=np.float32)[outs]
                    writes.append((x, y, self.addr(bias), np.ascontiguousarray(b).view(np.uint32)))
        return writes

    @staticmethod
    def _tiles(region):
        ins, outs = region.in_blocks(), region.out_blocks()
        for q, p, x, y in region.cells():
            yield q, p, x, y, np.asarray(ins[q]), np.asarray(outs[p])

    def read_tiles(self, read, tile: str = "w", bias: str = "b", replica: int = 0) -> dict[str, np.ndarray]:
        """The parameters (or, with ``"m"``, ``"mb"``, the momentum buffers) by name,
        assembled from the PE memory of copy ``replica`` of the pipeline;
        ``read(x, y, address, words)`` returns ``uint32`` words."""
        out = {}
        for layer, region in zip(self.layers, self.copies()[replica][0]):
            w = np.zeros((region.o, region.k), dtype=np.float32)
            b = np.zeros(region.o, dtype=np.float32)
            for q, p, x, y, ins, outs in self._tiles(region):
                words = read(x, y, self.addr(tile), len(ins) * len(outs))
                w[np.ix_(outs, ins)] = np.asarray(words, dtype=np.uint32).view(np.float32).reshape(len(ins), -1).T
                if layer.bias is not None and q == region.n_in - 1:
                    b[outs] = np.asarray(read(x, y, self.addr(bias), len(outs)), dtype=np.uint32).view(np.float32)
            out[layer.weight] = w
            if layer.bias is not None:
                out[layer.bias] = b
        return out

    def input_streams(self, x: np.ndarray) -> list[tuple[str, int, int, np.ndarray]]:
        """``(edge, index, color, uint32 words)``: the batch ``x [batch, features]``
        entering the first region (of every replica: its shard), sample after sample, at the north edge."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        streams = []
        for regions, samples in self.copies():
            region, xs = regions[0], x[samples.start:samples.stop]
            streams += [("N", region.x0 + q, INPUT_COLORS[0], np.ascontiguousarray(xs[:, block]).ravel().view(np.uint32))
                        for q, block in enumerate(region.in_blocks())]
        return streams

    def logit_cells(self) -> list[tuple[int, int, range]]:
        """``(x, y, classes)``: the PEs holding the logits (``[sample][class]`` at
        the output store) and the classes each holds (one replica's; see :meth:`output_cells`)."""
        region = self.regions[-1]
        return [region.pe(region.n_in - 1, p) + (block,) for p, block in enumerate(region.out_blocks())]

    def output_cells(self) -> list[tuple[int, int, range, range]]:
        """``(x, y, classes, samples)``: the PEs of every replica holding the logits
        (``[sample][class]`` at the output store), the classes and the pass's samples each holds."""
        cells = []
        for regions, samples in self.copies():
            region = regions[-1]
            cells += [region.pe(region.n_in - 1, p) + (block, samples) for p, block in enumerate(region.out_blocks())]
        return cells


def _check_graph(graph: Graph, config: FabricConfig, batch: int, colors: int,
                 replicas: int = 1) -> tuple[list[WSLayer], list[list[Region]]]:
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    layers, relu_input = _lower(graph)
    if relu_input:
        raise FitError(f"model {graph.name} applies a ReLU to its input; the layer-pipelined mode starts "
                       f"with a Linear layer")
    if config.colors < colors:
        raise FitError(f"the layer-pipelined mode needs {colors} colors but the configuration has "
                       f"colors={config.colors}")
    if len(layers) > config.num_pes:
        raise FitError(f"model {graph.name} has {len(layers)} Linear layers but a {config.mesh} mesh has "
                       f"{config.num_pes} PEs; the layer-pipelined mode needs at least one PE per layer")
    return layers, place_replicas([(layer.k, layer.o) for layer in layers], config, replicas)


def plan(graph: Graph, config: FabricConfig, batch: int, optimizer=None, sparse: bool | str = False,
         replicas: int = 1) -> PipelinedPlan:
    """Map ``graph`` for the layer-pipelined mode with batches of ``batch`` samples on ``config``;
    with an ``optimizer`` (:class:`~wse.host.memoryx.optim.OptimizerConfig`) the
    plan also trains: backward pass and the optimizer on the PEs. With ``sparse``,
    every layer whose input is a ReLU's output harvests its sparsity (``psfwd``:
    only the nonzero activations are sent, as (index, value) pairs; the plan's
    ``harvest[l]`` says which layers do), and the forward phase's cycles depend
    on the activations (:func:`~.pipelined_cycles.phase_cycles` takes their pattern).
    ``sparse="skip"``: the activations are sent dense and the receiving PEs skip
    the zeros (no multiply-adds for them; the same float order and bits as the
    pairs); ``True`` or ``"pairs"``: the pairs.
    With ``replicas`` > 1 the pipeline is copied on adjacent strips of columns
    (:func:`~.pipelined_place.place_replicas`) and each pass's ``batch`` samples
    are dealt over the copies in contiguous shards (``block_partition``: at least
    one sample each); a training plan then adds the ``reduce`` phase before the
    update (:mod:`.pipelined_reduce`: the copies' gradients summed on the fabric
    in copy order, the sum given to every copy).

    Raises
    ------
    FitError
        If the layers cannot be placed, or the weight tiles, the in-flight
        activations and the op lists do not fit in ``sram_words`` (the
        message names each consumer's words).
    UsageError
        For a bad batch, a graph without a softmax cross-entropy loss or an
        optimizer the PEs do not run.
    """
    if optimizer is not None:
        check_optimizer(optimizer)
    if sparse not in (False, True, "pairs", "skip"):
        raise UsageError(f"sparse must be False, True, 'pairs' or 'skip', not {sparse!r}")
    if sparse and replicas != 1:
        raise UsageError("activation sparsity harvesting runs with one replica, not with replicas")
    colors = COLORS_USED if optimizer is None else TRAIN_COLORS_USED if replicas == 1 else REDUCE_COLORS_USED
    layers, copies = _check_graph(graph, config, batch, colors, replicas)
    batch = int(batch)
    if batch < len(copies):
        raise UsageError(f"batch {batch} is smaller than the {len(copies)} replicas; each takes at least one sample")
    shards = tuple(block_partition(batch, len(copies)))
    regions = copies[0]
    shard = len(shards[0])
    program = pipe.pipelined_program(config)
    k_max = max(-(-r.k // r.n_in) for r in regions)
    o_max = max(-(-r.o // r.n_out) for r in regions)
    mem = _Memory(program.data_end)
    mem.take("w", max(r.tile for r in regions), "the weight tile")
    mem.take("b", o_max, "the bias")
    mem.take("acc", o_max, "the partial sums")
    mem.take("xs", shard * k_max, f"the inputs of {shard} samples in flight")
    mem.take("ys", shard * o_max, f"the outputs of {shard} samples in flight")
    harvest = tuple(bool(sparse) and l > 0 and layers[l - 1].relu for l in range(len(layers)))
    skip = sparse == "skip"
    if any(harvest):
        mem.take("pair", 2, "the (index, value) pair")
    if optimizer is not None:
        train_memory(mem, max(r.tile for r in regions), k_max, o_max, optimizer)
        if len(copies) > 1:
            reduce, reduce_rows = reduce_records(config, layers, copies, mem)
    ops = {"forward": mem.take("ops:forward", pipe.record_words("psfwd" if any(harvest) else "pfwd") + 2,
                               "op lists")}
    if optimizer is not None:
        ops["backward_first"] = mem.take("ops:backward_first", pipe.record_words("pbwd") + 2, "op lists")
        ops["backward"] = mem.take("ops:backward", pipe.record_words("pbwd") + 2, "op lists")
        ops["update"] = mem.take("ops:update", pipe.record_words("pupd") + 2, "op lists")
        if optimizer.hyper["momentum"] != 0:
            ops["update_first"] = mem.take("ops:update_first", pipe.record_words("pupd") + 2, "op lists")
        if len(copies) > 1:
            longest = max(sum(len(words) for words in records) for row in reduce for records in row)
            ops["reduce"] = mem.take("ops:reduce", longest + 2, "op lists")
    if mem.next > config.sram_words:
        detail = ", ".join(f"{owner} {words}" for owner, words in mem.owners.items())
        raise MemoryFitError(f"model {graph.name} with batch {batch} needs {mem.next} words per PE in the "
                             f"layer-pipelined mode on a {config.mesh} mesh ({detail}, program data "
                             f"{program.data_end}) but sram_words is {config.sram_words}", mem.next)
    zero = program.symbol("f_zero")
    forward = [[[] for _ in range(config.width)] for _ in range(config.height)]
    routes = []
    for copy, samples in zip(copies, shards):
        routes += _routes(copy)
        _forward_records(forward, layers, copy, mem, len(samples), zero, harvest, skip)
    phases = {"forward": (ops["forward"], forward)}
    sequences = {"eval": ["forward"]}
    if optimizer is not None:
        for copy in copies:
            routes += backward_routes(copy, _along)
        for name, first in (("backward_first", True), ("backward", False)):
            phases[name] = (ops[name], _merge(backward_records(config, layers, copy, mem, len(samples), zero, first)
                                              for copy, samples in zip(copies, shards)))
        phases["update"] = (ops["update"], _merge(update_records(config, layers, copy, mem, optimizer, False)
                                                  for copy in copies))
        reduced = []
        if len(copies) > 1:
            routes += reduce_routes(copies, reduce_rows)
            phases["reduce"] = (ops["reduce"], reduce)
            reduced = ["reduce"]
        sequences.update({"first_pass": ["forward", "backward_first"], "pass": ["forward", "backward"],
                          "first_update": reduced + ["update"], "update": reduced + ["update"]})
        if "update_first" in ops:
            phases["update_first"] = (ops["update_first"], _merge(
                update_records(config, layers, copy, mem, optimizer, True) for copy in copies))
            sequences["first_update"] = reduced + ["update_first"]
    many = len(copies) > 1
    return PipelinedPlan(config, batch, graph, optimizer, layers, regions, dict(mem.regions), dict(mem.owners),
                         routes, phases, sequences, harvest, tuple(copies) if many else (), shards if many else ())


def _merge(grids) -> list:
    """One ``[H][W]`` grid of record lists from several (the copies' cells are disjoint)."""
    grids = list(grids)
    return [[sum((g[y][x] for g in grids), []) for x in range(len(grids[0][0]))] for y in range(len(grids[0]))]


def _along(region: Region) -> tuple[Port, Port]:
    """``(port along an input line, port along a reduction chain)`` of a region's forward routes."""
    return (Port.S, Port.E) if region.inputs_on_columns else (Port.E, Port.S)


def _routes(regions: list[Region]) -> list:
    routes = []
    for l, region in enumerate(regions):
        color = INPUT_COLORS[l % 2]
        along_in, along_out = _along(region)
        for q in range(region.n_in):
            cells = [region.pe(q, p) for p in range(region.n_out)]
            if l == 0:
                routes += multicast_routes(cells, along_in, color, from_edge=True)
            else:
                prev = regions[l - 1]
                source = prev.pe(prev.n_in - 1, q)     # the end of the previous region's chain q
                routes += multicast_routes([source] + cells, along_in, color, from_edge=False)
        for p in range(region.n_out):
            cells = [region.pe(q, p) for q in range(region.n_in)]
            routes += chain_routes(cells, along_out, CHAIN_COLORS, from_edge=False, to_edge=False)
    return routes


def _forward_records(records: list, layers, regions, mem, batch: int, zero: int, harvest=(),
                     skip: bool = False) -> list:
    """Append the forward phase's records of one copy of the pipeline to the ``[H][W]``
    lists ``records`` (``psfwd`` where a PE takes or sends harvested activations,
    ``harvest[l]``: layer ``l``'s inputs are; with ``skip`` they are sent dense and
    the receivers skip the zeros); ``batch``: the copy's samples."""
    a = mem.regions
    last_layer = len(layers) - 1
    for l, (layer, region) in enumerate(zip(layers, regions)):
        ins, outs = region.in_blocks(), region.out_blocks()
        for q, p, x, y in region.cells():
            k, o = len(ins[q]), len(outs[p])
            first, last = q == 0, q == region.n_in - 1
            c_in, c_out = CHAIN_COLORS[q % 2], CHAIN_COLORS[(q + 1) % 2]
            fields = dict(
                t=batch, k=k, o=o, xbase=a["xs"][0], ybase=a["ys"][0], first=int(first), last=int(last),
                bias=int(last and layer.bias is not None), relu=int(last and layer.relu),
                send=int(last and l < last_layer),
                xin=pipe.dsd_fabin(INPUT_COLORS[l % 2], k), xs=pipe.dsd_mem(0, k), acc=pipe.dsd_mem(a["acc"][0], o),
                w0=pipe.dsd_mem(a["w"][0], o), w1=pipe.dsd_mem(a["w"][0] + o, (k - 1) * o),
                xw=pipe.dsd_mem(0, k - 1), cin=pipe.dsd_mem(zero, o, 0) if first else pipe.dsd_fabin(c_in, o),
                cout=pipe.dsd_fabout(c_out, o), ys=pipe.dsd_mem(0, o), b=pipe.dsd_mem(a["b"][0], o),
                xout=pipe.dsd_fabout(INPUT_COLORS[(l + 1) % 2], o))
            sin = bool(harvest) and harvest[l]
            sout = bool(harvest) and last and l < last_layer and harvest[l + 1] and not skip
            if sin or sout:
                pair = a["pair"][0]
                fields.update(sin=(2 if skip else 1) if sin else 0, sout=int(sout), layer=l, lin=ins[q][0], lout=outs[p][0],
                              wbase=a["w"][0], pbase=pair, zk=pipe.dsd_mem(zero, k, 0), zo=pipe.dsd_mem(zero, o, 0),
                              pair=pipe.dsd_mem(pair, 2), pin=pipe.dsd_fabin(INPUT_COLORS[l % 2], 2),
                              pout=pipe.dsd_fabout(INPUT_COLORS[(l + 1) % 2], 2))
            else:
                del fields["xw"]
            records[y][x].append(pipe.encode("psfwd" if sin or sout else "pfwd", fields))
    return records
