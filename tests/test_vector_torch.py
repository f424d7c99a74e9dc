"""The vectorized model's parts on torch equal their numba forms bit for bit.

The router step (``sim/vector/torch_routers.py``) against ``VectorRouters.decide`` / ``finish``
cycle after cycle: FIFOs, PE input and output queues, hops, woken PEs, edge streams and the
wavelets that leave the mesh, on random routes and contents of square, non-square and one-row
meshes. The PE parts (``torch_scalar.py``, ``torch_queues.py``, ``torch_tasks.py``,
``torch_decode.py``, ``torch_vector.py``) against ``scalar.scalar_kernel``, ``veck.send_recv``,
``VectorFabric._select_tasks`` and the ``veck`` decoding, check and vector kernels on random
groups of PEs. Marked
``gpu``: the same on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wse.config import FabricConfig, Port
from wse.sim.vector.routers import VectorRouters
from wse.sim.vector.state import PeState
from wse.sim.vector.torch_routers import TorchRouters

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]
PORTS = [Port.N, Port.E, Port.S, Port.W, Port.RAMP]


def random_mesh(width, height, colors, seed, depth=2, rx_depth=2, tx_depth=2):
    """A :class:`VectorRouters` with random routes, FIFO contents, PE queues and edge streams."""
    cfg = FabricConfig(width=width, height=height, colors=colors, router_depth=depth, rx_depth=rx_depth,
                       tx_depth=tx_depth)
    rng = np.random.default_rng(seed)
    pes = PeState(cfg)
    routers = VectorRouters(cfg, pes)
    n = width * height
    for r in range(n):
        for c in range(colors):
            if rng.random() < 0.9:               # outputs shared between colors: grants contend
                source = rng.integers(-1, 5)
                outputs = [PORTS[i] for i in rng.permutation(5)[:rng.integers(1, 3)]]
                routers.set_route(r % width, r // width, c, None if source < 0 else PORTS[source], outputs)
    routers.count[:] = np.minimum(depth, rng.integers(0, depth + 3, routers.count.shape))
    routers.head[:] = rng.integers(0, depth, routers.head.shape)
    routers.data[:] = rng.integers(0, 2**32, routers.data.shape, dtype=np.uint32)
    routers.ctrl[:] = rng.integers(0, 2, routers.ctrl.shape)
    slots = pes.rdata.shape[2]
    pes.rcount[:] = rng.integers(0, rx_depth + 1, pes.rcount.shape)
    pes.rhead[:] = rng.integers(0, slots, pes.rhead.shape)
    tslots = pes.tdata.shape[1]
    pes.tcount[:] = rng.integers(0, tslots + 1, n)
    pes.thead[:] = rng.integers(0, tslots, n)
    pes.tcolor[:] = rng.integers(0, colors, pes.tcolor.shape)
    pes.tdata[:] = rng.integers(0, 2**32, pes.tdata.shape, dtype=np.uint32)
    pes.tctrl[:] = rng.integers(0, 2, pes.tctrl.shape)
    edges = [("N", width), ("S", width), ("W", height), ("E", height)]
    for _ in range(6):
        edge, size = edges[rng.integers(0, 4)]
        wavelets = [(int(rng.integers(0, 2**32)), int(rng.integers(0, 2))) for _ in range(rng.integers(1, 9))]
        routers.queue_edge(edge, int(rng.integers(0, size)), int(rng.integers(0, colors)), wavelets)
    return routers, pes, rng


def drain(pes, torch_routers, keep):
    """The PEs take the heads of the input queues where ``keep`` is False (both models alike)."""
    take = (pes.rcount > 0) & ~keep
    pes.rhead[take] = (pes.rhead[take] + 1) % pes.rdata.shape[2]
    pes.rcount[take] -= 1
    t = torch.from_numpy(take).to(torch_routers.device)
    torch_routers.rhead = torch.where(t, (torch_routers.rhead + 1) % pes.rdata.shape[2], torch_routers.rhead)
    torch_routers.rcount = torch_routers.rcount - t.to(torch.int64)


def assert_same_state(routers, pes, torch_routers, cycle):
    got = torch_routers.state()
    for name in ("data", "ctrl", "head", "count"):
        assert np.array_equal(got[name], getattr(routers, name)), (cycle, name)
    for name in ("rdata", "rctrl", "rhead", "rcount", "tdata", "tcolor", "tctrl", "thead", "tcount"):
        assert np.array_equal(got[name], getattr(pes, name)), (cycle, name)
    assert got["hops"] == routers.hops, cycle
    assert np.array_equal(got["stream_left"], routers.stream_left), cycle
    assert np.array_equal(got["stream_pos"], routers.stream_pos), cycle


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh", [(4, 4, 3), (5, 3, 4), (7, 1, 2), (1, 6, 3), (1, 1, 2), (6, 5, 8)])
@pytest.mark.parametrize("seed", [0, 1])
def test_router_step_equals_the_numba_kernels(device, mesh, seed):
    width, height, colors = mesh
    routers, pes, rng = random_mesh(width, height, colors, seed)
    routers.begin_run()
    ours = TorchRouters(routers, device)
    moved = 0
    for cycle in range(40):
        first = cycle % colors
        routers.decide(first)
        woken = routers.finish()
        got = ours.step(first).cpu().numpy()
        assert sorted(set(woken.tolist())) == np.flatnonzero(got).tolist(), cycle
        moved += len(woken)
        assert_same_state(routers, pes, ours, cycle)
        drain(pes, ours, rng.random(pes.rcount.shape) < 0.5)
    assert moved + routers.hops > 0                   # wavelets moved
    assert ours.edge_outputs() == {key: list(value) for key, value in routers.edge_out.items()}
    routers.end_run()


@pytest.mark.parametrize("device", DEVICES)
def test_streaming_mesh_moves_every_wavelet_like_the_numba_kernels(device):
    """Every color flowing west to east from full FIFOs and edge streams: the busy steady state."""
    width, height, colors = 9, 3, 4
    cfg = FabricConfig(width=width, height=height, colors=colors)
    pes = PeState(cfg)
    routers = VectorRouters(cfg, pes)
    for r in range(width * height):
        for c in range(colors):
            routers.set_route(r % width, r // width, c, Port.W, [Port.E] + ([Port.RAMP] if c == 0 else []))
    routers.count[:] = cfg.router_depth
    routers.data[:] = np.arange(routers.data.size, dtype=np.uint32).reshape(routers.data.shape)
    for y in range(height):
        for c in range(colors):
            routers.queue_edge("W", y, c, [(1000 * y + 10 * c + i, i % 2) for i in range(5)])
    routers.begin_run()
    ours = TorchRouters(routers, device)
    for cycle in range(60):
        routers.decide(cycle % colors)
        routers.finish()
        ours.step(cycle % colors)
        assert_same_state(routers, pes, ours, cycle)
        drain(pes, ours, np.zeros(pes.rcount.shape, dtype=bool))
    assert ours.edge_outputs() == {key: list(value) for key, value in routers.edge_out.items()}
    assert sum(len(v) for v in routers.edge_out.values()) > 0
    routers.end_run()


def vector_group(rng, pes_total, group, words, fmacw=False):
    """Random decoded memory vector instructions for ``group`` distinct PEs: operations, in-range
    operands with strides of either sign (often overlapping), random memory and registers."""
    from wse.sim.vector.fpk import VOPS

    pes = rng.permutation(pes_total)[:group].astype(np.int64)
    vop = rng.integers(0, VOPS["fmacw"], group).astype(np.int64)     # fmov .. fsum
    n = rng.integers(0, 9, group).astype(np.int64)
    kind = np.where(rng.random((group, 3)) < 0.8, 0, -1).astype(np.int64)
    stride = rng.integers(-2, 3, (group, 3)).astype(np.int64)
    ln = rng.integers(1, 5, (group, 3)).astype(np.int64)
    span = np.maximum(n - 1, 0)[:, None] if not fmacw else np.maximum(np.minimum(ln, n[:, None]) - 1, 0)
    if fmacw:
        chunks = (n + np.maximum(np.minimum(ln[:, 0], ln[:, 1]), 1) - 1) // np.maximum(np.minimum(ln[:, 0], ln[:, 1]), 1)
        span[:, 2] = np.maximum(chunks - 1, 0)
    low = np.maximum(0, -stride * span)
    high = words - 1 - np.maximum(0, stride * span)
    base = (low + rng.random((group, 3)) * (high - low + 1)).astype(np.int64)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0x00000001, 0x3F800000,
                         0x1E3CE508, 0x9E3CE508], dtype=np.uint32)     # ... and +-1e-20: products underflow
    mem = rng.standard_normal((pes_total, words)).astype(np.float32).view(np.uint32)
    special = rng.random(mem.shape) < 0.25
    mem[special] = rng.choice(specials, size=int(special.sum()))
    regs = rng.standard_normal((pes_total, 8)).astype(np.float32).view(np.uint32)
    scalar = rng.standard_normal(group).astype(np.float32).view(np.uint32)
    rd = rng.integers(0, 8, group).astype(np.int64)
    return pes, vop, kind, base, stride, n, scalar, rd, ln, mem, regs


def _on(values, device):
    values = np.array(values, copy=True, order="C")         # never the numba side's buffer
    return torch.from_numpy(values.view(np.int32) if values.dtype == np.uint32 else values).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_memory_vector_instructions_equal_the_numba_kernels(device, seed):
    from wse.sim.vector import veck
    from wse.sim.vector.torch_vector import memory_elements, memory_fmacw

    rng = np.random.default_rng(seed)
    pes, vop, kind, base, stride, n, scalar, rd, ln, mem, regs = vector_group(rng, 40, 25, 24)
    mem_t, regs_t = _on(mem, device), _on(regs, device)
    veck.memory_elements(pes, vop, kind, base, stride, n, scalar, rd, mem, regs)
    memory_elements(*(_on(a, device) for a in (pes, vop, kind, base, stride, n, scalar, rd)), mem_t, regs_t)
    assert np.array_equal(mem_t.cpu().numpy().view(np.uint32), mem)
    assert np.array_equal(regs_t.cpu().numpy().view(np.uint32), regs)
    pes, _, _, base, stride, n, _, _, ln, mem, _ = vector_group(rng, 40, 25, 24, fmacw=True)
    mem_t = _on(mem, device)
    veck.memory_fmacw(pes, base, ln, stride, n, mem)
    memory_fmacw(*(_on(a, device) for a in (pes, base, ln, stride, n)), mem_t)
    assert np.array_equal(mem_t.cpu().numpy().view(np.uint32), mem)


def scalar_programs(rng, pes_total, rows=240, words=128, registers=8, dsds=4, tasks=4):
    """A random code table of mostly scalar instructions (a few vector and unassembled rows),
    PEs at random places in it with random registers, memory, task tables and clocks."""
    from wse.firmware.isa import BY_OPCODE
    from wse.sim.vector.code import K_BAD, K_SCALAR, K_VECTOR
    from wse.sim.vector.scalar import SOP_OF

    scalar_ops = np.array([op for op in BY_OPCODE if SOP_OF[op] >= 0])
    pick = rng.random(rows)
    code = {"op": rng.choice(scalar_ops, rows), "kind": np.full(rows, K_SCALAR)}
    code["kind"][pick > 0.93] = K_VECTOR
    code["op"][pick > 0.93] = 40
    code["kind"][pick > 0.998], code["op"][pick > 0.998] = K_BAD, -1
    code["kind"][29::30], code["op"][29::30] = K_VECTOR, 40          # each 30-row program ends in one
    for name, high in (("rd", registers), ("ra", registers), ("rb", registers), ("rs", registers), ("dd", dsds),
                       ("task", tasks), ("cycles", 3)):
        code[name] = rng.integers(0, high, rows)
    code["cycles"] += 1
    code["imm"] = np.where(rng.random(rows) < 0.9, rng.integers(0, 40, rows), rng.integers(-70000, 70000, rows))
    code["task"][rng.random(rows) < 0.01] = tasks                    # rarely a task that does not exist
    code["target"] = np.where(rng.random(rows) < 0.99, rng.integers(0, 10, rows), 40)
    memory = np.isin(code["op"], [op for op in BY_OPCODE if BY_OPCODE[op].name in ("ld", "st", "ldsd")])
    code["ra"][memory & (rng.random(rows) < 0.9)] = 0                 # r0 (always 0) + immediate: in memory
    code = {k: v.astype(np.int64) for k, v in code.items()}
    state = {"base": 30 * rng.integers(0, rows // 30, pes_total), "ncode": np.full(pes_total, 30)}
    state["pc"] = rng.integers(0, 8, pes_total)
    state["time"] = rng.integers(0, 10, pes_total)
    state["instructions"] = np.zeros(pes_total)
    state = {k: v.astype(np.int64) for k, v in state.items()}
    regs = np.where(rng.random((pes_total, registers)) < 0.7, rng.integers(0, 40, (pes_total, registers)),
                    rng.integers(0, 2**32, (pes_total, registers))).astype(np.uint32)
    regs[:, 0] = 0
    floats = rng.random(regs.shape) < 0.05
    floats[:, 0] = False
    regs[floats] = rng.choice(np.float32([1.5, -2.25, 1e-30, 3e9, -0.0]), int(floats.sum())).view(np.uint32)
    state.update(regs=regs, mem=rng.integers(0, 2**32, (pes_total, words), dtype=np.uint64).astype(np.uint32),
                 entry=np.where(rng.random((pes_total, tasks)) < 0.97, 3, -1).astype(np.int64),
                 activated=rng.random((pes_total, tasks)) < 0.5, blocked=rng.random((pes_total, tasks)) < 0.5)
    for name in ("dsd_kind", "dsd_base", "dsd_len", "dsd_stride"):
        state[name] = rng.integers(0, 5, (pes_total, dsds)).astype(np.int64)
    return code, state


_SCALAR_STATE = ("regs", "mem", "dsd_kind", "dsd_base", "dsd_len", "dsd_stride", "activated", "blocked", "entry",
                 "pc", "time", "instructions")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(16))     # 6 and 13 run without a fault, the others end in one
def test_scalar_instructions_equal_the_numba_kernel(device, seed):
    from wse.sim.vector import scalar
    from wse.sim.vector.torch_scalar import scalar_kernel

    rng = np.random.default_rng(seed)
    code, state = scalar_programs(rng, 30)
    pes = rng.permutation(30)[:20].astype(np.int64)
    limit = 70
    ours = {name: _on(value, device) for name, value in state.items()}
    table = {name: _on(value, device) for name, value in code.items()}
    stopped = np.empty(pes.size, dtype=np.int64)
    j, kind, value, k = scalar.scalar_kernel(
        pes, limit, state["base"], state["ncode"], code["kind"], scalar.SOP_OF, code["op"], code["rd"], code["ra"],
        code["rb"], code["imm"], code["rs"], code["target"], code["task"], code["dd"], code["cycles"],
        *(state[name] for name in _SCALAR_STATE), stopped)
    got = scalar_kernel(
        _on(pes, device), limit, ours["base"], ours["ncode"], table["kind"], _on(scalar.SOP_OF, device), table["op"],
        table["rd"], table["ra"], table["rb"], table["imm"], table["rs"], table["target"], table["task"], table["dd"],
        table["cycles"], *(ours[name] for name in _SCALAR_STATE))
    assert got[:3] == (j, kind, value)
    checked = pes if j < 0 else pes[:j + 1]          # after a fault the numba kernel stops at that PE
    for name in _SCALAR_STATE:
        mine = ours[name].cpu().numpy()
        mine = mine.view(np.uint32) if state[name].dtype == np.uint32 else mine
        assert np.array_equal(mine[checked], state[name][checked]), name
    if j < 0:
        assert got[3].cpu().numpy().tolist() == stopped[:k].tolist()
    assert state["instructions"][checked].sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_send_and_recv_equal_the_numba_kernel(device, seed):
    from wse.firmware.isa import BY_NAME
    from wse.sim.vector import veck
    from wse.sim.vector.torch_queues import send_recv

    rng = np.random.default_rng(seed)
    n, colors, rx_depth, tx_depth, rows = 30, 4, 2, 2, 50
    sendc = BY_NAME["sendc"].opcode
    code = {"op": rng.choice([BY_NAME["send"].opcode, sendc, BY_NAME["recv"].opcode], rows),
            "ra": rng.integers(0, 8, rows), "rd": rng.integers(0, 8, rows), "color": rng.integers(0, colors, rows),
            "cycles": rng.integers(1, 3, rows)}
    code = {k: v.astype(np.int64) for k, v in code.items()}
    state = {"regs": rng.integers(0, 2**32, (n, 8), dtype=np.uint64).astype(np.uint32),
             "rdata": rng.integers(0, 2**32, (n, colors, rx_depth + 1), dtype=np.uint64).astype(np.uint32),
             "rhead": rng.integers(0, rx_depth + 1, (n, colors)), "rcount": rng.integers(0, rx_depth + 1, (n, colors)),
             "tdata": rng.integers(0, 2**32, (n, tx_depth + 2), dtype=np.uint64).astype(np.uint32),
             "tcolor": rng.integers(0, colors, (n, tx_depth + 2)),
             "tctrl": rng.integers(0, 2, (n, tx_depth + 2)).astype(np.uint8),
             "thead": rng.integers(0, tx_depth + 2, n), "tcount": rng.integers(0, tx_depth + 1, n),
             "waiting": np.zeros(n, dtype=bool), "instructions": rng.integers(0, 9, n), "stall": rng.integers(0, 9, n),
             "instr_start": rng.integers(-1, 40, n), "pc": rng.integers(0, 9, n), "time": np.full(n, 40)}
    state = {k: v.astype(np.int64) if v.dtype == np.int64 else v for k, v in state.items()}
    names = list(state)
    ours = {name: _on(value, device) for name, value in state.items()}
    pes = rng.permutation(n)[:20].astype(np.int64)
    rows_of = rng.integers(0, rows, pes.size).astype(np.int64)
    send = code["op"][rows_of] != BY_NAME["recv"].opcode
    went = np.empty(pes.size, dtype=np.int64)
    k = veck.send_recv(pes, rows_of, 40, send, sendc, code["op"], code["ra"], code["rd"], code["color"],
                       code["cycles"], state["regs"], state["rdata"], state["rhead"], state["rcount"], state["tdata"],
                       state["tcolor"], state["tctrl"], state["thead"], state["tcount"], tx_depth, state["waiting"],
                       state["instructions"], state["stall"], state["instr_start"], state["pc"], state["time"], went)
    got = send_recv(_on(pes, device), _on(rows_of, device), 40, _on(send, device), sendc,
                    *(_on(code[name], device) for name in ("op", "ra", "rd", "color", "cycles")),
                    *(ours[name] for name in names[:9]), tx_depth, *(ours[name] for name in names[9:]))
    assert got.cpu().numpy().tolist() == went[:k].tolist() and 0 < k < pes.size
    for name in names:
        mine = ours[name].cpu().numpy()
        assert np.array_equal(mine.view(np.uint32) if state[name].dtype == np.uint32 else mine, state[name]), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tasks", [12, 5])                  # more task slots than colors, and as many
def test_task_selection_equals_the_vectorized_model(device, seed, tasks):
    from types import SimpleNamespace

    from wse.sim.vector.fabric import VectorFabric
    from wse.sim.vector.torch_tasks import select_tasks

    rng = np.random.default_rng(seed)
    cfg = FabricConfig(width=6, height=5, colors=5, tasks=tasks, sram_words=16)
    s = PeState(cfg)
    n, T = s.n, s.ntasks
    s.rcount[:] = rng.integers(0, 3, s.rcount.shape) * (rng.random(s.rcount.shape) < 0.3)
    s.rhead[:] = rng.integers(0, s.rdata.shape[2], s.rhead.shape)
    s.rdata[:] = rng.integers(0, 2**32, s.rdata.shape, dtype=np.uint64).astype(np.uint32)
    s.rctrl[:] = rng.integers(0, 2, s.rctrl.shape)
    s.regs[:] = rng.integers(0, 2**32, s.regs.shape, dtype=np.uint64).astype(np.uint32)
    s.entry[:] = np.where(rng.random((n, T)) < 0.8, rng.integers(0, 50, (n, T)), -1)
    for name, p in (("bound", 0.5), ("blocked", 0.2), ("activated", 0.15)):
        getattr(s, name)[:] = rng.random((n, T)) < p
    names = ("rcount", "rhead", "rdata", "rctrl", "regs", "entry", "bound", "blocked", "activated", "waiting",
             "running", "task", "pc", "task_start", "time")
    ours = SimpleNamespace(**{name: _on(getattr(s, name), device) for name in names},
                           counters={"tasks": _on(s.counters["tasks"], device)})
    pes = rng.permutation(n)[:22].astype(np.int64)
    fab = SimpleNamespace(s=s, colors=cfg.colors, moved=0)
    started = VectorFabric._select_tasks(fab, pes, 7)
    got, moved = select_tasks(ours, _on(pes, device), 7, cfg.colors)
    assert got.cpu().numpy().tolist() == started.tolist() and moved == fab.moved
    assert 0 < len(started) < len(pes) and moved > 0
    for name in names:
        mine = getattr(ours, name).cpu().numpy()
        mine = mine.view(np.uint32) if getattr(s, name).dtype == np.uint32 else mine
        assert np.array_equal(mine, getattr(s, name)), name
    assert np.array_equal(ours.counters["tasks"].cpu().numpy(), s.counters["tasks"])


def _patterns(rng, shape):
    """Random binary32 patterns (normal floats) as ``uint32``."""
    return rng.standard_normal(shape).astype(np.float32).view(np.uint32)


def _queues(rng, n, colors, slots):
    """Random PE input queues: words, heads and counts (0 to 2)."""
    return {"rdata": _patterns(rng, (n, colors, slots)), "rhead": rng.integers(0, slots, (n, colors)),
            "rcount": rng.integers(0, 3, (n, colors))}


def _instruction_end(rng, n, rows):
    """What the end of a vector instruction reads and writes: the code's ``rd`` and cycles, registers,
    counters, ``pc``, the clock, in the numba kernels' argument order."""
    return {"code_rd": rng.integers(0, 8, rows), "code_cycles": rng.integers(1, 3, rows),
            "regs": rng.integers(0, 2**32, (n, 8), dtype=np.uint64).astype(np.uint32),
            "stall": rng.integers(0, 9, n), "instr_start": rng.integers(0, 20, n), "pc": rng.integers(0, 9, n),
            "vactive": np.ones(n, dtype=bool), "time": np.full(n, 20), "waiting": np.zeros(n, dtype=bool)}


