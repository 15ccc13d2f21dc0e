"""Array and tensor arguments, from whatever protocol they speak.

Accepted: NumPy arrays, anything with __array_interface__ (host),
__cuda_array_interface__ (device), PyTorch tensors (host or CUDA, bf16
included; torch is never imported here), and DLPack producers (__dlpack__,
read through the capsule with ctypes, so bf16 and CUDA work without torch).
Each argument is checked here (device, dtype, shape, C-contiguity,
alignment, writability) so that a bad one raises TensorError before any C
call. Nothing is copied: the C call gets the caller's memory."""
import ctypes
import sys

import numpy as np

from ._errors import TensorError

# dtype names: f32, f16, bf16 (also u16: a bf16 tensor seen through NumPy), i32, i64, u8
_TYPESTR = {"<f4": "f32", "<f2": "f16", "<u2": "u16", "<i4": "i32", "<i8": "i64", "|u1": "u8",
            "<V2": "bf16"}
_ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "u16": 2, "i32": 4, "i64": 8, "u8": 1}
_DLPACK_DTYPE = {(2, 32): "f32", (2, 16): "f16", (4, 16): "bf16", (1, 16): "u16", (0, 32): "i32",
                 (0, 64): "i64", (1, 8): "u8"}
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13

FLOATS = ("f32", "f16", "bf16")   # what the kernels take; a u16 array stands for bf16
_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bf16 (or a uint16 view)", "u16": "uint16",
          "i32": "int32", "i64": "int64", "u8": "uint8"}


class Buf:
    """One argument as the C side sees it: an address, a shape, a dtype name,
    where it lives, and the object that keeps the memory alive."""
    __slots__ = ("ptr", "shape", "dtype", "device", "device_id", "readonly", "contiguous", "keep")

    def __init__(self, ptr, shape, dtype, device, device_id=0, readonly=False, contiguous=True, keep=None):
        self.ptr, self.shape, self.dtype, self.device = int(ptr or 0), tuple(shape), dtype, device
        self.device_id, self.readonly, self.contiguous, self.keep = device_id, readonly, contiguous, keep

    @property
    def nbytes(self):
        n = _ITEMSIZE.get(self.dtype, 1)
        for s in self.shape:
            n *= s
        return n


def _c_contiguous(shape, strides, itemsize):
    expect = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expect:
            return False
        expect *= dim
    return True


def _from_numpy(a):
    dt = _TYPESTR.get(a.dtype.str, a.dtype.name)
    return Buf(a.__array_interface__["data"][0], a.shape, dt, "cpu",
               readonly=not a.flags.writeable, contiguous=a.flags.c_contiguous, keep=a)


def _from_torch(t):
    name = str(t.dtype).replace("torch.", "")
    dt = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "uint16": "u16", "int32": "i32",
          "int64": "i64", "uint8": "u8"}.get(name, name)
    dev = "cuda" if t.is_cuda else ("cpu" if t.device.type == "cpu" else t.device.type)
    return Buf(t.data_ptr(), tuple(t.shape), dt, dev, t.device.index or 0, False, t.is_contiguous(), t)


def _from_cuda_interface(obj):
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dt = _TYPESTR.get(cai["typestr"], cai["typestr"])
    ptr, readonly = cai["data"]
    strides = cai.get("strides")
    contiguous = strides is None or _c_contiguous(shape, strides, _ITEMSIZE.get(dt, 1))
    return Buf(ptr, shape, dt, "cuda", 0, bool(readonly), contiguous, obj)


# DLPack (v0.x "dltensor" capsule): read in place; the capsule keeps the
# producer's memory alive and frees it (through its deleter) when collected.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj, stream):
    kwargs = {}
    try:
        dev_type, _ = obj.__dlpack_device__()
    except AttributeError:
        dev_type = None
    if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED) and stream is not None:
        kwargs["stream"] = stream
    capsule = obj.__dlpack__(**kwargs)
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dt = _DLPACK_DTYPE.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    dt = dt or "dlpack(code=%d, bits=%d, lanes=%d)" % (t.dtype.code, t.dtype.bits, t.dtype.lanes)
    contiguous = True
    if t.strides:
        # DLPack strides count elements
        contiguous = _c_contiguous(shape, [t.strides[i] for i in range(t.ndim)], 1)
    device = {_DL_CPU: "cpu", _DL_CUDA_HOST: "cpu", _DL_CUDA: "cuda", _DL_CUDA_MANAGED: "cuda"}.get(
        t.device.device_type, "device type %d" % t.device.device_type)
    return Buf((t.data or 0) + t.byte_offset, shape, dt, device, t.device.device_id, False, contiguous,
               (obj, capsule))


def view(obj, name, stream=None):
    """A Buf for any accepted array or tensor (no checks yet)."""
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_interface(obj)
    if hasattr(obj, "__array_interface__"):
        return _from_numpy(np.asarray(obj))
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, stream)
    raise TensorError("%s: expected an array or tensor (NumPy, __array_interface__, "
                      "__cuda_array_interface__ or DLPack), got %s" % (name, type(obj).__name__))


def _fmt_shape(shape):
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + (",)" if len(shape) == 1 else ")")


def check(obj, name, *, device, dtypes, shape=None, layout="", writable=False, align=None, stream=None):
    """The checked Buf of one argument, or TensorError saying what is wrong.
    shape: a tuple of ints (None: any size on that axis); layout names the
    axes for the message; align: bytes (default: the element size)."""
    b = view(obj, name, stream)
    if b.device != device:
        where = "host memory (NumPy arrays or CPU tensors)" if device == "cpu" else "a CUDA device"
        raise TensorError("%s: is on %s; this call needs %s" % (name, b.device, where))
    if b.dtype not in dtypes:
        want = ", ".join(_NAMES.get(d, d) for d in dtypes)
        raise TensorError("%s: dtype %s; expected %s" % (name, _NAMES.get(b.dtype, b.dtype), want))
    if shape is not None and (len(b.shape) != len(shape) or
                              any(w is not None and w != s for w, s in zip(shape, b.shape))):
        raise TensorError("%s: shape %s; expected %s%s" % (name, _fmt_shape(b.shape), _fmt_shape(shape),
                                                           " " + layout if layout else ""))
    if not b.contiguous:
        raise TensorError("%s: not C-contiguous; pass a contiguous copy (np.ascontiguousarray, "
                          ".contiguous())" % name)
    need = align or _ITEMSIZE.get(b.dtype, 1)
    if b.ptr % need:
        raise TensorError("%s: address 0x%x is not aligned to %d bytes" % (name, b.ptr, need))
    if writable and b.readonly:
        raise TensorError("%s: is read-only; the call writes into it" % name)
    return b


def same_dtype(a, b, what):
    if _kernel_dtype(a.dtype) != _kernel_dtype(b.dtype):
        raise TensorError("%s: dtypes differ (%s and %s)" % (what, _NAMES.get(a.dtype, a.dtype),
                                                             _NAMES.get(b.dtype, b.dtype)))


def _kernel_dtype(d):
    return "bf16" if d == "u16" else d


def overlaps(a, b):
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
