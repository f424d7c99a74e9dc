"""Op records: the per-PE work list that the training program walks.

A phase of training is one run of the fabric. Before it, the host writes the
address of the phase's *op list* into the program's ``phase_ops`` word and
launches task ``T_RUN``; every PE then executes the records of its list in
order. A record is a header (``kind``, ``length`` in words) followed by the
fields of its kind; scalar fields take one word, descriptor fields two (the
``.dsd`` encoding of ``docs/architecture.md`` section 4.4), and some kinds end
with a table. The list ends with a record of kind ``end``.

This module is the one home of the layout: :func:`assembler_defines` turns it
into the ``XX_FIELD`` offset constants that ``train.s`` uses, and
:func:`encode` builds records for the host.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.isa import DsdKind

__all__ = ["KINDS", "FIELDS", "SPARSE_KINDS", "PREFIX", "HEADER_WORDS", "DSD", "dsd_mem", "dsd_fabin", "dsd_fabout",
           "encode", "decode", "record_words", "assembler_defines"]

#: Record kinds and their codes (``0`` ends a list).
KINDS = {"end": 0, "sgemm": 1, "relu": 2, "transpose": 3, "mask": 4, "wgrad": 5, "softmax": 6, "spgemm": 7,
         "spwgrad": 8}

#: Words of every record's header: ``kind`` then ``length``.
HEADER_WORDS = 2

#: A field holding a descriptor (two words).
DSD = "dsd"

#: Fields of each kind in order: ``(name, "word" | DSD)``. A trailing table
#: (``counts``) is appended by :func:`encode` after the fields.
FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "end": (),
    # The streamed GEMM (section "Streamed GEMM" of docs/weight_streaming.md).
    "sgemm": (("k", "word"), ("t", "word"), ("rounds", "word"), ("h", "word"), ("o_last", "word"),
              ("e0", "word"), ("acc", DSD), ("zero", DSD), ("x0", DSD), ("x1", DSD), ("w", DSD),
              ("out", DSD), ("inp", DSD), ("y", DSD), ("e_step", "word")),
    "relu": (("data", DSD),),
    "transpose": (("k", "word"), ("t", "word"), ("dst", DSD), ("src", DSD)),
    "mask": (("act", DSD), ("grad", DSD), ("tmp", DSD)),
    # Weight gradients; followed by the table counts[H] (outputs per rotation step).
    "wgrad": (("kx", "word"), ("t", "word"), ("h", "word"), ("bias", "word"), ("send_first", "word"),
              ("own", "word"), ("buf0", "word"), ("buf1", "word"), ("gk", "word"),
              ("g", DSD), ("zero", DSD), ("x0", DSD), ("x1", DSD), ("dyr", DSD), ("eout", DSD),
              ("ein", DSD), ("dyo", DSD), ("rout", DSD), ("rin", DSD), ("mem", DSD)),
    # Softmax cross-entropy delta; followed by the table counts[H] (classes per rotation step).
    "softmax": (("c", "word"), ("ci", "word"), ("t", "word"), ("h", "word"), ("row", "word"),
                ("send_first", "word"), ("own", "word"), ("buf0", "word"), ("buf1", "word"),
                ("zall", "word"), ("ht", "word"), ("n", "word"), ("nb", "word"), ("fb", "word"),
                ("sb", "word"), ("ib", "word"),
                ("tmem", DSD), ("rout", DSD), ("rin", DSD), ("mem", DSD), ("m", DSD), ("s", DSD),
                ("inv", DSD), ("tmp", DSD), ("two", DSD), ("zn", DSD), ("fn", DSD), ("rn", DSD),
                ("onehot", DSD), ("scale", DSD), ("dz", DSD)),
    # The sparse streamed GEMM of a masked layer (section 13 of docs/weight_streaming.md); ``b`` steps
    # per block (partials of a block, then its ring operations), ``acc`` the first of b slots of t words;
    # followed by the table steps[n]: per output step, (non-zeros of this row << 2) | ring kind (SPARSE_KINDS).
    "spgemm": (("t", "word"), ("b", "word"), ("acc", DSD), ("zero", DSD), ("x", DSD), ("w", DSD), ("out", DSD),
               ("inp", DSD), ("y", DSD)),
    # The weight gradients of a masked layer; followed by the table counts[H] (outputs per rotation
    # step) and, per output in rotation order, the kept weights of this row (read by the cycle model);
    # ``w`` names the color of the mask's index stream (train_sparse.s receives it on C_W).
    "spwgrad": (("t", "word"), ("h", "word"), ("bias", "word"), ("send_first", "word"), ("own", "word"),
                ("buf0", "word"), ("buf1", "word"), ("ga", "word"), ("g", DSD), ("gall", DSD), ("zero", DSD),
                ("x", DSD), ("eout", DSD), ("ein", DSD), ("dyo", DSD), ("rout", DSD), ("rin", DSD),
                ("mem", DSD), ("w", DSD)),
}

#: The ring kinds of a sparse step, as the ``steps`` table of an ``spgemm`` record codes them. The
#: ring part of a block names each step's kind by a marker (``train_sparse.s``'s ``spgemm``, included
#: by ``train.s``): ``-(kind + 1)`` (-1 .. -4) for a step with a non-zero on the row, which runs on its
#: slot, and 1, 0, 2, 3 for first, mid, last, only of a step without one, which runs on the zero block
#: (``ws_phases._RING_MARKS``).
SPARSE_KINDS = {"first": 0, "mid": 1, "last": 2, "only": 3}

#: The prefix of each kind's offset constants in ``train.s``.
PREFIX = {"end": "END", "sgemm": "SG", "relu": "RL", "transpose": "TR", "mask": "MK", "wgrad": "WG",
          "softmax": "SM", "spgemm": "SP", "spwgrad": "SW"}

_TABLES = {"wgrad": "counts", "softmax": "counts", "spgemm": "steps", "spwgrad": "counts"}


def _offsets(kind: str) -> dict[str, int]:
    offsets, at = {}, HEADER_WORDS
    for name, what in FIELDS[kind]:
        offsets[name] = at
        at += 2 if what == DSD else 1
    if kind in _TABLES:
        offsets[_TABLES[kind]] = at
    return offsets


def _dsd(kind: DsdKind, base: int, length: int, stride: int) -> tuple[int, int]:
    if not (0 <= base <= 0xFFFF and 0 <= length <= 0xFFFF and -(1 << 15) <= stride < (1 << 15)):
        raise ValueError(f"descriptor out of range: base {base}, length {length}, stride {stride}")
    return base | length << 16, int(kind) | (stride & 0xFFFF) << 16


def dsd_mem(base: int, length: int, stride: int = 1) -> tuple[int, int]:
    """The two words of a memory descriptor."""
    return _dsd(DsdKind.MEM, int(base), int(length), int(stride))


def dsd_fabin(color: int, length: int = 0) -> tuple[int, int]:
    """The two words of a fabric-in descriptor."""
    return _dsd(DsdKind.FABIN, int(color), int(length), 0)


def dsd_fabout(color: int, length: int = 0) -> tuple[int, int]:
    """The two words of a fabric-out descriptor."""
    return _dsd(DsdKind.FABOUT, int(color), int(length), 0)


def record_words(kind: str, table: int = 0) -> int:
    """Length in words of a record of ``kind`` with a trailing table of ``table`` words."""
    fields = sum(2 if what == DSD else 1 for _, what in FIELDS[kind])
    return HEADER_WORDS + fields + table


def encode(kind: str, values: dict, table=()) -> np.ndarray:
    """One record as ``uint32`` words.

    ``values`` gives every field of ``kind`` (integers for words, word pairs
    from :func:`dsd_mem` and friends for descriptors); ``table`` is the
    trailing table of the kinds that have one.
    """
    fields = FIELDS[kind]
    missing = [name for name, _ in fields if name not in values]
    extra = sorted(set(values) - {name for name, _ in fields})
    if missing or extra:
        raise ValueError(f"{kind} record: missing fields {missing}, unknown fields {extra}")
    table = [int(v) for v in table]
    words = [KINDS[kind], record_words(kind, len(table))]
    for name, what in fields:
        value = values[name]
        if what == DSD:
            words.extend(int(w) for w in value)
        else:
            words.append(int(value) & 0xFFFFFFFF)
    words.extend(v & 0xFFFFFFFF for v in table)
    return np.array(words, dtype=np.uint32)


def decode(words) -> tuple[str, dict, list[int]]:
    """``(kind, fields, table)`` of the record at the start of ``words``.

    Word fields are ints; descriptor fields are ``(kind, base, length, stride)``
    with ``kind`` a :class:`~wse.firmware.isa.DsdKind`.
    """
    words = [int(w) for w in words]
    kind = {code: name for name, code in KINDS.items()}[words[0]]
    if kind == "end":
        return kind, {}, []
    length = words[1]
    fields, at = decode_fields(words, FIELDS[kind])
    return kind, fields, words[at:length]


def decode_fields(words: list[int], layout) -> tuple[dict, int]:
    """The fields of a record whose header starts ``words``, laid out as
    ``layout`` (``(name, WORD | DSD)`` pairs, as in :data:`FIELDS`): word
    fields as ints, descriptor fields as ``(kind, base, length, stride)``
    with ``kind`` a :class:`~wse.firmware.isa.DsdKind`. Returns the fields
    and the index of the first word after them."""
    fields, at = {}, HEADER_WORDS
    for name, what in layout:
        if what == DSD:
            w0, w1 = words[at], words[at + 1]
            stride = (w1 >> 16) & 0xFFFF
            fields[name] = (DsdKind(w1 & 3), w0 & 0xFFFF, w0 >> 16, stride - 0x10000 if stride & 0x8000 else stride)
            at += 2
        else:
            fields[name] = words[at]
            at += 1
    return fields, at


def assembler_defines() -> dict[str, int]:
    """``{"K_SGEMM": 1, "SG_K": 2, ...}``: kind codes and field offsets for ``train.s``."""
    defines = {f"K_{kind.upper()}": code for kind, code in KINDS.items()}
    defines["R_KIND"], defines["R_LEN"] = 0, 1
    for kind in FIELDS:
        for name, offset in _offsets(kind).items():
            defines[f"{PREFIX[kind]}_{name.upper()}"] = offset
    return defines
