"""CUDA graph capture and replay (CudaStore.capture_begin / capture_end,
CudaGraph) and fences recorded by a caller that publishes itself
(CudaStore.fence_record): mstar_kv_cuda.h's >>graphs and >>fences calls."""
import ctypes
import weakref
from typing import TYPE_CHECKING

from . import _ffi
from ._closing import Closing
from ._errors import MskvError

if TYPE_CHECKING:
    from ._cuda import CudaStore

byref = ctypes.byref


class CudaGraph(Closing):
    """A captured step (mskv_cuda_graph): launch() replays it with the plan
    uploaded last (same batch and token count, no longer segment; plan
    smaller steps padded to the captured shape: plan_build(pad=...)).
    close() destroys it (also when the store closes)."""

    def __init__(self, store: "CudaStore", ptr: int):
        self._store, self._ptr = store, ptr

    store = property(lambda self: self._store)

    def __repr__(self) -> str:
        return "CudaGraph(%s)" % ("closed" if not self._ptr else "0x%x" % self._ptr)

    def launch(self) -> None:
        """Replays the captured launches on the store's stream (mskv_cuda_graph_launch)."""
        if not self._ptr:
            raise MskvError("the CUDA graph is closed")
        self._store._call("mskv_cuda_graph_launch", self._store.ptr, self._ptr)

    def close(self) -> None:
        """Destroys the graph (mskv_cuda_graph_destroy)."""
        if self._ptr and getattr(self._store, "_ptr", None):
            _ffi.lib.mskv_cuda_graph_destroy(self._store._ptr, self._ptr)
        self._ptr = None

    __del__ = close


class CudaStoreGraphs:
    """CudaStore methods: graph capture and fences."""
    __slots__ = ()

    def capture_begin(self) -> None:
        """Starts capturing the store's launches (write_kv, attention, merge,
        rope) into a graph (mskv_cuda_capture_begin); uploads and stream
        changes are refused (BadStateError) until capture_end()."""
        self._call("mskv_cuda_capture_begin", self.ptr)

    def capture_end(self) -> CudaGraph:
        """Ends the capture; the graph of what was launched since capture_begin()."""
        out = ctypes.c_void_p()
        self._call("mskv_cuda_capture_end", self.ptr, byref(out))
        g = CudaGraph(self, out.value)
        graphs = self.__dict__.setdefault("_graphs", weakref.WeakSet())
        graphs.add(g)   # destroyed before the store is (CudaStore.close)
        return g

    def fence_record(self, fence: int) -> None:
        """Records the event of fence on the store's stream and polls
        retirement (mskv_cuda_fence_record): what publish() does after
        Arena.publish, for a caller that publishes itself."""
        self._call("mskv_cuda_fence_record", self.ptr, fence)
