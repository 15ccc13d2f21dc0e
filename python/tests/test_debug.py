"""Stale plans, the debug checks and the skipped-tokens errors from Python (issue 9)."""
import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _ffi
from conftest import filled


def test_a_plan_is_stale_once_its_request_releases_pages(arena):
    r, k, v = filled(arena, 12)
    arena.admit([(r, 2)])
    plan = mk.Plan(1, 2, 16)
    arena.plan_build([(r, 2)], plan)
    arena.check_plan(plan)
    r.release_oldest(4)
    with pytest.raises(mk.StalePlanError):
        arena.check_plan(plan)
    with pytest.raises(mk.StalePlanError):
        arena.write_kv(0, plan, k[:2], v[:2])


def test_a_plan_stays_valid_while_its_request_only_grows(arena):
    r, k, v = filled(arena, 6)
    arena.admit([(r, 2)])
    plan = mk.Plan(1, 2, 16)
    arena.plan_build([(r, 2)], plan)
    arena.commit([(r, 2)])
    arena.admit([(r, 9)])
    arena.commit([(r, 9)])
    arena.check_plan(plan)


def test_a_write_into_a_freed_page_fails_the_byte_audit():
    with mk.Arena(num_pages=16, page_size=4, num_layers=1, kv_heads=2, head_dim=8,
                  debug=_ffi.CONSTANTS["MSKV_DEBUG_ALL"]) as a:
        r, k, v = filled(a, 8)
        page = r.pages()[0]
        r.release_oldest(4)
        pool = a.pool(0, "k")
        assert np.all(np.isnan(pool[page]))      # poisoned: NaN
        a.audit_bytes()
        pool[page, 1, 0, 3] = 0.5                # a stale write
        with pytest.raises(mk.AuditFailedError, match="written after it was freed"):
            a.audit_bytes()


def test_the_byte_audit_needs_a_debug_check(arena):
    with pytest.raises(mk.UnsupportedError):
        arena.audit_bytes()


def test_skipped_tokens_of_an_invalid_policy_raises_instead_of_returning_zero():
    with pytest.raises(mk.InvalidSpecError):
        mk.Retention(0, window_chunks=1).skipped_tokens(100)
    with pytest.raises(mk.InvalidArgumentError):
        mk.Retention(10, window_chunks=1).skipped_tokens(-1)
    assert mk.Retention(10, sink_chunks=1, window_chunks=1).skipped_tokens(15) == 0
