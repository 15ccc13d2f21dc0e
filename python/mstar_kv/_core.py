"""The host core and CPU backend of mstar_kv.h, with the C API's nouns:
Arena, Request, Plan, Session, plus the window arithmetic (Schedule,
Retention), RoPE and the CPU attention backend (Cpu)."""
from __future__ import annotations

import collections
import ctypes
import os
import sys
import types
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._closing import Closing  # noqa: F401  (the owners' base, re-exported)

from . import _ffi, _hints, _tensors
from ._errors import MskvError, TensorError, error_for
from ._sched import ArenaScheduling, RequestScheduling
from ._stream import ArenaStreaming
from ._types import Choice, Segments, Tensor
from ._enums import Dtype, Location, PlanFeature, PosMode
from ._ffi import (mskv_arena_desc, mskv_arena_stats, mskv_attn, mskv_cpu_desc, mskv_decode_span,
                   mskv_plan, mskv_plan_desc, mskv_plan_size, mskv_request, mskv_request_info,
                   mskv_retention, mskv_rope, mskv_schedule, mskv_segment, mskv_session, mskv_store_info,
                   mskv_window)

byref = ctypes.byref

# ---- names for enum arguments -----------------------------------------------------------

DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
_DTYPE_ALIASES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "uint16": "bf16"}
POS_MODES = {"none": 0, "1d": 1, "3d": 2}
PLAN_KINDS = {"self": 0, "cross": 1, "dense": 2, "prefix": 3}
MASKS = {"none": 0, "causal": 1, "window": 2}
ROPE_STYLES = {"half": 0, "interleaved": 1}
RETIRE_MODES = {"immediate": 0, "fenced": 1}


VISIBILITY = ("exact", "pages", "caller")   # plan_build(visibility=...): see _visibility


def _visibility_table():
    c = _ffi.CONSTANTS
    return {"exact": c["MSKV_VIS_EXACT"], "pages": c["MSKV_VIS_PAGES"], "caller": c["MSKV_VIS_CALLER"]}


def _visibility(value, n_segments):
    """(mskv_visibility code, kept arrays) for plan_build's visibility=:
    "exact" (the default: token-exact, what a rolling cache keeps), "pages"
    (every token of the pages in the table), an mskv_visibility code / enum,
    or caller bounds (sink_end, window_start), one absolute position per
    segment each."""
    table = _visibility_table()
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], str):
        se = np.ascontiguousarray(np.atleast_1d(value[0]), dtype=np.int64)
        ws = np.ascontiguousarray(np.atleast_1d(value[1]), dtype=np.int64)
        if se.shape != (n_segments,) or ws.shape != (n_segments,):
            raise ValueError("visibility: caller bounds need one sink_end and one window_start per segment "
                             "(%d segments; got %d and %d)" % (n_segments, se.size, ws.size))
        return table["caller"], (se, ws)
    code = _enum(table, value, "visibility")
    if code == table["caller"]:
        raise ValueError("visibility: 'caller' needs the bounds: pass visibility=(sink_end, window_start), "
                         "one absolute position per segment each")
    return code, None
_NP_DTYPE = {0: np.float32, 1: np.float16, 2: np.uint16}   # bf16 is seen as uint16 bits


def _enum(table, value, what):
    key = value.lower() if isinstance(value, str) else value
    if key in table:
        return table[key]
    if isinstance(value, int) and value in table.values():
        return value
    raise ValueError("%s: %r is not one of %s" % (what, value, ", ".join(table)))


def dtype_code(dtype: Union[Choice, Any]) -> Dtype:
    """'f32' / 'f16' / 'bf16', a NumPy dtype (uint16 means bf16), a
    torch.dtype (torch.float32, torch.float16, torch.bfloat16),
    ml_dtypes.bfloat16, or a code."""
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        name = str(dtype).replace("torch.", "")
        return Dtype(_enum(DTYPES, _DTYPE_ALIASES.get(name, name), "dtype"))
    if isinstance(dtype, str):
        return Dtype(_enum(DTYPES, _DTYPE_ALIASES.get(dtype.lower(), dtype.lower()), "dtype"))
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return Dtype(_enum(DTYPES, dtype, "dtype"))
    name = np.dtype(dtype).name
    return Dtype(_enum(DTYPES, _DTYPE_ALIASES.get(name, name), "dtype"))


def _check(code, function, detail=""):
    if code != 0:
        raise error_for(code, function, detail)


def _record_type(struct, name):
    """A namedtuple with the struct's fields (so a field added to the mirror shows up)."""
    return collections.namedtuple(name, [f[0] for f in struct._fields_])


def _record(cls, s):
    return cls(*[getattr(s, f) for f in cls._fields])


ArenaStats = _record_type(mskv_arena_stats, "ArenaStats")
StoreInfo = _record_type(mskv_store_info, "StoreInfo")
RequestInfo = _record_type(mskv_request_info, "RequestInfo")
Window = _record_type(mskv_window, "Window")
DecodeSpan = _record_type(mskv_decode_span, "DecodeSpan")
Event = collections.namedtuple("Event", "type request page first_token step")
EVENT_TYPES = {1: "page_stored", 2: "page_removed"}
_EVENT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_ffi.mskv_event))


# ---- arena --------------------------------------------------------------------------------

class _Owned:
    """Owns one C object and destroys it once nothing refers to it: the
    Python object that made it, or a NumPy view into its memory."""

    def __init__(self, ptr, destroy):
        self.ptr, self._destroy = ptr, destroy

    def release(self):
        if self.ptr:
            ptr, self.ptr = self.ptr, None
            self._destroy(ptr)

    def __del__(self):
        self.release()


