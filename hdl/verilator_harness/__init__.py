"""C++ test harnesses that drive Verilator models of the HDL blocks.

``fpu_tb.cpp`` evaluates a combinational model once per operand pair read
from a file; :mod:`wse.hdl.fpucheck` builds and runs it.
"""
