"""``wse trace``: record one phase of a training step on the golden fabric model.

A whole training step of FC-MNIST on a 16x16 mesh takes minutes on the
golden model; one of its phases takes well under one. ``wse trace`` prepares
the job exactly as ``wse train`` does (same options, same initial weights,
same first batch), runs the phases of step 1 on the golden model up to the
chosen one, records that phase (:mod:`wse.sim.golden.events`) and writes its
three heatmaps and, with ``--trace``, its Perfetto timeline::

    wse trace examples/fc_mnist.py --phase "fwd fc1" --mode weight-streaming --out pictures/

writes ``pictures/fwd_fc1_fmac.png``, ``_stalls.png`` and ``_links.png``
(``docs/pictures.md`` says how to read them). Nothing else is written, and
no weight changes. Progress lines come every 10 seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from wse.config import UsageError

from .cli import _Parser
from .options import TrainConfig
from .pictures import file_prefix
from .preparation import prepare

__all__ = ["main", "build_parser", "record_phase", "step_phases"]


def build_parser() -> argparse.ArgumentParser:
    """The ``wse trace`` argument parser."""
    parser = _Parser(prog="wse trace", description="Record one phase of training step 1 on the golden fabric "
                     "model: its heatmaps (PNG) and, with --trace, its Perfetto timeline.")
    parser.add_argument("example", metavar="FILE.py", help="the job file (as for wse train)")
    parser.add_argument("--phase", required=True, help='the phase to record, e.g. "fwd fc1" (an unknown name '
                                                       "lists the step's phases)")
    parser.add_argument("--out", metavar="DIR", required=True, help="folder of the pictures")
    parser.add_argument("--prefix", default="", help="file name prefix of the pictures (default none)")
    parser.add_argument("--trace", metavar="FILE", help="also write the phase's Perfetto timeline (JSON)")
    parser.add_argument("--mesh", metavar="WxH", help="fabric mesh (default 16x16)")
    parser.add_argument("--mode", choices=["weight-streaming"], default="weight-streaming",
                        help="execution mode: the phases of the weight-streaming mode (the default, and the only one "
                             "whose phases run one by one)")
    parser.add_argument("--batch", type=int, metavar="N", help="mini-batch size (default: the job file's)")
    parser.add_argument("--dataset", help="data set (default: the job file's)")
    parser.add_argument("--mnist-dir", metavar="DIR", help="folder of MNIST IDX files")
    parser.add_argument("--seed", type=int, metavar="N", help="initial weights and data order (default 0)")
    return parser


def _check_out(path: Path, what: str) -> None:
    folder = path if what == "--out" else path.parent
    existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"{what} {str(path)!r}: {str(existing)!r} is not a folder")
    if what == "--trace" and path.is_dir():
        raise UsageError(f"--trace {str(path)!r} must be a file name, not a folder")


def step_phases(prepared, phase: str) -> list[str]:
    """The phases of a training step of ``prepared``; raises :class:`UsageError` unless ``phase``
    is one of them and the run's backend runs phases one by one (the weight-streaming mode)."""
    exe = prepared.executable
    if exe.layout.resident or not hasattr(prepared.runtime.backend, "run_phase"):
        raise UsageError(f"wse trace records the phases of the weight-streaming mode; this run compiled to the "
                         f"{exe.mode} mode: pass --mode weight-streaming")
    sequence = list(exe.sequences["train"])
    if phase not in sequence:
        raise UsageError(f"--phase {phase!r} is not a phase of the training step; its phases are "
                         + ", ".join(repr(name) for name in sequence))
    return sequence


def record_phase(prepared, phase: str, out: Path, prefix: str = "", trace: Path | None = None,
                 stream=None) -> dict:
    """Run step 1 of ``prepared`` (a golden-backend run) up to ``phase``, record that phase
    and draw it; returns ``{"cycles": ..., "fmac_utilization": ..., "pictures": {...}, "trace": ...}``.

    The phases before ``phase`` run unrecorded (they set the fabric's state);
    every phase prints a progress line every 10 seconds to ``stream``.
    """
    from wse.sim.golden.heatmap import mesh_pictures
    from wse.sim.golden.perfetto import write_trace
    from wse.sim.golden.progress import reporting

    runtime, exe = prepared.runtime, prepared.executable
    backend = runtime.backend
    sequence = step_phases(prepared, phase)
    x, y = prepared.batches.next_batch()
    weights = runtime.begin_phases(x, y, {name: prepared.memoryx.weight(name) for name in exe.parameters()})
    device = backend.device
    pools: dict = {}
    recorder = None
    for name in sequence[:sequence.index(phase) + 1]:
        if name == phase:
            recorder = device.record()
            recorder.label = name
        with reporting(device, f"golden model, step 1, phase {name}", exe.phases[name].cycles, stream=stream):
            backend.run_phase(name, weights, pools)
    device.stop_recording()
    pictures = mesh_pictures(recorder, out, phase, prefix=prefix + file_prefix(phase),
                             title=f"step 1, phase {phase}")
    totals = recorder.totals(phase)
    result = {"cycles": totals["cycles"], "fmac_utilization": float(totals["fmac"].mean() / max(totals["cycles"], 1)),
              "pictures": {k: str(v) for k, v in pictures.items()}, "trace": None}
    if trace is not None:
        result["events"] = write_trace(recorder, trace, f"{prepared.job.path.stem}, step 1, phase {phase}")
        result["trace"] = str(trace)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run ``wse trace`` with ``argv`` (default ``sys.argv[2:]``); return the exit code (2: a usage error)."""
    argv = list(sys.argv[2:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:              # --help
        return int(exc.code or 0)
    except UsageError as exc:
        print(f"wse trace: {exc}", file=sys.stderr)
        return 2
    try:
        out, trace = Path(args.out), Path(args.trace) if args.trace else None
        _check_out(out, "--out")
        if trace is not None:
            _check_out(trace, "--trace")
        config = TrainConfig(example=args.example, backend="golden", mode=args.mode, mesh=args.mesh,
                             batch=args.batch, dataset=args.dataset, mnist_dir=args.mnist_dir, seed=args.seed,
                             max_steps=1, progress="none", tensorboard=False, eval_train=False)
        tick = time.monotonic()
        prepared = prepare(config)
        s = prepared.settings
        step_phases(prepared, args.phase)
        print(f"recording phase {args.phase!r} of step 1 of {prepared.job.path.name} on the golden model "
              f"({s.mesh} mesh, batch {s.batch}, {prepared.executable.mode} mode)", flush=True)
        result = record_phase(prepared, args.phase, out, args.prefix, trace)
    except UsageError as exc:
        print(f"wse trace: {exc}", file=sys.stderr)
        return 2
    print(f"  phase {args.phase}: {result['cycles']:,} cycles, FMAC utilization {result['fmac_utilization']:.3f} "
          f"({time.monotonic() - tick:.0f} s)")
    print(f"  heatmaps : {', '.join(result['pictures'].values())}")
    if result["trace"]:
        print(f"  timeline : {result['trace']} ({result['events']:,} events; open in ui.perfetto.dev)")
    return 0
