"""mstar_kv as the cache manager, FlashInfer or flash-attn as the kernels.

The arrays of a Plan already are FlashInfer's paged-KV arguments
(qo_indptr, kv_indptr, kv_indices, kv_last_page_len: int32, CSR over pages,
1 <= last <= page_size) and every pool is [num_pages, page_size, kv_heads,
head_dim], FlashInfer's "NHD" page layout and flash-attn's paged k_cache.
What the libraries lack is the plan's token-exact visibility: the keys of
a page the cache still holds but the retention policy dropped (the tail of
the sink's last page, the head of the window's first page). This module
turns a plan into each library's arguments and, where those keys are
hidden, into what the library needs to hide them (a FlashInfer
custom_mask, a window_left / window_size), or raises UnsupportedCase
naming the case the library cannot express. It never lets a kernel attend
over a key the plan hides. docs/interop.md has the mapping and the rules.

Nothing here copies what can be shared: the plan's arrays and the pools
are handed over as views (torch.from_numpy; a CUDA pool through
__cuda_array_interface__). A view of a plan array aliases the plan's
fixed buffer, so the next build overwrites it (the property a captured
CUDA graph needs); do not write into it.

Mask semantics (mstar_kv.h, mskv_plan): query i of segment b is at qpos(i)
(q_pos when the plan carries it, else the tail rule), key j at kpos(j);
key j is visible iff it is not hidden by the bounds [vis_sink_end,
vis_window_start), and with mask "causal" kpos(j) <= qpos(i), and with
mask "window" also qpos(i) - kpos(j) <= window_left. FlashInfer and
flash-attn index keys by their compacted position j and align queries to
the end of the sequence: query i is at j_q = kv_len - qo_len + i.
"""
import warnings

import numpy as np

from ._core import MASKS, _enum
from ._errors import MskvError

__all__ = ["UnsupportedCase", "SegmentRows", "segment_rows", "visible_mask", "FlashInferArgs",
           "flashinfer_prefill_args", "flashinfer_decode_args", "FlashAttnArgs", "flash_attn_args",
           "arena_pools", "cuda_store_pools"]


class UnsupportedCase(MskvError, ValueError):
    """A plan the target library cannot run exactly. case names it (one of
    "no_keys", "empty_row", "sink_and_hole", "window_per_segment",
    "q_not_tail", "ragged_queries", "page_size", "decode_queries"); segment is the
    first segment that has it (or None)."""

    def __init__(self, message, case, segment=None):
        MskvError.__init__(self, message)
        self.case, self.segment = case, segment


def _mask_code(mask):
    return _enum(MASKS, mask, "mask")


# ---- the exact rule, row by row -----------------------------------------------------------------

class SegmentRows:
    """Segment b's visibility, one row per query, in compacted key indices:
    query i sees keys lo[i] <= j <= hi[i] except the hidden run
    h0 <= j < h1 (h0 == h1: nothing hidden). jq[i] = kv_len - qo_len + i is
    where FlashInfer and flash-attn put the query."""
    __slots__ = ("b", "qo_len", "kv_len", "lo", "hi", "h0", "h1", "jq")

    def __init__(self, b, qo_len, kv_len, lo, hi, h0, h1, jq):
        self.b, self.qo_len, self.kv_len, self.lo, self.hi = b, qo_len, kv_len, lo, hi
        self.h0, self.h1, self.jq = h0, h1, jq

    def intervals(self):
        """(L, H): per row the visible keys as one interval L..H (L > H:
        none), or None when the hidden run splits some row in two."""
        lo, hi, h0, h1 = self.lo, self.hi, self.h0, self.h1
        if h0 >= h1:
            return lo.copy(), hi.copy()
        inside = (h0 > lo) & (h1 <= hi) & (lo <= hi)   # visible keys on both sides of the hole
        if inside.any():
            return None
        L = np.where((h0 <= lo) & (h1 > lo), h1, lo)    # the hole covers the row's front
        H = np.where((h1 > hi) & (h0 <= hi), h0 - 1, hi)  # ... or its back
        return L, H


def _first(p, split, shift, kv_len):
    """The first compacted index j with kpos(j) >= p (kv_len if none)."""
    p = np.asarray(p, dtype=np.int64)
    j = np.where(p <= split, np.maximum(p, 0), np.maximum(split, p - shift))
    return np.minimum(j, kv_len)


