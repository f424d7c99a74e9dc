"""Fault-injection testbench: memory and link faults on the full RTL mesh, in
lockstep with the golden model.

Flips go into both devices through the host API (``inject``: on the RTL a
host-bus read and write of the raw 39-bit code word, ``docs/architecture.md``
section 4.7) once a kernel's program and data are loaded, before its run.

* ``random_single_flips``: one random bit in each of ``WSE_COSIM_FLIPS``
  random non-zero words of every PE (default 4), for gemv and axpy: the
  result is bit exact, cycles, counters and memory equal the golden model's
  after the run, and so do the memory ECC counters, PE by PE; every flipped
  word is corrected once (by the kernel or by the lockstep's memory check).
* ``double_flip_stops_the_run``: two flips in a weight that gemv reads on
  the last PE: both runs stop with the same one-line report (PE, task, pc,
  address, stored bits, syndrome) and one detected error.

* ``random_link_flips``: a random bit flipped on each of
  ``WSE_COSIM_LINKS`` random links between routers that the kernel uses
  (default 6; found by a golden dry run), the first at cycle 0, the others at
  random cycles of the run, for gemv and reduce: the RTL's link coders
  (``hdl/link_ecc.py``) correct them; the result is bit exact and the link
  ECC counters equal the golden model's, link by link, one correction per
  flip that fired.
* ``link_double_flip_stops_the_run``: two flipped bits in the first wavelet
  of a random link that gemv uses: both
  runs stop with the same one-line report (link, cycle, color as received,
  received bits, syndrome) and one detected error.

Parameters (environment): ``WSE_COSIM_CONFIG`` (the mesh), ``WSE_COSIM_SIZE``
(default 24), ``WSE_COSIM_SEED``, ``WSE_COSIM_FLIPS`` (memory flips),
``WSE_COSIM_LINKS`` (link flips, default 6).
"""

from __future__ import annotations

import numpy as np

import cocotb

from wse.sim.cosim.lockstep import router_links
from wse.sim.golden.ecc import EccError, LinkEccError
from wse.sim.runner import run_kernel

from .common import config_from_env, env_int, in_thread, mesh_pair


def _before_first_run(pair, inject) -> dict:
    """Call ``inject(pair)`` just before the pair's first run; returns a record."""
    record: dict = {}
    run = pair.run

    def run_once_injected(max_cycles=None):
        if "words" not in record:
            record["words"] = inject(pair)
        return run(max_cycles)

    pair.run = run_once_injected
    return record


def _used_links(kernel: str, config, seed: int, **sizes) -> list[tuple[int, int, str]]:
    """The links between routers that ``kernel`` sends wavelets over, found by a golden dry run with a
    single flip armed at cycle 0 on every link (a link whose flip fired and was corrected carried a wavelet)."""
    from wse.config import Port
    from wse.sim.devices import make_device

    dev = make_device("golden", config)
    links = router_links(config.width, config.height)
    _before_first_run(dev, lambda d: [d.inject_link(x, y, p, [0], 0) for x, y, p in links])
    run_kernel(kernel, config, seed, device=lambda cfg: dev, **sizes)
    corrected = dev.link_ecc_counters()["corrected"]
    return [(x, y, p) for x, y, p in links if corrected[y, x, Port[p].value]]



@cocotb.test()
@cocotb.parametrize(kernel=["gemv", "axpy"])
async def random_single_flips(dut, kernel):
    """Random single flips: corrected, counted alike, bits and cycles unchanged."""
    pair = await mesh_pair(dut, check_emits=False)
    config = config_from_env()
    size, seed = env_int("SIZE", 24), env_int("SEED", 0)
    sizes = {"rows": size, "cols": size} if kernel == "gemv" else {"n": size}
    rng = np.random.default_rng(seed)
    record = _before_first_run(pair, lambda p: p.inject_random(rng, env_int("FLIPS", 4)))
    report = await in_thread(run_kernel, kernel, config, seed, device=lambda cfg: pair, **sizes)
    assert report["bit_exact"], f"{kernel}: {report['mismatches']} of {report['words']} result words differ"
    counts = await in_thread(pair.ecc_counters)      # golden and RTL compared PE by PE
    corrected = int(counts["corrected"].sum())
    assert corrected == record["words"] and not counts["detected"].any(), (corrected, record["words"])
    dut._log.info("%s: %d flipped words corrected, %d cycles", kernel, corrected, report["cycles"])


