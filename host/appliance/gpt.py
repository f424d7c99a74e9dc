"""A GPT run's first stage: read and check everything, write nothing (:func:`prepare_gpt`).

A job whose ``DATASET`` is a text corpus (:data:`~wse.host.appliance.job.TEXT_DATASETS`,
e.g. ``examples/char_gpt.py``) is a language model. The appliance builds it
with ``model(vocab, CONTEXT)`` (``torch`` seeded with the run's seed),
captures it with the transformer front end
(:func:`~wse.host.compiler.transformer_capture.capture`), and trains the
captured graph with the functional model of its float order
(:class:`~wse.host.runtime.transformer_reference.TransformerReference`,
``docs/transformer.md`` sections 3 and 7) while MemoryX keeps the weights
and the optimizer state, as for the MLP. On a device (``--backend golden``,
``vector``, ``verilator``, ``icarus``) each training step runs instead as the
compiled fabric phases (:func:`gpt_fabric`, ``docs/transformer.md`` section 11),
which give the functional model's bits on the same layout; the evaluations
stay on the functional model (the same bits, far faster).

The layout fixes the float order of the sums that depend on placement
(:class:`GptLayout`): feature ``k`` on mesh row ``k mod H`` (the streamed
GEMM's partial sums and LayerNorm's feature sums over ``H`` rows) and the
batch's sequences dealt over the mesh's columns in contiguous runs (the
weight gradients' token blocks, one partial sum per column, chained along
the row). ``--systems N`` deals the columns to the systems
(:func:`~wse.host.swarmx.column_shards`), so N systems chain the same
partial sums in the same order and give one system's bits.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from wse.config import UsageError
from wse.host.data import Batches, load_text_corpus
from wse.host.memoryx import MemoryX

from .folder import RunLock, choose_run_folder, start_run_folder
from .job import TEXT_DATASETS, Job
from .options import Settings, TrainConfig, resolve_settings
from .preparation import RunSteps, resume_point

__all__ = ["GptLayout", "GptPlan", "GptRun", "prepare_gpt", "gpt_model", "PROBE_SEQUENCES", "GPT_BACKENDS",
           "FABRIC_BACKENDS", "gpt_fabric"]

#: Validation sequences (a fixed random choice) scored at every report between epochs.
PROBE_SEQUENCES = 128
#: Devices that run a GPT's training step as fabric phases (``docs/transformer.md`` section 11).
FABRIC_BACKENDS = ("golden", "vector", "verilator", "icarus")
#: Backends a GPT trains on: the functional model, or a device running the fabric phases.
GPT_BACKENDS = ("functional",) + FABRIC_BACKENDS


@dataclasses.dataclass(frozen=True)
class GptLayout:
    """Where a batch of a GPT run lives, as far as it fixes the order of float operations.

    Members
    -------
    rows : int
        ``H``: feature ``k`` on row ``k mod H`` (GEMM partial sums, LayerNorm feature sums).
    columns : list of int
        Sequences of the batch held by each column, in column order (contiguous runs).
    context : int
        Positions per sequence.
    """

    rows: int
    columns: list[int]
    context: int

    @classmethod
    def of(cls, settings: Settings, context: int) -> "GptLayout":
        """The layout of a run's batch on its mesh: ``min(W, batch)`` columns, the first
        ``batch mod columns`` with one sequence more."""
        width, height = settings.mesh_shape
        count = min(width, settings.batch)
        base, extra = divmod(settings.batch, count)
        return cls(height, [base + (1 if c < extra else 0) for c in range(count)], context)

    def blocks(self, columns: range | None = None) -> list[int]:
        """Token blocks (tokens per column) of ``columns`` (default all)."""
        chosen = range(len(self.columns)) if columns is None else columns
        return [self.columns[c] * self.context for c in chosen]

    def sequences(self, columns: range) -> slice:
        """The batch's sequences that ``columns`` (contiguous) hold."""
        start = sum(self.columns[:columns.start])
        return slice(start, start + sum(self.columns[c] for c in columns))

    def describe(self) -> str:
        """One line for people."""
        return (f"layout: feature k on mesh row k mod {self.rows}; {len(self.columns)} columns of "
                f"{'/'.join(str(c) for c in sorted(set(self.columns), reverse=True))} sequence(s) x "
                f"{self.context} tokens (one weight-gradient partial sum per column, chained along the row)")


