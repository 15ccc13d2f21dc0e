"""The GPU layer from Python. Without a GPU: the unavailable path and the
stream-handle rules. With PyTorch and a CUDA device: torch tensors through
the store, on torch's current stream, with the K/V in torch-owned pools
(skipped, with the reason, where either is missing)."""
import numpy as np
import pytest

import mstar_kv as mk


def test_probe_and_create_say_why_cuda_is_unavailable():
    ok, why = mk.cuda_probe()
    if ok:
        pytest.skip("a CUDA device is present: the unavailable path is not reachable here")
    assert "libcuda" in why or "device" in why
    with pytest.raises(mk.CudaUnavailableError) as e:
        mk.Cuda()
    assert e.value.code == -83 and e.value.detail == why


def test_cpu_backend_works_after_cuda_was_refused():
    try:
        mk.Cuda().close()
    except mk.CudaUnavailableError:
        pass
    with mk.Arena(num_pages=8, page_size=4, num_layers=1, kv_heads=1, head_dim=4) as a:
        r = a.add_request()
        a.admit([(r, 3)])
        plan = a.plan_build([(r, 3)], mk.Plan(1, 4, 4))
        a.write_kv(0, plan, np.ones((3, 1, 4), np.float32), np.full((3, 1, 4), 2.0, np.float32))
        assert np.allclose(mk.attention(a, 0, plan, np.ones((3, 1, 4), np.float32)), 2.0)


def test_attn_path_names_the_kernel_and_an_unknown_one_is_refused_before_any_driver_call():
    assert mk._cuda._desc(0, None, None, None, False, "wgmma").attn_path == 2
    assert mk._cuda._desc(0, None, None, None, False, "MMA").attn_path == 1
    assert mk._cuda._desc(0, None, None, None, False).attn_path == 0
    with pytest.raises(ValueError):
        mk.Cuda(attn_path="tensor cores")


class _Recorder:
    def __init__(self):
        self.calls = []

    def _call(self, function, *args):
        self.calls.append((function,) + args)


class _TorchLikeStream:
    def __init__(self, handle):
        self.cuda_stream = handle


def test_set_stream_maps_the_default_stream_to_legacy_and_none_to_the_stores_own():
    st = object.__new__(mk.CudaStore)
    st._ptr, st._cuda = 0x1234, _Recorder()
    st.set_stream(_TorchLikeStream(0))          # torch's default stream is handle 0
    st.set_stream(_TorchLikeStream(0xBEEF))
    st.set_stream(0xCAFE)
    st.set_stream(None)
    assert [c[2] for c in st.cuda.calls] == [mk.STREAM_LEGACY, 0xBEEF, 0xCAFE, None]
    assert all(c[:2] == ("mskv_cuda_store_set_stream", 0x1234) for c in st.cuda.calls)
    st._ptr = None


# ---- with PyTorch ----------------------------------------------------------------------------

def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed (the package does not need it; these tests check torch tensors)")
    return torch


def _torch_cuda():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device here")
    ok, why = mk.cuda_probe()
    if not ok:
        pytest.skip("mstar_kv cannot open the GPU: " + why)
    return torch


def test_torch_cpu_tensors_feed_the_cpu_backend_bf16_included():
    torch = _torch()
    with mk.Arena(num_pages=8, page_size=4, num_layers=1, kv_heads=1, head_dim=8, dtype="bf16") as a:
        r = a.add_request()
        a.admit([(r, 3)])
        plan = a.plan_build([(r, 3)], mk.Plan(1, 4, 4))
        kv = torch.ones((3, 1, 8), dtype=torch.bfloat16)
        a.write_kv(0, plan, kv, kv * 2)
        out = torch.zeros((3, 1, 8), dtype=torch.bfloat16)
        mk.attention(a, 0, plan, torch.ones((3, 1, 8), dtype=torch.bfloat16), out=out)
        assert torch.allclose(out.float(), torch.full((3, 1, 8), 2.0))


def _gpu_rig(torch, adopt):
    cu = mk.Cuda()
    dev = torch.device("cuda")
    pools = None
    if adopt:
        pools = [tuple(torch.empty((32, 16, 2, 64), dtype=torch.float16, device=dev) for _ in range(2))]
    st = mk.CudaStore(cu, num_pages=32, page_size=16, num_layers=1, kv_heads=2, head_dim=64, dtype="f16",
                      pools=pools)
    return cu, st, st.arena(), pools


