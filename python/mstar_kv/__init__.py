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
from ._cpuinfo import CpuInfo, cpu_isa_available, cpu_isa_name, cpu_isas
from ._cudax import (AttnGeometry, CudaImage, CudaShards, cuda_attn_geometry, cuda_compile, cuda_embedded_lines,
                     cuda_embedded_source, cuda_log_spills, cuda_page_divisor, cuda_probe_driver)
from ._extras import DeviceBuffer, Pools, bf16_to_f32, dtype_size, f16_to_f32, f32_to_bf16, f32_to_f16
from ._enums import (AttnPath, CpuIsa, DebugFlags, Dtype, EventType, Location, LogLevel, Mask, PlanFeature,
                     PlanKind, PosMode, RetireMode, RopeStyle, Visibility)
from ._graphs import CudaGraph
from ._sched import LockstepGroup, PlanDesc, RequestGroup
from ._stream import BlobLayout, BlobRange, ExportStream, ImportStream, Ucx, hmac_sha256, sha256, ucx_probe, xxh64
from ._core import VISIBILITY, default_threads
from ._backend import CpuBackend, CudaBackend, backend
from ._research import CausalKVCache, LayerCache, pages_needed, retention_from_research
from ._errors import ERROR_CLASSES, MskvError, TensorError, error_for
from ._errors import *  # noqa: F401,F403  (one class per result code: OutOfPagesError, ...)

library_path = _ffi.library_path
RESIDENT, OFFLOADED = Location.RESIDENT, Location.OFFLOADED   # RequestInfo.location
__version__ = "0.2.0"


def result_string(code: int) -> str:
    """The library's description of a result code."""
    return _ffi.lib.mskv_result_string(code).decode()
from . import interop  # FlashInfer / flash-attn arguments from a plan (docs/interop.md)