class Arena(ArenaScheduling, ArenaStreaming):
    """An mskv_arena: pages, requests, plans; with num_layers > 0 also the
    host K/V pools the CPU backend reads and writes
    (2 * num_layers * num_pages * page_size * kv_heads * head_dim elements).

    Use it as a context manager, or call close(). Every failed call raises
    the MskvError subclass of its result code. on_event(Event) is called for
    page-stored / page-removed events with the arena's lock held: it must not
    call the arena."""

    def __init__(self, num_pages: int, page_size: int, num_layers: int = 0, kv_heads: int = 0, head_dim: int = 0,
                 dtype: Choice = "f32", max_requests: int = 0, retire: Choice = "immediate",
                 on_event: Optional[Callable[["Event"], None]] = None, debug: int = 0, _desc=None, _keep=None,
                 num_groups: int = 0):
        d = _desc if _desc is not None else mskv_arena_desc()
        if _desc is None:
            d.num_groups = num_groups   # layer groups (0 = 1): see Request.group()
            d.num_pages, d.page_size, d.max_requests = num_pages, page_size, max_requests
            d.num_layers, d.kv_heads, d.head_dim = num_layers, kv_heads, head_dim
            d.dtype = dtype_code(dtype)
            d.retire_mode = _enum(RETIRE_MODES, retire, "retire")
            d.debug = debug   # MSKV_DEBUG_* bits: mstar_kv._ffi.CONSTANTS
        self._log_count, self._log_last = 0, ""
        # the callbacks hold only a weak reference: the arena must stay collectable
        me = weakref.ref(self)
        self._log_fn = _ffi.LOG_FN(lambda user, level, msg: Arena._logged(me, level, msg))
        d.log = ctypes.cast(self._log_fn, ctypes.c_void_p)
        self._on_event = on_event
        if on_event is not None:
            self._event_fn = _EVENT_FN(lambda user, ev: Arena._event(me, ev))
            d.on_event = ctypes.cast(self._event_fn, ctypes.c_void_p)
        self._keep = _keep
        self._num_groups = d.num_groups
        out = ctypes.c_void_p()
        self._h = None
        self._call("mskv_arena_create", byref(d), byref(out))
        self._h = _Owned(out.value, _ffi.lib.mskv_arena_destroy)
        # what the C arena points at lives as long as the C arena does
        self._h.keep = (self._log_fn, getattr(self, "_event_fn", None), _keep)
        self._info = self.store_info()

    @staticmethod
    def _logged(me, level, msg):
        self = me()
        if self is not None and level >= 2:
            self._log_count += 1
            self._log_last = msg.decode(errors="replace")

    @staticmethod
    def _event(me, ev):
        self = me()
        if self is not None:
            e = ev.contents
            self._on_event(Event(EVENT_TYPES.get(e.type, e.type), Request(self, e.request.id), e.page,
                                 e.first_token, e.step))

    @property
    def ptr(self) -> int:
        """The C arena's address (MskvError once the arena is closed)."""
        if self._h is None or not self._h.ptr:
            raise MskvError("the arena is closed")
        return self._h.ptr

    def _call(self, function, *args):
        n = self._log_count
        code = getattr(_ffi.lib, function)(*args)
        if code != 0:
            detail = self._log_last if self._log_count != n else _hints.explain(function, code, self, args)
            raise error_for(code, function, detail)

    def close(self) -> None:
        """Destroys the arena (pool views and sessions keep its memory until they are gone)."""
        # the last reference goes: destroyed now, or once the last pool view is gone
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        if self._h is None or not self._h.ptr:
            return "Arena(closed)"
        i, st = self._info, self.stats()
        geo = ", layers=%d, kv_heads=%d, head_dim=%d, dtype=%s" % (
            i.num_layers, i.kv_heads, i.head_dim, Dtype(i.dtype).name.lower()) if i.num_layers else ""
        groups = ", groups=%d" % self.num_groups if self.num_groups > 1 else ""
        return "Arena(pages=%d, page_size=%d%s%s, free=%d, requests=%d, step=%d)" % (
            st.num_pages, i.page_size, geo, groups, st.free_pages, st.requests, st.step)

    # -- state
    def stats(self) -> ArenaStats:
        """Page and request counts, fences (mskv_arena_stats_get)."""
        s = mskv_arena_stats()
        self._call("mskv_arena_stats_get", self.ptr, byref(s))
        return _record(ArenaStats, s)

    def audit(self) -> None:
        """Checks every invariant; AuditFailedError says which one broke."""
        why = ctypes.create_string_buffer(512)
        code = _ffi.lib.mskv_arena_audit(self.ptr, why, len(why))
        _check(code, "mskv_arena_audit", why.value.decode(errors="replace"))

    def audit_bytes(self) -> None:
        """audit(), then the bytes the debug checks (debug=...) make checkable:
        free pages still poisoned, host copies still matching their checksums.
        AuditFailedError says which page; UnsupportedError without debug checks."""
        why = ctypes.create_string_buffer(512)
        code = _ffi.lib.mskv_arena_audit_bytes(self.ptr, why, len(why))
        _check(code, "mskv_arena_audit_bytes", why.value.decode(errors="replace"))

    def check_plan(self, plan: "Plan") -> None:
        """StalePlanError when pages left one of the plan's requests since it was built."""
        self._call("mskv_plan_check", self.ptr, byref(plan._s))

    def digest(self) -> int:
        """A hash of the whole bookkeeping state: equal digests mean nothing changed (mskv_arena_digest)."""
        return _ffi.lib.mskv_arena_digest(self.ptr)

    def trim(self) -> None:
        """Frees the host memory kept for reuse by the next offload (mskv_arena_trim)."""
        _ffi.lib.mskv_arena_trim(self.ptr)

    def retire(self, completed: int) -> None:
        """Pages freed during fences <= completed become reusable (fenced mode; mskv_arena_retire)."""
        self._call("mskv_arena_retire", self.ptr, completed)

    @property
    def step(self) -> int:
        """The current fence: pages freed now are tagged with it (mskv_arena_step)."""
        return _ffi.lib.mskv_arena_step(self.ptr)

    def store_info(self) -> StoreInfo:
        """Host store geometry: layers, heads, head_dim, page size, dtype, byte sizes (mskv_store_info_get)."""
        s = mskv_store_info()
        self._call("mskv_store_info_get", self.ptr, byref(s))
        return _record(StoreInfo, s)._replace(dtype=Dtype(s.dtype))

    def pool(self, layer: int, kind: Union[str, int]) -> Optional[np.ndarray]:
        """A zero-copy NumPy view of one host pool, [num_pages][page_size][kv_heads][head_dim]
        (kind "k"/0 or "v"/1; bf16 as uint16). None when the arena has no host pools."""
        k = {"k": 0, "v": 1}.get(kind, kind)
        if k not in (0, 1):
            raise ValueError("pool: kind %r is not \"k\" (0) or \"v\" (1)" % (kind,))
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError("pool: layer: expected an int, got %s" % type(layer).__name__)
        if not 0 <= layer < self._info.num_layers:
            raise ValueError("pool: layer %d is not in [0, %d) (the arena's num_layers)"
                             % (layer, self._info.num_layers))
        ptr = _ffi.lib.mskv_store_pool(self.ptr, layer, k)
        if not ptr:
            return None
        i = self._info
        raw = (ctypes.c_char * i.pool_bytes).from_address(ptr)
        raw.owner = self._h          # the memory lives until the last view is gone
        return np.frombuffer(raw, dtype=_NP_DTYPE[i.dtype]).reshape(i.num_pages, i.page_size, i.kv_heads,
                                                                      i.head_dim)

    # -- requests
    def add_request(self) -> "Request":
        """A new, empty request (one KV stream; mskv_request_add)."""
        r = mskv_request()
        self._call("mskv_request_add", self.ptr, byref(r))
        return Request(self, r.id)

    def import_request(self, blob: bytes) -> "Request":
        """A new, offloaded request from an exported blob (bytes-like)."""
        buf = np.frombuffer(memoryview(blob).cast("B"), dtype=np.uint8)
        r = mskv_request()
        self._call("mskv_request_import", self.ptr, buf.ctypes.data, buf.size, byref(r))
        return Request(self, r.id)

    def keyed_create(self, key: int, n_tokens: int) -> "Request":
        """A keyed, write-once entry (e.g. text-encoder K/V) with n_tokens reserved."""
        r = mskv_request()
        self._call("mskv_keyed_create", self.ptr, key, n_tokens, byref(r))
        return Request(self, r.id)

    def keyed_find(self, key: int) -> "Request":
        """The keyed entry of key (NotFoundError when there is none)."""
        r = mskv_request()
        self._call("mskv_keyed_find", self.ptr, key, byref(r))
        return Request(self, r.id)

    def keyed_remove(self, key: int) -> None:
        """Removes the keyed entry of key (its pages wait for the fence like any free)."""
        self._call("mskv_keyed_remove", self.ptr, key)

    # -- the step lifecycle
    def _segments(self, segments):
        if isinstance(segments, Request) or (isinstance(segments, tuple) and len(segments) == 2 and
                                             isinstance(segments[0], Request)):
            raise TypeError("segments: expected a list of (Request, n_tokens) pairs, got one %s: %r"
                            % ("Request" if isinstance(segments, Request) else "pair", segments))
        segs = list(segments)
        arr = (mskv_segment * max(len(segs), 1))()
        for i, seg in enumerate(segs):
            if not isinstance(seg, tuple) or len(seg) != 2:
                raise TypeError("segments[%d]: expected a (Request, n_tokens) pair, got %r" % (i, seg))
            req, n = seg
            if not isinstance(req, Request):
                raise TypeError("segments[%d]: expected a Request, got %s" % (i, type(req).__name__))
            if isinstance(n, bool) or not hasattr(n, "__index__"):
                raise TypeError("segments[%d]: n_tokens: expected an int, got %s" % (i, type(n).__name__))
            if req.arena is not self:
                raise ValueError("segment %d: %r is not a request of this arena" % (i, req))
            e = arr[i]
            e.request, e.n_tokens = req._c, n
        return arr, len(segs)

    def admit(self, segments: Segments) -> None:
        """Reserves every segment's tokens ((request, n_tokens) pairs), all or nothing."""
        self._call("mskv_admit", self.ptr, *self._segments(segments))

    def commit(self, segments: Segments) -> None:
        """Reserved tokens become committed; every segment needs an open reservation (mskv_commit)."""
        self._call("mskv_commit", self.ptr, *self._segments(segments))

    def admit_and_commit(self, segments: Segments) -> None:
        """mskv_step: admit then commit of the same segments in one call (one lock), the single-pass
        step whose tokens are never aborted. All or nothing, with admit's errors."""
        self._call("mskv_step", self.ptr, *self._segments(segments))

    def abort(self, segments: Segments) -> None:
        """Returns the segments' reservations without committing; the pages they added are freed (mskv_abort)."""
        self._call("mskv_abort", self.ptr, *self._segments(segments))

    def publish(self, segments: Segments = ()) -> int:
        """Ends the step (retention, events, fence); returns the fence that ended."""
        step = ctypes.c_uint64()
        self._call("mskv_publish", self.ptr, *self._segments(segments), byref(step))
        return step.value

    def _plan_desc(self, kind, cross, dense_kv_len, pos, pos_offset, grid, pad=None, exclude_prefix=False,
                   visibility="exact", n_segments=1):
        d = mskv_plan_desc()
        d.visibility, bounds = _visibility(visibility, n_segments)
        if bounds is not None:
            d.vis_sink_end, d.vis_window_start = bounds   # kept by d
        d.exclude_prefix = int(bool(exclude_prefix))
        if pad is not None:   # (batch, tokens, qo_len, kv_len) of a captured shape
            d.pad_batch, d.pad_tokens, d.pad_qo_len, d.pad_kv_len = pad
        d.kind = _enum(PLAN_KINDS, kind, "kind")
        if cross is not None:
            d.cross.id = cross.id
        keep = None
        if dense_kv_len is not None:
            keep = np.ascontiguousarray(dense_kv_len, dtype=np.int64)
            d.dense_kv_len = keep   # kept by d
        d.pos_mode = _enum(POS_MODES, pos, "pos")
        d.pos_offset = pos_offset
        if grid is not None:
            d.grid_h, d.grid_w = grid
        return d, keep

    def plan_query(self, segments: Segments, kind: Choice = "self", cross: "Optional[Request]" = None,
                   dense_kv_len: Optional[Sequence[int]] = None, pos: Choice = "none", pos_offset: int = 0,
                   grid: Optional[Tuple[int, int]] = None, pad: Optional[Tuple[int, int, int, int]] = None,
                   exclude_prefix: bool = False, visibility: Any = "exact") -> Tuple[int, int, int]:
        """(batch, total_q, num_page_ids) a plan of these segments needs."""
        segments = list(segments)
        d, keep = self._plan_desc(kind, cross, dense_kv_len, pos, pos_offset, grid, pad, exclude_prefix,
                                  visibility, len(segments))
        out = mskv_plan_size()
        self._call("mskv_plan_query", self.ptr, *self._segments(segments), byref(d), byref(out))
        del keep
        return out.batch, out.total_q, out.num_page_ids

    def plan_build(self, segments: Segments, plan: "Plan", kind: Choice = "self", cross: "Optional[Request]" = None,
                   dense_kv_len: Optional[Sequence[int]] = None, pos: Choice = "none", pos_offset: int = 0,
                   grid: Optional[Tuple[int, int]] = None, pad: Optional[Tuple[int, int, int, int]] = None,
                   exclude_prefix: bool = False, visibility: Any = "exact") -> "Plan":
        """Fills plan (a Plan) for these segments; returns it. pad: (batch,
        tokens, qo_len, kv_len) of a captured CUDA graph's step, planned into
        that shape (mskv_plan_desc.pad_*); CapacityError if it does not fit.
        kind "prefix" attends over a PrefixView; exclude_prefix (kind "self")
        hides the protected prefix, so the two merged give the whole.
        visibility: "exact" (default: attention sees exactly the tokens the
        retention keeps, the protected prefix and everything from the
        release point on, whatever the page size), "pages" (every token of
        the pages still in the table: up to page_size - 1 released tokens
        stay visible at each edge), or (sink_end, window_start) caller
        bounds per segment; an mskv_visibility code is accepted too."""
        segments = list(segments)
        d, keep = self._plan_desc(kind, cross, dense_kv_len, pos, pos_offset, grid, pad, exclude_prefix,
                                  visibility, len(segments))
        self._call("mskv_plan_build", self.ptr, *self._segments(segments), byref(d), byref(plan._s))
        del keep
        plan._built(d.pos_mode)
        return plan

    # -- CPU backend on this arena's host pools
    def write_kv(self, layer: int, plan: "Plan", k: Tensor, v: Tensor, rope: "Optional[Rope]" = None) -> None:
        """Scatters new K/V rows [total_q][kv_heads][head_dim] (f32, f16, bf16
        as uint16) into the layer's pools through plan.slot_mapping; rope
        (optional) rotates K on the way in."""
        i = self._info
        shape, layout = (plan.total_q, i.kv_heads, i.head_dim), "[total_q][kv_heads][head_dim]"
        kb = _tensors.check(k, "k", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=shape, layout=layout)
        vb = _tensors.check(v, "v", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=shape, layout=layout)
        _tensors.same_dtype(kb, vb, "k and v")
        if rope is not None:
            plan._need_positions(rope.mode)
        self._call("mskv_cpu_write_kv", self.ptr, layer, byref(plan._s), kb.ptr, vb.ptr,
                   dtype_code(_tensors._kernel_dtype(kb.dtype)), byref(rope._s) if rope is not None else None)

    def session(self, request: "Request", retention: "Retention") -> "Session":
        """A Session binding request to retention (mskv_session_init)."""
        return Session(self, request, retention)

    def backend(self, cpu: "Optional[Cpu]" = None) -> Any:
        """The backend for this arena behind one protocol: mstar_kv.CpuBackend
        over its host pools (cpu: a Cpu, default none = the caller's thread),
        or mstar_kv.CudaBackend when the arena is bound to a CudaStore."""
        from ._backend import backend
        return backend(self, cpu=cpu)


