"""The research call order as a drop-in (mstar_kv._research): the
retention from a causal video model's own parameters, a step keyed by its
current_start, per-layer handles sharing one plan per model call, a batch
as one request per sample, arena sizing, and the example model
(python/examples/causal_video_dit.py) against a rolling cache."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

import mstar_kv as mk

SEED = 777
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "causal_video_dit.py"


def test_retention_from_research_is_the_gcd_arithmetic():
    for L, S, fpb, F in [(7, 1, 2, 12), (21, 3, 3, 1560), (12, 3, 3, 5), (5, 1, 4, 7), (6, 2, 2, 4), (9, 0, 3, 6)]:
        r = mk.Retention.from_research(local_attn_size=L, sink_size=S, frames_per_block=fpb, tokens_per_frame=F)
        g = math.gcd(math.gcd(fpb, S), L - fpb)
        assert r.chunk_size == g * F and r.sink_chunks == S // g
        assert r.window_chunks == (L - S - fpb) // g
        assert bool(r.reset_at_boundary) == (r.window_chunks == 0) and r.exact
    assert mk.Retention.from_research(-1, 3, 3, 1560).is_unbounded
    assert repr(mk.Retention.unbounded()) == "Retention.unbounded()"
    assert mk.Retention.unbounded().skipped_tokens(10 ** 9) == 0


def test_retention_from_research_names_the_bad_parameter():
    with pytest.raises(ValueError, match="local_attn_size: 3 frames cannot hold sink_size 1 \\+ frames_per_block 3"):
        mk.Retention.from_research(3, 1, 3, 10)
    with pytest.raises(ValueError, match="frames_per_block: 0"):
        mk.Retention.from_research(7, 1, 0, 10)
    with pytest.raises(ValueError, match="tokens_per_frame: 0"):
        mk.Retention.from_research(7, 1, 2, 0)
    with pytest.raises(ValueError, match="sink_size: -1"):
        mk.Retention.from_research(7, -1, 2, 10)
    with pytest.raises(TypeError, match="local_attn_size: expected an int"):
        mk.Retention.from_research(7.0, 1, 2, 10)


def _self_forcing_attended(L, S, fpb, F, blocks):
    """The keys (absolute positions) Self-Forcing's CausalWanSelfAttention
    attends over per block, from its kv_cache arithmetic (global/local end
    indices, rolling by copying) on a buffer of positions."""
    size, sink, n = L * F, S * F, fpb * F
    cache = np.full(size, -1)
    global_end = local_end = 0
    out = []
    for blk in range(blocks):
        start = blk * n
        end = start + n
        if end > global_end and n + local_end > size:
            evicted = n + local_end - size
            rolled = local_end - evicted - sink
            cache[sink:sink + rolled] = cache[sink + evicted:sink + evicted + rolled].copy()
            local_end = local_end + end - global_end - evicted
        else:
            local_end = local_end + end - global_end
        cache[local_end - n:local_end] = np.arange(start, end)
        out.append(np.sort(cache[max(0, local_end - size):local_end]))
        global_end = end
    return out


@pytest.mark.parametrize("L,S,fpb,F,page", [(7, 1, 2, 5, 4), (12, 3, 3, 5, 8), (5, 1, 4, 3, 4), (6, 2, 2, 4, 16),
                                            (9, 0, 3, 6, 8), (21, 3, 3, 2, 16), (4, 1, 3, 5, 8)])
def test_a_cache_from_research_parameters_attends_over_what_self_forcing_does(L, S, fpb, F, page):
    r = mk.Retention.from_research(L, S, fpb, F)
    blocks = 3 * L // fpb + 4
    n = fpb * F
    want = _self_forcing_attended(L, S, fpb, F, blocks)
    pages = mk.pages_needed(r, block_tokens=n, page_size=page)
    with mk.Arena(num_pages=pages, page_size=page, num_layers=1, kv_heads=1, head_dim=4) as a:
        cache = mk.CausalKVCache(a, r)
        for blk in range(blocks):
            plan = cache.step(blk * n, n)
            got = plan.visible_positions()[0]
            assert np.array_equal(got, want[blk]), "block %d: %s vs Self-Forcing's %s" % (blk, got, want[blk])
        cache.finish()


def _attend_ref(q, k, v):
    s = np.einsum("nhd,mhd->hnm", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hnm,mhd->nhd", s / s.sum(-1, keepdims=True), v.astype(np.float64))


def test_the_same_current_start_overwrites_the_open_block_and_a_new_one_commits_it():
    print("seed", SEED)
    g = np.random.default_rng(SEED)
    r = mk.Retention(6, sink_chunks=1, window_chunks=1)
    with mk.Arena(num_pages=32, page_size=4, num_layers=2, kv_heads=1, head_dim=4) as a:
        cache = mk.CausalKVCache(a, r)
        kv = cache.layers                      # kv_cache[i]
        k0, v0, q = (g.standard_normal((1, 6, 1, 4)).astype(np.float32) for _ in range(3))
        kv[0].attention(q, k0, v0, current_start=0)
        k1, v1 = (g.standard_normal((1, 6, 1, 4)).astype(np.float32) for _ in range(2))
        out = kv[0].attention(q, k1, v1, current_start=0)          # a denoise step: overwrites
        assert np.abs(out[0] - _attend_ref(q[0], k1[0], v1[0])).max() < 1e-5
        assert cache.request_info()[0].committed == 0
        k2, v2 = (g.standard_normal((1, 6, 1, 4)).astype(np.float32) for _ in range(2))
        out = kv[0].attention(q, k2, v2, current_start=6)          # the next block: commits the first
        assert cache.request_info()[0].committed == 6
        ref = _attend_ref(q[0], np.concatenate([k1[0], k2[0]]), np.concatenate([v1[0], v2[0]]))
        assert np.abs(out[0] - ref).max() < 1e-5
        before = a.stats()
        with pytest.raises(ValueError, match="current_start: 3; the open block is \\[6, 12\\): expected 6"):
            kv[0].attention(q, k2, v2, current_start=3)
        with pytest.raises(ValueError, match="n_tokens: 4 for the open block at 6 of 6 tokens"):
            cache.step(6, 4)
        assert a.stats() == before and cache.request_info()[0].reserved == 6   # nothing changed
        cache.finish()
        assert cache.request_info()[0].committed == 12 and cache.plan is None
        with pytest.raises(ValueError, match="current_start: 0; 12 tokens are committed, so the next block starts at 12"):
            cache.step(0, 6)
        live = a.stats().live_pages
        cache.reset()                                               # a new video
        assert a.stats().live_pages < live and cache.request_info()[0].committed == 0
        cache.step(0, 6)
        cache.finish()


def test_every_layer_of_one_model_call_shares_one_plan():
    g = np.random.default_rng(SEED)
    with mk.Arena(num_pages=32, page_size=4, num_layers=3, kv_heads=1, head_dim=4) as a:
        cache = mk.CausalKVCache(a, mk.Retention(8, 1, 1))
        x = g.standard_normal((1, 8, 1, 4)).astype(np.float32)
        for call in range(4):                       # 3 denoise steps and a clean pass
            plans = set()
            for layer in cache.layers:
                layer.attention(x, x, x, current_start=0)
                plans.add(id(cache.plan))
            assert cache.calls == call + 1 and len(plans) == 1
        for layer in cache.layers:
            layer.attention(x, x, x, current_start=8)
        assert cache.calls == 5 and cache.request_info()[0].committed == 8


def test_a_batch_is_a_request_per_sample_in_one_plan_each_as_if_alone():
    print("seed", SEED)
    g = np.random.default_rng(SEED)
    r = mk.Retention(5, sink_chunks=1, window_chunks=2)
    data = [[g.standard_normal((2, 5, 2, 4)).astype(np.float32) for _ in range(3)] for _ in range(7)]
    outs = {}
    for batch in (2, 1):
        with mk.Arena(num_pages=64, page_size=4, num_layers=1, kv_heads=2, head_dim=4) as a:
            results = []
            for sample in range(2 if batch == 1 else 1):
                cache = mk.CausalKVCache(a, r, batch=batch, rope=mk.Rope("1d"))
                res = []
                for blk, (q, k, v) in enumerate(data):
                    sl = slice(None) if batch == 2 else slice(sample, sample + 1)
                    res.append(cache[0].attention(q[sl], k[sl], v[sl], current_start=5 * blk))
                    assert cache.plan.batch == batch
                cache.finish()
                results.append(np.stack(res))
            outs[batch] = results[0] if batch == 2 else np.concatenate(results, axis=1)
    assert outs[2].shape == (7, 2, 5, 2, 4)
    assert np.abs(outs[2] - outs[1]).max() == 0
    assert np.abs(outs[2][:, 0] - outs[2][:, 1]).max() > 0.1


@pytest.mark.parametrize("chunk,blocks_of,page,sink,window", [(12, 2, 8, 1, 4), (16, 1, 8, 1, 2), (40, 1, 16, 1, 2),
                                                             (10, 3, 4, 2, 3), (7, 1, 16, 1, 5)])
def test_pages_needed_is_enough_and_one_fewer_is_not(chunk, blocks_of, page, sink, window):
    r = mk.Retention(chunk, sink_chunks=sink, window_chunks=window)
    n = chunk * blocks_of
    need = mk.pages_needed(r, block_tokens=n, page_size=page, batch=2, extra_tokens=9)

    def run(num_pages):
        with mk.Arena(num_pages=num_pages, page_size=page) as a:
            for b in range(2):
                e = a.keyed_create(100 + b, 9)
                e.seal()
            cache = mk.CausalKVCache(a, r, batch=2)
            for blk in range(3 * (sink + window) + page):
                cache.step(blk * n, n)
            cache.finish()

    run(need)
    with pytest.raises(mk.OutOfPagesError):
        run(need - 1)


def test_pages_needed_adds_a_page_where_the_page_does_not_divide_the_chunk():
    aligned = mk.pages_needed(mk.Retention(16, 1, 2), block_tokens=16, page_size=8)
    assert aligned == (16 + 32 + 16) // 8 + 1                     # sink, window, block, the null page
    unaligned = mk.pages_needed(mk.Retention(40, 1, 2), block_tokens=40, page_size=16)   # the shape
    assert unaligned == (40 + 80 + 40) // 16 + 1 + 1           # the window starts mid-page: one more
    with pytest.raises(ValueError, match="total_tokens: an unbounded retention keeps everything"):
        mk.pages_needed(mk.Retention.unbounded(), 16, 8)
    assert mk.pages_needed(mk.Retention.unbounded(), 16, 8, total_tokens=160) == 160 // 8 + 1
    with pytest.raises(ValueError, match="page_size: 0"):
        mk.pages_needed(mk.Retention(16, 1, 2), 16, 0)


def test_rope_inside_attention_rotates_q_and_k_alike():
    print("seed", SEED)
    g = np.random.default_rng(SEED)
    rope = mk.Rope("3d", style="interleaved")
    with mk.Arena(num_pages=16, page_size=4, num_layers=1, kv_heads=1, head_dim=8) as a:
        cache = mk.CausalKVCache(a, mk.Retention(6, 1, 1), grid=(2, 3), rope=rope)
        q, k, v = (g.standard_normal((1, 6, 1, 8)).astype(np.float32) for _ in range(3))
        out = cache[0].attention(q, k, v, current_start=0)
        pos = cache.plan.positions
        ref = _attend_ref(rope.apply(q[0], pos), rope.apply(k[0], pos), v[0])
        assert np.abs(out[0] - ref).max() < 1e-5
        assert pos.tolist()[:4] == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0]]
    with pytest.raises(ValueError, match="grid: a 3-D rope needs the token grid"):
        mk.CausalKVCache(mk.Arena(num_pages=4, page_size=4, num_layers=1, kv_heads=1, head_dim=8),
                         mk.Retention(6, 1, 1), rope=rope)


def _example():
    spec = importlib.util.spec_from_file_location("causal_video_dit", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_example(device):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the example model is torch)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                 # a model this small runs fastest on one thread
    try:
        return _example().run(device, blocks=13)
    finally:
        torch.set_num_threads(threads)


def test_the_example_dit_matches_its_rolling_cache_and_its_memory_stays_flat():
    err, pages, offloaded, (out, ref) = _run_example("cpu")
    assert err <= 1e-5, "max |mstar_kv - rolling cache| = %g" % err
    assert len(pages) == 13 and all(n > 0 for n in offloaded)
    full = pages.index(max(pages))
    assert full <= 4 and pages[full:] == [pages[full]] * (13 - full)   # flat once the window is full
    assert float((out[-1] - out[-2]).abs().max()) > 0.1                # the blocks differ


def test_the_example_dit_on_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the example model is torch)")
    if not torch.cuda.is_available() or not mk.cuda_probe()[0]:
        pytest.skip("needs a GPU (no CUDA device for torch and mstar_kv here)")
    err, pages, _, _ = _run_example("cuda")
    print("cuda: max error %g (an f16 store), pages %s" % (err, pages))
    assert err <= 5e-2, err                  # f16 K/V and attention against the f32 rolling cache
    assert pages == list(_run_example("cpu")[1])


def test_on_a_gpu_store_a_torch_q_goes_in_the_stores_dtype_and_comes_back_in_its_own():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the conversion is of torch tensors)")
    st = object.__new__(mk.CudaStore)
    st._ptr, st._dtype = None, "f16"                 # a stand-in: only its dtype is read
    with mk.Arena(num_pages=8, page_size=4, num_layers=1, kv_heads=1, head_dim=4) as a:
        cache = mk.CausalKVCache(a, mk.Retention(4, 1, 1), backend=mk.CudaBackend(st))
        q = torch.randn((4, 1, 4))
        qk, back = cache._to_kernel(q)
        assert qk.dtype == torch.float16 and back(qk).dtype == torch.float32
        assert torch.allclose(back(qk), q, atol=1e-3)
        same, back = cache._to_kernel(q.half())
        assert back(same) is same
        cpu = mk.CausalKVCache(a, mk.Retention(4, 1, 1))
        assert cpu._to_kernel(q)[0] is q               # the CPU attends in q's own dtype


class _Recorder:
    def __init__(self):
        self.calls = []

    def _call(self, function, *args):
        self.calls.append(function)


def test_on_a_gpu_store_blocks_end_with_the_stores_publish_and_offload_waits_for_the_fence():
    with mk.Arena(num_pages=16, page_size=4) as a:
        st = object.__new__(mk.CudaStore)           # a recording stand-in for the store's C calls
        st._ptr, st._cuda, st._arenas, st._dtype = 0x1234, _Recorder(), [a], "f16"
        cache = mk.CausalKVCache(a, mk.Retention(4, 1, 1), backend=mk.CudaBackend(st))
        cache.step(0, 4)
        cache.step(4, 4)                            # commits the first block: the store's publish
        assert st.cuda.calls == ["mskv_cuda_publish"]
        cache.offload()                             # commits, offloads, then settles the fence
        assert st.cuda.calls == ["mskv_cuda_publish"] * 3 + ["mskv_cuda_retire"]
        assert cache.request_info()[0].location == mk.OFFLOADED
        st._ptr = None