def _as_int64(state):
    return {k: v.astype(np.int64) if v.dtype.kind == "i" else v for k, v in state.items()}


def _assert_same(ours, state):
    for name, want in state.items():
        mine = ours[name].cpu().numpy()
        assert np.array_equal(mine.view(np.uint32) if want.dtype == np.uint32 else mine, want), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_fabric_fmacw_equals_the_numba_kernel(device, seed):
    """``fmacw`` with its weights from the fabric (the streamed GEMMs' instruction): a weight per
    PE and cycle, its chunk of elements in order, the end of the instruction."""
    from wse.sim.vector import veck
    from wse.sim.vector.torch_vector import fabric_fmacw

    rng = np.random.default_rng(seed)
    n, colors, slots, words, rows = 30, 4, 3, 40, 10
    vlen = rng.integers(1, 6, (n, 3))
    vstride = rng.integers(-1, 3, (n, 3))
    vbase = np.stack([np.where(vstride[:, k] < 0, words - 1, 0) + rng.integers(0, 20, n) * (vstride[:, k] >= 0)
                      for k in range(3)], axis=1)
    vbase[:, 2] = rng.integers(0, colors, n)                        # the weights' color
    vn = rng.integers(1, 12, n)
    state = _as_int64({**_queues(rng, n, colors, slots), "mem": _patterns(rng, (n, words)), "vbase": vbase,
                       "vstride": vstride, "vlen": vlen, "vi": rng.integers(0, vn), "vn": vn,
                       "vrow": rng.integers(0, rows, n), "vkind": rng.integers(-1, 2, (n, 3)),
                       "vacc": _patterns(rng, n), **_instruction_end(rng, n, rows)})
    names = list(state)
    ours = {name: _on(value, device) for name, value in state.items()}
    pes = rng.permutation(n)[:24].astype(np.int64)
    ended = np.empty(pes.size, dtype=np.int64)
    ne, moved = veck.fabric_fmacw(pes, 20, *(state[name] for name in names), ended)
    got, got_moved = fabric_fmacw(_on(pes, device), 20, *(ours[name] for name in names))
    assert got.cpu().numpy().tolist() == ended[:ne].tolist() and got_moved == moved
    assert 0 < ne and moved < pes.size
    _assert_same(ours, state)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_fabric_vector_elements_equal_the_numba_kernel(device, seed):
    """One element of each PE's fabric vector instruction (sources and destinations in memory or on
    the fabric, every operation but ``fmacw``): queues, memory, accumulators, outputs, the ends."""
    from wse.sim.vector import veck
    from wse.sim.vector.torch_vector import fabric_elements

    rng = np.random.default_rng(seed)
    n, colors, slots, words, rows, tx_depth = 30, 4, 3, 64, 12, 2
    vkind = np.stack([rng.choice([0, 2, 2, -1], n), rng.choice([0, 1], n), rng.choice([0, 1, -1], n)], axis=1)
    vstride = rng.integers(-1, 3, (n, 3))
    vbase = np.where(vstride < 0, 20, 0) + rng.integers(0, 30, (n, 3))
    vbase = np.where((vkind == 1) | (vkind == 2), rng.integers(0, colors, (n, 3)), vbase)
    vn = rng.integers(1, 12, n)
    state = _as_int64({"vop": rng.integers(0, 11, rows), **_queues(rng, n, colors, slots),
                       "tcount": rng.integers(0, tx_depth, n), "inflight_due": rng.integers(17, 22, n),
                       "mem": _patterns(rng, (n, words)), "vbase": vbase, "vstride": vstride,
                       "vi": np.where(rng.random(n) < 0.4, vn - 1, rng.integers(0, vn)), "vn": vn,
                       "vrow": rng.integers(0, rows, n), "vkind": vkind, "vacc": _patterns(rng, n),
                       "vscalar": _patterns(rng, n), **_instruction_end(rng, n, rows)})
    names = list(state)
    ours = {name: _on(value, device) for name, value in state.items()}
    pes = rng.permutation(n)[:24].astype(np.int64)
    ended = np.empty(pes.size, dtype=np.int64)
    out_pe, out_data, out_color = (np.empty(pes.size, dtype=dtype) for dtype in (np.int64, np.uint32, np.int64))
    args = [state[name] for name in names]
    ne, no, moved = veck.fabric_elements(pes, 20, args[0], *args[1:4], args[4], tx_depth, *args[5:], ended, out_pe,
                                         out_data, out_color)
    mine = [ours[name] for name in names]
    got, (got_pe, got_data, got_color), got_moved = fabric_elements(_on(pes, device), 20, mine[0], *mine[1:4],
                                                                    mine[4], tx_depth, *mine[5:])
    assert got.cpu().numpy().tolist() == ended[:ne].tolist() and got_moved == moved
    assert got_pe.cpu().numpy().tolist() == out_pe[:no].tolist()
    assert np.array_equal(got_data.cpu().numpy().view(np.uint32), out_data[:no])
    assert got_color.cpu().numpy().tolist() == out_color[:no].tolist()
    assert 0 < ne and 0 < no and 0 < moved
    _assert_same(ours, state)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_vector_decoding_checks_counters_and_start_equal_the_numba_kernels(device, seed):
    from wse.sim.vector import veck
    from wse.sim.vector import torch_decode as td

    rng = np.random.default_rng(seed)
    n, rows, dsds, words, colors = 30, 20, 4, 40, 4
    code = _as_int64({"vop": rng.integers(0, 12, rows), "dd": rng.integers(0, dsds, rows),
                      "da": rng.integers(0, dsds, rows), "db": rng.integers(0, dsds, rows),
                      "vec_fmt": rng.integers(0, 2, rows), "has_db": rng.integers(0, 2, rows),
                      "has_rs": rng.integers(0, 2, rows), "rs": rng.integers(0, 8, rows),
                      "code_rd": rng.integers(0, 8, rows)})
    dsd = _as_int64({"dsd_kind": rng.choice([0, 0, 0, 1, 2], (n, dsds)), "dsd_base": rng.integers(0, 44, (n, dsds)),
                     "dsd_len": rng.integers(0, 12, (n, dsds)), "dsd_stride": rng.integers(-2, 4, (n, dsds))})
    regs = rng.integers(0, 2**32, (n, 8), dtype=np.uint64).astype(np.uint32)
    pes = rng.permutation(n)[:20].astype(np.int64)
    rows_of = rng.integers(0, rows, pes.size).astype(np.int64)
    t = {name: _on(value, device) for name, value in {**code, **dsd, "regs": regs, "pes": pes, "rows": rows_of}.items()}
    g = pes.size
    kind, base, ln, stride = (np.empty((g, 3), dtype=np.int64) for _ in range(4))
    scalar, count = np.empty(g, dtype=np.uint32), np.empty(g, dtype=np.int64)
    decode_args = [code[k] for k in ("vop", "dd", "da", "db", "vec_fmt", "has_db", "has_rs", "rs")]
    veck.decode_operands(pes, rows_of, *decode_args, *dsd.values(), regs, kind, base, ln, stride, scalar, count)
    got = td.decode_operands(t["pes"], t["rows"], *(t[k] for k in ("vop", "dd", "da", "db", "vec_fmt", "has_db",
                                                                     "has_rs", "rs")), *(t[k] for k in dsd), t["regs"])
    for want, mine in zip((kind, base, ln, stride, scalar, count), got):
        mine = mine.cpu().numpy()
        assert np.array_equal(mine.view(np.uint32) if want.dtype == np.uint32 else mine, want)
    touches = np.empty(g, dtype=bool)
    veck.touches_fabric(pes, rows_of, code["dd"], code["da"], code["db"], code["vec_fmt"], code["has_db"],
                        dsd["dsd_kind"], touches)
    mine = td.touches_fabric(t["pes"], t["rows"], *(t[k] for k in ("dd", "da", "db", "vec_fmt", "has_db",
                                                                   "dsd_kind")))
    assert mine.cpu().numpy().tolist() == touches.tolist() and 0 < touches.sum() < g
    vop = code["vop"][rows_of]
    verdicts = []
    for lane in range(g):                                # one instruction at a time, and the whole group
        for fabric in (False, True):
            part = slice(lane, lane + 1)
            want = veck.any_fault(vop[part], kind[part], base[part], ln[part], stride[part], count[part], colors,
                                  words, fabric)
            verdicts.append(want)
            assert td.any_fault(*(_on(a[part], device) for a in (vop, kind, base, ln, stride, count)), colors, words,
                                fabric) == want, (lane, fabric)
    assert 0 < sum(verdicts) < len(verdicts)
    lanes = 150                                          # more instructions, fmacw ones near the memory's end
    many = {"vop": rng.choice([11, 11, 5, 9, 0], lanes), "kind": rng.choice([0, 0, 0, 0, 1, 2, -1], (lanes, 3)),
            "base": rng.integers(0, words + 2, (lanes, 3)), "ln": rng.integers(0, 8, (lanes, 3)),
            "stride": rng.integers(-1, 4, (lanes, 3)), "n": rng.integers(0, 20, lanes)}
    many = _as_int64(many)
    for lane in range(lanes):
        for fabric in (False, True):
            part = {name: value[lane:lane + 1] for name, value in many.items()}
            want = veck.any_fault(*part.values(), colors, words, fabric)
            verdicts.append(want)
            assert td.any_fault(*(_on(a, device) for a in part.values()), colors, words, fabric) == want, lane
    counters = {name: rng.integers(0, 9, n) for name in ("instructions", "flops", "fmac")}
    ours = {name: _on(value, device) for name, value in counters.items()}
    veck.count(pes, vop, count, *counters.values())
    td.count(t["pes"], _on(vop, device), _on(count, device), *ours.values())
    _assert_same(ours, counters)
    state = _as_int64({"vacc": _patterns(rng, n), "vactive": np.zeros(n, dtype=bool), "vrow": rng.integers(0, 9, n),
                       "vi": rng.integers(0, 9, n), "vn": rng.integers(0, 9, n), "vscalar": _patterns(rng, n),
                       "vkind": rng.integers(0, 3, (n, 3)), "vbase": rng.integers(0, 9, (n, 3)),
                       "vlen": rng.integers(0, 9, (n, 3)), "vstride": rng.integers(0, 9, (n, 3))})
    ours = {name: _on(value, device) for name, value in state.items()}
    veck.begin(pes, rows_of, kind, base, ln, stride, scalar, count, code["code_rd"], regs, *state.values())
    td.begin(t["pes"], t["rows"], *(_on(a, device) for a in (kind, base, ln, stride, scalar, count)), t["code_rd"],
             t["regs"], *ours.values())
    _assert_same(ours, state)
