"""The layer-pipelined PE program (``pipe.s``) and its op records.

The same record scheme as :mod:`.records` (a header ``kind``, ``length`` in
words, then the kind's fields: one word for a scalar, two for a descriptor;
a list ends with a record of kind ``end``), with the kinds of the
layer-pipelined mode. This module is the one home of their layout:
:func:`assembler_defines` gives ``pipe.s`` its ``XX_FIELD`` offsets and
:func:`encode` builds records for the host.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from wse.config import FabricConfig
from wse.firmware.asm import assemble_file
from wse.firmware.image import Program

from .records import DSD, HEADER_WORDS, decode_fields, dsd_fabin, dsd_fabout, dsd_mem

__all__ = ["pipelined_program", "PIPE_SOURCE", "T_RUN", "KINDS", "FIELDS", "PREFIX", "encode", "decode", "record_words", "assembler_defines",
           "PV_ENTRY", "encode_pvop", "pvop_entries",
           "dsd_mem", "dsd_fabin", "dsd_fabout"]

#: The program's source file (it includes ``pipe_sparse.s``, the harvesting record ``psfwd``).
PIPE_SOURCE = Path(__file__).resolve().parent / "pipe.s"
#: The local task that runs a phase's op list.
T_RUN = 0

#: Record kinds and their codes (``0`` ends a list).
KINDS = {"end": 0, "pfwd": 1, "pbwd": 2, "pupd": 3, "psfwd": 4, "pvop": 5}

#: Fields of each kind in order: ``(name, "word" | DSD)``.
FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "end": (),
    # One layer's forward pass on one PE of its region, for every sample (pipe.s).
    "pfwd": (("t", "word"), ("k", "word"), ("o", "word"), ("xbase", "word"), ("ybase", "word"),
             ("first", "word"), ("last", "word"), ("bias", "word"), ("relu", "word"), ("send", "word"),
             ("xin", DSD), ("xs", DSD), ("acc", DSD), ("w0", DSD), ("w1", DSD), ("cin", DSD),
             ("cout", DSD), ("ys", DSD), ("b", DSD), ("xout", DSD)),
    # The forward pass with activation sparsity harvesting (pipe_sparse.s, docs/layer_pipelined.md
    # section 6a): pfwd's fields and `xw` (the inputs from the second on), then `sin`
    # (1: the inputs arrive as (index, value) pairs
    # ending with index -1: only the nonzero ones; 2: they arrive dense and the PE
    # skips the zeros, its multiply-adds as with the pairs: pk_rec; `sout` then unused), `sout` (send only the nonzero outputs
    # so), `layer`, `lin`, `lout` (the layer and the first input and output feature of
    # the PE's blocks: the static cycle model's key to the activation pattern), `wbase`
    # (the tile's address), `pbase` (two words for a pair), `zk` and `zo` (+0 times K, O),
    # `pair` (the pair in memory), `pin` (a pair from the fabric), `pout` (a pair to the fabric).
    "psfwd": (("t", "word"), ("k", "word"), ("o", "word"), ("xbase", "word"), ("ybase", "word"),
              ("first", "word"), ("last", "word"), ("bias", "word"), ("relu", "word"), ("send", "word"),
              ("sin", "word"), ("sout", "word"), ("layer", "word"), ("lin", "word"), ("lout", "word"),
              ("wbase", "word"), ("pbase", "word"),
              ("xin", DSD), ("xs", DSD), ("acc", DSD), ("w0", DSD), ("w1", DSD), ("xw", DSD), ("cin", DSD),
              ("cout", DSD), ("ys", DSD), ("b", DSD), ("xout", DSD), ("zk", DSD), ("zo", DSD), ("pair", DSD),
              ("pin", DSD), ("pout", DSD)),
    # One layer's backward pass on one PE, for every sample (pipe.s): the delta
    # (from the host at the last layer, else from the next region's input-gradient
    # chain, through the ReLU mask) at the chain end, multicast back along the
    # output line; the input-gradient partials reduced along the input line; the
    # weight gradient accumulated in place; `xmask`: the previous layer's ReLU mask
    # applied by the input line's near end (into the scratch `xmk`) rather than at the chain end.
    "pbwd": (("t", "word"), ("k", "word"), ("o", "word"), ("xbase", "word"), ("ybase", "word"),
             ("dxbase", "word"), ("zero", "word"), ("end", "word"), ("host", "word"), ("mask", "word"), ("bias", "word"),
             ("mcast", "word"), ("dx", "word"), ("dxfirst", "word"), ("xmask", "word"),
             ("g", DSD), ("zg", DSD), ("db", DSD), ("zo", DSD), ("dz", DSD), ("ys", DSD), ("dyin", DSD),
             ("mk", DSD), ("dzout", DSD), ("dzin", DSD), ("wrow", DSD), ("dxv", DSD), ("bin", DSD),
             ("bout", DSD), ("xg", DSD), ("xmk", DSD)),
    # The optimizer on one PE's tile and bias at the end of a batch (pipe.s):
    # SGD with weight decay, momentum (dampening) and Nesterov, in torch.optim.SGD's order.
    "pupd": (("params", "word"), ("wd", "word"), ("mom", "word"), ("first", "word"), ("nest", "word"),
             ("rwd", "word"), ("rmu", "word"), ("rdamp", "word"), ("rlr", "word"),
             ("w", DSD), ("g", DSD), ("m", DSD), ("b", DSD), ("db", DSD), ("mb", DSD)),
    # `n` vector instructions run one after another (pipe.s): each entry `op` 0 is
    # `fmov d, a`, 1 is `fadd d, a, b`; any descriptor may be a fabric one. The first
    # entry is the record's fields, the other n - 1 follow it (PV_ENTRY words each;
    # encode_pvop, pvop_entries). The replicas' gradient reduction is made of them
    # (docs/layer_pipelined.md section 6b).
    "pvop": (("n", "word"), ("op", "word"), ("d", DSD), ("a", DSD), ("b", DSD)),
}

#: The prefix of each kind's offset constants in ``pipe.s``.
PREFIX = {"end": "END", "pfwd": "PF", "pbwd": "PB", "pupd": "PU", "psfwd": "PS", "pvop": "PV"}


def record_words(kind: str) -> int:
    """Length in words of a record of ``kind``."""
    return HEADER_WORDS + sum(2 if what == DSD else 1 for _, what in FIELDS[kind])


def encode(kind: str, values: dict) -> np.ndarray:
    """One record as ``uint32`` words; ``values`` gives every field of ``kind``
    (integers for words, word pairs from :func:`dsd_mem` and friends for descriptors).

    Raises
    ------
    ValueError
        For missing or unknown fields.
    """
    fields = FIELDS[kind]
    missing = [name for name, _ in fields if name not in values]
    extra = sorted(set(values) - {name for name, _ in fields})
    if missing or extra:
        raise ValueError(f"{kind} record: missing fields {missing}, unknown fields {extra}")
    words = [KINDS[kind], record_words(kind)]
    for name, what in fields:
        value = values[name]
        words.extend(int(w) for w in value) if what == DSD else words.append(int(value) & 0xFFFFFFFF)
    return np.array(words, dtype=np.uint32)


#: Words of one entry of a ``pvop`` record (``op``, ``d``, ``a``, ``b``).
PV_ENTRY = 7
_PV_FIELDS = FIELDS["pvop"][1:]


def encode_pvop(entries) -> np.ndarray:
    """A ``pvop`` record of ``entries``, each ``(op, d, a, b)`` (``b`` None for ``fmov``);
    the vector instructions run in order.

    Raises
    ------
    ValueError
        For an empty list.
    """
    entries = list(entries)
    if not entries:
        raise ValueError("a pvop record needs at least one entry")
    rows = [(op, d, a, b if b is not None else dsd_mem(0, 0)) for op, d, a, b in entries]
    op, d, a, b = rows[0]
    head = encode("pvop", dict(n=len(rows), op=op, d=d, a=a, b=b))
    tail = [[int(op), *map(int, d), *map(int, a), *map(int, b)] for op, d, a, b in rows[1:]]
    words = np.concatenate([head, np.array(tail, dtype=np.uint32).reshape(-1)])
    words[1] = len(words)
    return words


def pvop_entries(fields: dict) -> list[dict]:
    """The entries of a decoded ``pvop`` record, in order: ``{"op", "d", "a", "b"}`` each."""
    return [{name: fields[name if i == 0 else f"{name}_{i}"] for name, _ in _PV_FIELDS}
            for i in range(fields["n"])]


def decode(words) -> tuple[str, dict]:
    """``(kind, fields)`` of the record at the start of ``words``; descriptor
    fields as ``(kind, base, length, stride)``, as :func:`.records.decode` gives them.
    A ``pvop`` record's entries after the first are fields ``op_1``, ``d_1``, ... (:func:`pvop_entries`)."""
    words = [int(w) for w in words]
    kind = {code: name for name, code in KINDS.items()}[words[0]]
    fields = decode_fields(words, FIELDS[kind])[0]
    if kind == "pvop":
        at = record_words("pvop")
        for i in range(1, fields["n"]):
            entry = decode_fields([0] * HEADER_WORDS + words[at:at + PV_ENTRY], _PV_FIELDS)[0]
            fields.update({f"{name}_{i}": value for name, value in entry.items()})
            at += PV_ENTRY
    return kind, fields


def assembler_defines() -> dict[str, int]:
    """``{"K_PFWD": 1, "PF_T": 2, ...}``: kind codes and field offsets for ``pipe.s``."""
    defines = {f"K_{kind.upper()}": code for kind, code in KINDS.items()}
    defines["R_KIND"], defines["R_LEN"], defines["PV_ENTRY"] = 0, 1, PV_ENTRY
    for kind, fields in FIELDS.items():
        at = HEADER_WORDS
        for name, what in fields:
            defines[f"{PREFIX[kind]}_{name.upper()}"] = at
            at += 2 if what == DSD else 1
    return defines


@functools.lru_cache(maxsize=16)
def pipelined_program(config: FabricConfig) -> Program:
    """``pipe.s`` assembled for ``config`` (cached per configuration).

    Raises
    ------
    UsageError
        If the program does not fit ``config`` (instruction memory, colors, tasks).
    """
    return assemble_file(PIPE_SOURCE, config, assembler_defines() | {"T_RUN": T_RUN})
