"""The instruction stream of ``train.s`` for a PE's op list, as timing ops.

:func:`pe_ops` follows the control flow of ``train.s`` for one PE's op list
(the branches depend only on record fields and loop counters) and returns
what the PE does, in order, as rows of :data:`OP_FIELDS`:

* ``BUSY n``: ``n`` cycles of instructions that touch only the PE's own
  state (scalar instructions, ``ld``/``ldsd`` 2 cycles, branches 1, memory
  vector instructions ``n + 1``), the task selection and ``exit``;
* ``RECV color``: one ``recv``;
* ``VEC n, in1, in2, out, period``: a vector instruction with fabric
  operands (colors, -1 for none); ``period > 0`` marks an ``fmacw`` popping
  one weight from ``in1`` every ``period`` elements;
* ``END``: the task's ``exit`` (its one cycle is included).

The static cycle model (:mod:`wse.host.compiler.cycles`) replays these
against the routers and queues. The mirror must change with ``train.s``:
``tests/test_weight_streaming.py`` checks the stall-free cycles per PE
against the golden model's ``busy - stall`` counters.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.isa import DsdKind
from wse.firmware.timing_ops import BUSY, END, OP_FIELDS, RECV, VEC, OpRows

from . import records as rec

__all__ = ["BUSY", "RECV", "VEC", "END", "OP_FIELDS", "pe_ops", "spwgrad_items", "indexed_rows"]


# Dispatch cost of each kind: ld 2 + beq 1 + (li, beq) per kind tested before it.
_ORDER = ("sgemm", "wgrad", "relu", "transpose", "mask", "softmax", "spgemm", "spwgrad")
_DISPATCH = {kind: 3 + 2 * (i + 1) for i, kind in enumerate(_ORDER)}
_OP_DONE = 4          # ld 2, add, jmp


def _color(d) -> int:
    """The color of a fabric descriptor, -1 for a memory one."""
    return d[1] if d[0] != DsdKind.MEM else -1


def _fmacw_n(ld: int, la: int) -> int:
    return max(ld, la) if min(ld, la) else 0


#: Whether :func:`_repeat` builds a loop's round once and repeats its rows (``False``: every
#: round built; the same rows, ``tests/test_compile_speed.py`` compares both on whole plans).
REPEAT_ROUNDS = True


def _built(body) -> tuple[int, np.ndarray, int]:
    """``body``'s rows built on their own, as ``(head, rows, tail)``: the private cycles they begin
    with, the rows from their first non-``BUSY`` row to their last (empty if none), and the private
    cycles they end with. Appending them with :func:`_append` equals running ``body`` in place."""
    one = OpRows()
    body(one)
    tail, one.pending = one.pending, 0
    rows = one.array()
    head = 0
    if rows.shape[0] and rows[0, 0] == BUSY:
        head, rows = int(rows[0, 1]), rows[1:]
    return head, rows, tail


def _append(ops: OpRows, built: tuple[int, np.ndarray, int]) -> None:
    """Rows from :func:`_built` after those of ``ops``: its leading private cycles merge with the
    ones before, its trailing ones with what follows (:meth:`OpRows.busy`)."""
    head, rows, tail = built
    ops.busy(head)
    if rows.shape[0]:
        ops.block(rows)
    ops.busy(tail)


def _repeat(ops: OpRows, rounds: int, body) -> None:
    """``body(ops)`` ``rounds`` times. A round's rows depend on nothing that changes from round to
    round (``body`` takes no round index), so one round is built and its rows repeated: the private
    cycles it begins and ends with merge across the rounds' boundaries as :meth:`OpRows.busy`
    merges them (round after round: its leading ones with the cycles before, its trailing ones
    with the next round's leading ones, the last round's with what follows)."""
    if rounds <= 1 or not REPEAT_ROUNDS:
        for _ in range(rounds):
            body(ops)
        return
    head, rows, tail = _built(body)
    if rows.shape[0] == 0:
        ops.busy(rounds * (head + tail))
        return
    if head + tail:
        gap = np.zeros((1, rows.shape[1]), dtype=rows.dtype)
        gap[0, 0], gap[0, 1] = BUSY, head + tail
        rows = np.concatenate([np.tile(np.concatenate([rows, gap]), (rounds - 1, 1)), rows])
    else:
        rows = np.tile(rows, (rounds, 1))
    _append(ops, (head, rows, tail))


def _memo(ops: OpRows, memo: dict, key, body) -> None:
    """``body(ops)``, whose rows depend on ``key`` alone: built once per key into ``memo`` and
    appended (:func:`_built`, :func:`_append`; every time in place when not :data:`REPEAT_ROUNDS`).
    A weight-gradient list runs one of a few such steps per row of the mesh: on 994 rows its
    Python took 15 ms a list, and the wafer's weight gradients 2,982 lists a phase."""
    if not REPEAT_ROUNDS:
        body(ops)
        return
    built = memo.get(key)
    if built is None:
        built = memo[key] = _built(body)
    _append(ops, built)


