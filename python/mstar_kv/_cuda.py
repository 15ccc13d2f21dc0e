"""The GPU layer (mstar_kv_cuda.h): a context, a device store whose arena
keeps the page bookkeeping, and the launches, on device tensors.

Device tensors are PyTorch CUDA tensors, objects with __cuda_array_interface__
(CuPy, Numba, ...) or CUDA DLPack producers. When a call gets torch tensors,
it runs on torch's current stream (the store follows it with
mskv_cuda_store_set_stream), so it is ordered with the model's own kernels."""
from __future__ import annotations

import ctypes
import sys
import weakref
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from . import _ffi, _tensors
from ._closing import Closing
from ._core import DTYPES, POS_MODES, Arena, Plan, PrefixView, _attn_struct, _enum, _name, dtype_code
from ._types import Choice, Segments, Tensor
from ._errors import MskvError, TensorError, error_for
from ._ffi import mskv_arena_desc, mskv_cuda_desc, mskv_cuda_dplan, mskv_cuda_info, mskv_cuda_store_desc
from ._extras import CudaMemory, CudaStoreCopies
from ._graphs import CudaStoreGraphs

byref = ctypes.byref
STREAM_LEGACY = 1   # MSKV_CU_STREAM_LEGACY: the runtime's default stream (handle 0)


ATTN_PATHS = {"auto": 0, "mma": 1, "wgmma": 2}   # mskv_cuda_attn_path


def _desc(device, driver_path, nvrtc_path, cache_dir, disable_disk_cache, attn_path="auto"):
    d = mskv_cuda_desc()
    d.device = device
    d.driver_path = driver_path.encode() if driver_path else None
    d.nvrtc_path = nvrtc_path.encode() if nvrtc_path else None
    d.cache_dir = cache_dir.encode() if cache_dir else None
    d.disable_disk_cache = int(bool(disable_disk_cache))
    d.attn_path = _enum(ATTN_PATHS, attn_path, "attn_path")
    return d


def cuda_probe(device: int = 0, driver_path: Optional[str] = None, nvrtc_path: Optional[str] = None) -> Tuple[bool, str]:
    """(True, "") when a context could be created, else (False, what was tried)."""
    why = ctypes.create_string_buffer(1024)
    d = _desc(device, driver_path, nvrtc_path, None, False)
    code = _ffi.lib.mskv_cuda_probe(byref(d), why, len(why))
    return code == 0, why.value.decode(errors="replace")


class Cuda(CudaMemory, Closing):
    """A GPU context (mskv_cuda). CudaUnavailableError, with what was tried,
    on a machine without a driver, a device or NVRTC. attn_path: "auto" (the
    sm_90a kernel for prefill on compute capability 9.0), "mma" or "wgmma"
    (mskv_cuda_desc.attn_path); info()["wgmma"] says what auto runs."""

    def __init__(self, device: int = 0, driver_path: Optional[str] = None, nvrtc_path: Optional[str] = None,
                 cache_dir: Optional[str] = None, disable_disk_cache: bool = False, attn_path: Choice = "auto"):
        self._ptr, self._stores = None, weakref.WeakSet()
        self._d = _desc(device, driver_path, nvrtc_path, cache_dir, disable_disk_cache, attn_path)
        out = ctypes.c_void_p()
        code = _ffi.lib.mskv_cuda_create(byref(self._d), byref(out))
        if code != 0:
            ok, why = cuda_probe(device, driver_path, nvrtc_path)
            raise error_for(code, "mskv_cuda_create", why)
        self._ptr = out.value

    @property
    def ptr(self) -> int:
        """The context's address (MskvError once closed)."""
        if not self._ptr:
            raise MskvError("the CUDA context is closed")
        return self._ptr

    def _call(self, function, *args):
        code = getattr(_ffi.lib, function)(*args)
        if code != 0:
            raise error_for(code, function, (_ffi.lib.mskv_cuda_last_error(self.ptr) or b"").decode(errors="replace"))

    def info(self) -> Dict[str, Any]:
        """The device and compiler: name, compute capability, arch, versions, cache hits, self-tests (mskv_cuda_info_get)."""
        i = mskv_cuda_info()
        self._call("mskv_cuda_info_get", self.ptr, byref(i))
        return {f: (v.decode(errors="replace") if isinstance(v, bytes) else v)
                for f, v in ((f, getattr(i, f)) for f, _ in i._fields_)}

    def close(self) -> None:
        """Closes every store of this context, then the context."""
        for st in list(getattr(self, "_stores", ())):
            st.close()
        if getattr(self, "_ptr", None):
            _ffi.lib.mskv_cuda_destroy(self._ptr)
            self._ptr = None

    __del__ = close


