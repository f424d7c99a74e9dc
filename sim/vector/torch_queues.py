"""The PEs' ``send``/``sendc``/``recv`` attempts on torch tensors, for a group of PEs at once.

The torch form of :func:`wse.sim.vector.veck.send_recv`, with its arguments
(registers and queue words as ``int32`` patterns, everything changed in
place): in cycle ``t`` each PE of the group attempts its own instruction on
the start-of-cycle counts of its queues. A ``send`` or ``sendc`` needs room in
the output queue (fewer than ``tx_depth`` wavelets) and appends the
register's word with its color (control flag 1 for ``sendc``); a ``recv``
needs a wavelet on its color and takes the head into ``rd`` (``r0`` is not
written). A PE that cannot go on is marked waiting; the others finish the
instruction (counters, ``pc``, the time of their next action). Each PE
touches only its own queues, so the whole group is one set of masked
gathers and scatters. ``tests/test_vector_torch.py`` compares it with the
numba kernel on random queues and instructions.
"""

from __future__ import annotations

import torch

__all__ = ["send_recv"]


def _put(table: torch.Tensor, index: tuple, mask: torch.Tensor, values) -> None:
    """``table[index] = values`` where ``mask`` (the old value elsewhere; the rows are distinct PEs)."""
    old = table[index]
    table[index] = torch.where(mask, torch.as_tensor(values, device=table.device).to(table.dtype), old)


def send_recv(pes, rows, t: int, kind_send, sendc: int, op, ra, rd, color, cycles, regs, rdata, rhead, rcount,
              tdata, tcolor, tctrl, thead, tcount, tx_depth: int, waiting, instructions, stall, instr_start, pc,
              time) -> torch.Tensor:
    """:func:`~wse.sim.vector.veck.send_recv` on tensors; returns the PEs that went on, in group order."""
    if pes.numel() == 0:
        return pes
    rslots, tslots = rdata.shape[2], tdata.shape[1]
    c = color[rows]
    send = kind_send.to(torch.bool)
    can_send = send & (tcount[pes] < tx_depth)
    count = rcount[pes, c]
    can_recv = ~send & (count > 0)
    went = can_send | can_recv
    _put(waiting, (pes,), ~went, True)
    slot = (thead[pes] + tcount[pes]) % tslots
    _put(tdata, (pes, slot), can_send, regs[pes, ra[rows]])
    _put(tcolor, (pes, slot), can_send, c)
    _put(tctrl, (pes, slot), can_send, (op[rows] == sendc).to(tctrl.dtype))
    tcount[pes] = tcount[pes] + can_send.to(tcount.dtype)
    head = rhead[pes, c]
    target = rd[rows]
    _put(regs, (pes, target), can_recv & (target != 0), rdata[pes, c, head])
    _put(rhead, (pes, c), can_recv, (head + 1) % rslots)
    rcount[pes, c] = count - can_recv.to(rcount.dtype)
    instructions[pes] = instructions[pes] + went.to(instructions.dtype)
    _put(stall, (pes,), went, stall[pes] + t - instr_start[pes])
    _put(instr_start, (pes,), went, -1)
    _put(pc, (pes,), went, pc[pes] + 1)
    _put(time, (pes,), went, t + cycles[rows])
    return pes[went]
