"""The rest of mstar_kv_cuda.h (graph capture is in _graphs.py): head shards
over several devices (CudaShards), and the device-free parts: the driver
probe, one NVRTC compilation (cuda_compile), the embedded kernel source,
the attention launch geometry and the page divisor."""
import collections
import ctypes
from typing import List, Optional, Sequence, Tuple

from ._closing import Closing
from . import _core, _cuda, _ffi
from ._errors import MskvError, TensorError, error_for
from ._types import Choice, Segments, Tensor
from ._ffi import mskv_cuda_attn_geometry, mskv_cuda_compile_info, mskv_cuda_image, mskv_cuda_shard_desc

byref = ctypes.byref


def cuda_probe_driver(device: int = 0, driver_path: Optional[str] = None) -> Tuple[bool, int, int, str]:
    """(ok, devices, driver_version, why): the driver and its devices alone,
    without NVRTC (mskv_cuda_probe_driver), which tells "no GPU" from "a GPU
    that cannot JIT". driver_version is 1000 * major + 10 * minor."""
    why = ctypes.create_string_buffer(1024)
    d = _cuda._desc(device, driver_path, None, None, False)
    devices, version = ctypes.c_int32(), ctypes.c_int32()
    code = _ffi.lib.mskv_cuda_probe_driver(byref(d), byref(devices), byref(version), why, len(why))
    return code == 0, devices.value, version.value, why.value.decode(errors="replace")


CudaImage = collections.namedtuple("CudaImage", "data is_ptx from_disk key path log")
CudaImage.__doc__ = ("One compilation (mskv_cuda_image): data (CUBIN, or PTX text as bytes), is_ptx, "
                     "from_disk (read from the cache), key, path (the cache file), log (NVRTC's).")


def cuda_compile(arch: int = 80, ptx: bool = False, arch_specific: bool = False, options: Sequence[str] = (),
                 kernel_source: Optional[str] = None, nvrtc_path: Optional[str] = None,
                 cache_dir: Optional[str] = None, disable_disk_cache: bool = False) -> CudaImage:
    """Compiles the kernel source (the embedded kernels.cu, or kernel_source)
    for sm_<arch> through the disk cache, without a device
    (mskv_cuda_compile). NvrtcError with NVRTC's log when it does not
    compile; CudaUnavailableError without NVRTC."""
    d = _cuda._desc(0, None, nvrtc_path, cache_dir, disable_disk_cache)
    src = kernel_source.encode() if kernel_source is not None else None
    d.kernel_source = src
    opts = [o.encode() for o in options]
    arr = (ctypes.c_char_p * max(len(opts), 1))(*opts)
    info = mskv_cuda_compile_info()
    info.arch, info.arch_specific, info.ptx = arch, int(bool(arch_specific)), int(bool(ptx))
    info.options, info.num_options = ctypes.cast(arr, ctypes.c_void_p).value, len(opts)
    img = mskv_cuda_image()
    code = _ffi.lib.mskv_cuda_compile(byref(d), byref(info), byref(img))
    try:
        log = ctypes.string_at(img.log).decode(errors="replace") if img.log else ""
        if code != 0:
            ok, why = _cuda.cuda_probe(0, None, nvrtc_path)
            raise error_for(code, "mskv_cuda_compile", log or why)
        data = ctypes.string_at(img.data, img.size) if img.data else b""
        return CudaImage(data, bool(img.is_ptx), bool(img.from_disk), img.key, img.path.decode(errors="replace"),
                         log)
    finally:
        _ffi.lib.mskv_cuda_image_free(byref(d), byref(img))
        del src, arr


def cuda_log_spills(log: str) -> int:
    """Register spills in a ptxas report (--ptxas-options=-v): the bytes of
    spill stores plus spill loads; -1 when the log has no report."""
    if not isinstance(log, str):
        raise TypeError("cuda_log_spills: log: expected a str, got %s" % type(log).__name__)
    return _ffi.lib.mskv_cuda_log_spills(log.encode())


def cuda_embedded_lines() -> List[str]:
    """The embedded copy of kernels.cu, line by line (mskv_cuda_embedded_lines)."""
    n = ctypes.c_int32()
    p = _ffi.lib.mskv_cuda_embedded_lines(byref(n))
    arr = ctypes.cast(p, ctypes.POINTER(ctypes.c_char_p))
    return [arr[i].decode() for i in range(n.value)]


def cuda_embedded_source() -> str:
    """The embedded copy of kernels.cu, joined (mskv_cuda_embedded_source)."""
    size = ctypes.c_size_t()
    _ffi.lib.mskv_cuda_embedded_source(None, 0, byref(size))   # the size query (CAPACITY with no buffer)
    buf = ctypes.create_string_buffer(size.value + 1)
    _core._check(_ffi.lib.mskv_cuda_embedded_source(buf, len(buf), byref(size)), "mskv_cuda_embedded_source")
    return buf.raw[:size.value].decode()