@cocotb.test()
async def double_flip_stops_the_run(dut):
    """Two flips in one word: both runs stop with the same report."""
    pair = await mesh_pair(dut, check_emits=False)
    config = config_from_env()
    x, y = config.width - 1, config.height - 1

    def double_flip(p):
        addr = int(np.flatnonzero(p.reference.pe(x, y).mem.view(np.ndarray))[-1])   # a weight gemv reads
        p.inject(x, y, addr, [4, 20])
        return 1

    _before_first_run(pair, double_flip)
    try:
        await in_thread(run_kernel, "gemv", config, env_int("SEED", 0), device=lambda cfg: pair, rows=8, cols=8)
    except EccError as exc:      # Lockstep raises it only when both reports are the same
        message = str(exc)
        assert message.startswith(f"PE ({x}, {y}) task ") and "uncorrectable" in message, message
        dut._log.info("both stopped: %s", message)
    else:
        raise AssertionError("a double flip was not reported")
    counts = await in_thread(pair.ecc_counters)
    assert int(counts["detected"].sum()) == 1, counts


@cocotb.test()
@cocotb.parametrize(kernel=["gemv", "reduce"])
async def random_link_flips(dut, kernel):
    """Random single flips on links at random cycles: corrected, counted alike, bits and cycles unchanged."""
    pair = await mesh_pair(dut, check_emits=False)
    config = config_from_env()
    size, seed = env_int("SIZE", 24), env_int("SEED", 0)
    sizes = {"rows": size, "cols": size} if kernel == "gemv" else {"n": size}
    clean = await in_thread(run_kernel, kernel, config, seed, **sizes)
    rng = np.random.default_rng(seed)
    used = await in_thread(_used_links, kernel, config, seed, **sizes)
    assert used, f"{kernel} sends nothing over a link on this mesh"
    record = _before_first_run(pair, lambda p: p.inject_random_links(rng, env_int("LINKS", 6), clean["cycles"],
                                                                     links=used, first_at_zero=True))
    report = await in_thread(run_kernel, kernel, config, seed, device=lambda cfg: pair, **sizes)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"], (report["mismatches"], report["cycles"])
    counts = await in_thread(pair.link_ecc_counters)      # golden and RTL compared link by link
    fired = len(record["words"]) - len(pair.reference.routers.link_flips)
    corrected = int(counts["corrected"].sum())
    assert corrected == fired and not counts["detected"].any(), (corrected, fired)
    assert fired > 0, "no armed link flip fired: the test checked nothing"
    dut._log.info("%s: %d link flips corrected, %d cycles", kernel, corrected, report["cycles"])


@cocotb.test()
async def link_double_flip_stops_the_run(dut):
    """Two flipped bits on links: both runs stop with the same report."""
    pair = await mesh_pair(dut, check_emits=False)
    config = config_from_env()
    rng = np.random.default_rng(env_int("SEED", 0))
    used = await in_thread(_used_links, "gemv", config, env_int("SEED", 0), rows=8, cols=8)
    _before_first_run(pair, lambda p: p.inject_random_links(rng, 1, 1, flips=2, links=used,
                                                            first_at_zero=True))      # the link's first wavelet
    try:
        await in_thread(run_kernel, "gemv", config, env_int("SEED", 0), device=lambda cfg: pair, rows=8, cols=8)
    except LinkEccError as exc:      # Lockstep raises it only when both reports are the same
        message = str(exc)
        assert message.startswith("the link from router (") and " at cycle " in message, message
        dut._log.info("both stopped: %s", message)
    else:
        raise AssertionError("a double flip on a link was not reported")
    counts = await in_thread(pair.link_ecc_counters)
    assert int(counts["detected"].sum()) == 1, counts
