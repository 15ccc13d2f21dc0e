"""mstar_kv.interop: a plan's arguments for FlashInfer's paged wrappers and
flash-attn's flash_attn_with_kvcache, checked against pure-torch
references written from those libraries' documented contracts (no GPU):

- FlashInfer (prefill.py / decode.py plan() docstrings, docs/tutorials/
  kv_layout.rst): request b's keys are its pages kv_indices[kv_indptr[b]:
  kv_indptr[b+1]] in order, kv_len = page_size * (pages - 1) +
  last_page_len; queries are aligned to the END of the keys (query i of
  qo_len is at kv_len - qo_len + i); causal keeps kv_idx <= kv_len - qo_len
  + qo_idx; window_left >= 0 keeps kv_idx + qo_len + window_left >= kv_len
  + qo_idx (with or without causal); custom_mask (flattened, row-major
  [qo_len, kv_len] per request, True = keep) replaces causal; GQA: q head h
  reads kv head h // (q_heads / kv_heads).
- flash-attn (flash_attn_with_kvcache docstring): q [batch, seqlen_q, ...],
  keys block_table[b] pages up to cache_seqlens[b]; causal aligned to the
  bottom right; window_size (left, right): query i sees keys in
  [i + sk - sq - left, i + sk - sq + right], -1 = unbounded.

Every plan is token-exact (MSKV_VIS_EXACT), so hidden keys on kept pages
are part of what is checked."""
import ctypes

import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _ffi, interop

torch = pytest.importorskip("torch", reason="the references are torch code: pip install torch into the venv")

PAGE, CHUNK, KVH, QH, DIM = 4, 6, 2, 4, 8   # 6-token chunks on 4-token pages; GQA 4 q heads over 2 kv heads


# ---- the references, from the libraries' docs ----------------------------------------------------------

def _paged_keys(pool, pages, kv_len):
    return pool[pages.long()].reshape(-1, pool.shape[2], pool.shape[3])[:kv_len]


