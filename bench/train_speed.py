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

Usage: python bench/train_speed.py [--mesh 16x16] [--batch 64] [--steps 20] [--rounds 3] [--warmup 3]
       [--backend functional]
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

from wse.config import UsageError
from wse.host.appliance import ReferenceTrainer, TrainConfig, prepare

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"
TARGET_RATIO = 10.0
TARGET_UTILIZATION = 0.85


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
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        print("train_speed: --steps and --rounds must be positive and --warmup non-negative", file=sys.stderr)
        return 2
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
