"""What a failed call's arguments did wrong, for the C refusals that come
without a logged message (the library validates, but a check made before it
has an arena to log through, or deep in a kernel entry, returns only its
code). Each rule here restates one of the header's documented checks with
the field, the value and the limit; the C call stays the judge: a hint is
only added to an error the library already returned."""
import ctypes

from . import _ffi

C = _ffi.CONSTANTS
_PARAMS = {}


def _arena_desc(d):
    """The first rule of mskv_arena_create's argument check that d breaks, or ""."""
    if d.num_pages < 2:
        return "num_pages %d: an arena needs at least 2 pages (page 0 is the null page)" % d.num_pages
    if d.page_size < 1:
        return "page_size %d: must be >= 1" % d.page_size
    if not 0 <= d.max_requests <= 65535:
        return "max_requests %d: must be in [0, 65535] (0 = 256)" % d.max_requests
    for f in ("num_layers", "kv_heads", "head_dim"):
        if getattr(d, f) < 0:
            return "%s %d: must be >= 0" % (f, getattr(d, f))
    if d.dtype not in (C["MSKV_DTYPE_F32"], C["MSKV_DTYPE_F16"], C["MSKV_DTYPE_BF16"]):
        return "dtype %d: not an mskv_dtype (f32 0, f16 1, bf16 2)" % d.dtype
    if d.retire_mode not in (0, 1):
        return "retire_mode %d: not immediate (0) or fenced (1)" % d.retire_mode
    if d.num_layers > 0 and (d.kv_heads < 1 or d.head_dim < 1):
        return "kv_heads %d, head_dim %d: both must be >= 1 when num_layers (%d) > 0" % (
            d.kv_heads, d.head_dim, d.num_layers)
    if not 0 <= d.num_groups <= C["MSKV_MAX_GROUPS"]:
        return "num_groups %d: must be in [0, MSKV_MAX_GROUPS = %d]" % (d.num_groups, C["MSKV_MAX_GROUPS"])
    if d.debug & ~C["MSKV_DEBUG_ALL"]:
        return "debug 0x%x: only MSKV_DEBUG_POISON (1) and MSKV_DEBUG_CHECKSUMS (2) exist" % d.debug
    if d.num_pages * d.page_size > (1 << 62):
        return "num_pages %d x page_size %d: more than 2**62 slots" % (d.num_pages, d.page_size)
    return ""


def _param(function, args, name):
    """The value of parameter `name` of C function `function` in args (None if it has none)."""
    if not _PARAMS:
        _PARAMS.update(_ffi.parameters(_ffi.DECLARATIONS))
    for i, (_, pname) in enumerate(_PARAMS.get(function, ())):
        if pname == name and i < len(args):
            return args[i]
    return None


def explain(function, code, arena, args):
    """A sentence naming the argument, its value and the limit, or ""."""
    try:
        if function == "mskv_arena_create" and args:
            return _arena_desc(args[0]._obj)
        if arena is None or arena._h is None:
            return ""
        info = arena._info
        layer = _param(function, args, "layer")
        if code == C["MSKV_ERROR_OUT_OF_RANGE"] and isinstance(layer, int) and not 0 <= layer < info.num_layers:
            return "layer %d is not in [0, %d) (the arena's num_layers)" % (layer, info.num_layers)
        if code == C["MSKV_ERROR_INVALID_ARGUMENT"] and function.startswith("mskv_cpu_") and \
                info.head_dim > C["MSKV_CPU_MAX_HEAD_DIM"]:
            return "head_dim %d is past MSKV_CPU_MAX_HEAD_DIM = %d, the CPU backend's limit" % (
                info.head_dim, C["MSKV_CPU_MAX_HEAD_DIM"])
    except (AttributeError, TypeError, ValueError, ctypes.ArgumentError):
        return ""
    return ""
