"""Static analysis of a ``torch.fx`` trace for the front end (:mod:`.frontend`).

:class:`Analysis` classifies the traced nodes, follows the chain of supported
layers from the input to the output and collects every operation the
compiler cannot map as an :class:`UnsupportedOp` with its place in the user's
code (:func:`node_location`); after shape propagation it adds the problems
only the example input's shapes reveal.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from .layers import format_shape

__all__ = ["UnsupportedOp", "Analysis", "node_location", "class_name", "function_name", "is_user_file",
           "format_frame", "is_inplace"]

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


# ---------------------------------------------------------------------------
# naming things in messages

def _display_path(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith(os.pardir) else relative


def is_user_file(path: str) -> bool:
    """Whether ``path`` is the user's code (not PyTorch's, not the compiler's)."""
    path = os.path.abspath(path)
    return not (path.startswith(_TORCH_DIR) or path.startswith(_COMPILER_DIR))


def format_frame(path: str, line: int | str, func: str) -> str:
    """``file:line in function`` for messages."""
    return f"{_display_path(path)}:{line} in {func}"


def node_location(node: fx.Node) -> str | None:
    """The innermost frame of the user's code that created ``node``, else its module path."""
    frames = [m for m in _FRAME_RE.finditer(node.stack_trace or "") if is_user_file(m["file"])]
    if frames:
        last = frames[-1]
        return format_frame(last["file"], last["line"], last["func"])
    if node.op == "call_module":
        return f"module {node.target}"
    stack = node.meta.get("nn_module_stack")
    if stack:
        return f"module {list(stack)[-1]}"
    return None


def class_name(cls: type) -> str:
    """``torch.nn.Linear`` for PyTorch's modules, ``module.Class`` for others."""
    if getattr(nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def function_name(fn: Any) -> str:
    """``torch.sigmoid``, ``torch.nn.functional.relu``, ``operator.add`` or ``module.function``."""
    name = getattr(fn, "__name__", None)
    if name:
        for module, prefix in ((torch, "torch"), (F, "torch.nn.functional"), (operator, "operator")):
            if getattr(module, name, None) is fn:
                return f"{prefix}.{name}"
        module_name = getattr(fn, "__module__", None)
        return f"{module_name}.{name}" if module_name and module_name != "builtins" else name
    return repr(fn)


# ---------------------------------------------------------------------------
# static analysis of the traced graph

def is_inplace(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether ``node`` changes its input tensor in place (``inplace=True``, ``relu_``, ...)."""
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


class Analysis:
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
    def label(self, node: fx.Node) -> str:
        """How messages name ``node``: its module path or fx node name."""
        return str(node.target) if node.op == "call_module" else node.name

    def target_name(self, node: fx.Node) -> str:
        """What ``node`` calls, as messages name it (``torch.nn.Linear``, ``Tensor.view``)."""
        if node.op == "call_module":
            return class_name(type(self.modules[node.target]))
        if node.op == "call_function":
            return function_name(node.target)
        if node.op == "call_method":
            return f"Tensor.{node.target}"
        return "return" if node.op == "output" else node.op

    def flag(self, node: fx.Node, reason: str | None = None) -> None:
        """Record ``node`` as a problem (``reason``: why, when not simply unsupported)."""
        self.problems.append(UnsupportedOp(self.label(node), self.target_name(node), node_location(node), reason))

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

    def layer_kind(self, node: fx.Node) -> str | None:
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
        seeds = [n for n in nodes if n.op == "output" or is_inplace(n, self.modules)]
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
            kind = self.layer_kind(node)
            if kind is None:
                self.flag(node)
                if current in acts:  # keep following the chain through the offender
                    if is_inplace(node, self.modules):
                        self.alias[current] = node
                    current = node
                continue
            if kind == "linear" and not self._check_linear(node, seen_linears, seen_weights):
                if acts == [current]:
                    current = node
                continue
            if len(acts) != 1 or acts[0] is not current:
                source = ", ".join(self.label(n) for n in acts) or "no tensor"
                self.flag(node, f"not applied in sequence (its input is {source}, not the output of "
                                f"{self.label(current)}); branches are not supported yet")
                continue
            if kind == "reshape":
                self._check_reshape_sizes(node)
            if is_inplace(node, self.modules):
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
            self.flag(node, f"the model returns {self.label(value)}, not the last layer "
                            f"{self.label(current)}; branches are not supported yet")

    def _check_linear(self, node: fx.Node, seen: dict[str, fx.Node], weights: dict[int, str]) -> bool:
        path = str(node.target)
        module = self.modules[path]
        if path in seen:
            first = node_location(seen[path]) or "an earlier call"
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