AttnGeometry = collections.namedtuple("AttnGeometry", [f for f, _ in mskv_cuda_attn_geometry._fields_])
AttnGeometry.__doc__ = "mskv_cuda_attn_geometry: how one GPU attention call is laid out (grid is a tuple)."


def cuda_attn_geometry(batch: int, total_q: int, max_qo_len: int, max_kv_len: int, q_heads: int, kv_heads: int,
                       head_dim: int, multiprocessors: int, max_smem_bytes: int = 0,
                       resident_blocks: int = 0) -> AttnGeometry:
    """How mskv_cuda_attention lays out one call (mskv_cuda_attn_geometry_get):
    pure arithmetic, no device. InvalidArgumentError for heads or a head_dim
    other than 64, 128, 256."""
    g = mskv_cuda_attn_geometry()
    _core._check(_ffi.lib.mskv_cuda_attn_geometry_get(batch, total_q, max_qo_len, max_kv_len, q_heads, kv_heads,
                                                     head_dim, multiprocessors, max_smem_bytes, resident_blocks,
                                                     byref(g)),
                 "mskv_cuda_attn_geometry_get",
                 "batch=%d total_q=%d q_heads=%d kv_heads=%d head_dim=%d" % (batch, total_q, q_heads, kv_heads,
                                                                           head_dim))
    return AttnGeometry(*[tuple(getattr(g, f)) if f == "grid" else getattr(g, f) for f in AttnGeometry._fields])


def cuda_page_divisor(page_size: int) -> Tuple[int, int]:
    """(magic, shift) with page = (j * magic) >> shift for 0 <= j < 2**31, as
    the attention kernel divides by page_size (mskv_cuda_page_divisor)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError("cuda_page_divisor: page_size %r must be an int >= 1" % (page_size,))
    magic, shift = ctypes.c_uint32(), ctypes.c_int32()
    _ffi.lib.mskv_cuda_page_divisor(page_size, byref(magic), byref(shift))
    return magic.value, shift.value


class _ShardStore(_cuda.CudaStore):
    """One shard's device store, owned by its CudaShards (closing it does not destroy it)."""

    def close(self) -> None:
        self._ptr = None

    __del__ = close


