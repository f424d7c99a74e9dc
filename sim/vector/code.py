"""Program images as arrays: every instruction of every loaded program decoded into columns.

The vectorized model keeps one code table for the whole mesh: the programs
loaded so far, one after another, each instruction decoded once into the
columns of :class:`CodeTable` (opcode, kind, operand fields, cycles). A PE
holds the offset of its program (``base``) and its length; its program
counter stays program-relative, as in the golden model, and the instruction
it executes is row ``base + pc``. PEs executing different instructions in the
same cycle look up their rows with one gather per column.
"""

from __future__ import annotations

import numpy as np

from wse.firmware import isa
from wse.sim.golden.decode import K_EXIT, K_INDEXED, K_RECV, K_SCALAR, K_SEND, K_VECTOR

from .fpk import VOPS

__all__ = ["CodeTable", "K_BAD", "K_SCALAR", "K_VECTOR", "K_SEND", "K_RECV", "K_EXIT", "K_INDEXED", "FIELDS"]

#: The kind of an instruction word that does not decode (a fault when executed).
K_BAD = 5

#: Operand columns (absent fields read 0; ``has_db``, ``has_rs`` say whether the format has them).
FIELDS = ("rd", "ra", "rb", "imm", "dd", "da", "db", "rs", "color", "target", "task")


class CodeTable:
    """The decoded instructions of every loaded program, one row per instruction.

    Columns (``int64`` arrays): ``op`` (opcode, -1 for an undecodable word),
    ``kind`` (``K_*``), ``cycles``, ``vec_fmt`` (1 for the reduction formats
    VR/VR1, whose destination is a register), ``has_db``, ``has_rs``, ``vop``
    (the compiled kernels' code of a vector instruction, :data:`~.fpk.VOPS`; -1 otherwise) and one
    per name of :data:`FIELDS`; ``words`` the instruction words and
    ``errors`` the decode error of each undecodable row.
    """

    def __init__(self):
        self.cols = {name: np.zeros(0, dtype=np.int64) for name in
                     ("op", "kind", "cycles", "vec_fmt", "has_db", "has_rs", "vop") + FIELDS}
        self.words = np.zeros(0, dtype=np.uint32)
        self.errors: dict[int, str] = {}
        self._programs: dict[int, tuple] = {}

    def __getattr__(self, name):
        cols = self.__dict__.get("cols")
        if cols is not None and name in cols:
            return cols[name]
        raise AttributeError(name)

    def add(self, program) -> tuple[int, int]:
        """The ``(base, length)`` of ``program``'s code in the table, decoding it on first use."""
        key = id(program)
        known = self._programs.get(key)
        if known is not None and known[0] is program:
            return known[1], known[2]
        words = np.asarray(program.code, dtype=np.uint32)
        base, n = len(self.words), len(words)
        rows = {name: np.zeros(n, dtype=np.int64) for name in self.cols}
        for i, word in enumerate(words.tolist()):
            try:
                ins, fields = isa.decode(word)
            except ValueError as exc:
                rows["op"][i], rows["kind"][i], rows["cycles"][i], rows["vop"][i] = -1, K_BAD, 1, -1
                self.errors[base + i] = str(exc)
                continue
            rows["op"][i] = ins.opcode
            rows["cycles"][i] = ins.cycles
            rows["vop"][i] = VOPS.get(ins.name, -1)
            if ins.name in isa.INDEXED:
                kind = K_INDEXED
            elif ins.is_vector:
                kind = K_VECTOR
            elif ins.name in ("send", "sendc"):
                kind = K_SEND
            elif ins.name == "recv":
                kind = K_RECV
            elif ins.name == "exit":
                kind = K_EXIT
            else:
                kind = K_SCALAR
            rows["kind"][i] = kind
            rows["vec_fmt"][i] = int(ins.fmt in ("VR", "VR1"))
            rows["has_db"][i] = int("db" in fields)
            rows["has_rs"][i] = int("rs" in fields)
            for name, value in fields.items():
                rows[name][i] = value
        for name in self.cols:
            self.cols[name] = np.concatenate([self.cols[name], rows[name]])
        self.words = np.concatenate([self.words, words])
        self.__dict__.update(self.cols)    # the columns as attributes: no __getattr__ on the hot path
        self._programs[key] = (program, base, n)
        return base, n
