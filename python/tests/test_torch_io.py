"""torch in, torch out, and one call shape on every backend: results take
the input's type, device and dtype; torch.dtype is a dtype; plans are
torch tensors without a copy; CpuBackend and CudaBackend answer the same
calls (the GPU one through a recording stand-in for the store here, and on
a device where there is one)."""
import warnings

import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _ffi

SEED = 2121


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (these tests check torch tensors)")


def _rig(dtype="f32", n=10):
    a = mk.Arena(num_pages=16, page_size=4, num_layers=1, kv_heads=2, head_dim=8, dtype=dtype)
    r = a.add_request()
    a.admit([(r, n)])
    plan = a.plan_build([(r, n)], mk.Plan(1, n, 8), pos="1d")
    return a, r, plan


def test_attention_with_a_torch_q_returns_a_tensor_of_its_dtype():
    torch = _torch()
    print("seed", SEED)
    g = torch.Generator().manual_seed(SEED)
    for dt, tol in ((torch.float32, 1e-6), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        a, r, plan = _rig(dtype=dt)
        k, v, q = (torch.randn((10, 2, 8), generator=g).to(dt) for _ in range(2)), None, None
        k, v = list(k)
        q = torch.randn((10, 4, 8), generator=g).to(dt)
        a.write_kv(0, plan, k, v)
        out = mk.attention(a, 0, plan, q, mask="causal")
        assert isinstance(out, torch.Tensor) and out.dtype == dt and out.device.type == "cpu"
        assert out.shape == (10, 4, 8)
        ref = mk.attention(a, 0, plan, q.float().numpy() if dt != torch.bfloat16 else
                           q.view(torch.uint16).numpy(), mask="causal")
        ref = torch.from_numpy(ref.view(np.uint16).astype(np.int32) << 16).view(torch.float32) \
            if dt == torch.bfloat16 else torch.from_numpy(ref.astype(np.float32))
        assert (out.float() - ref).abs().max() <= tol
        out2, lse = mk.attention(a, 0, plan, q, lse=True)
        assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32 and lse.shape == (10, 4)
        a.close()


def test_numpy_in_stays_numpy_out_and_bf16_bits_stay_bits():
    a, r, plan = _rig(dtype="bf16")
    q = mk.to_bf16(np.ones((10, 2, 8), np.float32))
    a.write_kv(0, plan, q, q)
    out = mk.attention(a, 0, plan, q)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint16
    a.close()


def test_merge_of_tensors_returns_tensors():
    torch = _torch()
    g = torch.Generator().manual_seed(SEED)
    o_a, o_b = torch.randn((3, 2, 8), generator=g), torch.randn((3, 2, 8), generator=g)
    l_a, l_b = torch.randn((3, 2), generator=g), torch.randn((3, 2), generator=g)
    o, lse = mk.merge(o_a, l_a, o_b, l_b)
    assert isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor)
    w = torch.sigmoid(l_a - l_b)[..., None]
    assert (o - (w * o_a + (1 - w) * o_b)).abs().max() < 1e-5
    assert (lse - torch.logaddexp(l_a, l_b)).abs().max() < 1e-5


def test_torch_dtypes_and_ml_dtypes_are_dtypes():
    torch = _torch()
    assert mk.dtype_code(torch.float32) == 0 and mk.dtype_code(torch.float16) == 1
    assert mk.dtype_code(torch.bfloat16) == 2
    with pytest.raises(ValueError, match="dtype: 'int8' is not one of f32, f16, bf16"):
        mk.dtype_code(torch.int8)
    with mk.Arena(num_pages=4, page_size=4, num_layers=1, kv_heads=1, head_dim=4, dtype=torch.bfloat16) as a:
        assert a.store_info().dtype == 2


