"""The CPU backend on NumPy arrays (f32, f16, bf16 as uint16 bits): K/V
write, paged attention, LSE merge and RoPE, against NumPy references."""
import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _ffi

SEED = 20261201


def _reference(q, k, v, mask="none", window_left=0, q_pos=None, k_pos=None):
    """Softmax attention in float64; q [n, QH, d], k/v [m, KVH, d]; masks on absolute positions."""
    g = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1).astype(np.float64), np.repeat(v, g, axis=1).astype(np.float64)
    s = np.einsum("nhd,mhd->hnm", q.astype(np.float64), kk) / np.sqrt(q.shape[2])
    if mask != "none":
        ok = k_pos[None, :] <= q_pos[:, None]
        if mask == "window":
            ok &= (q_pos[:, None] - k_pos[None, :]) <= window_left
        s = np.where(ok[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = (np.log(p.sum(-1)) + m[..., 0]).T
    return np.einsum("hnm,mhd->nhd", p / p.sum(-1, keepdims=True), vv), lse


def _run(dtype, n_kv=37, n_q=5, mask="none", window_left=0, cpu=None, q_heads=4):
    print("seed", SEED)
    g = np.random.default_rng(SEED)
    np_dtype = {"f32": np.float32, "f16": np.float16}.get(dtype)
    pages = n_kv // 4 + 2
    with mk.Arena(num_pages=pages, page_size=4, num_layers=1, kv_heads=2, head_dim=16, dtype=dtype) as a:
        r = a.add_request()
        plan = mk.Plan(1, n_kv, pages)
        k = g.standard_normal((n_kv, 2, 16)).astype(np.float32)
        v = g.standard_normal((n_kv, 2, 16)).astype(np.float32)
        q = g.standard_normal((n_q, q_heads, 16)).astype(np.float32)

        def cast(x):
            return mk.to_bf16(x) if dtype == "bf16" else x.astype(np_dtype)

        def back(x):
            return mk.from_bf16(x) if dtype == "bf16" else x.astype(np.float32)

        a.admit([(r, n_kv)])
        a.plan_build([(r, n_kv)], plan)
        a.write_kv(0, plan, cast(k), cast(v))
        a.commit([(r, n_kv - n_q)])
        # the last n_q tokens stay reserved: they are the queries' own step
        a.plan_build([(r, n_q)], plan)
        o, lse = mk.attention(a, 0, plan, cast(q), lse=True, mask=mask, window_left=window_left, cpu=cpu)
        pos = np.arange(n_kv)
        ref, ref_lse = _reference(back(cast(q)), back(cast(k)), back(cast(v)), mask, window_left,
                                  pos[n_kv - n_q:], pos)
        return back(o), lse, ref, ref_lse


@pytest.mark.parametrize("dtype,tol", [("f32", 2e-6), ("f16", 2e-3), ("bf16", 2e-2)])
def test_attention_matches_a_numpy_reference_in_each_dtype(dtype, tol):
    o, lse, ref, ref_lse = _run(dtype)
    assert np.abs(o - ref).max() <= tol
    assert np.abs(lse - ref_lse).max() <= 1e-4


@pytest.mark.parametrize("mask,window_left", [("causal", 0), ("window", 6)])
def test_attention_masks_are_on_absolute_positions(mask, window_left):
    o, lse, ref, ref_lse = _run("f32", n_kv=30, n_q=9, mask=mask, window_left=window_left)
    assert np.abs(o - ref).max() <= 2e-6 and np.abs(lse - ref_lse).max() <= 1e-4


def test_attention_on_two_threads_equals_one_thread_with_the_same_tiles():
    with mk.Cpu(num_threads=2) as cpu:
        threaded, _, ref, _ = _run("f32", n_kv=300, n_q=64, cpu=cpu)
    with mk.Cpu(num_threads=1) as cpu:
        single = _run("f32", n_kv=300, n_q=64, cpu=cpu)[0]
    assert np.array_equal(threaded, single)     # work items never split one sequence's keys
    assert np.abs(threaded - ref).max() <= 2e-6


def test_write_kv_with_rope_equals_rope_then_write(arena):
    g = np.random.default_rng(SEED)
    rope = mk.Rope(mode="1d", theta=500.0)
    r = arena.add_request()
    arena.admit([(r, 6)])
    plan = arena.plan_build([(r, 6)], mk.Plan(1, 8, 8), pos="1d")
    k = g.standard_normal((6, 2, 8)).astype(np.float32)
    arena.write_kv(0, plan, k, k, rope=rope)
    expect = rope.apply(k, plan.positions)
    pool = arena.pool(0, "k")
    got = np.stack([pool[s // 4, s % 4] for s in plan.slot_mapping])
    assert np.array_equal(got, expect)
    assert np.array_equal(np.stack([arena.pool(0, "v")[s // 4, s % 4] for s in plan.slot_mapping]), k)


def test_rope_1d_matches_the_formula():
    g = np.random.default_rng(SEED)
    x = g.standard_normal((5, 3, 8)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 12345], np.int32)
    got = mk.Rope(mode="1d").apply(x, pos)
    ang = pos[:, None].astype(np.float64) * 10000.0 ** (-2.0 * np.arange(4) / 8)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = x[..., :4].astype(np.float64), x[..., 4:].astype(np.float64)
    expect = np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    assert np.abs(got - expect).max() <= 1e-5


def test_rope_3d_rotates_each_axis_part_by_its_own_position():
    x = np.ones((2, 1, 12), np.float32)
    rope = mk.Rope(mode="3d", dims=(4, 4, 4))
    got = rope.apply(x, np.array([[0, 0, 0], [0, 5, 0]], np.int32))
    assert np.array_equal(got[0], x[0])                         # position (0, 0, 0): no rotation
    assert np.array_equal(got[1][0, :4], x[1][0, :4]) and np.array_equal(got[1][0, 8:], x[1][0, 8:])
    assert not np.allclose(got[1][0, 4:8], 1.0)                  # only the row part turned


def test_merge_of_two_halves_equals_attention_over_all_keys():
    g = np.random.default_rng(SEED)
    q = g.standard_normal((3, 2, 8))
    k = g.standard_normal((20, 2, 8))
    v = g.standard_normal((20, 2, 8))
    oa, la = _reference(q, k[:7], v[:7])
    ob, lb = _reference(q, k[7:], v[7:])
    o, lse = mk.merge(oa.astype(np.float32), la.astype(np.float32), ob.astype(np.float32), lb.astype(np.float32))
    ref, ref_lse = _reference(q, k, v)
    assert np.abs(o - ref).max() <= 1e-5 and np.abs(lse - ref_lse).max() <= 1e-5


def test_merge_may_write_over_its_inputs():
    oa = np.ones((2, 1, 4), np.float32)
    la = np.zeros((2, 1), np.float32)
    ob = np.full((2, 1, 4), 3.0, np.float32)
    lb = np.zeros((2, 1), np.float32)
    o, lse = mk.merge(oa, la, ob, lb, out=oa, out_lse=la)
    assert o is oa and np.allclose(oa, 2.0) and np.allclose(la, np.log(2.0))


def test_bf16_helpers_round_like_the_library():
    g = np.random.default_rng(SEED)
    x = np.concatenate([g.standard_normal(2000).astype(np.float32) * 100,
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.00390625, 1.01171875, 3.4e38], np.float32)])
    lib = np.array([_ffi.lib.mskv_f32_to_bf16(float(v)) for v in x], np.uint16)
    assert np.array_equal(mk.to_bf16(x), lib)
    back = np.array([_ffi.lib.mskv_bf16_to_f32(int(b)) for b in lib], np.float32)
    assert np.array_equal(mk.from_bf16(lib), back, equal_nan=True)


def test_rope_apply_is_pure_and_apply__rotates_in_place():
    g = np.random.default_rng(SEED)
    print("seed", SEED)
    x = g.standard_normal((4, 2, 8)).astype(np.float32)
    keep = x.copy()
    pos = np.array([0, 3, 9, 40], np.int32)
    rope = mk.Rope(mode="1d", style="interleaved")
    y = rope.apply(x, pos)
    assert y is not x and np.array_equal(x, keep)          # x unchanged
    assert not np.allclose(y[1:], keep[1:])
    z = rope.apply_(x, pos)
    assert z is x and np.array_equal(x, y)                 # the same rotation, in place
    ro = keep.copy()
    ro.flags.writeable = False
    assert np.array_equal(rope.apply(ro, pos), y)          # pure: a read-only input is fine


def test_rope_interleaved_pairs_adjacent_channels_as_wans_rope_apply():
    x = np.random.default_rng(SEED).standard_normal((3, 1, 8)).astype(np.float32)
    pos = np.array([0, 2, 5], np.int32)
    got = mk.Rope(mode="1d", style="interleaved").apply(x, pos)
    ang = pos[:, None].astype(np.float64) * 10000.0 ** (-2.0 * np.arange(4) / 8)
    c = (x[..., 0::2] + 1j * x[..., 1::2]).astype(np.complex128) * np.exp(1j * ang)[:, None]   # Wan: view_as_complex
    expect = np.stack([c.real, c.imag], axis=-1).reshape(x.shape)
    assert np.abs(got - expect).max() <= 1e-5


def test_cpu_defaults_to_the_machines_cores():
    import os
    import sys
    with mk.Cpu() as c:
        torch = sys.modules.get("torch")
        want = torch.get_num_threads() if torch is not None else os.cpu_count()
        assert c.num_threads == max(1, want) == mk.default_threads()
    with mk.Cpu(num_threads=1) as c:
        assert c.num_threads == 1


def test_the_bf16_paths_are_named_and_the_emulation_is_chosen_by_the_environment(monkeypatch):
    assert mk.cpu_isa_name(mk.CpuIsa.AVX512_BF16) == "avx512_bf16"
    assert mk.cpu_isa_name("bf16_emu") == "bf16_emu" and mk.cpu_isas()["bf16_emu"]   # plain C: everywhere
    monkeypatch.setenv("MSKV_CPU_ISA", "bf16_emu")
    with mk.Cpu(num_threads=1) as cpu:
        assert cpu.info().isa == mk.CpuIsa.BF16_EMU
        # 24 queries x 2 q heads per kv head: 48 rows, the wide (video) kernels with bf16 products
        o, lse, ref, ref_lse = _run("bf16", n_kv=70, n_q=24, cpu=cpu)
    monkeypatch.setenv("MSKV_CPU_ISA", "portable")
    with mk.Cpu(num_threads=1) as cpu:
        assert cpu.info().isa == mk.CpuIsa.PORTABLE
        o_f32 = _run("bf16", n_kv=70, n_q=24, cpu=cpu)[0]
    assert np.abs(o - ref).max() <= 2e-2 and np.abs(lse - ref_lse).max() <= 2e-2
    assert not np.array_equal(o, o_f32)   # Q and P were rounded to bf16: not the f32 products' result
