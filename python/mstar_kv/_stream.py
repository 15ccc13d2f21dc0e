"""Streamed export and import of a request (mskv_request_export_begin ..
mskv_request_import_commit) and the UCX transport that uses them
(mstar_kv_ucx.h).

A streamed blob is the header, then layout.range_count page ranges of
layout.range_bytes each in blob order, then the 8-byte little-endian
checksum: byte for byte what Request.export() returns, read straight from
the pools (export) or written straight into them (import). Only for arenas
with host pools or bookkeeping only (UnsupportedError with a device store)."""
import collections
import ctypes
from typing import Iterator, List, Optional, Tuple

import numpy as np

from ._closing import Closing
from . import _core, _ffi
from ._errors import MskvError, UnsupportedError, error_for
from ._ffi import mskv_blob_layout, mskv_blob_range, mskv_request

byref = ctypes.byref

BlobLayout = collections.namedtuple("BlobLayout", [f for f, _ in mskv_blob_layout._fields_])
BlobLayout.__doc__ = "mskv_blob_layout: header_bytes, blob_bytes, range_count, range_bytes, checksum."


class BlobRange:
    """One page range of a streamed blob (mskv_blob_range): offset (where
    its bytes sit in the blob), page, group, layer, kind (0 K, 1 V), and
    data: a writable NumPy uint8 view of the bytes in place (a pool page or
    a host copy), valid until the stream ends."""
    __slots__ = ("offset", "page", "group", "layer", "kind", "data")

    def __init__(self, r: mskv_blob_range, owner: object):
        self.offset, self.page, self.group, self.layer, self.kind = r.offset, r.page, r.group, r.layer, r.kind
        raw = (ctypes.c_char * r.bytes).from_address(r.data) if r.bytes else bytearray()
        if r.bytes:
            raw.owner = owner   # the arena's memory: kept while the view lives
        self.data = np.frombuffer(raw, dtype=np.uint8)

    def __repr__(self) -> str:
        return "BlobRange(offset=%d, bytes=%d, page=%d, group=%d, layer=%d, kind=%d)" % (
            self.offset, self.data.size, self.page, self.group, self.layer, self.kind)


class _Stream:
    _verb = ""

    def __init__(self, request):
        self._request, self._open = request, True

    request = property(lambda self: self._request)
    layout = property(lambda self: self._layout)
    open = property(lambda self: self._open)

    def ranges(self, first: int = 0, n: Optional[int] = None) -> List[BlobRange]:
        """Ranges [first, first + n) in blob order (n None: to the end)."""
        if not self._open:
            raise MskvError("ranges: the streamed %s has ended" % self._verb)
        if n is None:
            n = max(self._layout.range_count - first, 0)
        out = (mskv_blob_range * max(n, 1))()
        self._request._call("mskv_request_blob_ranges", first, n, out)
        owner = self._request.arena._h
        return [BlobRange(out[i], owner) for i in range(n)]

    def __iter__(self) -> Iterator[BlobRange]:
        step = 256
        for first in range(0, self._layout.range_count, step):
            yield from self.ranges(first, min(step, self._layout.range_count - first))

    def __enter__(self):
        return self


class ExportStream(_Stream):
    """An open streamed export (Request.export_begin()): header (bytes),
    layout (BlobLayout, checksum included), ranges(); end() (or leaving the
    with block) unfreezes the request. blob() joins the parts: the same
    bytes as Request.export()."""
    _verb = "export"

    def __init__(self, request: "_core.Request"):
        super().__init__(request)
        cap = _ffi.CONSTANTS["MSKV_BLOB_HEADER_MAX"]
        header = ctypes.create_string_buffer(cap)
        lay = mskv_blob_layout()
        request._call("mskv_request_export_begin", header, cap, byref(lay))
        self._layout = _core._record(BlobLayout, lay)
        self._header = header.raw[:lay.header_bytes]

    header = property(lambda self: self._header)

    def __repr__(self) -> str:
        return "ExportStream(request=0x%x, blob_bytes=%d, ranges=%d, open=%s)" % (
            self._request.id, self._layout.blob_bytes, self._layout.range_count, self._open)

    def blob(self) -> bytes:
        """header + every range + checksum, as one bytes object."""
        parts = [self._header] + [r.data.tobytes() for r in self]
        parts.append(self._layout.checksum.to_bytes(8, "little"))
        return b"".join(parts)

    def end(self) -> None:
        """Ends the export: the request may change again (mskv_request_export_end)."""
        if self._open:
            self._request._call("mskv_request_export_end")
            self._open = False

    def __exit__(self, *exc):
        self.end()


