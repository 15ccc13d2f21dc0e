"""The host core and CPU backend of mstar_kv.h, with the C API's nouns:
Arena, Request, Plan, Session, plus the window arithmetic (Schedule,
Retention), RoPE and the CPU attention backend (Cpu)."""
import collections
import ctypes
import types
import weakref

import numpy as np

from . import _ffi, _tensors
from ._errors import MskvError, TensorError, error_for
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
_NP_DTYPE = {0: np.float32, 1: np.float16, 2: np.uint16}   # bf16 is seen as uint16 bits


def _enum(table, value, what):
    key = value.lower() if isinstance(value, str) else value
    if key in table:
        return table[key]
    if isinstance(value, int) and value in table.values():
        return value
    raise ValueError("%s: %r is not one of %s" % (what, value, ", ".join(table)))


def dtype_code(dtype):
    """'f32' / 'f16' / 'bf16', a NumPy dtype (uint16 means bf16) or a code."""
    if isinstance(dtype, str):
        return _enum(DTYPES, _DTYPE_ALIASES.get(dtype.lower(), dtype.lower()), "dtype")
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return _enum(DTYPES, dtype, "dtype")
    name = np.dtype(dtype).name
    return _enum(DTYPES, _DTYPE_ALIASES.get(name, name), "dtype")


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


