"""Scheduling and layer groups (mstar_kv.h's >>scheduling part and the calls
around it): lockstep groups (classifier-free guidance), preemption
(make_room, admit_query), keyed scratch entries, arena reset / flush, the
rank check of one-process-per-GPU runs, layer groups (the *_in_group calls),
position shifts, and the full plan descriptor (PlanDesc: group, explicit
positions, visibility).

The methods here are Arena's and Request's (mixins of those classes); the
classes are LockstepGroup, RequestGroup and PlanDesc."""
import ctypes
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core, _ffi, _stream
from ._enums import PlanKind, PosMode, Visibility
from ._errors import error_for
from ._ffi import mskv_lockstep, mskv_request, mskv_request_info, mskv_segment

byref = ctypes.byref
_ALLREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32)
_CAPACITY = -7


def _int(value, name):
    """value as an int, or TypeError naming the parameter."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    return value.__index__()


class ArenaScheduling:
    """Arena methods: lockstep groups, preemption, scratch entries, reset,
    flush, the rank check, layer groups."""
    __slots__ = ()

    @property
    def num_groups(self) -> int:
        """Layer groups of the arena (mskv_arena_desc.num_groups; 1 unless made with more)."""
        return max(1, getattr(self, "_num_groups", 0))

    def lockstep(self, members: "Sequence[_core.Request]") -> "LockstepGroup":
        """Binds 2..16 requests, in this order, into a lockstep group
        (mskv_lockstep_create): admit, commit, abort and publish then take
        the group whole, and offload, reload, remove and release go through
        the group. E.g. the conditional and unconditional branches of
        classifier-free guidance."""
        members = list(members)
        arr = (mskv_request * max(len(members), 1))()
        for i, r in enumerate(members):
            if not isinstance(r, _core.Request) or r.arena is not self:
                raise TypeError("members[%d]: %r is not a Request of this arena" % (i, r))
            arr[i] = r._c
        out = mskv_lockstep()
        self._call("mskv_lockstep_create", self.ptr, arr, len(members), byref(out))
        return LockstepGroup(self, out.id)

    def admit_query(self, segments: "Sequence[Tuple[_core.Request, int]]") -> int:
        """The pages admit(segments) would take now, in every layer group
        (mskv_admit_query); nothing changes. What to ask make_room for."""
        pages = ctypes.c_int64()
        self._call("mskv_admit_query", self.ptr, *self._segments(segments), byref(pages))
        return pages.value

    def make_room(self, pages_needed: int, host_budget_bytes: Optional[int] = None,
                  batch: "Sequence[Tuple[_core.Request, int]]" = ()) -> "List[_core.Request]":
        """Frees at least pages_needed pages by offloading idle requests,
        least recently admitted first (mskv_make_room), all or nothing:
        OutOfPagesError when they cannot make room (nothing parked). Requests
        in batch (the step being admitted) are not parked. host_budget_bytes
        (None: no limit) bounds the host copies. Returns the parked requests
        in the order chosen (reload() brings each back)."""
        pages_needed = _int(pages_needed, "make_room: pages_needed")
        budget = (1 << 64) - 1 if host_budget_bytes is None else _int(host_budget_bytes, "make_room: host_budget_bytes")
        segs, n = self._segments(batch)
        count = ctypes.c_int32()
        info = self.stats()
        cap = max(info.requests, 1)
        parked = (mskv_request * cap)()
        self._call("mskv_make_room", self.ptr, pages_needed, budget, segs if n else None, n, parked, cap,
                   byref(count))
        return [_core.Request(self, parked[i].id) for i in range(count.value)]

    def scratch_create(self, key: int, cap_tokens: int) -> "_core.Request":
        """A keyed scratch entry (mskv_scratch_create): rewritable K/V for a
        short inner loop, up to cap_tokens tokens, dropped by
        Request.scratch_reset() at each step; found and removed by key like
        any keyed entry."""
        key = _int(key, "scratch_create: key")
        cap_tokens = _int(cap_tokens, "scratch_create: cap_tokens")
        r = mskv_request()
        self._call("mskv_scratch_create", self.ptr, key, cap_tokens, byref(r))
        return _core.Request(self, r.id)

    def reset(self) -> None:
        """Drops every request (keyed, offloaded, lockstep groups too) and
        returns every page (mskv_arena_reset): every handle is stale after.
        BadStateError while a streamed export or import is open."""
        self._call("mskv_arena_reset", self.ptr)

    def flush(self) -> None:
        """Makes every pending page free now (mskv_arena_flush): waits for the
        device with a device store; on the CPU the caller's word that its
        work is done."""
        self._call("mskv_arena_flush", self.ptr)

    def rank_check(self, step: int, allreduce: Optional[Callable[[np.ndarray], None]] = None) -> None:
        """Records (step, digest) of the arena and, with allreduce, compares
        every record since the last agreeing check across ranks
        (mskv_rank_check). allreduce(values) gets a NumPy uint64 array
        (4 * MSKV_RANK_STEPS values, the same count on every rank) and must
        replace each value by its minimum over all ranks, in place (an
        MPI_Allreduce with MPI_MIN, or torch.distributed.all_reduce with
        ReduceOp.MIN). DivergedError when ranks differ: its .first_divergent
        is the earliest step at which two ranks differ. CapacityError when
        records are full (record-only mode: check every MSKV_RANK_STEPS - 1 steps)."""
        step = _int(step, "rank_check: step")
        failure = []

        def call(user, values, count):
            try:
                allreduce(np.ctypeslib.as_array(values, shape=(count,)))
                return 0
            except BaseException as e:   # noqa: BLE001  (raised again after the C call)
                failure.append(e)
                return -86   # MSKV_ERROR_PEER: the collective failed
        fn = _ALLREDUCE_FN(call) if allreduce is not None else None
        first = ctypes.c_uint64()
        n = self._log_count
        code = _ffi.lib.mskv_rank_check(self.ptr, step, ctypes.cast(fn, ctypes.c_void_p).value if fn else None,
                                        None, byref(first))
        if failure:
            raise failure[0]
        if code != 0:
            e = error_for(code, "mskv_rank_check", self._log_last if self._log_count != n else "")
            e.first_divergent = first.value if code == _ffi.CONSTANTS["MSKV_ERROR_DIVERGED"] else None
            raise e


class RequestScheduling:
    """Request methods: scratch reset, position shifts, layer groups, prefix pages."""
    __slots__ = ()

    def scratch_reset(self) -> None:
        """Drops a scratch entry's tokens (mskv_scratch_reset); its pages go
        back (on their fence in fenced mode). BadStateError for a request that
        is not a scratch entry, ReservationPendingError with a step open."""
        self._call("mskv_scratch_reset")

    def shift_positions(self, delta: int) -> None:
        """Adds delta to the RoPE positions plans derive for this request
        (mskv_request_shift_positions; info().pos_shift). With a reservation
        open it applies at that reservation's commit (info().pos_shift_pending).
        Masks and slots stay on absolute positions."""
        self._call("mskv_request_shift_positions", _int(delta, "shift_positions: delta"))

    def group(self, group: int) -> "RequestGroup":
        """The request in one layer group (the mskv_request_*_in_group calls)."""
        return RequestGroup(self, _int(group, "group"))

    def prefix_pages(self, group: int = 0) -> "Tuple[np.ndarray, int, int]":
        """(pages, tokens, epoch) of the protected prefix in group, read
        together under the arena's lock (mskv_prefix_pages_get): what a
        gather of the prefix into one's own buffers needs."""
        group = _int(group, "prefix_pages: group")
        n, tokens, epoch = ctypes.c_int32(), ctypes.c_int64(), ctypes.c_uint64()
        a = self._arena
        code = _ffi.lib.mskv_prefix_pages_get(a.ptr, self._c, group, None, 0, byref(n), byref(tokens), byref(epoch))
        if code not in (0, _CAPACITY):
            a._call("mskv_prefix_pages_get", a.ptr, self._c, group, None, 0, byref(n), byref(tokens), byref(epoch))
        pages = np.zeros(n.value, dtype=np.int32)
        a._call("mskv_prefix_pages_get", a.ptr, self._c, group, pages.ctypes.data, pages.size, byref(n),
                byref(tokens), byref(epoch))
        return pages, tokens.value, epoch.value

    # -- streamed export (mstar_kv.h's streaming calls; see _stream.py)
    def export_begin(self) -> "_stream.ExportStream":
        """Begins a streamed export (mskv_request_export_begin): the blob's
        header and layout now, its page ranges read in place from the pools;
        the request is frozen until the stream's end(). A context manager."""
        return _stream.ExportStream(self)


