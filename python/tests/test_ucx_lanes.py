"""Which UCX lanes a migration really uses, from Python (Ucx.lanes,
mskv_ucx_lanes): with shared memory allowed the pages take a
shared-memory transport of their own endpoint while the connection stays
on TCP; with UCX_TLS=tcp, or lanes=1, everything is TCP. Both sides live
in this process (a receiver thread), which UCX's shared memory serves as
it would two processes."""
import os
import threading

import pytest

import mstar_kv as mk
from conftest import filled

SHM = ("posix/", "sysv/", "cma/", "knem/", "xpmem/")
KW = dict(num_pages=32, page_size=4, num_layers=2, kv_heads=2, head_dim=8)


def _need_ucx():
    ok, why = mk.ucx_probe()
    if not ok:
        pytest.skip("UCX cannot be loaded here: %s" % why)


def _part(line, name):
    """The transports after "name " up to ';' or '(' in a lanes line."""
    rest = line.split(name + " ", 1)[1]
    return rest.split(";")[0].split("(")[0].split()


def _move_and_report(tls, lanes):
    """Moves one request from a sender here to a receiver thread with
    UCX_TLS=tls; returns (sender's lanes, receiver's lanes, the bytes match)."""
    old = os.environ.get("UCX_TLS")
    os.environ["UCX_TLS"] = tls
    try:
        with mk.Arena(**KW) as src, mk.Arena(**KW) as dst:
            r, _, _ = filled(src, 37, seed=3)
            blob = r.export()
            out, ready = {}, threading.Event()

            def receive():
                try:
                    with mk.Ucx.listen("127.0.0.1", 0, timeout_ms=20000, lanes=lanes) as rx:
                        out["port"] = rx.port
                        ready.set()
                        rx.accept()
                        got = rx.recv(dst)
                        out["same"] = got.export() == blob
                        out["lanes"] = rx.lanes()
                except Exception as e:   # noqa: BLE001  (checked below)
                    out["error"] = e
                    ready.set()
            t = threading.Thread(target=receive)
            t.start()
            ready.wait(30)
            assert "error" not in out, out.get("error")
            with mk.Ucx.connect("127.0.0.1", out["port"], timeout_ms=20000, lanes=lanes) as tx:
                tx.send(src, r, keep=True)
                mine = tx.lanes()
            t.join(60)
            assert "error" not in out, out.get("error")
            return mine, out["lanes"], out["same"]
    finally:
        if old is None:
            os.environ.pop("UCX_TLS", None)
        else:
            os.environ["UCX_TLS"] = old


def test_shared_memory_carries_the_pages_and_tcp_the_connection():
    _need_ucx()
    mine, theirs, same = _move_and_report("shm,tcp", 0)
    print("sender:", mine, "| receiver:", theirs)
    assert same
    for line in (mine, theirs):
        assert line.startswith("control ")
        assert all(t.startswith("tcp/") for t in _part(line, "control")), line
        data = _part(line, "data")
        assert data and all(t.startswith(SHM) for t in data), line   # no silent fall-back to TCP


def test_tcp_only_and_one_endpoint_keep_everything_on_tcp():
    _need_ucx()
    for tls, lanes in (("tcp", 0), ("shm,tcp", 1)):
        mine, _, same = _move_and_report(tls, lanes)
        print(tls, lanes, "sender:", mine)
        assert same
        data = _part(mine, "data")
        assert data and all(t.startswith("tcp/") for t in data), mine
        assert "(one endpoint" in mine


def test_lanes_refuses_a_bad_value_and_an_unconnected_object():
    _need_ucx()
    with pytest.raises(ValueError, match="lanes"):
        mk.Ucx.listen("127.0.0.1", 0, lanes=3)
    with mk.Ucx.listen("127.0.0.1", 0, timeout_ms=1000) as u:
        with pytest.raises(mk.BadStateError):
            u.lanes()
