"""The instruction stream of ``pipe.s`` for a PE's op list, as timing ops.

The mirror of :mod:`.timing` for the layer-pipelined program: :func:`pe_ops`
follows ``pipe.s``'s control flow for one PE's op list (its branches test
record fields and counters only) and returns the same rows (``BUSY``,
``RECV``, ``VEC``, ``END``), which the static cycle model replays against the
routers and queues. ``tests/test_pipelined.py`` checks the replayed cycles
against the golden model's. The mirror must change with ``pipe.s``.
"""

from __future__ import annotations

import numpy as np

from . import pipe
from .records import HEADER_WORDS
from wse.firmware.timing_ops import OpRows

from .timing import _color

__all__ = ["pe_ops"]

_DISPATCH = {"pfwd": 2 + 1 + 2, "pbwd": 2 + 1 + 4, "pupd": 2 + 1 + 6, "psfwd": 2 + 1 + 8,
             "pvop": 2 + 1 + 10}   # ld kind, beq end, (li, beq) per kind tested
_OP_DONE = 4                         # ld 2, add, jmp


def _pfwd(ops: OpRows, f: dict) -> None:
    T, K, O = f["t"], f["k"], f["o"]
    c_x, c_in = _color(f["xin"]), _color(f["cin"])
    n_w = max(O, (K - 1) * O) if K > 1 and O else 0      # fmacw's elements
    ops.busy(8 + 2 + 5)                                   # 4 ld; li, addi; 2 ldsd, setb
    ops.vec(K, in1=c_x)                                   # fmov: the first sample's inputs
    ops.busy(6 + 3)                                       # 3 ldsd; ld, bne
    if not f["last"]:
        ops.busy(7)                                       # 2 ldsd, ld, bne
        c_out = _color(f["cout"])
        for s in range(T):
            ops.busy(3 + O + 1 + n_w + 1 + 4)             # ld, addb; fmuls; fmacw; addb, add, addi, beq
            if s < T - 1:
                ops.vec(K, in1=c_x)                       # fmov: the next sample's inputs
            ops.vec(O, out=c_out) if f["first"] else ops.vec(O, in1=c_in, out=c_out)
            ops.busy(1)                                   # jmp
        return
    c_next = _color(f["xout"])
    code = 2 * f["relu"] + f["send"]
    ops.busy(20)                                          # ld, ldsd, setb, 2 ldsd, 4 ld, add, add, li
    for s in range(T):
        ops.busy(3 + 1 + O + 1 + (0 if f["bias"] else 1) + n_w + 1 + 4)   # ld, addb; bne; fmacs | fmuls,
        #                                                   jmp; fmacw; addb, add, addi, beq
        if s < T - 1:
            ops.vec(K, in1=c_x)                           # fmov: the next sample's inputs
        ops.busy(1)                                       # bne on first
        if not f["first"]:
            ops.vec(O, in1=c_in)                          # fadd: y = in + P
        ops.busy(1)                                       # beq on the output code
        if code == 3:
            ops.busy(1)                                   # bne
            ops.vec(O, out=c_next)                        # fmaxs: max(y, +0) on to the next region
            ops.busy(1)                                   # jmp
        elif code == 1:
            ops.busy(2)                                   # 2 bne
            ops.vec(O, out=c_next)                        # fmov: y on
            ops.busy(1)                                   # jmp
        elif code == 2:
            ops.busy(2 + O + 1)                           # 2 bne; fmaxs in place
        ops.busy(2)                                       # addb, bne
    ops.busy(1)                                           # jmp op_done


def _chain(ops: OpRows, f: dict, send) -> None:
    """psfwd's reduction chain of one sample, from ``bne`` on
    ``last`` to the output slot's ``add``; ``send()`` adds the send to the next region."""
    O, c_in, c_out = f["o"], _color(f["cin"]), _color(f["cout"])
    if not f["last"]:
        ops.busy(3)                                       # ldsd, beq
        ops.vec(O, out=c_out) if f["first"] else ops.vec(O, in1=c_in, out=c_out)
        ops.busy(1)                                       # jmp to the sample's end
        return
    ops.busy(4)                                           # ldsd, setb, beq
    if f["first"]:
        ops.busy(O + 1 + 1)                               # fmov (memory), jmp
    else:
        ops.vec(O, in1=c_in)                              # fadd into the output store
    ops.busy(3)                                           # ld, beq on relu
    if f["relu"]:
        ops.busy(3 + (3 if f["send"] else 0))             # ld, beq on send; ld, beq on sout
        if f["send"] and not f["sout"]:
            ops.busy(2)                                   # ldsd
            ops.vec(O, out=_color(f["xout"]))             # fmaxs: max(y, +0) on, dense
            ops.busy(1 + 1)                               # jmp ps_stored; add
            return
        ops.busy(O + 1)                                   # fmaxs in place
    ops.busy(3)                                           # ld, beq
    if f["send"]:
        send()
    ops.busy(1)                                           # add