def _torch_stream(bufs):
    """torch's current stream handle when an argument is a torch CUDA tensor, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for b in bufs:
        if b is not None and isinstance(b.keep, torch.Tensor):
            handle = torch.cuda.current_stream(b.keep.device).cuda_stream
            return handle or STREAM_LEGACY
    return None


class DevicePlan:
    """A plan uploaded into the store's fixed device buffers (same addresses
    every upload); the host Plan it came from gives the sizes (read-only)."""

    def __init__(self, plan: Plan, s: mskv_cuda_dplan, store: Optional["CudaStore"] = None):
        self._plan, self._s, self._store = plan, s, store

    plan = property(lambda self: self._plan)

    def torch(self, name: Optional[str] = None) -> Any:
        """The device buffers as CUDA torch tensors, no copy (one by name, or
        a dict of all): through __cuda_array_interface__, so they alias the
        store's fixed plan buffers and show what the next upload writes."""
        from . import _torchio
        return _torchio.dplan_tensors(self, self._store, name)

    def arrays(self) -> dict:
        """The device buffers as objects with __cuda_array_interface__ (for CuPy, Numba, torch.as_tensor)."""
        from . import _torchio
        return _torchio.dplan_arrays(self, self._store)

    def __getattr__(self, name):
        if name in dict(mskv_cuda_dplan._fields_):
            return getattr(self._s, name)
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name in dict(mskv_cuda_dplan._fields_):
            raise AttributeError("DevicePlan.%s is read-only (the device buffers hold what the upload wrote)" % name)
        object.__setattr__(self, name, value)


