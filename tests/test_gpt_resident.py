"""A resident GPT step (``host/runtime/gpt_resident.py``, ``docs/transformer.md`` section 11, *Resident
values*) computes on the words the fabric holds, never on the host's copies: the host's values poisoned
after every phase and every attention round's region poisoned before its relayout in leave the step equal
to the functional model; no phase or move disturbs a live value it does not write; and the loss's delta
reaches its slot whatever ranges the phase before it left."""

from __future__ import annotations

import numpy as np

from wse.config import FabricConfig
from wse.host.compiler.gpt_phases import compile_gpt
from wse.host.runtime.gpt_fabric import GptFabric
from wse.host.runtime.transformer_reference import TransformerReference

from test_gpt_fabric import _setup

POISON = np.uint32(0x7FC0DEAD)                  # a NaN no step computes


def _equal(got, want) -> bool:
    return got.loss == want.loss and all(np.array_equal(got.grads[k].view(np.uint32), g.view(np.uint32))
                                         for k, g in want.grads.items())


def _poisoned(value):
    value = np.asarray(value)
    if value.dtype in (np.float32, np.uint32):
        return np.full(value.shape, POISON, dtype=np.uint32).view(value.dtype)
    return value


class _Watched(GptFabric):
    """The step with the host's copies of kept values poisoned after every phase, each attention round's
    region poisoned on the device before its relayout in, and every live slot a phase (or move) does not
    write compared before and after it."""

    def step(self, params, tokens, targets):
        s = self.schedule
        self.order, k = {}, 0
        for p in s.phases:
            if p.kind != "move":
                self.order[p.name], k = k, k + 1
        self.disturbed, self.poisoned_regions = [], 0
        return super().step(params, tokens, targets)

    def _run(self, phase):
        s, memory = self.schedule, self.schedule.memory
        if phase.kind == "host":
            return super()._run(phase)
        if phase.op == "relayout-in":
            tiling = self._tiling(phase)
            cfg = self.config
            self.shared.device.memcpy_h2d(tiling.base, np.full((cfg.height, cfg.width, tiling.top - tiling.base),
                                                               POISON, dtype=np.uint32))
            self.poisoned_regions += 1
        if phase.kind == "move":
            i = s.moves[phase.name].at
            served = next(q for q in s.phases if q.kind != "move" and self.order[q.name] == i)
            written = set(served.outputs) if phase.arg("side") == "out" else set()
        else:
            i, written = self.order[phase.name], set(phase.outputs)
        written = {memory.aliases.get(n, n) for n in written}
        live = [x for x in memory.slots.values() if x.first < i <= x.last and x.value not in written]
        before = {x.value: self.shared.device.memcpy_d2h(x.addr, x.words).copy() for x in live}
        result = super()._run(phase)
        for x in live:
            if not np.array_equal(before[x.value], self.shared.device.memcpy_d2h(x.addr, x.words)):
                self.disturbed.append((phase.name, x.value))
        for name in list(self.values):
            if memory.aliases.get(name, name) in memory.slots:
                self.values[name] = _poisoned(self.values[name])
        return result


def test_the_step_computes_on_the_wafer_not_on_the_hosts_copies():
    graph, params, x, y = _setup(2, seed=3)
    config = FabricConfig(width=2, height=1)
    schedule = compile_gpt(graph, config, 2)
    assert sorted({p.arg("round") for p in schedule.phases if p.op == "relayout-in"}) == [0, 1]
    fabric = _Watched(schedule, "vector")
    got = fabric.step(params, x, y)
    want = TransformerReference(graph, rows=config.height, blocks=schedule.blocks).step(params, x, y)
    assert _equal(got, want)
    assert fabric.disturbed == [] and fabric.poisoned_regions == 4


def test_the_losss_delta_reaches_its_slot_under_any_earlier_ranges():
    """The phase before the loss claims the delta's slot as resident: the loss (a host phase) still writes it."""
    graph, params, x, y = _setup(1, seed=3)
    config = FabricConfig(width=2, height=2)
    schedule = compile_gpt(graph, config, 1)
    names = [p.name for p in schedule.phases]
    loss = next(p for p in schedule.phases if p.op == "loss")
    before = next(n for n in reversed(names[:names.index(loss.name)]) if n in schedule.ranges)
    slot = schedule.memory.slot(loss.outputs[0])
    keep, resident, per_pe = schedule.ranges[before]
    schedule.ranges[before] = (keep, resident + [(slot.addr, slot.addr + slot.words)], per_pe)
    got = GptFabric(schedule, "vector").step(params, x, y)
    want = TransformerReference(graph, rows=config.height, blocks=schedule.blocks).step(params, x, y)
    assert _equal(got, want)
