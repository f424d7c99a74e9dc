"""The PyTorch front end: ``nn.Module`` in, layer :class:`~wse.host.compiler.ir.Graph` out.

:func:`trace` records the model with ``torch.fx`` (``symbolic_trace``'s tracer,
with stack traces kept so every operation knows its line in the user's code),
propagates shapes on the example input (``ShapeProp``) and lowers the result
into the layer IR. Everything the compiler cannot map is collected first and
reported in one :class:`UnsupportedModelError`, before any compilation work.

Supported now: ``nn.Linear`` (with or without bias) applied in sequence,
``nn.ReLU`` / ``F.relu`` / ``torch.relu`` / ``x.relu()`` (in place too),
``nn.Flatten`` / ``torch.flatten`` / ``x.flatten(1)`` / ``x.view(x.size(0), -1)``
/ ``x.reshape(batch, -1)`` (any reshape that flattens each sample), ``nn.Identity``,
and softmax cross-entropy as the loss. Operations whose results the model never
uses (and that change nothing in place) are ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import traceback
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from wse.config import UsageError

from .fx_analysis import (Analysis, UnsupportedOp, class_name, format_frame, function_name, is_user_file,
                          node_location)
from .ir import Flatten, Graph, Input, Layer, Linear, ReLU, SoftmaxCrossEntropy, format_shape

__all__ = ["trace", "UnsupportedOp", "UnsupportedModelError", "UntraceableModelError", "ModelShapeError",
           "SUPPORTED_SUMMARY"]

#: How error messages name what the front end accepts.
SUPPORTED_SUMMARY = "supported: Linear, ReLU, Flatten; loss: softmax cross-entropy"

_CROSS_ENTROPY_NAMES = ("cross_entropy", "softmax_cross_entropy")


class UnsupportedModelError(UsageError):
    """The model uses operations the compiler cannot map; :attr:`problems` lists every one."""

    def __init__(self, model_name: str, problems: list[UnsupportedOp], supported: str = SUPPORTED_SUMMARY) -> None:
        self.model_name = model_name
        self.problems = list(problems)
        count = len(self.problems)
        lines = [f"model {model_name} has {count} unsupported operation{'' if count == 1 else 's'} "
                 f"({supported}):"]
        lines += [f"  {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))


class UntraceableModelError(UsageError):
    """``torch.fx`` cannot record the model (data-dependent control flow and the like)."""


class ModelShapeError(UsageError):
    """The model does not run on the example input: shapes do not match."""


# ---------------------------------------------------------------------------
# argument checks, loss and tracing

def _check_arguments(model: Any, example_input: Any) -> None:
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(example_input, torch.Tensor):
        raise UsageError(f"example_input must be a torch.Tensor, not {type(example_input).__name__}")
    if example_input.dim() < 2:
        raise UsageError(
            f"example_input must have a batch dimension and at least one feature dimension, such as "
            f"[batch, 784], not shape {list(example_input.shape)}")
    if example_input.shape[0] < 1 or example_input.numel() == 0:
        raise UsageError(f"example_input must not be empty, not shape {list(example_input.shape)}")
    if example_input.dtype != torch.float32:
        raise UsageError(f"example_input must be float32 (the fabric computes in binary32), "
                         f"not {example_input.dtype}")


@dataclasses.dataclass(frozen=True)
class _LossSpec:
    reduction: str
    target: str  # how messages name it


def _resolve_loss(loss: Any) -> tuple[_LossSpec | None, UnsupportedOp | None]:
    """The loss argument as a spec, or the problem with it."""
    def problem(target: str, reason: str) -> tuple[None, UnsupportedOp]:
        return None, UnsupportedOp("loss", target, None, f"given as the loss argument; {reason}")

    if loss is None:
        return None, None
    if isinstance(loss, str):
        if loss in _CROSS_ENTROPY_NAMES:
            return _LossSpec("mean", "cross_entropy"), None
        return problem(repr(loss), "expected 'cross_entropy', nn.CrossEntropyLoss() or F.cross_entropy")
    if loss is F.cross_entropy:
        return _LossSpec("mean", "torch.nn.functional.cross_entropy"), None
    if isinstance(loss, nn.CrossEntropyLoss):
        target = class_name(type(loss))
        if type(loss).forward is not nn.CrossEntropyLoss.forward:
            return problem(target, "a subclass that overrides forward is not supported")
        if loss.weight is not None:
            return problem(target, "class weights are not supported")
        if loss.label_smoothing != 0.0:
            return problem(target, f"label_smoothing={loss.label_smoothing} is not supported")
        if loss.ignore_index != -100:
            return problem(target, f"ignore_index={loss.ignore_index} is not supported")
        if loss.reduction not in ("mean", "sum"):
            return problem(target, f"reduction={loss.reduction!r} is not supported; use 'mean' or 'sum'")
        return _LossSpec(loss.reduction, target), None
    if isinstance(loss, nn.Module):
        return problem(class_name(type(loss)), "only softmax cross-entropy is supported")
    if callable(loss):
        return problem(function_name(loss), "only softmax cross-entropy is supported")
    return problem(type(loss).__name__,
                   "expected 'cross_entropy', nn.CrossEntropyLoss(), F.cross_entropy or None")


def _concrete_args(model: nn.Module, model_name: str) -> dict[str, Any]:
    """Defaults for forward's extra arguments, so tracing specializes on them."""
    params = list(inspect.signature(model.forward).parameters.values())
    if not params:
        raise UsageError(f"model {model_name}'s forward takes no input; it must take one tensor")
    concrete, required = {}, []
    for param in params[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is param.empty:
            required.append(param.name)
        else:
            concrete[param.name] = param.default
    if required:
        raise UsageError(f"model {model_name}'s forward takes extra required arguments {', '.join(required)}; "
                         f"the compiler feeds it one input tensor")
    return concrete


def _symbolic_trace(model: nn.Module, model_name: str) -> fx.GraphModule:
    tracer = fx.Tracer()
    tracer.record_stack_traces = True
    try:
        graph = tracer.trace(model, concrete_args=_concrete_args(model, model_name) or None)
    except UsageError:
        raise
    except Exception as exc:  # anything raised while running forward on proxies
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]
        where = ""
        if frames:
            where = f" at {format_frame(frames[-1].filename, frames[-1].lineno, frames[-1].name)}"
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise UntraceableModelError(
            f"model {model_name} cannot be traced by torch.fx{where}: {type(exc).__name__}: {detail} "
            f"(the compiler needs a forward pass without data-dependent control flow or Python use of "
            f"tensor values)") from None
    return fx.GraphModule(tracer.root, graph, model_name)