def _sgemm(ops: OpRows, f: dict) -> None:
    # T: the vectors' length (a token pass's tokens); the field t is only y's slot stride
    K, T, H, rounds, o_last, e, e_step = f["k"], f["y"][2], f["h"], f["rounds"], f["o_last"], f["e0"], f["e_step"]
    w = _color(f["w"])
    n_w = _fmacw_n(f["acc"][2], f["x1"][2])
    c_out, c_in = _color(f["out"]), _color(f["inp"])

    def weights(o):
        o.recv(w)
        o.busy(T + 1)                                     # fmacs (memory)
        o.vec(n_w, w, period=f["acc"][2]) if n_w else o.vec(0, w, period=1)

    def start(o):
        o.recv(w)
        o.vec(T, out=c_out)

    def middle(o):
        o.vec(T, in1=c_in, out=c_out)

    def end(o):
        o.vec(T, in1=c_in)

    ops.busy(26)                                          # 3 ld, 2 addi, 8 ldsd, ld
    if H == 1:
        ops.busy(2)                                       # beq (taken), beq

        def one_row_round(o):
            o.busy(1)                                     # beq r4
            if K:
                weights(o)
            o.recv(w)
            o.busy(T + 1 + 3)                             # fadds to memory, addb, addi, bne
        _repeat(ops, rounds, one_row_round)
        if rounds:
            ops.busy(1)                                   # jmp op_done
        return
    ops.busy(2 if rounds == 0 else 3)
    mids = H - 2

    def one_round(o):
        if K:
            weights(o); start(o)
            o.busy(2)                                     # andi, beq
            if mids % 2:
                weights(o); middle(o)
            o.busy(2)                                     # shri, beq
            for _ in range(mids // 2):
                weights(o); middle(o); weights(o); middle(o)
                o.busy(2)                                 # addi, bne
            weights(o); end(o)
            o.busy(3)                                     # addb, addi, bne
        else:
            start(o)
            o.busy(2)                                     # add, beq
            for _ in range(mids):
                middle(o)
                o.busy(2)
            end(o)
            o.busy(3)
    _repeat(ops, rounds, one_round)
    if rounds and K:
        ops.busy(1)                                       # jmp sg_partial
    ops.busy(3)                                           # ld r9, beq
    if not o_last:
        return
    ops.busy(5)                                           # ld r12, ld r11 (2 each), li r13
    for p in range(H):
        ops.busy(1)                                       # bge e, o_last
        if e < o_last:
            ops.busy(1)                                   # beq K
            if K:
                weights(ops)
            ops.busy(1)                                   # beq p == 0
            if p == 0:
                start(ops)
                ops.busy(1)                               # jmp
            else:
                ops.busy(1)                               # beq p == H-1
                if p == H - 1:
                    end(ops)
                else:
                    middle(ops)
                    ops.busy(1)                           # jmp
        ops.busy(2)                                       # sub, bge
        e -= e_step
        if e < 0:
            e += H
            ops.busy(2)                                   # add, addi
        ops.busy(2)                                       # addi, bge
    ops.busy(1)                                           # jmp op_done


def indexed_rows(n: int, T: int, color: int, fabric_weights: bool) -> np.ndarray:
    """``n`` indices of an ``fmacx`` (``fabric_weights``: an index, then its weight and ``T`` elements)
    or ``fdotx`` (an index, then ``T`` elements from memory) on ``color``, and the control wavelet that
    ends it, as timing ops: per index ``T + 1`` cycles with no waiting, the control wavelet one."""
    if fabric_weights:
        each = [(RECV, color, 0, 0, 0, 0), (RECV, color, 0, 0, 0, 0)] + ([(BUSY, T - 1, 0, 0, 0, 0)] if T > 1 else [])
    else:
        each = [(RECV, color, 0, 0, 0, 0), (BUSY, T, 0, 0, 0, 0)]
    rows = np.array(each * n + [(RECV, color, 0, 0, 0, 0)], dtype=np.int64)
    return rows


def _spgemm(ops: OpRows, f: dict, steps: list[int]) -> None:
    """``spgemm``: per step ``(count << 2) | kind`` of the record's table
    (:data:`~.records.SPARSE_KINDS`); blocks of ``b`` steps, each the non-zeros of its steps (each
    step closed by a carriage return; a step without one on the row sends nothing) and a marker, then
    the block's ring operations (a step without a non-zero: on the zero block, no slot)."""
    T, w, block = f["t"], _color(f["w"]), max(f["b"], 1)
    c_out, c_in = _color(f["out"]), _color(f["inp"])
    first, mid, last, _ = (rec.SPARSE_KINDS[k] for k in ("first", "mid", "last", "only"))
    ops.busy(2 * 2 + 7 * 2 + 7 + 1)                       # 2 ld, 7 ldsd, 7 li, jmp
    for b0 in range(0, len(steps), block):
        codes = steps[b0:b0 + block]
        for code in codes:                                # the compute part
            n = code >> 2
            if n:
                ops.recv(w)                               # the first index
                ops.busy(2)                               # blt, setb
                ops.recv(w)
                ops.busy(T + 1)                           # fmacs (memory)
                ops.block(indexed_rows(n - 1, T, w, True))  # fmacx: the other pairs, the carriage return
                ops.busy(2)                               # jmp, addb
        ops.recv(w)                                       # -3: the ring part
        ops.busy(3)                                       # blt (taken), setb, jmp
        for code in codes:                                # the ring part
            kind = code & 3
            ops.recv(w)                                   # the ring kind
            if code >> 2:
                _ring_op(ops, kind, T, w, c_in, c_out, (first, mid, last))
            else:
                _ring_op_zero(ops, kind, T, w, c_in, c_out, (first, mid, last))
        ops.recv(w)                                       # -5 or -6
        ops.busy(5 + 1 + 1)                               # beq, bge, 2 beq, blt (taken), setb, beq
        if b0 + block >= len(steps):
            ops.busy(1)                                   # jmp op_done


def _ring_op(ops: OpRows, kind: int, T: int, w: int, c_in: int, c_out: int, kinds) -> None:
    """A step's ring operation on its slot, from the kind's first test to ``jmp spr_step``."""
    first, mid, last = kinds
    if kind == mid:
        ops.busy(1)                                       # beq (taken)
        ops.vec(T, in1=c_in, out=c_out)
        ops.busy(1)                                       # addb
    elif kind == first:
        ops.busy(3)                                       # beq, bge, beq (taken)
        ops.recv(w)                                       # the bias word
        ops.vec(T, out=c_out)
        ops.busy(2)                                       # addb, jmp
    elif kind == last:
        ops.busy(4)
        ops.vec(T, in1=c_in)
        ops.busy(3)                                       # addb, addb, jmp
    else:                                                 # only: the bias word, fadds to memory
        ops.busy(5)
        ops.recv(w)
        ops.busy(T + 1 + 3)                               # fadds, addb, addb, jmp


def _ring_op_zero(ops: OpRows, kind: int, T: int, w: int, c_in: int, c_out: int, kinds) -> None:
    """An empty step's ring operation on the zero block (no slot), to ``jmp spr_step``."""
    first, mid, last = kinds
    if kind == mid:
        ops.busy(3)                                       # beq, bge (taken), bne
        ops.vec(T, in1=c_in, out=c_out)
        ops.busy(1)                                       # jmp
    elif kind == first:
        ops.busy(4)                                       # beq, bge, bne, beq (taken)
        ops.recv(w)
        ops.vec(T, out=c_out)
        ops.busy(1)
    elif kind == last:
        ops.busy(5)
        ops.vec(T, in1=c_in)
        ops.busy(2)                                       # addb, jmp
    else:
        ops.busy(5)
        ops.recv(w)
        ops.busy(T + 1 + 2)                               # fadds, addb, jmp


def _rotate(ops: OpRows, f: dict, words_out: int, words_in: int, setup: int) -> None:
    c_out, c_in = _color(f["rout"]), _color(f["rin"])
    ops.busy(setup)
    if f["send_first"]:
        ops.vec(words_out, out=c_out)
        ops.vec(words_in, in1=c_in)
        ops.busy(1)                                       # jmp
    else:
        ops.vec(words_in, in1=c_in)
        ops.vec(words_out, out=c_out)


def _wgrad(ops: OpRows, f: dict, counts: list[int]) -> None:
    T, Kx, H, bias = f["t"], f["kx"], f["h"], f["bias"]
    e_in, e_out = _color(f["ein"]), _color(f["eout"])
    n_w = _fmacw_n(f["g"][2], f["x1"][2])

    def step(o: OpRows, n: int, after: int, first: bool) -> None:
        """A rotation step with ``n`` outputs, ``after`` at the next step (-1: the last step)."""
        o.busy(4)                                         # add, ld, bge
        if after >= 0:
            _rotate(o, f, n * T, after * T, 20)
        o.busy(13 + (3 if first else 0))                  # descriptors, length
        o.busy(3)                                         # setl, setl, beq
        length = Kx + (bias if first else 0)
        if n:
            o.busy(1)                                     # bne s
            with_bias = first and bias
            if first:
                o.busy(3)                                 # ld bias, bne

            def output(o, with_bias=with_bias, length=length):
                o.busy(2 + Kx + 1 + n_w + 1)              # ld, fmacs, fmacw (memory)
                if with_bias:
                    o.busy(1 + T + 1 + 1)                 # li, fsum, st
                o.vec(length, in1=e_in, out=e_out)
                o.busy(5 if with_bias else 4)             # addb(s), add, addi, bne
            _repeat(o, n, output)                         # the step's n outputs: the same rows each
            if not with_bias:
                o.busy(1)                                 # jmp wg_next
        o.busy(5)                                         # 3 add, addi, bge

    ops.busy(24)                                          # 9 ld/ldsd, ..., addi, li
    memo: dict = {}
    for s in range(H):
        key = (counts[s], counts[s + 1] if s < H - 1 else -1, s == 0)
        _memo(ops, memo, key, lambda o, key=key: step(o, *key))
    ops.busy(1)                                           # jmp op_done


def spwgrad_items(counts: list[int], kept: list[int], bias: bool, cap: int) -> list[list[tuple]]:
    """What a row's ``spwgrad`` stream holds, per rotation step: ``("out", n, b)``
    for an output with ``n`` kept weights on the row (``b``: its bias partial
    comes first, step 0 with a bias) and ``("chain", N)`` for a row chain of G's
    first ``N`` words, placed before an output that would not fit in the ``cap``
    words of G, and after the last output. ``counts[s]`` outputs at step ``s``,
    ``kept`` their kept weights in rotation order. The stream builder
    (``ws_phases``) and the cycle mirror both follow this list."""
    steps, used, at = [], 0, 0
    for s, n_out in enumerate(counts):
        items = []
        for n in kept[at:at + n_out]:
            b = bool(bias and s == 0)
            if used + n + b > cap:
                items.append(("chain", used))
                used = 0
            items.append(("out", n, b))
            used += n + b
        at += n_out
        if s == len(counts) - 1 and used:
            items.append(("chain", used))
        steps.append(items)
    return steps


def _spwgrad(ops: OpRows, f: dict, table: list[int]) -> None:
    """``spwgrad``: ``table`` is ``counts[H]`` (outputs per rotation step), then
    the kept weights of this row per output, in rotation order; the stream's
    markers follow :func:`spwgrad_items`."""
    T, H, bias, cap = f["t"], f["h"], f["bias"], f["gall"][2]
    w, e_in, e_out = _color(f["w"]), _color(f["ein"]), _color(f["eout"])
    counts = table[:H]
    ops.busy(6 * 2 + 1 + 2 * 2 + cap + 1 + 2 * 2 + 2)    # 6 ld, addi, 2 ldsd, fmov G, 2 ldsd, 2 li
    for s, items in enumerate(spwgrad_items(counts, table[H:], bias, cap)):
        ops.busy(4)                                       # add, ld, bge
        if s < H - 1:
            _rotate(ops, f, counts[s] * T, counts[s + 1] * T, 20)
        ops.busy(2 + 1 + 3)                               # ldsd, setb, 3 li
        ops.recv(w)                                       # the first marker
        after_output = False                              # how the marker was reached: recv, or fdotx's end
        for item in items:
            ops.busy(2 if after_output else 1)            # addb d7, beq / blt
            if item[0] == "out":
                n, b = item[1], item[2]
                if b:                                     # -5: addi, bne; li, fsum, fadds, addb, jmp
                    ops.busy(2 + 1 + T + 1 + 2 + 1 + 1)
                ops.block(indexed_rows(n, T, w, False))   # fdotx: the indices and the next marker
                after_output = True
            else:
                N = item[1]
                ops.busy(3)                               # addi, bne (taken), bne
                ops.recv(w)                               # N
                ops.busy(3 * 2 + 3)                       # 3 ldsd, 3 setl
                ops.vec(N, in1=e_in, out=e_out)
                ops.busy(N + 1 + 1)                       # fmov G back to +0, setb
                ops.recv(w)                               # the next marker
                ops.busy(1)                               # jmp swg_mark
                after_output = False
        ops.busy((2 if after_output else 1) + 3 + 5)      # -7: (addb, beq / blt), addi, bne, bne; 3 add, addi, bge
    ops.busy(1)                                           # jmp op_done


def _softmax(ops: OpRows, f: dict, counts: list[int]) -> None:
    T, H, C, ci, N = f["t"], f["h"], f["c"], f["ci"], f["n"]
    ops.busy(14)
    row = f["row"]
    for s in range(H):
        n = counts[s]
        ops.busy(17 + n * (T + 5))                        # placing the block
        ops.busy(1)                                       # bge
        if s < H - 1:
            _rotate(ops, f, n * T, counts[s + 1] * T, 20)
        ops.busy(5)
        row -= 1
        if row < 0:
            row += H
            ops.busy(2)
        ops.busy(2)
    ops.busy(3)                                           # ld ci, beq
    if not ci:
        return
    cost = 2 + 2 + 2 + 1 + (T + 1) + 2 + 1 + 1 + (C - 1) * (T + 4)        # max
    cost += 1 + 2 + C * (T + 4)                                              # subtract
    cost += 6 + 2 + (N + 1) + 8 + N * 11                                     # t, n, nf
    cost += 2 * (2 + N + 1) + 2 + (N + 1) + 5 * (2 + 2 * (N + 1)) + 2 + (N + 1)   # r and p
    cost += 6 + N * 15                                                       # scale by 2^n
    cost += 2 + 2 + 2 + 1 + (T + 1) + 2 + 1 + 1 + (C - 1) * (T + 4)          # sum
    cost += 7 + T * 8 + 7 + 2 * (3 * (T + 1) + 2) + 2 + 4 * (T + 1)          # reciprocal
    cost += 8 + 2 + 2 + 1 + 1 + 1 + 2 + 2 + ci * (3 * (T + 1) + 5) + 1       # deltas, jmp
    ops.busy(cost)


def pe_ops(words: np.ndarray, start: int = 0) -> np.ndarray:
    """The timing ops of one PE running the op list that begins at ``words[start]``."""
    ops = OpRows()
    ops.busy(1 + 2)                                       # task selection, ld r15
    at = int(start)
    while True:
        length = int(words[at + 1]) if words[at] else rec.HEADER_WORDS
        kind, fields, table = rec.decode(words[at:at + length])
        if kind == "end":
            ops.busy(3)                                   # ld, beq (taken) then exit in end()
            return ops.end()
        ops.busy(_DISPATCH[kind])
        if kind == "sgemm":
            _sgemm(ops, fields)
        elif kind == "wgrad":
            _wgrad(ops, fields, table)
        elif kind == "softmax":
            _softmax(ops, fields, table)
        elif kind == "spgemm":
            _spgemm(ops, fields, table)
        elif kind == "spwgrad":
            _spwgrad(ops, fields, table)
        elif kind == "relu":
            ops.busy(2 + fields["data"][2] + 1 + 1)
        elif kind == "transpose":
            T, K = fields["t"], fields["dst"][2]           # fmov of dst's length; k is dst's step
            ops.busy(10 + T * (K + 5) + (1 if T else 0))
        elif kind == "mask":
            ops.busy(11 + 4 * (fields["act"][2] + 1))
        ops.busy(_OP_DONE)
        at += length