class RequestGroup:
    """One layer group's view of a request: its page table, prefix,
    released window, epoch and retention (mskv_request_*_in_group)."""
    __slots__ = ("_request", "_group")

    def __init__(self, request: "_core.Request", group: int):
        self._request, self._group = request, group

    request = property(lambda self: self._request)
    index = property(lambda self: self._group)

    def __repr__(self) -> str:
        return "RequestGroup(request=0x%x, group=%d)" % (self._request.id, self._group)

    def _call(self, function, *args):
        self._request._call(function, self._group, *args)

    def info(self) -> "_core.RequestInfo":
        """mskv_request_info_in_group: tokens, and this group's prefix, window, pages, kv_len and epoch."""
        s = mskv_request_info()
        self._call("mskv_request_info_in_group", byref(s))
        return _core._record(_core.RequestInfo, s)._replace(location=_core.Location(s.location))

    def pages(self) -> np.ndarray:
        """This group's page table, [prefix pages][live pages], as a new int32 array."""
        a, r = self._request.arena, self._request
        count = ctypes.c_int32()
        code = _ffi.lib.mskv_request_pages_in_group(a.ptr, r._c, self._group, None, 0, byref(count))
        if code not in (0, _CAPACITY):
            self._call("mskv_request_pages_in_group", None, 0, byref(count))
        out = np.zeros(count.value, dtype=np.int32)
        self._call("mskv_request_pages_in_group", out.ctypes.data, out.size, byref(count))
        return out

    def slot(self, pos: int) -> int:
        """page * page_size + offset of absolute position pos in this group's table."""
        s = ctypes.c_int64()
        self._call("mskv_request_slot_in_group", _int(pos, "slot: pos"), byref(s))
        return s.value

    def protect_prefix(self, n: int) -> None:
        """Protects the first n committed tokens in this group."""
        self._call("mskv_request_protect_prefix_in_group", _int(n, "protect_prefix: n"))

    def release_oldest(self, n: int) -> int:
        """Releases the n oldest visible live tokens of this group; returns the tokens freed."""
        released = ctypes.c_int64()
        self._call("mskv_request_release_oldest_in_group", _int(n, "release_oldest: n"), byref(released))
        return released.value

    def set_retention(self, retention: "Optional[_core.Retention]") -> None:
        """Binds a retention policy to this group only (None clears it)."""
        if retention is not None and not isinstance(retention, _core.Retention):
            raise TypeError("set_retention: retention: expected a Retention or None, got %s"
                            % type(retention).__name__)
        self._call("mskv_request_set_retention_in_group", byref(retention._s) if retention is not None else None)

    def prefix_pages(self) -> "Tuple[np.ndarray, int, int]":
        """(pages, tokens, epoch) of this group's protected prefix."""
        return self._request.prefix_pages(self._group)


