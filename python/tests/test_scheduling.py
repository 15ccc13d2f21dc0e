"""Lockstep groups, preemption (make_room, admit_query), scratch entries,
reset / flush, the rank check, layer groups, position shifts and the full
plan descriptor, from Python: each against what the C call promises."""
import threading

import numpy as np
import pytest

import mstar_kv as mk
from conftest import filled


def _step(arena, segments):
    arena.admit(segments)
    arena.commit(segments)
    arena.publish(segments)


# ---- lockstep groups (classifier-free guidance) --------------------------------------------------

def test_a_lockstep_pair_is_admitted_committed_and_offloaded_together(arena):
    cond, uncond = arena.add_request(), arena.add_request()
    g = arena.lockstep([cond, uncond])
    assert g.members() == [cond, uncond]
    assert cond.info().lockstep == 1 and uncond.info().lockstep == 1
    with pytest.raises(mk.BadStateError):
        arena.admit([(cond, 5)])           # half of the group
    segs = g.segments(5)
    assert segs == [(cond, 5), (uncond, 5)]
    arena.admit(segs)
    plan = arena.plan_build(segs, mk.Plan(2, 10, 8))
    assert plan.batch == 2 and list(plan.qo_indptr) == [0, 5, 10]
    arena.commit(segs)
    arena.publish(segs)
    assert cond.info().committed == uncond.info().committed == 5
    with pytest.raises(mk.BadStateError):
        cond.offload()                     # members go through the group
    free = arena.stats().free_pages
    g.offload()
    assert cond.info().location == mk.OFFLOADED and uncond.info().location == mk.OFFLOADED
    assert arena.stats().free_pages == free + 4   # 2 pages of 4 tokens each
    g.reload()
    assert cond.info().location == mk.RESIDENT and uncond.info().location == mk.RESIDENT
    arena.audit()


def test_lockstep_release_oldest_sums_over_members_and_dissolve_frees_the_members(arena):
    a, b = arena.add_request(), arena.add_request()
    g = arena.lockstep([a, b])
    _step(arena, g.segments(12))
    assert g.release_oldest(8) == 16          # two whole pages from each member
    assert a.info().live_start == 8 and b.info().live_start == 8
    g.dissolve()
    assert a.info().lockstep == 0
    a.offload()                               # single-request calls work again
    g2 = arena.lockstep([arena.add_request(), arena.add_request()])
    n = arena.stats().requests
    g2.remove()
    assert arena.stats().requests == n - 2
    with pytest.raises(mk.InvalidHandleError):
        g2.members()


def test_lockstep_refuses_bad_members_with_the_parameter_named(arena):
    r = arena.add_request()
    with pytest.raises(mk.InvalidArgumentError):
        arena.lockstep([r])                   # n must be 2..16
    with pytest.raises(TypeError, match=r"members\[1\]"):
        arena.lockstep([r, "not a request"])


# ---- preemption ---------------------------------------------------------------------------------

def test_admit_query_says_the_pages_admit_takes():
    with mk.Arena(num_pages=16, page_size=4) as a:
        r = a.add_request()
        _step(a, [(r, 6)])
        assert a.admit_query([(r, 7)]) == 2   # 2 tokens left on page 2, 7 more need 2 pages
        free = a.stats().free_pages
        a.admit([(r, 7)])
        assert free - a.stats().free_pages == 2


def test_make_room_parks_the_least_recently_admitted_requests_and_frees_what_it_says():
    with mk.Arena(num_pages=9, page_size=4, num_layers=1, kv_heads=1, head_dim=4) as a:
        old, mid, new = a.add_request(), a.add_request(), a.add_request()
        for r in (old, mid, new):
            _step(a, [(r, 8)])               # 2 pages each: 6 of the 8 usable pages
        assert a.stats().free_pages == 2
        want = a.admit_query([(new, 12)])
        assert want == 3
        parked = a.make_room(want - a.stats().free_pages + 2, batch=[(new, 12)])
        assert parked == [old]               # the oldest admit goes first, and only as many as needed
        assert old.info().location == mk.OFFLOADED and mid.info().location == mk.RESIDENT
        assert a.stats().free_pages == 4
        a.admit([(new, 12)])
        with pytest.raises(mk.OutOfPagesError):
            a.make_room(100)                 # all or nothing
        assert mid.info().location == mk.RESIDENT and a.stats().free_pages == 1