class Arena:
    """An mskv_arena: pages, requests, plans; with num_layers > 0 also the
    host K/V pools the CPU backend reads and writes
    (2 * num_layers * num_pages * page_size * kv_heads * head_dim elements).

    Use it as a context manager, or call close(). Every failed call raises
    the MskvError subclass of its result code. on_event(Event) is called for
    page-stored / page-removed events with the arena's lock held: it must not
    call the arena."""

    def __init__(self, num_pages, page_size, num_layers=0, kv_heads=0, head_dim=0, dtype="f32",
                 max_requests=0, retire="immediate", on_event=None, debug=0, _desc=None, _keep=None):
        d = _desc if _desc is not None else mskv_arena_desc()
        if _desc is None:
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
    def ptr(self):
        if self._h is None or not self._h.ptr:
            raise MskvError("the arena is closed")
        return self._h.ptr

    def _call(self, function, *args):
        n = self._log_count
        code = getattr(_ffi.lib, function)(*args)
        if code != 0:
            raise error_for(code, function, self._log_last if self._log_count != n else "")

    def close(self):
        """Destroys the arena (pool views and sessions keep its memory until they are gone)."""
        # the last reference goes: destroyed now, or once the last pool view is gone
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- state
    def stats(self):
        s = mskv_arena_stats()
        self._call("mskv_arena_stats_get", self.ptr, byref(s))
        return _record(ArenaStats, s)

    def audit(self):
        """Checks every invariant; AuditFailedError says which one broke."""
        why = ctypes.create_string_buffer(512)
        code = _ffi.lib.mskv_arena_audit(self.ptr, why, len(why))
        _check(code, "mskv_arena_audit", why.value.decode(errors="replace"))

    def audit_bytes(self):
        """audit(), then the bytes the debug checks (debug=...) make checkable:
        free pages still poisoned, host copies still matching their checksums.
        AuditFailedError says which page; UnsupportedError without debug checks."""
        why = ctypes.create_string_buffer(512)
        code = _ffi.lib.mskv_arena_audit_bytes(self.ptr, why, len(why))
        _check(code, "mskv_arena_audit_bytes", why.value.decode(errors="replace"))

    def check_plan(self, plan):
        """StalePlanError when pages left one of the plan's requests since it was built."""
        self._call("mskv_plan_check", self.ptr, byref(plan._s))

    def digest(self):
        return _ffi.lib.mskv_arena_digest(self.ptr)

    def trim(self):
        _ffi.lib.mskv_arena_trim(self.ptr)

    def retire(self, completed):
        self._call("mskv_arena_retire", self.ptr, completed)

    @property
    def step(self):
        return _ffi.lib.mskv_arena_step(self.ptr)

    def store_info(self):
        s = mskv_store_info()
        self._call("mskv_store_info_get", self.ptr, byref(s))
        return _record(StoreInfo, s)

    def pool(self, layer, kind):
        """A zero-copy NumPy view of one host pool, [num_pages][page_size][kv_heads][head_dim]
        (kind "k"/0 or "v"/1; bf16 as uint16). None when the arena has no host pools."""
        k = {"k": 0, "v": 1}.get(kind, kind)
        if k not in (0, 1) or not 0 <= layer < self._info.num_layers:
            raise ValueError("pool: layer %r / kind %r out of range" % (layer, kind))
        ptr = _ffi.lib.mskv_store_pool(self.ptr, layer, k)
        if not ptr:
            return None
        i = self._info
        raw = (ctypes.c_char * i.pool_bytes).from_address(ptr)
        raw.owner = self._h          # the memory lives until the last view is gone
        return np.frombuffer(raw, dtype=_NP_DTYPE[i.dtype]).reshape(i.num_pages, i.page_size, i.kv_heads,
                                                                      i.head_dim)

    # -- requests
    def add_request(self):
        r = mskv_request()
        self._call("mskv_request_add", self.ptr, byref(r))
        return Request(self, r.id)

    def import_request(self, blob):
        """A new, offloaded request from an exported blob (bytes-like)."""
        buf = np.frombuffer(memoryview(blob).cast("B"), dtype=np.uint8)
        r = mskv_request()
        self._call("mskv_request_import", self.ptr, buf.ctypes.data, buf.size, byref(r))
        return Request(self, r.id)

    def keyed_create(self, key, n_tokens):
        """A keyed, write-once entry (e.g. text-encoder K/V) with n_tokens reserved."""
        r = mskv_request()
        self._call("mskv_keyed_create", self.ptr, key, n_tokens, byref(r))
        return Request(self, r.id)

    def keyed_find(self, key):
        r = mskv_request()
        self._call("mskv_keyed_find", self.ptr, key, byref(r))
        return Request(self, r.id)

    def keyed_remove(self, key):
        self._call("mskv_keyed_remove", self.ptr, key)

    # -- the step lifecycle
    def _segments(self, segments):
        segs = list(segments)
        arr = (mskv_segment * max(len(segs), 1))()
        for i, (req, n) in enumerate(segs):
            if not isinstance(req, Request) or req.arena is not self:
                raise ValueError("segment %d: %r is not a request of this arena" % (i, req))
            e = arr[i]
            e.request, e.n_tokens = req._c, n
        return arr, len(segs)

    def admit(self, segments):
        """Reserves every segment's tokens ((request, n_tokens) pairs), all or nothing."""
        self._call("mskv_admit", self.ptr, *self._segments(segments))

    def commit(self, segments):
        self._call("mskv_commit", self.ptr, *self._segments(segments))

    def admit_and_commit(self, segments):
        """mskv_step: admit then commit of the same segments in one call (one lock), the single-pass
        step whose tokens are never aborted. All or nothing, with admit's errors."""
        self._call("mskv_step", self.ptr, *self._segments(segments))

    def abort(self, segments):
        self._call("mskv_abort", self.ptr, *self._segments(segments))

    def publish(self, segments=()):
        """Ends the step (retention, events, fence); returns the fence that ended."""
        step = ctypes.c_uint64()
        self._call("mskv_publish", self.ptr, *self._segments(segments), byref(step))
        return step.value

    def _plan_desc(self, kind, cross, dense_kv_len, pos, pos_offset, grid, pad=None, exclude_prefix=False):
        d = mskv_plan_desc()
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

    def plan_query(self, segments, kind="self", cross=None, dense_kv_len=None, pos="none", pos_offset=0,
                   grid=None, pad=None, exclude_prefix=False):
        """(batch, total_q, num_page_ids) a plan of these segments needs."""
        d, keep = self._plan_desc(kind, cross, dense_kv_len, pos, pos_offset, grid, pad, exclude_prefix)
        out = mskv_plan_size()
        self._call("mskv_plan_query", self.ptr, *self._segments(segments), byref(d), byref(out))
        del keep
        return out.batch, out.total_q, out.num_page_ids

    def plan_build(self, segments, plan, kind="self", cross=None, dense_kv_len=None, pos="none",
                   pos_offset=0, grid=None, pad=None, exclude_prefix=False):
        """Fills plan (a Plan) for these segments; returns it. pad: (batch,
        tokens, qo_len, kv_len) of a captured CUDA graph's step, planned into
        that shape (mskv_plan_desc.pad_*); CapacityError if it does not fit.
        kind "prefix" attends over a PrefixView; exclude_prefix (kind "self")
        hides the protected prefix, so the two merged give the whole."""
        d, keep = self._plan_desc(kind, cross, dense_kv_len, pos, pos_offset, grid, pad, exclude_prefix)
        self._call("mskv_plan_build", self.ptr, *self._segments(segments), byref(d), byref(plan._s))
        del keep
        plan._pos_mode = d.pos_mode
        return plan

    # -- CPU backend on this arena's host pools
    def write_kv(self, layer, plan, k, v, rope=None):
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

    def session(self, request, retention):
        return Session(self, request, retention)


