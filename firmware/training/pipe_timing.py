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
from .timing import _color, _Ops

__all__ = ["pe_ops"]

_DISPATCH = {"pfwd": 2 + 1 + 2}      # ld kind, beq end, (li, beq) per kind tested
_OP_DONE = 4                         # ld 2, add, jmp


def _pfwd(ops: _Ops, f: dict) -> None:
    T, K, O = f["t"], f["k"], f["o"]
    c_x, c_in, c_out, c_next = _color(f["xin"]), _color(f["cin"]), _color(f["cout"]), _color(f["xout"])
    n_w = max(O, (K - 1) * O) if K > 1 and O else 0
    ops.busy(10)                                          # 5 ld
    for _ in range(T):
        ops.busy(5)                                       # 2 ldsd, setb
        ops.vec(K, in1=c_x)                               # fmov: the inputs into memory
        ops.busy(6 + O + 1 + 6 + n_w + 1 + 7)             # ld, 2 ldsd; fmuls; 2 ldsd, addi, setb; fmacw; ld, ldsd, ld, bne
        if not f["last"]:
            ops.busy(3)                                   # ldsd, beq
            ops.vec(O, out=c_out) if f["first"] else ops.vec(O, in1=c_in, out=c_out)
            ops.busy(1)                                   # jmp pf_next
        else:
            ops.busy(4)                                   # ldsd, setb, beq
            if f["first"]:
                ops.busy(O + 1 + 1)                       # fmov (memory), jmp
            else:
                ops.vec(O, in1=c_in)                      # fadd into the output store
            ops.busy(3 + (2 + O + 1 if f["bias"] else 0))      # ld, beq; ldsd, fadd
            ops.busy(3 + (O + 1 if f["relu"] else 0))          # ld, beq; fmaxs
            ops.busy(3)                                   # ld, beq
            if f["send"]:
                ops.busy(2)                               # ldsd
                ops.vec(O, out=c_next)
            ops.busy(1)                                   # add
        ops.busy(3)                                       # add, addi, bne
    ops.busy(1)                                           # jmp op_done


def pe_ops(words: np.ndarray, start: int = 0) -> np.ndarray:
    """The timing ops of one PE running the ``pipe.s`` op list that begins at ``words[start]``."""
    ops = _Ops()
    ops.busy(1 + 2)                                       # task selection, ld r15
    at = int(start)
    while True:
        if not words[at]:
            ops.busy(3)                                   # ld, beq (taken), then exit in end()
            return ops.end()
        length = int(words[at + 1])
        kind, fields = pipe.decode(words[at:at + length])
        ops.busy(_DISPATCH[kind])
        if kind == "pfwd":
            _pfwd(ops, fields)
        ops.busy(_OP_DONE)
        at += length if length else HEADER_WORDS
