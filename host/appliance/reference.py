"""The reference: the same run in plain PyTorch fp32 on the CPU.

:class:`ReferenceTrainer` trains a model the way the appliance does (mean
softmax cross-entropy over each batch, one ``torch.optim`` step per batch,
built by the run's :class:`~wse.host.memoryx.OptimizerConfig`) but with
PyTorch's own forward and backward passes. :func:`run_reference` repeats a
:class:`~wse.host.appliance.TrainConfig` run with it: same job file, initial
weights, data order and optimizer. The agreement tests and the training
benchmark compare the fabric against it.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from wse.config import UsageError
from wse.host.data import Batches
from wse.host.memoryx import OptimizerConfig

from .job import load_job
from .evaluation import evaluate
from .options import TrainConfig, resolve_settings
from .preparation import load_run

__all__ = ["ReferenceTrainer", "ReferenceRun", "run_reference"]


class ReferenceTrainer:
    """Train a copy of ``model`` in plain PyTorch float32.

    Parameters
    ----------
    model : torch.nn.Module
        Copied (the caller's module is not changed).
    optimizer : OptimizerConfig or str
        The optimizer; a name takes ``**hyper`` with PyTorch's names.
    weights : mapping of str to array, optional
        Initial values for some or all parameters (by ``state_dict`` name).
    """

    def __init__(self, model: torch.nn.Module, optimizer: OptimizerConfig | str = "sgd", *,
                 weights: Mapping[str, np.ndarray] | None = None, **hyper):
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        config = optimizer if isinstance(optimizer, OptimizerConfig) else OptimizerConfig(optimizer, **hyper)
        self.model = copy.deepcopy(model).float().train()
        if weights:
            state = {name: torch.as_tensor(np.asarray(value)) for name, value in weights.items()}
            missing = set(state) - set(self.model.state_dict())
            if missing:
                raise UsageError(f"weights name tensors the model does not hold: {sorted(missing)}")
            self.model.load_state_dict(state, strict=False)
        self.optimizer = config.build(list(self.model.parameters()))

    def train_step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """One optimizer step on a batch: ``(mean cross-entropy before the step, correct predictions)``."""
        logits = self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        target = torch.from_numpy(np.asarray(y, dtype=np.int64))
        loss = F.cross_entropy(logits, target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.item()), int((logits.detach().argmax(dim=1) == target).sum())

    def forward(self, x: np.ndarray, weights: object = None) -> np.ndarray:
        """Logits of a batch as float32 (``weights`` is ignored: the signature of ``Runtime.forward``)."""
        with torch.no_grad():
            return self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()

    def weights(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters by ``state_dict`` name."""
        return {name: value.detach().numpy().copy() for name, value in self.model.state_dict().items()}


@dataclasses.dataclass(frozen=True)
class ReferenceRun:
    """The result of :func:`run_reference`.

    Members
    -------
    losses : list of float
        Loss of each step.
    correct : list of int
        Correct predictions in each step's batch (before the update).
    weights : dict of str to numpy.ndarray
        Final parameters.
    test_loss, test_accuracy : float
        Of the final weights on the test split.
    step_times : list of float
        Seconds per optimizer step (forward, backward and update).
    """

    losses: list
    correct: list
    weights: dict
    test_loss: float
    test_accuracy: float
    step_times: list


def run_reference(config: TrainConfig, steps: int | None = None) -> ReferenceRun:
    """Run ``config`` (a fresh run: ``resume`` and ``out`` are ignored) in plain PyTorch.

    Parameters
    ----------
    config : TrainConfig
        The run to repeat: job file, data set, seed, batch, optimizer, epochs
        and ``max_steps`` as the appliance resolves them.
    steps : int, optional
        Steps to take instead of the run's own count.
    """
    job = load_job(config.example)
    settings = resolve_settings(dataclasses.replace(config, resume=False, overwrite=False), job)
    (x_train, y_train), (x_test, y_test), model = load_run(job, settings)
    trainer = ReferenceTrainer(model, settings.optimizer_config)
    batches = Batches(x_train, y_train, settings.batch, seed=settings.seed, drop_last=True)
    if steps is None:
        steps = settings.epochs * len(batches)
        if settings.max_steps is not None:
            steps = min(steps, settings.max_steps)
    losses, correct, times = [], [], []
    for _ in range(steps):
        xb, yb = batches.next_batch()
        tick = time.perf_counter()
        loss, right = trainer.train_step(xb, yb)
        times.append(time.perf_counter() - tick)
        losses.append(loss)
        correct.append(right)
    test_loss, test_accuracy = evaluate(trainer, None, x_test, y_test, settings.batch)
    return ReferenceRun(losses, correct, trainer.weights(), test_loss, test_accuracy, times)
