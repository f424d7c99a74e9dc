"""Shared test setup: no test reads or writes the user's cycle cache."""

import os
import shutil
import sys
import tempfile

import pytest

_SESSION_CACHE = None


def pytest_configure(config):
    """Before any fixture (module- and session-scoped ones compile too), point the cycle cache
    (``wse.host.compiler.cycle_cache``) at a folder of this test session's own, so nothing reads or
    writes the user's cache; subprocesses inherit it."""
    global _SESSION_CACHE
    _SESSION_CACHE = tempfile.mkdtemp(prefix="wse-test-cycle-cache-")
    os.environ["WSE_CACHE_DIR"] = _SESSION_CACHE
    os.environ.pop("WSE_CYCLE_CACHE", None)


def pytest_unconfigure(config):
    """Remove the session's cache folder."""
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_cycle_cache(tmp_path_factory, monkeypatch):
    """Every test function compiles against an empty cycle cache of its own: a cold cache, as a
    first compile has (subprocesses inherit it); the tally of where cycle counts came from starts
    empty. Fixtures of a wider scope compile against the session's folder (:func:`pytest_configure`)."""
    monkeypatch.setenv("WSE_CACHE_DIR", str(tmp_path_factory.mktemp("cycle-cache")))
    monkeypatch.delenv("WSE_CYCLE_CACHE", raising=False)
    cache = sys.modules.get("wse.host.compiler.cycle_cache")
    if cache is not None:
        cache.TALLY.reset()


@pytest.fixture
def instances(monkeypatch):
    """``watch(module, name)``: the class ``module.name`` replaced, for the test, by a subclass that
    keeps every instance made; returns the list they are kept in, in order."""
    def watch(module, name: str) -> list:
        made = []

        class Kept(getattr(module, name)):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                made.append(self)
        monkeypatch.setattr(module, name, Kept)
        return made
    return watch
