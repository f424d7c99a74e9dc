"""The compiler: PyTorch front end, the layer IR, mappers and code generation.

:func:`trace` turns an ``nn.Module`` into a :class:`Graph` of layers;
:func:`compile_model` traces, maps (weight streaming or layer pipelining,
or ``"auto"``: :mod:`.mapper`) and generates an :class:`Executable` that
:mod:`wse.host.runtime` runs: typed phases (:class:`Phase`, its
:class:`StreamIn`/:class:`StreamOut` and :class:`MathOp` entries) and the
mode's :class:`Layout`. The IR and the executable's types import without
PyTorch; the front end (which needs it) loads on first use, as do the mappers.
"""

from __future__ import annotations

from typing import Any

from .ir import (IR_FORMAT, IR_VERSION, Flatten, Graph, Input, Layer, Linear, ReLU, Shape,
                 SoftmaxCrossEntropy, format_shape)
from .layouts import LAYOUTS, Layout, PipelinedLayout, WeightStreamingLayout, register_layout
from .schedule import (MathOp, Phase, Relu, ReluMask, Sgemm, SgemmTransposed, SoftmaxDelta, StreamIn, StreamOut,
                       WeightGradient)

_FRONTEND_NAMES = ("trace", "UnsupportedModelError", "UntraceableModelError", "ModelShapeError",
                   "UnsupportedOp")
_LAZY = {
    "compile_model": "mapper", "compile_graph": "mapper", "choose_mode": "mapper", "MAPPERS": "mapper",
    "Mapper": "mapper", "register_mapper": "mapper", "Executable": "executable", "FitError": "weight_streaming",
    "PipelinedMapper": "mapper",
}

__all__ = ["IR_FORMAT", "IR_VERSION", "Flatten", "Graph", "Input", "Layer", "Linear", "ReLU",
           "Shape", "SoftmaxCrossEntropy", "format_shape", "Phase", "StreamIn", "StreamOut", "MathOp", "Sgemm",
           "SgemmTransposed", "Relu", "ReluMask", "SoftmaxDelta", "WeightGradient", "Layout",
           "WeightStreamingLayout", "PipelinedLayout", "LAYOUTS", "register_layout", *_FRONTEND_NAMES, *_LAZY]


def __getattr__(name: str) -> Any:
    # The front end imports torch, the mappers numba: load them only when asked for.
    if name in _FRONTEND_NAMES:
        from . import frontend
        return getattr(frontend, name)
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
