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
import math
import operator
import os
import re
import traceback
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from wse.config import UsageError

from .ir import Flatten, Graph, Input, Layer, Linear, ReLU, SoftmaxCrossEntropy, format_shape

__all__ = ["trace", "UnsupportedOp", "UnsupportedModelError", "UntraceableModelError", "ModelShapeError",
           "SUPPORTED_SUMMARY"]

#: How error messages name what the front end accepts.
SUPPORTED_SUMMARY = "supported: Linear, ReLU, Flatten; loss: softmax cross-entropy"

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_COMPILER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')

_RELU_FUNCTIONS = frozenset({F.relu, torch.relu, torch.relu_})  # F.relu_ is torch.relu_
_FLATTEN_FUNCTIONS = frozenset({torch.flatten})
_RESHAPE_FUNCTIONS = frozenset({torch.reshape})
_RELU_METHODS = frozenset({"relu", "relu_"})
_FLATTEN_METHODS = frozenset({"flatten"})
_RESHAPE_METHODS = frozenset({"view", "reshape"})
_SIZE_ARITHMETIC = frozenset({operator.mul, operator.floordiv, operator.add, operator.sub})
_CROSS_ENTROPY_NAMES = ("cross_entropy", "softmax_cross_entropy")


@dataclasses.dataclass(frozen=True)
class UnsupportedOp:
    """One thing in a model that the compiler cannot map.

    Members
    -------
    name:
        The operation: a module path (``encoder.0``) or the fx node name (``sigmoid``).
    target:
        What it calls (``torch.nn.Conv2d``, ``torch.sigmoid``, ``Tensor.view``).
    location:
        ``file:line in function`` in the user's code, ``module <path>`` when no
        source line is known, or ``None``.
    reason:
        Why, when it is not simply an unsupported operation.
    """

    name: str
    target: str
    location: str | None = None
    reason: str | None = None

    def __str__(self) -> str:
        text = f"{self.name} ({self.target})"
        if self.location:
            text += f" at {self.location}"
        if self.reason:
            text += f": {self.reason}"
        return text