def test_ml_dtypes_bfloat16_is_a_dtype_and_its_arrays_come_back_as_such():
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    assert mk.dtype_code(ml.bfloat16) == 2
    a, r, plan = _rig(dtype=ml.bfloat16)
    q = np.ones((10, 2, 8), np.float32).astype(ml.bfloat16)
    a.write_kv(0, plan, q, (q.astype(np.float32) * 2).astype(ml.bfloat16))
    out = mk.attention(a, 0, plan, q)
    assert out.dtype == ml.bfloat16 and np.all(out.astype(np.float32) == 2.0)
    a.close()


def test_plan_torch_shares_the_buffers_without_a_copy_or_a_warning():
    torch = _torch()
    a, r, plan = _rig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = plan.torch()
        slots = plan.torch("slot_mapping")
    assert set(t) >= {"kv_indices", "slot_mapping", "positions", "kv_len"}
    assert slots.dtype == torch.int64 and slots.shape == (10,)
    assert slots.data_ptr() == plan.buffers["slot_mapping"].__array_interface__["data"][0]   # no copy
    assert torch.equal(slots, torch.from_numpy(plan.slot_mapping.copy()))
    assert torch.equal(t["positions"], torch.arange(10, dtype=torch.int32))
    r2 = a.add_request()
    a.admit([(r2, 3)])
    a.plan_build([(r2, 3)], plan, pos="1d")
    assert slots[0].item() == plan.slot_mapping[0]       # the same memory shows the next build
    assert not plan.slot_mapping.flags.writeable         # NumPy users still see the library's output
    with pytest.raises(KeyError, match="no array 'nope'"):
        plan.torch("nope")
    a.close()


def test_rope_apply_on_a_tensor_is_pure_and_apply__in_place():
    torch = _torch()
    x = torch.randn((4, 2, 8), generator=torch.Generator().manual_seed(SEED))
    keep = x.clone()
    pos = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    rope = mk.Rope("1d", style="half")
    y = rope.apply(x, pos)
    assert isinstance(y, torch.Tensor) and torch.equal(x, keep) and not torch.equal(y, x)
    assert rope.apply_(x, pos) is x and torch.equal(x, y)


# ---- one protocol ---------------------------------------------------------------------------------

def test_cpu_backend_answers_the_protocol_and_matches_the_old_calls():
    g = np.random.default_rng(SEED)
    print("seed", SEED)
    a, r, plan = _rig()
    k, v = (g.standard_normal((10, 2, 8)).astype(np.float32) for _ in range(2))
    q = g.standard_normal((10, 4, 8)).astype(np.float32)
    rope = mk.Rope("1d")
    with mk.Cpu(2) as cpu:
        be = mk.backend(a, cpu=cpu)
        assert isinstance(be, mk.CpuBackend) and be is not None and "CpuBackend" in repr(be)
        be.write_kv(0, plan, k, v, rope=rope)
        qr = be.rope(rope, q, plan)                       # a plan's positions
        assert np.array_equal(qr, rope.apply(q, plan.positions))
        out = be.attention(0, plan, qr, mask="causal")
        assert np.array_equal(out, cpu.attention(a, 0, plan, qr, mask="causal"))
        out2, lse = be.attention(0, plan, qr, lse=True)
        assert lse.shape == (10, 4)
    assert isinstance(a.backend(), mk.CpuBackend)
    with pytest.raises(TypeError, match="expected an Arena or a CudaStore"):
        mk.backend(object())
    a.close()