class Request(RequestScheduling):
    """A request handle (one KV stream) of an arena."""
    __slots__ = ("_arena", "_id", "_c", "__weakref__")

    def __init__(self, arena: Arena, id: int):
        self._arena, self._id = arena, id
        self._c = mskv_request(id)   # checked once: the handle as C takes it (passed by value)

    # read-only: a handle is hashed by both
    arena = property(lambda self: self._arena)
    id = property(lambda self: self._id)

    def __repr__(self) -> str:
        try:
            i = self.info()
        except MskvError:   # a closed arena or a stale handle: the id is all there is
            return "Request(id=0x%x, stale)" % self.id
        flags = "".join(", " + f for f in ("keyed", "sealed", "paused", "lockstep") if getattr(i, f))
        return "Request(id=0x%x, committed=%d, reserved=%d, prefix=%d, pages=%d, %s%s)" % (
            self.id, i.committed, i.reserved, i.prefix_tokens, i.num_pages, Location(i.location).name.lower(), flags)

    def __eq__(self, other):
        return isinstance(other, Request) and other.arena is self.arena and other.id == self.id

    def __hash__(self):
        return hash((id(self.arena), self.id))

    @property
    def _h(self):
        return self._c

    def _call(self, function, *args):
        arena = self._arena
        arena._call(function, arena.ptr, self._c, *args)

    def info(self) -> RequestInfo:
        """Token counts, prefix, pages, epoch, location (a Location), flags (mskv_request_info_get)."""
        s = mskv_request_info()
        self._call("mskv_request_info_get", byref(s))
        return _record(RequestInfo, s)._replace(location=Location(s.location))

    def remove(self) -> None:
        """Removes the request in any state; every page goes back and the handle is stale (mskv_request_remove)."""
        self._call("mskv_request_remove")

    def fork(self) -> "Request":
        """A child sharing the full pages (the partial last page copied), with the parent's tokens and prefix (mskv_request_fork)."""
        child = mskv_request()
        self._call("mskv_request_fork", byref(child))
        return Request(self.arena, child.id)

    def pause(self) -> None:
        """Keeps the pages but makes admit refuse the request (BadStateError) until resume()."""
        self._call("mskv_request_pause")

    def resume(self) -> None:
        """Undoes pause()."""
        self._call("mskv_request_resume")

    def reserve(self, tokens: int) -> None:
        """Sizes the page table for tokens tokens now, so steps up to that length never allocate."""
        self._call("mskv_request_reserve", tokens)

    def pages(self) -> np.ndarray:
        """The page table, [prefix pages][live pages], as a new int32 array."""
        count = ctypes.c_int32()
        code = _ffi.lib.mskv_request_pages(self._arena.ptr, self._c, None, 0, byref(count))
        if code not in (0, _CAPACITY):
            _check(code, "mskv_request_pages")
        out = np.zeros(count.value, dtype=np.int32)
        self._call("mskv_request_pages", out.ctypes.data, out.size, byref(count))
        return out

    def protect_prefix(self, n: int) -> None:
        """Protects the first n committed tokens (their pages whole) against release; a new length moves prefix_epoch."""
        self._call("mskv_request_protect_prefix", n)

    def prefix_view(self, cap_tokens: int, group: int = 0) -> "PrefixView":
        """A PrefixView of this request's protected prefix with host buffers
        for cap_tokens tokens per layer (not gathered yet: call gather())."""
        return PrefixView(self.arena, self, cap_tokens, group)

    def release_oldest(self, n: int) -> int:
        """Releases the n oldest tokens still visible: n counts on from the previous release point (repeated small releases add up); pages go only when whole. Returns the tokens freed."""
        released = ctypes.c_int64()
        self._call("mskv_request_release_oldest", n, byref(released))
        return released.value

    def slot(self, pos: int) -> int:
        """page * page_size + offset of absolute position pos (ReleasedError, NotWrittenError otherwise)."""
        s = ctypes.c_int64()
        self._call("mskv_request_slot", pos, byref(s))
        return s.value

    def set_retention(self, retention: "Optional[Retention]") -> None:
        """Binds a retention policy (None clears it); publish applies it (mskv_request_set_retention)."""
        self._call("mskv_request_set_retention", byref(retention._s) if retention is not None else None)

    def offload(self) -> None:
        """Copies every page to host memory the request owns, then frees the pages (mskv_request_offload)."""
        self._call("mskv_request_offload")

    def reload(self) -> None:
        """Fresh pages, bytes copied back, prefix_epoch moves, the host copy freed; all or nothing (mskv_request_reload)."""
        self._call("mskv_request_reload")

    def export(self) -> bytes:
        """The request as a versioned, checksummed blob (bytes)."""
        size = ctypes.c_size_t()
        code = _ffi.lib.mskv_request_export(self.arena.ptr, self._h, None, 0, byref(size))
        if code not in (0, _CAPACITY):
            _check(code, "mskv_request_export")
        buf = ctypes.create_string_buffer(size.value)
        self._call("mskv_request_export", buf, size.value, byref(size))
        return buf.raw[:size.value]

    def seal(self) -> None:
        """Seals a keyed entry: read-only from now on, readable by CROSS plans."""
        self._call("mskv_keyed_seal")


