"""Prefix views from Python: a request's protected prefix gathered into
contiguous K/V (PrefixView), attended without a page table
(attention_dense, a "prefix" plan), refused once the prefix changed and
refreshed in place; the dense prefix plus the paged rest (exclude_prefix)
merged equal the paged attention over everything. On a GPU (PyTorch with
CUDA): the device view against the CPU (skipped, with the reason, without)."""
import numpy as np
import pytest

import mstar_kv as mk

SEED = 20261201


def _rig(dtype="f32"):
    a = mk.Arena(num_pages=32, page_size=16, num_layers=2, kv_heads=2, head_dim=32, dtype=dtype)
    rng = np.random.default_rng(SEED)
    print("seed", SEED)
    r = a.add_request()
    for n in (100, 8):   # 100 tokens, then the step's 8 queries
        a.admit([(r, n)])
        plan = a.plan_build([(r, n)], mk.Plan(1, n, 16))
        for layer in range(2):
            k = rng.standard_normal((n, 2, 32)).astype(np.float32)
            v = rng.standard_normal((n, 2, 32)).astype(np.float32)
            a.write_kv(layer, plan, k, v)
        a.commit([(r, n)])
        if n == 100:
            r.protect_prefix(37)   # mid-page
    q = rng.standard_normal((8, 4, 32)).astype(np.float32)
    return a, r, q


def _reference(k, v, q):
    """softmax(q k^T / sqrt(d)) v over every key, GQA 4:2, in float64."""
    out = np.zeros(q.shape, np.float64)
    for h in range(q.shape[1]):
        kh = k[:, h // 2].astype(np.float64)
        s = q[:, h].astype(np.float64) @ kh.T / np.sqrt(q.shape[2])
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // 2].astype(np.float64)
    return out


def test_prefix_view_holds_the_prefix_and_attends_like_a_reference():
    a, r, q = _rig()
    view = r.prefix_view(64)
    assert not view.current and view.epoch == 0
    view.gather()
    assert view.current and view.tokens == 37 and not view.device
    pages = r.pages()
    for layer in range(2):
        k, v = view.layer(layer)
        pool_k = a.pool(layer, "k").reshape(-1, 2, 32)
        rows = np.concatenate([pool_k[p * 16:(p + 1) * 16] for p in pages[:3]])[:37]
        assert np.array_equal(k, rows)        # the prefix, in order, from its pages
        plan = a.plan_build([(r, 8)], mk.Plan(1, 8, 16), kind="prefix")
        out = mk.attention_dense(view, layer, plan, q)
        assert np.abs(out - _reference(k, v, q)).max() < 1e-5


def test_dense_prefix_plus_paged_rest_merge_to_the_paged_whole():
    a, r, q = _rig()
    view = r.prefix_view(64).gather()
    for mask in ("none", "causal"):
        whole, lw = mk.attention(a, 1, a.plan_build([(r, 8)], mk.Plan(1, 8, 16)), q, lse=True, mask=mask)
        od, ld = mk.attention_dense(view, 1, a.plan_build([(r, 8)], mk.Plan(1, 8, 16), kind="prefix"), q,
                                    lse=True, mask=mask)
        orr, lr = mk.attention(a, 1, a.plan_build([(r, 8)], mk.Plan(1, 8, 16), exclude_prefix=True), q,
                               lse=True, mask=mask)
        om, lm = mk.merge(od, ld, orr, lr)
        assert np.abs(om - whole).max() < 1e-5 and np.abs(lm - lw).max() < 1e-5


def test_a_changed_prefix_is_refused_until_gathered_again():
    a, r, q = _rig()
    view = r.prefix_view(96).gather()
    epoch = view.epoch
    r.protect_prefix(70)
    assert not view.current
    with pytest.raises(mk.StaleViewError):
        view.check()
    plan = a.plan_build([(r, 8)], mk.Plan(1, 8, 16), kind="prefix")
    with pytest.raises(mk.StaleViewError):
        mk.attention_dense(view, 0, plan, q)
    view.gather()                     # in place: the same buffers
    assert view.current and view.tokens == 70 and view.epoch != epoch
    k, v = view.layer(0)
    assert np.abs(mk.attention_dense(view, 0, plan, q) - _reference(k, v, q)).max() < 1e-5
    with pytest.raises(mk.CapacityError):
        r.prefix_view(69).gather()    # the prefix does not fit


def test_bf16_views_hold_the_stores_bits():
    a, r, q = _rig("bf16")
    view = r.prefix_view(40).gather()
    assert view.k.dtype == np.uint16 and view.k.shape == (2, 40, 2, 32)
    plan = a.plan_build([(r, 8)], mk.Plan(1, 8, 16), kind="prefix")
    out = mk.attention_dense(view, 0, plan, mk.to_bf16(q))
    k, v = view.layer(0)
    ref = _reference(mk.from_bf16(k), mk.from_bf16(v), mk.from_bf16(mk.to_bf16(q)))
    assert np.abs(mk.from_bf16(out) - ref).max() < 2e-2


def test_device_view_matches_the_cpu():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device here")
    ok, why = mk.cuda_probe()
    if not ok:
        pytest.skip("mstar_kv cannot open the GPU: " + why)
    g = torch.Generator().manual_seed(SEED)
    k = torch.randn((300, 2, 64), generator=g).half()
    v = torch.randn((300, 2, 64), generator=g).half()
    q = torch.randn((8, 4, 64), generator=g).half()
    cu = mk.Cuda()
    st = mk.CudaStore(cu, num_pages=32, page_size=16, num_layers=1, kv_heads=2, head_dim=64, dtype="f16")
    a = st.arena()
    r = a.add_request()
    a.admit([(r, 300)])
    dp = st.upload_plan(a.plan_build([(r, 300)], mk.Plan(1, 300, 32)))
    st.write_kv(0, dp, k.cuda(), v.cuda())
    a.commit([(r, 300)])
    r.protect_prefix(200)
    a.admit([(r, 8)])
    dk = torch.empty((1, 256, 2, 64), dtype=torch.float16, device="cuda")
    dv = torch.empty_like(dk)
    view = st.prefix_view(r, dk, dv).gather()
    assert view.device and view.tokens == 200
    plan = a.plan_build([(r, 8)], mk.Plan(1, 8, 32), kind="prefix")
    out = torch.empty((8, 4, 64), dtype=torch.float16, device="cuda")
    st.attention_dense(view, 0, st.upload_plan(plan), q.cuda(), out)
    torch.cuda.synchronize()
    ref = _reference(k[:200].numpy(), v[:200].numpy(), q.numpy())
    assert np.abs(out.float().cpu().numpy() - ref).max() < 4e-3
    st.close()
    cu.close()
