"""Arena, Request, Session and Plan: the C API's nouns and rules from Python."""
import gc

import numpy as np
import pytest

import mstar_kv as mk
from conftest import filled


def test_arena_is_a_context_manager_and_refuses_calls_once_closed():
    with mk.Arena(num_pages=8, page_size=4) as a:
        r = a.add_request()
        assert a.stats().requests == 1
    with pytest.raises(mk.MskvError, match="closed"):
        a.stats()
    with pytest.raises(mk.MskvError, match="closed"):
        r.info()


def test_pool_view_keeps_the_arena_memory_after_close(arena):
    r, k, v = filled(arena, 6)
    pool = arena.pool(0, "k")
    slot = r.slot(5)
    arena.close()
    gc.collect()
    # the view still reads the bytes the arena held
    assert np.array_equal(pool[slot // 4, slot % 4], k[5])


def test_pool_view_is_zero_copy_in_the_store_layout(arena):
    r, k, v = filled(arena, 10, seed=3)
    kp, vp = arena.pool(0, "k"), arena.pool(0, 1)
    assert kp.shape == (64, 4, 2, 8) and kp.dtype == np.float32
    for pos in range(10):
        s = r.slot(pos)
        assert np.array_equal(kp[s // 4, s % 4], k[pos]) and np.array_equal(vp[s // 4, s % 4], v[pos])
    kp[r.slot(0) // 4, 0] = 7.0
    assert np.all(arena.pool(0, "k")[r.slot(0) // 4, 0] == 7.0)


def test_bookkeeping_only_arena_has_no_pools():
    with mk.Arena(num_pages=8, page_size=4) as a:
        assert a.store_info().num_layers == 0
        with pytest.raises(ValueError):
            a.pool(0, "k")


def test_requests_compare_by_handle_and_stale_handles_raise(arena):
    r = arena.add_request()
    assert r == mk.Request(arena, r.id) and hash(r) == hash(mk.Request(arena, r.id))
    r.remove()
    with pytest.raises(mk.InvalidHandleError):
        r.info()


def test_admit_is_all_or_nothing_over_a_batch(arena):
    a, b = arena.add_request(), arena.add_request()
    d = arena.digest()
    with pytest.raises(mk.OutOfPagesError):
        arena.admit([(a, 100), (b, 200)])
    assert arena.digest() == d
    assert a.info().reserved == 0 and b.info().reserved == 0


def test_admit_and_commit_is_admit_then_commit_and_all_or_nothing():
    with mk.Arena(num_pages=9, page_size=4) as a, mk.Arena(num_pages=9, page_size=4) as b:
        ra, rb = a.add_request(), b.add_request()
        for n in (3, 1, 4, 0, 6):
            a.admit_and_commit([(ra, n)])
            b.admit([(rb, n)])
            b.commit([(rb, n)])
            ia, ib = ra.info(), rb.info()
            assert (ia.committed, ia.reserved, ia.num_pages) == (ib.committed, ib.reserved, ib.num_pages)
            assert np.array_equal(ra.pages(), rb.pages()) and ia.reserved == 0 and not ia.has_reservation
        assert ra.info().committed == 14 and ra.info().num_pages == 4
        other = a.add_request()
        d = a.digest()
        with pytest.raises(mk.OutOfPagesError, match="need 5 pages, 4 free"):
            a.admit_and_commit([(other, 2), (ra, 17)])   # the second needs 5 pages: neither gets any
        with pytest.raises(mk.MskvError, match="repeats a request"):
            a.admit_and_commit([(other, 1), (other, 1)])
        assert a.digest() == d and other.info().committed == 0
        a.audit()


def test_a_failed_call_changes_nothing(arena):
    r, _, _ = filled(arena, 9)
    d = arena.digest()
    for bad in (lambda: r.protect_prefix(100), lambda: r.release_oldest(100), lambda: arena.commit([(r, 1)]),
                lambda: r.reload(), lambda: arena.keyed_find(99)):
        with pytest.raises(mk.MskvError):
            bad()
        assert arena.digest() == d
    arena.audit()


def test_commit_publish_and_step_advance(arena):
    r = arena.add_request()
    s0 = arena.step
    arena.admit([(r, 5)])
    info = r.info()
    assert info.reserved == 5 and info.has_reservation
    arena.commit([(r, 5)])
    assert arena.publish([(r, 5)]) == s0
    assert arena.step == s0 + 1
    assert r.info().committed == 5


def test_abort_returns_the_reservation(arena):
    r = arena.add_request()
    free = arena.stats().free_pages
    arena.admit([(r, 9)])
    assert arena.stats().free_pages == free - 3
    arena.abort([(r, 9)])
    assert arena.stats().free_pages == free and r.info().reserved == 0


def test_protect_and_release_keep_the_prefix_and_free_whole_pages(arena):
    r, _, _ = filled(arena, 20)
    r.protect_prefix(4)
    assert r.release_oldest(7) == 4          # page floor: one whole page of the live part
    info = r.info()
    assert info.prefix_tokens == 4 and info.prefix_pages == 1 and info.live_start == 8
    with pytest.raises(mk.ReleasedError):
        r.slot(5)
    assert r.slot(8) == r.pages()[1] * 4
    arena.audit()


def test_fork_shares_full_pages_and_copies_the_partial_one(arena):
    parent, _, _ = filled(arena, 10)
    child = parent.fork()
    pp, cp = parent.pages(), child.pages()
    assert list(pp[:2]) == list(cp[:2]) and pp[2] != cp[2]
    assert child.info().committed == 10
    arena.audit()


def test_paused_request_is_not_admitted_until_resumed(arena):
    r = arena.add_request()
    r.pause()
    assert r.info().paused
    with pytest.raises(mk.BadStateError):
        arena.admit([(r, 1)])
    r.resume()
    arena.admit([(r, 1)])


def test_offload_and_reload_restore_tokens_and_bytes(arena):
    r, k, _ = filled(arena, 13, seed=5)
    before = r.info()
    r.offload()
    assert r.info().location == mk.OFFLOADED
    assert arena.stats().offloaded_pages == 4
    with pytest.raises(mk.OffloadedError):
        r.slot(0)
    arena.pool(0, "k")[:] = np.nan                           # the reload must copy
    r.reload()
    after = r.info()
    assert after.committed == before.committed and after.prefix_epoch != before.prefix_epoch
    pool = arena.pool(0, "k")
    for pos in range(13):
        s = r.slot(pos)
        assert np.array_equal(pool[s // 4, s % 4], k[pos])


def test_reload_without_pages_fails_and_keeps_the_host_copy(arena):
    r, _, _ = filled(arena, 40)
    r.offload()
    hog = arena.add_request()
    arena.admit([(hog, 4 * 60)])
    d = arena.digest()
    with pytest.raises(mk.OutOfPagesError):
        r.reload()
    assert arena.digest() == d
    arena.abort([(hog, 240)])
    r.reload()


def test_export_is_bytes_and_import_restores_the_request_in_another_arena(arena):
    r, k, _ = filled(arena, 11, seed=9)
    blob = r.export()
    assert isinstance(blob, bytes) and len(blob) > 11 * 2 * 8 * 4
    with mk.Arena(num_pages=64, page_size=4, num_layers=2, kv_heads=2, head_dim=8) as other:
        for form in (blob, bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
            copy = other.import_request(form)
            assert copy.info().location == mk.OFFLOADED and copy.info().committed == 11
            copy.reload()
            s = copy.slot(10)
            assert np.array_equal(other.pool(0, "k")[s // 4, s % 4], k[10])
            copy.remove()


def test_damaged_or_foreign_blobs_are_refused(arena):
    r, _, _ = filled(arena, 8)
    blob = bytearray(r.export())
    with pytest.raises(mk.BlobTruncatedError):
        arena.import_request(bytes(blob[:-1]))
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(mk.BlobCorruptError):
        arena.import_request(bytes(blob))
    with mk.Arena(num_pages=64, page_size=8, num_layers=2, kv_heads=2, head_dim=8) as other:
        with pytest.raises(mk.BlobMismatchError):
            other.import_request(r.export())


def test_keyed_entry_is_written_once_sealed_and_found_by_key(arena):
    e = arena.keyed_create(0xABC, 6)
    plan = mk.Plan(1, 6, 8)
    arena.plan_build([(e, 6)], plan)
    z = np.ones((6, 2, 8), np.float32)
    arena.write_kv(1, plan, z, z)
    e.seal()
    assert arena.keyed_find(0xABC) == e and e.info().sealed
    with pytest.raises(mk.DuplicateError):
        arena.keyed_create(0xABC, 1)
    with pytest.raises(mk.ReadOnlyError):
        arena.admit([(e, 1)])
    arena.keyed_remove(0xABC)
    with pytest.raises(mk.NotFoundError):
        arena.keyed_find(0xABC)


def test_stats_audit_and_digest_follow_the_state(arena):
    d0 = arena.digest()
    s = arena.stats()
    assert s.free_pages + s.live_pages + s.pending_pages + 1 == s.num_pages
    r, _, _ = filled(arena, 5)
    assert arena.digest() != d0
    assert arena.stats().live_pages == 2
    arena.audit()


def test_events_report_stored_and_removed_pages():
    seen = []
    with mk.Arena(num_pages=16, page_size=4, on_event=seen.append) as a:
        r = a.add_request()
        a.admit([(r, 8)])
        a.commit([(r, 8)])
        a.publish([(r, 8)])
        r.remove()
    kinds = [e.type for e in seen]
    assert kinds.count("page_stored") == 2 and kinds.count("page_removed") == 2
    assert {e.request.id for e in seen} == {r.id}


def test_plan_arrays_are_views_of_fixed_buffers_at_stable_addresses(arena):
    plan = mk.Plan(4, 64, 64)
    addr = {n: b.__array_interface__["data"][0] for n, b in plan.buffers.items()}
    r = arena.add_request()
    for n in (5, 7, 3):
        arena.admit([(r, n)])
        arena.plan_build([(r, n)], plan, pos="1d")
        for name in ("qo_indptr", "kv_indices", "slot_mapping", "positions", "kv_len"):
            view = getattr(plan, name)
            assert view.__array_interface__["data"][0] == addr[name], name
            assert view.ctypes.data == addr[name]
        arena.commit([(r, n)])
        arena.publish([(r, n)])
    assert list(plan.positions) == [12, 13, 14]
    assert plan.slot_mapping[0] == r.slot(12)
    assert not plan.kv_indices.flags.writeable


def test_plan_contents_follow_the_csr_rules(arena):
    a, b = arena.add_request(), arena.add_request()
    plan = mk.Plan(2, 32, 32)
    arena.admit([(a, 6), (b, 9)])
    arena.plan_build([(a, 6), (b, 9)], plan, pos="3d", grid=(2, 2))
    assert plan.batch == 2 and plan.total_q == 15
    assert list(plan.qo_indptr) == [0, 6, 15] and list(plan.kv_indptr) == [0, 2, 5]
    assert list(plan.kv_last_page_len) == [2, 1] and list(plan.kv_len) == [6, 9]
    assert plan.positions.shape == (15, 3) and list(plan.positions[5]) == [1, 0, 1]
    assert arena.plan_query([(a, 6), (b, 9)]) == (2, 15, 5)
    plan.validate(64)


def test_plan_too_small_raises_capacity_and_writes_nothing(arena):
    r = arena.add_request()
    arena.admit([(r, 20)])
    plan = mk.Plan(1, 8, 8)
    with pytest.raises(mk.CapacityError):
        arena.plan_build([(r, 20)], plan)
    assert plan.batch == 0 and plan.total_q == 0


def test_session_context_manager_aborts_an_open_chunk_on_error(arena):
    r = arena.add_request()
    free = arena.stats().free_pages
    with pytest.raises(RuntimeError):
        with arena.session(r, mk.Retention(8, sink_chunks=1, window_chunks=1)) as s:
            s.begin_chunk(8)
            raise RuntimeError("the model failed")
    assert arena.stats().free_pages == free and r.info().reserved == 0


def test_session_keeps_sink_and_window_and_releases_the_rest(arena):
    r = arena.add_request()
    plan = mk.Plan(1, 8, 64)
    with arena.session(r, mk.Retention(8, sink_chunks=1, window_chunks=2)) as s:
        for c in range(6):
            s.begin_chunk(8)
            s.plan(plan, pos="1d")
            assert plan.kv_len[0] == (min(c, 3) + 1) * 8     # sink + window + this chunk
            s.commit_chunk()
        assert s.chunks_done == 6 and s.released_total == 3 * 8
    assert r.info().kv_len == 24


def test_dense_plan_gives_token_offsets_and_no_slots(arena):
    a, b = arena.add_request(), arena.add_request()
    plan = arena.plan_build([(a, 3), (b, 2)], mk.Plan(2, 8, 8), kind="dense", dense_kv_len=[10, 4])
    assert plan.kv_token_indptr.tolist() == [0, 10, 14]
    assert plan.qo_indptr.tolist() == [0, 3, 5] and plan.kv_len.tolist() == [10, 4]
    assert (plan.slot_mapping == -1).all()


def test_fenced_arena_keeps_freed_pages_pending_until_their_step_retires():
    with mk.Arena(num_pages=16, page_size=4, retire="fenced") as a:
        r = a.add_request()
        a.admit([(r, 8)])
        a.commit([(r, 8)])
        a.publish([(r, 8)])
        r.remove()
        assert a.stats().pending_pages == 2
        fence = a.publish()
        assert a.stats().pending_pages == 2
        a.retire(fence)
        s = a.stats()
        assert s.pending_pages == 0 and s.completed_step == fence and s.free_pages == 15


def test_plan_build_pads_a_step_to_a_captured_shape_and_refuses_a_larger_one():
    with mk.Arena(num_pages=32, page_size=8, num_layers=1, kv_heads=1, head_dim=4) as a:
        r = [a.add_request() for _ in range(3)]
        a.admit([(r[0], 3), (r[1], 1)])
        plan = a.plan_build([(r[0], 3), (r[1], 1)], mk.Plan(4, 10, 8), pad=(4, 10, 4, 48))
        assert (plan.batch, plan.total_q, plan.pad_segments) == (4, 10, 2)
        assert list(plan.qo_indptr) == [0, 3, 4, 7, 10]
        assert list(plan.slot_mapping[4:]) == [-1] * 6
        assert a.plan_query([(r[0], 3), (r[1], 1)], pad=(4, 10, 4, 48)) == (4, 10, 2)
        with pytest.raises(mk.CapacityError):
            a.plan_build([(r[0], 3), (r[1], 1)], mk.Plan(4, 10, 8), pad=(4, 3, 4, 48))   # 4 queries, 3 captured