class Request:
    """A request handle (one KV stream) of an arena."""
    __slots__ = ("_arena", "_id", "_c", "__weakref__")

    def __init__(self, arena, id):
        self._arena, self._id = arena, id
        self._c = mskv_request(id)   # checked once: the handle as C takes it (passed by value)

    # read-only: a handle is hashed by both
    arena = property(lambda self: self._arena)
    id = property(lambda self: self._id)

    def __repr__(self):
        return "Request(id=0x%x)" % self.id

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

    def info(self):
        s = mskv_request_info()
        self._call("mskv_request_info_get", byref(s))
        return _record(RequestInfo, s)

    def remove(self):
        self._call("mskv_request_remove")

    def fork(self):
        child = mskv_request()
        self._call("mskv_request_fork", byref(child))
        return Request(self.arena, child.id)

    def pause(self):
        self._call("mskv_request_pause")

    def resume(self):
        self._call("mskv_request_resume")

    def reserve(self, tokens):
        self._call("mskv_request_reserve", tokens)

    def pages(self):
        """The page table, [prefix pages][live pages], as a new int32 array."""
        count = ctypes.c_int32()
        code = _ffi.lib.mskv_request_pages(self._arena.ptr, self._c, None, 0, byref(count))
        if code not in (0, _CAPACITY):
            _check(code, "mskv_request_pages")
        out = np.zeros(count.value, dtype=np.int32)
        self._call("mskv_request_pages", out.ctypes.data, out.size, byref(count))
        return out

    def protect_prefix(self, n):
        self._call("mskv_request_protect_prefix", n)

    def prefix_view(self, cap_tokens, group=0):
        """A PrefixView of this request's protected prefix with host buffers
        for cap_tokens tokens per layer (not gathered yet: call gather())."""
        return PrefixView(self.arena, self, cap_tokens, group)

    def release_oldest(self, n):
        """Releases the n oldest tokens still visible: n counts on from the previous release point (repeated small releases add up); pages go only when whole. Returns the tokens freed."""
        released = ctypes.c_int64()
        self._call("mskv_request_release_oldest", n, byref(released))
        return released.value

    def slot(self, pos):
        s = ctypes.c_int64()
        self._call("mskv_request_slot", pos, byref(s))
        return s.value

    def set_retention(self, retention):
        self._call("mskv_request_set_retention", byref(retention._s) if retention is not None else None)

    def offload(self):
        self._call("mskv_request_offload")

    def reload(self):
        self._call("mskv_request_reload")

    def export(self):
        """The request as a versioned, checksummed blob (bytes)."""
        size = ctypes.c_size_t()
        code = _ffi.lib.mskv_request_export(self.arena.ptr, self._h, None, 0, byref(size))
        if code not in (0, _CAPACITY):
            _check(code, "mskv_request_export")
        buf = ctypes.create_string_buffer(size.value)
        self._call("mskv_request_export", buf, size.value, byref(size))
        return buf.raw[:size.value]

    def seal(self):
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

    def __init__(self, cap_batch, cap_tokens, cap_page_ids):
        self._s = mskv_plan()
        # checked first (int32_t, >= 0), before anything is allocated from them
        self._s.cap_batch, self._s.cap_tokens, self._s.cap_page_ids = cap_batch, cap_tokens, cap_page_ids
        buffers = {}
        for name, dt, length in _PLAN_ARRAYS:
            a = np.zeros(max(length(cap_batch, cap_tokens, cap_page_ids), 1), dtype=dt)
            setattr(self._s, name, a)   # the struct keeps the array it points into
            a.flags.writeable = False   # the plan is the library's output
            buffers[name] = a
        self._buffers = types.MappingProxyType(buffers)
        self._pos_mode = 0

    # read-only: the C struct points into these arrays, so none can be rebound or dropped
    buffers = property(lambda self: self._buffers)
    pos_mode = property(lambda self: self._pos_mode)   # what the last build planned positions for

    batch = property(lambda self: self._s.batch)
    total_q = property(lambda self: self._s.total_q)
    num_page_ids = property(lambda self: self._s.num_page_ids)
    page_size = property(lambda self: self._s.page_size)
    step = property(lambda self: self._s.step)
    capacity = property(lambda self: (self._s.cap_batch, self._s.cap_tokens, self._s.cap_page_ids))
    pad_segments = property(lambda self: self._s.pad_segments)   # trailing padding segments (plan_build pad=)

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
    features = property(lambda self: self._s.features)

    @property
    def positions(self):
        """[total_q] (1-D) or [total_q, 3] (3-D: frame, row, col); empty without a position plan."""
        if self.pos_mode == 2:
            return self._part("positions", 3 * self.total_q).reshape(self.total_q, 3)
        return self._part("positions", self.total_q if self.pos_mode == 1 else 0)

    def _need_positions(self, mode):
        if self.pos_mode != mode:
            raise ValueError("rope: the plan was built with pos=%r, the rope needs %r"
                             % (_name(POS_MODES, self.pos_mode), _name(POS_MODES, mode)))

    def validate(self, num_pages):
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

    def __init__(self, total, window, overlap=0):
        self._s = mskv_schedule()
        _check(_ffi.lib.mskv_schedule_init(byref(self._s), total, window, overlap), "mskv_schedule_init")

    total = property(lambda self: self._s.total)
    window_size = property(lambda self: self._s.window)
    overlap = property(lambda self: self._s.overlap)
    stride = property(lambda self: self._s.stride)
    count = property(lambda self: self._s.count)

    def __len__(self):
        return self._s.count

    def window(self, k):
        w = mskv_window()
        _check(_ffi.lib.mskv_schedule_window(byref(self._s), k, byref(w)), "mskv_schedule_window")
        return _record(Window, w)

    def __iter__(self):
        return (self.window(k) for k in range(self.count))

    def decode_span(self, k, ctx):
        d = mskv_decode_span()
        _check(_ffi.lib.mskv_schedule_decode_span(byref(self._s), k, ctx, byref(d)),
               "mskv_schedule_decode_span")
        return _record(DecodeSpan, d)


