"""One exception class per mskv_result code, all under MskvError.

The message is the library's own (mskv_result_string), the C function that
failed, and the logger's detail when the call logged one."""
from typing import Optional

from . import _ffi


class MskvError(Exception):
    """A failed mstar_kv call. .code is the mskv_result value, .name its C
    name, .detail what the library's logger said about it ("" if nothing)."""
    code = None
    name = "MSKV_ERROR"

    def __init__(self, message: str, code: Optional[int] = None, detail: str = "", function: str = ""):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.detail = detail
        self.function = function


class TensorError(ValueError):
    """An array or tensor argument the C call would not accept (dtype, shape,
    device, layout, alignment); raised before any C call is made."""


# extra builtin bases where one says the same thing
_ALSO = {"MSKV_ERROR_INVALID_ARGUMENT": (ValueError,), "MSKV_ERROR_INVALID_SPEC": (ValueError,),
         "MSKV_ERROR_OUT_OF_MEMORY": (MemoryError,)}

_BY_CODE = {}


# names that would shadow a builtin exception
_RENAMED = {"MSKV_ERROR_OVERFLOW": "SizeOverflowError", "MSKV_ERROR_IO": "MskvIOError",
            "MSKV_ERROR_TIMEOUT": "PeerTimeoutError"}


def _class_name(c_name):
    if c_name in _RENAMED:
        return _RENAMED[c_name]
    words = c_name[len("MSKV_ERROR_"):].lower().split("_")
    return "".join(w.capitalize() for w in words) + "Error"


for _code, _cname in _ffi.RESULTS:
    _cls = type(_class_name(_cname), (MskvError,) + _ALSO.get(_cname, ()),
                {"code": _code, "name": _cname,
                 "__doc__": "%s (%d)." % (_cname, _code), "__module__": "mstar_kv"})
    globals()[_cls.__name__] = _cls
    _BY_CODE[_code] = _cls

ERROR_CLASSES = dict(_BY_CODE)


def error_for(code: int, function: str = "", detail: str = "") -> "MskvError":
    """The exception for a result code (MskvError itself for a code this
    package does not know yet)."""
    cls = _BY_CODE.get(code, MskvError)
    text = _ffi.lib.mskv_result_string(code).decode()
    name = cls.name if cls is not MskvError else "result %d" % code
    msg = "%s: %s (%s)" % (function, text, name) if function else "%s (%s)" % (text, name)
    if detail:
        msg += ": " + detail
    return cls(msg, code=code, detail=detail, function=function)

__all__ = ["MskvError", "TensorError", "error_for", "ERROR_CLASSES"] + [c.__name__ for c in _BY_CODE.values()]
