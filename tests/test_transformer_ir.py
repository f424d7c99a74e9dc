"""The transformer IR (wse.host.compiler.transformer_ir): typed nodes, their
checks and the JSON round trip."""

from __future__ import annotations

import json

import pytest

from wse.config import UsageError
from wse.host.compiler.transformer_ir import (GELU, Add, Embedding, LayerNorm, Rearrange, SequenceCrossEntropy,
                                              TNode, TokenLinear, Tokens, TransformerGraph)


def small_graph() -> TransformerGraph:
    return TransformerGraph([
        Tokens("tokens", (), (4,)),
        Embedding("tok", ("tokens",), (4, 8), num_embeddings=10, dim=8, weight_name="tok.weight"),
        LayerNorm("ln", ("tok",), (4, 8), features=8, weight_name="ln.weight", bias_name="ln.bias"),
        TokenLinear("fc", ("ln",), (4, 8), in_features=8, out_features=8, weight_name="fc.weight",
                    bias_name="fc.bias"),
        GELU("gelu", ("fc",), (4, 8), approximate="tanh"),
        Add("res", ("tok", "gelu"), (4, 8)),
        Rearrange("split", ("res",), (4, 2, 4), op="view"),
        Rearrange("swap", ("split",), (2, 4, 4), op="transpose", dims=(1, 2)),
        SequenceCrossEntropy("loss", ("res",), (), vocab=8),
    ], output="res", name="Small")


def test_graph_parameters_and_round_trip():
    graph = small_graph()
    assert graph.parameters() == {"tok.weight": (10, 8), "ln.weight": (8,), "ln.bias": (8,),
                                  "fc.weight": (8, 8), "fc.bias": (8,)}
    assert graph.parameter_count == 80 + 16 + 72
    assert graph.loss.vocab == 8 and graph.node("swap").dims == (1, 2)
    again = TransformerGraph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert again == graph and again.summary() == graph.summary()
    assert "GELU(approximate=tanh)" in graph.summary() and "scalar" in graph.summary()


@pytest.mark.parametrize("build, message", [
    (lambda: Add("a", ("x",), (4,)), "takes 2 input name"),
    (lambda: GELU("g", ("x",), (4,), approximate="fast"), "GELU approximate must be"),
    (lambda: Rearrange("r", ("x",), (4,), op="permute"), "Rearrange op must be"),
    (lambda: Rearrange("r", ("x",), (4,), op="transpose", dims=(0, 1)), "swaps two non-batch dimensions"),
    (lambda: Embedding("e", ("x",), (4, 0), num_embeddings=3, dim=2, weight_name="w"), "positive integers"),
    (lambda: Embedding("e", ("x",), (4, 2), num_embeddings=0, dim=2, weight_name="w"), "num_embeddings"),
    (lambda: TNode.from_dict({"kind": "conv"}), "transformer node kind must be one of"),
    (lambda: TransformerGraph([Tokens("t", (), (4,)), Add("a", ("t", "b"), (4,))], "a"), "not an earlier node"),
    (lambda: TransformerGraph([Tokens("t", (), (4,)), Tokens("t", (), (4,))], "t"), "appears twice"),
    (lambda: TransformerGraph([Tokens("t", (), (4,))], "x"), "is not a node"),
    (lambda: TransformerGraph.from_dict({"format": "wse-layer-ir"}), "must have format"),
])
def test_bad_nodes_and_graphs_are_usage_errors(build, message):
    with pytest.raises(UsageError, match=message):
        build()


def test_unknown_node_name():
    with pytest.raises(UsageError, match="has no node 'nope'"):
        small_graph().node("nope")