def _psfwd(ops: OpRows, f: dict, pattern) -> None:
    """``psfwd``: ``pattern[l]`` is layer ``l``'s input activation pattern (``[T, features]``,
    true where the word is not +0), which sets the pairs taken and sent."""
    T, K, O = f["t"], f["k"], f["o"]
    c_x, c_pin = _color(f["xin"]), _color(f["pin"])
    if pattern is None and (f["sin"] or (f["send"] and f["sout"])):
        raise ValueError("a psfwd record's cycles depend on the activations: give their pattern")
    taken = pattern[f["layer"]][:, f["lin"]:f["lin"] + K].sum(axis=1) if f["sin"] else None
    sent = pattern[f["layer"] + 1][:, f["lout"]:f["lout"] + O] if f["send"] and f["sout"] else None
    n_w = max(O, (K - 1) * O) if K > 1 and O else 0
    ops.busy(4)                                           # ld, li, beq on `sin` 2
    if f["sin"] == 2:
        _pskip(ops, f, pattern[f["layer"]][:, f["lin"]:f["lin"] + K], c_x)
        return
    ops.busy(10)                                          # 5 ld
    for s in range(T):
        ops.busy(3)                                       # ld, bne
        if f["sin"]:
            ops.busy(5 + K + 1 + 7 + (5 if f["bias"] else 0) + O + 1 + 10)   # 2 ldsd, setb; fmov; 2 ldsd,
            #                         ld, beq; fmov | ldsd, ld, fmuls, jmp; 3 ldsd, 2 ld
            for _ in range(int(taken[s])):
                ops.vec(2, in1=c_pin)                     # fmov: a pair
                ops.busy(2 + 1 + 2 + 2 + 3 + O + 1 + 1)   # ld, blt; ld, add, st; mul, add, setb; fmacs; jmp
            ops.vec(2, in1=c_pin)                         # the end marker
            ops.busy(3)                                   # ld, blt (taken)
        else:
            ops.busy(5)                                   # 2 ldsd, setb
            ops.vec(K, in1=c_x)
            ops.busy(9 + (2 if f["bias"] else 1) + O + 1 + 6 + n_w + 1 + 1)   # ld, 2 ldsd, ld, bne;
            #                                  ldsd, fmacs | fmuls, jmp; 2 ldsd, addi, setb; fmacw; jmp ps_chain
        ops.busy(7)                                       # ld, ldsd, ld, bne
        _chain(ops, f, lambda: _harvest_send(ops, f, sent[s] if sent is not None else None))
        ops.busy(3)                                       # add, addi, bne
    ops.busy(1)                                           # jmp op_done


def _pskip(ops: OpRows, f: dict, nonzero, c_x: int) -> None:
    """``pk_rec`` (``psfwd`` with ``sin`` 2: dense inputs, the zeros skipped), after the
    dispatch; ``nonzero``: ``[T, K]``, the inputs of the PE's block, true where the word is not +0."""
    O, c_in = f["o"], _color(f["cin"])
    ops.busy(18 + 1 + 6 + 3 + (2 if f["bias"] else 0) + 5 + (4 if f["last"] else 0))   # 9 ld, andi,
    #                                 3 ldsd, ld, beq; ldsd (bias); 2 ldsd, beq; 2 ldsd (last)
    for row in nonzero:
        ops.busy(5 + 1)                                   # 3 add, addi, bne on the color; bge
        seen = False
        for k, value in enumerate(row):
            odd = k == len(row) - 1 and len(row) % 2
            if odd:
                ops.busy(1)                               # bne: one input left
            ops.recv(c_x)                                 # recv x[k]
            ops.busy(2)                                   # st, bne | beq
            if value:                                     # (sub, jmp) sub, (addi), mul, add, setb, beq; fmacs
                ops.busy((6 if odd else 5 + k % 2) + O + 1)
                ops.busy(1 if seen else 2 if not odd or c_x == 0 else 1)   # jmp | addi, (jmp)
                seen = True
            if k % 2:
                ops.busy(2)                               # addi, blt
        if len(row) % 2 == 0:
            ops.busy(1)                                   # bne: no input left
        ops.busy(1 + (0 if seen else 2 + O + 1))          # bne; ld, fmuls
        ops.busy(1)                                       # bne on last
        if not f["last"]:
            ops.busy(1)                                   # bne on first
            ops.vec(O, out=_color(f["cout"])) if f["first"] else ops.vec(O, in1=c_in, out=_color(f["cout"]))
            ops.busy(1 + 3)                               # jmp; add, addi, bne
            continue
        ops.busy(2)                                       # setb, bne on first
        if f["first"]:
            ops.busy(O + 1)                               # fmov y = P
        else:
            ops.vec(O, in1=c_in)                          # fadd y = in + P
            ops.busy(1)                                   # jmp
        ops.busy(4 + 1)                                   # 2 ld, beq on send
        if f["send"]:
            ops.busy(1)                                   # beq on relu
            ops.vec(O, out=_color(f["xout"]))             # fmaxs | fmov on to the next region
            ops.busy(1)                                   # jmp
        else:
            ops.busy(1 + (O + 1 if f["relu"] else 0))     # beq; fmaxs in place
        ops.busy(1 + 3)                                   # add; add, addi, bne
    ops.busy(1)                                           # jmp op_done


