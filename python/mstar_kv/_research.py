"""The research call order as a drop-in: what a causal video model
(Self-Forcing / CausVid's CausalWanModel and its inference pipeline) does
with its rolling kv_cache, on mstar_kv's pages.

    retention = mk.Retention.from_research(local_attn_size=7, sink_size=1, frames_per_block=2,
                                           tokens_per_frame=12)
    arena = mk.Arena(mk.pages_needed(retention, block_tokens=24, page_size=8, batch=2), 8, layers, kvh, hd)
    cache = mk.CausalKVCache(arena, retention, batch=2, grid=(3, 4), rope=mk.Rope("3d", "interleaved"))
    kv_cache = cache.layers            # kv_cache[i] stands where research code's dict stood
    ...in layer i's forward:  x = kv_cache[i].attention(q, k, v, current_start=current_start)
    cache.finish()                     # the end of generation commits the last block

A call with the same current_start again (the next denoise step, the clean
pass) re-plans and overwrites the open block; a new current_start commits
the previous block and begins the next. One plan per model call, shared by
every layer. A batch (CFG's two branches, several samples) is one request
per sample in one multi-segment plan."""
import itertools
import math

from typing import Any, Optional, Tuple

from . import _torchio
from ._core import Arena, Plan, Retention, Rope


