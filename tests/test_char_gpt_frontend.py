"""The transformer front end: examples/char_gpt.py captured into typed nodes,
and one error listing every unsupported piece of other models."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.compiler import compile_model
from wse.host.compiler.frontend import UnsupportedModelError, trace
from wse.host.compiler.transformer_capture import capture, is_transformer
from wse.host.compiler.transformer_ir import (GELU, Add, CausalAttention, CausalMask, Embedding, LayerNorm,
                                              MatMul, Positions, Softmax, TokenLinear, TransformerGraph)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.py"


def load_example():
    spec = importlib.util.spec_from_file_location("char_gpt_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load_example()


def ids(batch=2, t=32, vocab=65):
    return torch.randint(0, vocab, (batch, t), generator=torch.Generator().manual_seed(0))


def kinds(graph, cls):
    return len(graph.of_kind(cls))


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_char_gpt_is_captured(example, attention):
    model = example.CharGPT(65, attention=attention)
    graph = capture(model, ids())
    assert graph.parameters() == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert graph.parameter_count == sum(p.numel() for p in model.parameters())
    assert kinds(graph, Embedding) == 2 and kinds(graph, Positions) == 1
    assert kinds(graph, LayerNorm) == 5 and kinds(graph, TokenLinear) == 13 and kinds(graph, GELU) == 2
    assert kinds(graph, Add) == 5     # token + position, two residuals per block
    if attention == "manual":
        roles = [n.role for n in graph.of_kind(MatMul)]
        assert roles == ["scores", "values"] * 2
        assert kinds(graph, CausalMask) == 2 and kinds(graph, Softmax) == 2
    else:
        assert [n.scale for n in graph.of_kind(CausalAttention)] == [0.25, 0.25]
    assert graph.node(graph.output).shape == (32, 65)
    assert graph.loss is not None and graph.loss.vocab == 65
    assert graph.node("pos").batched is False and graph.node("tok").batched is True
    again = TransformerGraph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert again == graph
    assert "blocks.1.attn.q" in graph.summary()


def test_residual_inputs_are_the_skip_and_the_branch(example):
    graph = capture(example.CharGPT(65), ids())
    first_block_add = [n for n in graph.of_kind(Add) if "blocks.0.attn.o" in n.inputs]
    assert len(first_block_add) == 1 and first_block_add[0].inputs == ("add", "blocks.0.attn.o")


def test_compile_model_says_the_mapping_is_not_built(example):
    model = example.CharGPT(65)
    with pytest.raises(UsageError, match="transformer .*compiles into fabric phases with wse.host.compiler.gpt_phases.compile_gpt") as info:
        compile_model(model, ids(), config=FabricConfig(width=4, height=4), batch=2)
    assert not isinstance(info.value, UnsupportedModelError)
    assert "\n" not in str(info.value)


def test_gelu_tanh_and_dropout_zero_are_accepted():
    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(10, 8)
            self.fc = nn.Linear(8, 8)
            self.act = nn.GELU(approximate="tanh")
            self.drop = nn.Dropout(0.0)
            self.out = nn.Linear(8, 10)

        def forward(self, x):
            h = self.tok(x)
            return self.out(self.drop(F.dropout(self.act(self.fc(h)), p=0.0)) + h)

    graph = capture(Small(), ids(vocab=10, t=5))
    assert [n.approximate for n in graph.of_kind(GELU)] == ["tanh"]
    assert is_transformer(Small(), ids(vocab=10, t=5)) and is_transformer(Small(), torch.zeros(2, 3))
    assert not is_transformer(nn.Linear(3, 2), torch.zeros(2, 3))
    assert not is_transformer(nn.Linear(3, 2), torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(UsageError, match="example_input must be float32"):
        trace(nn.Linear(3, 2), torch.zeros(2, 3, dtype=torch.int64))


class Bad(nn.Module):
    """Several unsupported pieces at once."""

    def __init__(self, mask: str = "triu"):
        super().__init__()
        self.tok = nn.Embedding(10, 8)
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.mask = mask

    def forward(self, x):
        h = self.drop(self.tok(x))
        q, k, v = (lin(h).view(x.size(0), -1, 2, 4).transpose(1, 2) for lin in (self.q, self.k, self.v))
        s = q @ k.transpose(-2, -1) / 2.0
        if self.mask == "triu":
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).tril(), float("-inf"))
        a = F.softmax(s, dim=-1) @ v
        b = F.scaled_dot_product_attention(q, k, v)
        y = (a + b).transpose(1, 2).reshape(x.size(0), -1, 8)
        out, _ = self.mha(y, y, y)
        return torch.sigmoid(out)


def test_one_error_lists_every_unsupported_piece():
    with pytest.raises(UnsupportedModelError) as info:
        capture(Bad(), ids(vocab=10, t=6))
    text = str(info.value)
    names = [p.name for p in info.value.problems]
    assert "drop" in names and "mha" in names and "masked_fill" in names
    assert "scaled_dot_product_attention" in names and "sigmoid" in names
    assert "dropout p=0.1 while training" in text
    assert "mask is not causal" in text
    assert "is_causal=False" in text
    assert "need_weights=True" in text
    assert text.startswith("model Bad has ") and "supported in a transformer" in text
    assert "test_char_gpt_frontend.py" in text      # each problem names its line


def test_softmax_without_mask_and_eval_dropout():
    model = Bad(mask="none").eval()
    with pytest.raises(UnsupportedModelError) as info:
        capture(model, ids(vocab=10, t=6))
    names = [p.name for p in info.value.problems]
    assert "drop" not in names                        # dropout in eval mode is the identity
    assert any("without a causal mask" in (p.reason or "") for p in info.value.problems)


def test_trace_routes_token_models_and_bad_inputs():
    with pytest.raises(UsageError, match="integer token ids"):
        capture(nn.Embedding(3, 2), torch.zeros(2, 3))
    with pytest.raises(UnsupportedModelError):
        trace(Bad(), ids(vocab=10, t=6))


def test_a_model_failing_on_the_example_is_one_sentence(example):
    with pytest.raises(UsageError, match="fails on example token ids of shape") as info:
        capture(example.CharGPT(65), ids(t=40))      # longer than the position table
    assert "\n" not in str(info.value)


def test_tied_weights_are_named_and_unused_results_ignored():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(10, 8)
            self.head = nn.Linear(8, 10, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, x):
            h = self.tok(x)
            torch.sigmoid(h)                      # computed, never used: ignored
            return self.head(h)

    with pytest.raises(UnsupportedModelError) as info:
        capture(Tied(), ids(vocab=10, t=4))
    assert [p.name for p in info.value.problems] == ["head"]
    assert "shares its weight with tok; tied weights are not supported yet" in str(info.value)


def test_view_with_a_hard_coded_batch_is_named():
    class Fixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(10, 8)
            self.head = nn.Linear(8, 10)

        def forward(self, x):
            return self.head(self.tok(x).view(2, 4, 8))

    with pytest.raises(UnsupportedModelError, match="hard-codes the batch size 2"):
        capture(Fixed(), ids(vocab=10, t=4))
