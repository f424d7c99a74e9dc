"""The front end for transformers: ``nn.Module`` over token ids in,
:class:`~.transformer_ir.TransformerGraph` out.

:func:`capture` records the model with ``torch.fx`` (the same tracer as the
layer front end, :mod:`.frontend`), runs it once on the example token ids
(keeping every intermediate value, which checks masks and positions) and
turns every traced operation into a typed node, or into an
:class:`~.fx_analysis.UnsupportedOp`; all problems are reported together in
one :class:`~.frontend.UnsupportedModelError`.

Supported: ``nn.Embedding`` (token ids, and positions from
``torch.arange``), ``nn.LayerNorm`` (last dimension, with weight and bias),
``nn.Linear`` per token, ``nn.GELU`` / ``F.gelu`` (``approximate`` ``'none'``
or ``'tanh'``), residual additions, ``view`` / ``reshape`` / ``transpose`` /
``contiguous`` (not moving the batch dimension), attention written out
(``q @ k.transpose(-2, -1)``, a multiplication or division by a constant,
``masked_fill`` with a causal boolean mask and ``-inf``, ``softmax`` over the
last dimension, ``@ v``) or as ``F.scaled_dot_product_attention(q, k, v,
is_causal=True)``, dropout with ``p=0`` or in eval mode, ``nn.Identity``.
The model returns logits ``[B, T, vocab]``; the loss is next-token softmax
cross-entropy over every position.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx, nn

from wse.config import UsageError

from .frontend import ModelShapeError, UnsupportedModelError, _resolve_loss, _symbolic_trace
from .fx_analysis import UnsupportedOp, class_name, function_name, node_location
from .transformer_ir import (GELU, Add, CausalAttention, CausalMask, Embedding, LayerNorm, MatMul, Positions,
                             Rearrange, Scale, SequenceCrossEntropy, Softmax, TNode, TokenLinear, Tokens,
                             TransformerGraph)

__all__ = ["capture", "is_transformer", "TRANSFORMER_SUMMARY"]

#: How error messages name what the transformer front end accepts.
TRANSFORMER_SUMMARY = ("supported in a transformer: Embedding, LayerNorm, Linear, GELU, residual add, "
                       "causal self-attention (written out or scaled_dot_product_attention with is_causal=True), "
                       "dropout p=0; loss: next-token cross-entropy")

_ADD = frozenset({operator.add, operator.iadd, torch.add})
_MUL = frozenset({operator.mul, torch.mul})
_DIV = frozenset({operator.truediv, torch.div})
_MATMUL = frozenset({operator.matmul, torch.matmul, torch.bmm})
_SOFTMAX = frozenset({F.softmax, torch.softmax})
_MOVES = frozenset({"view", "reshape", "transpose", "contiguous"})
_TRANSFORMER_MODULES = (nn.Embedding, nn.MultiheadAttention, nn.TransformerEncoderLayer,
                        nn.TransformerDecoderLayer)


def is_transformer(model: Any, example_input: Any = None) -> bool:
    """Whether :func:`capture` (not the layer front end) handles ``model``: it has
    an embedding or attention module (``example_input`` is not consulted: a
    model without an embedding cannot read token ids, and the layer front end
    says that its input must be float32)."""
    return isinstance(model, nn.Module) and any(isinstance(m, _TRANSFORMER_MODULES) for m in model.modules())


class _Recorder(fx.Interpreter):
    """Runs the traced model and keeps every node's value."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}
        self.current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        value = super().run_node(n)
        self.values[n] = value
        return value


