"""The golden PE: task model, instruction costs, vector engine, faults, hangs."""

import numpy as np
import pytest

from wse.config import FabricConfig, Port
from wse.firmware.asm import assemble
from wse.sim.golden import Fabric, FabricHang, ProgramFault
from wse import numerics as fp

ONE = FabricConfig(width=1, height=1, colors=8)


def run_one(source, config=ONE, launch=0, streams=(), routes=(), max_cycles=100_000):
    fab = Fabric(config, trace=True)
    prog = assemble(source, filename="t.s", config=config)
    fab.load(prog)
    for color, inp, outs in routes:
        fab.set_route(0, 0, color, inp, outs)
    for edge, color, words in streams:
        fab.stream_in(edge, 0, color, words)
    if launch is not None:
        fab.launch(launch)
    cycles = fab.run(max_cycles=max_cycles)
    return fab, prog, cycles


def word(fab, prog, name, n=1):
    return fab.memcpy_d2h(prog.symbol(name), n, (0, 0, 1, 1))[0, 0]


def test_scalar_costs_and_task_select():
    # select (1) + li (1) + ld (2) + add (1) + st (1) + exit (1) = 7 cycles
    fab, prog, cycles = run_one("""
    .data
    x: .word 40
    y: .word 0
    .text
    .task 0, main
    main: li r1, 2
          ld r2, x
          add r3, r1, r2
          st r3, y
          exit
    """)
    assert cycles == 7
    assert word(fab, prog, "y")[0] == 42
    counters = fab.counters()["pe"]
    assert counters["busy"][0, 0] == 7 and counters["instructions"][0, 0] == 5 and counters["tasks"][0, 0] == 1
    # The registers read back through the host API, as on the RTL devices: 16 words, r0 reads 0.
    assert fab.registers(0, 0) == [0, 2, 40, 42] + [0] * 12
    assert all(type(v) is int for v in fab.registers(0, 0))


def test_vector_cost_is_n_plus_one_and_r0_is_zero():
    fab, prog, cycles = run_one("""
    .data
    a: .float 1, 2, 3, 4, 5
    b: .float 10, 20, 30, 40, 50
    c: .zero 5
    da: .dsd mem, base=a, len=5
    db: .dsd mem, base=b, len=5
    dc: .dsd mem, base=c, len=5
    .text
    .task 0, main
    main: ldsd d0, da
          ldsd d1, db
          ldsd d2, dc
          fadd d2, d0, d1
          li r0, 99
          exit
    """)
    # select 1 + 3 x ldsd 2 + fadd (5 + 1) + li 1 + exit 1
    assert cycles == 1 + 6 + 6 + 1 + 1
    assert fp.as_float(word(fab, prog, "c", 5)).tolist() == [11, 22, 33, 44, 55]
    assert fab.counters()["pe"]["flops"][0, 0] == 5


def test_fmacs_dot_and_aliasing_follow_element_order():
    fab, prog, cycles = run_one("""
    .data
    x: .float 1.5, -2, 3.25, 0.1
    y: .float 4, 5, 6, 7
    s: .float 0.3
    run: .float 1, 0, 0, 0, 0
    dx: .dsd mem, base=x, len=4
    dy: .dsd mem, base=y, len=4
    dsrc: .dsd mem, base=run, len=4
    ddst: .dsd mem, base=run+1, len=4
    out: .zero 1
    .text
    .task 0, main
    main: ldsd d0, dx
          ldsd d1, dy
          ld r5, s
          fmacs d1, d1, d0, r5      ; y = y + x * s
          li r6, 0
          dot r6, d0, d1            ; r6 = sum x * y in order
          st r6, out
          ldsd d2, dsrc
          ldsd d3, ddst
          lui r7, 0x3f80          
          fadds d3, d2, r7          ; run[i+1] = run[i] + 1: each element reads the previous write
          exit
    """)
    x = fp.as_bits([1.5, -2, 3.25, 0.1])
    y = fp.as_bits([4, 5, 6, 7])
    s = fp.f2b(np.float32(0.3))
    y2 = [fp.add(b, fp.mul(a, s)) for a, b in zip(x.tolist(), y.tolist())]
    acc = 0
    for a, b in zip(x.tolist(), y2):
        acc = fp.add(acc, fp.mul(a, b))
    assert word(fab, prog, "y", 4).tolist() == y2
    assert word(fab, prog, "out")[0] == acc
    assert fp.as_float(word(fab, prog, "run", 5)).tolist() == [1, 2, 3, 4, 5]
    assert fab.counters()["pe"]["fmac"][0, 0] == 8


