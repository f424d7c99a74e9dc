"""Decoding and checking the PEs' vector instructions on torch tensors, for a group at once.

The torch forms of the numba kernels that prepare a vector instruction
(:mod:`wse.sim.vector.veck`): :func:`decode_operands` (each PE's descriptors
for the slots dst, a, b, its scalar operand and element count, spec 4.5),
:func:`touches_fabric` (whether an operand is on the fabric), :func:`any_fault`
(whether any instruction of the group faults: bad descriptor kinds,
``fmacw`` operands, a vector leaving memory; the caller's array checks then
raise the golden model's message), :func:`count` (the counters) and
:func:`begin` (the ``v*`` state of a fabric vector instruction that starts).
Each is a few gathers and masked operations over the group, every PE
reading its own descriptor registers. ``tests/test_vector_torch.py`` checks
each against its numba kernel on random groups.
"""

from __future__ import annotations

import torch

__all__ = ["decode_operands", "touches_fabric", "any_fault", "count", "begin"]

_MEM, _FABIN, _FABOUT = 0, 1, 2
_DOT, _FMACS, _FMACW = 9, 5, 11


def _descriptor(table: torch.Tensor, pes: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``table[pes[j], d[j, slot]]`` as ``[group, 3]`` (``d`` clamped where a slot is absent)."""
    return table[pes[:, None], d.clamp(0, table.shape[1] - 1)]


def decode_operands(pes, rows, vop, dd, da, db, vec_fmt, has_db, has_rs, rs, dsd_kind, dsd_base, dsd_len,
                    dsd_stride, regs) -> tuple[torch.Tensor, ...]:
    """:func:`~wse.sim.vector.veck.decode_operands`: ``(kind, base, ln, stride)`` ``[group, 3]``
    (a missing slot has kind -1 and zeros), ``scalar`` and ``n`` ``[group]``."""
    present = torch.stack([vec_fmt[rows] == 0, torch.ones_like(rows, dtype=torch.bool), has_db[rows] == 1], dim=1)
    d = torch.stack([dd[rows], da[rows], db[rows]], dim=1)
    kind = torch.where(present, _descriptor(dsd_kind, pes, d), -1)
    base, ln, stride = (torch.where(present, _descriptor(t, pes, d), 0) for t in (dsd_base, dsd_len, dsd_stride))
    scalar = torch.where(has_rs[rows] == 1, regs[pes, rs[rows].clamp(0, regs.shape[1] - 1)], 0)
    per = torch.minimum(ln[:, 0], ln[:, 1])
    fmacw = torch.where(per > 0, torch.maximum(ln[:, 0], ln[:, 1]), 0)
    n = torch.where(vop[rows] == _FMACW, fmacw, torch.where(kind[:, 0] < 0, ln[:, 1], ln[:, 0]))
    return kind, base, ln, stride, scalar, n


def touches_fabric(pes, rows, dd, da, db, vec_fmt, has_db, dsd_kind) -> torch.Tensor:
    """:func:`~wse.sim.vector.veck.touches_fabric`: ``[group]`` bool, an operand is a fabric descriptor."""
    def fabric(d):
        return dsd_kind[pes, d[rows].clamp(0, dsd_kind.shape[1] - 1)] != _MEM

    return fabric(da) | ((vec_fmt[rows] == 0) & fabric(dd)) | ((has_db[rows] == 1) & fabric(db))


def _span_bad(base, stride, n, words: int) -> torch.Tensor:
    last = base + (n - 1) * stride
    return (n > 0) & ~((base >= 0) & (base < words) & (last >= 0) & (last < words))


def any_fault(vop, kind, base, ln, stride, n, colors: int, words: int, fabric: bool) -> bool:
    """:func:`~wse.sim.vector.veck.any_fault`: whether any instruction of the group faults."""
    k0, k1, k2 = kind[:, 0], kind[:, 1], kind[:, 2]
    bad = torch.zeros_like(k0, dtype=torch.bool)
    if fabric:
        bad |= (k0 == _FABIN) | (k1 >= _FABOUT) | (k2 >= _FABOUT)
        bad |= (k1 == _FABIN) & (k2 == _FABIN) & (base[:, 1] == base[:, 2])
        bad |= ((kind > _MEM) & (base >= colors)).any(dim=1)
    fmacw = vop == _FMACW
    memory_ops = (k0 != _MEM) | (k1 != _MEM)
    period = torch.minimum(ln[:, 0], ln[:, 1]).clamp(min=1)
    chunks = torch.div(n + period - 1, period, rounding_mode="floor")
    fmacw_bad = memory_ops | _span_bad(base[:, 0], stride[:, 0], torch.minimum(n, ln[:, 0]), words) \
        | _span_bad(base[:, 1], stride[:, 1], torch.minimum(n, ln[:, 1]), words) \
        | ((k2 == _MEM) & _span_bad(base[:, 2], stride[:, 2], chunks, words))
    bad |= fmacw & torch.where(n > 0, fmacw_bad, memory_ops)
    need = kind == _MEM if fabric else kind >= 0
    spans = need & _span_bad(base, stride, n[:, None], words)
    bad |= ~fmacw & spans.any(dim=1)
    return bool(bad.any())


def count(pes, vop, n, instructions, flops, fmac) -> None:
    """:func:`~wse.sim.vector.veck.count`: the counters of the vector instructions ``vop`` (in place)."""
    instructions[pes] = instructions[pes] + 1
    flops[pes] = flops[pes] + torch.where(vop != 0, n, 0)
    fmac[pes] = fmac[pes] + torch.where((vop == _FMACS) | (vop == _DOT) | (vop == _FMACW), n, 0)


def begin(pes, rows, kind, base, ln, stride, scalar, n, code_rd, regs, vacc, vactive, vrow, vi, vn, vscalar,
          vkind, vbase, vlen, vstride) -> None:
    """:func:`~wse.sim.vector.veck.begin`: the ``v*`` state of the fabric vector instructions that
    ``pes`` start (in place)."""
    vacc[pes] = torch.where(kind[:, 0] < 0, regs[pes, code_rd[rows]], torch.zeros_like(vacc[pes]))
    vactive[pes] = True
    vrow[pes], vi[pes], vn[pes], vscalar[pes] = rows, 0, n, scalar.to(vscalar.dtype)
    for table, value in ((vkind, kind), (vbase, base), (vlen, ln), (vstride, stride)):
        table[pes] = value.to(table.dtype)
