"""Timelines and heatmaps: the trace agrees with the counters, the pictures are what they say."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from wse.config import FabricConfig
from wse.sim.golden import Fabric
from wse.sim.golden.heatmap import DPI, mesh_pictures, save_heatmaps
from wse.sim.golden.perfetto import write_trace
from wse.sim.runner import main as kernel_main
from wse.sim.runner import run_kernel

CASES = [("gemv", {"rows": 45, "cols": 30}), ("axpy", {"n": 40}), ("dot", {"n": 33}),
         ("reduce", {"n": 9}), ("broadcast", {"variant": "column", "n": 7})]


def _recorded(name: str, sizes: dict, mesh=(4, 3), **record):
    fabrics = []

    def factory(config):
        fabric = Fabric(config)
        fabric.record(**record)
        fabrics.append(fabric)
        return fabric

    report = run_kernel(name, FabricConfig(width=mesh[0], height=mesh[1]), seed=1, device=factory, **sizes)
    return report, fabrics[0]


@pytest.mark.parametrize("name,sizes", CASES)
def test_slices_add_up_to_the_counters(name, sizes):
    report, fabric = _recorded(name, sizes, queues=[(1, 1)])
    rec = fabric.recorder
    assert rec.total_cycles == fabric.total_cycles == report["cycles"]
    for pe in fabric.pes:
        sums = rec.pe_sums(pe.index)
        assert sums["task"] == pe.counters["busy"]
        assert sums["stall"] == pe.counters["stall"]
        assert sums["task"] + sums["idle"] == rec.total_cycles
        assert rec.stall[:, pe.index].sum() == pe.counters["stall"]
    assert rec.links.sum() == fabric.wavelet_hops
    assert rec.fmac.sum() == report["fmac_elements"]


@pytest.mark.parametrize("name,sizes", CASES)
def test_recording_changes_neither_bits_nor_cycles(name, sizes):
    config = FabricConfig(width=4, height=3)
    plain = run_kernel(name, config, seed=1, **sizes)
    traced, fabric = _recorded(name, sizes)
    for key in ("bit_exact", "cycles", "fmac_elements", "utilization", "mismatches"):
        assert plain[key] == traced[key]
    plain_fabric = Fabric(config)
    run_kernel(name, config, seed=1, device=lambda c: plain_fabric, **sizes)
    for key, grid in plain_fabric.counters()["pe"].items():
        assert np.array_equal(grid, fabric.counters()["pe"][key])


def _check_trace(path, cycles: int) -> list[dict]:
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    assert events and isinstance(events, list)
    for event in events:
        for key in ("ph", "ts", "pid", "tid"):
            assert key in event, event
        assert event["ph"] in ("X", "C", "M")
        assert isinstance(event["ts"], int) and 0 <= event["ts"] <= cycles
        if event["ph"] == "X":
            assert event["dur"] >= 0 and event["ts"] + event["dur"] <= cycles
            assert isinstance(event["name"], str)
    return events


def test_trace_is_trace_event_json_and_matches_counters(tmp_path):
    report, fabric = _recorded("gemv", {"rows": 45, "cols": 30}, queues=[(0, 0)])
    path = tmp_path / "gemv.json"
    write_trace(fabric.recorder, path)
    events = _check_trace(path, report["cycles"])
    width = fabric.width
    per_pe: dict[int, dict] = {}
    for e in events:
        if e["ph"] == "X" and e["pid"] == 1:
            sums = per_pe.setdefault(e["tid"] - 1, {"task": 0, "stall": 0, "idle": 0})
            if e["cat"] in sums:
                sums[e["cat"]] += e["dur"]
    assert len(per_pe) == fabric.width * fabric.height
    for index, sums in per_pe.items():
        pe = fabric.pe(index % width, index // width)
        assert sums["task"] == pe.counters["busy"] and sums["stall"] == pe.counters["stall"]
        assert sums["task"] + sums["idle"] == report["cycles"]
    # X slices of one track nest or follow each other, as the viewer needs.
    for tid in {e["tid"] for e in events if e["pid"] == 1 and e["ph"] == "X"}:
        stack = []
        for e in sorted((e for e in events if e["pid"] == 1 and e["tid"] == tid and e["ph"] == "X"),
                        key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1]
            stack.append(e["ts"] + e["dur"])
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"phases", "FIFO (0, 0)", "PE (3, 2)"} <= names
    assert any(n.startswith("stream in N") for n in names)


def test_region_and_event_limit_keep_the_file_small():
    _, fabric = _recorded("gemv", {"rows": 45, "cols": 30}, rect=(1, 1, 2, 1), max_events=30)
    rec = fabric.recorder
    assert set(rec.slices) == {5, 6}
    assert rec.events == 30 and rec.dropped > 0


def _png(path):
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(raw):
        length, kind = struct.unpack(">I4s", raw[at:at + 8])
        body = raw[at + 8:at + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", raw[at + 8 + length:at + 12 + length])[0]
        chunks.append((kind, body))
        at += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    return struct.unpack(">II", chunks[0][1][:8])


def test_heatmap_is_a_png_of_the_expected_size_with_one_cell_per_pe(tmp_path):
    import matplotlib.image

    w, h = 7, 3
    grid = np.arange(w * h, dtype=np.float64).reshape(h, w)
    info = save_heatmaps(tmp_path / "h.png", [("a", grid, grid.max(), "u"), ("b", grid[::-1], grid.max(), "u")],
                         "test", annotate=False)
    assert _png(info["path"]) == info["size"]
    assert info["cells"] == w * h and len(info["boxes"]) == 2
    pixels = matplotlib.image.imread(info["path"])
    assert pixels.shape[:2] == (info["size"][1], info["size"][0])
    for left, top, right, bottom in info["boxes"]:
        inner = pixels[top + 3:bottom - 3, left + 3:right - 3, :3]
        colors = {tuple(c) for c in np.round(inner.reshape(-1, 3), 3)}
        assert len(colors) == w * h
    assert info["size"][0] == round(info["size"][0] / DPI * DPI)


def test_mesh_pictures_and_the_kernel_command(tmp_path, capsys):
    code = kernel_main(["axpy", "--mesh", "3x2", "--n", "20", "--trace", str(tmp_path / "t.json"),
                        "--pictures", str(tmp_path / "pics"), "--trace-queue", "1,0"])
    assert code == 0
    out = capsys.readouterr().out
    assert "timeline" in out and "fmac.png" in out
    for name in ("fmac", "stalls", "links"):
        width, height = _png(tmp_path / "pics" / f"{name}.png")
        assert width > 200 and height > 100
    _, fabric = _recorded("axpy", {"n": 20}, mesh=(3, 2))
    paths = mesh_pictures(fabric.recorder, tmp_path / "again", prefix="k_")
    assert sorted(p.name for p in paths.values()) == ["k_fmac.png", "k_links.png", "k_stalls.png"]


@pytest.mark.parametrize("argv,words", [
    (["axpy", "--trace-region", "0,0,1,1"], "need --trace"),
    (["axpy", "--trace", "t.json", "--trace-region", "0,0,1"], "--trace-region must be X,Y,W,H"),
    (["axpy", "--trace", "t.json", "--trace-queue", "a,b"], "--trace-queue must be X,Y"),
    (["axpy", "--trace", "/no/such/folder/t.json"], "does not exist"),
    (["axpy", "--pictures", "p", "--backend", "verilator"], "need --backend golden"),
    (["axpy", "--trace", "t.json", "--trace-region", "0,0,9,9"], "--trace-region"),
])
def test_bad_trace_options_are_one_line_errors(argv, words, tmp_path, monkeypatch, capsys):
    from wse.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["kernel"] + argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_first_step_pictures_and_the_run_report(tmp_path, capsys):
    from types import SimpleNamespace

    from wse.cli import main
    from wse.host.appliance.pictures import FirstStep

    config = FabricConfig(width=3, height=2)
    fabric = Fabric(config)
    backend = SimpleNamespace(device=fabric, make_device=Fabric, load=None)
    first = FirstStep(SimpleNamespace(runtime=SimpleNamespace(backend=backend)), tmp_path)
    assert first.active
    cycles = {}
    for phase, kernel in (("fwd fc1", "axpy"), ("bwd-data fc1", "dot")):
        cycles[phase] = run_kernel(kernel, config, device=lambda c: fabric, n=12)["cycles"]
    index = first.finish(cycles)
    assert fabric.recorder is None and list(index["phases"]) == list(cycles)
    assert (tmp_path / "pictures" / "fwd_fc1_fmac.png").is_file()
    assert index["windows"]["bwd-data fc1"]["cycles"] == cycles["bwd-data fc1"]
    assert index["hot"]["fwd fc1"]["host_stream_wavelets"]["in"] > 0
    _check_trace(tmp_path / "pictures" / "step1_trace.json", sum(cycles.values()))
    (tmp_path / "fabric.txt").write_text("FCMNIST: weight_streaming on a 3x2 mesh\n")
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "weight_streaming" in out and "| fwd fc1 |" in out and "step1_trace.json" in out
    assert (tmp_path / "report.md").read_text().strip() == out.strip()
    assert main(["report", str(tmp_path / "pictures")]) == 2
    assert "not a run folder" in capsys.readouterr().err
