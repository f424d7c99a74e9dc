"""Training speed: the functional backend against plain PyTorch on the CPU, same model and batch.

Trains FC-MNIST (examples/fc_mnist.py: 784-256-256-10) on the same batches
three ways in one process: the appliance's step (``Runtime.train_step`` with
the weights MemoryX holds, then the MemoryX optimizer step, torch limited to
one thread as the appliance runs it), and the reference's step (PyTorch
forward, backward and ``torch.optim`` step) with torch's default thread count
and with one thread. Steps are timed in blocks per side, in several rounds,
so that slow drifts in machine load reach every side alike. Prints JSON lines:
each side's median step time, the ratio of the functional step to the faster
PyTorch step, the simulated fabric cycles per step and the FMAC utilization
of the streamed GEMMs (as the runtime reports them), and last a summary with
the targets (ratio <= 10, utilization >= 0.85).

With ``--backends`` it compares runtime backends instead (no PyTorch side, no
optimizer): ``Runtime.train_step`` on the same batches and weights for each
named backend (e.g. ``functional functional-torch-cpu functional-torch-cuda``;
a CUDA backend is left out where torch finds no CUDA device), for FC-MNIST and
a wide MLP (``--models``: ``fc_mnist`` 784-256-256-10, ``wide``
2048-2048-2048-10), compiled without the static cycle model. Prints per
model and backend the median step time, the ratio to the first backend's and
whether logits and gradients are the first backend's bit for bit.

With ``--gpt`` it times the GPT instead (examples/char_gpt.py on the pydoc
corpus, batch 16 x 32 characters): the appliance's step (the functional model
of the transformer's float order on the run's layout, joined gradients, MemoryX's
Adam step) against PyTorch's (forward, cross-entropy, backward, ``torch.optim.Adam``)
from the same initial weights on the same batches, and prints both step times
and their ratio (target: at most 10). Then the GPT's step on the fabric: the
compiled phases (``wse.host.compiler.gpt_phases.compile_gpt``, docs/transformer.md
section 11) of the same model and batch on the mesh, with the static cycle
model's count of every phase (the kernels' mirrors and the streamed GEMM's
replay, each equal to the golden model's by tests/test_gpt_fabric.py, the
``relayout`` programs of the attention's operands and the ``rows`` programs,
MemoryX's embedding rows streamed in and their gradients out at the mesh
edges, included; only the ``host`` kind has no cycles): one JSON line per phase kind
(cycles per step, device runs, multiply-accumulate elements and FMAC
utilization = those elements per PE and cycle), a line for the linear
layers' token-major input copies (``token-major`` relayout phases), a line
with the step's memory plan (words per PE with ``--sram-words``, default
12288: at batch 16 the plan needs more than the default 8192) and a line with
the whole step's cycles. ``--no-fabric`` leaves the fabric part out.

Usage: python bench/train_speed.py [--mesh 16x16] [--batch 64] [--steps 20] [--rounds 3] [--warmup 3]
       [--backend functional]
       python bench/train_speed.py --backends functional functional-torch-cpu [functional-torch-cuda]
       [--models fc_mnist wide] [--steps 3] [--torch-threads 1]
       python bench/train_speed.py --gpt [--steps 5] [--rounds 3] [--warmup 2] [--no-fabric] [--sram-words 12288]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from wse.config import FabricConfig, UsageError
from wse.host.appliance import ReferenceTrainer, TrainConfig, prepare

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"
GPT_EXAMPLE = EXAMPLE.with_name("char_gpt.py")
TARGET_RATIO = 10.0
TARGET_UTILIZATION = 0.85


#: Models of ``--backends``: layer sizes.
MODELS = {"fc_mnist": (784, 256, 256, 10), "wide": (2048, 2048, 2048, 10)}


def _mlp(sizes):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(sizes) - 2 else [])
    return torch.nn.Sequential(*layers)


def compare_backends(args) -> int:
    """``--backends``: the median ``Runtime.train_step`` time of each backend per model (JSON lines)."""
    import numpy as np

    from wse.config import FabricConfig, parse_mesh
    from wse.host.compiler import compile_model
    from wse.host.runtime import Runtime

    backends = [b for b in args.backends if not b.endswith("-cuda") or torch.cuda.is_available()]
    torch.set_num_threads(args.torch_threads)
    try:
        width, height = parse_mesh(args.mesh)
    except UsageError as exc:
        print(f"train_speed: {exc}", file=sys.stderr)
        return 2
    for model_name in args.models:
        sizes = MODELS[model_name]
        torch.manual_seed(0)
        model = _mlp(sizes)
        exe = compile_model(model, torch.randn(args.batch, sizes[0]), config=FabricConfig(width=width, height=height),
                            batch=args.batch, cycles=False)
        weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
        rng = np.random.default_rng(0)
        data = [(rng.standard_normal((args.batch, sizes[0])).astype(np.float32), rng.integers(0, sizes[-1], args.batch))
                for _ in range(args.steps)]
        first = None
        common = {"bench": "train_speed", "model": model_name, "sizes": list(sizes), "mesh": args.mesh,
                  "batch": args.batch, "steps": args.steps, "torch_threads": args.torch_threads}
        for backend in backends:
            try:
                runtime = Runtime(exe, backend)
            except UsageError as exc:
                print(f"train_speed: {exc}", file=sys.stderr)
                return 2
            runtime.train_step(*data[0], weights)              # warm-up: compiled loops, device start
            times, results = [], []
            for x, y in data:
                start = time.perf_counter()
                results.append(runtime.train_step(x, y, weights))
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            if first is None:
                first = (backend, median, results)
            same = all(np.array_equal(a.logits.view(np.uint32), b.logits.view(np.uint32)) and a.loss == b.loss
                       and all(np.array_equal(a.grads[n].view(np.uint32), b.grads[n].view(np.uint32)) for n in a.grads)
                       for a, b in zip(first[2], results))
            print(json.dumps({**common, "backend": backend, "step_s": round(median, 6),
                              "min_step_s": round(min(times), 6), f"ratio_to_{first[0]}": round(median / first[1], 3),
                              "same_bits": same, "what": "Runtime.train_step (forward, backward, gradients)"}))
    return 0


def compare_gpt(args) -> int:
    """Time the GPT's appliance step against PyTorch's (see the module notes); print JSON lines."""
    import numpy as np
    import torch.nn.functional as F

    from wse.host.appliance.gpt import prepare_gpt
    from wse.host.appliance.gpt_loop import GptSystems
    from wse.host.appliance.job import load_job

    with tempfile.TemporaryDirectory() as scratch:
        config = TrainConfig(str(GPT_EXAMPLE), out=Path(scratch) / "run", mesh=args.mesh)
        run = prepare_gpt(config, load_job(config.example))
    systems, memoryx = GptSystems(run), run.memoryx
    model = run.job.model(run.corpus.vocab_size, run.job.context, run.settings.seed)
    hyper = run.settings.optimizer_config.hyper
    optimizer = torch.optim.Adam(model.parameters(), lr=hyper.get("lr", 1e-3))

    def ours(x, y):
        loss, grads = systems.step(x, y, {name: memoryx.weight(name) for name in memoryx.names()})
        memoryx.apply_gradients(grads)
        return loss

    def theirs(x, y):
        optimizer.zero_grad()
        logits = model(torch.from_numpy(x))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.item()

    batches = [run.batches.next_batch() for _ in range(args.warmup + args.steps * args.rounds)]
    times: dict[str, list[float]] = {"functional": [], "pytorch-1-thread": []}
    losses: dict[str, list[float]] = {"functional": [], "pytorch-1-thread": []}
    torch.set_num_threads(1)
    for x, y in batches[:args.warmup]:
        losses["functional"].append(ours(x, y))
        losses["pytorch-1-thread"].append(theirs(x, y))
    for r in range(args.rounds):
        for side, step in (("functional", ours), ("pytorch-1-thread", theirs)):
            for x, y in batches[args.warmup + r * args.steps:args.warmup + (r + 1) * args.steps]:
                start = time.process_time()
                losses[side].append(step(x, y))
                times[side].append(time.process_time() - start)
    median = {side: statistics.median(values) for side, values in times.items()}
    ratio = median["functional"] / median["pytorch-1-thread"]
    worst = max(abs(a - b) / b for a, b in zip(losses["functional"], losses["pytorch-1-thread"]))
    common = {"bench": "train_speed", "model": run.graph.name, "mesh": run.settings.mesh, "batch": run.settings.batch,
              "context": run.job.context, "dataset": run.settings.dataset, "steps": args.steps * args.rounds}
    for side, what in (("functional", "GPT step: functional model + MemoryX Adam step, 1 thread"),
                       ("pytorch-1-thread", "forward + backward + torch.optim.Adam step, 1 thread")):
        print(json.dumps({**common, "side": side, "cpu_step_s": round(median[side], 6), "what": what}))
    print(json.dumps({**common, "summary": True, "ratio": round(ratio, 2), "target_ratio": TARGET_RATIO,
                      "ratio_ok": ratio <= TARGET_RATIO, "max_rel_loss_diff": float(np.float64(worst)),
                      "what": "CPU seconds per step (process time, robust to other load)"}))
    if not args.no_fabric:
        try:
            gpt_fabric_cycles(run, common, args.sram_words)
        except UsageError as exc:                   # the step does not fit --sram-words: one line
            print(f"train_speed: {exc}", file=sys.stderr)
            return 2
    return 0


def gpt_fabric_cycles(run, common: dict, sram_words: int = 12288) -> None:
    """Print the GPT step's fabric cycles and FMAC utilization per phase kind (static cycle model) and its
    memory plan, on PEs of ``sram_words`` words."""
    from wse.config import parse_mesh
    from wse.host.compiler.gpt_phases import compile_gpt

    width, height = parse_mesh(run.settings.mesh)
    config = FabricConfig.current().replace(width=width, height=height, sram_words=sram_words)
    start = time.process_time()
    schedule = compile_gpt(run.graph, config, run.settings.batch)
    seconds = time.process_time() - start
    copies = [p for p in schedule.phases if p.op == "token-major"]
    print(json.dumps({**common, "fabric_op": "token-major", "cycles_per_step": sum(p.cycles for p in copies),
                      "device_runs": len(copies), "what": "the linear layers' token-major input copies "
                      "(relayout phases of local moves; part of the relayout kind)"}))
    memory = schedule.memory
    print(json.dumps({**common, "memory_plan": True, "sram_words": sram_words, "words_per_pe": memory.words,
                      "peak_phase": memory.peak_phase, "kept_values": len(memory.slots),
                      "peak_live_words": memory.peak_live, "largest_phase_footprint": memory.largest,
                      "what": "the step's memory plan: phases' own buffers and the values kept between them"}))
    total = schedule.cycles()
    for kind, figures in schedule.by_kind().items():
        print(json.dumps({**common, "fabric_kind": kind, "cycles_per_step": figures["cycles"],
                          "share": round(figures["cycles"] / total, 4), "device_runs": figures["runs"],
                          "fmacs": figures["fmacs"], "fmac_utilization": round(figures["fmac_utilization"], 4),
                          "what": "static cycle model of the compiled GPT step's phases of this kind"}))
    fmacs = sum(p.fmacs * p.runs for p in schedule.phases)
    print(json.dumps({**common, "fabric_summary": True, "cycles_per_step": total,
                      "fmac_utilization": round(fmacs / (config.num_pes * total), 4),
                      "phases": len(schedule.phases), "compile_cpu_s": round(seconds, 2),
                      "what": "fabric cycles of one GPT training step (phases one after another)"}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default=str(EXAMPLE), help="job file (default examples/fc_mnist.py)")
    parser.add_argument("--mesh", default="16x16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed steps on each side per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of timed blocks")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps on each side first")
    parser.add_argument("--backend", default="functional")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--backends", nargs="+", default=None, help="compare these runtime backends instead")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                        help="models of --backends (default: all)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads with --backends (default 1)")
    parser.add_argument("--gpt", action="store_true", help="time examples/char_gpt.py's step against PyTorch's")
    parser.add_argument("--no-fabric", action="store_true", help="with --gpt: leave out the fabric cycles")
    parser.add_argument("--sram-words", type=int, default=12288,
                        help="with --gpt: words per PE of the fabric step (default 12288: its memory plan needs "
                             "more than the default 8192 at batch 16)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        print("train_speed: --steps and --rounds must be positive and --warmup non-negative", file=sys.stderr)
        return 2
    if args.backends:
        return compare_backends(args)
    if args.gpt:
        try:
            FabricConfig.current().replace(sram_words=args.sram_words)
        except UsageError as exc:                   # before the PyTorch comparison, not after it
            print(f"train_speed: --sram-words: {exc}", file=sys.stderr)
            return 2
        return compare_gpt(args)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            # prepare() compiles and loads everything but writes nothing; the folder is never created.
            run = prepare(TrainConfig(args.example, out=Path(scratch) / "run", backend=args.backend,
                                      mesh=args.mesh, batch=args.batch, dataset=args.dataset))
        except UsageError as exc:
            print(f"train_speed: {exc}", file=sys.stderr)
            return 2
    names = run.memoryx.names()

    def fabric_step(x, y):
        result = run.runtime.train_step(x, y, {name: run.memoryx.weight(name) for name in names})
        run.memoryx.apply_gradients(result.grads)
        return result

    default_threads = torch.get_num_threads()
    sides = {                      # name -> (step function, torch threads while it runs)
        args.backend: (fabric_step, 1),       # as the appliance runs it (see optimizer_threads)
        "pytorch": (ReferenceTrainer(run.model, run.settings.optimizer_config).train_step, default_threads),
        "pytorch-1-thread": (ReferenceTrainer(run.model, run.settings.optimizer_config).train_step, 1),
    }
    times = {side: [] for side in sides}
    results = []
    batches = [run.batches.next_batch() for _ in range(args.warmup + args.steps * args.rounds)]
    # Blocks of steps per side, in rounds, so that each side keeps its caches and threads warm within a
    # block while slow drifts in machine load reach all sides alike.
    for step, threads in sides.values():
        torch.set_num_threads(threads)
        for x, y in batches[:args.warmup]:
            step(x, y)
    for r in range(args.rounds):
        for side, (step, threads) in sides.items():
            torch.set_num_threads(threads)
            for x, y in batches[args.warmup + r * args.steps:args.warmup + (r + 1) * args.steps]:
                start = time.perf_counter()
                out = step(x, y)
                times[side].append(time.perf_counter() - start)
                if side == args.backend:
                    results.append(out)
    torch.set_num_threads(default_threads)
    median = {side: statistics.median(values) for side, values in times.items()}
    best_torch = min(median["pytorch"], median["pytorch-1-thread"])
    ratio = median[args.backend] / best_torch
    cycles = statistics.mean(r.cycles for r in results)
    utilization = statistics.mean(r.fmac_utilization for r in results)
    common = {"bench": "train_speed", "model": run.executable.graph.name, "mesh": run.settings.mesh,
              "batch": run.settings.batch, "dataset": run.settings.dataset, "steps": args.steps * args.rounds}
    what = {args.backend: "Runtime.train_step + MemoryX optimizer step",
            "pytorch": f"forward + backward + torch.optim step, {default_threads} threads",
            "pytorch-1-thread": "forward + backward + torch.optim step, 1 thread"}
    lines = [{**common, "side": side, "step_s": round(median[side], 6), "min_step_s": round(min(times[side]), 6),
              "what": what[side]} for side in sides]
    lines += [
        {**common, "ratio": round(ratio, 3), "what": f"{args.backend} step time / the faster pytorch step time"},
        {**common, "cycles_per_step": cycles, "fmac_utilization": round(utilization, 4),
         "phases": dict(results[-1].phases), "what": "simulated fabric cycles; FMAC utilization of the streamed GEMMs"},
        {**common, "summary": True, "ratio": round(ratio, 3), "target_ratio": TARGET_RATIO,
         "ratio_ok": ratio <= TARGET_RATIO, "fmac_utilization": round(utilization, 4),
         "target_utilization": TARGET_UTILIZATION, "utilization_ok": utilization >= TARGET_UTILIZATION,
         "cycles_per_step": cycles},
    ]
    for line in lines:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
