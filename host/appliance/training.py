"""The appliance's entry points: a job file in; checkpoints, TensorBoard scalars and a summary out.

:func:`train` does everything ``wse train`` does. A run has two stages:

1. :func:`~wse.host.appliance.preparation.prepare` reads and checks
   everything (options, job file, data, compilation onto the fabric, the
   checkpoint to resume) and writes nothing; any problem raises
   :class:`~wse.config.UsageError` before the run folder is touched.
2. The training loop (:func:`~wse.host.appliance.loop.train_loop`) streams
   each mini-batch through the fabric (``Runtime.train_step`` with the
   weights MemoryX holds), hands the gradients to MemoryX for the optimizer
   step, evaluates on the test split after each epoch (``Runtime.forward``)
   and checkpoints. With ``systems`` > 1 the loop runs on every system and
   each step is a SwarmX data-parallel step (:mod:`~wse.host.appliance.systems`,
   :mod:`~wse.host.appliance.engines`); system 0 evaluates and writes.

The appliance's modules, from the top: ``cli``; ``training`` (this module);
``systems`` (launching one system or N, in-process or under ``torchrun``);
``loop`` (the one training loop); ``engines`` (one system's steps); ``report``
(progress, scalars, the summary); ``preparation``, ``evaluation`` and
``reference``; ``sparsity`` (the masks and the executable of a ``--sparsity``
run); at the bottom ``folder``, ``checkpoint``, ``options`` and
``job``. Each imports only modules below it.
"""

from __future__ import annotations

from wse.config import UsageError

from .evaluation import evaluate
from .folder import EXECUTABLE_NAME, SUMMARY_NAME
from .gpt import prepare_gpt
from .gpt_loop import GptSummary, check_gpt_launch, gpt_loop
from .job import TEXT_DATASETS, load_job
from .loop import optimizer_threads
from .options import TrainConfig
from .preparation import Prepared, load_run, prepare
from .report import RunSummary
from .systems import detect_launch, run_systems, train_gloo

# Prepared, prepare, evaluate, load_run, optimizer_threads and the file names live below; re-exported here.
__all__ = ["RunSummary", "GptSummary", "Prepared", "prepare", "run", "train", "train_gpt", "evaluate", "load_run",
           "optimizer_threads", "SUMMARY_NAME", "EXECUTABLE_NAME"]


def train(config: TrainConfig, *, stream=None) -> RunSummary | GptSummary | None:
    """Train the job of ``config`` on the fabric; see the module notes.

    Under ``torchrun`` this process is one system of the run (gloo);
    otherwise ``config.systems`` systems run in this process.

    Parameters
    ----------
    config : TrainConfig
    stream : file, optional
        Where progress goes (default: a bar on stderr on a terminal, lines on stdout).

    A job on a text data set (a language model such as ``examples/char_gpt.py``)
    is a GPT run (:func:`train_gpt`).

    Returns
    -------
    RunSummary, GptSummary or None
        The summary; None in the processes of systems other than 0 under ``torchrun``.

    Raises
    ------
    UsageError
        As :func:`prepare` (then nothing is written), for a non-finite
        gradient during training (the last checkpoint stays valid), or a
        SwarmX peer that is missing or stopped (:class:`~wse.host.swarmx.PeerError`).
    """
    if not isinstance(config, TrainConfig):
        raise UsageError(f"config must be a TrainConfig, not {type(config).__name__}")
    config.check()
    launch = detect_launch(config)
    if _is_text_job(config):
        check_gpt_launch(launch.transport)
        return train_gpt(config, stream=stream)
    if launch.transport == "gloo":
        return train_gloo(config, launch, stream)
    return run(prepare(config), stream=stream)


def _is_text_job(config: TrainConfig) -> bool:
    """Whether ``config`` trains a language model (its job's ``DATASET`` or ``--dataset`` is text).
    A job file that does not load is not one: the usual preparation reports it."""
    try:
        job = load_job(config.example)
    except UsageError:
        return False
    return job.is_text or config.dataset in TEXT_DATASETS


def train_gpt(config: TrainConfig, *, stream=None) -> GptSummary:
    """Train a GPT job (a text data set) on the functional model: prepare (writing nothing),
    start the run folder, train (:func:`~wse.host.appliance.gpt_loop.gpt_loop`), release the folder."""
    config.check()
    run = prepare_gpt(config, load_job(config.example))
    run.start_folder()
    try:
        with optimizer_threads(1):
            return gpt_loop(run, stream=stream)
    finally:
        run.release_folder()


def run(prepared: Prepared, *, stream=None) -> RunSummary:
    """Run a :class:`Prepared` run to its end (or ``max_steps``) and write its summary.

    ``prepared.settings.systems`` systems run in this process (as threads
    when more than one); ``prepared`` is used up.
    """
    with optimizer_threads(1):
        return run_systems(prepared, stream)