class LockstepGroup:
    """A lockstep group of an arena (mskv_lockstep): requests that move
    together. segments(n) gives the batch of one step (member i is the
    plan's segment i); offload, reload, remove and release_oldest act on
    every member, all or nothing."""
    __slots__ = ("_arena", "_id")

    def __init__(self, arena: "_core.Arena", id: int):
        self._arena, self._id = arena, id

    arena = property(lambda self: self._arena)
    id = property(lambda self: self._id)

    def __repr__(self) -> str:
        return "LockstepGroup(id=0x%x, members=%d)" % (self._id, len(self.members()))

    def _call(self, function, *args):
        a = self._arena
        a._call(function, a.ptr, mskv_lockstep(self._id), *args)

    def members(self) -> "List[_core.Request]":
        """The members, in order."""
        count = ctypes.c_int32()
        out = (mskv_request * _ffi.CONSTANTS["MSKV_MAX_LOCKSTEP"])()
        self._call("mskv_lockstep_members", out, len(out), byref(count))
        return [_core.Request(self._arena, out[i].id) for i in range(count.value)]

    def segments(self, n_tokens: int) -> "List[Tuple[_core.Request, int]]":
        """The batch of one step: (member, n_tokens) per member, in member
        order, for admit / plan_build / commit / publish."""
        n_tokens = _int(n_tokens, "segments: n_tokens")
        count = ctypes.c_int32()
        segs = (mskv_segment * _ffi.CONSTANTS["MSKV_MAX_LOCKSTEP"])()
        self._call("mskv_lockstep_segments", n_tokens, segs, len(segs), byref(count))
        return [(_core.Request(self._arena, segs[i].request.id), segs[i].n_tokens) for i in range(count.value)]

    def offload(self) -> None:
        """Offloads every member, all or nothing."""
        self._call("mskv_lockstep_offload")

    def reload(self) -> None:
        """Reloads every member, all or nothing (OutOfPagesError when they do not all fit)."""
        self._call("mskv_lockstep_reload")

    def remove(self) -> None:
        """Removes every member and the group."""
        self._call("mskv_lockstep_remove")

    def release_oldest(self, n: int, group: int = 0) -> int:
        """release_oldest(n) on every member's layer group, all or nothing;
        returns the tokens freed, summed over the members."""
        released = ctypes.c_int64()
        self._call("mskv_lockstep_release_oldest", _int(group, "release_oldest: group"),
                   _int(n, "release_oldest: n"), byref(released))
        return released.value

    def dissolve(self) -> None:
        """Unbinds the group; the members stay, now independent."""
        self._call("mskv_lockstep_dissolve")