class ImportStream(_Stream):
    """An open streamed import (Arena.import_begin(header)): the new
    request's pages are taken; write each range's bytes into range.data
    (or call write(blob)), then commit(checksum) verifies them and the
    request exists, resident; abort() gives every page back. Leaving a with
    block without commit aborts."""
    _verb = "import"

    def __init__(self, arena: "_core.Arena", header: bytes):
        hdr = np.frombuffer(memoryview(header).cast("B"), dtype=np.uint8)
        out, lay = mskv_request(), mskv_blob_layout()
        arena._call("mskv_request_import_begin", arena.ptr, hdr.ctypes.data if hdr.size else None, hdr.size,
                    byref(out), byref(lay))
        super().__init__(_core.Request(arena, out.id))
        self._layout = _core._record(BlobLayout, lay)

    def __repr__(self) -> str:
        return "ImportStream(request=0x%x, blob_bytes=%d, ranges=%d, open=%s)" % (
            self._request.id, self._layout.blob_bytes, self._layout.range_count, self._open)

    def write(self, blob: bytes) -> None:
        """Copies every range's bytes from a whole blob (bytes-like) into place."""
        b = np.frombuffer(memoryview(blob).cast("B"), dtype=np.uint8)
        if b.size < self._layout.blob_bytes:
            raise ValueError("write: the blob has %d bytes; the layout says %d" % (b.size, self._layout.blob_bytes))
        for r in self:
            r.data[:] = b[r.offset:r.offset + r.data.size]

    def commit(self, checksum: Optional[int] = None) -> "_core.Request":
        """Verifies checksum (the blob's last 8 bytes as a number; None: the
        layout's, i.e. the header's claim) over what arrived; returns the
        resident request. BlobCorruptError on a mismatch (still open: abort)."""
        if not self._open:
            raise MskvError("commit: the streamed import has ended")
        value = self._layout.checksum if checksum is None else checksum
        self._request._call("mskv_request_import_commit", value)
        self._open = False
        return self._request

    def abort(self) -> None:
        """Drops the import: every page goes back, the handle goes stale."""
        if self._open:
            self._request._call("mskv_request_import_abort")
            self._open = False

    def __exit__(self, *exc):
        self.abort()


class ArenaStreaming:
    """Arena methods: the streamed import."""
    __slots__ = ()

    def import_begin(self, header: bytes) -> ImportStream:
        """Begins a streamed import from a blob's header (bytes-like; the rest
        of the blob is not needed yet): takes every page, all or nothing,
        and returns the open ImportStream (mskv_request_import_begin)."""
        return ImportStream(self, header)


# ---- UCX ---------------------------------------------------------------------------------------

def _need_ucx():
    if getattr(_ffi.lib, "ucx_missing", None):
        raise UnsupportedError("mstar_kv: %s was built without mstar_kv_ucx.h (missing %s)"
                               % (_ffi.library_path, ", ".join(_ffi.lib.ucx_missing)),
                               code=_ffi.CONSTANTS["MSKV_ERROR_UNSUPPORTED"])


def ucx_probe(library: Optional[str] = None) -> Tuple[bool, str]:
    """(True, "") when UCX (libucp.so.0, or library) can be loaded, else
    (False, the loader's reason) (mskv_ucx_probe)."""
    _need_ucx()
    why = ctypes.create_string_buffer(1024)
    code = _ffi.lib.mskv_ucx_probe(library.encode() if library else None, why, len(why))
    return code == 0, why.value.decode(errors="replace")


def _ucx_check(code, function, library):
    if code != 0:
        ok, why = ucx_probe(library)
        raise error_for(code, function, "" if ok else why)


