"""Streamed export / import (the blob read from and written into the pools
in place) and the UCX transport, from Python."""
import threading

import numpy as np
import pytest

import mstar_kv as mk
from conftest import filled


def test_a_streamed_export_is_the_exported_blob_byte_for_byte(arena):
    r, _, _ = filled(arena, 11, seed=3)
    r.protect_prefix(4)
    blob = r.export()
    with r.export_begin() as ex:
        assert ex.layout.blob_bytes == len(blob) and ex.layout.header_bytes == len(ex.header)
        assert ex.layout.range_count == 3 * 2 * 2     # 3 pages x 2 layers x (K, V)
        with pytest.raises(mk.BadStateError):
            arena.admit([(r, 1)])                    # frozen while the export is open
        assert ex.blob() == blob
        ranges = ex.ranges()
        assert [x.offset for x in ranges] == sorted(x.offset for x in ranges)
        assert all(x.data.size == ex.layout.range_bytes for x in ranges)
    assert not ex.open
    arena.admit([(r, 1)])                            # unfrozen


def test_a_streamed_import_round_trips_bytes_identical_and_a_bad_checksum_is_refused():
    g = np.random.default_rng(5)
    print("seed 5")
    kw = dict(num_pages=32, page_size=4, num_layers=2, kv_heads=2, head_dim=8)
    with mk.Arena(**kw) as src, mk.Arena(**kw) as dst:
        r, _, _ = filled(src, 10, seed=int(g.integers(1 << 30)))
        blob = r.export()
        free = dst.stats().free_pages
        imp = dst.import_begin(blob[:mk._ffi.CONSTANTS["MSKV_BLOB_HEADER_MAX"]])
        assert dst.stats().free_pages == free - 3        # every page taken at begin
        imp.write(blob)
        with pytest.raises(mk.BlobCorruptError):
            imp.commit(imp.layout.checksum ^ 1)
        got = imp.commit(int.from_bytes(blob[-8:], "little"))
        assert got.info().location == mk.RESIDENT and got.info().committed == 10
        assert got.export() == blob
        assert np.array_equal(dst.pool(0, "k")[got.pages()], src.pool(0, "k")[r.pages()])
        # an aborted import gives every page back
        with dst.import_begin(blob) as imp2:
            pass
        assert not imp2.open and dst.stats().free_pages == free - 3


def test_streamed_export_is_unsupported_on_a_truncated_header(arena):
    r, _, _ = filled(arena, 5)
    blob = r.export()
    with pytest.raises(mk.BlobTruncatedError):
        arena.import_begin(blob[:10])


def test_ucx_moves_a_request_between_two_arenas():
    ok, why = mk.ucx_probe()
    if not ok:
        pytest.skip("UCX cannot be loaded here: %s" % why)
    kw = dict(num_pages=32, page_size=4, num_layers=2, kv_heads=2, head_dim=8)
    with mk.Arena(**kw) as src, mk.Arena(**kw) as dst:
        r, _, _ = filled(src, 9, seed=11)
        blob = r.export()
        got, errors = [], []
        rx = mk.Ucx.listen("127.0.0.1", 0, timeout_ms=20000)
        port = rx.port
        assert port > 0

        def receive():
            # each side closes on its own thread: a close waits for the peer's side of the shutdown
            try:
                with rx:
                    rx.accept()
                    got.append(rx.recv(dst))
            except Exception as e:   # noqa: BLE001  (reported by the main thread)
                errors.append(e)
        t = threading.Thread(target=receive)
        t.start()
        with mk.Ucx.connect("127.0.0.1", port, timeout_ms=20000) as tx:
            tx.send(src, r, keep=True)
        t.join(60)
        assert not errors, errors
        assert got[0].export() == blob
        assert r.info().committed == 9             # keep=True: a copy


def test_ucx_refuses_a_bad_address_and_a_closed_connection():
    ok, why = mk.ucx_probe()
    if not ok:
        pytest.skip("UCX cannot be loaded here: %s" % why)
    with pytest.raises(mk.InvalidArgumentError):
        mk.Ucx.listen("not an address", 0)
    with pytest.raises(OverflowError, match="port"):
        mk.Ucx.listen("127.0.0.1", 70000)
    u = mk.Ucx.listen("127.0.0.1", 0)
    u.close()
    with pytest.raises(mk.MskvError, match="closed"):
        u.accept()


def test_ucx_probe_names_a_missing_library():
    ok, why = mk.ucx_probe("/nonexistent/libucp.so.0")
    assert not ok and "libucp" in why