_CAPACITY = -7


# ---- plans ----------------------------------------------------------------------------------

_PLAN_ARRAYS = [  # name, dtype, length from (cap_batch, cap_tokens, cap_page_ids)
    ("qo_indptr", np.int32, lambda b, t, p: b + 1),
    ("kv_indptr", np.int32, lambda b, t, p: b + 1),
    ("kv_indices", np.int32, lambda b, t, p: p),
    ("kv_last_page_len", np.int32, lambda b, t, p: b),
    ("kv_len", np.int32, lambda b, t, p: b),
    ("kv_pos_split", np.int32, lambda b, t, p: b),
    ("kv_pos_shift", np.int32, lambda b, t, p: b),
    ("kv_token_indptr", np.int64, lambda b, t, p: b + 1),
    ("slot_mapping", np.int64, lambda b, t, p: t),
    ("positions", np.int32, lambda b, t, p: 3 * t),
    ("requests", np.uint32, lambda b, t, p: b),   # the segments' requests: exact stale-plan checks
    ("q_pos", np.int32, lambda b, t, p: t),
    ("vis_sink_end", np.int32, lambda b, t, p: b),
    ("vis_window_start", np.int32, lambda b, t, p: b),
]


class Plan:
    """A step's plan in fixed buffers of the given capacities, owned by this
    object. Its arrays are NumPy views of those buffers: every build writes
    the same memory, so addresses never change (a captured CUDA graph, or any
    consumer holding a pointer, reads the new contents). `buffers` has the
    whole buffers; the attributes are the parts the last build filled."""

    def __init__(self, cap_batch: int, cap_tokens: int, cap_page_ids: int):
        self._s = mskv_plan()
        # checked first (int32_t, >= 0), before anything is allocated from them
        self._s.cap_batch, self._s.cap_tokens, self._s.cap_page_ids = cap_batch, cap_tokens, cap_page_ids
        buffers, raw = {}, {}
        for name, dt, length in _PLAN_ARRAYS:
            a = np.zeros(max(length(cap_batch, cap_tokens, cap_page_ids), 1), dtype=dt)
            setattr(self._s, name, a)   # the struct keeps the array it points into
            raw[name] = a               # writable owner: torch() shares it without a copy or a warning
            ro = a.view()
            ro.flags.writeable = False  # what NumPy users see: the plan is the library's output
            buffers[name] = ro
        self._raw = raw
        self._buffers = types.MappingProxyType(buffers)
        self._pos_mode = 0
        self._builds = 0   # counts builds: a backend uploads a plan again when it changed

    def _built(self, pos_mode: int) -> None:
        self._pos_mode = pos_mode
        self._builds += 1

    # read-only: the C struct points into these arrays, so none can be rebound or dropped
    buffers = property(lambda self: self._buffers)
    pos_mode = property(lambda self: PosMode(self._pos_mode))   # what the last build planned positions for

    batch = property(lambda self: self._s.batch)
    total_q = property(lambda self: self._s.total_q)
    num_page_ids = property(lambda self: self._s.num_page_ids)
    page_size = property(lambda self: self._s.page_size)
    step = property(lambda self: self._s.step)
    capacity = property(lambda self: (self._s.cap_batch, self._s.cap_tokens, self._s.cap_page_ids))
    pad_segments = property(lambda self: self._s.pad_segments)   # trailing padding segments (plan_build pad=)

    def __repr__(self) -> str:
        return "Plan(batch=%d, total_q=%d, num_page_ids=%d, page_size=%d, pos=%s, step=%d, capacity=%s)" % (
            self.batch, self.total_q, self.num_page_ids, self.page_size,
            PosMode(self.pos_mode).name.lower().replace("pos_", ""), self.step, self.capacity)

    def _part(self, name, n):
        return self.buffers[name][:n]

    qo_indptr = property(lambda self: self._part("qo_indptr", self.batch + 1))
    kv_indptr = property(lambda self: self._part("kv_indptr", self.batch + 1))
    kv_indices = property(lambda self: self._part("kv_indices", self.num_page_ids))
    kv_last_page_len = property(lambda self: self._part("kv_last_page_len", self.batch))
    kv_len = property(lambda self: self._part("kv_len", self.batch))
    kv_pos_split = property(lambda self: self._part("kv_pos_split", self.batch))
    kv_pos_shift = property(lambda self: self._part("kv_pos_shift", self.batch))
    kv_token_indptr = property(lambda self: self._part("kv_token_indptr", self.batch + 1))
    slot_mapping = property(lambda self: self._part("slot_mapping", self.total_q))
    q_pos = property(lambda self: self._part("q_pos", self.total_q))
    vis_sink_end = property(lambda self: self._part("vis_sink_end", self.batch))
    vis_window_start = property(lambda self: self._part("vis_window_start", self.batch))
    features = property(lambda self: PlanFeature(self._s.features))   # PlanFeature.Q_POS | VISIBILITY

    @property
    def positions(self) -> np.ndarray:
        """[total_q] (1-D) or [total_q, 3] (3-D: frame, row, col); empty without a position plan."""
        if self.pos_mode == 2:
            return self._part("positions", 3 * self.total_q).reshape(self.total_q, 3)
        return self._part("positions", self.total_q if self.pos_mode == 1 else 0)

    def _need_positions(self, mode):
        if self.pos_mode != mode:
            raise ValueError("rope: the plan was built with pos=%r, the rope needs %r"
                             % (_name(POS_MODES, self.pos_mode), _name(POS_MODES, mode)))

    def torch(self, name: "Optional[str]" = None) -> Any:
        """The plan's arrays as CPU torch tensors sharing its buffers (no
        copy, no "not writable" warning): one array by name (e.g.
        "kv_indices", "positions"), or a dict of every array when name is
        None. They alias the fixed buffers, so they show what the next build
        writes; the library owns their contents, do not write into them."""
        from . import _torchio
        return _torchio.plan_tensors(self, name)

    def visible_positions(self) -> "List[np.ndarray]":
        """Per segment, the absolute positions of the keys its queries may
        see (before any mask): kpos(j) of mstar_kv.h's mskv_plan comment,
        minus what the visibility bounds hide. For a windowed session with
        exact visibility, the sink and the window a rolling cache keeps."""
        out = []
        vis = self._s.features & _ffi.CONSTANTS["MSKV_PLAN_VISIBILITY"]
        for b in range(self.batch):
            j = np.arange(int(self.kv_len[b]), dtype=np.int64)
            kpos = np.where(j < self.kv_pos_split[b], j, j + self.kv_pos_shift[b])
            if vis:
                se, ws = int(self.vis_sink_end[b]), int(self.vis_window_start[b])
                if ws > se:
                    kpos = kpos[(kpos < se) | (kpos >= ws)]
            out.append(kpos)
        return out

    def validate(self, num_pages: int) -> None:
        """Checks the CSR invariants; InvalidArgumentError (with the broken rule) otherwise."""
        why = ctypes.create_string_buffer(512)
        code = _ffi.lib.mskv_plan_validate(byref(self._s), num_pages, why, len(why))
        _check(code, "mskv_plan_validate", why.value.decode(errors="replace"))