def segment_rows(plan, b, mask="none", window_left=0):
    """Segment b's rows (a SegmentRows) under the plan's exact rule with
    the given mask ("none", "causal", "window") and window_left."""
    m = _mask_code(mask)
    if not 0 <= b < plan.batch:
        raise ValueError("segment_rows: segment %r is not in [0, %d)" % (b, plan.batch))
    if m == MASKS["window"] and window_left < 0:
        raise ValueError("segment_rows: window_left %d is negative (mask 'window' needs >= 0)" % window_left)
    q0, q1 = int(plan.qo_indptr[b]), int(plan.qo_indptr[b + 1])
    qo, kv = q1 - q0, int(plan.kv_len[b])
    split, shift = int(plan.kv_pos_split[b]), int(plan.kv_pos_shift[b])
    jq = np.arange(kv - qo, kv, dtype=np.int64)
    if plan.features & 1:   # MSKV_PLAN_Q_POS: the plan says where its queries are
        qpos = plan.q_pos[q0:q1].astype(np.int64)
    else:
        qpos = np.where(jq < split, jq, jq + shift)
    lo = np.zeros(qo, dtype=np.int64)
    hi = np.full(qo, kv - 1, dtype=np.int64)
    if m != MASKS["none"]:
        hi = _first(qpos + 1, split, shift, kv) - 1   # the last key at or before the query
    if m == MASKS["window"]:
        lo = _first(qpos - window_left, split, shift, kv)
    se, ws = int(plan.vis_sink_end[b]), int(plan.vis_window_start[b])
    h0 = h1 = 0
    if ws > se:
        h0, h1 = int(_first(se, split, shift, kv)), int(_first(ws, split, shift, kv))
    return SegmentRows(b, qo, kv, lo, hi, h0, h1, jq)


def visible_mask(plan, b, mask="none", window_left=0):
    """Segment b's exact visibility as a bool NumPy array [qo_len, kv_len]
    (row = query, column = compacted key index; True = attended)."""
    r = segment_rows(plan, b, mask, window_left)
    j = np.arange(r.kv_len, dtype=np.int64)[None, :]
    vis = (j >= r.lo[:, None]) & (j <= r.hi[:, None])
    if r.h1 > r.h0:
        vis &= ~((j >= r.h0) & (j < r.h1))
    return vis


def _common_window(rows, causal, library):
    """The one left window (compacted keys, -1 = none) under which
    library's bottom-right mask gives every segment's rows exactly, or the
    UnsupportedCase saying why there is none."""
    need, floor = None, -1   # a window every row with a left edge needs; the least one the others allow
    for r in rows:
        iv = r.intervals()
        if iv is None:
            raise UnsupportedCase(
                "%s: segment %d hides keys %d..%d between a visible sink and the window (a sink and a hole): "
                "the library has no mask for it; use flashinfer_prefill_args (custom_mask), or plan with "
                "exclude_prefix and merge the prefix part by LSE" % (library, r.b, r.h0, r.h1 - 1),
                "sink_and_hole", r.b)
        L, H = iv
        if (L > H).any():
            i = int(np.argmax(L > H))
            raise UnsupportedCase("%s: segment %d, query %d sees no key (the library's output for such a row is "
                                  "not the plan's o = 0, lse = -inf)" % (library, r.b, i), "empty_row", r.b)
        top = r.jq if causal else np.full(r.qo_len, r.kv_len - 1)
        if (H != top).any():
            i = int(np.argmax(H != top))
            raise UnsupportedCase(
                "%s: segment %d, query %d sees keys up to %d, the library's %s mask up to %d: the queries are not "
                "at the end of the sequence (q_pos), or a hidden run ends the row" % (
                    library, r.b, i, int(H[i]), "causal" if causal else "full", int(top[i])), "q_not_tail", r.b)
        edge = L > 0
        if edge.any():
            w = r.jq[edge] - L[edge]
            if (w != w[0]).any() or (need is not None and need != int(w[0])) or int(w[0]) < 0:
                raise UnsupportedCase(
                    "%s: segment %d needs a left window of %s keys where %s: one window_left cannot give every "
                    "query its first visible key; use flashinfer_prefill_args (custom_mask) or one call per "
                    "segment" % (library, r.b, sorted(set(int(x) for x in w))[:4],
                                 "an earlier segment needs %d" % need if need is not None else "its rows differ"),
                    "window_per_segment", r.b)
            need = int(w[0])
        if (~edge).any():
            floor = max(floor, int(r.jq[~edge].max()))   # these rows start at key 0: the window must reach it
    if need is not None and need < floor:
        raise UnsupportedCase("%s: a left window of %d keys hides keys other segments' queries see (they need "
                              "at least %d)" % (library, need, floor), "window_per_segment", None)
    return -1 if need is None else need


