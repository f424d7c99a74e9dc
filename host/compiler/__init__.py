"""The compiler: PyTorch front end, the layer IR, mappers and code generation.

:func:`trace` turns an ``nn.Module`` into a :class:`Graph` of layers; the
mappers and the code generator work from that graph. The IR imports without
PyTorch; the front end (which needs it) loads on first use.
"""

from __future__ import annotations

from typing import Any

from .ir import (IR_FORMAT, IR_VERSION, Flatten, Graph, Input, Layer, Linear, ReLU, Shape,
                 SoftmaxCrossEntropy, format_shape)

_FRONTEND_NAMES = ("trace", "UnsupportedModelError", "UntraceableModelError", "ModelShapeError",
                   "UnsupportedOp")

__all__ = ["IR_FORMAT", "IR_VERSION", "Flatten", "Graph", "Input", "Layer", "Linear", "ReLU",
           "Shape", "SoftmaxCrossEntropy", "format_shape", *_FRONTEND_NAMES]


def __getattr__(name: str) -> Any:
    # The front end imports torch; load it only when asked for.
    if name in _FRONTEND_NAMES:
        from . import frontend
        return getattr(frontend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