class PlanDesc:
    """The whole mskv_plan_desc: what Arena.plan_build's keywords set, plus
    the layer group, explicit RoPE positions per segment and the visibility
    rule (exact windows, page-grained, or the caller's bounds).

    positions: None, or one entry per segment: None (derived as pos says)
    or int32 positions of its new tokens, [n_tokens] (1-D) or [n_tokens, 3]
    (3-D). vis_sink_end / vis_window_start: per-segment bounds for
    visibility "caller". build() and query() run mskv_plan_build /
    mskv_plan_query on an arena; build_session() runs mskv_session_plan."""

    def __init__(self, kind: Union[str, int] = "self", *, cross: "Optional[_core.Request]" = None,
                 dense_kv_len: Optional[Sequence[int]] = None, pos: Union[str, int] = "none", pos_offset: int = 0,
                 grid: Optional[Tuple[int, int]] = None, group: int = 0,
                 positions: Optional[Sequence[Optional[np.ndarray]]] = None,
                 visibility: Union[str, int, None] = None, vis_sink_end: Optional[Sequence[int]] = None,
                 vis_window_start: Optional[Sequence[int]] = None, exclude_prefix: bool = False,
                 pad: Optional[Tuple[int, int, int, int]] = None):
        if cross is not None and not isinstance(cross, _core.Request):
            raise TypeError("PlanDesc: cross: expected a Request (a sealed keyed entry), got %s" % type(cross).__name__)
        self.kind = PlanKind.parse(kind, "kind")
        self.cross, self.pos, self.pos_offset = cross, PosMode.parse(pos, "pos"), _int(pos_offset, "pos_offset")
        self.dense_kv_len, self.grid, self.group = dense_kv_len, grid, _int(group, "group")
        self.positions = None if positions is None else list(positions)
        self.visibility = None if visibility is None else Visibility.parse(visibility, "visibility")
        self.vis_sink_end, self.vis_window_start = vis_sink_end, vis_window_start
        self.exclude_prefix, self.pad = bool(exclude_prefix), pad

    def __repr__(self) -> str:
        return "PlanDesc(kind=%s, pos=%s, group=%d%s)" % (
            self.kind.name.lower(), self.pos.name.lower(), self.group,
            "" if self.visibility is None else ", visibility=%s" % self.visibility.name.lower())

    def _struct(self, arena, segments):
        d, keep = arena._plan_desc(int(self.kind), self.cross, self.dense_kv_len, int(self.pos), self.pos_offset,
                                   self.grid, self.pad, self.exclude_prefix)
        keep = [keep]
        d.group = self.group
        if self.visibility is not None:
            d.visibility = int(self.visibility)
        for name in ("vis_sink_end", "vis_window_start"):
            bounds = getattr(self, name)
            if bounds is not None:
                arr = np.ascontiguousarray(bounds, dtype=np.int64)
                if segments is not None and arr.shape != (len(segments),):
                    raise ValueError("PlanDesc: %s: %d bounds for %d segments" % (name, arr.size, len(segments)))
                setattr(d, name, arr)
        if self.positions is not None:
            if segments is not None and len(self.positions) != len(segments):
                raise ValueError("PlanDesc: positions: %d entries for %d segments" % (len(self.positions),
                                                                                      len(segments)))
            per = 3 if self.pos == PosMode.POS_3D else 1
            ptrs = (ctypes.c_void_p * max(len(self.positions), 1))()
            for i, p in enumerate(self.positions):
                if p is None:
                    continue
                a = np.ascontiguousarray(p, dtype=np.int32).reshape(-1)
                if segments is not None:
                    n = segments[i][1]
                    if a.size != per * n:
                        raise ValueError("PlanDesc: positions[%d]: %d values; segment %d has %d tokens (%d each)"
                                         % (i, a.size, i, n, per))
                keep.append(a)
                ptrs[i] = a.ctypes.data
            keep.append(ptrs)
            d.positions = ptrs   # kept by d
        return d, keep

    def query(self, arena: "_core.Arena", segments: "Sequence[Tuple[_core.Request, int]]") -> Tuple[int, int, int]:
        """(batch, total_q, num_page_ids) a plan of these segments needs (mskv_plan_query)."""
        segments = list(segments)
        d, keep = self._struct(arena, segments)
        out = _ffi.mskv_plan_size()
        arena._call("mskv_plan_query", arena.ptr, *arena._segments(segments), byref(d), byref(out))
        del keep
        return out.batch, out.total_q, out.num_page_ids

    def build(self, arena: "_core.Arena", segments: "Sequence[Tuple[_core.Request, int]]",
              plan: "_core.Plan") -> "_core.Plan":
        """Fills plan for these segments with this description (mskv_plan_build); returns it."""
        if not isinstance(plan, _core.Plan):
            raise TypeError("build: plan: expected a Plan, got %s" % type(plan).__name__)
        segments = list(segments)
        d, keep = self._struct(arena, segments)
        arena._call("mskv_plan_build", arena.ptr, *arena._segments(segments), byref(d), byref(plan._s))
        del keep
        plan._pos_mode = d.pos_mode
        return plan

    def build_session(self, session: "_core.Session", plan: "_core.Plan") -> "_core.Plan":
        """The session's plan of its open chunk with this description (mskv_session_plan)."""
        if not isinstance(plan, _core.Plan):
            raise TypeError("build_session: plan: expected a Plan, got %s" % type(plan).__name__)
        n = session.chunk_tokens
        d, keep = self._struct(session.arena, [(session.request, n)])
        session.arena._call("mskv_session_plan", session._open(), byref(d), byref(plan._s))
        del keep
        plan._pos_mode = d.pos_mode
        return plan