@dataclasses.dataclass(frozen=True)
class GptPlan:
    """What ``fabric.txt`` of a GPT run says: the captured graph, the layout and, on a device,
    the fabric step's phases (:class:`~wse.host.compiler.gpt_phases.GptSchedule`)."""

    graph: Any
    layout: GptLayout
    schedule: Any = None

    def summary(self) -> str:
        """The run's plan as text."""
        if self.schedule is None:
            mode = ("mode: weight streaming, functional model of the transformer's float order "
                    "(docs/transformer.md sections 3, 7, 10)")
        else:
            kinds = ", ".join(f"{kind} {figures['cycles']:,}" for kind, figures in self.schedule.by_kind().items()
                              if figures["cycles"])
            mode = (f"mode: weight streaming, the training step as {len(self.schedule.phases)} fabric phases "
                    f"(docs/transformer.md section 11): {self.schedule.cycles():,} cycles per step by the static "
                    f"cycle model ({kinds})")
        return "\n".join([mode, self.layout.describe(), self.graph.summary()])


@dataclasses.dataclass
class GptRun(RunSteps):
    """A checked GPT run, ready to start; nothing has been written yet (see :func:`prepare_gpt`)."""

    config: TrainConfig
    settings: Settings
    job: Job
    out: Path
    replace_out: bool
    corpus: Any
    train_data: tuple[np.ndarray, np.ndarray]
    validation: tuple[np.ndarray, np.ndarray]
    probe: tuple[np.ndarray, np.ndarray]
    graph: Any
    layout: GptLayout
    reference: Any
    memoryx: MemoryX
    batches: Batches
    trainer: dict | None
    resumed: Path | None = None
    lock: RunLock | None = None
    fabric: Any = None

    def start_folder(self) -> None:
        """Create and lock the run folder and write ``fabric.txt``; released by :meth:`release_folder`."""
        schedule = self.fabric.schedule if self.fabric is not None else None
        self.lock = start_run_folder(self.out, GptPlan(self.graph, self.layout, schedule), replace=self.replace_out,
                                     resumed=self.resumed)


def _refuse_options(config: TrainConfig, settings: Settings, job: Job) -> None:
    """One clear error for an option a GPT run does not take."""
    name = job.path.name
    if settings.backend not in GPT_BACKENDS:
        raise UsageError(f"--backend {settings.backend}: {name} is a transformer (GPT); it trains on --backend "
                         f"functional (the functional model of its float order) or on a device that runs its "
                         f"fabric phases ({', '.join(FABRIC_BACKENDS)}; docs/transformer.md section 11)")
    refused = {"--mode pipelined": settings.mode == "pipelined", "--sparsity": settings.sparsity is not None,
               "--defects": settings.defects is not None, "--mnist-dir": settings.mnist_dir is not None,
               "--memoryx-budget": config.memoryx_budget is not None, "--trace": config.trace is not None}
    for option, given in refused.items():
        if given:
            raise UsageError(f"{option} does not apply to {name}: a transformer (GPT) trains in weight streaming "
                             "on the functional model, with dense weights held in RAM by MemoryX")


def gpt_model(job: Job, corpus: Any, seed: int) -> tuple[Any, Any, Any]:
    """``(model, graph, example ids)``: the job's model for the corpus, built with ``torch`` seeded by
    ``seed``, and its captured graph (:class:`UsageError` listing what the front end cannot map)."""
    import torch

    from wse.host.compiler.transformer_capture import capture

    x, _ = corpus.sequences("train", job.context)
    model = job.model(corpus.vocab_size, job.context, seed)
    example = torch.from_numpy(x[:2].copy())
    return model, capture(model, example), example


