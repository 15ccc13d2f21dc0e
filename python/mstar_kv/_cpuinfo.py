"""The CPU backend's instruction-set paths (mskv_cpu_isa_name,
mskv_cpu_isa_available) and what a pool runs on (Cpu.info, mskv_cpu_info_get)."""
import collections
import ctypes
from typing import Dict, Union

from . import _core, _ffi
from ._enums import CpuIsa

CpuInfo = collections.namedtuple("CpuInfo", [f for f, _ in _ffi.mskv_cpu_info._fields_])
CpuInfo.__doc__ = ("mskv_cpu_info: num_threads, isa (the CpuIsa in use, never AUTO), workspace_bytes "
                   "(per thread), last_call_items (work items of the last attention call).")


def cpu_isa_name(isa: Union[CpuIsa, int, str]) -> str:
    """"auto", "portable", "avx2", "avx512", "neon", "avx512_bf16", "bf16_emu" or "amx_bf16" (mskv_cpu_isa_name)."""
    return _ffi.lib.mskv_cpu_isa_name(CpuIsa.parse(isa, "isa")).decode()


def cpu_isa_available(isa: Union[CpuIsa, int, str]) -> bool:
    """Whether this build and CPU can run the path (mskv_cpu_isa_available; AUTO: always)."""
    return bool(_ffi.lib.mskv_cpu_isa_available(CpuIsa.parse(isa, "isa")))


def cpu_isas() -> Dict[str, bool]:
    """{name: available} of every path."""
    return {cpu_isa_name(i): cpu_isa_available(i) for i in CpuIsa}


def _info(self) -> CpuInfo:
    """What the pool runs on (mskv_cpu_info_get): threads, the ISA path
    chosen (a CpuIsa), workspace per thread, and how many work items the
    last attention call was cut into."""
    out = _ffi.mskv_cpu_info()
    _core._check(_ffi.lib.mskv_cpu_info_get(self.ptr, ctypes.byref(out)), "mskv_cpu_info_get")
    rec = _core._record(CpuInfo, out)
    return rec._replace(isa=CpuIsa(rec.isa))


_info.__name__, _info.__qualname__ = "info", "Cpu.info"
_core.Cpu.info = _info   # added here (not in _core.py's class body): Cpu's own lines are another branch's
