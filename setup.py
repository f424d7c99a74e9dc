"""Maps the top-level folders into the ``wse`` package.

``hdl/`` is ``wse.hdl``, ``firmware/`` is ``wse.firmware``, ``sim/`` is
``wse.sim`` and ``host/`` is ``wse.host``; every sub-folder with an
``__init__.py`` becomes a sub-package. Metadata lives in ``pyproject.toml``.
"""
from setuptools import find_packages, setup

ROOTS = {"wse": "wse", "wse.hdl": "hdl", "wse.firmware": "firmware", "wse.sim": "sim", "wse.host": "host"}

packages, package_dir = [], {}
for name, folder in ROOTS.items():
    packages.append(name)
    package_dir[name] = folder
    for sub in find_packages(folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)
