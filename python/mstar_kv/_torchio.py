"""Results of the caller's kind: a call given a torch tensor returns torch
tensors (same device, dtype), one given NumPy arrays returns NumPy arrays;
and plans seen as torch tensors without a copy. torch is never imported
here: it is used only when the caller's objects are torch tensors."""
import sys

import numpy as np

from . import _tensors

_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "u16": np.uint16, "i32": np.int32,
       "i64": np.int64, "u8": np.uint8}
_TORCH = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i64": "int64", "u8": "uint8"}


def torch_module():
    """torch when the caller has imported it, else None."""
    return sys.modules.get("torch")


def is_tensor(obj) -> bool:
    """Whether obj is a torch.Tensor (False when torch was never imported)."""
    torch = torch_module()
    return torch is not None and isinstance(obj, torch.Tensor)


def empty_like(like, shape, dtype=None):
    """A new uninitialised result of `like`'s kind: a torch tensor on its
    device for a tensor, else a NumPy array. dtype: a _tensors name
    ("f32", ...), default like's own (a NumPy uint16 stays uint16 bits)."""
    if is_tensor(like):
        torch = torch_module()
        dt = like.dtype if dtype is None else getattr(torch, _TORCH[dtype])
        return torch.empty(tuple(shape), dtype=dt, device=like.device)
    if dtype is None:
        if isinstance(like, np.ndarray):
            return np.empty(tuple(shape), dtype=like.dtype)   # uint16 bits or ml_dtypes.bfloat16 alike
        dtype = _tensors.view(like, "like").dtype
    return np.empty(tuple(shape), dtype=_NP[dtype])


def copy_of(x):
    """A contiguous copy of x of its own kind (torch tensor or NumPy array)."""
    if is_tensor(x):
        return x.detach().clone(memory_format=torch_module().contiguous_format)
    if isinstance(x, np.ndarray):
        return np.array(x, copy=True, order="C")
    return np.array(np.asarray(x), copy=True, order="C")


def _need_torch(what):
    torch = torch_module()
    if torch is None:
        try:
            import torch   # noqa: F811  (asked for by name: the caller wants tensors)
        except ImportError:
            raise ImportError("%s needs PyTorch (pip install torch)" % what) from None
    return torch


def plan_tensors(plan, name=None):
    """plan's arrays (the parts its last build filled) as CPU torch tensors
    sharing its buffers: torch.from_numpy of the writable owner arrays, so
    no copy and no "not writable" warning."""
    torch = _need_torch("Plan.torch()")
    public = [n for n in plan._raw if n != "requests"]   # requests: the stale-plan check's own
    if name is not None:
        if name not in public:
            raise KeyError("Plan.torch: no array %r (one of %s)" % (name, ", ".join(public)))
        names = [name]
    else:
        names = public
    out = {}
    for n in names:
        part = getattr(plan, n)     # the read-only view of what the build filled: its length and shape
        raw = plan._raw[n][:part.size].reshape(part.shape)
        out[n] = torch.from_numpy(raw)
    return out[name] if name is not None else out


class DeviceArray:
    """A device array described by __cuda_array_interface__ (version 3), for
    torch.as_tensor(..., device="cuda") / CuPy to wrap without a copy."""

    def __init__(self, ptr, shape, typestr, owner):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (int(ptr), True),
                                         "version": 3, "strides": None}
        self.owner = owner   # keeps the store (and so the device buffer) alive


# the device plan's buffers: name, typestr, length from the host plan
_DPLAN = [("qo_indptr", "<i4", lambda p: p.batch + 1), ("kv_indptr", "<i4", lambda p: p.batch + 1),
          ("kv_indices", "<i4", lambda p: p.num_page_ids), ("kv_last_page_len", "<i4", lambda p: p.batch),
          ("kv_len", "<i4", lambda p: p.batch), ("kv_pos_split", "<i4", lambda p: p.batch),
          ("kv_pos_shift", "<i4", lambda p: p.batch), ("kv_token_indptr", "<i8", lambda p: p.batch + 1),
          ("slot_mapping", "<i8", lambda p: p.total_q),
          ("q_pos", "<i4", lambda p: p.total_q), ("vis_sink_end", "<i4", lambda p: p.batch),
          ("vis_window_start", "<i4", lambda p: p.batch)]


def dplan_arrays(dplan, owner):
    """{name: DeviceArray} of a DevicePlan's device buffers (0-address ones left out)."""
    plan, out = dplan.plan, {}
    for name, typestr, length in _DPLAN:
        ptr = getattr(dplan._s, name)
        if ptr:
            out[name] = DeviceArray(ptr, (length(plan),), typestr, owner)
    if dplan._s.positions and dplan.pos_mode:
        shape = (plan.total_q, 3) if dplan.pos_mode == 2 else (plan.total_q,)
        out["positions"] = DeviceArray(dplan._s.positions, shape, "<i4", owner)
    return out


def dplan_tensors(dplan, owner, name=None):
    """A DevicePlan's buffers as CUDA torch tensors (no copy)."""
    torch = _need_torch("DevicePlan.torch()")
    arrays = dplan_arrays(dplan, owner)
    if name is not None:
        if name not in arrays:
            raise KeyError("DevicePlan.torch: no array %r (one of %s)" % (name, ", ".join(arrays)))
        return torch.as_tensor(arrays[name], device="cuda")
    return {n: torch.as_tensor(a, device="cuda") for n, a in arrays.items()}