def _name(table, code):
    return next((k for k, v in table.items() if v == code), code)


# ---- windows ----------------------------------------------------------------------------------

class Schedule:
    """Window schedule over `total` units: window k denoises
    [k*stride, k*stride + window), stride = window - overlap."""

    def __init__(self, total: int, window: int, overlap: int = 0):
        self._s = mskv_schedule()
        _check(_ffi.lib.mskv_schedule_init(byref(self._s), total, window, overlap), "mskv_schedule_init")

    total = property(lambda self: self._s.total)
    window_size = property(lambda self: self._s.window)
    overlap = property(lambda self: self._s.overlap)
    stride = property(lambda self: self._s.stride)
    count = property(lambda self: self._s.count)

    def __len__(self):
        return self._s.count

    def window(self, k: int) -> Window:
        """Window k: what it denoises, its conditioning and commit spans (mskv_schedule_window)."""
        w = mskv_window()
        _check(_ffi.lib.mskv_schedule_window(byref(self._s), k, byref(w)), "mskv_schedule_window")
        return _record(Window, w)

    def __iter__(self):
        return (self.window(k) for k in range(self.count))

    def decode_span(self, k: int, ctx: int) -> DecodeSpan:
        """What a causal decoder with ctx units of left context decodes for window k (mskv_schedule_decode_span)."""
        d = mskv_decode_span()
        _check(_ffi.lib.mskv_schedule_decode_span(byref(self._s), k, ctx, byref(d)),
               "mskv_schedule_decode_span")
        return _record(DecodeSpan, d)