def test_make_room_respects_the_host_budget():
    with mk.Arena(num_pages=9, page_size=4, num_layers=1, kv_heads=1, head_dim=4) as a:
        r = a.add_request()
        _step(a, [(r, 8)])
        with pytest.raises(mk.OutOfPagesError):
            a.make_room(a.stats().free_pages + 1, host_budget_bytes=1)
        assert r.info().location == mk.RESIDENT
        with pytest.raises(TypeError, match="pages_needed"):
            a.make_room("3")


# ---- scratch entries ------------------------------------------------------------------------------

def test_a_scratch_entry_is_rewritten_each_step_and_capped(arena):
    s = arena.scratch_create(key=77, cap_tokens=6)
    assert arena.keyed_find(77) == s and s.info().keyed == 1 and s.info().sealed == 0
    free = arena.stats().free_pages
    _step(arena, [(s, 5)])
    assert s.info().committed == 5 and arena.stats().free_pages == free - 2
    with pytest.raises(mk.CapacityError):
        arena.admit([(s, 2)])                # 7 > cap_tokens
    s.scratch_reset()
    assert s.info().committed == 0 and arena.stats().free_pages == free
    _step(arena, [(s, 6)])
    with pytest.raises(mk.BadStateError):
        arena.add_request().scratch_reset()  # not a scratch entry


# ---- reset and flush --------------------------------------------------------------------------------

def test_reset_returns_every_page_and_makes_every_handle_stale(arena):
    r, _, _ = filled(arena, 9)
    arena.keyed_create(5, 4)
    arena.reset()
    st = arena.stats()
    assert st.requests == 0 and st.free_pages == st.num_pages - 1
    with pytest.raises(mk.InvalidHandleError):
        r.info()
    assert arena.add_request().info().committed == 0


def test_flush_makes_pending_pages_free_in_fenced_mode():
    with mk.Arena(num_pages=8, page_size=4, retire="fenced") as a:
        r = a.add_request()
        _step(a, [(r, 8)])
        r.remove()
        assert a.stats().pending_pages == 2
        a.flush()
        st = a.stats()
        assert st.pending_pages == 0 and st.free_pages == 7


# ---- rank check -----------------------------------------------------------------------------------

