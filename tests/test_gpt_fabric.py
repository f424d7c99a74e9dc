"""The GPT training step as fabric phases (``host/compiler/gpt_phases.py``,
``host/runtime/gpt_fabric.py``, ``docs/transformer.md`` section 11): a
one-layer transformer's whole step (forward, loss, backward: every
parameter's gradient) on the golden model equals the functional model
``TransformerReference`` on the same layout bit for bit, and every device
run of every phase takes exactly the static cycle model's cycles (the
relayouts of the heads' operands and results and MemoryX's embedding rows
included: only the host's phases have no device cycles); the same on
Verilator (a tiny mesh) and, slow, on Icarus."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from wse.config import FabricConfig, UsageError
from wse.firmware.kernels import residual as residual_kernel
from wse.host.compiler.gpt_phases import KINDS, compile_gpt, rows_cycles
from wse.host.compiler.replay import Network, replay
from wse.host.compiler.transformer_capture import capture
from wse.host.runtime.gpt_fabric import GptFabric
from wse.host.runtime.transformer_reference import TransformerReference
from wse.sim.runner import run_kernel


def _example():
    spec = importlib.util.spec_from_file_location("_char_gpt_fabric", Path(__file__).resolve().parents[1]
                                                  / "examples" / "char_gpt.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def _setup(sequences: int, seed: int = 0, attention: str = "manual", approximate: str = "none"):
    example = _example()
    torch.manual_seed(seed)
    model = example.CharGPT(16, layers=1, d_model=16, heads=2, context=8, attention=attention)
    if approximate != "none":
        model.blocks[0].gelu = torch.nn.GELU(approximate=approximate)
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 16, (sequences, 8)), rng.integers(0, 16, (sequences, 8))
    graph = capture(model, torch.from_numpy(x))
    params = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return graph, params, x, y


def _check_step(graph, params, x, y, cfg: FabricConfig, device: str) -> None:
    """Every fabric phase's bits and cycles against the reference. The loss, its delta and the
    embedding tables' row sums are host code shared with the reference (MemoryX's work), so their
    own comparison cannot fail; everything they read and feed runs on the device."""
    schedule = compile_gpt(graph, cfg, x.shape[0])
    got = GptFabric(schedule, device).step(params, x, y)
    want = TransformerReference(graph, rows=cfg.height, blocks=schedule.blocks).step(params, x, y)
    assert got.loss == want.loss
    assert np.array_equal(got.logits.view(np.uint32), want.logits.view(np.uint32))
    assert got.grads.keys() == want.grads.keys() == set(params)
    for name, grad in want.grads.items():
        assert got.grads[name].shape == grad.shape, name
        assert np.array_equal(got.grads[name].view(np.uint32), grad.view(np.uint32)), name
    ran = 0
    for phase in schedule.phases:
        runs = got.cycles[phase.name]
        if phase.kind == "host":
            assert runs == [] and phase.cycles == 0, phase.name
            continue
        assert phase.cycles > 0 and runs == [phase.cycles] * phase.runs, (phase.name, phase.cycles, runs)
        ran += len(runs)
        if phase.kind in ("gemm", "attention"):    # the PEs' own fmac counters
            assert got.fmacs[phase.name] == phase.fmacs * phase.runs, (phase.name, got.fmacs[phase.name])
    assert ran == sum(p.runs for p in schedule.phases if p.kind != "host")
    assert {p.op for p in schedule.phases if p.kind == "host"} <= {"embedding", "embedding-grad", "loss", "view",
                                                                   "view-bwd"}
    assert schedule.cycles() == sum(p.cycles * p.runs for p in schedule.phases)


@pytest.mark.parametrize("sequences,width,height", [(2, 4, 4), (1, 3, 2), (3, 2, 2)])
def test_golden_step_equals_the_functional_model_bit_for_bit(sequences, width, height):
    """(3, 2, 2): 12 tokens per column, two token passes of the streamed GEMMs (8 per pass at most),
    and 6 attention instances on 4 one-PE tiles: two rounds. (2, 4, 4): 4 instances on 2x2 tiles at
    once; (1, 3, 2): 2 on 3x1 tiles."""
    graph, params, x, y = _setup(sequences)
    _check_step(graph, params, x, y, FabricConfig(width=width, height=height), "golden")


def test_sdpa_and_tanh_gelu_forms_on_golden():
    graph, params, x, y = _setup(1, seed=2, attention="sdpa", approximate="tanh")
    _check_step(graph, params, x, y, FabricConfig(width=2, height=2), "golden")


def test_verilator_step_equals_the_functional_model():
    graph, params, x, y = _setup(1, seed=1)
    _check_step(graph, params, x, y, FabricConfig(width=2, height=2), "verilator")


@pytest.mark.slow
def test_icarus_step_equals_the_functional_model():
    graph, params, x, y = _setup(1, seed=1)
    _check_step(graph, params, x, y, FabricConfig(width=2, height=2), "icarus")


def test_schedule_phases_and_kinds():
    graph, _, _, _ = _setup(2)
    cfg = FabricConfig(width=4, height=4)
    schedule = compile_gpt(graph, cfg, 2)
    kinds = schedule.by_kind()
    assert set(kinds) == set(KINDS)
    assert all(kinds[k]["cycles"] > 0 for k in KINDS if k != "host") and kinds["host"]["cycles"] == 0
    assert sum(k["cycles"] for k in kinds.values()) == schedule.cycles()
    names = [p.name for p in schedule.phases]
    assert len(names) == len(set(names))
    # every linear layer has its three streamed-GEMM phases, the attention its eight kernels per (sequence, head)
    linears = [n.name for n in graph.nodes if n.kind == "token_linear"]
    for name in linears:
        assert {f"fwd {name}", f"bwd-data {name}", f"bwd-weight {name}"} <= set(names)
        # the weight gradient reads the input's token-major copy, made on the fabric just before it
        copy = names.index(f"token-major {name}")
        weight = names.index(f"bwd-weight {name}")
        assert copy < weight and all(schedule.phases[i].kind == "move" for i in range(copy + 1, weight))
        assert schedule.phases[copy].kind == "relayout" and schedule.phases[copy].cycles > 0
        assert schedule.phases[weight].inputs[0] == schedule.phases[copy].outputs[0]
    # resident: a move before every device phase that reads kept values, one after every one that writes them
    moves = [p for p in schedule.phases if p.kind == "move"]
    assert len(moves) == len(schedule.moves) > 0 and all(p.cycles > 0 for p in moves)
    for i, p in enumerate(schedule.phases):
        if p.kind == "move":
            served = names.index(p.name.split(" ", 1)[1])
            assert served == (i + 1 if p.arg("side") == "in" else i - 1), p.name
    assert f"move-in fwd {linears[0]}" in names and f"move-out fwd {linears[0]}" in names
    assert "move-out softmax-forward matmul_1 r0" in names and "move-in softmax-backward matmul_1 r0" in names
    # 2 sequences x 2 heads side by side on 2x2 tiles: one round of eight kernels, each one device run;
    # the relayouts: q, k, v in and the output back; dout, q, k, v in and dv, dq, dk back
    attention = [p for p in schedule.phases if p.kind in ("attention", "softmax")]
    assert len(attention) == 8 and all(p.runs == 1 for p in attention)
    assert sum(p.fmacs for p in attention) == 6 * 4 * (8 * 9 // 2) * 8
    relayouts = [p.name for p in schedule.phases if p.kind == "relayout" and p.op != "token-major"]
    assert relayouts == ["relayout-in matmul_1 r0 q+k+v", "relayout-out matmul_1 r0 values",
                         "relayout-in matmul_1 r0 dout+q+k+v", "relayout-out matmul_1 r0 backward-dv",
                         "relayout-out matmul_1 r0 backward-dq", "relayout-out matmul_1 r0 backward-dk"]
    assert [p.name for p in schedule.phases if p.kind == "rows"] == ["rows tok", "rows pos",
                                                                      "rows-grad pos", "rows-grad tok"]
    # the forward before the loss, the backward after it
    assert names.index("fwd head") < names.index("loss") < names.index("bwd-data head")
    assert schedule.blocks == [4, 4, 4, 4]
    # 16 tokens x 16 features on 4x4: 4 words per PE, each row's west and east halves 8 words each;
    # pinned (the golden model's cycles equal it in _check_step)
    assert rows_cycles(cfg, 16, 16, "in") == 60


def test_residual_kernel_bits_and_mirror():
    for width, height, rows, cols in ((4, 4, 16, 32), (3, 2, 5, 7), (2, 2, 1, 3)):
        cfg = FabricConfig(width=width, height=height)
        report = run_kernel("residual", cfg, seed=1, rows=rows, cols=cols)
        kernel = residual_kernel.Residual()
        plan = kernel.plan(cfg, kernel.resolve(cfg, {"rows": rows, "cols": cols}))
        _, ops, starts, ends, _ = residual_kernel.timing_ops(plan)
        assert report["bit_exact"] and report["cycles"] == replay(Network(cfg, []), ops, starts, ends, {},
                                                                  periods=False)


def test_step_refuses_a_batch_of_another_shape_and_a_graph_without_loss():
    graph, params, x, y = _setup(1)
    schedule = compile_gpt(graph, FabricConfig(width=2, height=2), 1, cycles=False)
    with pytest.raises(ValueError, match="the schedule runs 1 sequences of 8 tokens"):
        GptFabric(schedule).step(params, np.concatenate([x, x]), np.concatenate([y, y]))
    with pytest.raises(UsageError, match=r"every token id must be an integer in 0\.\.15, not int64 values in -1\.\.\d+"):
        GptFabric(schedule).step(params, np.where(x == x[0, 0], -1, x), y)
    with pytest.raises(UsageError, match=r"every target id must be an integer in 0\.\.15, not int64 values in \d+\.\.16"):
        GptFabric(schedule).step(params, x, np.where(y == y[0, 0], 16, y))
    with pytest.raises(UsageError, match="sequences must be a positive integer"):
        compile_gpt(graph, FabricConfig(width=2, height=2), 0)
    no_loss = capture(_example().CharGPT(16, layers=1, d_model=16, heads=2, context=8), torch.from_numpy(x),
                      loss=None)
    with pytest.raises(UsageError, match="has no loss"):
        compile_gpt(no_loss, FabricConfig(width=2, height=2), 1)


def test_a_linear_layer_that_does_not_fit_names_the_gpt_layer():
    graph, _, x, _ = _setup(2)
    with pytest.raises(UsageError, match=r"the GPT's linear layer blocks\.0\.attn\.\w+ \(16 -> 16\) over 16 tokens "
                                         r"\(2 sequences of 8\) does not fit a 1x1 mesh: its streamed GEMM needs \d+ "
                                         r"words per PE, sram_words is 1536"):
        compile_gpt(graph, FabricConfig(width=1, height=1, sram_words=1536), 2, cycles=False)



@pytest.mark.parametrize("mesh,sram,what", [
    ((1, 1), 256, r"embedding tok \(16 features, rows in\)"),
    ((1, 1), 512, r"residual of 16 features"),
    ((1, 1), 1024, r"layernorm of 16 features"),
    ((4, 4), 768, r"attention relayout-in matmul_1 r0 q\+k\+v \(2 heads of 8 x 8\)")])
def test_rows_and_relayouts_that_do_not_fit_name_the_gpt(mesh, sram, what):
    graph, _, _, _ = _setup(2)
    cfg = FabricConfig(width=mesh[0], height=mesh[1], sram_words=sram)
    with pytest.raises(UsageError, match=rf"^the GPT's {what} over 16 tokens \(2 sequences of 8\) does not fit a "
                                         rf"{cfg.mesh} mesh: it needs \d+ words per PE, sram_words is {sram}; use a "
                                         rf"smaller batch or a wider mesh$"):
        compile_gpt(graph, cfg, 2, cycles=False)


def test_vector_step_equals_the_functional_model():
    graph, params, x, y = _setup(1, seed=3)
    _check_step(graph, params, x, y, FabricConfig(width=2, height=2), "vector")


def test_a_run_whose_cycles_differ_from_the_static_model_is_refused():
    """The step compares every device run with the static cycle model as it goes."""
    import dataclasses
    graph, params, x, y = _setup(1)
    schedule = compile_gpt(graph, FabricConfig(width=2, height=2), 1)
    first = next(i for i, p in enumerate(schedule.phases) if p.cycles)
    phase = schedule.phases[first]
    schedule.phases[first] = dataclasses.replace(phase, cycles=phase.cycles + 1)
    with pytest.raises(RuntimeError, match=rf"phase {phase.name!r} took \[{phase.cycles}\] device cycles but the "
                                           rf"static cycle model gives \[{phase.cycles + 1}\]"):
        GptFabric(schedule).step(params, x, y)