class Retention:
    """Chunk-window retention: keep sink_chunks leading chunks and the last
    window_chunks chunks (or drop everything past the sink at each boundary)."""

    def __init__(self, chunk_size, sink_chunks=0, window_chunks=0, window_tokens=0, reset_at_boundary=False,
                 exact=False):
        self._s = mskv_retention(chunk_size, sink_chunks, window_chunks, window_tokens,
                                 int(bool(reset_at_boundary)), int(bool(exact)))

    def __getattr__(self, name):
        if name != "_s" and name in dict(mskv_retention._fields_):
            return getattr(self._s, name)
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name in dict(mskv_retention._fields_):
            raise AttributeError("Retention.%s is read-only (a session copied the policy; make a new Retention)" % name)
        object.__setattr__(self, name, value)

    def __repr__(self):
        return "Retention(%s)" % ", ".join("%s=%r" % (f, getattr(self._s, f)) for f, _ in mskv_retention._fields_)

    def validate(self, page_size=0):
        """InvalidSpecError with the reason unless the policy is valid (for this page size)."""
        why = ctypes.create_string_buffer(256)
        code = _ffi.lib.mskv_retention_validate(byref(self._s), page_size, why, len(why))
        _check(code, "mskv_retention_validate", why.value.decode(errors="replace"))

    def skipped_tokens(self, num_computed):
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

    def __init__(self, arena, request, retention):
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

    def begin_chunk(self, n_tokens):
        self.arena._call("mskv_session_begin_chunk", self._open(), n_tokens)

    def plan(self, plan, pos="none", pos_offset=0, grid=None):
        d, _ = self.arena._plan_desc("self", None, None, pos, pos_offset, grid)
        self.arena._call("mskv_session_plan", self._open(), byref(d), byref(plan._s))
        plan._pos_mode = d.pos_mode
        return plan

    def commit_chunk(self):
        step = ctypes.c_uint64()
        self.arena._call("mskv_session_commit_chunk", self._open(), byref(step))
        return step.value

    def abort_chunk(self):
        self.arena._call("mskv_session_abort_chunk", self._open())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self._s.chunk_tokens and self.arena._h is not None:
            self.abort_chunk()