# ---- FlashInfer ----------------------------------------------------------------------------------

class FlashInferArgs:
    """What a FlashInfer paged wrapper's plan() takes, from one mstar_kv
    plan: qo_indptr, paged_kv_indptr, paged_kv_indices,
    paged_kv_last_page_len (views of the plan's arrays), page_size, causal,
    window_left and custom_mask (None, or the exact mask: flattened bool,
    segment by segment, row-major [qo_len, kv_len]; causal is then False
    and window_left -1, the mask holds them). kwargs() gives them by
    FlashInfer's parameter names (prefill: all; decode: no qo_indptr,
    causal, custom_mask)."""

    def __init__(self, kind, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size, causal, window_left,
                 custom_mask):
        self.kind, self.qo_indptr, self.kv_indptr, self.kv_indices = kind, qo_indptr, kv_indptr, kv_indices
        self.kv_last_page_len, self.page_size, self.causal = kv_last_page_len, page_size, causal
        self.window_left, self.custom_mask = window_left, custom_mask

    def kwargs(self):
        if self.kind == "decode":
            return dict(indptr=self.kv_indptr, indices=self.kv_indices, last_page_len=self.kv_last_page_len,
                        page_size=self.page_size, window_left=self.window_left)
        return dict(qo_indptr=self.qo_indptr, paged_kv_indptr=self.kv_indptr, paged_kv_indices=self.kv_indices,
                    paged_kv_last_page_len=self.kv_last_page_len, page_size=self.page_size, causal=self.causal,
                    window_left=self.window_left, custom_mask=self.custom_mask)

    def __repr__(self):
        return ("FlashInferArgs(%s, batch=%d, page_size=%d, causal=%r, window_left=%d, custom_mask=%s)"
                % (self.kind, len(self.kv_last_page_len), self.page_size, self.causal, self.window_left,
                   "None" if self.custom_mask is None else "[%d]" % len(self.custom_mask)))


def _as(a, fmt):
    if fmt == "numpy":
        return a
    if fmt != "torch":
        raise ValueError("fmt: %r is not 'torch' or 'numpy'" % (fmt,))
    import torch
    with warnings.catch_warnings():   # the plan's buffers are read-only to NumPy; the view shares them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def _check_pages(plan, library):
    if plan.batch < 1:
        raise UnsupportedCase("%s: the plan has no segments" % library, "no_keys", None)
    if plan.pad_segments:
        raise UnsupportedCase("%s: the plan has %d padding segments (pad=): they hold no keys; plan without pad="
                              % (library, plan.pad_segments), "no_keys", plan.batch - plan.pad_segments)
    pages = np.diff(plan.kv_indptr)
    bad = np.nonzero((pages < 1) | (plan.kv_len < 1))[0]
    if bad.size:
        b = int(bad[0])
        raise UnsupportedCase("%s: segment %d has %d keys on %d pages; the library needs at least one key "
                              "(1 <= last_page_len <= page_size)" % (library, b, int(plan.kv_len[b]), int(pages[b])),
                              "no_keys", b)


