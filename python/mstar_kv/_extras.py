"""The smaller calls of the two headers that had no Python form: dtype
sizes and the scalar half conversions, attention and K/V writes on raw
pools (Pools, mskv_pools), the dense K/V epoch check, and on the GPU:
device memory (Cuda.malloc, DeviceBuffer), host <-> device copies on a
store's stream and the LSE merge on the device."""
import ctypes
from typing import Any, Optional, Tuple, Union

import numpy as np

from ._closing import Closing
from . import _core, _ffi, _tensors
from ._enums import Dtype
from ._errors import MskvError, TensorError
from ._types import Choice, Tensor

byref = ctypes.byref


def dtype_size(dtype: Union[str, int]) -> int:
    """Bytes per element of a store dtype (mskv_dtype_size): 4, 2, 2."""
    return _ffi.lib.mskv_dtype_size(_core.dtype_code(dtype))


def _float(x, name):
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise TypeError("%s: expected a float, got %s" % (name, type(x).__name__))
    return float(x)


def _bits(h, name):
    if isinstance(h, bool) or not hasattr(h, "__index__"):
        raise TypeError("%s: expected 16-bit pattern as an int, got %s" % (name, type(h).__name__))
    return h.__index__()


def f32_to_f16(x: float) -> int:
    """x as IEEE half bits, rounded to nearest even as the store rounds (mskv_f32_to_f16)."""
    return _ffi.lib.mskv_f32_to_f16(_float(x, "f32_to_f16: x"))


def f16_to_f32(h: int) -> float:
    """The float value of IEEE half bits h (mskv_f16_to_f32)."""
    return _ffi.lib.mskv_f16_to_f32(_bits(h, "f16_to_f32: h"))


def f32_to_bf16(x: float) -> int:
    """x as bfloat16 bits, rounded to nearest even (mskv_f32_to_bf16)."""
    return _ffi.lib.mskv_f32_to_bf16(_float(x, "f32_to_bf16: x"))


def bf16_to_f32(h: int) -> float:
    """The float value of bfloat16 bits h (mskv_bf16_to_f32)."""
    return _ffi.lib.mskv_bf16_to_f32(_bits(h, "bf16_to_f32: h"))


class Pools:
    """Raw K/V pools in caller memory, no arena (mskv_pools): k and v
    [num_pages][page_size][kv_heads][head_dim] NumPy arrays of one dtype
    (bf16 as uint16). write_kv and attention take caller-made plans as
    they are (no stale-plan check): the CPU backend over memory the caller
    manages (e.g. another cache's pages)."""

    def __init__(self, k: np.ndarray, v: np.ndarray):
        layout = "[num_pages][page_size][kv_heads][head_dim]"
        kb = _tensors.check(k, "k", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=(None,) * 4, layout=layout,
                            writable=True)
        vb = _tensors.check(v, "v", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=kb.shape, layout=layout,
                            writable=True)
        _tensors.same_dtype(kb, vb, "k and v")
        s = self._s = _ffi.mskv_pools()
        s.k, s.v = k, v            # kept by the struct
        s.dtype = _core.dtype_code(_tensors._kernel_dtype(kb.dtype))
        s.num_pages, s.page_size, s.kv_heads, s.head_dim = kb.shape
        self._k, self._v = k, v

    k = property(lambda self: self._k)
    v = property(lambda self: self._v)
    dtype = property(lambda self: Dtype(self._s.dtype))

    def __repr__(self) -> str:
        s = self._s
        return "Pools(num_pages=%d, page_size=%d, kv_heads=%d, head_dim=%d, dtype=%s)" % (
            s.num_pages, s.page_size, s.kv_heads, s.head_dim, self.dtype.name.lower())

    def write_kv(self, plan: "_core.Plan", k: Tensor, v: Tensor, rope: "Optional[_core.Rope]" = None) -> None:
        """Scatters k, v [total_q][kv_heads][head_dim] through plan.slot_mapping (mskv_cpu_write_kv_pools)."""
        s = self._s
        shape, layout = (plan.total_q, s.kv_heads, s.head_dim), "[total_q][kv_heads][head_dim]"
        kb = _tensors.check(k, "k", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=shape, layout=layout)
        vb = _tensors.check(v, "v", device="cpu", dtypes=_tensors.FLOATS + ("u16",), shape=shape, layout=layout)
        _tensors.same_dtype(kb, vb, "k and v")
        if rope is not None:
            plan._need_positions(rope.mode)
        _core._check(_ffi.lib.mskv_cpu_write_kv_pools(byref(s), byref(plan._s), kb.ptr, vb.ptr,
                                                      _core.dtype_code(_tensors._kernel_dtype(kb.dtype)),
                                                      byref(rope._s) if rope is not None else None),
                     "mskv_cpu_write_kv_pools")

    def attention(self, plan: "_core.Plan", q: Tensor, out: Optional[Tensor] = None,
                  lse: Union[bool, Tensor, None] = None, mask: Choice = "none", window_left: int = 0, scale: float = 0.0,
                  cpu: "Optional[_core.Cpu]" = None) -> Any:
        """Paged attention over the pools (mskv_cpu_attention_pools): the
        arguments and results of mstar_kv.attention."""
        s = self._s
        qb, ob, lb, out, lse_arr, kdt = _core._attention_args(plan, q, out, lse, s.kv_heads, s.head_dim)
        a = _core._attn_struct(qb.shape[1], kdt, mask, window_left, scale)
        _core._check(_ffi.lib.mskv_cpu_attention_pools(cpu.ptr if cpu is not None else None, byref(s), byref(plan._s),
                                                       byref(a), qb.ptr, ob.ptr, lb.ptr if lb else None),
                     "mskv_cpu_attention_pools")
        return (out, lse_arr) if lse_arr is not None else out


