"""``wse train``: train a model described by a job file on the fabric.

Usage::

    wse train examples/fc_mnist.py --backend functional --mesh 16x16 --batch 64 --epochs 5 --out runs/x
    wse train examples/fc_mnist.py --systems 4 ...                          # four systems in this process
    torchrun --standalone --nproc-per-node 2 -m wse.cli train examples/fc_mnist.py --out runs/x ...

Every mistake (bad option, bad job file, unsupported model, model that does
not fit, a run folder that holds another run or that another run is writing)
is reported as one message on stderr with exit code 2, before anything is
written; so is a SwarmX peer that is missing or stopped, and so is a file
system that fails the run (full, read-only, not writable): the message names
the path and what it needs, and every checkpoint already written stays
loadable. Under ``torchrun`` only system 0 prints results, and errors that
every system meets alike.
"""

from __future__ import annotations

import argparse
import sys

from wse.atomic import file_error
from wse.config import UsageError

from .job import DATASETS
from .options import DEFAULT_BACKEND, DEFAULT_MESH, PROGRESS_MODES, TrainConfig
from .training import train

__all__ = ["main", "build_parser"]

_EPILOG = """\
The job file defines model(in_features, classes) -> torch.nn.Module and, optionally,
DATASET ("mnist" or "digits"), OPTIMIZER (e.g. {"name": "sgd", "lr": 0.05, "momentum": 0.9}),
BATCH and EPOCHS as defaults for the options above. See examples/fc_mnist.py.
A job with DATASET = "pydoc" (text) is a language model: model(vocab, context) over token ids
and CONTEXT, trained on the functional backend; see examples/char_gpt.py and wse generate.

The run folder receives summary.json, train.log, fabric.txt (layout and schedule), executable.npz
(the compiled model, MLP runs), tensorboard/ and checkpoints/; run.lock keeps a second run out while one writes it.
After a crash, continue with --resume (from the latest complete checkpoint).

Several systems (SwarmX, docs/swarmx.md): --systems N runs N systems in this process; under
torchrun (torchrun --nproc-per-node N -m wse.cli train ...) every process is one system (gloo).
The batch is the global batch; N systems give the weights of one system bit for bit. Under
torchrun --max-restarts, restarted systems continue from the run's latest checkpoint.
"""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError` (one line, exit 2) rather than usage dumps."""

    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The ``wse train`` argument parser."""
    parser = _Parser(prog="wse train", description="Train a PyTorch model on the fabric (layer-pipelined or weight streaming).",
                     epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("example", metavar="FILE.py", help="the job file (defines model())")
    run = parser.add_argument_group("run")
    run.add_argument("--out", metavar="DIR", help="run folder (default: runs/<job name>, or runs/<job name>-N "
                                                  "if that one is taken)")
    run.add_argument("--backend", help="runtime backend: functional, functional-torch (the same bits on torch: CUDA "
                                       "where present, else the CPU; functional-torch-cpu, functional-torch-cuda "
                                       "pick one), golden (the golden fabric model), vector (the "
                                       "vectorized fabric model, the golden model's bits and cycles), verilator or "
                                       f"icarus (the RTL; slow, for cross-checks) (default {DEFAULT_BACKEND})")
    run.add_argument("--mesh", metavar="WxH", help=f"fabric mesh (default {DEFAULT_MESH})")
    run.add_argument("--defects", metavar="SPEC", help="dead PEs and links of the mesh: random:FRACTION,SEED, "
                     "X,Y[,PORT][;...] or a file of such lines; the run trains on the usable mesh around them")
    run.add_argument("--mode", metavar="MODE", help="execution mode: auto (default: pipelined when the model, "
                     "its optimizer state and the in-flight samples fit PE memory), pipelined, weight-streaming")
    run.add_argument("--systems", type=int, metavar="N",
                     help="systems sharing each batch (default 1; under torchrun: its process count)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    run.add_argument("--overwrite", action="store_true", help="replace the run that --out holds")
    data = parser.add_argument_group("data and schedule")
    data.add_argument("--dataset", choices=list(DATASETS), help="data set (default: the job file's, else mnist)")
    data.add_argument("--mnist-dir", metavar="DIR", help="folder of MNIST IDX files (default: the bundled subset)")
    data.add_argument("--batch", type=int, metavar="N", help="mini-batch size (default: job file's, else 64)")
    data.add_argument("--epochs", type=int, metavar="N", help="passes over the training split "
                                                             "(default: job file's, else 1)")
    data.add_argument("--max-steps", type=int, metavar="N", help="stop after N optimizer steps in all")
    data.add_argument("--seed", type=int, metavar="N", help="initial weights and data order (default 0)")
    optim = parser.add_argument_group("optimizer (MemoryX)")
    optim.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], help="default: the job file's, else sgd")
    optim.add_argument("--lr", type=float, help="learning rate")
    optim.add_argument("--momentum", type=float, help="SGD momentum")
    optim.add_argument("--weight-decay", type=float, help="weight decay (PyTorch meaning per optimizer)")
    optim.add_argument("--sparsity", type=float, metavar="S",
                       help="static unstructured weight sparsity in [0, 1) of every Linear layer (weight "
                            "streaming; only the non-zeros stream; default: the job file's SPARSITY, else dense)")
    optim.add_argument("--memoryx-budget", metavar="SIZE",
                       help="RAM for weights and optimizer state per system, e.g. 64K, 10MiB, 2GB; "
                            "the rest lives memory-mapped on disk (default: no limit)")
    run.add_argument("--swarmx-timeout", type=float, metavar="SECONDS",
                     help="how long a system waits for a peer before stopping with an error naming it "
                          "(default 120 s to join, 600 s per transfer)")
    out = parser.add_argument_group("output")
    out.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                     help="also checkpoint every N steps (default: at each epoch's end and the run's end)")
    out.add_argument("--keep-checkpoints", type=int, default=2, metavar="N", help="checkpoints kept (default 2)")
    out.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                     help="progress bar, log lines, or nothing (default: a bar on a terminal, else lines)")
    out.add_argument("--log-every", type=int, metavar="N", help="steps between log lines (default: 10 per epoch)")
    out.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                     help="do not write TensorBoard event files")
    out.add_argument("--no-train-eval", dest="eval_train", action="store_false",
                     help="skip evaluating the final weights on the whole training split")
    out.add_argument("--trace", metavar="FILE", help="write the Perfetto timeline of step 1 to FILE "
                                                     "(--backend golden; default RUN/pictures/step1_trace.json)")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` that parsed ``wse train`` arguments describe."""
    return TrainConfig(
        example=args.example, out=args.out, backend=args.backend, mode=args.mode, mesh=args.mesh, batch=args.batch,
        epochs=args.epochs, max_steps=args.max_steps, optimizer=args.optimizer, lr=args.lr,
        momentum=args.momentum, weight_decay=args.weight_decay, seed=args.seed, dataset=args.dataset,
        mnist_dir=args.mnist_dir, resume=args.resume, overwrite=args.overwrite, systems=args.systems,
        memoryx_budget=args.memoryx_budget, swarmx_timeout=args.swarmx_timeout,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
        progress=args.progress, log_every=args.log_every, tensorboard=args.tensorboard, eval_train=args.eval_train,
        trace=args.trace, sparsity=args.sparsity, defects=args.defects)


def main(argv: list[str] | None = None) -> int:
    """Run ``wse train`` with ``argv`` (default ``sys.argv[2:]``); return the exit code.

    Prints the run's results at the end. A :class:`UsageError` is printed as
    ``wse train: <message>`` on stderr and gives exit code 2 (under
    ``torchrun``, an error that system 0 reports too is printed by system 0
    only).
    """
    argv = list(sys.argv[2:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:              # --help
        return int(exc.code or 0)
    except UsageError as exc:
        print(f"wse train: {exc}", file=sys.stderr)
        return 2
    try:
        summary = train(config_from_args(args))
    except UsageError as exc:
        if not getattr(exc, "echo", False):
            print(f"wse train: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:             # a file system failing a path of the run (the log, TensorBoard, ...)
        if exc.filename is None:
            raise
        print(f"wse train: {file_error(exc, 'write', exc.filename)}", file=sys.stderr)
        return 2
    if summary is not None:             # None: a system other than 0 under torchrun
        print(summary.describe())
        if args.defects is not None:
            from .defects import defects_text
            from .options import Settings
            print("  " + defects_text(Settings.from_dict(summary.data["settings"])).replace("\n", "\n  "))
    return 0