def _harvest_send(ops: OpRows, f: dict, sent) -> None:
    """psfwd's send to the next region: dense, or a pair per ``sent`` element that is true."""
    ops.busy(3)                                           # ld, bne
    if not f["sout"]:
        ops.busy(2)                                       # ldsd
        ops.vec(f["o"], out=_color(f["xout"]))
        ops.busy(1)                                       # jmp ps_stored
        return
    c_pout = _color(f["pout"])
    ops.busy(4 + 2 + 2)                                   # 2 ldsd, ld, 2 add
    for nonzero in sent:
        ops.busy(3)                                       # ld, beq
        if nonzero:
            ops.busy(2)                                   # 2 st
            ops.vec(2, out=c_pout)
        ops.busy(3)                                       # 2 addi, bne
    ops.busy(2)                                           # li, st
    ops.vec(2, out=c_pout)                                # the end marker


def _pbwd_end(ops: OpRows, f: dict, c_dy: int, c_zo: int) -> None:
    """``pbwd``'s chain-end part of a sample, from ``pb_end`` to the jump to ``pb_dx``."""
    O = f["o"]
    ops.busy(2)                                           # li, blt
    if f["host"]:
        ops.busy(3 + O + 1 + 2 + 1)                       # ldsd, setb, fmov (memory), ldsd, jmp
    else:
        ops.busy(1)                                       # beq
        if f["mask"]:
            ops.busy(5 + 3 * (O + 1) + 4)                 # 2 ldsd, setb, fmaxs, ld, fmuls, ld, fmaxs
            ops.vec(O, in1=c_dy)                          # fmul from the fabric
            ops.busy(O + 1 + 2 + 1)                       # fmuls, ldsd, jmp
        else:
            ops.vec(O, in1=c_dy)                          # fmov from the fabric
    ops.busy(1 + (2 + O + 1 if f["bias"] else 0))         # beq; ldsd, fadd
    ops.busy(1)                                           # beq
    if f["mcast"]:
        ops.busy(2)                                       # ldsd
        ops.vec(O, out=c_zo)
        ops.busy(1)                                       # jmp


