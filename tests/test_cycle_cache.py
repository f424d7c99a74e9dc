"""The cycle cache (``wse.host.compiler.cycle_cache``): a warm compile reads the cycle model's
replays from disk and gives the same executable; any change of what a replay reads misses; a
bad entry is replayed again; a cache that cannot be written never fails a compile."""

import dataclasses
import os

import numpy as np
import pytest
import torch

from wse.config import FabricConfig
from wse.firmware.training.timing import END
from wse.host.compiler import compile_model, cycle_cache, cycles, trace
from wse.host.compiler.cycles import Network, phase_injections, phase_ops
from wse.host.compiler.replay import run_replay
from wse.host.compiler.weight_streaming import plan
from mlps import mlp


def _plan(mesh=(3, 2), sizes=(6, 24, 24, 3), batch=5, **config):
    torch.manual_seed(0)
    return plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])),
                FabricConfig(width=mesh[0], height=mesh[1], **config), batch)


def _cold(the_plan, **kwargs):
    """The counts with nothing carried over in this process (the in-process memo emptied)."""
    cycles.MEMO = cycles.ReplayMemo()
    return cycles.phase_cycles(the_plan, progress=False, **kwargs)


@pytest.fixture(autouse=True)
def _own_memo(monkeypatch):
    monkeypatch.setattr(cycles, "MEMO", cycles.ReplayMemo())


def _entries():
    return sorted(p for p in os.listdir(cycle_cache.cache_dir()) if p.endswith(".cyc"))


def _saved(exe, path):
    exe.save(path)
    with np.load(path) as data:
        return {k: data[k].copy() for k in data.files}


