"""The small calls: dtype sizes, scalar half conversions, the CPU backend on
raw pools, the dense K/V epoch check, device memory and copies (GPU)."""
import numpy as np
import pytest

import mstar_kv as mk
from conftest import filled


def test_dtype_size():
    assert [mk.dtype_size(d) for d in ("f32", "f16", "bf16")] == [4, 2, 2]
    assert mk.dtype_size(mk.Dtype.BF16) == 2
    with pytest.raises(ValueError, match="dtype"):
        mk.dtype_size("f64")


def test_scalar_conversions_round_like_numpy_and_the_array_helpers():
    g = np.random.default_rng(1234)
    print("seed 1234")
    xs = np.concatenate([g.standard_normal(200) * 10.0 ** g.integers(-6, 6, 200),
                         [0.0, -0.0, np.inf, -np.inf, 65520.0, 1e-8]]).astype(np.float32)
    with np.errstate(over="ignore"):   # large values go to inf, as the library's do
        halves = xs.astype(np.float16).view(np.uint16)
    for x, half in zip(xs, halves):
        assert mk.f32_to_f16(x) == int(half), x
        assert mk.f32_to_bf16(x) == int(mk.to_bf16(np.array([x]))[0]), x
        h = mk.f32_to_f16(x)
        assert mk.f16_to_f32(h) == float(np.uint16(h).view(np.float16)) or np.isnan(mk.f16_to_f32(h))
        b = mk.f32_to_bf16(x)
        assert mk.bf16_to_f32(b) == float(mk.from_bf16(np.array([b], np.uint16))[0])
    assert np.isnan(mk.bf16_to_f32(mk.f32_to_bf16(float("nan"))))
    with pytest.raises(TypeError, match="x"):
        mk.f32_to_f16("1.0")
    with pytest.raises(OverflowError, match="h"):
        mk.f16_to_f32(1 << 16)


def test_attention_on_raw_pools_matches_the_arena(arena):
    r, _, _ = filled(arena, 10, seed=9)
    arena.admit([(r, 3)])
    plan = arena.plan_build([(r, 3)], mk.Plan(1, 3, 8))
    g = np.random.default_rng(9)
    print("seed 9")
    k, v = (g.standard_normal((3, 2, 8)).astype(np.float32) for _ in range(2))
    kp, vp = arena.pool(0, "k").copy(), arena.pool(0, "v").copy()
    pools = mk.Pools(kp, vp)
    assert "num_pages=64" in repr(pools)
    pools.write_kv(plan, k, v)
    arena.write_kv(0, plan, k, v)
    assert np.array_equal(kp, arena.pool(0, "k")) and np.array_equal(vp, arena.pool(0, "v"))
    q = g.standard_normal((3, 4, 8)).astype(np.float32)
    want = mk.attention(arena, 0, plan, q, mask="causal")
    got, lse = pools.attention(plan, q, lse=True, mask="causal")
    assert np.allclose(got, want, atol=1e-6) and lse.shape == (3, 4)
    with pytest.raises(mk.TensorError, match="v: shape"):
        mk.Pools(kp, vp[:3])


def test_dense_check_names_both_epochs_once_the_prefix_moved(arena):
    r, _, _ = filled(arena, 12)
    r.protect_prefix(4)
    view = r.prefix_view(8).gather()
    view.dense_check(0)
    r.protect_prefix(8)
    with pytest.raises(mk.StaleViewError, match="epoch"):
        view.dense_check(0)


def test_device_memory_and_copies_round_trip():
    ok, why = mk.cuda_probe()
    if not ok:
        pytest.skip("needs a GPU: %s" % why)
    with mk.Cuda() as cu, mk.CudaStore(cu, 8, 16, 1, 1, 64) as st:
        src = np.arange(256, dtype=np.float32)
        with cu.malloc(src.nbytes) as buf:
            st.upload(buf, src)
            back = st.download(np.zeros_like(src), buf)
        assert np.array_equal(back, src)