def _two_ranks(ops_a, ops_b, steps):
    """Two arenas as two ranks in two threads, the all-reduce a barrier and a minimum."""
    arenas = [mk.Arena(num_pages=16, page_size=4), mk.Arena(num_pages=16, page_size=4)]
    barrier, slots, results = threading.Barrier(2), [None, None], [None, None]

    def allreduce(rank):
        def fn(values):
            slots[rank] = values.copy()
            barrier.wait()
            np.minimum(slots[0], slots[1], out=values)
            barrier.wait()
        return fn

    def run(rank, ops):
        a = arenas[rank]
        reqs = [a.add_request()]
        for s in range(steps):
            ops(a, reqs, s)
            a.rank_check(s)
        try:
            a.rank_check(steps, allreduce(rank))
            results[rank] = "agree"
        except mk.DivergedError as e:
            results[rank] = e.first_divergent
    ts = [threading.Thread(target=run, args=(i, ops)) for i, ops in enumerate((ops_a, ops_b))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    for a in arenas:
        a.close()
    return results


def test_rank_check_agrees_for_ranks_that_decide_alike_and_names_the_first_divergent_step():
    same = lambda a, reqs, s: _step(a, [(reqs[0], 3)])
    assert _two_ranks(same, same, 4) == ["agree", "agree"]

    def other(a, reqs, s):
        _step(a, [(reqs[0], 3 if s != 2 else 4)])   # rank 1 admits one token more at step 2
    assert _two_ranks(same, other, 4) == [2, 2]


def test_rank_check_passes_an_allreduce_error_through(arena):
    def broken(values):
        raise RuntimeError("the collective failed")
    with pytest.raises(RuntimeError, match="collective"):
        arena.rank_check(0, broken)


# ---- layer groups -------------------------------------------------------------------------------------

def test_layer_groups_keep_a_page_table_each_and_retain_separately():
    with mk.Arena(num_pages=32, page_size=4, num_groups=2) as a:
        assert a.num_groups == 2
        r = a.add_request()
        a.admit([(r, 8)])
        assert a.stats().free_pages == 31 - 4      # 2 pages in each group
        a.commit([(r, 8)])
        full, windowed = r.group(0), r.group(1)
        assert len(full.pages()) == 2 and len(windowed.pages()) == 2
        assert not set(full.pages()) & set(windowed.pages())
        assert windowed.release_oldest(4) == 4
        assert len(windowed.pages()) == 1 and len(full.pages()) == 2
        assert windowed.info().live_start == 4 and full.info().live_start == 0
        assert full.slot(0) == full.pages()[0] * 4
        with pytest.raises(mk.ReleasedError):
            windowed.slot(0)
        full.protect_prefix(4)
        pages, tokens, epoch = full.prefix_pages()
        assert list(pages) == [full.pages()[0]] and tokens == 4 and epoch == full.info().prefix_epoch
        windowed.set_retention(mk.Retention(chunk_size=4, window_chunks=1))
        with pytest.raises(mk.InvalidArgumentError, match="layer group 2"):
            r.group(2).info()
        plan = mk.PlanDesc(group=1).build(a, [(r, 0)], mk.Plan(1, 0, 4))
        assert list(plan.kv_indices) == list(windowed.pages())


# ---- positions ------------------------------------------------------------------------------------------

def test_shift_positions_moves_derived_rope_positions_and_waits_for_an_open_reservation(arena):
    r = arena.add_request()
    r.shift_positions(100)
    arena.admit([(r, 3)])
    plan = arena.plan_build([(r, 3)], mk.Plan(1, 3, 4), pos="1d")
    assert list(plan.positions) == [100, 101, 102]
    r.shift_positions(-50)                       # waits for the commit
    assert r.info().pos_shift == 100 and r.info().pos_shift_pending == -50
    arena.commit([(r, 3)])
    assert r.info().pos_shift == 50
    with pytest.raises(TypeError, match="delta"):
        r.shift_positions(1.5)


def test_plan_desc_explicit_positions_are_taken_as_they_are(arena):
    a, b = arena.add_request(), arena.add_request()
    segs = [(a, 2), (b, 3)]
    arena.admit(segs)
    d = mk.PlanDesc(pos="1d", positions=[np.array([7, 9], np.int32), None])
    assert d.query(arena, segs) == (2, 5, 2)
    plan = d.build(arena, segs, mk.Plan(2, 5, 4))
    assert list(plan.positions) == [7, 9, 0, 1, 2]
    with pytest.raises(ValueError, match=r"positions\[0\]: 3 values"):
        mk.PlanDesc(pos="1d", positions=[np.arange(3), None]).build(arena, segs, mk.Plan(2, 5, 4))


def test_plan_desc_caller_visibility_writes_the_bounds(arena):
    r = arena.add_request()
    arena.admit([(r, 8)])
    plan = mk.PlanDesc(visibility="caller", vis_sink_end=[2], vis_window_start=[6]).build(
        arena, [(r, 8)], mk.Plan(1, 8, 4))
    assert list(plan.vis_sink_end) == [2] and list(plan.vis_window_start) == [6]
    assert plan.features & mk.PlanFeature.VISIBILITY


def test_plan_desc_builds_a_session_plan(arena):
    r = arena.add_request()
    with arena.session(r, mk.Retention(chunk_size=4, window_chunks=2)) as s:
        s.begin_chunk(4)
        plan = mk.PlanDesc(pos="1d").build_session(s, mk.Plan(1, 4, 4))
        assert list(plan.positions) == [0, 1, 2, 3] and plan.total_q == 4
        s.commit_chunk()
