"""Sparse weight streaming in a run (``wse train --sparsity``, a job file's
``SPARSITY``; ``docs/weight_streaming.md`` section 13).

:func:`sparse_compile` chooses the static mask of every Linear weight from the
run's initial weights (:func:`wse.host.compiler.sparse.layer_masks`: the
global sparsity, the method, the seed, per-layer overrides), compiles the
weight-streaming executable whose forward phases stream only the kept
weights, and the dense executable's step cycles beside it for the summary.
A resumed run's checkpoint holds its masks (as indices, in MemoryX); they
must be the ones its settings choose.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from wse.config import FabricConfig, UsageError

__all__ = ["linear_weights", "run_masks", "sparse_compile"]


def linear_weights(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The weights of ``model``'s Linear layers by ``state_dict`` name, in module order."""
    return {f"{name}.weight": module.weight.detach().numpy().copy()
            for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}


def run_masks(model: torch.nn.Module, sparsity: dict) -> dict[str, np.ndarray]:
    """The masks the settings' ``sparsity`` (:func:`~.options.sparsity_settings`) choose for ``model``'s
    initial weights. The global sparsity leaves the classifier (the last Linear layer, about 1% of
    FC-MNIST's weights) dense, as is common practice; naming it in ``layers`` prunes it too."""
    from wse.host.compiler.sparse import layer_masks

    weights = linear_weights(model)
    layers = dict(sparsity["layers"])
    if weights:
        layers.setdefault(list(weights)[-1], 0.0)
    return layer_masks(weights, sparsity["sparsity"], sparsity["method"], sparsity["seed"], layers)


def _check_resumed(masks: dict, memoryx: Any) -> None:
    held = memoryx.masks
    if set(held) != set(masks):
        raise UsageError(f"the checkpoint's masks cover {sorted(held) or 'no weight'}, but the run's sparsity "
                         f"settings mask {sorted(masks)}; a sparse run resumes with the mask it started with")
    for name, mask in masks.items():
        if not np.array_equal(held[name], mask):
            raise UsageError(f"the checkpoint's mask of {name} ({int(held[name].sum())} kept) is not the one the "
                             f"run's sparsity settings choose ({int(mask.sum())} kept); a sparse run resumes "
                             "with the mask it started with")


def sparse_compile(model: torch.nn.Module, example: torch.Tensor, fabric: FabricConfig, settings: Any,
                   saved_memoryx: Any = None) -> tuple[Any, dict, int]:
    """``(executable, masks, dense_cycles)`` of a sparse run: the sparse
    weight-streaming executable, the masks by weight name and a dense step's
    cycles on the same fabric (the static cycle model of both).

    Raises
    ------
    UsageError
        In the layer-pipelined mode or on several systems (sparse weight
        streaming trains on one system), for a bad override, or when a
        resumed checkpoint's masks are not the run's.
    """
    from wse.host.compiler import compile_model
    from wse.host.compiler.sparse import compile_sparse

    if settings.mode == "pipelined":
        raise UsageError("--sparsity streams only the non-zero weights in the weight-streaming mode; use --mode "
                         "weight-streaming (or auto) rather than pipelined")
    if settings.systems > 1:
        raise UsageError(f"--sparsity trains on one system so far, not --systems {settings.systems}")
    masks = run_masks(model, settings.sparsity)
    if saved_memoryx is not None:
        _check_resumed(masks, saved_memoryx)
    executable = compile_sparse(model, example, config=fabric, batch=settings.batch, masks=masks)
    dense = compile_model(model, example, config=fabric, batch=settings.batch, mode="weight_streaming")
    dense_cycles = int(sum(dense.phases[name].cycles for name in dense.sequences["train"]))
    return executable, masks, dense_cycles
