"""Data-parallel training of the reference system, on any transport: ``python -m wse.host.swarmx``.

One code path for every transport: under ``torchrun`` each process is one
system (gloo); otherwise ``--systems N`` runs N in-process systems. The run
trains :class:`~wse.host.swarmx.ReferenceSystem` on a seeded synthetic data
set with a sharded MemoryX, optionally with a disk tier
(``--memoryx-budget``), then writes to ``--out``:

- ``memoryx/``: the gathered MemoryX checkpoint (any number of systems can resume from it);
- ``batches.json``: the data position, for ``--resume``;
- ``steps.json``: loss, correct count and cycles of every step of this run.

Everything needed to continue is in those files: ``--resume`` continues
from them, on the same or another number of systems, exactly as if the run
had not stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from wse.config import UsageError
from wse.host.data import Batches
from wse.host.memoryx import ShardedMemoryX, TieredStore

from .data_parallel import DataParallel
from .group import REDUCE_ORDERS, init_gloo, run_inprocess
from .reference import ReferenceSystem
from .transport import DEFAULT_TIMEOUT

__all__ = ["train_reference", "reference_data", "main"]


def reference_data(sizes, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded, learnable data set: Gaussian inputs labelled by a random linear map's argmax."""
    rng = np.random.default_rng([seed, 1])
    x = rng.standard_normal((samples, sizes[0])).astype(np.float32)
    y = np.argmax(x @ rng.standard_normal((sizes[0], sizes[-1])), axis=1).astype(np.int64)
    return x, y


def train_reference(group, out: str | os.PathLike, *, steps: int = 3, optimizer: str = "adam",
                    sizes=(8, 6, 4), batch: int = 12, columns: int = 4, samples: int = 30, seed: int = 0,
                    budget: int | str | None = None, resume: bool = False, **hyper) -> list[dict]:
    """Train the reference system for ``steps`` global batches on ``group``; write ``out`` (module docstring).

    Returns this run's steps, the same list on every system.
    """
    out = Path(out)
    system = ReferenceSystem(sizes, batch, columns)
    x, y = reference_data(sizes, samples, seed)
    store = TieredStore(budget) if budget is not None else None
    try:
        if resume:
            memoryx = ShardedMemoryX.load(group, out / "memoryx", store=store)
            state = json.loads((out / "batches.json").read_text())
            batches = Batches.from_state(x, y, state)
        else:
            memoryx = ShardedMemoryX.from_state_dict(group, system.init_weights(seed), optimizer, store=store,
                                                     **hyper)
            batches = Batches(x, y, batch, seed=seed)
        trainer = DataParallel(group, system, memoryx, system.blocks)
        log = []
        for _ in range(steps):
            xb, yb = batches.next_batch()
            result = trainer.step(xb, yb)
            log.append({"loss": result.loss, "correct": result.correct, "samples": len(xb),
                        "cycles": result.cycles, "compute_cycles": result.compute_cycles,
                        "swarmx_cycles": result.swarmx_cycles})
        memoryx.save(out / "memoryx")
        if group.rank == 0:
            (out / "batches.json").write_text(json.dumps(batches.state()))
            (out / "steps.json").write_text(json.dumps(log, indent=1))
        group.barrier()
        return log
    finally:
        if store is not None:
            store.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wse.host.swarmx", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the checkpoint and the step log")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--systems", type=int, default=1, help="in-process systems (ignored under torchrun)")
    parser.add_argument("--transport", choices=("auto", "inprocess", "gloo"), default="auto",
                        help="auto: gloo under torchrun, otherwise in-process")
    parser.add_argument("--reduce-order", choices=REDUCE_ORDERS, default="chain")
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--memoryx-budget", default=None, help="RAM for each MemoryX shard, e.g. 2KiB")
    parser.add_argument("--sizes", default="8,6,4", help="features of the input, hidden layers and classes")
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--columns", type=int, default=4)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for a peer")
    parser.add_argument("--resume", action="store_true", help="continue from the files in --out")
    return parser


def main(argv=None) -> int:
    """Command-line entry; returns the exit status (2 for a usage or peer error, printed as one line)."""
    args = _parser().parse_args(argv)
    try:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    except ValueError:
        print(f"error: --sizes must be comma-separated integers, not {args.sizes!r}", file=sys.stderr)
        return 2
    kwargs = dict(steps=args.steps, optimizer=args.optimizer, lr=args.lr, sizes=sizes, batch=args.batch,
                  columns=args.columns, samples=args.samples, seed=args.seed, budget=args.memoryx_budget,
                  resume=args.resume)
    gloo = args.transport == "gloo" or (args.transport == "auto" and "RANK" in os.environ)
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        if gloo:
            group = init_gloo(timeout=args.timeout, reduce_order=args.reduce_order)
            try:
                log = train_reference(group, args.out, **kwargs)
            finally:
                group.close()
            rank = group.rank
        else:
            log = run_inprocess(train_reference, args.systems, args.out, timeout=args.timeout,
                                reduce_order=args.reduce_order, **kwargs)[0]
            rank = 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if rank == 0:
        for i, step in enumerate(log):
            print(f"step {i}: loss {step['loss']:.6f}, correct {step['correct']}/{step['samples']}, "
                  f"cycles {step['cycles']}")
    return 0
