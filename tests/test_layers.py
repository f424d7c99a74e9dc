"""The import layers (``wse.layers``, contracts in ``pyproject.toml``): kept by
the sources, and broken by a planted upward import, a planted cycle inside the
appliance, or a module in no layer (each planted in a staged copy)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from wse import layers

pytest.importorskip("importlinter")


def _plant(staged: Path, module: str, text: str) -> Path:
    """Replace ``module``'s link in a staged tree by a copy of it with ``text`` appended."""
    path = staged.joinpath(*module.split(".")).with_suffix(".py")
    if not path.exists():
        path = staged.joinpath(*module.split("."), "__init__.py")
    source = path.read_text(encoding="utf-8")
    path.unlink()
    path.write_text(source + "\n" + text + "\n", encoding="utf-8")
    return path


@pytest.fixture
def staged(tmp_path):
    return layers.stage(tmp_path)


def test_the_sources_keep_every_contract():
    kept, report = layers.check()
    assert kept, report
    assert "Contracts: 3 kept, 0 broken." in report


def test_an_upward_import_inside_a_function_breaks_the_layers(staged):
    # The kernel definitions reaching up for a device, lazily, as the runners once did.
    _plant(staged, "wse.firmware.kernels.common",
           "def _device(config):\n    from wse.sim.golden import Fabric\n    return Fabric(config)")
    done = layers.lint(staged)
    assert done.returncode == 1, done.stdout
    # Broken twice: the layers, and the packages' acyclicity (firmware <-> sim).
    assert "Contracts: 1 kept, 2 broken." in done.stdout
    assert "wse.firmware.kernels.common -> wse.sim.golden" in done.stdout
    assert "- .firmware -> .sim (1 import)" in done.stdout


def test_a_cycle_inside_the_appliance_is_caught(staged):
    package = staged / "wse" / "host" / "appliance"
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
                    and node.module and (package / f"{node.module.split('.')[0]}.py").exists()]
        if path.stem != "__init__" and imported:
            break
    else:
        pytest.skip("no module of the appliance imports another")
    _plant(staged, f"wse.host.appliance.{imported[0].split('.')[0]}", f"from . import {path.stem}  # noqa")
    done = layers.lint(staged)
    assert done.returncode == 1, done.stdout
    assert "No cycles are allowed in wse.host.appliance." in done.stdout


def test_a_module_in_no_layer_is_reported(staged):
    assert layers.unplaced_modules(staged) == []
    (staged / "wse" / "firmware" / "scratch.py").write_text('"""A new module."""\n', encoding="utf-8")
    (staged / "wse" / "sim" / "extra").mkdir()
    (staged / "wse" / "sim" / "extra" / "__init__.py").write_text("from wse.sim import runner\n", encoding="utf-8")
    assert layers.unplaced_modules(staged) == ["wse.firmware.scratch", "wse.sim.extra"]


def test_the_staged_tree_has_every_module_under_its_package_name(staged):
    names = set(layers.staged_modules(staged))
    assert {"wse", "wse.config", "wse.hdl.router", "wse.firmware.asm", "wse.firmware.kernels.common",
            "wse.sim.golden", "wse.sim.cosim.device", "wse.host.runtime", "wse.host.appliance"} <= names
    for package, folder in layers.ROOTS.items():
        count = len([p for p in (layers.REPO / folder).rglob("*.py") if "__pycache__" not in p.parts])
        if package != "wse":
            assert count == sum(1 for name in names if name == package or name.startswith(package + ".")), package