class _FakeDevice:
    """Device memory as __cuda_array_interface__ describes it (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", addr=0x7f0000000000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (addr, False), "version": 3}


class _Recorder:
    """Stands in for a Cuda context: records the calls; an upload fills the device plan."""

    def __init__(self):
        self.calls = []

    def _call(self, function, *args):
        self.calls.append((function,) + args)
        if function == "mskv_cuda_plan_upload":
            host, mode, out = args[1]._obj, args[2], args[3]._obj
            out.batch, out.total_q, out.pos_mode = host.batch, host.total_q, mode
            out.positions, out.kv_indices = 0x5000, 0x6000


def _fake_store():
    st = object.__new__(mk.CudaStore)
    st._ptr, st._cuda, st._stream, st._dtype = 0x1234, _Recorder(), None, "f32"
    d = _ffi.mskv_cuda_store_desc()
    d.num_pages, d.page_size, d.num_layers, d.kv_heads, d.head_dim = 16, 4, 1, 2, 8
    st._desc = d
    return st


def test_cuda_backend_uploads_a_host_plan_once_per_build_and_makes_the_same_calls():
    a, r, plan = _rig()
    st = _fake_store()
    be = st.backend()
    assert isinstance(be, mk.CudaBackend)
    k, v = _FakeDevice((10, 2, 8), addr=0x10000), _FakeDevice((10, 2, 8), addr=0x20000)
    q, out = _FakeDevice((10, 4, 8), addr=0x30000), _FakeDevice((10, 4, 8), addr=0x40000)
    be.write_kv(0, plan, k, v)
    assert be.attention(0, plan, q, out=out) is out
    names = [c[0] for c in st.cuda.calls]
    assert names == ["mskv_cuda_plan_upload", "mskv_cuda_write_kv_ex", "mskv_cuda_attention"]
    w = st.cuda.calls[1]
    assert w[2] == 0 and w[4:6] == (0x10000, 0x20000)
    att = st.cuda.calls[2]
    assert att[6:8] == (0x30000, 0x40000)
    a.plan_build([(r, 10)], plan, pos="1d")            # a new build: uploaded again
    be.attention(0, plan, q, out=out)
    assert [c[0] for c in st.cuda.calls[3:]] == ["mskv_cuda_plan_upload", "mskv_cuda_attention"]
    dp = be.device_plan(plan)
    assert be.device_plan(dp) is dp and len(st.cuda.calls) == 5
    rope = mk.Rope("1d")
    x = _FakeDevice((10, 4, 8), addr=0x50000)
    assert be.rope_(rope, x, plan) is x                  # the plan's device positions
    assert st.cuda.calls[-1][0] == "mskv_cuda_rope" and st.cuda.calls[-1][6] == 0x5000
    with pytest.raises(mk.TensorError, match="out: a new device result is made only for a torch q"):
        be.attention(0, plan, q)
    with pytest.raises(mk.TensorError, match="x: a pure device rope copies x"):
        be.rope(rope, x, plan)
    with pytest.raises(TypeError, match="plan: expected a Plan or a DevicePlan"):
        be.write_kv(0, "plan", k, v)
    arrays = dp.arrays()
    assert arrays["kv_indices"].__cuda_array_interface__["data"][0] == 0x6000
    assert arrays["positions"].__cuda_array_interface__["shape"] == (10,)
    st._ptr = None
    a.close()


def test_the_same_model_code_runs_on_the_gpu_backend():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU (PyTorch has no CUDA device here)")
    ok, why = mk.cuda_probe()
    if not ok:
        pytest.skip("needs a GPU: mstar_kv cannot open one: " + why)
    g = torch.Generator().manual_seed(SEED)
    k, v = torch.randn((10, 2, 8), generator=g).half(), torch.randn((10, 2, 8), generator=g).half()
    q = torch.randn((10, 4, 8), generator=g).half()     # the GPU attends in its store's f16 / bf16
    results = []
    cu = mk.Cuda()
    st = mk.CudaStore(cu, num_pages=16, page_size=4, num_layers=1, kv_heads=2, head_dim=8, dtype="f16")
    for be, dev in ((mk.backend(_rig(dtype="f16")[0]), "cpu"), (st.backend(), "cuda")):
        a = be.arena if dev == "cpu" else st.arena()
        r = a.add_request()
        a.admit([(r, 10)])
        plan = a.plan_build([(r, 10)], mk.Plan(1, 10, 8), pos="1d")
        be.write_kv(0, plan, k.to(dev), v.to(dev), rope=mk.Rope("1d"))
        out = be.attention(0, plan, be.rope(mk.Rope("1d"), q.to(dev), plan), mask="causal")
        assert out.device.type == dev
        assert out.dtype == torch.float16
        results.append(out.float().cpu())
    assert (results[0] - results[1]).abs().max() < 2e-3
    st.close()
    cu.close()
