"""Training firmware for weight streaming: the PE program (``train.s``), the
layout of its op records (:mod:`.records`) and the bit-exact references of
its multi-instruction float algorithms (:mod:`.numerics`).

:func:`training_program` assembles the program for a fabric configuration;
the compiler (:mod:`wse.host.compiler`) lays out the op records and the
runtime (:mod:`wse.host.runtime`) drives it phase by phase.
"""

from __future__ import annotations

import functools
from pathlib import Path

from wse.config import FabricConfig
from wse.firmware.asm import assemble_file
from wse.firmware.image import Program

from . import numerics, records

__all__ = ["training_program", "SOURCE", "T_RUN", "C_W"]

#: The program's source file (it includes ``train_sparse.s``, the records ``spgemm`` and ``spwgrad``).
SOURCE = Path(__file__).resolve().parent / "train.s"
#: The local task that runs a phase's op list.
T_RUN = 0
#: The color of the weight stream.
C_W = 0


@functools.lru_cache(maxsize=16)
def training_program(config: FabricConfig) -> Program:
    """``train.s`` assembled for ``config`` (cached per configuration).

    Raises
    ------
    UsageError
        If the program does not fit ``config`` (instruction memory, colors, tasks).
    """
    defines = records.assembler_defines() | numerics.assembler_defines() | {"C_W": C_W, "T_RUN": T_RUN}
    return assemble_file(SOURCE, config, defines)
