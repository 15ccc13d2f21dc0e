"""Shared fixtures. The tests import the installed package (`pip install
./python`, which `make test` does into build/venv) or whatever MSKV_LIBRARY
and PYTHONPATH point at."""
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _ffi

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def headers():
    """The repository root holding mstar_kv.h and mstar_kv_cuda.h."""
    if not (REPO / "mstar_kv.h").is_file():
        pytest.skip("the headers are not next to python/ (%s): run from a checkout of the repository" % REPO)
    return REPO


@pytest.fixture
def cc():
    """The C compiler the layout checks compile with."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.skip("no C compiler on PATH (CC, cc, gcc, clang)")


def pytest_terminal_summary(terminalreporter):
    """The closing line every test program of the repository prints, so
    tests/run.sh adds these counts to the others (an error counts as a failure)."""
    stats = terminalreporter.stats
    n = {k: len([r for r in stats.get(k, []) if getattr(r, "when", "call") in ("call", "setup", "teardown")])
         for k in ("passed", "failed", "error", "skipped")}
    terminalreporter.write_line("%d passed, %d failed, %d skipped" % (n["passed"], n["failed"] + n["error"],
                                                                     n["skipped"]))


class Tripwire:
    """Stands in for the loaded library: any C function used raises."""

    def __init__(self):
        self.called = []

    def __getattr__(self, name):
        self.called.append(name)
        raise AssertionError("C function %s was called" % name)


@pytest.fixture
def no_c_calls(monkeypatch):
    """Within the test, any call into the library fails the test; for checks
    that must happen before the C call."""
    wire = Tripwire()
    monkeypatch.setattr(_ffi, "lib", wire)
    return wire


@pytest.fixture
def arena():
    """A small arena with f32 host pools: 64 pages of 4 tokens, 2 layers,
    2 kv heads of 8 dims."""
    with mk.Arena(num_pages=64, page_size=4, num_layers=2, kv_heads=2, head_dim=8) as a:
        yield a


def filled(arena, n, seed=0):
    """A request with n committed tokens whose K/V (layer 0) are random; returns (request, k, v)."""
    r = arena.add_request()
    arena.admit([(r, n)])
    plan = mk.Plan(1, n, 64)
    arena.plan_build([(r, n)], plan)
    g = np.random.default_rng(seed)
    info = arena.store_info()
    k = g.standard_normal((n, info.kv_heads, info.head_dim)).astype(np.float32)
    v = g.standard_normal((n, info.kv_heads, info.head_dim)).astype(np.float32)
    arena.write_kv(0, plan, k, v)
    arena.commit([(r, n)])
    arena.publish([(r, n)])
    return r, k, v