def flashinfer_prefill_args(plan, mask="causal", window_left=0, fmt="torch"):
    """BatchPrefillWithPagedKVCacheWrapper.plan() arguments that attend
    exactly as mstar_kv does over plan with this mask ("none", "causal",
    "window") and window_left. The page arrays are the plan's own (no
    copy). Where the plan's mask is FlashInfer's (queries at the end of
    their sequence, no hidden key a row would otherwise see, a window that
    does not reach across the jump to the sink, hidden keys only at the
    front of every row's window with one window for all) causal /
    window_left say it; otherwise custom_mask is the exact mask (one bool per query and
    key: qo_len x kv_len per segment, made here). UnsupportedCase when a
    query sees no key (FlashInfer does not define that row)."""
    _check_pages(plan, "FlashInfer prefill")
    causal = _mask_code(mask) != MASKS["none"]
    rows = [segment_rows(plan, b, mask, window_left) for b in range(plan.batch)]
    custom = None
    try:
        wl = _common_window(rows, causal, "FlashInfer prefill")
    except UnsupportedCase as e:
        if e.case == "empty_row":
            raise
        masks = [visible_mask(plan, b, mask, window_left) for b in range(plan.batch)]
        for b, vm in enumerate(masks):
            if not vm.any(axis=1).all():
                i = int(np.argmin(vm.any(axis=1)))
                raise UnsupportedCase("FlashInfer prefill: segment %d, query %d sees no key (FlashInfer does not "
                                      "define that row)" % (b, i), "empty_row", b)
        custom = _as(np.concatenate([vm.reshape(-1) for vm in masks]), fmt)
        causal, wl = False, -1
    return FlashInferArgs("prefill", _as(plan.qo_indptr, fmt), _as(plan.kv_indptr, fmt), _as(plan.kv_indices, fmt),
                          _as(plan.kv_last_page_len, fmt), plan.page_size, causal, wl, custom)


def flashinfer_decode_args(plan, mask="causal", window_left=0, fmt="torch"):
    """BatchDecodeWithPagedKVCacheWrapper.plan() arguments (one query per
    segment, at the end of its sequence) that attend exactly as mstar_kv
    over plan. BatchDecode has no mask, only one window_left for the batch:
    keys hidden at the front of a segment's window (the head of its first
    page) become that window_left; UnsupportedCase for what it cannot say
    (case "sink_and_hole": hidden keys between a visible sink and the
    window; "window_per_segment": segments needing different windows;
    "decode_queries": a segment with another number of queries than 1).
    flashinfer_prefill_args expresses every case with a custom_mask."""
    _check_pages(plan, "FlashInfer decode")
    qo = np.diff(plan.qo_indptr)
    if (qo != 1).any():
        b = int(np.argmax(qo != 1))
        raise UnsupportedCase("FlashInfer decode: segment %d has %d queries; BatchDecode takes exactly 1 per "
                              "segment (use flashinfer_prefill_args)" % (b, int(qo[b])), "decode_queries", b)
    rows = [segment_rows(plan, b, mask, window_left) for b in range(plan.batch)]
    wl = _common_window(rows, False, "FlashInfer decode")
    return FlashInferArgs("decode", _as(plan.qo_indptr, fmt), _as(plan.kv_indptr, fmt), _as(plan.kv_indices, fmt),
                          _as(plan.kv_last_page_len, fmt), plan.page_size, False, wl, None)


# ---- flash-attn ----------------------------------------------------------------------------------

class FlashAttnArgs:
    """flash_attn_with_kvcache(q, k_cache, v_cache, ...) arguments from one
    plan: block_table [batch, max_pages] int32 (each row the segment's pages,
    padded with page 0, the null page, which cache_seqlens keeps unread),
    cache_seqlens [batch] int32 (the plan's kv_len, a view), causal,
    window_size (left, right) and seqlen_q (every segment's query count:
    q is [batch, seqlen_q, q_heads, head_dim])."""

    def __init__(self, block_table, cache_seqlens, causal, window_size, seqlen_q):
        self.block_table, self.cache_seqlens, self.causal = block_table, cache_seqlens, causal
        self.window_size, self.seqlen_q = window_size, seqlen_q

    def kwargs(self):
        return dict(block_table=self.block_table, cache_seqlens=self.cache_seqlens, causal=self.causal,
                    window_size=self.window_size)

    def __repr__(self):
        return "FlashAttnArgs(block_table=%s, causal=%r, window_size=%r, seqlen_q=%d)" % (
            tuple(self.block_table.shape), self.causal, self.window_size, self.seqlen_q)