def test_torch_cuda_tensors_match_the_cpu_backend_in_adopted_pools():
    torch = _torch_cuda()
    cu, st, a, pools = _gpu_rig(torch, adopt=True)
    g = torch.Generator().manual_seed(7)
    k = torch.randn((40, 2, 64), generator=g).half()
    v = torch.randn((40, 2, 64), generator=g).half()
    q = torch.randn((40, 4, 64), generator=g).half()
    r = a.add_request()
    a.admit([(r, 40)])
    plan = a.plan_build([(r, 40)], mk.Plan(1, 40, 8))
    dp = st.upload_plan(plan)
    st.write_kv(0, dp, k.cuda(), v.cuda())
    out = torch.empty((40, 4, 64), dtype=torch.float16, device="cuda")
    st.attention(0, dp, q.cuda(), out, mask="causal")
    torch.cuda.synchronize()
    slot = r.slot(39)
    assert torch.equal(pools[0][0][slot // 16, slot % 16].cpu(), k[39])     # K/V live in the torch tensors
    with mk.Arena(num_pages=32, page_size=16, num_layers=1, kv_heads=2, head_dim=64, dtype="f16") as ca:
        cr = ca.add_request()
        ca.admit([(cr, 40)])
        cplan = ca.plan_build([(cr, 40)], mk.Plan(1, 40, 8))
        ca.write_kv(0, cplan, k.numpy(), v.numpy())
        ref = mk.attention(ca, 0, cplan, q.numpy(), mask="causal")
    assert np.abs(out.float().cpu().numpy() - ref.astype(np.float32)).max() < 2e-3
    st.close()
    cu.close()


def test_torch_calls_run_on_torchs_current_stream():
    torch = _torch_cuda()
    cu, st, a, _ = _gpu_rig(torch, adopt=False)
    r = a.add_request()
    a.admit([(r, 16)])
    dp = st.upload_plan(a.plan_build([(r, 16)], mk.Plan(1, 16, 4)))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        k = torch.zeros((16, 2, 64), dtype=torch.float16, device="cuda")
        st.write_kv(0, dp, k, k)
        assert st.stream == s.cuda_stream
    st.write_kv(0, dp, k, k)                       # back on the default stream
    assert st.stream == mk.STREAM_LEGACY or st.stream == torch.cuda.current_stream().cuda_stream
    st.set_stream(None)
    st.close()
    cu.close()


def test_write_kv_takes_f32_tensors_and_rounds_them_into_the_pools_as_the_cpu_does():
    torch = _torch_cuda()
    cu, st, a, pools = _gpu_rig(torch, adopt=True)
    g = torch.Generator().manual_seed(11)
    k = torch.randn((40, 2, 64), generator=g) * 100
    v = torch.randn((40, 2, 64), generator=g) / 100
    r = a.add_request()
    a.admit([(r, 40)])
    dp = st.upload_plan(a.plan_build([(r, 40)], mk.Plan(1, 40, 8)))
    st.write_kv(0, dp, k.cuda(), v.cuda())                       # f32 into an f16 store
    torch.cuda.synchronize()
    with mk.Arena(num_pages=32, page_size=16, num_layers=1, kv_heads=2, head_dim=64, dtype="f16") as ca:
        cr = ca.add_request()
        ca.admit([(cr, 40)])
        ca.write_kv(0, ca.plan_build([(cr, 40)], mk.Plan(1, 40, 8)), k.numpy(), v.numpy())
        for t in (0, 17, 39):
            gs, cs = r.slot(t), cr.slot(t)
            for kind in (0, 1):
                got = pools[0][kind][gs // 16, gs % 16].cpu().numpy().view(np.uint16)
                ref = ca.pool(0, kind)[cs // 16, cs % 16].view(np.uint16)
                assert np.array_equal(got, ref)
    with pytest.raises(mk.TensorError):
        st.write_kv(0, dp, k.cuda(), v.half().cuda())            # k and v of different dtypes
    st.close()
    cu.close()