def _arg(node: fx.Node, index: int, key: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


class _Capture:
    """One pass over the traced graph: typed nodes and problems."""

    def __init__(self, gm: fx.GraphModule, model: nn.Module, values: dict[fx.Node, Any]) -> None:
        self.gm, self.model, self.values = gm, model, values
        self.modules = dict(gm.named_modules())
        self.state_keys = set(model.state_dict().keys())
        self.problems: list[UnsupportedOp] = []
        self.nodes: list[TNode] = []
        self.names: dict[fx.Node, str] = {}      # fx node -> typed node name (aliases included)
        self.typed: dict[str, TNode] = {}
        self.masks = self._mask_nodes()
        self.used_modules: dict[str, fx.Node] = {}
        self.unbatched: set[fx.Node] = set()      # positions and their embeddings: [T, ...], no batch
        self.flagged: set[fx.Node] = set()
        self.origin: dict[str, fx.Node] = {}      # typed node name -> its fx node
        self.owners: dict[int, str] = {}          # id of a parameter tensor -> the module path that uses it
        self.live = self._live_nodes()

    # -- helpers ---------------------------------------------------------
    def label(self, node: fx.Node) -> str:
        return str(node.target) if node.op == "call_module" else node.name

    def target_name(self, node: fx.Node) -> str:
        if node.op == "call_module":
            return class_name(type(self.modules[node.target]))
        if node.op == "call_function":
            return function_name(node.target)
        return f"Tensor.{node.target}" if node.op == "call_method" else node.op

    def flag(self, node: fx.Node, reason: str | None = None) -> None:
        """Record ``node`` as a problem; later operations read through it (to its
        first activation input), so their own problems are found too."""
        self.problems.append(UnsupportedOp(self.label(node), self.target_name(node), node_location(node), reason))
        self.flagged.add(node)
        named = [n for n in self.acts(node) if n in self.names]
        self.names[node] = self.names[named[0]] if named else "tokens"

    def is_tensor(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and isinstance(self.values.get(node), torch.Tensor)

    def holds_tensors(self, node: fx.Node) -> bool:
        """A tensor, or a tuple or list with tensors (what nn.MultiheadAttention returns)."""
        value = self.values.get(node)
        if isinstance(value, (tuple, list)):
            return any(isinstance(v, torch.Tensor) for v in value)
        return isinstance(value, torch.Tensor)

    def per_sample(self, node: fx.Node) -> tuple[int, ...]:
        shape = tuple(self.values[node].shape)
        return shape if node in self.unbatched else shape[1:]

    def acts(self, node: fx.Node) -> list[fx.Node]:
        """The tensor inputs of ``node`` that carry activations (not masks, not buffers)."""
        return [n for n in node.all_input_nodes
                if self.is_tensor(n) and n not in self.masks and n.op != "get_attr"]

    def _live_nodes(self) -> set[fx.Node]:
        """The nodes the model's result depends on (operations whose results are
        never used are ignored, as by the layer front end)."""
        seeds = [n for n in self.gm.graph.nodes if n.op == "output"]
        live: set[fx.Node] = set()
        while seeds:
            node = seeds.pop()
            if node not in live:
                live.add(node)
                seeds.extend(node.all_input_nodes)
        return live

    def _mask_nodes(self) -> set[fx.Node]:
        """Nodes that only build boolean masks: backwards from masked_fill's mask
        through boolean tensors (the check of the mask is on its value)."""
        seeds = [n.args[1] for n in self.gm.graph.nodes
                 if n.op == "call_method" and n.target == "masked_fill" and len(n.args) > 1]
        masks: set[fx.Node] = set()
        while seeds:
            node = seeds.pop()
            value = self.values.get(node) if isinstance(node, fx.Node) else None
            if isinstance(value, torch.Tensor) and value.dtype == torch.bool and node not in masks:
                masks.add(node)
                seeds.extend(node.all_input_nodes)
        return masks

    def emit(self, fx_node: fx.Node, cls: type[TNode], inputs: list[fx.Node], name: str | None = None,
             **fields: Any) -> None:
        name = name or self.label(fx_node)
        if name in self.typed:
            name = fx_node.name
        node = cls(name, tuple(self.names[i] for i in inputs), self.per_sample(fx_node),
                   source=node_location(fx_node), batched=fx_node not in self.unbatched, **fields)
        self.nodes.append(node)
        self.typed[name] = node
        self.names[fx_node] = name
        self.origin[name] = fx_node

    # -- the walk --------------------------------------------------------
    def run(self) -> None:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if node is placeholders[0]:
                    self.emit(node, Tokens, [], name="tokens")
                continue
            if node.op in ("get_attr", "output") or node in self.masks or not self.holds_tensors(node) \
                    or node not in self.live:
                continue  # buffers, masks (checked where used), sizes, unused results
            if node.target is operator.getitem and node.args[0] in self.flagged:
                self.flagged.add(node)   # a part of what an unsupported operation returned
                self.names[node] = self.names[node.args[0]]
                continue
            if any(n not in self.names for n in self.acts(node)):
                self.flag(node, "reads a value the front end does not model")
                continue
            if node.op == "call_module":
                self._module(node)
            elif node.op == "call_function":
                self._function(node)
            elif node.op == "call_method":
                self._method(node)
        self._check_attention()

    def _alias(self, node: fx.Node) -> None:
        acts = self.acts(node)
        if len(acts) == 1:
            self.names[node] = self.names[acts[0]]
        else:
            self.flag(node, "expected one tensor input")

    def _module(self, node: fx.Node) -> None:
        module = self.modules[node.target]
        path = str(node.target)
        acts = self.acts(node)
        if isinstance(module, nn.MultiheadAttention):
            need = node.kwargs.get("need_weights", True)
            self.flag(node, ("need_weights=True returns the attention weights, which the fabric does not "
                             "produce; " if need else "") + "write the q, k, v and output projections as nn.Linear "
                            "and use F.scaled_dot_product_attention(q, k, v, is_causal=True)")
            return
        if isinstance(module, nn.Dropout):
            if module.p == 0 or not module.training:
                self._alias(node)
            else:
                self.flag(node, f"dropout p={module.p} while training; the fabric trains without dropout: "
                                f"set p=0 (or evaluate in eval mode)")
            return
        if isinstance(module, nn.Identity):
            self._alias(node)
            return
        if path in self.used_modules and not isinstance(module, (nn.GELU, nn.Softmax)):
            self.flag(node, f"applies {path} a second time; reusing a module with weights is not supported yet")
            return
        self.used_modules[path] = node
        if isinstance(module, nn.Linear):
            self._linear(node, module, path)
        elif isinstance(module, nn.Embedding):
            self._embedding(node, module, path)
        elif isinstance(module, nn.LayerNorm):
            self._layer_norm(node, module, path)
        elif isinstance(module, nn.GELU):
            self.emit(node, GELU, acts, approximate=module.approximate)
        elif isinstance(module, nn.Softmax):
            self._softmax(node, module.dim)
        else:
            self.flag(node)

    def _params_ok(self, node: fx.Node, module: nn.Module, path: str, keys: list[str]) -> bool:
        if any(f"{path}.{key}" not in self.state_keys for key in keys):
            self.flag(node, "its parameters are not plain state_dict entries (tied or parametrized?); "
                            "not supported")
            return False
        if any(p.dtype != torch.float32 for p in module.parameters(recurse=False)):
            self.flag(node, "its parameters are not float32; the fabric computes in float32")
            return False
        for key in keys:
            other = self.owners.setdefault(id(getattr(module, key)), path)
            if other != path:
                self.flag(node, f"shares its {key} with {other}; tied weights are not supported yet")
                return False
        return True

    def _linear(self, node: fx.Node, module: nn.Linear, path: str) -> None:
        has_bias = module.bias is not None
        if self._params_ok(node, module, path, ["weight"] + (["bias"] if has_bias else [])):
            self.emit(node, TokenLinear, self.acts(node), in_features=module.in_features,
                      out_features=module.out_features, bias=has_bias, weight_name=f"{path}.weight",
                      bias_name=f"{path}.bias" if has_bias else None)

    def _embedding(self, node: fx.Node, module: nn.Embedding, path: str) -> None:
        source = node.args[0] if node.args else None
        typed = self.typed.get(self.names.get(source, ""))
        if not isinstance(typed, (Tokens, Positions)):
            self.flag(node, "an embedding must look up the model's token ids or torch.arange positions")
            return
        extras = [f"{k}={getattr(module, k)}" for k in ("padding_idx", "max_norm") if getattr(module, k) is not None]
        extras += [k for k in ("scale_grad_by_freq", "sparse") if getattr(module, k)]
        if extras:
            self.flag(node, f"{', '.join(extras)} is not supported")
        elif self._params_ok(node, module, path, ["weight"]):
            if isinstance(typed, Positions):
                self.unbatched.add(node)
            self.emit(node, Embedding, [source], num_embeddings=module.num_embeddings,
                      dim=module.embedding_dim, weight_name=f"{path}.weight")

    def _layer_norm(self, node: fx.Node, module: nn.LayerNorm, path: str) -> None:
        if len(module.normalized_shape) != 1:
            self.flag(node, f"normalizes over {list(module.normalized_shape)}; only the last dimension is supported")
        elif not module.elementwise_affine or module.bias is None:
            self.flag(node, "LayerNorm without weight and bias is not supported")
        elif self._params_ok(node, module, path, ["weight", "bias"]):
            self.emit(node, LayerNorm, self.acts(node), features=module.normalized_shape[0], eps=module.eps,
                      weight_name=f"{path}.weight", bias_name=f"{path}.bias")

    def _function(self, node: fx.Node) -> None:
        target, acts = node.target, self.acts(node)
        handlers: dict[Callable[..., Any], Callable[[fx.Node], None]] = {
            torch.arange: self._arange, F.scaled_dot_product_attention: self._sdpa, F.dropout: self._dropout,
            F.gelu: lambda n: self.emit(n, GELU, acts, approximate=n.kwargs.get("approximate", "none"))}
        if target in handlers:
            handlers[target](node)
        elif target in _ADD:
            self._add(node, acts)
        elif target in _MUL or target in _DIV:
            self._scale(node, acts, divide=target in _DIV)
        elif target in _MATMUL:
            self._matmul(node, acts)
        elif target in _SOFTMAX:
            self._softmax(node, _arg(node, 1, "dim"), _arg(node, 2, "dtype") if target is torch.softmax else
                          node.kwargs.get("dtype"))
        else:
            self.flag(node)

    def _method(self, node: fx.Node) -> None:
        target, acts = node.target, self.acts(node)
        if target in _MOVES:
            self._move(node, acts)
        elif target == "masked_fill":
            self._masked_fill(node, acts)
        elif target == "softmax":
            self._softmax(node, _arg(node, 1, "dim"), node.kwargs.get("dtype"))
        elif target == "matmul":
            self._matmul(node, acts)
        elif target in ("add", "__add__"):
            self._add(node, acts)
        elif target in ("mul", "div"):
            self._scale(node, acts, divide=target == "div")
        else:
            self.flag(node)

    # -- operations --------------------------------------------------------
    def _arange(self, node: fx.Node) -> None:
        value = self.values[node]
        t = value.numel()
        if value.dim() != 1 or not torch.equal(value.cpu(), torch.arange(t, dtype=value.dtype)):
            self.flag(node, "positions must be torch.arange(T) over the sequence")
            return
        self.unbatched.add(node)
        self.nodes.append(Positions(node.name, (), (t,), source=node_location(node), batched=False))
        self.typed[node.name] = self.nodes[-1]
        self.names[node] = node.name

    def _add(self, node: fx.Node, acts: list[fx.Node]) -> None:
        if len(acts) != 2 or len({self.per_sample(acts[0]), self.per_sample(acts[1]), self.per_sample(node)}) != 1 \
                or all(a in self.unbatched for a in acts):
            self.flag(node, "only the sum of two activations of the same shape (a residual) is supported; "
                            "an additive attention mask is not: use masked_fill with a causal mask or is_causal=True")
            return
        self.emit(node, Add, acts)

    def _scale(self, node: fx.Node, acts: list[fx.Node], divide: bool) -> None:
        constants = [a for a in node.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if len(acts) != 1 or len(constants) != 1 or (divide and node.args[0] is not acts[0]):
            self.flag(node, "only an activation times (or divided by) a Python number is supported")
            return
        self.emit(node, Scale, acts, factor=float(constants[0]), divide=divide)

    def _matmul(self, node: fx.Node, acts: list[fx.Node]) -> None:
        if len(acts) != 2 or self.values[node].dim() != 4:
            self.flag(node, "only the attention products q @ k^T and p @ v over [B, heads, T, Dh] are supported")
            return
        role = "values" if self._reaches(acts[0], Softmax) else "scores"
        self.emit(node, MatMul, acts, role=role)

    def _reaches(self, node: fx.Node, cls: type[TNode]) -> bool:
        """Whether ``node`` is ``cls`` seen through data movement and scaling."""
        typed = self.typed.get(self.names.get(node, ""))
        while isinstance(typed, (Rearrange, Scale)):
            typed = self.typed[typed.inputs[0]]
        return isinstance(typed, cls)

    def _move(self, node: fx.Node, acts: list[fx.Node]) -> None:
        if len(acts) != 1:
            self.flag(node, "expected one tensor input")
            return
        before, after = self.values[acts[0]], self.values[node]
        dims = tuple(_arg(node, i + 1, key) for i, key in enumerate(("dim0", "dim1"))) \
            if node.target == "transpose" else ()
        if node.target == "transpose" and all(isinstance(d, int) for d in dims):
            dims = tuple(sorted(d % before.dim() for d in dims))
        if after.shape[0] != before.shape[0] or 0 in dims or node in self.unbatched \
                or not all(isinstance(d, int) for d in dims):
            self.flag(node, "moves or changes the batch dimension; only per-sample rearrangements are supported")
            return
        if node.target in ("view", "reshape"):
            first = node.args[1] if len(node.args) > 1 else None
            if isinstance(first, (tuple, list)):
                first = first[0] if first else None
            if isinstance(first, int) and first != -1:
                self.flag(node, f"hard-codes the batch size {first}; write x.size(0) or -1 as the first size")
                return
        op = {"reshape": "view"}.get(node.target, node.target)
        self.emit(node, Rearrange, acts, op=op, dims=dims)

    def _masked_fill(self, node: fx.Node, acts: list[fx.Node]) -> None:
        mask, fill = _arg(node, 1, "mask"), _arg(node, 2, "value")
        value = self.values.get(mask) if isinstance(mask, fx.Node) else None
        scores = self.values[acts[0]] if len(acts) == 1 else None
        if scores is None or not isinstance(value, torch.Tensor) or value.dtype != torch.bool:
            self.flag(node, "only masked_fill of attention scores with a boolean mask is supported")
            return
        t = scores.shape[-1]
        causal = torch.ones(scores.shape[-2], t, dtype=torch.bool).triu(1)
        if scores.shape[-2] != t or not bool((value.cpu().expand_as(scores) == causal).all()):
            self.flag(node, "its mask is not causal (query i must see exactly keys j <= i); only causal "
                            "self-attention is supported")
            return
        if not (isinstance(fill, float) and fill == -math.inf):
            self.flag(node, f"fills with {fill!r}; the causal mask must fill with float('-inf')")
            return
        self.emit(node, CausalMask, acts)

    def _softmax(self, node: fx.Node, dim: Any, dtype: Any = None) -> None:
        ndim = self.values[node].dim()
        if not isinstance(dim, int) or dim % ndim != ndim - 1 or dtype is not None:
            self.flag(node, f"softmax over dim={dim!r}{'' if dtype is None else f' with dtype={dtype}'}; "
                            f"only the last dimension (the keys), in float32, is supported")
            return
        self.emit(node, Softmax, self.acts(node))

    def _sdpa(self, node: fx.Node) -> None:
        q, k, v = (_arg(node, i, key) for i, key in enumerate(("query", "key", "value")))
        reasons = []
        if _arg(node, 3, "attn_mask") is not None:
            reasons.append("an attn_mask (pass is_causal=True instead)")
        if _arg(node, 4, "dropout_p", 0.0) != 0.0:
            reasons.append(f"dropout_p={_arg(node, 4, 'dropout_p')}")
        if not _arg(node, 5, "is_causal", False):
            reasons.append("is_causal=False (only causal attention is supported)")
        if node.kwargs.get("enable_gqa", False):
            reasons.append("enable_gqa=True")
        if reasons:
            self.flag(node, "not supported: " + ", ".join(reasons))
            return
        scale = _arg(node, 6, "scale")
        head = self.values[q].shape[-1]
        self.emit(node, CausalAttention, [q, k, v], scale=float(scale if scale is not None else head ** -0.5))

    def _dropout(self, node: fx.Node) -> None:
        p, training = _arg(node, 1, "p", 0.5), _arg(node, 2, "training", True)
        if p == 0 or not training:
            self._alias(node)
        else:
            self.flag(node, f"dropout p={p} while training; the fabric trains without dropout: set p=0")

    def _check_attention(self) -> None:
        """Every softmax must see causally masked scores."""
        for node in self.nodes:
            if isinstance(node, Softmax):
                source = self.typed[node.inputs[0]]
                while isinstance(source, Scale):
                    source = self.typed[source.inputs[0]]
                if not isinstance(source, CausalMask):
                    self.flag(self.origin[node.name], "softmax of scores without a causal mask: only causal "
                                                      "self-attention is supported")


def capture(model: nn.Module, example_input: torch.Tensor,
            loss: str | nn.Module | Callable[..., Any] | None = "cross_entropy") -> TransformerGraph:
    """Capture a decoder-only transformer into the transformer IR.

    Parameters
    ----------
    model:
        The network; ``forward`` takes token ids ``[B, T]`` and returns logits ``[B, T, vocab]``.
    example_input:
        Integer token ids ``[B, T]`` (any valid ids); the model runs once on them.
    loss:
        As for :func:`~.frontend.trace`: next-token softmax cross-entropy over
        every position (``"cross_entropy"``, ``nn.CrossEntropyLoss()``,
        ``F.cross_entropy``) or ``None``.

    Raises
    ------
    UnsupportedModelError
        Listing every operation the transformer front end cannot map.
    ModelShapeError
        If the model does not run on ``example_input``.
    UsageError
        For wrong arguments.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(example_input, torch.Tensor) or example_input.is_floating_point() \
            or example_input.dim() != 2 or example_input.numel() == 0:
        got = (f"{example_input.dtype} of shape {list(example_input.shape)}"
               if isinstance(example_input, torch.Tensor) else type(example_input).__name__)
        raise UsageError(f"example_input of a transformer must be integer token ids [batch, positions], not {got}")
    model_name = type(model).__name__
    loss_spec, loss_problem = _resolve_loss(loss)
    gm = _symbolic_trace(model, model_name)
    recorder = _Recorder(gm)
    try:
        with torch.no_grad():
            out = recorder.run(example_input)
    except Exception as exc:  # the model fails on the example: one sentence, not a traceback
        where = recorder.current
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        at = f" in {where.name} at {node_location(where)}" if where is not None else ""
        raise ModelShapeError(f"model {model_name} fails on example token ids of shape "
                              f"{list(example_input.shape)}{at}: {detail}") from None
    work = _Capture(gm, model, recorder.values)
    work.run()
    problems = list(work.problems)
    output_node = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or not isinstance(output_node, fx.Node):
        problems.append(UnsupportedOp("output", "return", None, "the model must return logits [B, T, vocab]"))
    if loss_problem:
        problems.append(loss_problem)
    if problems:
        raise UnsupportedModelError(model_name, problems, supported=TRANSFORMER_SUMMARY)
    nodes = list(work.nodes)
    output = work.names[output_node]
    if loss_spec is not None:
        nodes.append(SequenceCrossEntropy("loss", (output,), (), vocab=int(out.shape[-1]),
                                          reduction=loss_spec.reduction))
    return TransformerGraph(nodes, output, name=model_name)