# ---------------------------------------------------------------------------
# shape propagation

class _ShapeProp(ShapeProp):
    """ShapeProp that remembers which node it was running when a node failed."""

    current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        return super().run_node(n)


def _propagate_shapes(analysis: Analysis, example_input: torch.Tensor,
                      model_name: str) -> ModelShapeError | None:
    """Run ShapeProp; return the error (not raised: unsupported operations take precedence)."""
    prop = _ShapeProp(analysis.gm)
    try:
        # ShapeProp prints a failing node's traceback before re-raising; the
        # user gets one sentence instead.
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
            prop.propagate(example_input.detach().clone())
    except Exception as exc:
        cause = exc.__cause__ or exc
        node = prop.current
        detail = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        shape = list(example_input.shape)
        if node is None:
            return ModelShapeError(f"model {model_name} fails on an example input of shape {shape}: {detail}")
        what = f"{analysis.label(node)} ({analysis.target_name(node)})"
        where = node_location(node)
        where = f" at {where}" if where else ""
        if analysis.layer_kind(node) == "linear":
            module = analysis.modules[node.target]
            got = analysis.shape(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            if got is not None:
                detail = f"it receives {format_shape(got[1:])} but needs [B, {module.in_features}]"
        return ModelShapeError(f"model {model_name} fails on an example input of shape {shape} in "
                               f"{what}{where}: {detail}")
    return None


# ---------------------------------------------------------------------------
# lowering

def _lower(analysis: Analysis, model_name: str, loss: _LossSpec | None, classes: int | None) -> Graph:
    def per_sample(node: fx.Node) -> tuple[int, ...]:
        return analysis.shape(node)[1:]

    layers: list[Layer] = [Input(per_sample(analysis.input_node), name="input")]
    taken = {"input", "loss"}

    def fresh(name: str) -> str | None:
        if name in taken:
            return None  # let the Graph pick a unique one
        taken.add(name)
        return name

    for node, kind in analysis.chain:
        location = node_location(node)
        in_shape = per_sample(node.args[0])
        if kind == "linear":
            path = str(node.target)
            module = analysis.modules[path]
            has_bias = module.bias is not None
            layers.append(Linear(module.in_features, module.out_features, has_bias, f"{path}.weight",
                                 f"{path}.bias" if has_bias else None, name=fresh(path), source=location))
        elif kind == "relu":
            layers.append(ReLU(in_shape, name=fresh(node.name), source=location))
        elif kind in ("flatten", "reshape"):
            layers.append(Flatten(in_shape, name=fresh(node.name), source=location))
        # identity: nothing to compute
    if loss is not None:
        layers.append(SoftmaxCrossEntropy(classes, loss.reduction, name="loss"))
    return Graph(layers, name=model_name)


def trace(model: nn.Module, example_input: torch.Tensor,
          loss: str | nn.Module | Callable[..., Any] | None = "cross_entropy") -> Graph:
    """Lower a PyTorch model to the layer IR.

    Parameters
    ----------
    model:
        The network. Its ``forward`` takes one tensor (further arguments must
        have defaults, which tracing fixes) and returns one tensor.
    example_input:
        A float32 batch ``[batch, features...]``; it fixes the per-sample
        shapes. The model runs once on it (without gradients) to find them.
    loss:
        ``"cross_entropy"``, an ``nn.CrossEntropyLoss`` (``mean`` or ``sum``
        reduction, no weights, no label smoothing), ``F.cross_entropy``, or
        ``None`` for a graph without a loss.

    Returns
    -------
    Graph
        Input, the model's layers in order, then ``SoftmaxCrossEntropy`` if a
        loss was given. Parameter names are the model's ``state_dict`` keys.

    Raises
    ------
    UnsupportedModelError
        Listing every unsupported operation with its place in the user's code
        (including Linear layers that branch or are reused, and an unsupported loss).
    UntraceableModelError
        If ``torch.fx`` cannot record the forward pass (data-dependent control flow).
    ModelShapeError
        If the model does not run on ``example_input`` (mismatched shapes).
    UsageError
        For wrong arguments (not a module, input without batch dimension or
        not float32) or a model without any Linear layer; and for a
        transformer (a model with an embedding or attention module):
        :func:`~.transformer_capture.capture` captures it (or lists what it
        cannot), and it compiles into fabric phases with
        :func:`~.gpt_phases.compile_gpt`, not into an executable.
    """
    from .transformer_capture import capture, is_transformer  # it builds on this module
    if is_transformer(model, example_input):
        graph = capture(model, example_input, loss)
        raise UsageError(f"model {graph.name} is a transformer ({len(graph.nodes)} operations, "
                         f"{graph.parameter_count:,} parameters, captured by the front end); it compiles into "
                         f"fabric phases with wse.host.compiler.gpt_phases.compile_gpt, not into an executable "
                         f"(docs/transformer.md section 11)")
    _check_arguments(model, example_input)
    model_name = type(model).__name__
    loss_spec, loss_problem = _resolve_loss(loss)
    gm = _symbolic_trace(model, model_name)
    analysis = Analysis(gm, model)
    static_problems = list(analysis.problems)
    shape_error = _propagate_shapes(analysis, example_input, model_name)
    if shape_error is not None and not static_problems:
        raise shape_error
    classes = None
    if shape_error is None:
        analysis.check_shapes(example_input.shape[0])
        out = analysis.shape(analysis.output_value) if analysis.output_value is not None else None
        if loss_spec is not None and out is not None:
            if len(out) != 2:
                loss_problem = UnsupportedOp("loss", loss_spec.target, None,
                                             f"needs the model output as [B, classes], but it is "
                                             f"{format_shape(out[1:])}")
            classes = out[-1]
    problems = analysis.problems + ([loss_problem] if loss_problem else [])
    if problems:
        raise UnsupportedModelError(model_name, problems)
    if not any(kind == "linear" for _, kind in analysis.chain):
        raise UsageError(f"model {model_name} has no Linear layer; the compiler maps Linear layers "
                         f"(with ReLU and Flatten between them) onto the fabric")
    return _lower(analysis, model_name, loss_spec, classes)
