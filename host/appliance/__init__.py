"""The appliance: one command (``wse train``) or one call (:func:`train`) trains a model on the fabric.

A user describes the model in a job file (``model(in_features, classes)``
plus optional defaults; see :mod:`wse.host.appliance.job`) and says how to
train it (:class:`TrainConfig`). The appliance compiles the model for weight
streaming, keeps the weights and optimizer in MemoryX, streams every batch
through the runtime, evaluates each epoch, and leaves a run folder with
checkpoints (resumable bit for bit), TensorBoard scalars, a log and
``summary.json``. :mod:`~wse.host.appliance.reference` trains the same run in
plain PyTorch for comparison. With ``systems`` > 1 (or under ``torchrun``)
the run is SwarmX data-parallel over several systems, each its own fabric,
with the single system's results bit for bit
(:mod:`~wse.host.appliance.systems`, ``docs/swarmx.md``).

The modules form layers, each importing only those below it: ``cli``;
``training`` (:func:`train`, :func:`run`); ``systems`` (launching);
``loop`` (the one training loop, over an engine); ``engines`` (one system,
or one of N SwarmX systems, in-process or gloo); ``report``;
``preparation``, ``evaluation``, ``reference``; ``folder``, ``checkpoint``,
``options``, ``job``.

Example::

    from wse.host.appliance import TrainConfig, train
    summary = train(TrainConfig("examples/fc_mnist.py", mesh="16x16", batch=64, epochs=5, out="runs/x"))
    print(summary.test_accuracy, summary.cycles_per_step)
"""

from .evaluation import evaluate
from .folder import SUMMARY_NAME
from .job import DATASETS, Job, load_dataset, load_job
from .options import Settings, TrainConfig, resolve_settings
from .preparation import Prepared, load_run, prepare
from .reference import ReferenceRun, ReferenceTrainer, run_reference
from .report import RunSummary
from .training import run, train

__all__ = [
    "train", "TrainConfig", "RunSummary", "prepare", "run", "Prepared", "Settings", "resolve_settings",
    "evaluate", "load_run", "SUMMARY_NAME",
    "Job", "load_job", "load_dataset", "DATASETS",
    "ReferenceTrainer", "ReferenceRun", "run_reference",
]
