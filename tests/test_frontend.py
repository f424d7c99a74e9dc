"""The PyTorch front end (``trace``) and the layer IR it produces."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wse.config import UsageError
from wse.host.compiler import (Flatten, Graph, Input, Linear, ModelShapeError, ReLU, SoftmaxCrossEntropy,
                               UnsupportedModelError, UntraceableModelError, trace)

THIS_FILE = os.path.basename(__file__)


def line_of(marker: str) -> int:
    """Line number of the one source line of this file ending in ``# <marker>``."""
    with open(__file__) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def run_graph(graph: Graph, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Reference semantics of the IR: execute it with the model's state_dict."""
    for layer in graph.layers[1:]:
        if isinstance(layer, Flatten):
            assert tuple(x.shape[1:]) == layer.input_shape
            x = x.reshape(x.shape[0], -1)
        elif isinstance(layer, Linear):
            bias = state[layer.bias_name] if layer.bias else None
            x = F.linear(x, state[layer.weight_name], bias)
        elif isinstance(layer, ReLU):
            x = torch.relu(x)
        elif isinstance(layer, SoftmaxCrossEntropy):
            break
        assert tuple(x.shape[1:]) == layer.output_shape
    return x


def assert_faithful(model: nn.Module, graph: Graph, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(run_graph(graph, model.state_dict(), x), model(x), rtol=0, atol=0)


# -- models ------------------------------------------------------------------

class FCMnist(nn.Module):
    """The seeds' FC-MNIST: 784-256-256-10 with ReLUs."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 256, bias=bias)
        self.fc2 = nn.Linear(256, 256, bias=bias)
        self.fc3 = nn.Linear(256, 10, bias=bias)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = x.view(x.size(0), -1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(x)  # block-gelu


class ManyUnsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.fc = nn.Linear(2 * 26 * 26, 32)
        self.block = Block()
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.conv(x)  # bad-conv
        x = torch.sigmoid(x)  # bad-sigmoid
        x = x.flatten(1)
        x = self.block(self.fc(x))
        return self.head(x) * 2  # bad-mul


def images(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 1, 28, 28, generator=torch.Generator().manual_seed(batch))


# -- supported models ------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_fc_mnist(bias):
    model = FCMnist(bias)
    graph = trace(model, images())
    assert [type(layer) for layer in graph.layers] == [
        Input, Flatten, Linear, ReLU, Linear, ReLU, Linear, SoftmaxCrossEntropy]
    assert graph.name == "FCMnist"
    assert graph.input.shape == (1, 28, 28)
    assert [(l.in_features, l.out_features, l.bias) for l in graph.linears] == [
        (784, 256, bias), (256, 256, bias), (256, 10, bias)]
    assert [l.name for l in graph.linears] == ["fc1", "fc2", "fc3"]
    assert graph.loss.classes == 10 and graph.loss.reduction == "mean"
    # Parameter names are state_dict keys with their shapes, in forward order.
    state = model.state_dict()
    assert graph.parameters() == {k: tuple(v.shape) for k, v in state.items()}
    assert list(graph.parameters()) == list(state)
    assert graph.parameter_count == sum(p.numel() for p in model.parameters())
    assert graph.linears[0].forward_flops() == 2 * 784 * 256 + (256 if bias else 0)
    # The first layer needs no input gradient; the others do.
    assert graph.linears[0].backward_flops(False) == graph.linears[0].forward_flops()
    assert not graph.needs_input_grad("fc1") and graph.needs_input_grad("fc2")
    assert_faithful(model, graph, images())


def test_nested_sequential_and_module_paths():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(784, 64), nn.ReLU()))
            self.decoder = nn.Sequential(nn.Identity(), nn.Linear(64, 10, bias=False))

        def forward(self, x):
            return self.decoder(self.encoder(x))

    model = Wrapper()
    graph = trace(model, images(), loss=None)
    assert [type(layer) for layer in graph.layers] == [Input, Flatten, Linear, ReLU, Linear]
    assert graph.loss is None and graph.output_shape == (10,)
    assert [l.weight_name for l in graph.linears] == ["encoder.1.0.weight", "decoder.1.weight"]
    assert [l.name for l in graph.linears] == ["encoder.1.0", "decoder.1"]
    assert graph.linears[1].bias_name is None
    assert list(graph.parameters()) == list(model.state_dict())
    assert_faithful(model, graph, images())


def test_top_level_sequential():
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(inplace=True), nn.Linear(16, 10))
    graph = trace(model, images())
    assert list(graph.parameters()) == ["1.weight", "1.bias", "3.weight", "3.bias"]
    assert graph.linears[0].source == "module 1"
    assert_faithful(model, graph, images())


class FunctionalRelus(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(5))

    def forward(self, x):
        x = F.relu(self.layers[0](x))
        x = torch.relu(self.layers[1](x))
        x = self.layers[2](x).relu()
        x = F.relu(self.layers[3](x), inplace=True)
        x = self.layers[4](x)
        x.relu_()  # in place, result not assigned: still the next value of x
        return x


def test_functional_relu_variants():
    model = FunctionalRelus()
    x = torch.randn(3, 16)
    graph = trace(model, x, loss=None)
    assert [type(layer).__name__ for layer in graph.layers[1:]] == ["Linear", "ReLU"] * 5
    assert_faithful(model, graph, x)
    relu_line = line_of("in place, result not assigned: still the next value of x")
    assert graph.layers[-1].source == f"{os.path.relpath(__file__)}:{relu_line} in forward"


FLATTENS = {
    "view_size0": lambda x: x.view(x.size(0), -1),
    "view_size_index": lambda x: x.view(x.size()[0], -1),
    "reshape_shape0": lambda x: x.reshape(x.shape[0], -1),
    "reshape_minus_one": lambda x: x.reshape(-1, 784),
    "view_tuple": lambda x: x.view((x.shape[0], 28 * 28)),
    "torch_reshape": lambda x: torch.reshape(x, (x.size(0), -1)),
    "torch_flatten": lambda x: torch.flatten(x, 1),
    "torch_flatten_kw": lambda x: torch.flatten(x, start_dim=1),
    "method_flatten": lambda x: x.flatten(1),
    "module_flatten": nn.Flatten(),
}


@pytest.mark.parametrize("name", FLATTENS)
def test_flatten_variants(name):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.flat = FLATTENS[name] if isinstance(FLATTENS[name], nn.Module) else None
            self.fc = nn.Linear(784, 10)

        def forward(self, x):
            x = self.flat(x) if self.flat is not None else FLATTENS[name](x)
            return self.fc(x)

    model = Net()
    graph = trace(model, images())
    assert [type(layer) for layer in graph.layers] == [Input, Flatten, Linear, SoftmaxCrossEntropy]
    assert graph.layers[1].input_shape == (1, 28, 28) and graph.layers[1].output_shape == (784,)
    assert_faithful(model, graph, images())


def test_loss_forms():
    model = FCMnist()
    assert trace(model, images(), loss=nn.CrossEntropyLoss(reduction="sum")).loss.reduction == "sum"
    assert trace(model, images(), loss=F.cross_entropy).loss == SoftmaxCrossEntropy(10)
    assert trace(model, images(), loss=None).loss is None


def test_defaulted_forward_arguments_are_specialized():
    class WithMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x, mask=None):
            if mask is not None:
                x = x * mask
            return self.fc(x)

    graph = trace(WithMask(), torch.randn(2, 8))
    assert [type(layer) for layer in graph.layers] == [Input, Linear, SoftmaxCrossEntropy]


def test_trace_leaves_model_and_input_alone():
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 2))
    x = torch.tensor([[-1.0, 2.0, -3.0, 4.0]])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trace(model, x)
    assert x.tolist() == [[-1.0, 2.0, -3.0, 4.0]]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- unsupported models ---------------------------------------------------------------

def test_unsupported_error_lists_every_offender_with_location():
    with pytest.raises(UnsupportedModelError) as info:
        trace(ManyUnsupported(), images())
    err = info.value
    assert isinstance(err, UsageError)
    assert [(p.name, p.target) for p in err.problems] == [
        ("conv", "torch.nn.Conv2d"), ("sigmoid", "torch.sigmoid"),
        ("block.act", "torch.nn.GELU"), ("mul", "operator.mul")]
    message = str(err)
    assert message.splitlines()[0] == (
        "model ManyUnsupported has 4 unsupported operations "
        "(supported: Linear, ReLU, Flatten; loss: softmax cross-entropy):")
    for marker in ("bad-conv", "bad-sigmoid", "block-gelu", "bad-mul"):
        assert f"{THIS_FILE}:{line_of(marker)} in forward" in message, marker
    # The location's path names this very file.
    path = err.problems[0].location.split(":")[0]
    assert os.path.samefile(path, __file__)


def test_unsupported_loss_joins_the_same_error():
    with pytest.raises(UnsupportedModelError) as info:
        trace(ManyUnsupported(), images(), loss=nn.MSELoss())
    assert len(info.value.problems) == 5
    assert str(info.value.problems[-1]) == (
        "loss (torch.nn.MSELoss): given as the loss argument; only softmax cross-entropy is supported")


@pytest.mark.parametrize("loss, reason", [
    (nn.CrossEntropyLoss(label_smoothing=0.1), "label_smoothing=0.1"),
    (nn.CrossEntropyLoss(weight=torch.ones(10)), "class weights"),
    (nn.CrossEntropyLoss(reduction="none"), "reduction='none'"),
    ("mse", "expected 'cross_entropy'"),
    (F.mse_loss, "only softmax cross-entropy"),
])
def test_unsupported_loss_options(loss, reason):
    with pytest.raises(UnsupportedModelError, match="given as the loss argument") as info:
        trace(FCMnist(), images(), loss=loss)
    assert reason in str(info.value)


class Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)

    def forward(self, x):
        y = self.a(x)
        z = self.b(x)  # branch-b
        y = self.c(y)
        y = self.c(y)  # reuse-c
        return torch.cat([y, z], 1)  # branch-cat


def test_branches_and_reuse_are_reported():
    with pytest.raises(UnsupportedModelError) as info:
        trace(Branches(), torch.randn(2, 8), loss=None)
    problems = {p.name: p for p in info.value.problems}
    assert list(problems) == ["b", "c", "cat"]
    assert "not applied in sequence" in problems["b"].reason
    assert problems["b"].location.endswith(f"{THIS_FILE}:{line_of('branch-b')} in forward")
    assert "applies c a second time" in problems["c"].reason
    assert problems["c"].location.endswith(f"{THIS_FILE}:{line_of('reuse-c')} in forward")
    assert problems["cat"].target == "torch.cat"


def test_unassigned_in_place_offender_is_reported_once():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            x = x * 1.0
            x.sigmoid_()  # in-place-sigmoid
            return self.fc(x)

    with pytest.raises(UnsupportedModelError) as info:
        trace(Net(), torch.randn(2, 8))
    assert [(p.name, p.target) for p in info.value.problems] == [
        ("mul", "operator.mul"), ("sigmoid_", "Tensor.sigmoid_")]
    assert info.value.problems[1].location.endswith(f"{THIS_FILE}:{line_of('in-place-sigmoid')} in forward")


def test_float64_parameters_are_reported():
    with pytest.raises(UnsupportedModelError, match="its parameters are torch.float64"):
        trace(FCMnist().double(), images())


def test_tied_weights_are_reported():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    model[2].weight = model[0].weight
    with pytest.raises(UnsupportedModelError, match="shares its weight with 0"):
        trace(model, torch.randn(2, 8))


@pytest.mark.parametrize("forward, reason", [
    (lambda m, x: m.fc(x.view(4, -1)), "hard-codes the batch size 4"),
    (lambda m, x: m.fc(x.reshape(x.size(1), -1)), "is not the batch size"),
    (lambda m, x: m.fc(torch.flatten(x).view(4, 784)), "only flattening each sample"),
    (lambda m, x: m.fc(x.view(x.size(0), 28, 28)), "a Linear layer needs [B, in_features]"),
    (lambda m, x: (m.fc(x.flatten(1)), x), "returns a tuple"),
])
def test_unsupported_shapes_and_outputs(forward, reason):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(784 if "Linear layer" not in reason else 28, 10)

        def forward(self, x):
            return forward(self, x)

    with pytest.raises(UnsupportedModelError) as info:
        trace(Net(), images(), loss=None)
    assert reason in str(info.value)


def test_loss_needs_two_dimensional_logits():
    model = nn.Sequential(nn.Linear(28, 10))
    with pytest.raises(UnsupportedModelError, match=r"needs \[B, in_features\]") as info:
        trace(model, images())
    assert "needs the model output as [B, classes], but it is [B, 1, 28, 10]" in str(info.value)


# -- other user errors ------------------------------------------------------------------

class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent
            x = self.fc(x)
        return x


class LoopsOverBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.stack([self.fc(x[i]) for i in range(len(x))])  # python-len


@pytest.mark.parametrize("model, marker", [(DataDependent(), "data-dependent"), (LoopsOverBatch(), "python-len")])
def test_untraceable_model(model, marker):
    with pytest.raises(UntraceableModelError) as info:
        trace(model, torch.randn(2, 8))
    message = str(info.value)
    assert message.startswith(f"model {type(model).__name__} cannot be traced by torch.fx at ")
    assert f"{THIS_FILE}:{line_of(marker)} in forward" in message
    assert "control flow" in message and "\n" not in message


class Mismatched(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 100)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.fc1(x.flatten(1))
        return self.fc2(x)  # mismatch


def test_mismatched_shapes():
    with pytest.raises(ModelShapeError) as info:
        trace(Mismatched(), images())
    message = str(info.value)
    assert "fc2 (torch.nn.Linear)" in message and "receives [B, 100] but needs [B, 128]" in message
    assert f"{THIS_FILE}:{line_of('mismatch')} in forward" in message


def test_input_of_wrong_rank_for_the_model():
    with pytest.raises(ModelShapeError, match=r"receives \[B, 1, 28, 28\] but needs \[B, 784\]"):
        trace(nn.Sequential(nn.Linear(784, 10)), images())


def test_model_without_linear():
    with pytest.raises(UsageError, match="model Sequential has no Linear layer"):
        trace(nn.Sequential(nn.Flatten(), nn.ReLU()), images(), loss=None)


@pytest.mark.parametrize("model, x, match", [
    (FCMnist(), torch.randn(784), r"example_input must have a batch dimension .* not shape \[784\]"),
    (FCMnist(), torch.randn(2, 784, dtype=torch.float64), "example_input must be float32"),
    (FCMnist(), [[0.0] * 784], "example_input must be a torch.Tensor, not list"),
    ("FCMnist", torch.randn(2, 784), "model must be a torch.nn.Module, not str"),
])
def test_argument_errors(model, x, match):
    with pytest.raises(UsageError, match=match):
        trace(model, x)


def test_required_extra_forward_argument():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, y):
            return self.fc(x + y)

    with pytest.raises(UsageError, match="takes extra required arguments y"):
        trace(TwoInputs(), torch.randn(2, 4))


# -- the IR itself --------------------------------------------------------------------

def test_ir_round_trip_through_json():
    graph = trace(FCMnist(bias=False), images())
    graph.annotate("weight_streaming", "fc1", rows=4, order=[0, 1])
    graph.annotate("pipelined", "fc2", region=[0, 0, 2, 3])
    data = json.loads(json.dumps(graph.to_dict()))
    again = Graph.from_dict(data)
    assert again == graph
    assert again.to_dict() == graph.to_dict()
    assert again.annotation("pipelined", "fc2") == {"region": [0, 0, 2, 3]}
    assert again.annotation("pipelined", "fc1") == {}
    assert [l.source for l in again.layers] == [l.source for l in graph.layers]
    again.annotate("pipelined", "fc1", rows=1)
    assert again != graph


def test_ir_built_by_hand_and_summary():
    graph = Graph([Input((784,)), Linear(784, 32, True, "l1.weight", "l1.bias"), ReLU((32,)),
                   ReLU((32,)), Linear(32, 10, False, "l2.weight"), SoftmaxCrossEntropy(10, "sum")],
                  name="Tiny")
    assert [layer.name for layer in graph] == ["input", "l1", "relu", "relu_1", "l2", "loss"]
    assert graph.parameters() == {"l1.weight": (32, 784), "l1.bias": (32,), "l2.weight": (10, 32)}
    assert graph.forward_flops() == (2 * 784 * 32 + 32) + 32 + 32 + 2 * 32 * 10 + (4 * 10 + 2)
    # Nothing trainable precedes l1, so it computes no input gradient.
    assert graph.backward_flops() == (2 * 784 * 32 + 32) + 32 + 32 + 4 * 32 * 10 + (10 + 1)
    lines = graph.summary().splitlines()
    assert lines[0].startswith("Tiny: 6 layers, 25,440 parameters")
    assert any(line.split()[:3] == ["1", "l1", "Linear(784,"] and "[B, 784]" in line for line in lines)
    assert lines[-1].split() == ["total", "25,440", f"{graph.forward_flops():,}", f"{graph.backward_flops():,}"]


@pytest.mark.parametrize("layers, match", [
    ([Linear(4, 4, True, "w", "b")], "must start with an Input layer"),
    ([Input((4,)), Linear(5, 4, False, "l.weight")], r"layer 'l' takes \[B, 5\] but 'input' produces \[B, 4\]"),
    ([Input((4,)), SoftmaxCrossEntropy(4), ReLU((4,))], "must be the last layer"),
    ([Input((4,)), ReLU((4,), name="a"), ReLU((4,), name="a")], "'a' appears twice"),
    ([Input((4,)), Linear(4, 4, False, "w", name="a"), Linear(4, 4, False, "w", name="b")],
     "'w' belongs to two layers"),
])
def test_graph_rejects_invalid_chains(layers, match):
    with pytest.raises(UsageError, match=match):
        Graph(layers)


@pytest.mark.parametrize("make, match", [
    (lambda: Linear(0, 4, False, "w"), "Linear in_features must be a positive integer, not 0"),
    (lambda: Linear(4, 4, True, "w"), "needs a bias_name"),
    (lambda: Linear(4, 4, False, "w", "b"), "must have bias_name None"),
    (lambda: Input((28, -1)), "shape dimension must be a positive integer, not -1"),
    (lambda: SoftmaxCrossEntropy(10, "none"), "reduction must be 'mean' or 'sum'"),
])
def test_layer_arguments_are_checked(make, match):
    with pytest.raises(UsageError, match=match):
        make()


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(format="onnx"), "must have format 'wse-layer-ir', not 'onnx'"),
    (lambda d: d.update(version=99), "version must be 1, not 99"),
    (lambda d: d["layers"][1].update(kind="conv"), "layer kind must be one of"),
    (lambda d: d["layers"][1].update(stride=2), r"unknown fields \['stride'\]"),
    (lambda d: d["layers"][1].pop("in_features"), "is incomplete"),
    (lambda d: d["layers"].pop(1), r"takes \[B, 2\] but 'input' produces \[B, 4\]"),
])
def test_from_dict_rejects_malformed_data(mutate, match):
    data = Graph([Input((4,)), Linear(4, 2, True, "w", "b"), ReLU((2,))]).to_dict()
    mutate(data)
    with pytest.raises(UsageError, match=match):
        Graph.from_dict(data)


def test_annotations_are_checked():
    graph = Graph([Input((4,)), Linear(4, 2, True, "fc.weight", "fc.bias")])
    with pytest.raises(UsageError, match="has no layer 'nope'"):
        graph.annotate("pipelined", "nope", rows=1)
    with pytest.raises(TypeError, match="JSON-able"):
        graph.annotate("pipelined", "fc", rows=object())
    graph.annotate("pipelined", "fc", rows=1)
    graph.annotate("pipelined", "fc", cols=2)
    assert graph.annotation("pipelined", "fc") == {"rows": 1, "cols": 2}
    assert graph.modes == ("pipelined",)
    graph.clear_annotations("pipelined")
    assert graph.modes == ()