def test_a_warm_compile_reads_every_replay_and_gives_the_same_executable(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, x = mlp(5, 40, 24, 3), torch.randn(6, 5)
    cold = compile_model(model, x, batch=6, config=FabricConfig(width=3, height=2))
    assert cycle_cache.TALLY.replayed > 0 and cycle_cache.TALLY.cached == 0
    stored = _entries()
    assert len(stored) == cycle_cache.TALLY.stored == cycle_cache.TALLY.replayed
    spent = cycle_cache.TALLY.replay_cpu_s      # each replay's CPU seconds, by the first phase that needed it
    assert len(spent) == cycle_cache.TALLY.replayed and set(spent) <= set(cold.phases)
    assert all(s > 0 for s in spent.values())
    cycle_cache.TALLY.reset()
    assert cycle_cache.TALLY.replay_cpu_s == {} and cycle_cache.TALLY.replay_cpu_s is not spent

    def no_replay(*args, **kwargs):
        raise AssertionError("a warm compile replayed")
    monkeypatch.setattr(cycles, "_replay_exits", no_replay)
    monkeypatch.setattr(cycles, "MEMO", cycles.ReplayMemo())
    warm = compile_model(model, x, batch=6, config=FabricConfig(width=3, height=2))
    assert cycle_cache.TALLY.cached == len(stored) and cycle_cache.TALLY.replayed == 0
    assert cycle_cache.TALLY.replay_cpu_s == {}
    assert {n: p.cycles for n, p in warm.phases.items()} == {n: p.cycles for n, p in cold.phases.items()}
    a, b = _saved(cold, tmp_path / "cold.wse"), _saved(warm, tmp_path / "warm.wse")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    line = cycle_cache.take_report_line()
    assert line.startswith("cycle counts: from the cycle cache ") and str(cycle_cache.cache_dir()) in line
    assert cycle_cache.report_line() is None            # taken: the tally starts again


def test_warm_counts_equal_the_full_replay_on_several_meshes():
    """Non-square, one-row and one-column meshes, uneven token blocks: cold, warm and the reference agree."""
    for mesh, sizes, batch in [((3, 2), (5, 36, 30, 4), 7), ((4, 1), (5, 24, 20, 3), 9), ((1, 3), (4, 30, 33, 3), 5)]:
        the_plan = _plan(mesh, sizes, batch)
        cold = _cold(the_plan)
        assert _cold(the_plan) == cold == cycles.phase_cycles(the_plan, progress=False, reuse=False,
                                                              periods=False, engine="reference")


def test_the_stored_result_does_not_depend_on_the_replay_options():
    """The key leaves out ``periods``, ``engine`` and the reduced replay: each gives the same count and the
    same last cycle of every PE, so the same entry."""
    the_plan = _plan((4, 2), (6, 60, 40, 3), 8)
    network = Network(the_plan.config, the_plan.routes)
    for name, phase in the_plan.phases.items():
        key = cycles.MEMO.key(network, *phase_ops(the_plan, phase), phase_injections(phase))
        starts, ends = key[1][8], key[1][9]
        results = [run_replay(network, key[3], starts, ends, phase_injections(phase), periods=periods,
                              engine=engine, columns=columns)
                   for periods, engine, columns in [(True, None, None), (True, "reference", False),
                                                    (False, "events", None), (False, "reference", None)]]
        assert all(r[0] == results[0][0] and np.array_equal(r[1], results[0][1]) for r in results), name


def test_an_entry_gives_back_each_phases_count():
    """An entry keeps the count and the latest last cycle of each op range: every phase sharing it (its
    own closing cycles) gets the count of its own replay."""
    the_plan = _plan((3, 2), (6, 24, 24, 24, 3), 5)
    network = Network(the_plan.config, the_plan.routes)
    disk = cycle_cache.open_cache(network)
    for name, phase in the_plan.phases.items():
        ops, starts, ends = phase_ops(the_plan, phase)
        key = cycles.MEMO.key(network, ops, starts, ends, phase_injections(phase))
        result = run_replay(network, key[3], starts, ends, phase_injections(phase))
        assert disk.put(key, result)
        back = disk.get(key)
        assert back[0] == result[0] and cycles.ReplayMemo.finish(back, key) == cycles.ReplayMemo.finish(result, key)
        assert cycles.ReplayMemo.finish(back, key) == run_replay(network, ops, starts, ends,
                                                                 phase_injections(phase))[0], name


def _key(the_plan, phase_name=None, ops=None, inject=None):
    network = Network(the_plan.config, the_plan.routes)
    phase = the_plan.phases[phase_name or next(iter(the_plan.phases))]
    o, s, e = phase_ops(the_plan, phase)
    key = cycles.MEMO.key(network, o if ops is None else ops, s, e,
                          phase_injections(phase) if inject is None else inject)
    return cycle_cache.CycleCache(cycle_cache.cache_dir(), the_plan.config).digest(key)


def test_any_change_of_what_a_replay_reads_misses(monkeypatch):
    base = _plan()
    name = next(iter(base.phases))
    reference = _key(base)
    assert _key(_plan()) == reference                                   # the same inputs: the same entry
    ops, _, _ = phase_ops(base, base.phases[name])
    changed = ops.copy()
    changed[int(np.flatnonzero(changed[:, 0] != END)[0]), 1] += 1      # one op row
    assert _key(base, ops=changed) != reference
    inject = {k: {c: n + 1 for c, n in v.items()} for k, v in phase_injections(base.phases[name]).items()}
    assert inject and _key(base, inject=inject) != reference            # the edge ports' wavelets
    assert _key(base, phase_name=list(base.phases)[1]) != reference
    rerouted = dataclasses.replace(base, routes=list(base.routes)[:-1])  # the routes
    assert _key(rerouted) != reference
    for change in ({"rx_depth": 3}, {"router_depth": 3}, {"tx_depth": 4}, {"colors": 24}, {"sram_words": 8000}):
        assert _key(_plan(**change)) != reference, change              # any configuration field
    monkeypatch.setattr(cycle_cache, "VERSION", "another version of the cycle model")
    assert _key(base) != reference                                      # the cycle model's code


def test_the_version_is_the_cycle_models_source(tmp_path):
    files = cycle_cache.source_files()
    names = [f.name for f in files]
    assert {"cycles.py", "network.py", "replay.py", "replay_periods.py", "cycle_cache.py", "timing.py"} <= set(names)
    assert cycle_cache.VERSION == cycle_cache.source_version() and len(cycle_cache.VERSION) == 64
    copies = []
    for f in files:
        copies.append(tmp_path / f"{len(copies)}" / f.name)
        copies[-1].parent.mkdir()
        copies[-1].write_bytes(f.read_bytes())
    assert cycle_cache.source_version(copies) == cycle_cache.VERSION
    for copy in copies:                              # one byte more in any of them: another version
        data = copy.read_bytes()
        copy.write_bytes(data + b"\n")
        assert cycle_cache.source_version(copies) != cycle_cache.VERSION, copy.name
        copy.write_bytes(data)


def test_a_corrupt_or_truncated_entry_is_replayed_and_written_again():
    the_plan = _plan()
    counts = _cold(the_plan)
    entries = _entries()
    folder = cycle_cache.cache_dir()
    damaged = {entries[0]: lambda b: b[:-5], entries[1]: lambda b: b[:12] + bytes([b[12] ^ 1]) + b[13:],
               entries[2]: lambda b: b""}
    originals = {}
    for entry, damage in damaged.items():
        originals[entry] = (folder / entry).read_bytes()
        (folder / entry).write_bytes(damage(originals[entry]))
    os.replace(folder / entries[3], folder / "moved.tmp")               # a valid entry under another name
    os.replace(folder / entries[4], folder / entries[3])
    os.replace(folder / "moved.tmp", folder / entries[4])
    cycle_cache.TALLY.reset()
    assert _cold(the_plan) == counts
    assert cycle_cache.TALLY.replayed == 5 and cycle_cache.TALLY.stored == 5
    for entry, data in originals.items():
        assert (folder / entry).read_bytes() == data                    # written again, whole


def test_an_unwritable_cache_still_compiles(tmp_path, monkeypatch, capsys):
    the_plan = _plan()
    expected = _cold(the_plan)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WSE_CACHE_DIR", str(blocker / "cycles"))        # no folder can be made under a file
    cycle_cache.TALLY.reset()
    assert _cold(the_plan) == expected
    assert _cold(the_plan) == expected
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"wse: cycle cache {blocker / 'cycles'} cannot be written")
    assert cycle_cache.TALLY.stored == 0 and "not stored" in cycle_cache.report_line()


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("WSE_CYCLE_CACHE", "0")
    the_plan = _plan()
    counts = _cold(the_plan)
    assert not _entries() and not cycle_cache.enabled()
    assert "the cycle cache is off: WSE_CYCLE_CACHE=0" in cycle_cache.report_line()
    monkeypatch.delenv("WSE_CYCLE_CACHE")
    assert _cold(the_plan) == counts and _entries()