def gpt_fabric(settings: Settings, layout: GptLayout, graph: Any, name: str) -> Any:
    """The run's fabric step (a :class:`~wse.host.runtime.gpt_fabric.GptFabric` on the run's device)
    for a fabric backend, else None. Raises :class:`UsageError` for ``--systems`` above 1 or a layout
    the fabric step does not have (it deals the batch's tokens evenly over the columns)."""
    if settings.backend not in FABRIC_BACKENDS:
        return None
    from wse.config import FabricConfig
    from wse.firmware.kernels.common import block_partition
    from wse.host.compiler.gpt_phases import compile_gpt
    from wse.host.runtime.gpt_fabric import GptFabric

    if settings.systems > 1:
        raise UsageError(f"--systems {settings.systems} with --backend {settings.backend}: {name}'s fabric step "
                         "runs on one system; use --systems 1, or --backend functional for N systems")
    width, height = settings.mesh_shape
    tokens = settings.batch * layout.context
    blocks = [len(b) for b in block_partition(tokens, min(width, tokens))]     # compile_gpt's token blocks
    if blocks != layout.blocks():
        raise UsageError(f"--backend {settings.backend}: {name}'s fabric step deals the batch's {tokens} "
                         f"tokens evenly over {len(blocks)} columns, but a batch of {settings.batch} "
                         f"sequences on the {settings.mesh} mesh is {len(layout.columns)} columns of "
                         f"{'/'.join(str(c) for c in sorted(set(layout.columns), reverse=True))} whole sequence(s); "
                         f"use a --batch that is a multiple of {width}, or --backend functional")
    return GptFabric(compile_gpt(graph, FabricConfig(width=width, height=height), settings.batch), settings.backend)


def _check_systems(settings: Settings, layout: GptLayout) -> None:
    if settings.systems > len(layout.columns):
        raise UsageError(f"--systems {settings.systems} exceeds the {len(layout.columns)} columns that hold a batch "
                         f"of {settings.batch} sequences on the {settings.mesh} mesh (each system takes whole "
                         f"columns); use at most {len(layout.columns)} systems or a larger --batch")


def prepare_gpt(config: TrainConfig, job: Job) -> GptRun:
    """Check and load everything a GPT run needs, without writing anything.

    Raises
    ------
    UsageError
        For an option a GPT run does not take (a cycle-level backend among
        them), a bad checkpoint, a model the transformer front end cannot map
        (every problem listed) or a batch larger than the training split.
    """
    from wse.host.runtime.transformer_reference import TransformerReference

    if job.is_text and config.dataset is not None and config.dataset not in TEXT_DATASETS:
        raise UsageError(f"--dataset {config.dataset}: {job.path.name} is a language model on the text data set "
                         f"{job.dataset} (its DATASET); it trains on {', '.join(TEXT_DATASETS)} only")
    if not job.is_text:
        raise UsageError(f"--dataset {config.dataset}: {job.path.name} is not a language model (its DATASET is "
                         f"{job.dataset}); text data sets train a job whose DATASET is one (e.g. examples/char_gpt.py)")
    out, replace_out = choose_run_folder(config, job)
    trainer, saved_memoryx, saved, folder = resume_point(config, out)
    settings = resolve_settings(config, job, saved)
    _refuse_options(config, settings, job)
    settings = dataclasses.replace(settings, mode="weight-streaming")
    corpus = load_text_corpus(settings.dataset)
    x, y = corpus.sequences("train", job.context)
    vx, vy = corpus.sequences("validation", job.context)
    if settings.batch > len(x):
        raise UsageError(f"--batch {settings.batch} exceeds the {len(x)} training sequences of {settings.dataset}")
    layout = GptLayout.of(settings, job.context)
    _check_systems(settings, layout)
    model, graph, _ = gpt_model(job, corpus, settings.seed)
    reference = TransformerReference(graph, rows=layout.rows, blocks=layout.blocks())
    fabric = gpt_fabric(settings, layout, graph, job.path.name)
    params = graph.parameters()
    if saved_memoryx is None:
        state = model.state_dict()
        memoryx = MemoryX.from_state_dict({name: state[name].detach().numpy().copy() for name in params},
                                          settings.optimizer_config, order=list(params))
        batches = Batches(x, y, settings.batch, seed=settings.seed, drop_last=True)
    else:
        held = {name: saved_memoryx.shape(name) for name in saved_memoryx.names()}
        if held != {name: tuple(shape) for name, shape in params.items()}:
            raise UsageError(f"the checkpoint in {str(out)!r} holds tensors {held}, but the model of "
                             f"{job.path.name} has {params}; the job file changed since the run started")
        memoryx = saved_memoryx
        batches = Batches.from_state(x, y, trainer["batches"])
    pick = np.random.default_rng(1).permutation(len(vx))[:PROBE_SEQUENCES]
    return GptRun(config, settings, job, out, replace_out, corpus, (x, y), (vx, vy), (vx[pick], vy[pick]), graph,
                  layout, reference, memoryx, batches, trainer, folder, fabric=fabric)