def retention_from_research(local_attn_size: int, sink_size: int, frames_per_block: int,
                            tokens_per_frame: int) -> Retention:
    """The Retention a research rolling cache keeps: attention over
    local_attn_size frames including the block being generated (the cache
    holds the sink_size leading frames and the most recent frames), blocks
    of frames_per_block frames. local_attn_size = -1: unbounded.

    The chunk is g frames, g = gcd(frames_per_block, sink_size,
    local_attn_size - frames_per_block), so the sink, the window and every
    block are whole chunks: window = (local_attn_size - sink_size -
    frames_per_block) / g chunks (0: only the sink survives a block, the
    reset mode). Exact (token-exact visibility) at any page size."""
    for name, value in (("sink_size", sink_size), ("frames_per_block", frames_per_block),
                        ("tokens_per_frame", tokens_per_frame), ("local_attn_size", local_attn_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError("%s: expected an int, got %r" % (name, value))
    if frames_per_block < 1:
        raise ValueError("frames_per_block: %d; it must be >= 1" % frames_per_block)
    if tokens_per_frame < 1:
        raise ValueError("tokens_per_frame: %d; it must be >= 1" % tokens_per_frame)
    if sink_size < 0:
        raise ValueError("sink_size: %d; it must be >= 0 frames" % sink_size)
    if local_attn_size == -1:
        return Retention.unbounded()
    if local_attn_size < sink_size + frames_per_block:
        raise ValueError("local_attn_size: %d frames cannot hold sink_size %d + frames_per_block %d (or pass -1 "
                         "for unbounded)" % (local_attn_size, sink_size, frames_per_block))
    g = math.gcd(math.gcd(frames_per_block, sink_size), local_attn_size - frames_per_block)
    chunk = g * tokens_per_frame
    window = (local_attn_size - sink_size - frames_per_block) // g
    return Retention(chunk, sink_chunks=sink_size // g, window_chunks=window, reset_at_boundary=window == 0,
                     exact=True)


def _request_pages(retention: Retention, block_tokens: int, page_size: int, blocks: int) -> int:
    """The most pages one request holds while `blocks` blocks run, measured on
    a page-only arena (the library's own release rules, so no formula to drift)."""
    kept = retention.sink_chunks * retention.chunk_size + retention.window_chunks * retention.chunk_size
    if retention.is_unbounded:
        kept = blocks * block_tokens
    cap = -(-(kept + block_tokens) // page_size) + 3
    with Arena(num_pages=cap + 1, page_size=page_size, max_requests=1) as a:
        r = a.add_request()
        r.set_retention(retention)
        most = 0
        for _ in range(blocks):
            seg = [(r, block_tokens)]
            a.admit(seg)
            most = max(most, a.stats().live_pages)
            a.commit(seg)
            a.publish(seg)
    return most


def pages_needed(retention: Retention, block_tokens: int, page_size: int, batch: int = 1,
                 extra_tokens: int = 0, total_tokens: "int | None" = None) -> int:
    """num_pages to give an Arena so `batch` requests under retention, blocks
    of block_tokens tokens at a time, never run out: per request the sink's
    pages, the window's and the open block's, plus up to one more where the
    page size does not divide the chunk (the window then starts mid-page:
    40-token chunks on 16-token pages, sink 1, window 2 hold 11 pages where
    their 160 tokens fill 10), plus
    ceil(extra_tokens / page_size) per sample (e.g. its text entry), plus the
    null page. total_tokens: the generation's length (needed for an
    unbounded retention; otherwise the peak is reached early)."""
    for name, value in (("block_tokens", block_tokens), ("page_size", page_size), ("batch", batch)):
        if value < 1:
            raise ValueError("%s: %d; it must be >= 1" % (name, value))
    if extra_tokens < 0:
        raise ValueError("extra_tokens: %d; it must be >= 0" % extra_tokens)
    retention.validate(page_size)
    if total_tokens is not None:
        if total_tokens < 1:
            raise ValueError("total_tokens: %d; it must be >= 1" % total_tokens)
        blocks = -(-total_tokens // block_tokens)
    elif retention.is_unbounded:
        raise ValueError("total_tokens: an unbounded retention keeps everything; say how long the generation is")
    else:
        kept = (retention.sink_chunks + retention.window_chunks) * retention.chunk_size
        # fill the window, then enough blocks for every offset of the window start within a page
        blocks = -(-kept // block_tokens) + 2 + page_size // math.gcd(page_size, block_tokens)
    per = _request_pages(retention, block_tokens, page_size, blocks)
    return batch * (per + -(-extra_tokens // page_size)) + 1


_KEYS = itertools.count(1)


class LayerCache:
    """One layer's handle on a CausalKVCache: what research code passes as
    kv_cache[i] / crossattn_cache[i]. Its calls use the cache's plan of the
    current model call (every layer shares it)."""

    def __init__(self, cache: "CausalKVCache", layer: int):
        self._cache, self._layer = cache, layer

    cache = property(lambda self: self._cache)   # read-only: the handle is bound to its cache and layer
    layer = property(lambda self: self._layer)

    def __repr__(self):
        return "LayerCache(layer=%d, %r)" % (self.layer, self.cache)

    def attention(self, q: Any, k: Any, v: Any, current_start: Optional[int] = None, mask: Any = "none",
                  scale: float = 0.0) -> Any:
        """Self-attention of this block's q over the kept keys plus its own:
        writes k, v (rotated by the cache's rope) into the open block's
        slots, rotates q alike (pure), attends. q [B, n, q_heads, head_dim]
        (or [B*n, q_heads, head_dim]), k, v likewise with kv_heads; returns a
        result of q's kind and shape. current_start (tokens) is the model's
        own: see CausalKVCache.step. Without a rope, q and k arrive rotated
        (the caller's job, alike for both)."""
        c = self.cache
        n = _rows(q, c.batch)
        if current_start is not None:
            c._enter(self.layer, current_start, n)
        plan = c._plan_for(self.layer)
        qf, back = c._to_kernel(_flat(q))
        kf, vf = _flat(k), _flat(v)
        be = c.backend
        be.write_kv(self.layer, plan, kf, vf, rope=c.rope)
        if c.rope is not None:
            qf = be.rope(c.rope, qf, plan)
        out = be.attention(self.layer, plan, qf, mask=mask, scale=scale)
        return back(out).reshape(tuple(q.shape))

    def cross_attention(self, q: Any, scale: float = 0.0) -> Any:
        """Attention of q [B, n, q_heads, head_dim] over each sample's text
        K/V of this layer (keyed entries written by CausalKVCache.write_text)."""
        c = self.cache
        if not c._text:
            raise ValueError("cross_attention: no text K/V; call CausalKVCache.write_text first")
        plans = c._cross_for(self.layer)
        qf, back = c._to_kernel(_flat(q))
        out = _torchio.empty_like(qf, tuple(qf.shape))
        n = qf.shape[0] // c.batch
        for b, plan in enumerate(plans):
            c.backend.attention(self.layer, plan, qf[b * n:(b + 1) * n], out=out[b * n:(b + 1) * n], scale=scale)
        return back(out).reshape(tuple(q.shape))


def _same(x):
    return x


def _rows(x, batch):
    if len(x.shape) == 4:
        if x.shape[0] != batch:
            raise ValueError("q: batch %d; the cache has %d samples" % (x.shape[0], batch))
        return int(x.shape[1])
    if len(x.shape) == 3 and x.shape[0] % batch == 0:
        return int(x.shape[0]) // batch
    raise ValueError("q: shape %s; expected [batch=%d, n, heads, head_dim] or [batch*n, heads, head_dim]"
                     % (tuple(x.shape), batch))


def _flat(x):
    if len(x.shape) == 4:
        x = x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3])
    if _torchio.is_tensor(x):
        return x.contiguous()
    import numpy as np
    return np.ascontiguousarray(x)


class CausalKVCache:
    """A rolling KV cache for a causal video model, keyed by the model's own
    current_start. batch samples (CFG branches) are one request each, all in
    one plan per model call. grid (h, w): tokens per frame h*w, 3-D RoPE
    positions (frame, row, col); rope (a Rope; Wan's rope_apply pairs
    adjacent channels: style="interleaved") is applied to k when written
    and to q inside attention. backend: mk.backend(arena, cpu) by default
    (an arena of a CudaStore: the GPU, which attends in the store's f16 /
    bf16; a torch q of another dtype is converted and the result back)."""

    def __init__(self, arena: Arena, retention: Retention, batch: int = 1, grid: Optional[Tuple[int, int]] = None,
                 rope: Optional[Rope] = None, backend: Any = None, cpu: Any = None, max_block_tokens: int = 0) -> None:
        if batch < 1:
            raise ValueError("batch: %d; it must be >= 1" % batch)
        if rope is not None and rope.mode == 2 and grid is None:
            raise ValueError("grid: a 3-D rope needs the token grid (h, w) of a frame")
        retention.validate(arena.store_info().page_size)
        self._arena, self._retention, self._batch, self._grid, self._rope = arena, retention, batch, grid, rope
        self._backend = backend if backend is not None else arena.backend(cpu=cpu)
        self._pos = "3d" if grid is not None else ("1d" if rope is not None else "none")
        if rope is not None and rope.mode != {"3d": 2, "1d": 1}[self._pos]:
            raise ValueError("rope: mode %d does not match the cache's positions (%s)" % (rope.mode, self._pos))
        self._max_block = max_block_tokens
        self._plan = self._cross = None
        self._text, self._requests = [], ()
        self._layers = tuple(LayerCache(self, i) for i in range(max(arena.store_info().num_layers, 1)))
        self._pages = []   # live pages in the arena after each committed block
        self._new_video()

    # read-only: the requests carry this retention, the plans this batch and grid
    arena = property(lambda self: self._arena)
    retention = property(lambda self: self._retention)
    batch = property(lambda self: self._batch)
    grid = property(lambda self: self._grid)
    rope = property(lambda self: self._rope)
    backend = property(lambda self: self._backend)
    layers = property(lambda self: self._layers, doc="the per-layer handles: kv_cache[i] of research code")
    requests = property(lambda self: self._requests, doc="one request per sample")
    pages_per_block = property(lambda self: tuple(self._pages), doc="live pages after each committed block")
    calls = property(lambda self: self._calls, doc="model calls planned (one plan each, shared by every layer)")

    def __getitem__(self, i: int) -> LayerCache:
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __repr__(self):
        return "CausalKVCache(batch=%d, committed=%d, open=%r, %r)" % (self.batch, self._next, self._open,
                                                                      self.retention)

    def _new_video(self):
        requests = []
        try:
            for _ in range(self.batch):
                r = self.arena.add_request()
                requests.append(r)
                r.set_retention(self.retention)
        except BaseException:
            for r in requests:
                r.remove()
            raise
        self._requests = tuple(requests)
        self._open, self._next = None, 0          # (start, n) of the open block; tokens committed
        self._served, self._calls = set(), 0

    # -- the step, keyed by current_start
    def step(self, current_start: int, n_tokens: int) -> Plan:
        """The plan for a model call over [current_start, current_start +
        n_tokens): the open block's start again re-plans it (its K/V are
        overwritten); its end commits it and begins the next block; anything
        else is an error naming both (call reset() for a new video)."""
        if self._open is not None:
            start, n = self._open
            if current_start == start:
                if n_tokens != n:
                    raise ValueError("n_tokens: %d for the open block at %d of %d tokens" % (n_tokens, start, n))
                return self._build()
            if current_start != start + n:
                raise ValueError("current_start: %d; the open block is [%d, %d): expected %d (same block) or %d "
                                 "(the next)" % (current_start, start, start + n, start, start + n))
            self.commit()
        if current_start != self._next:
            raise ValueError("current_start: %d; %d tokens are committed, so the next block starts at %d "
                             "(reset() starts a new video)" % (current_start, self._next, self._next))
        if n_tokens < 1:
            raise ValueError("n_tokens: %d; it must be >= 1" % n_tokens)
        self.arena.admit([(r, n_tokens) for r in self.requests])
        self._open = (current_start, n_tokens)
        try:
            return self._build()
        except BaseException:
            self.arena.abort([(r, n_tokens) for r in self.requests])
            self._open = None
            raise

    def _to_kernel(self, q):
        """(q in the dtype the backend attends in, the way back to q's dtype).
        The GPU attends in its store's f16 / bf16: a torch q of another
        dtype is converted there and the result back (the CPU takes q as it is)."""
        store = getattr(self.backend, "store", None)
        if store is None or not _torchio.is_tensor(q):
            return q, _same
        torch = _torchio.torch_module()
        want = getattr(torch, {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}[store._dtype])
        if q.dtype == want:
            return q, _same
        dt = q.dtype
        return q.to(want), (lambda o: o.to(dt))

    def _ensure_plans(self, n):
        cap_pages = self.arena.store_info().num_pages
        need = max(n, self._max_block)
        if self._plan is None or self._plan.capacity[1] < self.batch * need:
            self._max_block = need
            self._plan = Plan(self.batch, self.batch * need, cap_pages)
            self._cross = [Plan(1, need, cap_pages) for _ in range(self.batch)]

    def _build(self):
        start, n = self._open
        self._ensure_plans(n)
        segs = [(r, n) for r in self.requests]
        self.arena.plan_build(segs, self._plan, pos=self._pos, grid=self.grid)
        for b, entry in enumerate(self._text):
            self.arena.plan_build([(self.requests[b], n)], self._cross[b], kind="cross", cross=entry)
        self._served, self._calls = set(), self._calls + 1
        return self._plan

    def _enter(self, layer, current_start, n):
        """A layer's attention with the model's current_start: the first layer
        of a model call (one this call has served already, or none open)
        steps; the others share its plan."""
        if self._open is None or layer in self._served or self._open[0] != current_start:
            self.step(current_start, n)
        elif n != self._open[1]:
            raise ValueError("q: %d tokens per sample; the open block has %d" % (n, self._open[1]))
        self._served.add(layer)

    def _plan_for(self, layer):
        if self._open is None:
            raise ValueError("attention: no open block; pass current_start (or call step())")
        return self._plan

    def _cross_for(self, layer):
        if self._open is None:
            raise ValueError("cross_attention: no open block; pass current_start to attention first (or call step())")
        return self._cross

    @property
    def plan(self) -> "Plan | None":
        """The current model call's plan (None before the first step)."""
        return self._plan if self._open is not None else None

    def commit(self) -> None:
        """Commits the open block (all samples) and releases what left the
        window; a no-op when none is open."""
        if self._open is None:
            return
        start, n = self._open
        segs = [(r, n) for r in self.requests]
        self.arena.commit(segs)
        self._publish(segs)
        self._open, self._next = None, start + n
        self._pages.append(self.arena.stats().live_pages)

    finish = commit   # the end of generation: commits the last block

    def _publish(self, segs, settle=False):
        """Ends the step: on a GPU store with its fence event (mskv_cuda_publish,
        which retires what completed); settle waits, so pages freed outside a
        step (offload, remove) come back now, as mstar_kv_cuda.h's Fences say."""
        store = getattr(self.backend, "store", None)
        if store is None:
            self.arena.publish(segs)
            return
        store.publish(segs)
        if settle:
            store.retire(wait=True)

    def offload(self) -> None:
        """Commits the open block, then parks every sample's request in host memory."""
        self.commit()
        for r in self.requests:
            r.offload()
        if getattr(self.backend, "store", None) is not None:
            self._publish((), settle=True)   # the device pages come back once their fence completed

    def reload(self) -> None:
        """Brings every sample's request back (maybe onto other pages; the next step re-plans)."""
        for r in self.requests:
            r.reload()

    def reset(self, keep_text: bool = False) -> None:
        """A new video: the open block is dropped, every sample's request
        removed (its pages come back) and new ones made; the text entries
        go too unless keep_text."""
        if self._open is not None:
            self.arena.abort([(r, self._open[1]) for r in self.requests])
        for r in self.requests:
            r.remove()
        if not keep_text:
            for e in self._text:
                e.remove()
            self._text = []
        if getattr(self.backend, "store", None) is not None:
            self._publish((), settle=True)
        self._pages = []
        self._new_video()

    # -- the text (cross-attention) K/V
    def write_text(self, k: Any, v: Any) -> None:
        """Writes each sample's text K/V once, into a sealed keyed entry per
        sample: k, v indexable by layer, each [B, text_tokens, kv_heads,
        head_dim] (CFG: sample 0 the prompt, sample 1 the negative one)."""
        if self._text:
            raise ValueError("write_text: the text K/V are written (reset() for a new prompt)")
        layers = len(k)
        if layers != len(v) or layers > len(self.layers):
            raise ValueError("k, v: %d and %d layers for an arena of %d" % (layers, len(v), len(self.layers)))
        tokens = int(k[0].shape[1])
        entries = []
        try:
            for b in range(self.batch):
                e = self.arena.keyed_create((0x6d6b7478 << 24) | (next(_KEYS) << 8) | b, tokens)
                entries.append(e)
                plan = self.arena.plan_build([(e, tokens)], Plan(1, tokens, self.arena.store_info().num_pages))
                for layer in range(layers):
                    self.backend.write_kv(layer, plan, _flat(k[layer][b]), _flat(v[layer][b]))
                e.seal()
        except BaseException:
            for e in entries:
                e.remove()
            raise
        self._text = entries
        if self._open is not None:
            self._build()

    def request_info(self) -> list:
        """RequestInfo of every sample's request (committed, reserved, kv_len, ...)."""
        return [r.info() for r in self.requests]

    @property
    def pages_in_use(self) -> int:
        """Live pages in the arena now."""
        return self.arena.stats().live_pages


__all__ = ["retention_from_research", "pages_needed", "CausalKVCache", "LayerCache"]