def flash_attn_args(plan, mask="causal", window_left=0, page_multiple=256, fmt="torch"):
    """flash_attn_with_kvcache arguments that attend exactly as mstar_kv
    over plan. q must be dense [batch, seqlen_q, ...], so every segment
    needs the same query count ("ragged_queries" otherwise); there is no
    mask and leftpad does not combine with a block_table, so hidden keys
    must be the front of every row's window with one left window for all
    ("sink_and_hole", "window_per_segment" otherwise: with more than one
    query a hidden front is not a sliding window, so that is decode only).
    page_multiple: the page size flash-attn's paged kernels take a multiple
    of (256 in flash-attn 2's docs; pass 1 for a build that takes any)."""
    _check_pages(plan, "flash-attn")
    if page_multiple < 1 or plan.page_size % page_multiple:
        raise UnsupportedCase("flash-attn: page_size %d is not a multiple of %d (page_multiple: flash-attn 2 "
                              "documents page_block_size as a multiple of 256)" % (plan.page_size, page_multiple),
                              "page_size", None)
    qo = np.diff(plan.qo_indptr)
    if (qo != qo[0]).any():
        b = int(np.argmax(qo != qo[0]))
        raise UnsupportedCase("flash-attn: segment %d has %d queries, segment 0 %d: q is [batch, seqlen_q, ...], "
                              "one query count for all" % (b, int(qo[b]), int(qo[0])), "ragged_queries", b)
    m = _mask_code(mask)
    causal = m != MASKS["none"]
    rows = [segment_rows(plan, b, mask, window_left) for b in range(plan.batch)]
    left = _common_window(rows, causal, "flash-attn")
    pages = np.diff(plan.kv_indptr)
    table = np.zeros((plan.batch, int(pages.max())), dtype=np.int32)
    for b in range(plan.batch):
        table[b, :pages[b]] = plan.kv_indices[plan.kv_indptr[b]:plan.kv_indptr[b + 1]]
    window = (left, 0 if causal else -1)
    return FlashAttnArgs(_as(table, fmt), _as(plan.kv_len, fmt), causal, window, int(qo[0]))


# ---- the pools as tensors ----------------------------------------------------------------------

def arena_pools(arena, layer, fmt="torch"):
    """(k, v) of one layer of an Arena's host store, each
    [num_pages, page_size, kv_heads, head_dim] sharing the store's memory:
    FlashInfer's NHD paged_kv_cache as a tuple, flash-attn's k_cache /
    v_cache (bf16 pools come as torch.bfloat16). The combined
    [pages, 2, page_size, ...] form would need K and V of a page side by
    side; the store keeps one pool per layer and kind, so it is not a view."""
    k, v = arena.pool(layer, "k"), arena.pool(layer, "v")
    if k is None:
        raise ValueError("arena_pools: the arena has no host pools (made with num_layers = 0, or bound to a "
                         "CudaStore: use cuda_store_pools)")
    if fmt == "numpy":
        return k, v
    kt, vt = _as(k, fmt), _as(v, fmt)
    if arena.store_info().dtype == 2:   # bf16, seen through NumPy as uint16
        import torch
        kt, vt = kt.view(torch.bfloat16), vt.view(torch.bfloat16)
    return kt, vt


class _DevicePool:
    """__cuda_array_interface__ over one device pool; keeps the store alive."""

    def __init__(self, store, ptr, shape, typestr):
        self._store = store
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": None, "version": 3}


def cuda_store_pools(store, layer):
    """(k, v) torch CUDA tensors of one layer of a CudaStore's pools
    (the caller's own tensors when the store adopted them; else views of
    the store's memory that keep the store alive)."""
    import torch
    d = store.desc
    if not 0 <= layer < d.num_layers:
        raise ValueError("cuda_store_pools: layer %r is not in [0, %d)" % (layer, d.num_layers))
    adopted = getattr(store, "_pools", None)
    if adopted is not None and all(isinstance(b.keep, torch.Tensor) for b in adopted[layer]):
        return tuple(b.keep for b in adopted[layer])
    shape = (d.num_pages, d.page_size, d.kv_heads, d.head_dim)
    typestr = {0: "<f4", 1: "<f2", 2: "<u2"}[d.dtype]
    device = torch.device("cuda", store.cuda.info()["device"])
    out = []
    for kind in ("k", "v"):
        ptr = store.pool(layer, kind)
        if not ptr:
            raise ValueError("cuda_store_pools: the store has no %s pool for layer %d" % (kind, layer))
        t = torch.as_tensor(_DevicePool(store, ptr, shape, typestr), device=device)
        out.append(t.view(torch.bfloat16) if d.dtype == 2 else t)
    return tuple(out)
