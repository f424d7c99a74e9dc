"""The static cycle model: the golden model's cycle count of every phase,
computed without computing any data.

The fabric's timing does not depend on data (``train.s`` branches only on
record fields and counters), so a phase's cycles are a function of the
compiled schedule alone. :func:`phase_cycles` gets each PE's instruction
stream from :func:`wse.firmware.training.timing.pe_ops` and replays it,
cycle by cycle, against a model of the routers, edge ports and PE queues
that follows ``docs/architecture.md`` sections 3, 4 and 6 (and the golden
model) to the cycle: rotating color priority, atomic multicast, ready bits
from start-of-cycle counts, vector elements written to ``tx`` one cycle after
they issue, ``fmacw`` popping a weight per chunk. The replay is a compiled
loop (numba); ``tests/test_weight_streaming.py`` checks it against the
golden model phase by phase.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse.config import FabricConfig, Port, ROUTE_INPUT_NONE, route_outputs
from wse.firmware.image import Program
from wse.firmware.training import timing

__all__ = ["phase_cycles", "replay", "Network"]

_EDGE_PORT = {"N": Port.N, "E": Port.E, "S": Port.S, "W": Port.W}
_K_ROUTER, _K_PE, _K_EDGE = 0, 1, 2


class Network:
    """Route tables as arrays for the replay: for each router and color the
    input port, the output port mask and up to five targets (kind, index,
    the port they must accept from)."""

    def __init__(self, config: FabricConfig, routes):
        W, H, C = config.width, config.height, config.colors
        n = W * H
        self.config = config
        self.route_in = np.full((n, C), ROUTE_INPUT_NONE, dtype=np.int64)
        self.mask = np.zeros((n, C), dtype=np.int64)
        self.ntgt = np.zeros((n, C), dtype=np.int64)
        self.kind = np.zeros((n, C, 5), dtype=np.int64)
        self.index = np.zeros((n, C, 5), dtype=np.int64)
        self.opp = np.zeros((n, C, 5), dtype=np.int64)
        for x, y, color, inp, outputs in routes:
            r = y * W + x
            self.route_in[r, color] = ROUTE_INPUT_NONE if inp is None else int(Port(inp))
            mask, outs = route_outputs(x, y, outputs, W, H)
            for k, (port, neighbour) in enumerate(outs):
                if port is Port.RAMP:
                    self.kind[r, color, k], self.index[r, color, k] = _K_PE, r
                elif neighbour is not None:
                    self.kind[r, color, k], self.index[r, color, k] = _K_ROUTER, neighbour
                    self.opp[r, color, k] = int(port.opposite)
                else:
                    self.kind[r, color, k] = _K_EDGE
            self.mask[r, color] = mask
            self.ntgt[r, color] = len(outs)

    def port(self, edge: str, index: int) -> tuple[int, int]:
        """(boundary router, port code) of edge port ``(edge, index)``."""
        W, H = self.config.width, self.config.height
        x, y = {"N": (index, 0), "S": (index, H - 1), "W": (0, index), "E": (W - 1, index)}[edge]
        return y * W + x, int(_EDGE_PORT[edge])


@njit(cache=True)
def _replay(route_in, mask, ntgt, kind, index, opp, depth, rx_depth, tx_depth, port_router, port_code, inject,
            ops, pc0, pc1, limit):
    n, C = route_in.shape
    P = port_router.shape[0]
    fifo = np.zeros((n, C), dtype=np.int64)
    busy = np.zeros(n, dtype=np.int64)
    rx = np.zeros((n, C), dtype=np.int64)
    txq = np.zeros((n, tx_depth), dtype=np.int64)
    txh = np.zeros(n, dtype=np.int64)
    txc = np.zeros(n, dtype=np.int64)
    pc = pc0.copy()
    tfree = np.zeros(n, dtype=np.int64)
    vi = np.zeros(n, dtype=np.int64)
    inflight = np.full(n, -1, dtype=np.int64)
    done = np.zeros(n, dtype=np.bool_)
    failed = np.full(n, -1, dtype=np.int64)
    left = inject.copy()
    port_left = np.zeros(P, dtype=np.int64)
    for p in range(P):
        port_left[p] = left[p].sum()
    gr_r = np.zeros(n * C, dtype=np.int64)
    gr_c = np.zeros(n * C, dtype=np.int64)
    inj_p = np.zeros(P, dtype=np.int64)
    inj_c = np.zeros(P, dtype=np.int64)
    mv = np.zeros(n, dtype=np.int64)
    pop_pe = np.zeros(2 * n, dtype=np.int64)
    pop_c = np.zeros(2 * n, dtype=np.int64)
    due_pe = np.zeros(n, dtype=np.int64)
    due_c = np.zeros(n, dtype=np.int64)
    nxt_pe = np.zeros(n, dtype=np.int64)
    nxt_c = np.zeros(n, dtype=np.int64)
    n_due = 0
    active_fifos = 0
    tx_total = 0
    inj_total = port_left.sum()
    remaining = n
    last = -1
    t = 0
    while remaining > 0 or active_fifos > 0 or tx_total > 0 or inj_total > 0 or n_due > 0:
        if t >= limit:
            return -1
        s = t % C
        # 1. router grants
        ng = 0
        for r in range(n):
            if busy[r] == 0:
                continue
            used = 0
            for q in range(C):
                c = (s + q) % C
                if fifo[r, c] == 0:
                    continue
                m = mask[r, c]
                if m == 0 or (m & used) != 0:
                    continue
                ok = True
                for k in range(ntgt[r, c]):
                    kk = kind[r, c, k]
                    tg = index[r, c, k]
                    if kk == 0:
                        if route_in[tg, c] != opp[r, c, k] or fifo[tg, c] >= depth:
                            ok = False
                            break
                    elif kk == 1:
                        if rx[tg, c] >= rx_depth:
                            ok = False
                            break
                if ok:
                    used |= m
                    gr_r[ng] = r
                    gr_c[ng] = c
                    ng += 1
        # 2. edge injections
        ni = 0
        for p in range(P):
            if port_left[p] == 0:
                continue
            r = port_router[p]
            for q in range(C):
                c = (s + q) % C
                if left[p, c] > 0 and route_in[r, c] == port_code[p] and fifo[r, c] < depth:
                    inj_p[ni] = p
                    inj_c[ni] = c
                    ni += 1
                    break
        # 3. output queues to the routers
        nm = 0
        for pe in range(n):
            if txc[pe] > 0:
                c = txq[pe, txh[pe]]
                if route_in[pe, c] == 4 and fifo[pe, c] < depth:
                    mv[nm] = pe
                    nm += 1
        # 4. PE steps (start-of-cycle queue state)
        npop = 0
        nn = 0
        moved = 0
        for pe in range(n):
            if done[pe] or tfree[pe] > t:
                continue
            while True:
                op = ops[pc[pe], 0]
                if op == 3:
                    done[pe] = True
                    remaining -= 1
                    if tfree[pe] - 1 > last:
                        last = tfree[pe] - 1
                    break
                if op == 0:
                    tfree[pe] += ops[pc[pe], 1]
                    pc[pe] += 1
                    continue
                if tfree[pe] > t:
                    break
                a = ops[pc[pe], 1]
                if op == 1:
                    c = ops[pc[pe], 1]
                    if rx[pe, c] > 0:
                        pop_pe[npop] = pe
                        pop_c[npop] = c
                        npop += 1
                        tfree[pe] = t + 1
                        pc[pe] += 1
                        moved += 1
                        continue
                    tfree[pe] = t + 1
                    failed[pe] = t
                    break
                # vector instruction
                in1 = ops[pc[pe], 2]
                in2 = ops[pc[pe], 3]
                out = ops[pc[pe], 4]
                period = ops[pc[pe], 5]
                if a == 0:
                    tfree[pe] = t + 1
                    pc[pe] += 1
                    moved += 1
                    continue
                if period > 0:
                    if rx[pe, in1] > 0:
                        pop_pe[npop] = pe
                        pop_c[npop] = in1
                        npop += 1
                        m = period if a - vi[pe] > period else a - vi[pe]
                        vi[pe] += m
                        moved += 1
                        if vi[pe] == a:
                            vi[pe] = 0
                            pc[pe] += 1
                            tfree[pe] = t + m + 1
                            continue
                        tfree[pe] = t + m
                        break
                    tfree[pe] = t + 1
                    failed[pe] = t
                    break
                ok = True
                if in1 >= 0 and rx[pe, in1] == 0:
                    ok = False
                if in2 >= 0 and rx[pe, in2] == 0:
                    ok = False
                if out >= 0:
                    fl = 1 if inflight[pe] == t else 0
                    if txc[pe] + fl >= tx_depth:
                        ok = False
                if not ok:
                    tfree[pe] = t + 1
                    failed[pe] = t
                    break
                if in1 >= 0:
                    pop_pe[npop] = pe
                    pop_c[npop] = in1
                    npop += 1
                if in2 >= 0:
                    pop_pe[npop] = pe
                    pop_c[npop] = in2
                    npop += 1
                if out >= 0:
                    nxt_pe[nn] = pe
                    nxt_c[nn] = out
                    nn += 1
                    inflight[pe] = t + 1
                vi[pe] += 1
                moved += 1
                if vi[pe] == a:
                    vi[pe] = 0
                    pc[pe] += 1
                    tfree[pe] = t + 2
                    continue
                tfree[pe] = t + 1
                break
        events = ng + ni + nm + npop + n_due
        if events > 0 and t > last:
            last = t
        # 5. apply pops and pushes
        for g in range(ng):
            r = gr_r[g]
            c = gr_c[g]
            fifo[r, c] -= 1
            if fifo[r, c] == 0:
                busy[r] -= 1
                active_fifos -= 1
            for k in range(ntgt[r, c]):
                kk = kind[r, c, k]
                tg = index[r, c, k]
                if kk == 0:
                    if fifo[tg, c] == 0:
                        busy[tg] += 1
                        active_fifos += 1
                    fifo[tg, c] += 1
                elif kk == 1:
                    rx[tg, c] += 1
        for g in range(ni):
            p = inj_p[g]
            c = inj_c[g]
            r = port_router[p]
            left[p, c] -= 1
            port_left[p] -= 1
            inj_total -= 1
            if fifo[r, c] == 0:
                busy[r] += 1
                active_fifos += 1
            fifo[r, c] += 1
        for g in range(nm):
            pe = mv[g]
            c = txq[pe, txh[pe]]
            txh[pe] = (txh[pe] + 1) % tx_depth
            txc[pe] -= 1
            tx_total -= 1
            if fifo[pe, c] == 0:
                busy[pe] += 1
                active_fifos += 1
            fifo[pe, c] += 1
        for g in range(npop):
            rx[pop_pe[g], pop_c[g]] -= 1
        for g in range(n_due):
            pe = due_pe[g]
            txq[pe, (txh[pe] + txc[pe]) % tx_depth] = due_c[g]
            txc[pe] += 1
            tx_total += 1
        for g in range(nn):
            due_pe[g] = nxt_pe[g]
            due_c[g] = nxt_c[g]
        n_due = nn
        if events == 0 and nn == 0 and moved == 0 and active_fifos == 0 and tx_total == 0 and inj_total == 0:
            # Nothing moved and nothing is in flight: PEs waiting for the fabric
            # wait for good unless a busy PE will send later; skip to the next one.
            nxt = limit
            for pe in range(n):
                if not done[pe] and failed[pe] != t and tfree[pe] < nxt:
                    nxt = tfree[pe]
            if nxt == limit:
                if remaining > 0:
                    return -2
            else:
                t = nxt
                continue
        t += 1
    return last + 1


def replay(network: Network, ops: np.ndarray, starts: np.ndarray, ends: np.ndarray, inject: dict,
           limit: int = 1 << 40) -> int:
    """Cycles of one run: PE ``p`` executes ``ops[starts[p]:ends[p]]``, the
    edge ports inject ``inject[(edge, index)][color]`` wavelets.

    Raises
    ------
    RuntimeError
        If the replay hangs (a schedule the golden model would report as a hang).
    """
    cfg = network.config
    ports = sorted(inject)
    port_router = np.zeros(len(ports), dtype=np.int64)
    port_code = np.zeros(len(ports), dtype=np.int64)
    counts = np.zeros((len(ports), cfg.colors), dtype=np.int64)
    for p, key in enumerate(ports):
        port_router[p], port_code[p] = network.port(*key)
        for color, count in inject[key].items():
            counts[p, color] += count
    result = _replay(network.route_in, network.mask, network.ntgt, network.kind, network.index, network.opp,
                     cfg.router_depth, cfg.rx_depth, cfg.tx_depth, port_router, port_code, counts,
                     ops, starts.astype(np.int64), ends.astype(np.int64), limit)
    if result < 0:
        raise RuntimeError("the cycle model's replay hung: the schedule would not finish on the fabric")
    return int(result)


def _phase_ops(plan, phase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All PEs' timing ops of ``phase``, identical op lists shared."""
    cfg = plan.config
    table, starts, ends, seen = [], [], [], {}
    at = 0
    for i in range(cfg.height):
        for j in range(cfg.width):
            records = phase.records[i][j]
            words = np.concatenate(records + [np.zeros(2, dtype=np.uint32)]) if records else \
                np.zeros(2, dtype=np.uint32)
            key = words.tobytes()
            if key not in seen:
                ops = timing.pe_ops(words)
                seen[key] = (at, at + len(ops))
                table.append(ops)
                at += len(ops)
            start, end = seen[key]
            starts.append(start)
            ends.append(end)
    return np.concatenate(table), np.array(starts), np.array(ends)


def phase_cycles(plan, program: Program) -> dict[str, int]:
    """Cycles of every phase of a weight-streaming plan, as the golden model counts them."""
    network = Network(plan.config, plan.routes)
    out = {}
    for name, phase in plan.phases.items():
        ops, starts, ends = _phase_ops(plan, phase)
        inject: dict = {}
        for stream in phase.streams_in:
            key = (stream["edge"], stream["index"])
            per_color = inject.setdefault(key, {})
            per_color[stream["color"]] = per_color.get(stream["color"], 0) + len(stream["gather"])
        out[name] = replay(network, ops, starts, ends, inject)
    return out
