"""Simulation: the numpy golden fabric model and the cocotb testbenches."""