class CudaStore(CudaStoreGraphs, CudaStoreCopies):
    """A device K/V store (mskv_cuda_store): pools per layer (its own, or the
    caller's: pools=[(k0, v0), (k1, v1), ...], device tensors of shape
    [num_pages, page_size, kv_heads, head_dim] in the store's dtype, which the
    store adopts, zeroes and never frees), fixed plan buffers, a stream.
    arena() makes the arena bound to it."""

    def __init__(self, cuda: Cuda, num_pages: int, page_size: int, num_layers: int, kv_heads: int, head_dim: int,
                 dtype: Choice = "f16", pools: Optional[Sequence[Tuple[Tensor, Tensor]]] = None, max_batch: int = 0,
                 max_tokens: int = 0, max_page_ids: int = 0, staging_bytes: int = 0, plan_ring: int = 0):
        self._cuda, self._ptr, self._arenas = cuda, None, weakref.WeakSet()
        d = mskv_cuda_store_desc()
        d.num_pages, d.page_size, d.num_layers = num_pages, page_size, num_layers
        d.kv_heads, d.head_dim, d.dtype = kv_heads, head_dim, dtype_code(dtype)
        d.max_batch, d.max_tokens, d.max_page_ids = max_batch, max_tokens, max_page_ids
        d.staging_bytes, d.plan_ring = staging_bytes, plan_ring
        self._dtype = _name(DTYPES, d.dtype)
        self._pools, self._pool_ptrs = None, None
        if pools is not None:
            self._pools = self._check_pools(pools, d)
            self._pool_ptrs = (ctypes.c_uint64 * (2 * num_layers))(*[b.ptr for pair in self._pools for b in pair])
            d.pools = self._pool_ptrs   # kept by d
        out = ctypes.c_void_p()
        cuda._call("mskv_cuda_store_create", cuda.ptr, byref(d), byref(out))
        self._ptr = out.value
        self._stream = None
        self._desc = d
        cuda._stores.add(self)

    cuda = property(lambda self: self._cuda)   # the context the store lives in (read-only)

    @property
    def desc(self) -> mskv_cuda_store_desc:
        """A copy of the store's description (the shapes every call is checked against stay the store's)."""
        return mskv_cuda_store_desc.from_buffer_copy(self._desc)

    def _check_pools(self, pools, d):
        pools = list(pools)
        if len(pools) != d.num_layers:
            raise TensorError("pools: %d (k, v) pairs for %d layers" % (len(pools), d.num_layers))
        shape = (d.num_pages, d.page_size, d.kv_heads, d.head_dim)
        dts = (self._dtype, "u16") if self._dtype == "bf16" else (self._dtype,)
        out = []
        for i, (k, v) in enumerate(pools):
            out.append(tuple(_tensors.check(t, "pools[%d].%s" % (i, kind), device="cuda", dtypes=dts, shape=shape,
                                            layout="[num_pages][page_size][kv_heads][head_dim]", writable=True,
                                            align=16) for t, kind in ((k, "k"), (v, "v"))))
        return out

    @property
    def ptr(self) -> int:
        """The store's address (MskvError once closed)."""
        if not self._ptr:
            raise MskvError("the CUDA store is closed")
        return self._ptr

    def _call(self, function, *args):
        self.cuda._call(function, *args)

    def close(self) -> None:
        """Closes the store's graphs and arenas, then the store."""
        for g in list(getattr(self, "_graphs", ())):
            g.close()
        for a in list(getattr(self, "_arenas", ())):
            a.close()
        if getattr(self, "_ptr", None):
            _ffi.lib.mskv_cuda_store_destroy(self._ptr)
            self._ptr = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def backend(self) -> Any:
        """This store behind the one backend protocol (mstar_kv.CudaBackend):
        write_kv / attention / rope taking host plans, uploaded on demand."""
        from ._backend import CudaBackend
        return CudaBackend(self)

    def arena(self, max_requests: int = 0, on_event: Optional[Callable[[Any], None]] = None) -> Arena:
        """An Arena whose pages live in this store (fenced retirement, offload
        through pinned host copies), bound to it."""
        d = mskv_arena_desc()
        d.max_requests = max_requests
        self._call("mskv_cuda_store_arena_desc", self.ptr, byref(d))
        a = Arena(0, 0, on_event=on_event, _desc=d, _keep=self)
        self._call("mskv_cuda_store_bind", self.ptr, a.ptr)
        self._arenas.add(a)
        return a

    def pool(self, layer: int, kind: Union[str, int]) -> int:
        """The device address of a pool (kind "k"/0 or "v"/1)."""
        return _ffi.lib.mskv_cuda_store_pool(self.ptr, layer, {"k": 0, "v": 1}.get(kind, kind))

    @property
    def stream(self) -> int:
        """The stream handle the store runs on (0: its own)."""
        return _ffi.lib.mskv_cuda_store_stream(self.ptr) or 0

    def set_stream(self, stream: Any) -> None:
        """Runs on stream from now on: a handle (int), an object with
        .cuda_stream (a torch stream; its 0 means the default stream), or None
        for the store's own stream."""
        handle = getattr(stream, "cuda_stream", stream)
        if stream is not None and not handle:
            handle = STREAM_LEGACY
        self._call("mskv_cuda_store_set_stream", self.ptr, handle)
        self._stream = handle

    def _follow(self, *bufs):
        handle = _torch_stream(bufs)
        if handle is not None and handle != self._stream:
            self.set_stream(handle)

    def _device(self, obj, name, shape, layout, dtypes=None, writable=False, align=None):
        return _tensors.check(obj, name, device="cuda", dtypes=dtypes or _same(self._dtype), shape=shape,
                              layout=layout, writable=writable, align=align, stream=self._stream)

    def upload_plan(self, plan: Plan, pos: Optional[Choice] = None) -> DevicePlan:
        """Copies a host Plan into the store's fixed device buffers; pos
        (default: the plan's own position mode) says which positions go."""
        out = mskv_cuda_dplan()
        mode = plan.pos_mode if pos is None else _enum(POS_MODES, pos, "pos")
        self._call("mskv_cuda_plan_upload", self.ptr, byref(plan._s), mode, byref(out))
        return DevicePlan(plan, out, self)

    def write_kv(self, layer: int, dplan: DevicePlan, k: Tensor, v: Tensor, rope: Optional[Any] = None) -> None:
        """Scatters device k, v [total_q][kv_heads][head_dim] into layer's
        pools: f32, f16 or bf16 (k and v alike), converted on the device into
        the store's dtype (rounded to nearest even, as the CPU backend does)."""
        d = self._desc
        shape, layout = (dplan.total_q, d.kv_heads, d.head_dim), "[total_q][kv_heads][head_dim]"
        kb = self._device(k, "k", shape, layout, dtypes=_tensors.FLOATS + ("u16",))
        vb = self._device(v, "v", shape, layout, dtypes=_tensors.FLOATS + ("u16",))
        _tensors.same_dtype(kb, vb, "k and v")
        if rope is not None and dplan.pos_mode != rope.mode:
            raise ValueError("rope: the plan was uploaded with pos=%r, the rope needs %r"
                             % (_name(POS_MODES, dplan.pos_mode), _name(POS_MODES, rope.mode)))
        self._follow(kb, vb)
        self._call("mskv_cuda_write_kv_ex", self.ptr, layer, byref(dplan._s), kb.ptr, vb.ptr,
                   dtype_code(_tensors._kernel_dtype(kb.dtype)), byref(rope._s) if rope is not None else None)

    def attention(self, layer: int, dplan: DevicePlan, q: Tensor, out: Tensor, lse: Optional[Tensor] = None,
                  mask: Choice = "none", window_left: int = 0, scale: float = 0.0) -> Tensor:
        """Paged attention on the device: q, out [total_q][q_heads][head_dim]
        (the store's dtype, q 16-byte aligned), lse (optional) f32 [total_q][q_heads]."""
        d, plan = self._desc, dplan.plan
        layout = "[total_q][q_heads][head_dim]"
        qb = self._device(q, "q", (plan.total_q, None, d.head_dim), layout, align=16)
        if qb.shape[1] % d.kv_heads:
            raise TensorError("q: %d heads is not a multiple of the %d kv heads" % (qb.shape[1], d.kv_heads))
        ob = self._device(out, "out", qb.shape, layout, writable=True)
        lb = None
        if lse is not None:
            lb = self._device(lse, "lse", (plan.total_q, qb.shape[1]), "[total_q][q_heads]", dtypes=("f32",),
                              writable=True)
        a = _attn_struct(qb.shape[1], self._dtype, mask, window_left, scale)
        self._follow(qb, ob, lb)
        self._call("mskv_cuda_attention", self.ptr, layer, byref(plan._s), byref(dplan._s), byref(a), qb.ptr,
                   ob.ptr, lb.ptr if lb else 0)
        return out

    def prefix_view(self, request: Any, k: Tensor, v: Tensor, group: int = 0) -> PrefixView:
        """A PrefixView of request's protected prefix in device buffers k, v
        ([num_layers][cap_tokens][kv_heads][head_dim], the store's dtype,
        16-byte aligned): gather() copies the prefix from the pools on the
        device (mskv_cuda_prefix_view_gather), attention_dense() reads it."""
        d = self._desc
        layout = "[num_layers][cap_tokens][kv_heads][head_dim]"
        kb = self._device(k, "k", (d.num_layers, None, d.kv_heads, d.head_dim), layout, writable=True, align=16)
        vb = self._device(v, "v", kb.shape, layout, writable=True, align=16)
        s = _ffi.mskv_prefix_view()
        s.request.id, s.group, s.cap_tokens = request.id, group, kb.shape[1]
        s.k, s.v = kb, vb   # kept by s (the Bufs keep the tensors)
        view = PrefixView(request.arena, request, kb.shape[1], group, _s=s, _k=k, _v=v)
        view._store = self
        return view

    def attention_dense(self, view: PrefixView, layer: int, dplan: DevicePlan, q: Tensor, out: Tensor,
                        lse: Optional[Tensor] = None, mask: Choice = "none", window_left: int = 0,
                        scale: float = 0.0) -> Tensor:
        """Attention over a device PrefixView's layer under dplan (a "prefix"
        plan, uploaded): the same arguments and results as attention()."""
        d, plan = self._desc, dplan.plan
        kv = view._dense(layer)
        layout = "[total_q][q_heads][head_dim]"
        qb = self._device(q, "q", (plan.total_q, None, d.head_dim), layout, align=16)
        if qb.shape[1] % d.kv_heads:
            raise TensorError("q: %d heads is not a multiple of the %d kv heads" % (qb.shape[1], d.kv_heads))
        ob = self._device(out, "out", qb.shape, layout, writable=True)
        lb = None
        if lse is not None:
            lb = self._device(lse, "lse", (plan.total_q, qb.shape[1]), "[total_q][q_heads]", dtypes=("f32",),
                              writable=True)
        a = _attn_struct(qb.shape[1], self._dtype, mask, window_left, scale)
        self._follow(qb, ob, lb)
        self._call("mskv_cuda_attention_dense", self.ptr, byref(kv), byref(plan._s), byref(dplan._s), byref(a),
                   qb.ptr, ob.ptr, lb.ptr if lb else 0)
        return out

    def rope(self, rope: Any, x: Tensor, positions: Tensor) -> Tensor:
        """Rotates device x [n][heads][head_dim] in place at device int32 positions."""
        xb = self._device(x, "x", (None, None, self._desc.head_dim), "[n][heads][head_dim]", writable=True)
        n = xb.shape[0]
        pb = self._device(positions, "positions", (n, 3) if rope.mode == 2 else (n,), "", dtypes=("i32",))
        self._follow(xb, pb)
        self._call("mskv_cuda_rope", self.ptr, byref(rope._s), xb.ptr, n, xb.shape[1], pb.ptr)
        return x

    def publish(self, segments: Segments = ()) -> int:
        """mskv_cuda_publish: ends the step and records its fence event."""
        arena = next(iter(self._arenas), None)
        if arena is None:
            raise MskvError("publish: the store has no arena (CudaStore.arena())")
        segs, n = arena._segments(segments)
        step = ctypes.c_uint64()
        self._call("mskv_cuda_publish", self.ptr, segs, n, byref(step))
        return step.value

    def retire(self, wait: bool = False) -> None:
        """Retires every recorded fence whose event completed (wait: wait for all; mskv_cuda_retire)."""
        self._call("mskv_cuda_retire", self.ptr, int(bool(wait)))

    def sync(self) -> None:
        """Waits for the store's stream (mskv_cuda_store_sync)."""
        self._call("mskv_cuda_store_sync", self.ptr)


def _same(dtype):
    return ("bf16", "u16") if dtype == "bf16" else (dtype,)
