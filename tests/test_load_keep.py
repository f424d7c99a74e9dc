"""``load(program, rect, keep)`` (``sim/api.py``, ``docs/architecture.md`` section 5): the data words of
the ``keep`` ranges keep what they held, every other data word the image does not write reads 0, a
program runs on the kept words, and a ``keep`` that is not word ranges or that a data segment of the
program writes is one ``UsageError`` with the same message on every device."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from wse.config import UsageError
from wse.firmware.asm import assemble
from wse.sim.cosim.lockstep import Lockstep
from wse.sim.cosim.programs import COSIM_CONFIG
from wse.sim.defects import DefectDevice, DefectMap, plan_remap
from wse.sim.devices import make_device
from wse.sim.golden import Fabric

# Data at words 0..3; the program copies kept word 12 to word 30 (which a load clears).
SOURCE = """
        .data
a0:     .word 7
a1:     .word 8
a2:     .word 9
a3:     .word 10
        .text
start:
        ld      r3, 12(r0)
        st      r3, 30(r0)
        exit
        .task 0, start
"""
KEEP = [(12, 16), (20, 22)]


def _config():
    return COSIM_CONFIG.with_mesh(3, 2)


def _defect_device(config):
    physical = config.with_mesh(config.width + 1, config.height)
    remap = plan_remap(DefectMap(physical.width, physical.height, frozenset({(1, 0)})))
    return DefectDevice(Fabric(physical), remap)


DEVICES = {
    "golden": lambda cfg: make_device("golden", cfg),
    "vector": lambda cfg: make_device("vector", cfg),
    "vector-torch-cpu": lambda cfg: make_device("vector-torch-cpu", cfg),
    "verilator": lambda cfg: make_device("verilator", cfg),
    "lockstep": lambda cfg: Lockstep(Fabric(cfg), make_device("vector", cfg)),
    "defects": _defect_device,
}
PARAMS = list(DEVICES) + [pytest.param("icarus", marks=[
    pytest.mark.slow, pytest.mark.skipif(shutil.which("iverilog") is None, reason="iverilog is not installed")])]


def _make(name, config):
    return make_device("icarus", config) if name == "icarus" else DEVICES[name](config)


@pytest.mark.parametrize("name", PARAMS)
def test_kept_words_survive_a_load_and_the_others_clear(name):
    config = _config()
    device = _make(name, config)
    try:
        program = assemble(SOURCE, filename="keep.s", config=config)
        h, w = config.height, config.width
        pattern = (np.arange(h * w * 24, dtype=np.uint32).reshape(h, w, 24) * 2654435761 + 1).astype(np.uint32)
        device.load(program)
        device.memcpy_h2d(8, pattern)                 # words 8..31
        device.load(program, keep=KEEP)
        got = device.memcpy_d2h(0, 40)
        want = np.zeros((h, w, 40), dtype=np.uint32)
        want[:, :, :4] = [7, 8, 9, 10]
        for lo, hi in KEEP:
            want[:, :, lo:hi] = pattern[:, :, lo - 8:hi - 8]
        assert np.array_equal(got, want)
        device.launch(0)
        assert device.run() > 0
        assert np.array_equal(device.memcpy_d2h(30, 1)[:, :, 0], pattern[:, :, 12 - 8])
        # a rect: only its PEs load (word 12, not kept, clears inside the rect and survives outside it);
        # a plain load clears what was kept
        device.load(program, rect=(1, 0, 2, 1), keep=[(30, 31)])
        assert np.array_equal(device.memcpy_d2h(30, 1)[:, :, 0], pattern[:, :, 12 - 8])
        inside = np.zeros((h, w), dtype=bool)
        inside[0, 1:3] = True
        assert np.array_equal(device.memcpy_d2h(12, 1)[:, :, 0], np.where(inside, 0, pattern[:, :, 12 - 8]))
        device.load(program)
        assert not device.memcpy_d2h(4, 36).any()
    finally:
        close = getattr(device, "close", None)
        if close is not None:
            close()


def _message(device, program, keep) -> str:
    with pytest.raises(UsageError) as error:
        device.load(program, keep=keep)
    return str(error.value)


@pytest.mark.parametrize("name", [n for n in DEVICES if n != "golden"])
def test_a_bad_keep_is_one_line_the_same_on_every_device(name):
    config = _config()
    program = assemble(SOURCE, filename="keep.s", config=config)
    golden, device = Fabric(config), _make(name, config)
    cases = [[(2, 6)], [(0, config.sram_words + 1)], [(5, 3)], "ab", [(1.5, 4)], [1, 2], None]
    for keep in cases:
        want = _message(golden, program, keep)
        assert _message(device, program, keep) == want and "\n" not in want
    assert _message(golden, program, [(2, 6)]) == ("program keep.s has data at words 2..3, inside the kept range "
                                                   "(2, 6); a load keeps a word or writes it, not both")
    assert _message(golden, program, [(5, 3)]) == (f"load keep must be a sequence of (lo, hi) word ranges with "
                                                   f"0 <= lo <= hi <= {config.sram_words}, not (5, 3)")


@pytest.mark.parametrize("name", ["golden", "verilator"])
def test_a_kept_word_keeps_its_flip_undecoded_until_read(name):
    """A load that keeps a word keeps it as stored, check bits included: an injected single flip is neither
    corrected nor counted by the load, and a double flip in a kept word no program reads raises nothing;
    the program's read corrects the single flip and counts it, the same on the golden model and the RTL."""
    config = _config()
    device = _make(name, config)
    try:
        program = assemble(SOURCE, filename="keep.s", config=config)
        device.load(program)
        device.memcpy_h2d(12, np.full((config.height, config.width, 4), 5, dtype=np.uint32))
        device.inject(0, 0, 12, [3])
        device.inject(1, 0, 13, [3, 5])
        device.load(program, keep=[(12, 16)])
        assert {k: int(v.sum()) for k, v in device.ecc_counters().items()} == {"corrected": 0, "detected": 0}
        device.launch(0)
        device.run()
        assert {k: int(v.sum()) for k, v in device.ecc_counters().items()} == {"corrected": 1, "detected": 0}
        assert not (device.memcpy_d2h(30, 1) - 5).any()      # every PE copied the (corrected) 5
    finally:
        close = getattr(device, "close", None)
        if close is not None:
            close()
