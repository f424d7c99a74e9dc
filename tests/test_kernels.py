"""The kernel library on the golden fabric: every kernel on several mesh
shapes and on sizes the mesh does not divide, compared bit for bit with its
reference in the documented order of operations; the check is shown to fail
on a perturbed run; the layout and route helpers; the ``wse kernel`` command.
"""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from wse import cli
from wse.config import FabricConfig, Port, UsageError
from wse.firmware.kernels import KERNELS
from wse.firmware.kernels.common import block_partition, chain_routes, multicast_routes, row_cells, column_cells
from wse.sim.devices import DEVICES
from wse.sim.golden import Fabric
from wse.sim.runner import run_kernel

MESHES = [(1, 1), (2, 2), (3, 2), (2, 3), (4, 4), (5, 3)]

# Sizes per kernel: divisible and not, fewer elements than PEs, one element.
SIZES = {
    "gemv": [dict(rows=12, cols=8), dict(rows=7, cols=5), dict(rows=2, cols=3), dict(rows=1, cols=1), dict(rows=3, cols=17)],
    "axpy": [dict(n=40), dict(n=23), dict(n=3), dict(n=1)],
    "dot": [dict(n=40), dict(n=23), dict(n=3), dict(n=1)],
    "broadcast": [dict(n=5, variant="row"), dict(n=5, variant="column"), dict(n=1, variant="row")],
    "reduce": [dict(n=5, variant="row"), dict(n=5, variant="column"), dict(n=1, variant="column")],
}
CASES = [(name, sizes) for name, options in SIZES.items() for sizes in options]


def config(width, height, **kw):
    return FabricConfig(width=width, height=height, **kw)


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"{m[0]}x{m[1]}")
@pytest.mark.parametrize("name,sizes", CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}{s}" for k, s in v.items()))
def test_kernel_is_bit_exact(name, sizes, mesh):
    report = run_kernel(name, config(*mesh), seed=7, **sizes)
    assert report["bit_exact"], report
    assert report["mismatches"] == 0
    assert report["mesh"] == f"{mesh[0]}x{mesh[1]}"
    assert report["cycles"] > 0
    assert report["max_abs_err_vs_float64"] < 1e-4
    fmacs = {"gemv": sizes.get("rows", 0) * sizes.get("cols", 0), "axpy": sizes.get("n"), "dot": sizes.get("n")}
    assert report["fmac_elements"] == fmacs.get(name, 0)
    util = np.array(report["utilization"])
    assert util.shape == (mesh[1], mesh[0])
    assert report["fmac_utilization"] == pytest.approx(report["fmac_elements"] / (mesh[0] * mesh[1] * report["cycles"]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(KERNELS)), width=st.integers(1, 6), height=st.integers(1, 6),
       a=st.integers(1, 30), b=st.integers(1, 30), variant=st.sampled_from(["row", "column"]),
       seed=st.integers(0, 2**32 - 1))
def test_random_shapes_are_bit_exact(name, width, height, a, b, variant, seed):
    sizes = {"gemv": dict(rows=a, cols=b), "axpy": dict(n=a * b), "dot": dict(n=a * b),
             "broadcast": dict(n=a, variant=variant), "reduce": dict(n=a, variant=variant),
             "spgemm": dict(rows=a, cols=b, n=1 + b % 8, sparsity=0.5), "spmv": dict(rows=a, cols=b, sparsity=0.5),
             "gelu": dict(rows=a, cols=b), "softmax": dict(n=a), "layernorm": dict(rows=a, cols=b),
             "attention": dict(n=a, cols=1 + b % 16, variant=("scores", "values", "backward-dv")[b % 3]),
             "layernorm_bwd": dict(rows=a, cols=b), "residual": dict(rows=a, cols=b)}[name]
    assert run_kernel(name, config(width, height), seed=seed, **sizes)["bit_exact"]


# The check can fail ---------------------------------------------------------------

def _flip(words):
    words = np.array(words, dtype=np.uint32, copy=True)
    if words.size:
        words.flat[0] ^= np.uint32(1 << 22)  # half the value: no rounding can hide it
    return words


class WrongInput(Fabric):
    """A device that corrupts the first word of the first stream it is given."""

    def stream_in(self, edge, index, color, words, ctrl=None):
        if not getattr(self, "tampered", False):
            self.tampered = True
            words = _flip(np.asarray(words, dtype=np.uint32))
        super().stream_in(edge, index, color, words, ctrl)