# ---- RoPE and the CPU backend -------------------------------------------------------------------

class Rope:
    """RoPE parameters: mode "1d" (positions [n]) or "3d" (positions [n, 3] =
    frame, row, col, with a width per axis in dims; zeros = the default
    split), style "half" or "interleaved", theta (0 = 10000)."""

    def __init__(self, mode="1d", style="half", theta=0.0, dims=(0, 0, 0)):
        dims = tuple(dims) + (0,) * (3 - len(dims))
        self._s = mskv_rope(_enum(ROPE_STYLES, style, "style"), _enum(POS_MODES, mode, "mode"), theta, dims)

    mode = property(lambda self: self._s.mode)

    def apply(self, x, positions):
        """Rotates x [n][heads][head_dim] (f32, f16, bf16 as uint16) in place."""
        xb = _tensors.check(x, "x", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=(None, None, None),
                            layout="[n][heads][head_dim]", writable=True)
        n = xb.shape[0]
        pshape = (n, 3) if self._s.mode == 2 else (n,)
        pb = _tensors.check(positions, "positions", device="cpu", dtypes=("i32",), shape=pshape)
        _check(_ffi.lib.mskv_rope_apply(byref(self._s), xb.ptr, dtype_code(_tensors._kernel_dtype(xb.dtype)),
                                        n, xb.shape[1], xb.shape[2], pb.ptr), "mskv_rope_apply")
        return x


def _attn_struct(q_heads, dtype, mask, window_left, scale):
    return mskv_attn(q_heads, scale, _enum(MASKS, mask, "mask"), window_left, dtype_code(dtype))


