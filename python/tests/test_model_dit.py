"""A model-level check: a small causal video-DiT block, written here, run
chunk by chunk through an mstar_kv windowed session, against the same block
with the plain contiguous rolling cache research code uses (NumPy arrays,
sink + window eviction by copying).

The block: latent frames patchified into tokens, a timestep embedding, 3-D
RoPE (frame, row, col) on queries and keys, self-attention over the cache
(a sink chunk, a sliding window of chunks, and the chunk being denoised),
cross-attention to text tokens (a sealed keyed entry), an MLP. Each chunk is
denoised in a few flow-matching steps that write its K/V as scratch, then
one clean pass writes the final K/V and the chunk is committed.

Chunks are page-aligned (the rolling cache evicts exact tokens, the arena
whole pages)."""
import numpy as np
import pytest

import mstar_kv as mk

# geometry
C, H, W, PATCH = 4, 8, 8, 2                  # latent channels, height, width; 2x2 patches
GH, GW = H // PATCH, W // PATCH              # token grid per frame: 4 x 4
TPF = GH * GW                                # tokens per latent frame: 16
FRAMES_PER_CHUNK = 2
CHUNK = FRAMES_PER_CHUNK * TPF               # 32 tokens = 4 pages of 8
PAGE = 8
Q_HEADS, KV_HEADS, HD = 4, 2, 16             # GQA 2:1
D = Q_HEADS * HD
TEXT_TOKENS, TEXT_DIM = 8, 24
SINK_CHUNKS, WINDOW_CHUNKS = 1, 2
CHUNKS = 14
STEPS = (1.0, 0.75, 0.5, 0.25)               # denoise timesteps; then a clean pass at t = 0
SELF_LAYER, CROSS_LAYER = 0, 1               # arena layers: self-attention K/V, text K/V
TEXT_KEY = 0x7E47


# ---- the block (shared by both runs) -------------------------------------------------------

class Weights:
    def __init__(self, seed=1234):
        g = np.random.default_rng(seed)

        def lin(i, o):
            return (g.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32)

        pdim = C * PATCH * PATCH
        self.embed, self.out = lin(pdim, D), lin(D, pdim)
        self.t1, self.t2 = lin(32, D), lin(D, D)
        self.wq, self.wk, self.wv, self.wo = lin(D, D), lin(D, KV_HEADS * HD), lin(D, KV_HEADS * HD), lin(D, D)
        self.wqc, self.woc = lin(D, D), lin(D, D)
        self.wkc, self.wvc = lin(TEXT_DIM, KV_HEADS * HD), lin(TEXT_DIM, KV_HEADS * HD)
        self.w1, self.w2 = lin(D, 2 * D), lin(2 * D, D)
        self.text = g.standard_normal((TEXT_TOKENS, TEXT_DIM)).astype(np.float32)


def patchify(x):                     # [F, C, H, W] -> [F*GH*GW, C*P*P]
    f = x.shape[0]
    x = x.reshape(f, C, GH, PATCH, GW, PATCH).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(f * TPF, C * PATCH * PATCH))


def unpatchify(t):                   # inverse of patchify
    f = t.shape[0] // TPF
    x = t.reshape(f, GH, GW, C, PATCH, PATCH).transpose(0, 3, 1, 4, 2, 5)
    return np.ascontiguousarray(x.reshape(f, C, H, W))


def layer_norm(x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return ((x - m) / np.sqrt(v + 1e-6)).astype(np.float32)


def gelu(x):
    return (0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))).astype(np.float32)


def t_embed(wt, t):
    half = 16
    f = np.exp(-np.log(1000.0) * np.arange(half) / half)
    e = np.concatenate([np.cos(t * 1000 * f), np.sin(t * 1000 * f)]).astype(np.float32)
    return gelu(e @ wt.t1) @ wt.t2


def text_kv(wt):
    k = (wt.text @ wt.wkc).reshape(TEXT_TOKENS, KV_HEADS, HD)
    v = (wt.text @ wt.wvc).reshape(TEXT_TOKENS, KV_HEADS, HD)
    return np.ascontiguousarray(k), np.ascontiguousarray(v)


def forward(wt, x, t, cache):
    """One pass of the block over a chunk's latents x [F, C, H, W] at time t;
    cache.self_attention / cache.cross_attention do the attention."""
    tok = patchify(x) @ wt.embed + t_embed(wt, t)
    n = tok.shape[0]
    h = layer_norm(tok)
    q = np.ascontiguousarray((h @ wt.wq).reshape(n, Q_HEADS, HD))
    k = np.ascontiguousarray((h @ wt.wk).reshape(n, KV_HEADS, HD))
    v = np.ascontiguousarray((h @ wt.wv).reshape(n, KV_HEADS, HD))
    tok = tok + cache.self_attention(q, k, v).reshape(n, D) @ wt.wo
    h = layer_norm(tok)
    qc = np.ascontiguousarray((h @ wt.wqc).reshape(n, Q_HEADS, HD))
    tok = tok + cache.cross_attention(qc).reshape(n, D) @ wt.woc
    tok = tok + gelu(layer_norm(tok) @ wt.w1) @ wt.w2
    return unpatchify(layer_norm(tok) @ wt.out)