class Retention:
    """Chunk-window retention: keep sink_chunks leading chunks and the last
    window_chunks chunks (or drop everything past the sink at each boundary).

    Pages always go whole; what attention sees is a plan's visibility.
    exact=True asks that attention see exactly the tokens kept (a rolling
    cache's sink and window): plans are token-exact by default, so any page
    size is accepted; only a visibility="pages" plan needs chunk and sink to
    be page-aligned (Session.plan refuses it otherwise). Research parameters
    (local_attn_size, sink_size in frames): Retention.from_research;
    keeping everything: Retention.unbounded()."""

    def __init__(self, chunk_size: int, sink_chunks: int = 0, window_chunks: int = 0, window_tokens: int = 0,
                 reset_at_boundary: bool = False, exact: bool = False):
        # the C field means "refuse unaligned shapes": that is only needed for whole-page
        # visibility, so the C policy never carries it (validate(visibility="pages") does the check)
        self._s = mskv_retention(chunk_size, sink_chunks, window_chunks, window_tokens,
                                 int(bool(reset_at_boundary)), 0)
        object.__setattr__(self, "_exact", bool(exact))
        object.__setattr__(self, "_unbounded", False)

    @classmethod
    def from_research(cls, local_attn_size: int, sink_size: int, frames_per_block: int,
                      tokens_per_frame: int) -> "Retention":
        """The policy a causal video model's rolling KV cache keeps
        (Self-Forcing / CausVid's CausalWanModel): local_attn_size frames of
        attention including the block being generated (-1: unbounded),
        sink_size leading frames kept, blocks of frames_per_block frames of
        tokens_per_frame tokens. See mstar_kv._research.retention_from_research."""
        from . import _research
        return _research.retention_from_research(local_attn_size, sink_size, frames_per_block, tokens_per_frame)

    @classmethod
    def unbounded(cls) -> "Retention":
        """Keeps every token (nothing is ever released): a model with
        local_attn_size = -1. Token-exact like any other policy."""
        r = cls(1 << 40, 0, 1, exact=True)   # a window no stream reaches (2^40 > 2^31 tokens)
        object.__setattr__(r, "_unbounded", True)
        return r

    exact = property(lambda self: self._exact)
    is_unbounded = property(lambda self: self._unbounded)

    def __getattr__(self, name):
        if name != "_s" and name in dict(mskv_retention._fields_):
            return getattr(self._s, name)
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name in dict(mskv_retention._fields_) or name in ("_exact", "_unbounded"):
            raise AttributeError("Retention.%s is read-only (a session copied the policy; make a new Retention)"
                                 % name.lstrip("_"))
        object.__setattr__(self, name, value)

    def __repr__(self):
        if self._unbounded:
            return "Retention.unbounded()"
        fields = ", ".join("%s=%r" % (f, getattr(self._s, f)) for f, _ in mskv_retention._fields_ if f != "exact")
        return "Retention(%s, exact=%r)" % (fields, self._exact)

    def validate(self, page_size: int = 0, visibility: Any = "exact") -> None:
        """InvalidSpecError with the reason unless the policy is valid (for
        this page size). With exact=True and visibility="pages" the chunk and
        the sink must be multiples of page_size (whole pages are then the
        exact set); with exact visibility any page size is fine."""
        s = self._s
        pages = _visibility(visibility, 1)[0] == _ffi.CONSTANTS["MSKV_VIS_PAGES"]
        if self._exact and pages:
            s = mskv_retention.from_buffer_copy(self._s)
            s.exact = 1
        why = ctypes.create_string_buffer(256)
        code = _ffi.lib.mskv_retention_validate(byref(s), page_size, why, len(why))
        detail = why.value.decode(errors="replace")
        if code != 0 and s is not self._s:
            detail += " (visibility='pages' shows whole pages; the default visibility='exact' takes any page size)"
        _check(code, "mskv_retention_validate", detail)

    def skipped_tokens(self, num_computed: int) -> int:
        """Tokens after the sink no longer needed once num_computed exist (pure);
        InvalidSpecError for an invalid policy, InvalidArgumentError for num_computed < 0."""
        out = ctypes.c_int64()
        _check(_ffi.lib.mskv_skipped_tokens_get(byref(self._s), num_computed, byref(out)), "mskv_skipped_tokens_get")
        return out.value


class Session:
    """A windowed session: a request bound to a retention policy, doing the
    protect/release bookkeeping. begin_chunk, then per denoise step plan +
    write K/V + attend, then commit_chunk. As a context manager it aborts a
    chunk left open by an exception, so its pages come back. The C session
    points at the C arena: it keeps it alive, and its calls raise once the
    Arena is closed."""

    def __init__(self, arena: Arena, request: Request, retention: Retention):
        self._arena, self._request, self._retention = arena, request, retention
        self._s = mskv_session()
        arena._call("mskv_session_init", byref(self._s), arena.ptr, request._h, byref(retention._s))
        self._s.arena = arena._h   # the same address; the struct now owns the arena it points at

    # read-only: the C session is bound to these (the retention is copied into it)
    arena = property(lambda self: self._arena)
    request = property(lambda self: self._request)
    retention = property(lambda self: self._retention)

    def _open(self):
        if self._arena._h is not self._s.pinned("arena"):
            raise MskvError("the session's arena is closed")
        return byref(self._s)

    chunk_tokens = property(lambda self: self._s.chunk_tokens)
    chunks_done = property(lambda self: self._s.chunks_done)
    released_total = property(lambda self: self._s.released_total)

    def __repr__(self) -> str:
        r = self._s.retention
        return "Session(request=0x%x, chunk_size=%d, chunks_done=%d, open_chunk=%d, released_total=%d)" % (
            self._request.id, r.chunk_size, self.chunks_done, self.chunk_tokens, self.released_total)

    def begin_chunk(self, n_tokens: int) -> None:
        """Reserves a chunk of n_tokens (admit) for the denoise steps to come (mskv_session_begin_chunk)."""
        self.arena._call("mskv_session_begin_chunk", self._open(), n_tokens)

    def plan(self, plan: Plan, pos: Choice = "none", pos_offset: int = 0,
             grid: Optional[Tuple[int, int]] = None, visibility: Any = "exact") -> Plan:
        """Plans the open chunk into plan (a Plan); returns it. visibility as
        Arena.plan_build's: "exact" by default, so attention sees exactly the
        sink and window the retention keeps at any page size. "pages" under
        an exact=True retention needs page-aligned chunks and sink
        (InvalidSpecError otherwise, nothing planned)."""
        d, _ = self.arena._plan_desc("self", None, None, pos, pos_offset, grid, visibility=visibility)
        if d.visibility == _ffi.CONSTANTS["MSKV_VIS_PAGES"] and self._retention.exact:
            self._retention.validate(self._arena._info.page_size, visibility="pages")
        self.arena._call("mskv_session_plan", self._open(), byref(d), byref(plan._s))
        plan._built(d.pos_mode)
        return plan

    def commit_chunk(self) -> int:
        """Commits the chunk, protects the sink, releases what left the window, publishes; returns the fence (mskv_session_commit_chunk)."""
        step = ctypes.c_uint64()
        self.arena._call("mskv_session_commit_chunk", self._open(), byref(step))
        return step.value

    def abort_chunk(self) -> None:
        """Drops the open chunk; its pages come back (mskv_session_abort_chunk)."""
        self.arena._call("mskv_session_abort_chunk", self._open())

    def reset(self) -> "Request":
        """A new video: a fresh request under the same retention takes the
        old one's place; the old one (its open chunk aborted) is removed, so
        its pages come back. Returns the new request. On an error nothing
        changed (the new request is made and bound first)."""
        self._open()
        arena = self._arena
        new = arena.add_request()
        s = mskv_session()
        try:
            arena._call("mskv_session_init", byref(s), arena.ptr, new._h, byref(self._retention._s))
        except BaseException:
            new.remove()
            raise
        s.arena = arena._h
        if self._s.chunk_tokens:
            self.abort_chunk()
        self._request.remove()
        self._s, self._request = s, new
        return new

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self._s.chunk_tokens and self.arena._h is not None:
            self.abort_chunk()