class Ucx(Closing):
    """One UCX connection (mskv_ucx) for moving requests between arenas in
    two processes or machines: Ucx.listen() then accept() and recv() on the
    receiving side, Ucx.connect() then send() on the sending side. Each
    object belongs to one thread at a time. A context manager; close()."""

    def __init__(self, _ptr: int, _desc: object):
        self._ptr, self._desc = _ptr, _desc
        self._arena: Optional["_core.Arena"] = None   # the arena of the last send/recv (resolve's)

    @staticmethod
    def _make_desc(library, timeout_ms, message_bytes, secret=None, lanes=0):
        d = _ffi.mskv_ucx_desc()
        d.library = library.encode() if library else None
        d.timeout_ms, d.message_bytes = timeout_ms, message_bytes
        if lanes not in (0, 1, 2):
            raise ValueError("lanes: expected 0 or 2 (a data endpoint for the pages) or 1 (one endpoint), got %r" % (lanes,))
        d.lanes = lanes
        if secret is not None:
            if not isinstance(secret, (bytes, bytearray)):
                raise TypeError("secret: expected bytes (1 to 1024 of them), got %s" % type(secret).__name__)
            buf = ctypes.create_string_buffer(bytes(secret), len(secret))
            d.secret, d.secret_bytes = ctypes.addressof(buf), len(secret)
            d._secret_buf = buf   # alive as long as the desc (C copies it at listen/connect)
        return d

    @classmethod
    def listen(cls, ip: str = "127.0.0.1", port: int = 0, timeout_ms: int = 0, message_bytes: int = 0,
               library: Optional[str] = None, secret: Optional[bytes] = None, lanes: int = 0) -> "Ucx":
        """A listener on ip:port (port 0: any free port; see .port).
        timeout_ms (0 = 10 s) bounds every wait for the peer. message_bytes:
        page bytes per message, 0 = 4 MiB, else 4096 to 256 MiB
        (InvalidArgumentError outside). secret (bytes):
        refuse every offer without a valid HMAC-SHA-256 under it
        (DeniedError, before a page is taken). For untrusted networks use
        listen_address(): a listening UCX socket can be aborted by junk.
        lanes (every constructor): 0 or 2 sends the pages on a data endpoint
        of their own (shared memory on one host), 1 keeps everything on the
        connection's endpoint (mskv_ucx_desc.lanes; see .lanes())."""
        _need_ucx()
        d = cls._make_desc(library, timeout_ms, message_bytes, secret, lanes)
        out = ctypes.c_void_p()
        _ucx_check(_ffi.lib.mskv_ucx_listen(byref(d), ip.encode(), port, byref(out)), "mskv_ucx_listen", library)
        return cls(out.value, d)

    @classmethod
    def connect(cls, ip: str, port: int, timeout_ms: int = 0, message_bytes: int = 0,
                library: Optional[str] = None, secret: Optional[bytes] = None, lanes: int = 0) -> "Ucx":
        """The sending side: an endpoint to ip:port (completes with the first
        message); secret signs its offers."""
        _need_ucx()
        d = cls._make_desc(library, timeout_ms, message_bytes, secret, lanes)
        out = ctypes.c_void_p()
        _ucx_check(_ffi.lib.mskv_ucx_connect(byref(d), ip.encode(), port, byref(out)), "mskv_ucx_connect", library)
        return cls(out.value, d)

    @classmethod
    def listen_address(cls, timeout_ms: int = 0, message_bytes: int = 0, library: Optional[str] = None,
                       secret: Optional[bytes] = None, lanes: int = 0) -> "Ucx":
        """A receiver reached through its worker address (.address, sent to
        the peer out of band) instead of a listening socket: the rendezvous
        for untrusted networks (mskv_ucx_listen_address)."""
        _need_ucx()
        d = cls._make_desc(library, timeout_ms, message_bytes, secret, lanes)
        out = ctypes.c_void_p()
        _ucx_check(_ffi.lib.mskv_ucx_listen_address(byref(d), byref(out)), "mskv_ucx_listen_address", library)
        return cls(out.value, d)

    @property
    def address(self) -> bytes:
        """This side's UCX worker address (mskv_ucx_address), for connect_address."""
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        _core._check(_ffi.lib.mskv_ucx_address(self.ptr, byref(p), byref(n)), "mskv_ucx_address")
        return ctypes.string_at(p.value, n.value)

    @classmethod
    def connect_address(cls, address: bytes, timeout_ms: int = 0, message_bytes: int = 0,
                        library: Optional[str] = None, secret: Optional[bytes] = None, lanes: int = 0) -> "Ucx":
        """The sending side, to a receiver's worker address (its .address)."""
        _need_ucx()
        if not isinstance(address, (bytes, bytearray)):
            raise TypeError("address: expected bytes (a receiver's Ucx.address), got %s" % type(address).__name__)
        d = cls._make_desc(library, timeout_ms, message_bytes, secret, lanes)
        out = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(bytes(address), len(address))
        _ucx_check(_ffi.lib.mskv_ucx_connect_address(byref(d), buf, len(address), byref(out)),
                   "mskv_ucx_connect_address", library)
        return cls(out.value, d)

    def in_doubt(self) -> Tuple[int, Optional["_core.Request"]]:
        """(0, None) when no hand-over is in doubt; (1, request) as the
        sender, (2, request) as the receiver, the request frozen until
        resolve() (mskv_ucx_in_doubt)."""
        r = mskv_request()
        side = _ffi.lib.mskv_ucx_in_doubt(self.ptr, byref(r))
        if side == 0 or self._arena is None:
            return side, None
        return side, _core.Request(self._arena, r.id)

    def resolve(self, committed: bool) -> Optional["_core.Request"]:
        """Ends a hand-over in doubt (InDoubtError from send/recv): committed
        True when the other side returned success or was in doubt too, False
        when it returned another error (mskv_ucx_resolve; see mstar_kv_ucx.h
        for the rule). A receiver gets its now usable request back
        (committed) or None; a sender None."""
        out = mskv_request()
        outcome = _ffi.CONSTANTS["MSKV_UCX_COMMITTED" if committed else "MSKV_UCX_ABORTED"]
        _core._check(_ffi.lib.mskv_ucx_resolve(self.ptr, outcome, byref(out)), "mskv_ucx_resolve")
        if out.id and self._arena is not None:
            return _core.Request(self._arena, out.id)
        return None

    @property
    def ptr(self) -> int:
        if not self._ptr:
            raise MskvError("the UCX connection is closed")
        return self._ptr

    @property
    def port(self) -> int:
        """The port a listener is bound to."""
        p = ctypes.c_uint16()
        _core._check(_ffi.lib.mskv_ucx_port(self.ptr, byref(p)), "mskv_ucx_port")
        return p.value

    def __repr__(self) -> str:
        return "Ucx(%s)" % ("closed" if not self._ptr else "0x%x" % self._ptr)

    def lanes(self) -> str:
        """Which UCX transports carry the tag messages on each endpoint, e.g.
        "control tcp/lo; data posix/memory cma/memory" (mskv_ucx_lanes): call
        it once connected. It makes the data endpoint if it is not there yet."""
        buf = ctypes.create_string_buffer(1024)
        _core._check(_ffi.lib.mskv_ucx_lanes(self.ptr, buf, len(buf)), "mskv_ucx_lanes")
        return buf.value.decode(errors="replace")

    def accept(self) -> None:
        """Waits (timeout_ms) for one peer to connect to the listener."""
        _core._check(_ffi.lib.mskv_ucx_accept(self.ptr), "mskv_ucx_accept")

    def send(self, arena: "_core.Arena", request: "_core.Request", keep: bool = False) -> None:
        """Moves request to the peer (mskv_ucx_send): removed once the peer
        acknowledged it (keep: a copy, the request stays). On any failure the
        request is as it was and the error says why."""
        if not isinstance(request, _core.Request) or request.arena is not arena:
            raise TypeError("send: request: expected a Request of the arena, got %r" % (request,))
        flags = _ffi.CONSTANTS["MSKV_UCX_KEEP"] if keep else 0
        self._arena = arena
        arena._call("mskv_ucx_send", self.ptr, arena.ptr, request._c, flags)

    def recv(self, arena: "_core.Arena") -> "_core.Request":
        """Receives one request into arena: a new, resident request."""
        out = mskv_request()
        self._arena = arena
        arena._call("mskv_ucx_recv", self.ptr, arena.ptr, byref(out))
        return _core.Request(arena, out.id)

    def close(self) -> None:
        """Closes the connection (and the listener)."""
        if getattr(self, "_ptr", None):
            _ffi.lib.mskv_ucx_destroy(self._ptr)
            self._ptr = None

    __del__ = close


def sha256(data: bytes) -> bytes:
    """SHA-256 (FIPS 180-4) of data, the library's own (mskv_sha256)."""
    _need_ucx()
    out = ctypes.create_string_buffer(32)
    _ffi.lib.mskv_sha256(bytes(data), len(data), out)
    return out.raw


def hmac_sha256(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA-256 (RFC 2104) of data under key: what signs a UCX offer (mskv_hmac_sha256)."""
    _need_ucx()
    out = ctypes.create_string_buffer(32)
    _ffi.lib.mskv_hmac_sha256(bytes(key), len(key), bytes(data), len(data), out)
    return out.raw


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of data (the blob and host-copy checksum, seed 0; mskv_xxh64)."""
    return int(_ffi.lib.mskv_xxh64(bytes(data), len(data), seed))


__all__ = ["BlobLayout", "BlobRange", "ExportStream", "ImportStream", "Ucx", "ucx_probe", "sha256", "hmac_sha256",
           "xxh64"]