class UnsupportedModelError(UsageError):
    """The model uses operations the compiler cannot map; :attr:`problems` lists every one."""

    def __init__(self, model_name: str, problems: list[UnsupportedOp]) -> None:
        self.model_name = model_name
        self.problems = list(problems)
        count = len(self.problems)
        lines = [f"model {model_name} has {count} unsupported operation{'' if count == 1 else 's'} "
                 f"({SUPPORTED_SUMMARY}):"]
        lines += [f"  {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))


class UntraceableModelError(UsageError):
    """``torch.fx`` cannot record the model (data-dependent control flow and the like)."""


class ModelShapeError(UsageError):
    """The model does not run on the example input: shapes do not match."""


# ---------------------------------------------------------------------------
# naming things in messages

def _display_path(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith(os.pardir) else relative


def _is_user_file(path: str) -> bool:
    path = os.path.abspath(path)
    return not (path.startswith(_TORCH_DIR) or path.startswith(_COMPILER_DIR))


def _format_frame(path: str, line: int | str, func: str) -> str:
    return f"{_display_path(path)}:{line} in {func}"


def _node_location(node: fx.Node) -> str | None:
    """The innermost frame of the user's code that created ``node``, else its module path."""
    frames = [m for m in _FRAME_RE.finditer(node.stack_trace or "") if _is_user_file(m["file"])]
    if frames:
        last = frames[-1]
        return _format_frame(last["file"], last["line"], last["func"])
    if node.op == "call_module":
        return f"module {node.target}"
    stack = node.meta.get("nn_module_stack")
    if stack:
        return f"module {list(stack)[-1]}"
    return None


def _class_name(cls: type) -> str:
    if getattr(nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _function_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None)
    if name:
        for module, prefix in ((torch, "torch"), (F, "torch.nn.functional"), (operator, "operator")):
            if getattr(module, name, None) is fn:
                return f"{prefix}.{name}"
        module_name = getattr(fn, "__module__", None)
        return f"{module_name}.{name}" if module_name and module_name != "builtins" else name
    return repr(fn)


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
        target = _class_name(type(loss))
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
        return problem(_class_name(type(loss)), "only softmax cross-entropy is supported")
    if callable(loss):
        return problem(_function_name(loss), "only softmax cross-entropy is supported")
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
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_user_file(f.filename)]
        where = ""
        if frames:
            where = f" at {_format_frame(frames[-1].filename, frames[-1].lineno, frames[-1].name)}"
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise UntraceableModelError(
            f"model {model_name} cannot be traced by torch.fx{where}: {type(exc).__name__}: {detail} "
            f"(the compiler needs a forward pass without data-dependent control flow or Python use of "
            f"tensor values)") from None
    return fx.GraphModule(tracer.root, graph, model_name)


# ---------------------------------------------------------------------------
# static analysis of the traced graph

def _is_inplace(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return bool(getattr(modules[node.target], "inplace", False))
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.startswith("_")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if node.target is F.relu and len(node.args) > 1:
            return bool(node.args[1])
        return bool(node.kwargs.get("inplace")) or (name.endswith("_") and not name.startswith("_"))
    return False


def _is_batch_size(node: Any) -> bool:
    """Whether ``node`` is ``x.size(0)``, ``x.shape[0]`` or ``x.size()[0]``."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and node.target == "size":
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        return dim == 0
    if node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0:
        shape = node.args[0]
        return isinstance(shape, fx.Node) and (
            (shape.op == "call_function" and shape.target is getattr and shape.args[1] == "shape")
            or (shape.op == "call_method" and shape.target == "size" and len(shape.args) == 1
                and "dim" not in shape.kwargs))
    return False


class _Analysis:
    """Classifies the traced nodes, finds the chain of supported layers and
    collects every problem (static ones at construction, shape ones later)."""

    def __init__(self, gm: fx.GraphModule, model: nn.Module) -> None:
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.state_keys = set(model.state_dict().keys())
        self.problems: list[UnsupportedOp] = []
        self.chain: list[tuple[fx.Node, str]] = []  # (node, kind) in order
        self.alias: dict[fx.Node, fx.Node] = {}     # tensors replaced by an in-place op
        self.input_node: fx.Node | None = None
        self.output_value: fx.Node | None = None
        self._helpers: set[fx.Node] = set()
        self._walk()

    # -- classification --------------------------------------------------
    def _label(self, node: fx.Node) -> str:
        return str(node.target) if node.op == "call_module" else node.name

    def _target(self, node: fx.Node) -> str:
        if node.op == "call_module":
            return _class_name(type(self.modules[node.target]))
        if node.op == "call_function":
            return _function_name(node.target)
        if node.op == "call_method":
            return f"Tensor.{node.target}"
        return "return" if node.op == "output" else node.op

    def flag(self, node: fx.Node, reason: str | None = None) -> None:
        self.problems.append(UnsupportedOp(self._label(node), self._target(node), _node_location(node), reason))

    def _is_helper(self, node: fx.Node) -> bool:
        """Nodes that compute sizes (ints) from tensors, used as reshape arguments."""
        if node.op == "call_method" and node.target == "size":
            return True
        if node.op != "call_function":
            return False
        if node.target is getattr:
            return len(node.args) > 1 and node.args[1] == "shape"
        inputs = node.all_input_nodes
        if node.target is operator.getitem:
            return bool(inputs) and inputs[0] in self._helpers and node.args[0] is inputs[0]
        if node.target in _SIZE_ARITHMETIC:
            return bool(inputs) and all(n in self._helpers for n in inputs)
        return False

    def _kind(self, node: fx.Node) -> str | None:
        """The supported kind of a tensor operation, or ``None``."""
        if node.op == "call_module":
            module = self.modules[node.target]
            for cls, kind in ((nn.Linear, "linear"), (nn.ReLU, "relu"), (nn.Flatten, "flatten"),
                              (nn.Identity, "identity")):
                if isinstance(module, cls) and type(module).forward is cls.forward:
                    return kind
            return None
        if node.op == "call_function":
            target = node.target
            if target in _RELU_FUNCTIONS:
                return "relu"
            if target in _FLATTEN_FUNCTIONS:
                return "flatten"
            if target in _RESHAPE_FUNCTIONS:
                return "reshape"
            return None
        if node.op == "call_method":
            if node.target in _RELU_METHODS:
                return "relu"
            if node.target in _FLATTEN_METHODS:
                return "flatten"
            if node.target in _RESHAPE_METHODS:
                return "reshape"
        return None

    def _resolve(self, node: fx.Node) -> fx.Node:
        while node in self.alias:
            node = self.alias[node]
        return node

    def _live_nodes(self) -> set[fx.Node]:
        """Nodes the result depends on, plus in-place operations (they change
        tensors the result may read) and what they depend on."""
        nodes = list(self.gm.graph.nodes)
        seeds = [n for n in nodes if n.op == "output" or _is_inplace(n, self.modules)]
        live: set[fx.Node] = set()
        while seeds:
            node = seeds.pop()
            if node not in live:
                live.add(node)
                seeds.extend(node.all_input_nodes)
        return live

    # -- the walk --------------------------------------------------------
    def _walk(self) -> None:
        live = self._live_nodes()
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.input_node = placeholders[0]
        extra = set(placeholders[1:])  # forward's defaulted arguments, specialized
        current = self.input_node
        seen_linears: dict[str, fx.Node] = {}
        seen_weights: dict[int, str] = {}
        for node in self.gm.graph.nodes:
            if node.op in ("placeholder", "get_attr") or node not in live:
                continue
            if self._is_helper(node):
                self._helpers.add(node)
                continue
            if node.op == "output":
                self._check_output(node, current)
                continue
            acts = [self._resolve(n) for n in node.all_input_nodes
                    if n not in self._helpers and n not in extra and n.op != "get_attr"]
            kind = self._kind(node)
            if kind is None:
                self.flag(node)
                if current in acts:  # keep following the chain through the offender
                    if _is_inplace(node, self.modules):
                        self.alias[current] = node
                    current = node
                continue
            if kind == "linear" and not self._check_linear(node, seen_linears, seen_weights):
                if acts == [current]:
                    current = node
                continue
            if len(acts) != 1 or acts[0] is not current:
                source = ", ".join(self._label(n) for n in acts) or "no tensor"
                self.flag(node, f"not applied in sequence (its input is {source}, not the output of "
                                f"{self._label(current)}); branches are not supported yet")
                continue
            if kind == "reshape":
                self._check_reshape_sizes(node)
            if _is_inplace(node, self.modules):
                self.alias[current] = node
            self.chain.append((node, kind))
            current = node

    def _check_output(self, node: fx.Node, current: fx.Node) -> None:
        value = node.args[0]
        if not isinstance(value, fx.Node):
            self.flag(node, f"the model returns a {type(value).__name__}; it must return one tensor")
            return
        value = self._resolve(value)
        self.output_value = value
        if value is not current:
            self.flag(node, f"the model returns {self._label(value)}, not the last layer "
                            f"{self._label(current)}; branches are not supported yet")

    def _check_linear(self, node: fx.Node, seen: dict[str, fx.Node], weights: dict[int, str]) -> bool:
        path = str(node.target)
        module = self.modules[path]
        if path in seen:
            first = _node_location(seen[path]) or "an earlier call"
            self.flag(node, f"applies {path} a second time (first at {first}); reusing a Linear layer "
                            f"is not supported yet")
            return False
        seen[path] = node
        other = weights.setdefault(id(module.weight), path)
        if other != path:
            self.flag(node, f"shares its weight with {other}; tied weights are not supported yet")
            return False
        keys = [f"{path}.weight"] + ([f"{path}.bias"] if module.bias is not None else [])
        if any(key not in self.state_keys for key in keys):
            self.flag(node, "its parameters are not plain state_dict entries (parametrized?); not supported")
            return False
        if any(p.dtype != torch.float32 for p in module.parameters(recurse=False)):
            self.flag(node, f"its parameters are {module.weight.dtype}; the fabric computes in float32")
            return False
        return True

    def _check_reshape_sizes(self, node: fx.Node) -> None:
        """A reshape must leave the batch size free: its first size is -1 or x.size(0)."""
        if node.op == "call_function":
            sizes = node.args[1] if len(node.args) > 1 else node.kwargs.get("shape")
        elif len(node.args) == 2 and isinstance(node.args[1], (tuple, list)):
            sizes = node.args[1]
        else:
            sizes = node.args[1:] or node.kwargs.get("shape") or node.kwargs.get("size")
        if not isinstance(sizes, (tuple, list)) or not sizes:
            return  # a whole shape computed elsewhere: the shape check decides
        first = sizes[0]
        if isinstance(first, int) and first != -1:
            self.flag(node, f"hard-codes the batch size {first}; write x.size(0) or -1 as the first size")
        elif isinstance(first, fx.Node) and not _is_batch_size(first):
            self.flag(node, f"its first size ({first.name}) is not the batch size; write x.size(0) or -1")

    # -- after shape propagation -----------------------------------------
    def shape(self, node: fx.Node) -> tuple[int, ...] | None:
        meta = node.meta.get("tensor_meta")
        return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None

    def check_shapes(self, batch: int) -> None:
        """Problems only the example input's shapes reveal."""
        for node, kind in self.chain:
            in_shape = self.shape(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            out_shape = self.shape(node)
            if in_shape is None or out_shape is None:
                self.flag(node, "its input or output is not a tensor")
            elif kind == "linear" and len(in_shape) != 2:
                self.flag(node, f"takes input of shape {format_shape(in_shape[1:])}; a Linear layer needs "
                                f"[B, in_features], so flatten each sample first")
            elif kind in ("flatten", "reshape") and out_shape != (batch, math.prod(in_shape[1:])):
                self.flag(node, f"reshapes {format_shape(in_shape[1:])} into {list(out_shape)} for a batch "
                                f"of {batch}; only flattening each sample to [B, features] is supported")


# ---------------------------------------------------------------------------
# shape propagation

class _ShapeProp(ShapeProp):
    """ShapeProp that remembers which node it was running when a node failed."""

    current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        return super().run_node(n)


def _propagate_shapes(analysis: _Analysis, example_input: torch.Tensor,
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
        what = f"{analysis._label(node)} ({analysis._target(node)})"
        where = _node_location(node)
        where = f" at {where}" if where else ""
        if analysis._kind(node) == "linear":
            module = analysis.modules[node.target]
            got = analysis.shape(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            if got is not None:
                detail = f"it receives {format_shape(got[1:])} but needs [B, {module.in_features}]"
        return ModelShapeError(f"model {model_name} fails on an example input of shape {shape} in "
                               f"{what}{where}: {detail}")
    return None


# ---------------------------------------------------------------------------
# lowering

def _lower(analysis: _Analysis, model_name: str, loss: _LossSpec | None, classes: int | None) -> Graph:
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
        location = _node_location(node)
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
        not float32) or a model without any Linear layer.
    """
    _check_arguments(model, example_input)
    model_name = type(model).__name__
    loss_spec, loss_problem = _resolve_loss(loss)
    gm = _symbolic_trace(model, model_name)
    analysis = _Analysis(gm, model)
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
