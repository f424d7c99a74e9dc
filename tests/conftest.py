"""Shared test setup: no test reads or writes the user's cycle cache."""

import sys

import pytest


@pytest.fixture(autouse=True)
def _fresh_cycle_cache(tmp_path_factory, monkeypatch):
    """Every test compiles against an empty cycle cache of its own (``wse.host.compiler.cycle_cache``):
    a cold cache, as a first compile has, whatever the user's cache holds (subprocesses inherit it);
    the tally of where cycle counts came from starts empty."""
    monkeypatch.setenv("WSE_CACHE_DIR", str(tmp_path_factory.mktemp("cycle-cache")))
    monkeypatch.delenv("WSE_CYCLE_CACHE", raising=False)
    cache = sys.modules.get("wse.host.compiler.cycle_cache")
    if cache is not None:
        cache.TALLY.reset()
