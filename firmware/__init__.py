"""The PE instruction set (one table), the assembler and the kernel library."""
