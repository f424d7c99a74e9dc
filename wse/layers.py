"""The import layers of the package, checked: ``python -m wse.layers`` (part of ``make lint`` and ``make test``).

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``): the
layers bottom-up (configuration, numerics, the ISA and the assembler; the
kernel definitions; the RTL and the golden model; the devices and their
registry; the kernel runner, the compiler and the runtime; MemoryX and
SwarmX; the appliance; the command line), no import cycles between
packages, and none inside ``host/appliance``. Function-level imports count
like any other.

import-linter reads a package from one folder, while ``wse`` is assembled
from five (``setup.py``: ``hdl/`` is ``wse.hdl``, ...). So the check stages
the package as a tree of links to the source files in a temporary folder and
runs ``lint-imports`` on it in a fresh interpreter. It also checks that every
module is in a layer, so a new module cannot slip past the contract.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

__all__ = ["REPO", "ROOTS", "stage", "staged_modules", "layer_entries", "unplaced_modules", "lint", "check", "main"]

#: The repository: the folder holding ``wse/`` and ``pyproject.toml``.
REPO = Path(__file__).resolve().parent.parent
#: Package -> source folder, as ``setup.py`` maps them.
ROOTS = {"wse": "wse", "wse.hdl": "hdl", "wse.firmware": "firmware", "wse.sim": "sim", "wse.host": "host"}


def stage(folder: Path, repo: Path = REPO) -> Path:
    """Lay out the ``wse`` package under ``folder`` as links to the ``.py`` files of
    ``repo`` (real folders, one link per file, so a file can be swapped in the
    staged copy alone); returns ``folder``."""
    folder = Path(folder)
    for package, source in ROOTS.items():
        root = repo / source
        target = folder.joinpath(*package.split("."))
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            relative = Path(dirpath).relative_to(root)
            if package == "wse" and relative != Path("."):
                continue  # wse/ holds modules only; its sub-packages come from the other folders
            for name in filenames:
                if name.endswith(".py"):
                    link = target / relative / name
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(Path(dirpath, name).resolve())
    return folder


def staged_modules(folder: Path) -> list[str]:
    """Every module name of a staged tree (packages by their ``__init__``)."""
    names = []
    for path in sorted(Path(folder, "wse").rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def layer_entries(config: Path = REPO / "pyproject.toml") -> list[str]:
    """The modules and packages named in the layers contracts of ``config``."""
    with open(config, "rb") as file:
        contracts = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    entries = []
    for contract in contracts:
        if contract["type"] == "layers":
            for layer in contract["layers"]:
                entries += [item.strip() for item in layer.replace(":", "|").split("|")]
    return entries


def _imports_nothing(path: Path) -> bool:
    """Whether a module has no import statement (a package's ``__init__`` that only documents)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return not any(isinstance(node, (ast.Import, ast.ImportFrom)) for node in ast.walk(tree))


def unplaced_modules(folder: Path, config: Path = REPO / "pyproject.toml") -> list[str]:
    """The modules of a staged tree that no layer covers (neither they nor a
    package holding them is named in a layer). Packages that hold layers of
    their own (``wse``, ``wse.sim``, ...) count as placed when their
    ``__init__`` imports nothing, or when they are the root package."""
    entries = set(layer_entries(config))
    unplaced = []
    for name in staged_modules(folder):
        parts = name.split(".")
        if any(".".join(parts[:i]) in entries for i in range(1, len(parts) + 1)):
            continue
        init = Path(folder, *parts, "__init__.py")
        holds_layers = any(entry.startswith(name + ".") for entry in entries)
        if holds_layers and (name == "wse" or _imports_nothing(init)):
            continue
        unplaced.append(name)
    return unplaced


def lint(folder: Path, config: Path = REPO / "pyproject.toml") -> subprocess.CompletedProcess:
    """Run ``lint-imports`` with the contracts of ``config`` on the staged tree in
    ``folder``; the result's ``returncode`` is 0 when every contract is kept."""
    command = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
               "sys.exit(c())", "--no-cache", "--no-logo", str(Path(config).resolve())]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)


def check(config: Path = REPO / "pyproject.toml", repo: Path = REPO) -> tuple[bool, str]:
    """Stage ``repo`` and check it: ``(kept, report)``, the report being
    import-linter's output and the modules in no layer."""
    with tempfile.TemporaryDirectory(prefix="wse-layers-") as folder:
        stage(Path(folder), repo)
        done = lint(Path(folder), config)
        unplaced = unplaced_modules(Path(folder), config)
    report = done.stdout + done.stderr
    if unplaced:
        report += "\nModules in no layer (add them to the layers in pyproject.toml):\n" + \
            "".join(f"  {name}\n" for name in unplaced)
    return done.returncode == 0 and not unplaced, report


def main() -> int:
    """Entry point of ``python -m wse.layers``: prints the report; exit status 0 when the layers are kept."""
    kept, report = check()
    print(report, end="" if report.endswith("\n") else "\n")
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