class WrongOutput(Fabric):
    """A device that corrupts the first word of the first non-empty result it returns."""

    def _tamper(self, words):
        if not getattr(self, "tampered", False) and words.size:
            self.tampered = True
            return _flip(words)
        return words

    def stream_out(self, edge, index, color, with_ctrl=False):
        return self._tamper(super().stream_out(edge, index, color))

    def memcpy_d2h(self, addr, n, rect=None):
        return self._tamper(super().memcpy_d2h(addr, n, rect))


@pytest.mark.parametrize("name", ["gemv", "axpy", "dot"])
def test_a_perturbed_input_is_caught(name):
    sizes = dict(rows=6, cols=5) if name == "gemv" else dict(n=20)
    assert run_kernel(name, config(2, 2), seed=3, **sizes)["bit_exact"]
    report = run_kernel(name, config(2, 2), seed=3, device=WrongInput, **sizes)
    assert not report["bit_exact"]
    assert report["mismatches"] >= 1


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_perturbed_result_is_caught(name):
    report = run_kernel(name, config(3, 2), seed=5, device=WrongOutput)
    assert not report["bit_exact"]
    assert report["mismatches"] == 1
    assert report["max_abs_err_vs_float64"] > 1e-3


def test_same_seed_same_report_and_seed_matters():
    first = run_kernel("dot", config(3, 2), seed=11, n=50)
    second = run_kernel("dot", config(3, 2), seed=11, n=50)
    other = run_kernel("dot", config(3, 2), seed=12, n=50)
    strip = lambda r: {k: v for k, v in r.items() if k != "seconds"}
    assert strip(first) == strip(second)
    assert first["max_abs_err_vs_float64"] != other["max_abs_err_vs_float64"]


def test_the_device_factory_is_used():
    made = []

    def factory(cfg):
        made.append(cfg)
        return Fabric(cfg)

    report = run_kernel("reduce", config(2, 3), device=factory, n=4)
    assert report["bit_exact"] and report["backend"] == "golden"
    assert made == [config(2, 3)]


# Impossible requests ------------------------------------------------------------------

@pytest.mark.parametrize("name,sizes,match", [
    ("gemv", dict(rows=0, cols=4), "gemv rows must be a positive integer, not 0"),
    ("axpy", dict(n=-3), "axpy n must be a positive integer"),
    ("dot", dict(n=2.5), "dot n must be a positive integer"),
    ("gemv", dict(n=4), "gemv takes rows, cols, not n"),
    ("reduce", dict(variant="diagonal"), "reduce variant must be one of row, column"),
    ("nope", {}, "unknown kernel 'nope'"),
])
def test_bad_requests(name, sizes, match):
    with pytest.raises(UsageError, match=match):
        run_kernel(name, config(2, 2), **sizes)


def test_data_larger_than_memory():
    with pytest.raises(UsageError, match=r"gemv 64x64 on a 1x1 mesh needs \d+ words per PE .* sram_words is 1024"):
        run_kernel("gemv", config(1, 1, sram_words=1024), rows=64, cols=64)
    with pytest.raises(UsageError, match="sram_words is 256"):
        run_kernel("axpy", config(2, 2, sram_words=256), n=4 * 250)
    # The same data fits on a bigger mesh.
    assert run_kernel("axpy", config(4, 4, sram_words=256), n=4 * 250)["bit_exact"]


def test_too_few_colors():
    with pytest.raises(UsageError, match="dot needs 6 colors"):
        run_kernel("dot", config(2, 2, colors=4, tasks=8))


def test_unknown_backend():
    with pytest.raises(UsageError, match="backend must be one of golden"):
        run_kernel("axpy", config(2, 2), backend="quantum")


# Layout and routes ------------------------------------------------------------------

@pytest.mark.parametrize("n,parts", [(10, 3), (3, 5), (0, 2), (16, 4), (1, 1), (7, 7)])
def test_block_partition(n, parts):
    blocks = block_partition(n, parts)
    assert len(blocks) == parts
    assert [i for b in blocks for i in b] == list(range(n))
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def _check_one_route_per_color(routes):
    seen = set()
    for x, y, color, _, _ in routes:
        assert (x, y, color) not in seen
        seen.add((x, y, color))


def test_chain_routes_alternate_colors():
    routes = chain_routes(row_cells(1, 4), Port.E, (5, 6), from_edge=False, to_edge=True)
    _check_one_route_per_color(routes)
    assert (0, 1, 6, Port.RAMP, (Port.E,)) in routes
    assert (1, 1, 6, Port.W, (Port.RAMP,)) in routes
    assert (1, 1, 5, Port.RAMP, (Port.E,)) in routes
    assert (3, 1, 5, Port.RAMP, (Port.E,)) in routes  # leaves the mesh on colors[4 % 2]
    assert not any(r[0] == 0 and r[3] == Port.W for r in routes)  # nothing enters from the west edge
    fed = chain_routes(column_cells(2, 3), Port.S, (0, 1), from_edge=True, to_edge=False)
    assert (2, 0, 0, Port.N, (Port.RAMP,)) in fed
    assert not any(r[1] == 2 and r[3] == Port.RAMP for r in fed)  # the last PE sends nothing on


