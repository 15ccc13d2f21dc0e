"""The header's enums and flag sets as enum.IntEnum / enum.IntFlag, with the
values of mstar_kv.h / mstar_kv_cuda.h (taken from _ffi.CONSTANTS, which the
test suite compares with the headers). Every call that takes one also takes
its plain int and its lower-case name ("causal", "1d", "bf16", ...)."""
import enum
from typing import Union

from ._ffi import CONSTANTS


class _Parse:
    """parse(): a member from a member, its int value, its name or an alias (any case)."""

    @classmethod
    def parse(cls, value: Union[str, int], what: str = "value"):
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.lower()
            key = cls._aliases().get(key, key)
            for m in cls:
                if m.name.lower() == key:
                    return m
            raise ValueError("%s: %r is not one of %s" % (what, value, ", ".join(cls.names())))
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError("%s: expected one of %s (a name or an mstar_kv.%s), got %s"
                            % (what, ", ".join(cls.names()), cls.__name__, type(value).__name__))
        try:
            return cls(value.__index__())
        except ValueError:
            raise ValueError("%s: %r is not one of %s (%s)" % (what, value, ", ".join(cls.names()),
                                                               ", ".join(str(int(m)) for m in cls))) from None

    @classmethod
    def names(cls):
        """The lower-case names parse() takes (aliases included)."""
        return [m.name.lower() for m in cls] + list(cls._aliases())

    @classmethod
    def _aliases(cls):
        return {}


def _make(name, base, prefix, members, aliases=None, doc=""):
    """An enum class whose member NAME has the value of the C constant prefix + NAME."""
    cls = base(name, [(m, CONSTANTS[prefix + m]) for m in members], module="mstar_kv")
    cls.__doc__ = doc + " (C: %s*)." % prefix
    cls._cnames_ = {m: prefix + m for m in members}
    al = dict(aliases or {})
    cls._aliases = classmethod(lambda c: al)
    for attr in ("parse", "names"):
        setattr(cls, attr, classmethod(getattr(_Parse, attr).__func__))
    return cls


Dtype = _make("Dtype", enum.IntEnum, "MSKV_DTYPE_", ["F32", "F16", "BF16"],
              {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "uint16": "bf16"},
              "Element types of the store, q and o (bf16 arrays may be uint16 bits)")
Mask = _make("Mask", enum.IntEnum, "MSKV_MASK_", ["NONE", "CAUSAL", "WINDOW"], doc="Attention masks")
PosMode = _make("PosMode", enum.IntEnum, "MSKV_", ["POS_NONE", "POS_1D", "POS_3D"],
                {"none": "pos_none", "1d": "pos_1d", "3d": "pos_3d"}, "RoPE position plans")
PlanKind = _make("PlanKind", enum.IntEnum, "MSKV_PLAN_", ["SELF", "CROSS", "DENSE", "PREFIX"], doc="Plan kinds")
Visibility = _make("Visibility", enum.IntEnum, "MSKV_VIS_", ["EXACT", "PAGES", "CALLER"],
                   doc="Which keys of a segment a plan lets its queries see")
EventType = _make("EventType", enum.IntEnum, "MSKV_EVENT_", ["PAGE_STORED", "PAGE_REMOVED"],
                  doc="Arena events (Event.type names them in lower case)")
RetireMode = _make("RetireMode", enum.IntEnum, "MSKV_RETIRE_", ["IMMEDIATE", "FENCED"],
                   doc="When freed pages become reusable")
Location = _make("Location", enum.IntEnum, "MSKV_", ["RESIDENT", "OFFLOADED"],
                 doc="Where a request's pages are (RequestInfo.location)")
RopeStyle = _make("RopeStyle", enum.IntEnum, "MSKV_ROPE_", ["HALF", "INTERLEAVED"], doc="RoPE pair layouts")
LogLevel = _make("LogLevel", enum.IntEnum, "MSKV_LOG_", ["DEBUG", "INFO", "WARN", "ERROR"], doc="Log levels")
CpuIsa = _make("CpuIsa", enum.IntEnum, "MSKV_CPU_ISA_", ["AUTO", "PORTABLE", "AVX2", "AVX512", "NEON",
                                                             "AVX512_BF16", "BF16_EMU", "AMX_BF16"],
               doc="Instruction-set paths of the CPU attention kernels")
AttnPath = _make("AttnPath", enum.IntEnum, "MSKV_CUDA_ATTN_", ["AUTO", "MMA", "WGMMA"],
                 doc="Which GPU kernel computes attention")
DebugFlags = _make("DebugFlags", enum.IntFlag, "MSKV_DEBUG_", ["POISON", "CHECKSUMS", "ALL"],
                   doc="Arena debug checks (Arena(debug=...))")
PlanFeature = _make("PlanFeature", enum.IntFlag, "MSKV_PLAN_", ["Q_POS", "VISIBILITY"],
                    doc="Optional plan arrays in use (Plan.features)")

ENUMS = [Dtype, Mask, PosMode, PlanKind, Visibility, EventType, RetireMode, Location, RopeStyle, LogLevel, CpuIsa,
         AttnPath, DebugFlags, PlanFeature]
__all__ = [e.__name__ for e in ENUMS]