def _attend(q, k, v, keep, scale, lse=None):
    """q [n, H, D], k/v [m, Hk, D], keep [n, m] bool -> o [n, H, D]; lse
    (optional, [n, H]) gets the log-sum-exp in base 2, as FlashInfer keeps it."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q, k) * scale
    s = s.masked_fill(~keep[None], float("-inf"))
    if lse is not None:
        lse[:] = (torch.logsumexp(s, dim=-1) / np.log(2.0)).T
    return torch.einsum("hnm,mhd->nhd", torch.softmax(s, dim=-1), v)


def flashinfer_reference(q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size,
                         causal=False, custom_mask=None, window_left=-1, sm_scale=None, lse=None):
    """FlashInfer's batch prefill over a paged NHD cache (k, v), as documented
    (lse: a [total_q, q_heads] tensor to fill, base 2)."""
    k_cache, v_cache = paged_kv_cache
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    out = torch.zeros_like(q)
    moff = 0
    for b in range(len(kv_last_page_len)):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])]
        last = int(kv_last_page_len[b])
        assert 1 <= last <= page_size, "FlashInfer: 1 <= last_page_len <= page_size"
        kv_len = page_size * (len(pages) - 1) + last
        qo_len = q1 - q0
        qi = torch.arange(qo_len)[:, None]
        kj = torch.arange(kv_len)[None, :]
        if custom_mask is not None:
            keep = custom_mask[moff:moff + qo_len * kv_len].reshape(qo_len, kv_len).bool()
            moff += qo_len * kv_len
        elif causal:
            keep = kj <= kv_len - qo_len + qi
        else:
            keep = torch.ones(qo_len, kv_len, dtype=torch.bool)
        if window_left >= 0:
            keep = keep & (kj + qo_len + window_left >= kv_len + qi)
        out[q0:q1] = _attend(q[q0:q1], _paged_keys(k_cache, pages, kv_len), _paged_keys(v_cache, pages, kv_len),
                             keep, scale, None if lse is None else lse[q0:q1])
    if custom_mask is not None:
        assert moff == len(custom_mask), "custom_mask: sum(qo_len * kv_len) elements"
    return out


def flashinfer_decode_reference(q, paged_kv_cache, indptr, indices, last_page_len, page_size, window_left=-1,
                                lse=None):
    """BatchDecode: one query per request, at the end of its keys."""
    qo_indptr = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
    return flashinfer_reference(q, paged_kv_cache, qo_indptr, indptr, indices, last_page_len, page_size,
                                causal=False, window_left=window_left, lse=lse)


def flash_attn_reference(q, k_cache, v_cache, block_table, cache_seqlens, causal=False, window_size=(-1, -1)):
    """flash_attn_with_kvcache with a block_table, as documented; q [batch, sq, H, D]."""
    ps = k_cache.shape[1]
    out = torch.zeros_like(q)
    sq = q.shape[1]
    for b in range(q.shape[0]):
        sk = int(cache_seqlens[b])
        pages = block_table[b, :(sk + ps - 1) // ps]
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        keep = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            keep &= j <= i + sk - sq
        left, right = window_size
        if left >= 0:
            keep &= j >= i + sk - sq - left
        if right >= 0:
            keep &= j <= i + sk - sq + right
        out[b] = _attend(q[b], _paged_keys(k_cache, pages, sk), _paged_keys(v_cache, pages, sk), keep,
                         q.shape[-1] ** -0.5)
    return out


# ---- plans with token-exact visibility ---------------------------------------------------------------

def _exact_desc(arena, pos="1d"):
    d, _ = arena._plan_desc("self", None, None, pos, 0, None)
    d.visibility = _ffi.CONSTANTS["MSKV_VIS_EXACT"]
    return d


def exact_plan(arena, segments, cap=(4, 64, 64), exclude_prefix=False):
    plan = mk.Plan(*cap)
    d = _exact_desc(arena)
    d.exclude_prefix = int(exclude_prefix)
    arena._call("mskv_plan_build", arena.ptr, *arena._segments(segments), ctypes.byref(d), ctypes.byref(plan._s))
    plan._pos_mode = d.pos_mode
    return plan


def session_plan(session, cap=(4, 64, 64)):
    plan = mk.Plan(*cap)
    d = _exact_desc(session.arena)
    session.arena._call("mskv_session_plan", session._open(), ctypes.byref(d), ctypes.byref(plan._s))
    plan._pos_mode = d.pos_mode
    return plan


def _write(arena, plan, rng):
    k = rng.standard_normal((plan.total_q, KVH, DIM)).astype(np.float32)
    v = rng.standard_normal((plan.total_q, KVH, DIM)).astype(np.float32)
    arena.write_kv(0, plan, k, v)


def _check_flashinfer_prefill(arena, plan, mask, window_left, rng, expect_mask=None):
    q = rng.standard_normal((plan.total_q, QH, DIM)).astype(np.float32)
    ours = mk.attention(arena, 0, plan, q, mask=mask, window_left=window_left)
    a = interop.flashinfer_prefill_args(plan, mask=mask, window_left=window_left)
    if expect_mask is not None:
        assert (a.custom_mask is not None) == expect_mask, a
    kw = a.kwargs()
    theirs = flashinfer_reference(torch.from_numpy(q), interop.arena_pools(arena, 0), kw["qo_indptr"],
                                  kw["paged_kv_indptr"], kw["paged_kv_indices"], kw["paged_kv_last_page_len"],
                                  kw["page_size"], causal=kw["causal"], custom_mask=kw["custom_mask"],
                                  window_left=kw["window_left"])
    np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-5, rtol=1e-5)
    return a


def _hidden(plan):
    return [(int(s), int(w)) for s, w in zip(plan.vis_sink_end, plan.vis_window_start)]


# ---- the windowed video session ------------------------------------------------------------------------

@pytest.mark.parametrize("mask", ["none", "causal"])
def test_flashinfer_prefill_matches_mstar_over_a_windowed_video_session(mask):
    seed = 2101
    print("seed", seed)
    rng = np.random.default_rng(seed)
    ret = mk.Retention(CHUNK, sink_chunks=1, window_chunks=2)
    with mk.Arena(64, PAGE, num_layers=1, kv_heads=KVH, head_dim=DIM) as arena:
        sessions = [mk.Session(arena, arena.add_request(), ret) for _ in range(2)]   # a CFG pair
        used_mask = 0
        for chunk in range(7):
            for s in sessions:
                s.begin_chunk(CHUNK)
            plan = exact_plan(arena, [(s.request, CHUNK) for s in sessions])
            _write(arena, plan, rng)
            for step in range(2):   # denoise steps attend over the same plan
                a = _check_flashinfer_prefill(arena, plan, mask, 0, rng)
                used_mask += a.custom_mask is not None
            if chunk >= 4:   # from the first release on: the sink's last page (6, 7), then the window's first
                assert all(w > s for s, w in _hidden(plan)), _hidden(plan)
                assert a.custom_mask is not None
                assert not a.causal and a.window_left == -1
            for s in sessions:
                s.commit_chunk()
        assert used_mask > 0


def test_flashinfer_prefill_uses_no_mask_where_the_plan_hides_nothing():
    rng = np.random.default_rng(7)
    with mk.Arena(32, PAGE, num_layers=1, kv_heads=KVH, head_dim=DIM) as arena:
        r = arena.add_request()
        arena.admit([(r, 7)])
        plan = exact_plan(arena, [(r, 7)])
        _write(arena, plan, rng)
        for mask, wl in [("none", 0), ("causal", 0), ("window", 2)]:
            a = _check_flashinfer_prefill(arena, plan, mask, wl, rng, expect_mask=False)
            assert a.window_left == (2 if mask == "window" else -1)
        # the page arrays are the plan's own memory, not copies
        a = interop.flashinfer_prefill_args(plan)
        assert a.kv_indices.data_ptr() == plan.kv_indices.ctypes.data
        assert a.kv_indptr.data_ptr() == plan.kv_indptr.ctypes.data


def test_flashinfer_prefill_window_across_the_sink_jump_needs_the_mask():
    # a window mask in absolute positions, over a sequence whose sink sits
    # before a released gap: FlashInfer's window counts compacted keys
    rng = np.random.default_rng(11)
    with mk.Arena(32, PAGE, num_layers=1, kv_heads=KVH, head_dim=DIM) as arena:
        r = arena.add_request()
        arena.admit([(r, 24)])
        p = exact_plan(arena, [(r, 24)])
        _write(arena, p, rng)
        arena.commit([(r, 24)])
        r.protect_prefix(4)
        r.release_oldest(9)   # frees positions 4..11 (two pages), window starts at 13: hides 12
        arena.publish()
        arena.admit([(r, 5)])
        plan = exact_plan(arena, [(r, 5)])
        _write(arena, plan, rng)
        assert int(plan.kv_pos_shift[0]) > 0
        a = _check_flashinfer_prefill(arena, plan, "window", 14, rng, expect_mask=True)
        assert a.custom_mask.dtype == torch.bool and a.custom_mask.numel() == 5 * int(plan.kv_len[0])


# ---- decode --------------------------------------------------------------------------------------------

def _decode_arena(prefix, release, lengths, rng):
    arena = mk.Arena(64, PAGE, num_layers=1, kv_heads=KVH, head_dim=DIM)
    reqs = []
    releases = release if isinstance(release, list) else [release] * len(lengths)
    for n, release in zip(lengths, releases):
        r = arena.add_request()
        arena.admit([(r, n)])
        p = exact_plan(arena, [(r, n)])
        _write(arena, p, rng)
        arena.commit([(r, n)])
        if prefix:
            r.protect_prefix(prefix)
        if release:
            r.release_oldest(release)
        reqs.append(r)
    arena.publish()
    arena.admit([(r, 1) for r in reqs])
    plan = exact_plan(arena, [(r, 1) for r in reqs])
    _write(arena, plan, rng)
    return arena, plan


def _check_decode(arena, plan, mask, rng):
    q = rng.standard_normal((plan.total_q, QH, DIM)).astype(np.float32)
    ours = mk.attention(arena, 0, plan, q, mask=mask)
    a = interop.flashinfer_decode_args(plan, mask=mask)
    kw = a.kwargs()
    theirs = flashinfer_decode_reference(torch.from_numpy(q), interop.arena_pools(arena, 0), kw["indptr"],
                                         kw["indices"], kw["last_page_len"], kw["page_size"], kw["window_left"])
    np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-5, rtol=1e-5)
    f = interop.flash_attn_args(plan, mask=mask, page_multiple=1)
    k, v = interop.arena_pools(arena, 0)
    fa = flash_attn_reference(torch.from_numpy(q).reshape(plan.batch, 1, QH, DIM), k, v, f.block_table,
                              f.cache_seqlens, f.causal, f.window_size)
    np.testing.assert_allclose(fa.reshape(plan.total_q, QH, DIM).numpy(), ours, atol=1e-5, rtol=1e-5)
    return a, f


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_decode_hidden_front_of_the_window_becomes_window_left(mask):
    rng = np.random.default_rng(5)
    arena, plan = _decode_arena(0, 9, [21, 21], rng)   # release point 9: page 8..11 keeps 8 hidden
    with arena:
        assert all(w > s for s, w in _hidden(plan)), _hidden(plan)
        a, f = _check_decode(arena, plan, mask, rng)
        assert a.window_left == int(plan.kv_len[0]) - 1 - 1   # one hidden key at the front
        assert f.window_size[0] == a.window_left
        p = _check_flashinfer_prefill(arena, plan, mask, 0, rng, expect_mask=False)   # one query: a window will do
        assert p.window_left == a.window_left


def test_bad_arguments_are_refused_by_name():
    rng = np.random.default_rng(14)
    arena, plan = _decode_arena(0, 0, [6], rng)
    with arena:
        with pytest.raises(ValueError, match="fmt: 'jax'"):
            interop.flashinfer_prefill_args(plan, fmt="jax")
        with pytest.raises(ValueError, match="mask"):
            interop.flash_attn_args(plan, mask="sliding", page_multiple=1)
        with pytest.raises(interop.UnsupportedCase, match="page_size 4 is not a multiple of 0"):
            interop.flash_attn_args(plan, page_multiple=0)
        with pytest.raises(ValueError, match="window_left -2"):
            interop.flashinfer_decode_args(plan, mask="window", window_left=-2)


def test_decode_segments_needing_different_windows_are_refused_by_name():
    rng = np.random.default_rng(6)
    arena, plan = _decode_arena(0, 9, [21, 25], rng)
    with arena:
        for call in (interop.flashinfer_decode_args, lambda p: interop.flash_attn_args(p, page_multiple=1)):
            with pytest.raises(interop.UnsupportedCase) as e:
                call(plan)
            assert e.value.case == "window_per_segment" and e.value.segment == 1
        # the prefill wrapper says it with a mask
        _check_flashinfer_prefill(arena, plan, "causal", 0, rng, expect_mask=True)


def test_decode_window_for_one_segment_must_not_hide_keys_of_a_longer_one():
    rng = np.random.default_rng(12)
    arena, plan = _decode_arena(0, [9, 0], [21, 30], rng)   # only the first released: 30 keys all visible
    with arena:
        with pytest.raises(interop.UnsupportedCase) as e:
            interop.flashinfer_decode_args(plan)
        assert e.value.case == "window_per_segment" and "at least 30" in str(e.value)   # 31 keys, the query at 30
        _check_flashinfer_prefill(arena, plan, "causal", 0, rng, expect_mask=True)
    arena, plan = _decode_arena(0, [9, 0], [21, 8], rng)    # a shorter one: the window reaches all its keys
    with arena:
        _check_decode(arena, plan, "causal", rng)


def test_decode_sink_and_hole_is_refused_and_prefill_masks_it():
    rng = np.random.default_rng(8)
    arena, plan = _decode_arena(5, 9, [22], rng)   # sink 0..4 on pages 0..7 (5..7 hidden), window mid-page
    with arena:
        (se, ws), = _hidden(plan)
        assert se == 5 and ws > 8 and ws % PAGE, (se, ws)
        for call in (interop.flashinfer_decode_args, lambda p: interop.flash_attn_args(p, page_multiple=1)):
            with pytest.raises(interop.UnsupportedCase) as e:
                call(plan)
            assert e.value.case == "sink_and_hole" and "segment 0" in str(e.value)
        _check_flashinfer_prefill(arena, plan, "causal", 0, rng, expect_mask=True)


def test_decode_sink_and_hole_in_two_parts_merged_by_lse_is_the_whole():
    # the rule docs/interop.md gives for BatchDecode: the window part from an
    # exclude_prefix plan (a hidden front: window_left), the sink part cut
    # with last_page_len alone, the two merged by their LSE
    rng = np.random.default_rng(13)
    arena, plan = _decode_arena(5, 9, [22], rng)
    with arena:
        q = rng.standard_normal((1, QH, DIM)).astype(np.float32)
        whole = mk.attention(arena, 0, plan, q, mask="causal")
        window = exact_plan(arena, [(arena_req, 1) for arena_req in _requests(arena, plan)], exclude_prefix=True)
        a = interop.flashinfer_decode_args(window, mask="causal")
        assert a.window_left >= 0
        pools = interop.arena_pools(arena, 0)
        lse_w = torch.empty(1, QH)
        o_w = flashinfer_decode_reference(torch.from_numpy(q), pools, a.kv_indptr, a.kv_indices, a.kv_last_page_len,
                                          PAGE, a.window_left, lse=lse_w)
        sink_pages = plan.kv_indices[:2].copy()          # tokens 0..4 on two pages, the second holds 1
        lse_s = torch.empty(1, QH)
        o_s = flashinfer_decode_reference(torch.from_numpy(q), pools, torch.tensor([0, 2], dtype=torch.int32),
                                          torch.from_numpy(sink_pages), torch.tensor([1], dtype=torch.int32), PAGE,
                                          lse=lse_s)
        ln2 = float(np.log(2.0))
        o, _ = mk.merge(o_w.numpy(), (lse_w * ln2).numpy(), o_s.numpy(), (lse_s * ln2).numpy())
        np.testing.assert_allclose(o, whole, atol=1e-5, rtol=1e-5)
        assert np.abs(o_w.numpy() - whole).max() > 1e-3   # the window part alone is not the answer


def _requests(arena, plan):
    return [mk.Request(arena, int(i)) for i in plan.buffers["requests"][:plan.batch]]


# ---- flash-attn over chunks ------------------------------------------------------------------------

def test_flash_attn_chunks_without_hidden_keys_match_and_hidden_ones_are_refused():
    rng = np.random.default_rng(9)
    with mk.Arena(64, PAGE, num_layers=1, kv_heads=KVH, head_dim=DIM) as arena:
        reqs = [arena.add_request() for _ in range(2)]
        arena.admit([(r, 10) for r in reqs])
        plan = exact_plan(arena, [(r, 10) for r in reqs])
        _write(arena, plan, rng)
        q = rng.standard_normal((plan.total_q, QH, DIM)).astype(np.float32)
        for mask in ("none", "causal"):
            ours = mk.attention(arena, 0, plan, q, mask=mask)
            f = interop.flash_attn_args(plan, mask=mask, page_multiple=1)
            assert tuple(f.block_table.shape) == (2, 3) and f.seqlen_q == 10
            k, v = interop.arena_pools(arena, 0)
            fa = flash_attn_reference(torch.from_numpy(q).reshape(2, 10, QH, DIM), k, v, f.block_table,
                                      f.cache_seqlens, f.causal, f.window_size)
            np.testing.assert_allclose(fa.reshape(-1, QH, DIM).numpy(), ours, atol=1e-5, rtol=1e-5)
        with pytest.raises(interop.UnsupportedCase) as e:
            interop.flash_attn_args(plan)   # page size 4 is no multiple of 256
        assert e.value.case == "page_size" and "256" in str(e.value)
        arena.commit([(r, 10) for r in reqs])
        reqs[0].release_oldest(5)          # window starts mid-page: a hidden front
        arena.publish()
        arena.admit([(r, 3) for r in reqs])
        plan = exact_plan(arena, [(r, 3) for r in reqs])
        with pytest.raises(interop.UnsupportedCase) as e:
            interop.flash_attn_args(plan, page_multiple=1)
        assert e.value.case == "window_per_segment" and e.value.segment == 0


def test_flash_attn_refuses_ragged_queries_and_padding():
    with mk.Arena(64, PAGE, num_layers=1, kv_heads=KVH, head_dim=DIM) as arena:
        a, b = arena.add_request(), arena.add_request()
        arena.admit([(a, 3), (b, 5)])
        plan = exact_plan(arena, [(a, 3), (b, 5)])
        with pytest.raises(interop.UnsupportedCase) as e:
            interop.flash_attn_args(plan, page_multiple=1)
        assert e.value.case == "ragged_queries" and e.value.segment == 1
        with pytest.raises(interop.UnsupportedCase) as e:
            interop.flashinfer_decode_args(plan)
        assert e.value.case == "decode_queries" and e.value.segment == 0


# ---- the rule itself and the pools -------------------------------------------------------------------

def test_visible_mask_is_the_plans_rule_key_by_key():
    rng = np.random.default_rng(10)
    arena, plan = _decode_arena(5, 9, [22], rng)
    with arena:
        vm = interop.visible_mask(plan, 0, "causal")
        kv, split, shift = int(plan.kv_len[0]), int(plan.kv_pos_split[0]), int(plan.kv_pos_shift[0])
        kpos = [j if j < split else j + shift for j in range(kv)]
        (se, ws), = _hidden(plan)
        assert se == 5 and ws % PAGE
        expect = [not (se <= p < ws) for p in kpos]
        assert vm.shape == (1, kv) and vm[0].tolist() == expect
        with pytest.raises(ValueError, match="segment 3"):
            interop.visible_mask(plan, 3)
        with pytest.raises(ValueError, match="window_left -1"):
            interop.visible_mask(plan, 0, "window", -1)
        with pytest.raises(ValueError, match="mask"):
            interop.visible_mask(plan, 0, "sliding")


def test_arena_pools_are_views_of_the_store():
    with mk.Arena(8, PAGE, num_layers=2, kv_heads=KVH, head_dim=DIM, dtype="bf16") as arena:
        k, v = interop.arena_pools(arena, 1)
        assert k.dtype == torch.bfloat16 and tuple(k.shape) == (8, PAGE, KVH, DIM)
        assert k.data_ptr() == ctypes.cast(_ffi.lib.mskv_store_pool(arena.ptr, 1, 0), ctypes.c_void_p).value
        assert v.data_ptr() == ctypes.cast(_ffi.lib.mskv_store_pool(arena.ptr, 1, 1), ctypes.c_void_p).value
    with mk.Arena(8, PAGE) as bare:
        with pytest.raises(ValueError, match="no host pools|out of range|is not in"):
            interop.arena_pools(bare, 0)


def test_cuda_store_pools_need_a_gpu():
    ok, why = mk.cuda_probe()
    if not ok:
        pytest.skip("no GPU: %s" % why)
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    cuda = mk.Cuda()
    with mk.CudaStore(cuda, 8, PAGE, 1, KVH, DIM, dtype="f16") as st:
        k, v = interop.cuda_store_pools(st, 0)
        assert k.is_cuda and k.dtype == torch.float16 and k.data_ptr() == st.pool(0, "k")
        assert v.data_ptr() == st.pool(0, "v")
