"""Task selection of idle PEs (spec 4.3) on torch tensors, for a group of PEs at once.

The torch form of the vectorized model's task selection
(``VectorFabric._select_tasks``), on a state object whose attributes are the
tensors of :class:`~wse.sim.vector.state.PeState` (same names; words and
registers as ``int32`` patterns). A task is ready when it has an entry point,
is not blocked, and is activated or bound to a color whose input queue holds
a wavelet; each idle PE of the group takes its first ready task (``argmax``
over the task table) or, with none, waits. A task started by data takes the
head of its color's queue into ``r1`` (the word) and ``r2`` (the control
flag); one started by activation is deactivated. The PE runs the task from
its entry point one cycle later. Every step is a masked operation over the
group, so PEs picking different tasks cost nothing extra.
``tests/test_vector_torch.py`` compares it with the vectorized model's.
"""

from __future__ import annotations

import torch

__all__ = ["select_tasks"]


def select_tasks(s, pes: torch.Tensor, t: int, colors: int) -> tuple[torch.Tensor, int]:
    """Task selection of the idle PEs ``pes`` in cycle ``t`` on the state ``s`` (changed in
    place). Returns ``(the PEs that started a task, in group order, the wavelets taken)``."""
    if pes.numel() == 0:
        return pes, 0
    tasks = s.entry.shape[1]
    shared = min(tasks, colors)
    has_data = torch.zeros((pes.shape[0], tasks), dtype=torch.bool, device=pes.device)
    has_data[:, :shared] = s.rcount[pes, :shared] > 0
    data = s.bound[pes] & has_data
    ready = ~s.blocked[pes] & (s.entry[pes] >= 0) & (data | s.activated[pes])
    found = ready.any(dim=1)
    s.waiting[pes] = s.waiting[pes] | ~found
    pes, ready, data = pes[found], ready[found], data[found]
    if pes.numel() == 0:
        return pes, 0
    task = ready.to(torch.int32).argmax(dim=1)         # the first ready task
    by_data = data.gather(1, task[:, None])[:, 0]
    c = task.clamp(max=colors - 1)
    head = s.rhead[pes, c]
    slots = s.rdata.shape[2]
    regs = s.regs
    regs[pes, 1] = torch.where(by_data, s.rdata[pes, c, head], regs[pes, 1])
    regs[pes, 2] = torch.where(by_data, s.rctrl[pes, c, head].to(regs.dtype), regs[pes, 2])
    s.rhead[pes, c] = torch.where(by_data, (head + 1) % slots, head)
    s.rcount[pes, c] = s.rcount[pes, c] - by_data.to(s.rcount.dtype)
    s.activated[pes, task] = s.activated[pes, task] & by_data
    s.running[pes] = True
    s.task[pes] = task
    s.pc[pes] = s.entry[pes, task]
    s.task_start[pes] = t
    s.counters["tasks"][pes] = s.counters["tasks"][pes] + 1
    s.time[pes] = t + 1
    return pes, int(by_data.sum())