# ---- RoPE and the CPU backend -------------------------------------------------------------------

class Rope:
    """RoPE parameters: mode "1d" (positions [n]) or "3d" (positions [n, 3] =
    frame, row, col, with a width per axis in dims; zeros = the default
    split, Wan's), style "half" or "interleaved", theta (0 = 10000).

    The style is the model family's: Wan (and CausVid / Self-Forcing on it)
    rotates adjacent channel pairs as complex numbers in its rope_apply:
    style="interleaved"; Llama and Hugging Face models rotate the first half
    against the second (rotate_half): style="half". apply() returns a
    rotated copy; apply_() rotates in place."""

    def __init__(self, mode: Choice = "1d", style: Choice = "half", theta: float = 0.0,
                 dims: Sequence[int] = (0, 0, 0)):
        dims = tuple(dims) + (0,) * (3 - len(dims))
        self._s = mskv_rope(_enum(ROPE_STYLES, style, "style"), _enum(POS_MODES, mode, "mode"), theta, dims)

    mode = property(lambda self: self._s.mode)
    style = property(lambda self: _name(ROPE_STYLES, self._s.style))

    def _check(self, x, positions):
        xb = _tensors.check(x, "x", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=(None, None, None),
                            layout="[n][heads][head_dim]", writable=True)
        n = xb.shape[0]
        pshape = (n, 3) if self._s.mode == 2 else (n,)
        pb = _tensors.check(positions, "positions", device="cpu", dtypes=("i32",), shape=pshape)
        return xb, pb

    def apply_(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotates x [n][heads][head_dim] (f32, f16, bf16: a torch bf16
        tensor or uint16 bits) in place at int32 positions ([n], or [n, 3]
        frame/row/col for "3d") and returns x (PyTorch's `_` convention)."""
        xb, pb = self._check(x, positions)
        _check(_ffi.lib.mskv_rope_apply(byref(self._s), xb.ptr, dtype_code(_tensors._kernel_dtype(xb.dtype)),
                                        xb.shape[0], xb.shape[1], xb.shape[2], pb.ptr), "mskv_rope_apply")
        return x

    def apply(self, x: Tensor, positions: Tensor) -> Tensor:
        """x rotated, as a new array or tensor of x's type and dtype; x is
        not changed (apply_ rotates in place). The rotation is the one
        write_kv(rope=...) gives K, so q and k rotated alike meet."""
        _tensors.check(x, "x", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=(None, None, None),
                       layout="[n][heads][head_dim]")
        from . import _torchio
        y = _torchio.copy_of(x)
        self._check(y, positions)   # positions checked before anything is written
        return self.apply_(y, positions)


def _attn_struct(q_heads, dtype, mask, window_left, scale):
    return mskv_attn(q_heads, scale, _enum(MASKS, mask, "mask"), window_left, dtype_code(dtype))


def _attention_args(plan, q, out, lse, kv_heads, head_dim):
    shape, layout = (plan.total_q, None, head_dim), "[total_q][q_heads][head_dim]"
    qb = _tensors.check(q, "q", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=shape, layout=layout)
    q_heads = qb.shape[1]
    if kv_heads and q_heads % kv_heads:
        raise TensorError("q: %d heads is not a multiple of the %d kv heads" % (q_heads, kv_heads))
    kdt = _tensors._kernel_dtype(qb.dtype)
    from . import _torchio
    if out is None:   # the result takes q's type, device and dtype
        out = _torchio.empty_like(q, qb.shape)
    ob = _tensors.check(out, "out", device="cpu", dtypes=(qb.dtype,) if kdt != "bf16" else ("bf16", "u16"),
                        shape=qb.shape, layout=layout, writable=True)
    if _tensors.overlaps(ob, qb):
        raise TensorError("out: overlaps q; the call needs separate memory")
    lb = None
    if lse is True:
        lse = _torchio.empty_like(q, (plan.total_q, q_heads), "f32")
    if lse is not None and lse is not False:
        lb = _tensors.check(lse, "lse", device="cpu", dtypes=("f32",), shape=(plan.total_q, q_heads),
                            layout="[total_q][q_heads]", writable=True)
    else:
        lse = None
    return qb, ob, lb, out, lse, kdt


def default_threads() -> int:
    """The CPU backend's default thread count: torch.get_num_threads() when
    torch is already imported (so the two pools agree), else os.cpu_count()."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return max(1, int(torch.get_num_threads()))
    return max(1, os.cpu_count() or 1)


class Cpu:
    """The CPU backend's thread pool and scratch (mskv_cpu). num_threads
    None (the default): default_threads(), i.e. torch.get_num_threads()
    when torch is imported, else os.cpu_count(); 0 or 1: the caller's
    thread only. A context manager; close() frees it."""

    def __init__(self, num_threads: Optional[int] = None, workspace_bytes: int = 0) -> None:
        if num_threads is None:
            num_threads = default_threads()
        self._num_threads = num_threads
        d = mskv_cpu_desc()
        d.num_threads, d.workspace_bytes = num_threads, workspace_bytes
        out = ctypes.c_void_p()
        _check(_ffi.lib.mskv_cpu_create(byref(d), byref(out)), "mskv_cpu_create")
        self._h = _Owned(out.value, _ffi.lib.mskv_cpu_destroy)

    num_threads = property(lambda self: self._num_threads)   # what the pool was made with (read-only)

    def close(self) -> None:
        """Stops the threads and frees the scratch (mskv_cpu_destroy)."""
        if self._h is not None:
            self._h.release()
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def ptr(self) -> int:
        """The C pool's address (MskvError once closed)."""
        if self._h is None:
            raise MskvError("the CPU backend is closed")
        return self._h.ptr

    def attention(self, arena: Arena, layer: int, plan: Plan, q: Tensor, out: Optional[Tensor] = None,
                  lse: Union[bool, Tensor, None] = None, mask: Choice = "none", window_left: int = 0,
                  scale: float = 0.0) -> Any:
        """mstar_kv.attention on this pool's threads."""
        return attention(arena, layer, plan, q, out, lse, mask, window_left, scale, cpu=self)

    def attention_dense(self, view: "PrefixView", layer: int, plan: Plan, q: Tensor, out: Optional[Tensor] = None,
                        lse: Union[bool, Tensor, None] = None, mask: Choice = "none", window_left: int = 0,
                        scale: float = 0.0) -> Any:
        """mstar_kv.attention_dense on this pool's threads."""
        return attention_dense(view, layer, plan, q, out, lse, mask, window_left, scale, cpu=self)


def attention(arena: Arena, layer: int, plan: Plan, q: Tensor, out: Optional[Tensor] = None,
              lse: Union[bool, Tensor, None] = None, mask: Choice = "none", window_left: int = 0,
              scale: float = 0.0, cpu: Optional[Cpu] = None) -> Any:
    """Paged attention over plan for one layer of arena's host pools.
    q: [total_q][q_heads][head_dim] (f32, f16, bf16 as uint16); out: same (new
    if None); lse: True for a new [total_q][q_heads] f32 array, or one to fill.
    Returns out, or (out, lse) when lse is asked for."""
    info = arena._info
    qb, ob, lb, out, lse_arr, kdt = _attention_args(plan, q, out, lse, info.kv_heads, info.head_dim)
    a = _attn_struct(qb.shape[1], kdt, mask, window_left, scale)
    arena._call("mskv_cpu_attention", cpu.ptr if cpu is not None else None, arena.ptr, layer, byref(plan._s),
                byref(a), qb.ptr, ob.ptr, lb.ptr if lb else None)
    return (out, lse_arr) if lse_arr is not None else out


class PrefixView:
    """A request's protected prefix gathered into contiguous K/V
    (mskv_prefix_view): k and v are NumPy arrays [num_layers][cap_tokens]
    [kv_heads][head_dim] in the store's dtype (bf16 as uint16) owned by the
    view. gather() fills them and tags the view with the request's
    prefix_epoch; after the prefix changed (another length, a reload onto
    other pages, an import) check() and attention_dense raise
    StaleViewError until gather() refreshes it in place. (The GPU's
    device-buffer view is CudaStore.prefix_view.) arena, request, k and v
    are read-only: the C view writes into k and v (its struct owns them)."""

    def __init__(self, arena: Arena, request: Request, cap_tokens: int, group: int = 0, _s=None, _k=None, _v=None):
        self._arena, self._request = arena, request
        if _s is not None:   # the device view: its buffers are the caller's tensors (pinned by _s)
            self._s, self._k, self._v = _s, _k, _v
            return
        i = arena._info
        s = self._s = _ffi.mskv_prefix_view()
        s.request.id, s.group, s.cap_tokens = request.id, group, cap_tokens   # checked (>= 0) before allocating
        shape = (i.num_layers, cap_tokens, i.kv_heads, i.head_dim)
        self._k = np.zeros(shape, dtype=_NP_DTYPE[i.dtype])
        self._v = np.zeros(shape, dtype=_NP_DTYPE[i.dtype])
        s.k, s.v = self._k, self._v   # the struct keeps the arrays it points into

    arena = property(lambda self: self._arena)
    request = property(lambda self: self._request)
    k = property(lambda self: self._k)
    v = property(lambda self: self._v)

    tokens = property(lambda self: self._s.tokens)        # the prefix gathered: tokens [0, tokens)
    epoch = property(lambda self: self._s.epoch)          # its prefix_epoch; 0: never gathered (or a failed refresh)
    cap_tokens = property(lambda self: self._s.cap_tokens)
    device = property(lambda self: bool(self._s.device))

    def gather(self) -> "PrefixView":
        """Gathers (or refreshes, in place) the prefix of every layer; returns self."""
        store = getattr(self, "_store", None)
        if store is not None:
            store._call("mskv_cuda_prefix_view_gather", store.ptr, byref(self._s))
        else:
            self.arena._call("mskv_prefix_view_gather", self.arena.ptr, byref(self._s))
        return self

    def check(self) -> None:
        """StaleViewError when the request's prefix moved since the gather."""
        self.arena._call("mskv_prefix_view_check", self.arena.ptr, byref(self._s))

    @property
    def current(self) -> bool:
        """Whether the view still holds the request's prefix (check() without raising)."""
        return _ffi.lib.mskv_prefix_view_check(self.arena.ptr, byref(self._s)) == 0

    def _dense(self, layer):
        kv = _ffi.mskv_dense_kv()
        _check(_ffi.lib.mskv_prefix_view_layer(byref(self._s), self.arena.ptr, layer, byref(kv)),
               "mskv_prefix_view_layer")
        kv.view = self._s   # kv points into the view's buffers: it keeps them
        return kv

    def layer(self, layer: int) -> Tuple[np.ndarray, np.ndarray]:
        """(k, v) of one layer: views [tokens][kv_heads][head_dim] into the buffers."""
        if self._s.device:
            raise ValueError("layer: a device view's buffers are the tensors it was given")
        self._dense(layer)   # the checks: gathered, layer in range
        return self.k[layer, :self.tokens], self.v[layer, :self.tokens]


def attention_dense(view: PrefixView, layer: int, plan: Plan, q: Tensor, out: Optional[Tensor] = None,
                    lse: Union[bool, Tensor, None] = None, mask: Choice = "none", window_left: int = 0,
                    scale: float = 0.0, cpu: Optional[Cpu] = None) -> Any:
    """Attention over a PrefixView's layer (a "prefix" plan, or any plan
    whose kv_token_indptr rows the view holds), on the CPU: the same masks,
    q_pos, results as attention(). StaleViewError when the view's epoch is no
    longer the request's. Returns out, or (out, lse)."""
    kv = view._dense(layer)
    qb, ob, lb, out, lse_arr, kdt = _attention_args(plan, q, out, lse, kv.kv_heads, kv.head_dim)
    a = _attn_struct(qb.shape[1], kdt, mask, window_left, scale)
    _check(_ffi.lib.mskv_cpu_attention_dense(cpu.ptr if cpu is not None else None, byref(kv), byref(plan._s),
                                             byref(a), qb.ptr, ob.ptr, lb.ptr if lb else None),
           "mskv_cpu_attention_dense")
    return (out, lse_arr) if lse_arr is not None else out


def merge(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor, out: Optional[Tensor] = None,
          out_lse: Optional[Tensor] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Merges two partial attention results over disjoint key sets (f32
    [n][heads][head_dim] and [n][heads]) into their union; returns (o, lse).
    out / out_lse may be o_a, lse_a, o_b or lse_b."""
    ab = _tensors.check(o_a, "o_a", device="cpu", dtypes=("f32",), shape=(None, None, None),
                        layout="[n][heads][head_dim]")
    n, heads, dim = ab.shape
    shape3, shape2 = (n, heads, dim), (n, heads)
    bb = _tensors.check(o_b, "o_b", device="cpu", dtypes=("f32",), shape=shape3, layout="[n][heads][head_dim]")
    la = _tensors.check(lse_a, "lse_a", device="cpu", dtypes=("f32",), shape=shape2, layout="[n][heads]")
    lbb = _tensors.check(lse_b, "lse_b", device="cpu", dtypes=("f32",), shape=shape2, layout="[n][heads]")
    from . import _torchio
    out = _torchio.empty_like(o_a, shape3, "f32") if out is None else out
    out_lse = _torchio.empty_like(o_a, shape2, "f32") if out_lse is None else out_lse
    ob = _tensors.check(out, "out", device="cpu", dtypes=("f32",), shape=shape3, writable=True)
    olb = _tensors.check(out_lse, "out_lse", device="cpu", dtypes=("f32",), shape=shape2, writable=True)
    _check(_ffi.lib.mskv_cpu_merge(n, heads, dim, ab.ptr, la.ptr, bb.ptr, lbb.ptr, ob.ptr, olb.ptr),
           "mskv_cpu_merge")
    return out, out_lse


# ---- bf16 / f16 bits, as the library rounds them --------------------------------------------------

def to_bf16(x: Any) -> np.ndarray:
    """float32 values as bf16 bits (uint16), rounded to nearest even like the store."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def from_bf16(bits: Any) -> np.ndarray:
    """bf16 bits (uint16) as float32."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
