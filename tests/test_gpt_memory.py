"""The GPT step's memory plan (``host/compiler/gpt_memory.py``, ``docs/transformer.md`` section 11):
every phase's footprint is the least memory its own program accepts, every value kept between phases
has a range above the footprint of every phase of its life and meets no other value live at the same
time, a GPT whose phases and kept values do not fit ``sram_words`` is refused at compile time in one
line that names the model, the phase and the words, and the resident step computes on the words its
move programs leave (``host/compiler/gpt_moves.py``, ``host/runtime/gpt_resident.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from wse.config import FabricConfig, MemoryNeedError, UsageError
from wse.firmware.kernels.embedding_rows import plan_rows
from wse.host.compiler import weight_streaming as ws
from wse.host.compiler.gpt_memory import OFF_WAFER, ROUND_VALUES
from wse.host.compiler.gpt_phases import compile_gpt, kernel_footprint, kernel_plan, linear_executable
from wse.host.runtime.gpt_fabric import GptFabric
from wse.host.runtime.transformer_reference import TransformerReference

from test_gpt_fabric import _setup


@pytest.fixture(scope="module")
def schedule():
    graph, *_ = _setup(2)
    return compile_gpt(graph, FabricConfig(width=4, height=4), 2, cycles=False, resident=False)


@pytest.fixture(scope="module")
def resident():
    graph, *_ = _setup(2)
    return compile_gpt(graph, FabricConfig(width=4, height=4), 2, cycles=False)


def test_every_kept_value_has_a_slot_above_its_phases_and_apart_from_the_others(schedule):
    plan, phases = schedule.memory, schedule.phases
    hosts = {n.name for n in schedule.graph.nodes if n.kind in ("tokens", "positions")}
    assert plan.fits and plan.words <= schedule.config.sram_words
    slots = list(plan.slots.values())
    for s in slots:
        assert s.floor == max(p.footprint for p in phases[s.first:s.last + 1]) <= s.addr, s
        assert s.words > 0 and s.addr + s.words <= plan.words
    for i, a in enumerate(slots):
        for b in slots[i + 1:]:
            if a.first <= b.last and b.first <= a.last:          # live at once: apart in memory
                assert a.addr + a.words <= b.addr or b.addr + b.words <= a.addr, (a, b)
    # every value a device phase reads, written by an earlier phase, is kept
    written = set()
    for i, p in enumerate(phases):
        if p.kind != "host":
            for name in p.inputs:
                root = plan.aliases.get(name, name)
                if root in written and not root.startswith(ROUND_VALUES + OFF_WAFER) and root not in hosts:
                    slot = plan.slot(name)
                    assert slot.first < i <= slot.last, (p.name, name)
        written.update(plan.aliases.get(n, n) for n in p.outputs)
    assert "p:matmul_1" in plan.slots and "xhat:blocks.0.ln1" in plan.slots and "r:ln_f" in plan.slots
    assert not any(n.startswith(ROUND_VALUES + OFF_WAFER) for n in plan.slots)
    for i, p in enumerate(phases):
        assert plan.high[i] >= p.footprint
    assert plan.describe()[0].startswith(f"{len(slots)} values kept between phases")


def test_footprints_are_the_least_memory_each_program_accepts(schedule):
    config = schedule.config
    seen = set()
    for p in schedule.phases:
        if p.kind in ("residual", "layernorm", "gelu") and (p.op, p.footprint) not in seen:
            seen.add((p.op, p.footprint))
            sizes = {"rows": schedule.tokens, "cols": schedule.graph.node(p.node).shape[-1]}
            if p.arg("variant"):
                sizes["variant"] = p.arg("variant")
            assert kernel_footprint(config, p.op, sizes, p.arg("eps")) == p.footprint
            kernel_plan(config.replace(sram_words=p.footprint), p.op, sizes, p.arg("eps"))
            with pytest.raises(MemoryNeedError, match="words per PE") as refused:
                kernel_plan(config.replace(sram_words=p.footprint - 1), p.op, sizes, p.arg("eps"))
            assert refused.value.need == p.footprint
        elif p.kind == "gemm":                            # linear, linear-data, linear-weight: one executable
            k, o, bias = p.arg("k"), p.arg("o"), p.arg("bias") is not None
            linear_executable(config.replace(sram_words=p.footprint), schedule.tokens, k, o, bias, False)
            with pytest.raises(ws.MemoryFitError) as refused:
                linear_executable(config.replace(sram_words=p.footprint - 1), schedule.tokens, k, o, bias, False)
            assert refused.value.need == p.footprint
        elif p.kind == "rows":
            plan_rows(config.replace(sram_words=p.footprint), schedule.tokens, p.arg("features"), p.op[5:])
            with pytest.raises(MemoryNeedError, match="words per PE") as refused:
                plan_rows(config.replace(sram_words=p.footprint - 1), schedule.tokens, p.arg("features"), p.op[5:])
            assert refused.value.need == p.footprint
    assert {op for op, _ in seen} >= {"residual", "layernorm", "layernorm-bwd", "gelu", "gelu-bwd"}


def test_relayout_move_and_round_footprints_are_their_programs_least_memory(schedule, resident):
    """A relayout's footprint (an attention relayout, a token-major copy, a move) is the least ``sram_words``
    ``plan_relayout`` accepts for its words; an attention round's is its region's top, with every round
    program's data below the region's base and its buffers inside the region."""
    from wse.firmware.kernels.relayout import plan_relayout
    from wse.host.compiler.gpt_memory import least_memory
    from wse.host.compiler.gpt_tiles import MATRICES, _region, head_tiling, relayout_in, relayout_out, \
        round_kernel, token_major

    config, words = resident.config, schedule.memory.words           # the moves' tables go above the plan's words

    def tiling(p):
        return head_tiling(config, resident.sequences, p.arg("heads"), p.arg("t"), p.arg("dh"), p.arg("scale"))

    def least(plan, free):
        return least_memory(config, lambda cfg: plan_relayout(cfg, plan.src, plan.dst, free))

    def top(plan):
        return int(max(plan.src[:, 2].max(), plan.dst[:, 2].max())) + 1

    checked = set()
    for p in resident.phases:
        if p.op == "relayout-in":
            t = tiling(p)
            plan = relayout_in(t, p.arg("round"), p.arg("what"))[0]
            assert least(plan, t.top + len(MATRICES) * _region(t)) == p.footprint, p.name
        elif p.op == "relayout-out":
            t = tiling(p)
            plan = relayout_out(t, p.arg("round"), p.arg("what"))[0]
            assert least(plan, t.top + _region(t)) == p.footprint, p.name
        elif p.op == "token-major":
            exe = linear_executable(config, resident.tokens, p.arg("k"), p.arg("o"), p.arg("bias") is not None)
            plan = token_major(config, resident.tokens, p.arg("k"), exe.regions["act1"][0], exe.regions["act1tm"][0])
            assert least(plan, top(plan)) == p.footprint, p.name
        elif p.kind == "move":
            plan = resident.moves[p.name].plan
            assert least(plan, max(words, top(plan))) == p.footprint, p.name
        elif p.kind in ("attention", "softmax"):
            t = tiling(p)
            kernel = round_kernel(t, p.arg("variant"), p.arg("scale"), len(t.rounds[p.arg("round")]))
            assert p.footprint == t.top and kernel.program.data_end <= t.base, p.name
            assert all(t.base <= int(np.min(a)) and int(np.max(a)) < t.top for _, a in t.buffers), p.name
        else:
            continue
        checked.add(p.op)
    assert checked == {"relayout-in", "relayout-out", "token-major", "move", "attention", "softmax"}


def test_a_gpt_that_does_not_fit_is_refused_in_one_line(schedule, resident):
    graph, *_ = _setup(2)
    need = resident.memory.words
    assert need > schedule.memory.words > max(p.footprint for p in schedule.phases)  # kept values, then moves
    # the moves' staging and tables are counted: every move's program fits the plan's words
    moves = [p for p in resident.phases if p.kind == "move"]
    assert len(resident.memory.moves) == len(moves) and max(p.footprint for p in moves) == need
    assert resident.memory.peak_phase.startswith("move-")
    compile_gpt(graph, FabricConfig(width=4, height=4, sram_words=need), 2, cycles=False)
    with pytest.raises(UsageError) as error:
        compile_gpt(graph, FabricConfig(width=4, height=4, sram_words=need - 1), 2, cycles=False)
    message = str(error.value)
    assert isinstance(error.value, MemoryNeedError) and error.value.need == need
    assert "\n" not in message
    assert message.startswith("the GPT CharGPT (1 attention layer(s), d_model 16, 2 heads, context 8, "
                              "vocabulary 16) with 2 sequences does not fit a 4x4 mesh: at phase '")
    assert f"the step needs {need} words per PE, sram_words is {need - 1}; use a smaller batch or a mesh with more rows" \
        in message
    # without the moves the host carries the values: the plan is made but nothing refuses it
    small = compile_gpt(graph, FabricConfig(width=4, height=4, sram_words=schedule.memory.words - 1), 2,
                        cycles=False, resident=False)
    assert not small.memory.fits and not small.moves


def test_a_value_no_phase_writes_is_live_from_its_first_reader():
    from types import SimpleNamespace as Phase
    from wse.host.compiler.gpt_memory import plan_memory
    phases = [Phase(name="a", op="x", inputs=("w",), outputs=("u",), footprint=10),
              Phase(name="b", op="x", inputs=("u",), outputs=("v",), footprint=10),
              Phase(name="c", op="x", inputs=("w", "v"), outputs=(), footprint=10)]
    plan = plan_memory(phases, None, FabricConfig(width=2, height=2), [4], {"w": 4, "u": 4, "v": 4}, [])
    assert (plan.slots["w"].first, plan.slots["w"].last) == (0, 2)
    slots = list(plan.slots.values())
    for i, a in enumerate(slots):                 # w (read by a and c) meets neither u nor v
        for b in slots[i + 1:]:
            if a.first <= b.last and b.first <= a.last:
                assert a.addr + a.words <= b.addr or b.addr + b.words <= a.addr, (a, b)


def test_the_resident_step_computes_on_what_the_moves_left():
    """On one device the host writes none of the words the moves put in place: the step equals the
    functional model, and without one move it does not."""
    graph, params, x, y = _setup(1, seed=3)
    config = FabricConfig(width=2, height=2)
    schedule = compile_gpt(graph, config, 1)
    fabric = GptFabric(schedule, "golden")
    got = fabric.step(params, x, y)
    want = TransformerReference(graph, rows=2, blocks=schedule.blocks).step(params, x, y)
    assert fabric.shared is not None and fabric.shared.skipped > 0
    assert all(np.array_equal(got.grads[k].view(np.uint32), g.view(np.uint32)) for k, g in want.grads.items())
    assert {p.kind for p in schedule.phases} >= {"move"} and schedule.ranges
    # the delta's move into bwd-data head's input region, left out: that phase reads whatever is there
    assert "move-in bwd-data head" in [p.name for p in schedule.phases]
    schedule.phases = [p for p in schedule.phases if p.name != "move-in bwd-data head"]
    broken = GptFabric(schedule, "golden").step(params, x, y)
    assert not np.array_equal(broken.grads["head.weight"].view(np.uint32), want.grads["head.weight"].view(np.uint32)) \
        or not np.array_equal(broken.grads["ln_f.weight"].view(np.uint32), want.grads["ln_f.weight"].view(np.uint32))