class CudaShards(Closing):
    """Head shards (mskv_cuda_shards): one arena over N device stores, the
    kv heads split evenly over contexts (one Cuda per device). Per step:
    plan_upload (every device), then write_kv / attention for each shard
    with its own slice of the heads, publish. kv_heads is the whole
    model's (divisible by N)."""

    def __init__(self, contexts: "Sequence[_cuda.Cuda]", num_pages: int, page_size: int, num_layers: int,
                 kv_heads: int, head_dim: int, dtype: str = "f16", max_batch: int = 0, max_tokens: int = 0,
                 max_page_ids: int = 0, staging_bytes: int = 0, plan_ring: int = 0):
        self._ptr, self._arenas = None, []
        self._contexts = list(contexts)
        for i, c in enumerate(self._contexts):
            if not isinstance(c, _cuda.Cuda):
                raise TypeError("contexts[%d]: expected a Cuda, got %s" % (i, type(c).__name__))
        n = len(self._contexts)
        d = mskv_cuda_shard_desc()
        d.num_shards = n
        self._devs = (ctypes.c_void_p * max(n, 1))(*[c.ptr for c in self._contexts])
        d.devices = ctypes.cast(self._devs, ctypes.c_void_p).value
        s = d.store
        s.num_pages, s.page_size, s.num_layers, s.kv_heads, s.head_dim = num_pages, page_size, num_layers, kv_heads, \
            head_dim
        s.dtype = _core.dtype_code(dtype)
        s.max_batch, s.max_tokens, s.max_page_ids = max_batch, max_tokens, max_page_ids
        s.staging_bytes, s.plan_ring = staging_bytes, plan_ring
        out = ctypes.c_void_p()
        code = _ffi.lib.mskv_cuda_shards_create(byref(d), byref(out))
        if code != 0:
            detail = (_ffi.lib.mskv_cuda_last_error(self._contexts[0].ptr) or b"").decode(errors="replace") if n else \
                "contexts: no context given (1 to %d)" % _ffi.CONSTANTS["MSKV_CUDA_MAX_SHARDS"]
            raise error_for(code, "mskv_cuda_shards_create", detail)
        self._ptr, self._desc = out.value, d
        self._stores = []
        for i in range(n):
            st = object.__new__(_ShardStore)
            st._cuda, st._ptr, st._arenas = self._contexts[i], _ffi.lib.mskv_cuda_shards_store(self._ptr, i), set()
            st._desc = _ffi.mskv_cuda_store_desc.from_buffer_copy(s)
            st._desc.kv_heads = kv_heads // n
            st._dtype, st._pools, st._pool_ptrs, st._stream = _core._name(_core.DTYPES, s.dtype), None, None, None
            self._stores.append(st)

    @property
    def ptr(self) -> int:
        if not self._ptr:
            raise MskvError("the CUDA shards are closed")
        return self._ptr

    def __repr__(self) -> str:
        return "CudaShards(count=%d)" % len(self._stores)

    def _call(self, function, *args, shard=0):
        self._contexts[shard]._call(function, *args)

    @property
    def count(self) -> int:
        """N: the shards (mskv_cuda_shards_count)."""
        return _ffi.lib.mskv_cuda_shards_count(self.ptr)

    def store(self, shard: int) -> "_cuda.CudaStore":
        """Shard shard's device store: its pools, stream, graphs, merge, rope."""
        if not 0 <= shard < len(self._stores):
            raise IndexError("store: shard %r is not in [0, %d)" % (shard, len(self._stores)))
        return self._stores[shard]

    def arena(self, max_requests: int = 0) -> "_core.Arena":
        """The arena whose pages live in the shards (the full geometry), bound to them."""
        d = _ffi.mskv_arena_desc()
        d.max_requests = max_requests
        self._call("mskv_cuda_shards_arena_desc", self.ptr, byref(d))
        a = _core.Arena(0, 0, _desc=d, _keep=self)
        self._call("mskv_cuda_shards_bind", self.ptr, a.ptr)
        self._arenas.append(a)
        return a

    def plan_upload(self, plan: "_core.Plan", pos: "Optional[Choice]" = None) -> "List[_cuda.DevicePlan]":
        """The plan on every device: one DevicePlan per shard."""
        mode = plan.pos_mode if pos is None else _core._enum(_core.POS_MODES, pos, "pos")
        out = (_ffi.mskv_cuda_dplan * len(self._stores))()
        self._call("mskv_cuda_shards_plan_upload", self.ptr, byref(plan._s), mode, out)
        return [_cuda.DevicePlan(plan, _ffi.mskv_cuda_dplan.from_buffer_copy(out[i])) for i in range(len(out))]

    def write_kv(self, shard: int, layer: int, dplan: "_cuda.DevicePlan", k: Tensor, v: Tensor,
                 rope: "Optional[_core.Rope]" = None) -> None:
        """write_kv on device shard with its slice k, v [total_q][kv_heads / N][head_dim] (the store's dtype)."""
        st = self.store(shard)
        d = st._desc
        shape, layout = (dplan.total_q, d.kv_heads, d.head_dim), "[total_q][kv_heads / N][head_dim]"
        kb = st._device(k, "k", shape, layout, align=16)
        vb = st._device(v, "v", shape, layout, align=16)
        self._call("mskv_cuda_shards_write_kv", self.ptr, shard, layer, byref(dplan._s), kb.ptr, vb.ptr,
                   byref(rope._s) if rope is not None else None, shard=shard)

    def attention(self, shard: int, layer: int, dplan: "_cuda.DevicePlan", q: Tensor, out: Tensor,
                  lse: Optional[Tensor] = None, mask: Choice = "none", window_left: int = 0,
                  scale: float = 0.0) -> Tensor:
        """attention on device shard: q, out [total_q][q_heads / N][head_dim], lse [total_q][q_heads / N]."""
        st = self.store(shard)
        d, plan, n = st._desc, dplan.plan, len(self._stores)
        layout = "[total_q][q_heads / N][head_dim]"
        qb = st._device(q, "q", (plan.total_q, None, d.head_dim), layout, align=16)
        if qb.shape[1] % d.kv_heads:
            raise TensorError("q: %d heads is not a multiple of the shard's %d kv heads" % (qb.shape[1], d.kv_heads))
        ob = st._device(out, "out", qb.shape, layout, writable=True)
        lb = None
        if lse is not None:
            lb = st._device(lse, "lse", (plan.total_q, qb.shape[1]), "[total_q][q_heads / N]", dtypes=("f32",),
                            writable=True)
        a = _core._attn_struct(qb.shape[1] * n, st._dtype, mask, window_left, scale)
        self._call("mskv_cuda_shards_attention", self.ptr, shard, layer, byref(plan._s), byref(dplan._s), byref(a),
                   qb.ptr, ob.ptr, lb.ptr if lb else 0, shard=shard)
        return out

    def publish(self, segments: Segments = ()) -> int:
        """Ends the step: mskv_publish plus an event on every device; returns the fence."""
        if not self._arenas:
            raise MskvError("publish: the shards have no arena (CudaShards.arena())")
        segs, n = self._arenas[0]._segments(segments)
        step = ctypes.c_uint64()
        self._call("mskv_cuda_shards_publish", self.ptr, segs, n, byref(step))
        return step.value

    def retire(self, wait: bool = False) -> None:
        """Retires every fence whose events completed on every device."""
        self._call("mskv_cuda_shards_retire", self.ptr, int(bool(wait)))

    def sync(self) -> None:
        """Waits for every device's stream."""
        self._call("mskv_cuda_shards_sync", self.ptr)

    def close(self) -> None:
        """Closes the arenas, then the shards."""
        for a in getattr(self, "_arenas", ()):
            a.close()
        if getattr(self, "_ptr", None):
            _ffi.lib.mskv_cuda_shards_destroy(self._ptr)
            self._ptr = None

    __del__ = close

