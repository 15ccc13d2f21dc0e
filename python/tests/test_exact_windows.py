"""Exact windows by default: a windowed session attends over exactly the
tokens a contiguous rolling cache keeps (sink + window + the chunk being
filled), whatever the page size, with no option set. Whole-page
visibility is the explicit opt-in (visibility="pages")."""
import numpy as np
import pytest

import mstar_kv as mk


def _attend_ref(q, k, v):
    s = np.einsum("nhd,mhd->hnm", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hnm,mhd->nhd", s, v.astype(np.float64))


def _loop(chunk, page, sink, window, chunks, head_dim=8, seed=0, **plan_kw):
    """Chunk by chunk through a session against a rolling cache; per chunk
    (keys the plan lets q see, the rolling cache's keys, max error)."""
    print("seed", seed)
    g = np.random.default_rng(seed)
    pages = -(-(sink + window + 1) * chunk // page) + 3
    rows = []
    with mk.Arena(num_pages=pages, page_size=page, num_layers=1, kv_heads=1, head_dim=head_dim) as a:
        s = a.session(a.add_request(), mk.Retention(chunk, sink_chunks=sink, window_chunks=window))
        plan = mk.Plan(1, chunk, pages)
        rk = np.zeros((0, 1, head_dim), np.float32)
        rv = rk.copy()
        for c in range(chunks):
            k, v, q = (g.standard_normal((chunk, 1, head_dim)).astype(np.float32) for _ in range(3))
            s.begin_chunk(chunk)
            s.plan(plan, **plan_kw)
            a.write_kv(0, plan, k, v)
            out = mk.attention(a, 0, plan, q)
            keys = np.concatenate([rk, k])
            ref = _attend_ref(q, keys, np.concatenate([rv, v]))
            seen = plan.visible_positions()[0]
            rows.append((len(seen), len(keys), float(np.abs(out - ref).max()), seen))
            s.commit_chunk()
            rk, rv = np.concatenate([rk, k]), np.concatenate([rv, v])
            if len(rk) > (sink + window) * chunk:    # the rolling cache: sink + the last window
                rk = np.concatenate([rk[:sink * chunk], rk[-window * chunk:]])
                rv = np.concatenate([rv[:sink * chunk], rv[-window * chunk:]])
    return rows


def _kept(c, chunk, sink, window):
    """Absolute positions a rolling cache holds while chunk c is filled."""
    done = c * chunk
    keep = list(range(min(done, sink * chunk)))
    keep += list(range(max(sink * chunk, done - window * chunk), done))
    return np.array(keep + list(range(done, done + chunk)))


def test_unaligned_chunks_attend_over_exactly_the_rolling_cache_by_default():
    # the case: 40-token chunks on 16-token pages, sink 1, window 2
    rows = _loop(40, 16, 1, 2, chunks=8, seed=21)
    for c, (seen, keys, err, pos) in enumerate(rows):
        assert seen == keys, "chunk %d: %d keys visible, the rolling cache has %d" % (c, seen, keys)
        assert np.array_equal(pos, _kept(c, 40, 1, 2)), c
        assert err <= 1e-5, "chunk %d: max error %g" % (c, err)
    assert rows[-1][1] == 160


def test_whole_page_visibility_is_the_opt_in_and_shows_released_tokens():
    rows = _loop(40, 16, 1, 2, chunks=8, seed=21, visibility="pages")
    assert any(seen > keys for seen, keys, _, _ in rows)
    assert max(err for _, _, err, _ in rows) > 1e-3      # not the rolling cache's attention


def test_wan_frames_of_1560_tokens_on_16_token_pages_one_frame_per_chunk():
    rows = _loop(1560, 16, 1, 2, chunks=6, head_dim=4, seed=1560)
    for c, (seen, keys, err, pos) in enumerate(rows):
        assert seen == keys and err <= 1e-5, (c, seen, keys, err)
        assert np.array_equal(pos, _kept(c, 1560, 1, 2))


@pytest.mark.parametrize("chunk,page,sink,window", [(24, 16, 1, 3), (12, 8, 2, 1), (7, 4, 1, 2), (40, 16, 0, 2),
                                                       # the sink ends inside the first page
                                                       (7, 16, 1, 2), (10, 16, 2, 1), (3, 8, 1, 1)])
def test_scaled_shapes_where_the_page_does_not_divide_the_chunk(chunk, page, sink, window):
    rows = _loop(chunk, page, sink, window, chunks=3 * (sink + window) + 4, seed=chunk * 100 + page)
    for c, (seen, keys, err, pos) in enumerate(rows):
        assert seen == keys and err <= 1e-5, (c, seen, keys, err)
        assert np.array_equal(pos, _kept(c, chunk, sink, window)), c


def test_exact_retention_takes_any_page_size_and_refuses_only_whole_page_plans_of_unaligned_shapes():
    r = mk.Retention(40, sink_chunks=1, window_chunks=2, exact=True)
    assert r.exact and "exact=True" in repr(r)
    r.validate(page_size=16)                                  # exact visibility: any page size
    with pytest.raises(mk.InvalidSpecError) as e:
        r.validate(page_size=16, visibility="pages")
    assert "40" in e.value.detail and "16" in e.value.detail
    mk.Retention(48, sink_chunks=1, window_chunks=2, exact=True).validate(page_size=16, visibility="pages")
    with mk.Arena(num_pages=32, page_size=16, num_layers=1, kv_heads=1, head_dim=4) as a:
        s = a.session(a.add_request(), r)
        s.begin_chunk(40)
        plan = mk.Plan(1, 40, 16)
        s.plan(plan)
        before = (plan.kv_len.copy(), plan.buffers["kv_indices"].copy(), plan._builds)
        with pytest.raises(mk.InvalidSpecError):
            s.plan(plan, visibility="pages")
        assert np.array_equal(before[0], plan.kv_len) and plan._builds == before[2]   # nothing planned
        assert np.array_equal(before[1], plan.buffers["kv_indices"])
        with pytest.raises(AttributeError):
            r.exact = False


def test_visibility_names_codes_and_caller_bounds():
    with mk.Arena(num_pages=16, page_size=4, num_layers=1, kv_heads=1, head_dim=4) as a:
        req = a.add_request()
        a.admit([(req, 10)])
        plan = mk.Plan(1, 10, 8)
        a.plan_build([(req, 10)], plan, visibility=(np.array([2]), np.array([6])))
        assert plan.visible_positions()[0].tolist() == [0, 1, 6, 7, 8, 9]
        a.plan_build([(req, 10)], plan, visibility=mk._ffi.CONSTANTS["MSKV_VIS_PAGES"])
        assert plan.visible_positions()[0].tolist() == list(range(10))
        a.plan_build([(req, 10)], plan, visibility="EXACT")
        assert plan.visible_positions()[0].tolist() == list(range(10))
        with pytest.raises(ValueError, match="visibility: 'sometimes' is not one of exact, pages, caller"):
            a.plan_build([(req, 10)], plan, visibility="sometimes")
        with pytest.raises(ValueError, match="needs the bounds"):
            a.plan_build([(req, 10)], plan, visibility="caller")
        with pytest.raises(ValueError, match="one sink_end and one window_start per segment"):
            a.plan_build([(req, 10)], plan, visibility=([1, 2], [3, 4]))
        assert a.plan_query([(req, 10)], visibility="pages") == (1, 10, 3)


def test_session_reset_starts_a_new_video_and_gives_the_pages_back():
    with mk.Arena(num_pages=32, page_size=16, num_layers=1, kv_heads=1, head_dim=4) as a:
        old = a.add_request()
        s = a.session(old, mk.Retention(40, sink_chunks=1, window_chunks=2))
        plan = mk.Plan(1, 40, 16)
        for _ in range(4):
            s.begin_chunk(40)
            s.commit_chunk()
        s.begin_chunk(40)                          # a chunk left open
        used = a.stats().live_pages
        new = s.reset()
        assert new != old and s.request is new and a.stats().live_pages == 0 < used
        with pytest.raises(mk.InvalidHandleError):
            old.info()
        assert s.chunks_done == 0 and s.chunk_tokens == 0
        s.begin_chunk(40)
        assert s.plan(plan).visible_positions()[0].tolist() == list(range(40))
        s.commit_chunk()
        assert new.info().committed == 40