def test_the_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("WSE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cycle_cache.cache_dir() == tmp_path / "xdg" / "wse" / "cycles"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cycle_cache.cache_dir() == tmp_path / "home" / ".cache" / "wse" / "cycles"


def test_the_least_recently_used_entries_go_past_the_limit():
    the_plan = _plan()
    _cold(the_plan)
    folder = cycle_cache.cache_dir()
    entries = _entries()
    for age, entry in enumerate(entries):          # the first entry the oldest
        os.utime(folder / entry, (1_000_000 + age, 1_000_000 + age))
    size = sum(os.stat(folder / e).st_blocks * 512 or os.stat(folder / e).st_size for e in entries)
    disk = cycle_cache.CycleCache(folder, the_plan.config)
    disk.trim(size)
    assert _entries() == entries                   # within the limit: nothing goes
    disk.trim(size - 1)
    left = _entries()
    assert 0 < len(left) < len(entries) and left == sorted(entries[len(entries) - len(left):])


def test_a_cache_folder_that_cannot_be_named_turns_the_cache_off(monkeypatch):
    the_plan = _plan()
    expected = _cold(the_plan)
    monkeypatch.setenv("WSE_CACHE_DIR", "~no-such-user-of-this-machine/cycles")    # expanduser raises
    cycle_cache.TALLY.reset()
    assert _cold(the_plan) == expected
    line = cycle_cache.report_line()
    assert line.startswith("cycle counts: replayed") and "no cache folder" in line and "WSE_CACHE_DIR" in line


def test_the_line_says_when_every_count_came_from_this_process(monkeypatch):
    tally = cycle_cache.Tally(shared=3, folder="/somewhere")
    assert cycle_cache.report_line(tally) == "cycle counts: from this process's earlier replays (3 phases)"
    tally = cycle_cache.Tally(cached=2, shared=1, folder="/somewhere")
    assert cycle_cache.report_line(tally) == "cycle counts: from the cycle cache /somewhere (2 replays skipped)"


def test_a_dead_writers_temporary_file_goes_when_old():
    the_plan = _plan()
    _cold(the_plan)
    folder = cycle_cache.cache_dir()
    old, new = folder / ".x.cyc.abc.tmp", folder / ".y.cyc.def.tmp"
    old.write_bytes(b"half")
    new.write_bytes(b"half")
    os.utime(old, (1_000_000, 1_000_000))
    cycle_cache.CycleCache(folder, the_plan.config).trim()
    assert not old.exists() and new.exists() and _entries()