def generate(wt, cache, chunks=CHUNKS, between_chunks=None):
    """Chunk by chunk: denoise from seeded noise (scratch K/V every step), a
    clean pass that writes the final K/V, commit. Returns every chunk's latents."""
    outs = []
    for c in range(chunks):
        x = np.random.default_rng(100 + c).standard_normal((FRAMES_PER_CHUNK, C, H, W)).astype(np.float32)
        cache.begin_chunk(c)
        for i, t in enumerate(STEPS):
            t_next = STEPS[i + 1] if i + 1 < len(STEPS) else 0.0
            vel = forward(wt, x, t, cache)
            x = (x + (t_next - t) * vel).astype(np.float32)
        forward(wt, x, 0.0, cache)             # the clean pass: its K/V are the ones kept
        cache.commit_chunk()
        outs.append(x)
        if between_chunks:
            between_chunks(c)
    return np.stack(outs)


# ---- the reference: a contiguous rolling cache, as research code keeps it ----------------------

def rope_3d_reference(x, pos):
    """Half-rotation RoPE in float64, the 3-D split of mstar_kv.h's docs:
    p = head_dim/2 pairs -> widths 2(p - 2(p/3)), 2(p/3), 2(p/3) for frame, row, col."""
    p = HD // 2
    widths = (2 * (p - 2 * (p // 3)), 2 * (p // 3), 2 * (p // 3))
    out = x.astype(np.float64).copy()
    start = 0
    for axis, w in enumerate(widths):
        i = np.arange(w // 2)
        ang = pos[:, axis:axis + 1].astype(np.float64) * 10000.0 ** (-2.0 * i / w)     # [n, w/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a = x[:, :, start:start + w // 2].astype(np.float64)
        b = x[:, :, start + w // 2:start + w].astype(np.float64)
        out[:, :, start:start + w // 2] = a * cos - b * sin
        out[:, :, start + w // 2:start + w] = a * sin + b * cos
        start += w
    return out.astype(np.float32)


def attention_reference(q, k, v):
    """Softmax attention with GQA in float64: q [n, QH, d], k/v [m, KVH, d]."""
    g = Q_HEADS // KV_HEADS
    kk = np.repeat(k.astype(np.float64), g, axis=1)
    vv = np.repeat(v.astype(np.float64), g, axis=1)
    s = np.einsum("nhd,mhd->hnm", q.astype(np.float64), kk) / np.sqrt(HD)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hnm,mhd->nhd", s, vv).astype(np.float32)


class RollingCache:
    def __init__(self, wt):
        self.k = np.zeros((0, KV_HEADS, HD), np.float32)
        self.v = np.zeros((0, KV_HEADS, HD), np.float32)
        self.text_k, self.text_v = text_kv(wt)
        self.max_tokens = 0

    def begin_chunk(self, c):
        j = c * CHUNK + np.arange(CHUNK)
        self.pos = np.stack([j // TPF, (j % TPF) // GW, j % GW], axis=1)
        self.pending = None

    def self_attention(self, q, k, v):
        kr = rope_3d_reference(k, self.pos)
        self.pending = (kr, v)                 # the chunk's own K/V: scratch until commit
        return attention_reference(rope_3d_reference(q, self.pos), np.concatenate([self.k, kr]),
                                   np.concatenate([self.v, v]))

    def cross_attention(self, q):
        return attention_reference(q, self.text_k, self.text_v)

    def commit_chunk(self):
        self.k = np.concatenate([self.k, self.pending[0]])
        self.v = np.concatenate([self.v, self.pending[1]])
        sink, window = SINK_CHUNKS * CHUNK, WINDOW_CHUNKS * CHUNK
        if len(self.k) > sink + window:        # evict by copying: the sink and the last window
            self.k = np.concatenate([self.k[:sink], self.k[-window:]])
            self.v = np.concatenate([self.v[:sink], self.v[-window:]])
        self.max_tokens = max(self.max_tokens, len(self.k))


# ---- the same model through mstar_kv ---------------------------------------------------------

class MstarCache:
    def __init__(self, wt, cpu):
        pages = (SINK_CHUNKS + WINDOW_CHUNKS + 1) * CHUNK // PAGE + TEXT_TOKENS // PAGE + 1
        self.arena = mk.Arena(num_pages=pages, page_size=PAGE, num_layers=2, kv_heads=KV_HEADS, head_dim=HD)
        self.cpu = cpu
        self.rope = mk.Rope(mode="3d")
        self.plan = mk.Plan(1, CHUNK, pages)
        self.cross_plan = mk.Plan(1, CHUNK, pages)
        self.text = self._write_text(wt)
        self.request = self.arena.add_request()
        self.session = self.arena.session(self.request, mk.Retention(CHUNK, sink_chunks=SINK_CHUNKS,
                                                                     window_chunks=WINDOW_CHUNKS, exact=True))
        self.live_pages = []
        self.addresses = set()

    def _write_text(self, wt):
        entry = self.arena.keyed_create(TEXT_KEY, TEXT_TOKENS)
        plan = mk.Plan(1, TEXT_TOKENS, 4)
        self.arena.plan_build([(entry, TEXT_TOKENS)], plan)
        k, v = text_kv(wt)
        self.arena.write_kv(CROSS_LAYER, plan, k, v)
        entry.seal()
        return entry

    def begin_chunk(self, c):
        self.session.begin_chunk(CHUNK)
        self.session.plan(self.plan, pos="3d", grid=(GH, GW))
        self.arena.plan_build([(self.request, CHUNK)], self.cross_plan, kind="cross", cross=self.text)
        self.addresses.add(tuple(a.__array_interface__["data"][0] for a in
                                 (self.plan.kv_indices, self.plan.slot_mapping, self.plan.positions)))

    def self_attention(self, q, k, v):
        q = self.rope.apply(q, self.plan.positions)
        self.arena.write_kv(SELF_LAYER, self.plan, k, v, rope=self.rope)   # scratch: reserved slots
        return self.cpu.attention(self.arena, SELF_LAYER, self.plan, q)

    def cross_attention(self, q):
        return self.cpu.attention(self.arena, CROSS_LAYER, self.cross_plan, q)

    def commit_chunk(self):
        self.session.commit_chunk()
        self.arena.audit()
        self.live_pages.append(self.arena.stats().live_pages)


@pytest.fixture(scope="module")
def weights():
    return Weights()


@pytest.fixture(scope="module")
def reference(weights):
    cache = RollingCache(weights)
    return generate(weights, cache), cache


@pytest.fixture(scope="module")
def cpu():
    with mk.Cpu(num_threads=2) as c:
        yield c


def test_dit_through_a_windowed_session_matches_a_rolling_cache_within_1e5(weights, reference, cpu):
    ref, _ = reference
    cache = MstarCache(weights, cpu)
    out = generate(weights, cache)
    assert out.shape == (CHUNKS, FRAMES_PER_CHUNK, C, H, W)
    assert np.all(np.isfinite(out))
    err = np.abs(out - ref).max()
    assert err <= 1e-5, "max |mstar_kv - rolling cache| = %g" % err
    # the chunks differ (the test would pass for a model that ignored its input otherwise)
    assert np.abs(out[-1] - out[-2]).max() > 0.1
    cache.arena.close()


def test_dit_memory_stays_flat_once_the_window_is_full(weights, cpu):
    cache = MstarCache(weights, cpu)
    generate(weights, cache)
    full = SINK_CHUNKS + WINDOW_CHUNKS
    text_pages = TEXT_TOKENS // PAGE
    assert cache.live_pages[full - 1:] == [full * CHUNK // PAGE + text_pages] * (CHUNKS - full + 1)
    info = cache.request.info()
    assert info.committed == CHUNKS * CHUNK
    assert info.kv_len == full * CHUNK        # sink + window, the rest released
    assert cache.session.released_total == (CHUNKS - full) * CHUNK
    cache.arena.close()


def test_dit_plan_buffers_keep_their_addresses_every_step(weights, cpu):
    cache = MstarCache(weights, cpu)
    generate(weights, cache, chunks=5)
    assert len(cache.addresses) == 1
    cache.arena.close()


def test_dit_rolling_cache_reference_keeps_sink_and_window_only(reference):
    _, cache = reference
    assert cache.max_tokens == (SINK_CHUNKS + WINDOW_CHUNKS) * CHUNK


def test_dit_with_offload_and_reload_between_chunks_gives_identical_output(weights, cpu):
    plain = MstarCache(weights, cpu)
    expect = generate(weights, plain)
    parked = MstarCache(weights, cpu)
    offloaded, moved = [], []

    def park(c):
        before = parked.request.pages()
        parked.request.offload()
        offloaded.append(parked.arena.stats().offloaded_pages)
        for kind in "kv":                      # the self-attention layer is this request's alone
            parked.arena.pool(SELF_LAYER, kind)[:] = np.nan
        other = parked.arena.add_request()     # takes pages, so the reload lands elsewhere
        parked.arena.admit([(other, PAGE)])
        parked.request.reload()
        moved.append(not np.array_equal(before, parked.request.pages()))
        other.remove()

    out = generate(weights, parked, between_chunks=park)
    assert all(n > 0 for n in offloaded)
    assert any(moved)
    assert np.array_equal(out, expect)
    plain.arena.close()
    parked.arena.close()
