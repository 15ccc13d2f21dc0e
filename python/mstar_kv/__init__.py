"""mstar_kv: a paged KV cache for windowed autoregressive video diffusion and
LLM decode, from Python. A thin ctypes layer over the C headers
(mstar_kv.h, mstar_kv_cuda.h) with the same nouns: Arena, Request, Plan,
Session; the CPU backend on NumPy arrays; the GPU layer on device tensors.
See python/README.md."""
from . import _ffi
from ._core import (DTYPES, EVENT_TYPES, MASKS, PLAN_KINDS, POS_MODES, Arena, ArenaStats, Cpu, DecodeSpan,
                    Event, Plan, PrefixView, Request, RequestInfo, Retention, Rope, Schedule, Session, StoreInfo,
                    Window, attention, attention_dense, dtype_code, from_bf16, merge, to_bf16)
from ._cuda import STREAM_LEGACY, Cuda, CudaStore, DevicePlan, cuda_probe
from ._core import VISIBILITY, default_threads
from ._backend import CpuBackend, CudaBackend, backend
from ._research import CausalKVCache, LayerCache, pages_needed, retention_from_research
from ._errors import ERROR_CLASSES, MskvError, TensorError, error_for
from ._errors import *  # noqa: F401,F403  (one class per result code: OutOfPagesError, ...)

library_path = _ffi.library_path
RESIDENT, OFFLOADED = _ffi.CONSTANTS["MSKV_RESIDENT"], _ffi.CONSTANTS["MSKV_OFFLOADED"]   # RequestInfo.location
__version__ = "0.1.0"


def result_string(code):
    """The library's description of a result code."""
    return _ffi.lib.mskv_result_string(code).decode()
