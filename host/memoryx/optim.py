"""Optimizer configurations for MemoryX: names, hyper-parameters, validation.

MemoryX does not re-implement optimizer arithmetic. It drives ``torch.optim``
itself (single-tensor loops, ``foreach=False``) on its own tensors, so every
update is the one plain PyTorch computes with the same settings. This module
holds the table of supported optimizers, checks hyper-parameters before any
work is done, and builds the ``torch.optim`` object.

Defaults are read from the ``torch.optim`` constructors, so they are written
down in one place only (PyTorch).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import types
from typing import Any, Callable, Mapping

import torch

from wse.config import UsageError

__all__ = ["OPTIMIZERS", "OptimizerConfig", "state_slots"]


@dataclasses.dataclass(frozen=True)
class _Spec:
    cls: type
    names: tuple[str, ...]          # accepted hyper-parameters
    doc: str

    def defaults(self) -> dict[str, Any]:
        params = inspect.signature(self.cls).parameters
        return {name: _normalize(name, params[name].default) for name in self.names}


_SGD_NAMES = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
_ADAM_NAMES = ("lr", "betas", "eps", "weight_decay", "amsgrad")

#: The optimizers MemoryX runs, by name.
OPTIMIZERS: Mapping[str, _Spec] = types.MappingProxyType({
    "sgd": _Spec(torch.optim.SGD, _SGD_NAMES, "stochastic gradient descent, optionally with (Nesterov) momentum"),
    "adam": _Spec(torch.optim.Adam, _ADAM_NAMES, "Adam with L2 weight decay added to the gradient"),
    "adamw": _Spec(torch.optim.AdamW, _ADAM_NAMES, "Adam with decoupled weight decay"),
})


def _normalize(name: str, value: Any) -> Any:
    """Canonical Python type of one hyper-parameter (float, bool or a float pair)."""
    if name in ("nesterov", "amsgrad"):
        return bool(value)
    if name == "betas":
        return tuple(float(b) for b in value)
    return float(value)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_real(name: str, value: Any, low: float = 0.0, high: float = math.inf,
                high_open: bool = False) -> None:
    upper = f"{high})" if high_open else f"{high}]"
    expected = f"a finite real number in [{low}, {upper}" if math.isfinite(high) else \
        f"a finite real number >= {low}"
    if not _is_real(value) or not math.isfinite(value) or value < low or value > high \
            or (high_open and value >= high):
        raise UsageError(f"optimizer hyper-parameter {name} must be {expected}, not {value!r}")


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "lr": _check_real,
    "momentum": _check_real,
    "dampening": _check_real,
    "weight_decay": _check_real,
    "eps": _check_real,
}


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise UsageError(f"optimizer hyper-parameter {name} must be True or False, not {value!r}")


def _check_betas(name: str, value: Any) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise UsageError(f"optimizer hyper-parameter {name} must be a pair (beta1, beta2), not {value!r}")
    for i, beta in enumerate(value):
        _check_real(f"{name}[{i}]", beta, 0.0, 1.0, high_open=True)


_CHECKS.update(nesterov=_check_bool, amsgrad=_check_bool, betas=_check_betas)


@dataclasses.dataclass(frozen=True, init=False)
class OptimizerConfig:
    """One optimizer and its complete, validated hyper-parameters.

    Parameters
    ----------
    name : str
        One of :data:`OPTIMIZERS`: ``"sgd"``, ``"adam"`` or ``"adamw"``
        (case-insensitive).
    **hyper
        Hyper-parameters with PyTorch's names and meaning. ``sgd`` takes
        ``lr, momentum, dampening, nesterov, weight_decay``; ``adam`` and
        ``adamw`` take ``lr, betas, eps, weight_decay, amsgrad``. Omitted ones
        take the ``torch.optim`` defaults.

    Members
    -------
    name : str
        The lower-case optimizer name.
    hyper : Mapping[str, Any]
        Every hyper-parameter of the optimizer (given or default), read-only;
        numbers are floats, flags bools, ``betas`` a tuple of two floats.

    Raises
    ------
    UsageError
        For an unknown optimizer (the message lists the valid names), an
        unknown hyper-parameter (the message lists the accepted ones) or a value
        out of range (the message names the hyper-parameter).
    """

    name: str
    hyper: Mapping[str, Any]

    def __init__(self, name: str, **hyper: Any):
        if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
            raise UsageError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {name!r}")
        name = name.lower()
        spec = OPTIMIZERS[name]
        unknown = sorted(set(hyper) - set(spec.names))
        if unknown:
            raise UsageError(f"optimizer {name} has no hyper-parameter {', '.join(unknown)}; "
                             f"it accepts {', '.join(spec.names)}")
        for key, value in hyper.items():
            _CHECKS[key](key, value)
        values = spec.defaults()
        values.update({key: _normalize(key, value) for key, value in hyper.items()})
        if values.get("nesterov") and (values["momentum"] <= 0 or values["dampening"] != 0):
            raise UsageError("optimizer hyper-parameter nesterov=True needs momentum > 0 and dampening == 0, "
                             f"not momentum={values['momentum']!r}, dampening={values['dampening']!r}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "hyper", types.MappingProxyType(values))

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.hyper.items()))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OptimizerConfig):
            return NotImplemented
        return self.name == other.name and dict(self.hyper) == dict(other.hyper)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyper.items())
        return f"OptimizerConfig({self.name!r}, {args})"

    def replace(self, **changes: Any) -> "OptimizerConfig":
        """Return a copy with some hyper-parameters changed (validated again)."""
        return OptimizerConfig(self.name, **{**self.hyper, **changes})

    def to_dict(self) -> dict:
        """JSON-ready form: ``{"name": ..., "hyper": {...}}``."""
        hyper = {k: list(v) if isinstance(v, tuple) else v for k, v in self.hyper.items()}
        return {"name": self.name, "hyper": hyper}

    @classmethod
    def from_dict(cls, data: Mapping) -> "OptimizerConfig":
        """Inverse of :meth:`to_dict`; raises :class:`UsageError` on a malformed mapping."""
        if not isinstance(data, Mapping) or set(data) != {"name", "hyper"} \
                or not isinstance(data["hyper"], Mapping):
            raise UsageError(f"optimizer description must be {{'name': ..., 'hyper': {{...}}}}, not {data!r}")
        hyper = {k: tuple(v) if k == "betas" and isinstance(v, list) else v for k, v in data["hyper"].items()}
        return cls(data["name"], **hyper)

    def build(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The ``torch.optim`` optimizer over ``params``, single-tensor loops (``foreach=False``)."""
        spec = OPTIMIZERS[self.name]
        return spec.cls(params, **self.hyper, foreach=False)


def state_slots(config: OptimizerConfig) -> frozenset[str]:
    """The optimizer-state tensors ``torch.optim`` keeps per parameter once it has been stepped.

    ``sgd`` keeps ``momentum_buffer`` when ``momentum`` is non-zero; ``adam``
    and ``adamw`` keep ``step`` (a 0-d float32 count), ``exp_avg``,
    ``exp_avg_sq`` and, with ``amsgrad``, ``max_exp_avg_sq``.
    """
    if config.name == "sgd":
        return frozenset({"momentum_buffer"} if config.hyper["momentum"] != 0 else ())
    slots = {"step", "exp_avg", "exp_avg_sq"}
    if config.hyper["amsgrad"]:
        slots.add("max_exp_avg_sq")
    return frozenset(slots)