def _dense_check(self, layer: int = 0) -> None:
    """The epoch check every dense attention starts with, on one layer's
    dense K/V (mskv_dense_kv_check): StaleViewError (both epochs named)
    once the request's prefix moved since the gather; for callers that
    attend over the view with kernels of their own."""
    kv = self._dense(layer)
    _core._check(_ffi.lib.mskv_dense_kv_check(byref(kv)), "mskv_dense_kv_check",
                 "view epoch %d, request prefix_epoch %d" % (self.epoch, self.request.info().prefix_epoch))


_dense_check.__name__, _dense_check.__qualname__ = "dense_check", "PrefixView.dense_check"
_core.PrefixView.dense_check = _dense_check   # added here: PrefixView's own lines stay as they are


class DeviceBuffer(Closing):
    """Device memory from Cuda.malloc (mskv_cuda_malloc): .ptr (the device
    address), .nbytes; close() frees it (mskv_cuda_free), also when collected."""

    def __init__(self, cuda: object, ptr: int, nbytes: int):
        self._cuda, self._ptr, self.nbytes = cuda, ptr, nbytes

    @property
    def ptr(self) -> int:
        if not self._ptr:
            raise MskvError("the device buffer is freed")
        return self._ptr

    def __repr__(self) -> str:
        return "DeviceBuffer(ptr=0x%x, nbytes=%d)" % (self._ptr or 0, self.nbytes)

    def close(self) -> None:
        """Frees the memory."""
        if self._ptr and getattr(self._cuda, "_ptr", None):
            _ffi.lib.mskv_cuda_free(self._cuda._ptr, self._ptr)
        self._ptr = None

    __del__ = close


class CudaMemory:
    """Cuda methods: device memory for the caller's own tensors."""
    __slots__ = ()

    def malloc(self, nbytes: int) -> DeviceBuffer:
        """nbytes of device memory (mskv_cuda_malloc), freed by DeviceBuffer.close()."""
        out = ctypes.c_uint64()
        self._call("mskv_cuda_malloc", self.ptr, nbytes, byref(out))
        return DeviceBuffer(self, out.value, nbytes)


def _device_address(x, name):
    if isinstance(x, DeviceBuffer):
        return x.ptr
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    return _tensors.view(x, name).ptr


class CudaStoreCopies:
    """CudaStore methods: host <-> device copies on the store's stream and the device LSE merge."""
    __slots__ = ()

    def upload(self, dst: Union[DeviceBuffer, int, Tensor], src: np.ndarray) -> None:
        """Copies host array src into device memory dst (a DeviceBuffer, a
        device address or tensor) on the store's stream; returns once the
        bytes arrived (mskv_cuda_upload)."""
        sb = _tensors.check(src, "src", device="cpu", dtypes=tuple(_tensors._ITEMSIZE))
        if isinstance(dst, DeviceBuffer) and sb.nbytes > dst.nbytes:
            raise TensorError("src: %d bytes do not fit the %d-byte device buffer" % (sb.nbytes, dst.nbytes))
        self._call("mskv_cuda_upload", self.ptr, _device_address(dst, "dst"), sb.ptr, sb.nbytes)

    def download(self, dst: np.ndarray, src: Union[DeviceBuffer, int, Tensor]) -> np.ndarray:
        """Copies device memory src into host array dst (all of dst's bytes); returns dst."""
        db = _tensors.check(dst, "dst", device="cpu", dtypes=tuple(_tensors._ITEMSIZE), writable=True)
        if isinstance(src, DeviceBuffer) and db.nbytes > src.nbytes:
            raise TensorError("dst: %d bytes; the device buffer has %d" % (db.nbytes, src.nbytes))
        self._call("mskv_cuda_download", self.ptr, db.ptr, _device_address(src, "src"), db.nbytes)
        return dst

    def merge(self, o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor, out: Tensor,
              out_lse: Tensor) -> Tuple[Tensor, Tensor]:
        """mstar_kv.merge on the device (mskv_cuda_merge): f32 device tensors
        [n][heads][head_dim] (head_dim 64, 128, 256) and [n][heads]; out may
        alias an input. Returns (out, out_lse)."""
        ab = self._device(o_a, "o_a", (None, None, None), "[n][heads][head_dim]", dtypes=("f32",))
        n, heads, dim = ab.shape
        bufs = [ab]
        for name, x, shape, writable in (("lse_a", lse_a, (n, heads), False), ("o_b", o_b, ab.shape, False),
                                         ("lse_b", lse_b, (n, heads), False), ("out", out, ab.shape, True),
                                         ("out_lse", out_lse, (n, heads), True)):
            bufs.append(self._device(x, name, shape, "", dtypes=("f32",), writable=writable))
        self._follow(*bufs)
        self._call("mskv_cuda_merge", self.ptr, n, heads, dim, *[b.ptr for b in bufs])
        return out, out_lse
