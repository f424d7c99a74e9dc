"""SwarmX scaling: FC-MNIST on N = 1, 2, 4, 8, 16 systems at a fixed per-system batch, and gloo's wall clock.

Part 1, simulated (weak scaling). Every system runs the same compiled
program on its own ``--batch`` samples, so a step of N systems trains on
``N * batch`` samples. The fabric cycles of one system's step come from the
runtime (``StepResult.cycles`` and ``.phases`` of a real training step of the
compiled FC-MNIST on the ``--mesh``); SwarmX's broadcast and reduce cycles
come from the link model (``LinkModel.for_fabric``: one wavelet per cycle per
mesh row, 100 cycles per hop) over the tensors each phase streams
(``phase_traffic``), and the step time in cycles from
``LinkModel.streamed_step``: weights and gradients stream while the fabric
computes, so a phase lasts ``max(fabric cycles, transfer cycles)`` plus the
latency its broadcast exposes, and the step's last reduction adds its
latency (``docs/swarmx.md`` section 7). One JSON line per N:

    systems, per_system_batch, global_batch, fabric_cycles_per_step (per system),
    broadcast_cycles_per_step, reduce_cycles_per_step (the transfers one after another),
    step_cycles (overlapped), exposed_cycles, step_cycles_serial (no overlap),
    samples_per_mcycle, efficiency = throughput(N) / (N * throughput(1)), efficiency_serial

then a line with the target (efficiency >= 0.9 at 16 systems) and whether it is met.

Part 2, measured: the wall clock of ``wse train`` on ``--gloo-batch`` samples
per step, as one process and as two gloo processes under ``torchrun`` (the
same global batch: each process computes half of it), ``--gloo-steps`` steps,
``--rounds`` times each, alternating. Prints each side's median time per
training step (``summary.json``'s ``step_time_s``: the step and the optimizer
update, system 0's view) and whole-run wall time, the speedup, and whether
the two runs ended with identical checkpoints (they must).

Usage: python bench/scaling.py [--mesh 16x16] [--batch 64] [--systems 1,2,4,8,16]
       [--gloo-batch 128] [--gloo-steps 40] [--rounds 2] [--no-gloo]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wse.config import UsageError
from wse.host.appliance import TrainConfig, prepare
from wse.host.appliance import checkpoint as ckpt
from wse.host.memoryx import read_checkpoint
from wse.host.swarmx import LinkModel, phase_traffic

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fc_mnist.py"
TARGET_EFFICIENCY = 0.9
TARGET_SYSTEMS = 16


def simulated(args) -> list[dict]:
    """Part 1: one JSON-ready record per number of systems."""
    with tempfile.TemporaryDirectory() as scratch:
        # prepare() compiles and loads everything but writes nothing.
        run = prepare(TrainConfig(args.example, out=Path(scratch) / "run", mesh=args.mesh, batch=args.batch))
    x, y = run.batches.next_batch()
    step = run.runtime.train_step(x, y, {name: run.memoryx.weight(name) for name in run.memoryx.names()})
    if sum(step.phases.values()) != step.cycles:
        raise RuntimeError("the runtime's phase cycles do not add up to its step cycles")
    traffic = [dataclasses.replace(phase, cycles=int(step.phases[phase.name]))
               for phase in phase_traffic(run.executable)]
    links = LinkModel.for_fabric(run.executable.config)
    base = links.streamed_step(traffic, 1)
    base_serial = base.serial
    records = []
    for systems in args.systems:
        cycles = links.streamed_step(traffic, systems)
        records.append({
            "systems": systems, "per_system_batch": args.batch, "global_batch": systems * args.batch,
            "mesh": args.mesh, "fabric_cycles_per_step": cycles.compute,
            "broadcast_cycles_per_step": cycles.broadcast, "reduce_cycles_per_step": cycles.reduce,
            "step_cycles": cycles.overlapped, "exposed_cycles": cycles.exposed,
            "step_cycles_serial": cycles.serial,
            "samples_per_mcycle": round(1e6 * systems * args.batch / cycles.overlapped, 3),
            "efficiency": round(base.overlapped / cycles.overlapped, 4),
            "efficiency_serial": round(base_serial / cycles.serial, 4),
            "link": {"wavelets_per_cycle": links.wavelets_per_cycle, "hop_latency": links.hop_latency,
                     "fanout": links.fanout},
        })
    return records


def _train(command: list[str], out: Path) -> dict:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    summary = json.loads((out / "summary.json").read_text())
    _, tensors = read_checkpoint(ckpt.latest_checkpoint(out) / "memoryx")
    return {"step_s": summary["step_time_s"], "wall_s": wall,
            "state": {name: value.tobytes() for name, value in tensors.items()}}


def measured(args) -> dict:
    """Part 2: one process against two gloo processes on the same global batch."""
    common = [str(args.example), "--mesh", args.mesh, "--batch", str(args.gloo_batch), "--max-steps",
              str(args.gloo_steps), "--progress", "none", "--no-tensorboard", "--no-train-eval"]
    one_process = [sys.executable, "-m", "wse.cli", "train", *common, "--systems", "1"]
    two_gloo = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "wse.cli", "train", *common]
    sides = {"1 process": one_process, "2 gloo processes": two_gloo}
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):             # alternate, so that drifts in load reach both sides
            for side, command in sides.items():
                out = Path(scratch) / f"{side.replace(' ', '-')}-{round_}"
                runs[side].append(_train([*command, "--out", str(out)], out))
    states = [run["state"] for side in runs.values() for run in side]
    one, two = (statistics.median(run["step_s"] for run in runs[side]) for side in sides)
    wall_one, wall_two = (statistics.median(run["wall_s"] for run in runs[side]) for side in sides)
    return {"gloo_systems": 2, "global_batch": args.gloo_batch, "mesh": args.mesh, "steps": args.gloo_steps,
            "rounds": args.rounds, "step_ms_1_process": round(1000 * one, 2),
            "step_ms_2_gloo": round(1000 * two, 2), "step_speedup": round(one / two, 3),
            "wall_s_1_process": round(wall_one, 2), "wall_s_2_gloo": round(wall_two, 2),
            "wall_speedup": round(wall_one / wall_two, 3),
            "identical_checkpoints": all(state == states[0] for state in states)}


def _systems(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, not {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default=str(EXAMPLE), help="job file (default examples/fc_mnist.py)")
    parser.add_argument("--mesh", default="16x16")
    parser.add_argument("--batch", type=int, default=64, help="samples per system per step (part 1)")
    parser.add_argument("--systems", type=_systems, default=[1, 2, 4, 8, 16], help="e.g. 1,2,4,8,16")
    parser.add_argument("--gloo-batch", type=int, default=128, help="global batch of part 2 (default 128)")
    parser.add_argument("--gloo-steps", type=int, default=40, help="steps per run of part 2")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side in part 2")
    parser.add_argument("--no-gloo", dest="gloo", action="store_false", help="skip part 2")
    args = parser.parse_args(argv)
    if args.gloo_steps < 1 or args.rounds < 1:
        print("scaling: --gloo-steps and --rounds must be positive", file=sys.stderr)
        return 2
    try:
        records = simulated(args)
    except UsageError as exc:
        print(f"scaling: {exc}", file=sys.stderr)
        return 2
    for record in records:
        print(json.dumps(record), flush=True)
    at_target = next((r for r in records if r["systems"] == TARGET_SYSTEMS), None)
    print(json.dumps({"target": f"efficiency >= {TARGET_EFFICIENCY} at {TARGET_SYSTEMS} systems",
                      "efficiency": at_target["efficiency"] if at_target else None,
                      "met": bool(at_target and at_target["efficiency"] >= TARGET_EFFICIENCY)}), flush=True)
    if args.gloo:
        print(json.dumps(measured(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
