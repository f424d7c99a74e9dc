"""Errors raised by the fabric models."""

from __future__ import annotations

from wse.config import UsageError

__all__ = ["FabricHang", "ProgramFault"]


class ProgramFault(UsageError):
    """A PE program did something the architecture forbids (an address outside
    the data memory, an unknown opcode, a fabric-in destination...). The
    message names the PE, the program counter and the instruction."""


class FabricHang(UsageError):
    """The fabric stopped making progress before becoming idle, or ran past
    ``max_cycles``. ``report`` lists what is stuck where."""

    def __init__(self, message: str, report: list[str], cycle: int):
        self.report = report
        self.cycle = cycle
        lines = [message] + [f"  {line}" for line in report]
        super().__init__("\n".join(lines))