def test_data_task_receives_data_and_ctrl_and_costs_k_plus_2():
    fab, prog, cycles = run_one("""
    .data
    got: .zero 4
    n: .word 0
    .text
    .data_task 2, on
    on: ld r3, n
        shli r4, r3, 1
        st r1, got(r4)
        st r2, got+1(r4)
        addi r3, r3, 1
        st r3, n
        exit
    """, launch=None, routes=[(2, Port.W, [Port.RAMP])])
    assert cycles == 0  # nothing arrived
    fab.stream_in("W", 0, 2, [7, 8], ctrl=[0, 1])
    cycles = fab.run()
    # wavelet 0: router at 0, rx at 1, select at 2, then 7 instructions in 8
    # cycles (ld takes 2): 3..10, exit at 10; wavelet 1 (already waiting) is
    # selected at 11 and exits at 19: 20 cycles.
    assert cycles == 20
    assert word(fab, prog, "got", 4).tolist() == [7, 0, 8, 1]


def test_fabric_vector_streams_in_and_out_at_one_per_cycle():
    config = FabricConfig(width=1, height=1, colors=8)
    n = 50
    fab, prog, cycles = run_one(f"""
    .data
    din: .dsd fabin, color=1, len={n}
    dout: .dsd fabout, color=2, len={n}
    .text
    .task 0, main
    main: ldsd d0, din
          ldsd d1, dout
          lui r3, 0x4000          ; 2.0
          fmuls d1, d0, r3
          exit
    """, config=config, routes=[(1, Port.W, [Port.RAMP]), (2, Port.RAMP, [Port.E])],
        streams=[("W", 1, np.arange(n, dtype=np.float32))])
    got = fab.stream_out("E", 0, 2).view(np.float32)
    assert got.tolist() == [2.0 * i for i in range(n)]
    # The stream arrives in rx from cycle 2 on; ldsd x2 end at cycle 4, so the
    # vector runs unstalled from cycle 5: n + 1 cycles, then exit, and the last
    # wavelet takes two more cycles to leave (tx -> router -> edge).
    assert fab.counters()["pe"]["stall"][0, 0] == 0
    assert cycles == 5 + n + 1 + 1 + 2


def test_recv_and_send_stall_and_count():
    fab, prog, cycles = run_one("""
    .text
    .task 0, main
    main: recv r3, 1
          addi r3, r3, 1
          send r3, 2
          sendc r3, 2
          exit
    """, routes=[(1, Port.W, [Port.RAMP]), (2, Port.RAMP, [Port.E])], streams=[("W", 1, [41])])
    data, ctrl = fab.stream_out("E", 0, 2, with_ctrl=True)
    assert data.tolist() == [42, 42] and ctrl.tolist() == [0, 1]
    assert fab.counters()["pe"]["stall"][0, 0] == 1   # recv waits from cycle 1 to 2


def test_local_tasks_priority_block_and_activate():
    fab, prog, cycles = run_one("""
    .data
    order: .zero 3
    n: .word 0
    .text
    .task 3, t3
    .task 5, t5
    .task 1, main
    main: activate 5
          activate 3
          block 3
          li r1, 1
          jmp log
    t3:   li r1, 3
          jmp log
    t5:   li r1, 5
          unblock 3
    log:  ld r3, n
          st r1, order(r3)
          addi r3, r3, 1
          st r3, n
          exit
    """, launch=1)
    # main runs first; then 3 is blocked so 5 runs, unblocks 3, and 3 runs last.
    assert word(fab, prog, "order", 3).tolist() == [1, 5, 3]


def test_faults_name_pe_pc_and_address():
    with pytest.raises(ProgramFault, match=r"PE \(0, 0\) task 0 pc 1 .*data address 9000"):
        run_one(".task 0, m\nm: li r1, 9000\nld r2, 0(r1)\nexit\n")
    with pytest.raises(ProgramFault, match="fabric-in descriptor cannot be a destination"):
        run_one(".data\nd: .dsd fabin, color=1, len=2\n.text\n.task 0, m\nm: ldsd d0, d\nfmov d0, d0\nexit\n")
    with pytest.raises(ProgramFault, match="leaves memory"):
        run_one(".data\nd: .dsd mem, base=8190, len=4\n.text\n.task 0, m\nm: ldsd d0, d\nfmov d0, d0\nexit\n")


def test_hang_names_the_waiting_pe_and_color():
    with pytest.raises(FabricHang) as info:
        run_one(".task 0, m\nm: recv r1, 3\nexit\n")
    assert "PE (0, 0) task 0 pc 0" in str(info.value) and "waits for a wavelet on color 3" in str(info.value)
    with pytest.raises(FabricHang, match="did not become idle within 1000 cycles"):
        run_one(".task 0, m\nm: jmp m\n", max_cycles=1000)