def _pbwd_dx(ops: OpRows, f: dict, c_bi: int, c_bo: int) -> None:
    """``pbwd``'s input gradient of a sample, from the dots to the send."""
    K, O = f["k"], f["o"]
    ops.busy(7 + (O + 7 if K % 2 else 0))                 # ldsd, ld, add, andi, beq; the odd input
    ops.busy(K // 2 * (2 * O + 11) + 1)                   # pairs of (add, dot, st, addb), 2 addi, bne; bne
    if f["xmask"]:
        ops.busy(1)                                       # blt on the far end
        if not f["dxfirst"]:
            ops.vec(K, in1=c_bi)                          # fadd: in + D
        ops.busy(2 + 2 + K + 1 + 2 + K + 1 + K + 1)       # ldsd; ld, fmuls; ld, fmaxs; fmul
        ops.vec(K, out=c_bo)                              # fmuls: masked, on
    elif f["dxfirst"]:
        ops.busy(1)                                       # blt
        ops.vec(K, out=c_bo)
        ops.busy(1)                                       # jmp
    else:
        ops.busy(1)                                       # blt
        ops.vec(K, in1=c_bi, out=c_bo)
        ops.busy(1)                                       # jmp


def _pbwd(ops: OpRows, f: dict) -> None:
    T, K, O = f["t"], f["k"], f["o"]
    c_dy, c_zo, c_zi = _color(f["dyin"]), _color(f["dzout"]), _color(f["dzin"])
    c_bi, c_bo = _color(f["bin"]), _color(f["bout"])
    ops.busy(10 + 3)                                      # 5 ld; ld, beq
    if f["zero"]:
        ops.busy(4 + K * O + 1 + 3)                       # 2 ldsd, fmov G; ld, beq
        if f["bias"]:
            ops.busy(4 + O + 1)                           # 2 ldsd, fmov db
    ops.busy(8 + 1 + (3 if f["dx"] else 0) + (1 if f["dx"] and f["dxfirst"] else 0))   # 4 ld, beq;
    #                                                       ld, beq; li
    ops.busy(12 + 3)                                      # 6 ldsd; ld, beq
    if f["end"]:
        ops.busy(4 + (0 if f["host"] else 4 + (1 if f["mask"] else 0)) + 3)   # ld, li, bne; ld, li,
        #                                                   beq; li; ldsd, jmp
    else:
        ops.busy(2)                                       # ldsd
    for s in range(T):
        if f["end"]:
            _pbwd_end(ops, f, c_dy, c_zo)
        else:
            ops.vec(O, in1=c_zi)                          # fmov: dz from the output line
        ops.busy(2)                                       # setb, beq
        if f["dx"]:
            _pbwd_dx(ops, f, c_bi, c_bo)
        ops.busy(K * O + 1 + 3 + 1)                       # fmacw; add, add, addi; beq
        if s < T - 1:
            ops.busy(1)                                   # beq on the chain end (to pb_in or on)


def _pupd(ops: OpRows, f: dict) -> None:
    sizes = [f["w"][2], f["b"][2]][:f["params"]]
    ops.busy(3)                                           # add, ld
    for n in sizes:
        ops.busy(6 + 3 + (2 + n + 1 if f["wd"] else 0) + 3)     # 3 ldsd; ld, beq; ld, fmacs; ld, beq
        if f["mom"]:
            ops.busy(3)                                   # ld, beq
            ops.busy(n + 1 + 1 if f["first"] else 2 + n + 1 + 2 + n + 1)   # fmov, jmp | ld, fmuls, ld, fmacs
            ops.busy(3 + (2 + n + 1 + 1 if f["nest"] else 2))              # ld, beq; ld, fmacs, jmp | ldsd
        ops.busy(2 + n + 1 + 3)                           # ld, fmacs; addi, addi, bne
    ops.busy(1)                                           # jmp op_done


def _pvop(ops: OpRows, f: dict) -> None:
    ops.busy(2 + 1)                                       # ld n, addi
    for e in pipe.pvop_entries(f):
        n = e["d"][2]
        ops.busy(7)                                       # ld, 2 ldsd, bne
        if e["op"]:
            ops.busy(2)                                   # ldsd
            ops.vec(n, in1=_color(e["a"]), in2=_color(e["b"]), out=_color(e["d"]))
        else:
            ops.vec(n, in1=_color(e["a"]), out=_color(e["d"]))
            ops.busy(1)                                   # jmp pv_step
        ops.busy(3)                                       # addi, addi, bne
    ops.busy(1)                                           # jmp op_done


def pe_ops(words: np.ndarray, start: int = 0, pattern=None) -> np.ndarray:
    """The timing ops of one PE running the ``pipe.s`` op list that begins at ``words[start]``;
    ``pattern`` (per layer, ``[T, features]`` booleans: the input word is not +0) for
    ``psfwd`` records, whose cycles depend on the activations."""
    ops = OpRows()
    ops.busy(1 + 2)                                       # task selection, ld r15
    at = int(start)
    while True:
        if not words[at]:
            ops.busy(3)                                   # ld, beq (taken), then exit in end()
            return ops.end()
        length = int(words[at + 1])
        kind, fields = pipe.decode(words[at:at + length])
        ops.busy(_DISPATCH[kind])
        if kind == "psfwd":
            _psfwd(ops, fields, pattern)
        else:
            {"pfwd": _pfwd, "pbwd": _pbwd, "pupd": _pupd, "pvop": _pvop}[kind](ops, fields)
        ops.busy(_OP_DONE)
        at += length if length else HEADER_WORDS