def test_multicast_routes():
    from_pe = multicast_routes(row_cells(0, 3), Port.E, 4, from_edge=False)
    assert from_pe == [(0, 0, 4, Port.RAMP, (Port.E,)), (1, 0, 4, Port.W, (Port.RAMP, Port.E)),
                       (2, 0, 4, Port.W, (Port.RAMP,))]
    from_edge = multicast_routes(column_cells(1, 2), Port.S, 0, from_edge=True)
    assert from_edge == [(1, 0, 0, Port.N, (Port.RAMP, Port.S)), (1, 1, 0, Port.N, (Port.RAMP,))]
    assert multicast_routes(row_cells(0, 1), Port.E, 0, from_edge=False) == []


# The wse kernel command -------------------------------------------------------------

def test_cli_list(capsys):
    assert cli.main(["kernel", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == list(KERNELS)


def test_cli_json(capsys):
    assert cli.main(["kernel", "gemv", "--mesh", "3x2", "--seed", "4", "--rows", "10", "--cols", "7", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("kernel", "mesh", "backend", "sizes", "bit_exact", "max_abs_err_vs_float64", "cycles",
                "fmac_utilization", "utilization"):
        assert key in report
    assert report["kernel"] == "gemv" and report["mesh"] == "3x2" and report["backend"] == "golden"
    assert report["sizes"] == {"rows": 10, "cols": 7} and report["bit_exact"] is True
    assert len(report["utilization"]) == 2 and len(report["utilization"][0]) == 3


def test_cli_summary(capsys):
    assert cli.main(["kernel", "reduce", "--variant", "column", "--n", "9", "--mesh", "2x3"]) == 0
    out = capsys.readouterr().out
    assert "reduce n=9 along every column on a 2x3 mesh" in out and "bit exact" in out


def test_cli_sram_words(capsys):
    assert cli.main(["kernel", "axpy", "--n", "2000", "--mesh", "1x1", "--sram-words", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bit_exact"]


def test_cli_exits_1_when_not_bit_exact(capsys, monkeypatch):
    monkeypatch.setitem(DEVICES, "golden", dataclasses.replace(DEVICES["golden"], factory=WrongOutput))
    assert cli.main(["kernel", "axpy", "--n", "30", "--mesh", "2x2"]) == 1
    assert "NOT bit exact (1 of 30 words differ)" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["nope"], "unknown kernel 'nope'"),
    (["gemv", "--mesh", "0x4"], "mesh must have at least one column"),
    (["gemv", "--rows", "0"], "rows must be a positive integer"),
    (["axpy", "--n", "0"], "n must be a positive integer"),
    (["gemv", "--n", "5"], "gemv takes --rows, --cols, not --n"),
    (["axpy", "--n", "100000", "--mesh", "1x1"], "sram_words is 8192"),
    (["reduce", "--variant", "diag"], "variant must be one of row, column"),
    (["gemv", "--rows", "x"], "invalid int value"),
    (["dot", "--sram-words", "8"], "sram_words must be an integer"),
    ([], "name a kernel"),
    (["gemv", "--backend", "fpga"], "--backend must be one of golden, vector, vector-torch, vector-torch-cpu, "
                                       "vector-torch-cuda, verilator, icarus, not 'fpga'"),
])
def test_cli_bad_input_exits_2(capsys, argv, message):
    assert cli.main(["kernel"] + argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in captured.err


# Big meshes -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name,sizes", [("gemv", dict(rows=256, cols=256)), ("gemv", dict(rows=250, cols=301)),
                                        ("axpy", dict(n=10_000)), ("dot", dict(n=9_999)),
                                        ("broadcast", dict(n=100, variant="column")),
                                        ("reduce", dict(n=100, variant="row"))])
def test_big_mesh(name, sizes):
    report = run_kernel(name, config(16, 16), seed=1, **sizes)
    assert report["bit_exact"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["axpy", "dot"])
def test_streams_longer_than_a_descriptor(name):
    # PE 0 of the single row forwards 68,250 elements: more than one descriptor
    # length (65,535), so the forwarding loop runs twice.
    report = run_kernel(name, config(40, 1, sram_words=4096), seed=2, n=70_000)
    assert report["bit_exact"]