def test_trace_records_instructions_and_wavelets():
    fab, prog, cycles = run_one(".task 0, m\nm: li r1, 5\nsend r1, 2\nexit\n", routes=[(2, Port.RAMP, [Port.E])])
    lines = fab.trace(0, 0)
    assert any("select task 0" in l for l in lines)
    assert any("li" in l for l in lines) and any("send  color 2 data 0x00000005" in l for l in lines)


def test_mesh_and_rect_errors_are_one_sentence():
    fab = Fabric(FabricConfig(width=2, height=2))
    with pytest.raises(Exception, match=r"rect \(1, 1, 2, 1\) does not fit the 2x2 mesh"):
        fab.memcpy_d2h(0, 1, (1, 1, 2, 1))
    with pytest.raises(Exception, match=r"shape \[2, 2, n\]"):
        fab.memcpy_h2d(0, np.zeros((3, 2, 1), np.float32))


def _fmacw_reference(acc, x, w, ld, la):
    acc = list(acc)
    n, period = max(ld, la), min(ld, la)
    for i in range(n):
        acc[i % ld] = fp.add(acc[i % ld], fp.mul(x[i % la], w[i // period]))
    return acc


@pytest.mark.parametrize("shape", ["forward", "backward"])
@pytest.mark.parametrize("weights_from", ["memory", "fabric"])
def test_fmacw_streams_weights_over_token_slices(shape, weights_from):
    rng = np.random.default_rng(5)
    K, T = 6, 4
    ld, la = (T, K * T) if shape == "forward" else (K * T, T)
    acc0 = fp.as_bits(rng.standard_normal(ld))
    x = fp.as_bits(rng.standard_normal(la))
    w = fp.as_bits(rng.standard_normal(K))
    wsrc = (".dsd mem, base=w, len=%d" % K) if weights_from == "memory" else (".dsd fabin, color=1, len=%d" % K)
    src = f"""
    .data
    acc: .word {", ".join(str(v) for v in acc0.tolist())}
    x:   .word {", ".join(str(v) for v in x.tolist())}
    w:   .word {", ".join(str(v) for v in w.tolist())}
    dacc: .dsd mem, base=acc, len={ld}
    dx:   .dsd mem, base=x, len={la}
    dw:   {wsrc}
    .text
    .task 0, main
    main: ldsd d0, dacc
          ldsd d1, dx
          ldsd d2, dw
          fmacw d0, d1, d2
          exit
    """
    streams = [("W", 1, w)] if weights_from == "fabric" else []
    fab, prog, cycles = run_one(src, routes=[(1, Port.W, [Port.RAMP])], streams=streams)
    assert word(fab, prog, "acc", ld).tolist() == _fmacw_reference(acc0.tolist(), x.tolist(), w.tolist(), ld, la)
    counters = fab.counters()["pe"]
    assert counters["fmac"][0, 0] == K * T and counters["stall"][0, 0] == 0
    # select + 3 ldsd + (K*T + 1) + exit: the weights were waiting, so no stall.
    assert cycles == 1 + 6 + K * T + 1 + 1


def test_fmacw_overlapping_operands_follow_element_order():
    # dd = words 1..2, da = words 0..1, weight 2: element 1 reads word 1 after
    # element 0 wrote it, so word 2 = 3 + 2 * (2 + 2 * 1) = 11.
    fab, prog, cycles = run_one("""
    .data
    m: .float 1, 2, 3, 4
    w: .float 2
    dd: .dsd mem, base=m+1, len=2
    da: .dsd mem, base=m, len=2
    dw: .dsd mem, base=w, len=1
    .text
    .task 0, main
    main: ldsd d0, dd
          ldsd d1, da
          ldsd d2, dw
          fmacw d0, d1, d2
          exit
    """)
    assert fp.as_float(word(fab, prog, "m", 4)).tolist() == [1, 4, 11, 4]


def test_fmacw_with_memory_weights_checks_only_the_elements_it_reads():
    # da is 2 words at the very end of memory and dd is 6: the op reads da 6
    # times modulo its length, which stays inside memory.
    top = ONE.sram_words - 2
    fab, prog, cycles = run_one(f"""
    .data
    acc: .zero 6
    w: .float 1, 1, 1
    dd: .dsd mem, base=acc, len=6
    da: .dsd mem, base={top}, len=2
    dw: .dsd mem, base=w, len=3
    .text
    .task 0, main
    main: ldsd d0, dd
          ldsd d1, da
          ldsd d2, dw
          fmacw d0, d1, d2
          exit
    """)
    assert fab.counters()["pe"]["fmac"][0, 0] == 6