def _attention_args(plan, q, out, lse, kv_heads, head_dim):
    shape, layout = (plan.total_q, None, head_dim), "[total_q][q_heads][head_dim]"
    qb = _tensors.check(q, "q", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=shape, layout=layout)
    q_heads = qb.shape[1]
    if kv_heads and q_heads % kv_heads:
        raise TensorError("q: %d heads is not a multiple of the %d kv heads" % (q_heads, kv_heads))
    kdt = _tensors._kernel_dtype(qb.dtype)
    if out is None:
        out = np.empty(qb.shape, dtype={"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[kdt])
    ob = _tensors.check(out, "out", device="cpu", dtypes=(qb.dtype,) if kdt != "bf16" else ("bf16", "u16"),
                        shape=qb.shape, layout=layout, writable=True)
    if _tensors.overlaps(ob, qb):
        raise TensorError("out: overlaps q; the call needs separate memory")
    lb = None
    if lse is True:
        lse = np.empty((plan.total_q, q_heads), dtype=np.float32)
    if lse is not None and lse is not False:
        lb = _tensors.check(lse, "lse", device="cpu", dtypes=("f32",), shape=(plan.total_q, q_heads),
                            layout="[total_q][q_heads]", writable=True)
    else:
        lse = None
    return qb, ob, lb, out, lse, kdt


class Cpu:
    """The CPU backend's thread pool and scratch (mskv_cpu). num_threads 0 or
    1: the caller's thread only. A context manager; close() frees it."""

    def __init__(self, num_threads=0, workspace_bytes=0):
        d = mskv_cpu_desc()
        d.num_threads, d.workspace_bytes = num_threads, workspace_bytes
        out = ctypes.c_void_p()
        _check(_ffi.lib.mskv_cpu_create(byref(d), byref(out)), "mskv_cpu_create")
        self._h = _Owned(out.value, _ffi.lib.mskv_cpu_destroy)

    def close(self):
        if self._h is not None:
            self._h.release()
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def ptr(self):
        if self._h is None:
            raise MskvError("the CPU backend is closed")
        return self._h.ptr

    def attention(self, arena, layer, plan, q, out=None, lse=None, mask="none", window_left=0, scale=0.0):
        return attention(arena, layer, plan, q, out, lse, mask, window_left, scale, cpu=self)

    def attention_dense(self, view, layer, plan, q, out=None, lse=None, mask="none", window_left=0, scale=0.0):
        return attention_dense(view, layer, plan, q, out, lse, mask, window_left, scale, cpu=self)


def attention(arena, layer, plan, q, out=None, lse=None, mask="none", window_left=0, scale=0.0, cpu=None):
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

    def __init__(self, arena, request, cap_tokens, group=0, _s=None, _k=None, _v=None):
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

    def gather(self):
        """Gathers (or refreshes, in place) the prefix of every layer; returns self."""
        store = getattr(self, "_store", None)
        if store is not None:
            store._call("mskv_cuda_prefix_view_gather", store.ptr, byref(self._s))
        else:
            self.arena._call("mskv_prefix_view_gather", self.arena.ptr, byref(self._s))
        return self

    def check(self):
        """StaleViewError when the request's prefix moved since the gather."""
        self.arena._call("mskv_prefix_view_check", self.arena.ptr, byref(self._s))

    @property
    def current(self):
        return _ffi.lib.mskv_prefix_view_check(self.arena.ptr, byref(self._s)) == 0

    def _dense(self, layer):
        kv = _ffi.mskv_dense_kv()
        _check(_ffi.lib.mskv_prefix_view_layer(byref(self._s), self.arena.ptr, layer, byref(kv)),
               "mskv_prefix_view_layer")
        kv.view = self._s   # kv points into the view's buffers: it keeps them
        return kv

    def layer(self, layer):
        """(k, v) of one layer: views [tokens][kv_heads][head_dim] into the buffers."""
        if self._s.device:
            raise ValueError("layer: a device view's buffers are the tensors it was given")
        self._dense(layer)   # the checks: gathered, layer in range
        return self.k[layer, :self.tokens], self.v[layer, :self.tokens]


def attention_dense(view, layer, plan, q, out=None, lse=None, mask="none", window_left=0, scale=0.0, cpu=None):
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


def merge(o_a, lse_a, o_b, lse_b, out=None, out_lse=None):
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
    out = np.empty(shape3, np.float32) if out is None else out
    out_lse = np.empty(shape2, np.float32) if out_lse is None else out_lse
    ob = _tensors.check(out, "out", device="cpu", dtypes=("f32",), shape=shape3, writable=True)
    olb = _tensors.check(out_lse, "out_lse", device="cpu", dtypes=("f32",), shape=shape2, writable=True)
    _check(_ffi.lib.mskv_cpu_merge(n, heads, dim, ab.ptr, la.ptr, bb.ptr, lbb.ptr, ob.ptr, olb.ptr),
           "mskv_cpu_merge")
    return out, out_lse


# ---- bf16 / f16 bits, as the library rounds them --------------------------------------------------

def to_bf16(x):
    """float32 values as bf16 bits (uint16), rounded to nearest even like the store."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def from_bf16(bits):
    """bf16 bits (uint16) as float32."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
