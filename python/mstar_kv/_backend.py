"""One call shape on every backend, so model code does not branch:

    be = mk.backend(arena_or_store, cpu=...)
    be.write_kv(layer, plan, k, v, rope=None)
    out = be.attention(layer, plan, q, out=None, lse=None, mask="none", window_left=0, scale=0.0)
    q_rot = be.rope(rope, q, positions)      # pure; be.rope_ rotates in place

plan is always the host Plan the arena built; the GPU backend uploads it
on demand (once per build) or takes a DevicePlan. Results take q's type,
device and dtype. The older per-backend calls (mk.attention,
Arena.write_kv, CudaStore.attention, ...) keep working."""
from . import _torchio
from typing import Any, Optional, Union

from ._core import Arena, Cpu, Plan, Rope, attention
from ._errors import TensorError


class CpuBackend:
    """The CPU backend over an arena's host pools (NumPy arrays or CPU torch
    tensors). cpu: a Cpu thread pool (None: the caller's thread)."""

    def __init__(self, arena: Arena, cpu: Optional[Cpu] = None) -> None:
        self._arena, self._cpu = arena, cpu

    arena = property(lambda self: self._arena)   # read-only, as every object bound to C memory
    cpu = property(lambda self: self._cpu)

    def __repr__(self):
        return "CpuBackend(arena=%r, threads=%s)" % (self.arena, getattr(self.cpu, "num_threads", 1))

    def write_kv(self, layer: int, plan: Plan, k: Any, v: Any, rope: Optional[Rope] = None) -> None:
        """Scatters k, v [total_q][kv_heads][head_dim] into layer's pools through plan (rope rotates k)."""
        self.arena.write_kv(layer, plan, k, v, rope=rope)

    def attention(self, layer: int, plan: Plan, q: Any, out: Any = None, lse: Any = None, mask: Union[str, int] = "none",
                  window_left: int = 0, scale: float = 0.0) -> Any:
        """Paged attention of q [total_q][q_heads][head_dim] over plan; returns
        out (new, of q's kind, when None), or (out, lse) when lse is asked for."""
        return attention(self.arena, layer, plan, q, out, lse, mask, window_left, scale, cpu=self.cpu)

    def rope_(self, rope: Rope, x: Any, positions: Any) -> Any:
        """Rotates x in place at positions (int32, or a Plan: its positions); returns x."""
        return rope.apply_(x, positions.positions if isinstance(positions, Plan) else positions)

    def rope(self, rope: Rope, x: Any, positions: Any) -> Any:
        """x rotated, as a new array/tensor (x unchanged); positions as rope_'s."""
        return rope.apply(x, positions.positions if isinstance(positions, Plan) else positions)


class CudaBackend:
    """A CudaStore behind the same protocol: device tensors in, device
    tensors out; a host Plan is uploaded (CudaStore.upload_plan) the first
    time it is used after each build, and reused until it is built again or
    another plan is uploaded (the store's plan buffers hold the last one)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._last = None   # (plan, its build count, the DevicePlan)

    store = property(lambda self: self._store)   # read-only

    def __repr__(self):
        return "CudaBackend(store=%r)" % (self.store,)

    def device_plan(self, plan: Any) -> Any:
        """The DevicePlan for plan (uploaded when it changed); a DevicePlan passes through."""
        from ._cuda import DevicePlan
        if isinstance(plan, DevicePlan):
            return plan
        if not isinstance(plan, Plan):
            raise TypeError("plan: expected a Plan or a DevicePlan, got %s" % type(plan).__name__)
        last = self._last
        if last is not None and last[0] is plan and last[1] == plan._builds:
            return last[2]
        dp = self.store.upload_plan(plan)
        self._last = (plan, plan._builds, dp)
        return dp

    def write_kv(self, layer: int, plan: Any, k: Any, v: Any, rope: Optional[Rope] = None) -> None:
        """Scatters device k, v into layer's pools through plan (rope rotates k)."""
        self.store.write_kv(layer, self.device_plan(plan), k, v, rope=rope)

    def attention(self, layer: int, plan: Any, q: Any, out: Any = None, lse: Any = None, mask: Union[str, int] = "none",
                  window_left: int = 0, scale: float = 0.0) -> Any:
        """Paged attention on the device; out (new when None: q must then be a
        torch tensor), lse True for a new f32 [total_q][q_heads] tensor.
        Returns out, or (out, lse) when lse is asked for."""
        dp = self.device_plan(plan)
        if (out is None or lse is True) and not _torchio.is_tensor(q):
            raise TensorError("out: a new device result is made only for a torch q; pass out= (and an lse "
                              "array) for a %s" % type(q).__name__)
        if out is None:
            out = _torchio.empty_like(q, tuple(q.shape))
        want_lse = lse is not None and lse is not False
        if lse is True:
            lse = _torchio.empty_like(q, (dp.plan.total_q, q.shape[1]), "f32")
        self.store.attention(layer, dp, q, out, lse if want_lse else None, mask, window_left, scale)
        return (out, lse) if want_lse else out

    def _positions(self, positions):
        from ._cuda import DevicePlan
        if isinstance(positions, (Plan, DevicePlan)):
            arrays = self.device_plan(positions).arrays()
            if "positions" not in arrays:
                raise ValueError("positions: the plan was built without positions (pos='1d' or '3d')")
            return arrays["positions"]
        return positions

    def rope_(self, rope: Rope, x: Any, positions: Any) -> Any:
        """Rotates device x in place at device int32 positions (or a plan's:
        a Plan is uploaded on demand); returns x."""
        return self.store.rope(rope, x, self._positions(positions))

    def rope(self, rope: Rope, x: Any, positions: Any) -> Any:
        """x rotated, as a new device tensor (x unchanged; x must be a torch tensor)."""
        if not _torchio.is_tensor(x):
            raise TensorError("x: a pure device rope copies x, which needs a torch tensor; use rope_ for a %s"
                              % type(x).__name__)
        return self.store.rope(rope, _torchio.copy_of(x), self._positions(positions))


def backend(target: Any, cpu: Optional[Cpu] = None) -> Any:
    """The backend for an Arena (CpuBackend; CudaBackend when the arena is
    bound to a CudaStore) or a CudaStore (CudaBackend)."""
    from ._cuda import CudaStore
    if isinstance(target, CudaStore):
        return CudaBackend(target)
    if isinstance(target, Arena):
        store = getattr(target, "_keep", None)
        if isinstance(store, CudaStore):
            return CudaBackend(store)
        return CpuBackend(target, cpu)
    raise TypeError("backend: expected an Arena or a CudaStore, got %s" % type(target).__name__)
