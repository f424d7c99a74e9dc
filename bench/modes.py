"""Execution modes compared: the layer-pipelined forward pass against weight
streaming's, from each mode's static cycle model (equal to the golden model's
cycles, checked by tests/test_pipelined.py and tests/test_weight_streaming.py).

For each model on its mesh, one JSON line per mode:

* ``pipelined``: the forward phase's cycles at two batches ``b1 < b2`` (the
  largest that fits PE memory) of a plan that evaluates; the steady-state
  cycles per sample ``(c(b2) - c(b1)) / (b2 - b1)`` (every region busy at
  once: what one more sample costs); the **steady-state FMAC utilization**:
  the model's multiply-adds per sample over (all the mesh's PEs, idle ones
  included, times those steady-state cycles), the same multiply-add count for
  every mode (``sum(k * o)`` over the Linear layers; backward
  ``2 * sum(k * o)`` less layer 0's input gradient); the fill and drain share
  of the ``b2`` run ``1 - b2 * steady / c(b2)`` (the bubble); the regions and
  the slowest region's tile;
* ``weight_streaming``: the forward phases' cycles per sample at its batch
  (weights streaming in at the full rate the cycle model assumes) and the
  same utilization;

then a line with the ratio of the two modes' cycles per sample (the
baseline is weight streaming, measured in the same run); then, for training
(SGD with momentum on the PEs; weight streaming's update runs in MemoryX and
costs no fabric cycles):

* ``pipelined`` training: forward and backward cycles of one pass at two
  pass sizes ``b1 < b2`` (``b2`` the largest in flight that fits with the
  gradient and momentum tiles), their steady-state cycles per sample, the
  update's cycles, the FMAC utilization of the backward steady state, and
  the cycles per sample of a batch of ``ws_batch`` run in passes of at most
  ``b2`` (fill and drain of every pass, the update once);
  the steady-state FMAC utilization of forward, backward and both (the
  model's multiply-adds over PEs times the steady cycles per sample), and the
  whole step's (every phase's FMACs, padding included, over PEs times the
  step's cycles);
* ``weight_streaming`` training: the cycles of all phases of a step per sample,
  the whole step's FMAC utilization and that of its streamed GEMM phases;

and the ratio of the two. Then activation sparsity harvesting, both ways
(``"harvest": "pairs"``: ``plan(..., sparse=True)``, only the nonzero
activations sent; ``"skip"``: ``sparse="skip"``, sent dense and the receivers
skip the zeros) at 0%, 50% and 90% zeros in the inputs of every layer that
follows a ReLU (random patterns, seeded; the cycle model given the pattern
equals the golden model's, tests/test_pipelined_sparse.py): per fraction, the
forward phase's cycles (batch 32) and, for each harvesting layer, its busiest
PE's own cycles per sample (instructions and vector elements, no waits: the
rate that layer alone could run at), with the ratio to the dense plan's
(baseline: the same layer in ``pfwd``, in the same run; target at 90% zeros
at most 0.3). Last, the host's time for one training step of
FC-MNIST (``examples/fc_mnist.py``, batch 64, 16x16) on the functional
backend in each mode, as ``wse train`` takes it (``OneSystem.step``: for weight
streaming the runtime's step and MemoryX's optimizer step; for the pipelined
mode the runtime's step with the update on the PEs), the same batches timed in
alternating blocks over several rounds (medians), and their ratio (baseline:
weight streaming, in the same run).

Data-parallel replicas inside the wafer (``plan(..., replicas=k)``, forward
pass): for ``k = 1, 2, 4, ...`` copies of the pipeline on strips of
``width / k`` columns, each with a shard of ``s`` samples (``s`` the largest
that fits one copy's PE memory, at most 64), the forward phase's cycles of
``k * s`` samples and the samples per 1M cycles, against two baselines
measured in the same run, both with ``s`` samples:

* ``over_k_times_one_replica`` (the target's, at least 0.8): ``k`` times one
  copy on the strip a replica gets (``width / k`` columns, the whole height),
  i.e. what replication itself costs: the edge shared by ``k`` intakes and
  outflows and, in training, the gradient reduction;
* ``over_k_times_one_copy_whole_mesh``: ``k`` times one copy spread over the
  whole mesh (strong scaling: whether replicating beats one larger copy,
  which is what the compiler's choice of ``k`` weighs);

and the number :func:`~wse.host.compiler.pipelined_cycles.choose_replicas`
picks. Then training with ``k`` copies (SGD with momentum on the PEs, the
copies' gradients reduced on the fabric): per ``k``, a step of one pass of
``k * s`` samples (``s`` the largest shard one copy's training memory holds,
at most 64): its cycles (forward, backward, ``reduce``, update), the
reduction's share, training samples per 1M cycles and the same two ratios
(one copy's step of ``s`` samples on the strip, on the whole mesh).

Usage: python bench/modes.py [--skip-cycles] [--replicas-only] [--bounds-only] [--steps 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from wse.config import FabricConfig
from wse.host.compiler import compile_model
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.firmware.training import pipe_timing
from wse.firmware.training.timing import BUSY, RECV, VEC
from wse.host.compiler.pipelined_cycles import choose_replicas, pe_fmacs, phase_cycles
from wse.host.compiler.weight_streaming import FitError
from wse.host.memoryx.optim import OptimizerConfig

#: The optimizer the PEs run in the training lines.
OPTIMIZER = OptimizerConfig("sgd", lr=0.05, momentum=0.9)


def _mlp(dims):
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def _largest_batch(graph, config, limit=64, optimizer=None):
    best = None
    for batch in range(1, limit + 1):
        try:
            plan(graph, config, batch, optimizer)
        except FitError:
            break
        best = batch
    return best


def measure(name: str, dims, config: FabricConfig, ws_batch: int) -> None:
    """Print the JSON lines of one model (see the module docstring)."""
    model = _mlp(dims)
    example = torch.zeros(1, dims[0])
    graph = trace(model, example)
    macs = sum(a * b for a, b in zip(dims, dims[1:]))
    b2 = _largest_batch(graph, config)
    b1 = max(1, b2 // 2)
    p1, p2 = plan(graph, config, b1), plan(graph, config, b2)
    c1, c2 = phase_cycles(p1)["forward"], phase_cycles(p2)["forward"]
    steady = (c2 - c1) / (b2 - b1)
    pes = config.num_pes
    print(json.dumps({"model": name, "mesh": config.mesh, "mode": "pipelined", "batches": [b1, b2],
                      "cycles": [c1, c2], "cycles_per_sample": round(steady, 1),
                      "fmac_utilization_steady": round(macs / (pes * steady), 3),
                      "fmac_utilization_run": round(int(pe_fmacs(p2, "forward").sum()) / (pes * c2), 3),
                      "bubble_fraction": round(1 - b2 * steady / c2, 3),
                      "regions": [[r.cols, r.rows] for r in p2.regions],
                      "slowest_tile": max(r.tile for r in p2.regions)}))
    exe = compile_model(model, example, config=config, batch=ws_batch, mode="weight_streaming")
    fwd = [phase for phase in exe.phases.values() if phase.group == "forward"]
    ws_cycles = sum(phase.cycles for phase in fwd)
    print(json.dumps({"model": name, "mesh": config.mesh, "mode": "weight_streaming", "batch": ws_batch,
                      "cycles": ws_cycles, "cycles_per_sample": round(ws_cycles / ws_batch, 1),
                      "fmac_utilization": round(sum(phase.fmacs for phase in fwd) / (pes * ws_cycles), 3)}))
    print(json.dumps({"model": name, "pipelined_over_weight_streaming_cycles_per_sample":
                      round(steady / (ws_cycles / ws_batch), 3)}))
    measure_training(name, graph, macs, config, exe, ws_batch)
    measure_sparsity(name, graph, config)
    measure_sparsity(name, graph, config, how="skip")


def _largest_shard(graph, config, replicas: int, limit: int = 64, optimizer=None) -> int | None:
    best = None
    for shard in range(1, limit + 1):
        try:
            plan(graph, config, shard * replicas, optimizer=optimizer, replicas=replicas)
        except FitError:
            break
        best = shard
    return best


def _strip(config: FabricConfig, k: int) -> FabricConfig:
    """The mesh one of ``k`` replicas gets: ``width // k`` columns, the whole height."""
    return dataclasses.replace(config, width=config.width // k)


def measure_replicas(name: str, dims, config: FabricConfig) -> None:
    """Print the replica lines of one model (see the module docstring)."""
    graph = trace(_mlp(dims), torch.zeros(1, dims[0]))
    base = None
    k = 1
    while k <= config.width:
        try:
            shard = _largest_shard(graph, config, k)
        except FitError as exc:
            print(json.dumps({"model": name, "mesh": config.mesh, "replicas": k, "fits": False,
                              "why": str(exc)}))
            break
        if shard is None:
            print(json.dumps({"model": name, "mesh": config.mesh, "replicas": k, "fits": False}))
            break
        if base is None:
            base = shard
        p = plan(graph, config, k * shard, replicas=k)
        cycles = phase_cycles(p)["forward"]
        strip = phase_cycles(plan(graph, _strip(config, k), shard))["forward"]   # one copy, its strip
        whole = phase_cycles(plan(graph, config, shard))["forward"]               # one copy, whole mesh
        rate, one_rate, whole_rate = k * shard / cycles * 1e6, shard / strip * 1e6, shard / whole * 1e6
        print(json.dumps({"model": name, "mesh": config.mesh, "mode": "pipelined", "replicas": k,
                          "shard": shard, "batch": k * shard, "forward_cycles": cycles,
                          "samples_per_1M_cycles": round(rate), "one_replica_samples_per_1M_cycles": round(one_rate),
                          "over_k_times_one_replica": round(rate / (k * one_rate), 3), "target": 0.8,
                          "one_copy_whole_mesh_samples_per_1M_cycles": round(whole_rate),
                          "over_k_times_one_copy_whole_mesh": round(rate / (k * whole_rate), 3),
                          "strip": [config.width // k, config.height],
                          "slowest_tile": max(r.tile for r in p.regions)}))
        k *= 2
    if base is not None:
        chosen, tried = choose_replicas(graph, config, base)
        print(json.dumps({"model": name, "mesh": config.mesh, "choose_replicas_batch": base, "chosen": chosen,
                          "forward_cycles_by_replicas": tried}))


def _step_cycles(p) -> tuple[int, dict]:
    """Cycles of a training step of one pass of ``p.batch`` samples (not a run's first step)."""
    c = phase_cycles(p)
    names = p.sequences["first_pass"] + p.sequences["update"]
    return sum(c[n] for n in names), c


def measure_replicas_training(name: str, dims, config: FabricConfig) -> None:
    """Print the training lines of ``k`` replicas (see the module docstring)."""
    graph = trace(_mlp(dims), torch.zeros(1, dims[0]))
    k = 1
    while k <= config.width:
        try:
            shard = _largest_shard(graph, config, k, optimizer=OPTIMIZER)
        except FitError as exc:
            print(json.dumps({"model": name, "mesh": config.mesh, "training_replicas": k, "fits": False,
                              "why": str(exc)}))
            break
        if shard is None:
            print(json.dumps({"model": name, "mesh": config.mesh, "training_replicas": k, "fits": False}))
            break
        cycles, phases = _step_cycles(plan(graph, config, k * shard, optimizer=OPTIMIZER, replicas=k))
        strip, _ = _step_cycles(plan(graph, _strip(config, k), shard, optimizer=OPTIMIZER))  # one copy, its strip
        whole, _ = _step_cycles(plan(graph, config, shard, optimizer=OPTIMIZER))             # one copy, whole mesh
        rate, one_rate, whole_rate = k * shard / cycles * 1e6, shard / strip * 1e6, shard / whole * 1e6
        print(json.dumps({"model": name, "mesh": config.mesh, "mode": "pipelined", "training_replicas": k,
                          "shard": shard, "batch": k * shard, "step_cycles": cycles,
                          "reduce_cycles": phases.get("reduce", 0),
                          "reduce_fraction": round(phases.get("reduce", 0) / cycles, 3),
                          "train_samples_per_1M_cycles": round(rate),
                          "one_replica_train_samples_per_1M_cycles": round(one_rate),
                          "over_k_times_one_replica": round(rate / (k * one_rate), 3), "target": 0.8,
                          "one_copy_whole_mesh_train_samples_per_1M_cycles": round(whole_rate),
                          "over_k_times_one_copy_whole_mesh": round(rate / (k * whole_rate), 3),
                          "strip": [config.width // k, config.height]}))
        k *= 2


def _layer_cycles(plan_, pattern, layer: int) -> float:
    """The busiest PE of region ``layer``: its own cycles per sample in the forward phase."""
    region, best = plan_.regions[layer], 0
    for _, _, x, y in region.cells():
        words = np.concatenate(plan_.phases["forward"][1][y][x] + [np.zeros(2, dtype=np.uint32)])
        ops = pipe_timing.pe_ops(words, 0, pattern)
        own = sum(int(a) if op == BUSY else int(a) + 1 if op == VEC else 1 if op == RECV else 0
                  for op, a, *_ in ops)
        best = max(best, own)
    return best / plan_.batch


def measure_sparsity(name: str, graph, config: FabricConfig, batch: int = 32, how: str = "pairs") -> None:
    """Print the activation sparsity lines of one model (see the module docstring); ``how``:
    ``"pairs"`` (only the nonzero activations sent) or ``"skip"`` (sent dense, the receivers
    skip the zeros)."""
    dense, sparse = plan(graph, config, batch), plan(graph, config, batch, sparse=how)
    widths = [layer.k for layer in sparse.layers]
    ones = [np.ones((batch, k), dtype=bool) for k in widths]
    base_phase = phase_cycles(dense)["forward"]
    harvesting = [l for l, h in enumerate(sparse.harvest) if h]
    base = {l: _layer_cycles(dense, ones, l) for l in harvesting}
    rng = np.random.default_rng(0)
    for zeros in (0.0, 0.5, 0.9):
        pattern = [ones[0]] + [rng.random((batch, k)) >= zeros for k in widths[1:]]
        cycles = phase_cycles(sparse, pattern)["forward"]
        layers = {sparse.layers[l].name: {"cycles_per_sample": round(_layer_cycles(sparse, pattern, l), 1),
                                          "dense_cycles_per_sample": round(base[l], 1),
                                          "over_dense": round(_layer_cycles(sparse, pattern, l) / base[l], 3)}
                  for l in harvesting}
        print(json.dumps({"model": name, "mesh": config.mesh, "mode": "pipelined", "harvest": how, "sparsity": zeros,
                          "batch": batch, "forward_cycles": cycles, "dense_forward_cycles": base_phase,
                          "forward_over_dense": round(cycles / base_phase, 3), "harvesting_layers": layers,
                          "target_over_dense_at_0.9": 0.3}))


def measure_training(name: str, graph, macs: int, config: FabricConfig, exe, ws_batch: int) -> None:
    """Print the training lines of one model (see the module docstring)."""
    b2 = _largest_batch(graph, config, optimizer=OPTIMIZER)
    b1 = max(1, b2 // 2)
    c1, c2 = phase_cycles(plan(graph, config, b1, OPTIMIZER)), phase_cycles(plan(graph, config, b2, OPTIMIZER))
    fwd = (c2["forward"] - c1["forward"]) / (b2 - b1)
    bwd = (c2["backward"] - c1["backward"]) / (b2 - b1)
    passes = -(-ws_batch // b2)
    per_pass = -(-ws_batch // passes)
    cp = phase_cycles(plan(graph, config, per_pass, OPTIMIZER))
    step = passes * cp["forward"] + cp["backward_first"] + (passes - 1) * cp["backward"] + cp["update"]
    backward_macs = 2 * macs - graph_first_layer_macs(graph)
    pes = config.num_pes
    pp = plan(graph, config, per_pass, OPTIMIZER)
    step_fmacs = sum(int(pe_fmacs(pp, phase).sum()) * count for phase, count in
                     (("forward", passes), ("backward_first", 1), ("backward", passes - 1), ("update", 1)))
    print(json.dumps({"model": name, "mesh": config.mesh, "mode": "pipelined", "training": True,
                      "batches": [b1, b2], "forward_cycles": [c1["forward"], c2["forward"]],
                      "backward_cycles": [c1["backward"], c2["backward"]], "update_cycles": c2["update"],
                      "forward_cycles_per_sample": round(fwd, 1), "backward_cycles_per_sample": round(bwd, 1),
                      "fmac_utilization_forward_steady": round(macs / (pes * fwd), 3),
                      "fmac_utilization_backward_steady": round(backward_macs / (pes * bwd), 3),
                      "fmac_utilization_steady": round((macs + backward_macs) / (pes * (fwd + bwd)), 3),
                      "batch": ws_batch, "passes": passes, "samples_per_pass": per_pass, "step_cycles": step,
                      "step_cycles_per_sample": round(step / ws_batch, 1),
                      "fmac_utilization_step": round(step_fmacs / (pes * step), 3),
                      "bubble_fraction_step": round(1 - ws_batch * (fwd + bwd) / step, 3)}))
    train = exe.sequences["train"]
    ws = sum(exe.phases[phase].cycles for phase in train)
    ws_fmacs = sum(exe.phases[phase].fmacs for phase in train)
    gemm = [phase for phase in train if exe.phases[phase].group in exe.layout.gemm_groups]
    gemm_cycles = sum(exe.phases[phase].cycles for phase in gemm)
    print(json.dumps({"model": name, "mesh": config.mesh, "mode": "weight_streaming", "training": True,
                      "batch": ws_batch, "step_cycles": ws, "step_cycles_per_sample": round(ws / ws_batch, 1),
                      "fmac_utilization_step": round(ws_fmacs / (pes * ws), 3),
                      "fmac_utilization_gemm_phases": round(sum(exe.phases[p].fmacs for p in gemm)
                                                            / (pes * gemm_cycles), 3),
                      "bubble_fraction_step": None,
                      "note": "phases run one after another over the whole mesh: no pipeline to fill; "
                              "the non-GEMM phases (loss, transfers) are its overhead"}))
    print(json.dumps({"model": name, "training_pipelined_over_weight_streaming_cycles_per_sample":
                      round(step / ws, 3)}))


def measure_bounds(name: str, dims, config: FabricConfig) -> None:
    """Print the FMAC utilization no staircase placement can exceed on ``config`` even with no
    per-sample overhead (``utilization_bounds``), beside the placement :func:`place` chooses."""
    from wse.host.compiler.pipelined_bounds import COSTS, region_bounds
    from wse.host.compiler.pipelined_place import place, utilization_bounds
    shapes = list(zip(dims[:-1], dims[1:]))
    bound = utilization_bounds(shapes, config)
    chosen = place(shapes, config)

    def rounded(d: dict) -> dict:
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in d.items()}

    print(json.dumps({"model": name, "mesh": config.mesh, "mode": "pipelined",
                      "staircase_bound_zero_overhead": rounded(bound),
                      "any_regions_bound": {costs: rounded(region_bounds(shapes, config, costs)) for costs in COSTS},
                      "chosen_regions": [[r.x0, r.y0, r.cols, r.rows] for r in chosen],
                      "note": "staircase: best over every staircase of forward, backward, training (both phases) "
                              "and min(forward, backward), with that placement's free sizes; any_regions: best "
                              "min(forward, backward) over every partition of the PEs into per-layer grids "
                              "(adjacency ignored), per cost model (none; outputs sent; inputs kept too), with "
                              "each layer's (PEs, output lines, input lines)"}))


def graph_first_layer_macs(graph) -> int:
    """Multiply-adds of the first Linear layer (its input gradient is not computed)."""
    from wse.host.compiler.weight_streaming import _lower
    layer = _lower(graph)[0][0]
    return layer.k * layer.o


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"


def measure_step_time(steps: int, rounds: int, warmup: int = 2) -> None:
    """Print the functional backend's seconds per FC-MNIST step in both modes (see the module docstring)."""
    from wse.host.appliance import TrainConfig, prepare
    from wse.host.appliance.engines import OneSystem
    engines = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in ("weight-streaming", "pipelined"):
            # prepare() compiles and loads everything but writes nothing; the folder is never created.
            run = prepare(TrainConfig(str(EXAMPLE), out=Path(scratch) / mode, backend="functional", mesh="16x16",
                                      batch=64, mode=mode))
            engines[mode] = (OneSystem(run.runtime, run.memoryx, run.executable), run.batches)
    torch.set_num_threads(1)            # as the appliance runs the host optimizer
    times: dict[str, list[float]] = {mode: [] for mode in engines}
    for mode, (engine, batches) in engines.items():
        for _ in range(warmup):
            engine.step(*batches.next_batch())
    for _ in range(rounds):
        for mode, (engine, batches) in engines.items():
            data = [batches.next_batch() for _ in range(steps)]
            for x, y in data:
                start = time.perf_counter()
                engine.step(x, y)
                times[mode].append(time.perf_counter() - start)
    median = {mode: statistics.median(t) for mode, t in times.items()}
    for mode, t in median.items():
        print(json.dumps({"model": "fc_mnist 784-256-256-10", "mesh": "16x16", "mode": mode.replace("-", "_"),
                          "backend": "functional", "batch": 64, "host_step_s": round(t, 4),
                          "steps_timed": len(times[mode])}))
    print(json.dumps({"model": "fc_mnist 784-256-256-10", "functional_step_pipelined_over_weight_streaming":
                      round(median["pipelined"] / median["weight-streaming"], 2), "target": 2.0}))


def main(argv: list[str] | None = None) -> None:
    """Run the comparison for FC-MNIST and a small model on 16x16, then the host step times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cycles", action="store_true", help="only the host step times")
    parser.add_argument("--replicas-only", action="store_true", help="only the data-parallel replica lines")
    parser.add_argument("--bounds-only", action="store_true", help="only the placements' utilization bounds")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    np.random.seed(0)
    if args.bounds_only:
        config = FabricConfig(width=16, height=16)
        measure_bounds("fc_mnist 784-256-256-10", (784, 256, 256, 10), config)
        measure_bounds("digits 64-32-10", (64, 32, 10), config)
        return
    if args.replicas_only:
        config = FabricConfig(width=16, height=16)
        measure_replicas("digits 64-32-10", (64, 32, 10), config)
        measure_replicas("fc_mnist 784-256-256-10", (784, 256, 256, 10), config)
        measure_replicas_training("digits 64-32-10", (64, 32, 10), config)
        measure_replicas_training("fc_mnist 784-256-256-10", (784, 256, 256, 10), config)
        return
    if not args.skip_cycles:
        config = FabricConfig(width=16, height=16)
        measure_bounds("fc_mnist 784-256-256-10", (784, 256, 256, 10), config)
        measure_bounds("digits 64-32-10", (64, 32, 10), config)
        measure("fc_mnist 784-256-256-10", (784, 256, 256, 10), config, 64)
        measure("digits 64-32-10", (64, 32, 10), config, 64)
        measure_replicas("digits 64-32-10", (64, 32, 10), config)
        measure_replicas("fc_mnist 784-256-256-10", (784, 256, 256, 10), config)
        measure_replicas_training("digits 64-32-10", (64, 32, 10), config)
        measure_replicas_training("fc_mnist 784-256-256-10", (784, 256, 256, 10), config)
    measure_step_time(max(1, args.steps), max(1, args.rounds))


if __name__ == "__main__":
    main()
