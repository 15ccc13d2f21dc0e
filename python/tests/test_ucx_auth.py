"""The migration layer's hashes and authentication from Python: SHA-256,
HMAC-SHA-256 and XXH64 against their published values (and Python's own
hashlib/hmac), an authenticated transfer, a wrong secret refused before a
page is taken, and the worker-address rendezvous."""
import hashlib
import hmac
import os
import threading

import pytest

import mstar_kv as mk
from conftest import filled


def test_sha256_and_hmac_match_the_published_values_and_hashlib():
    assert mk.sha256(b"abc").hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert mk.sha256(b"").hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    seed = int.from_bytes(os.urandom(4), "little")
    print("seed", seed)
    data = bytes((seed * 7 + i * 13) & 0xFF for i in range(1000))
    for n in (0, 1, 55, 56, 63, 64, 65, 1000):
        assert mk.sha256(data[:n]) == hashlib.sha256(data[:n]).digest(), n
    # RFC 4231 test case 2
    assert mk.hmac_sha256(b"Jefe", b"what do ya want for nothing?").hex() == \
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    for kn in (0, 1, 64, 65, 200):
        key = data[:kn]
        assert mk.hmac_sha256(key, data[kn:kn + 100]) == hmac.new(key, data[kn:kn + 100], hashlib.sha256).digest()


def test_xxh64_matches_the_published_values():
    assert mk.xxh64(b"") == 0xEF46DB3751D8E999
    assert mk.xxh64(b"abc") == 0x44BC2CF5AD770999
    assert mk.xxh64(b"", seed=1) != mk.xxh64(b"")


def _need_ucx():
    ok, why = mk.ucx_probe()
    if not ok:
        pytest.skip("UCX cannot be loaded here: %s" % why)


KW = dict(num_pages=32, page_size=4, num_layers=2, kv_heads=2, head_dim=8)


def _transfer(make_rx, make_tx, src, dst, r):
    """Runs a receiver thread (make_rx() -> Ucx; accept, recv into dst) and a
    sender (make_tx(rx) -> Ucx; send r with keep). Returns (received, rx error, tx error)."""
    got, errors, ready = [], [], threading.Event()
    holder = {}

    def receive():
        try:
            with make_rx() as rx:
                holder["rx"] = rx
                ready.set()
                rx.accept()
                got.append(rx.recv(dst))
        except Exception as e:   # noqa: BLE001  (checked by the caller)
            errors.append(e)
            ready.set()
    t = threading.Thread(target=receive)
    t.start()
    ready.wait(30)
    tx_error = None
    try:
        with make_tx(holder.get("rx")) as tx:
            tx.send(src, r, keep=True)
    except Exception as e:   # noqa: BLE001
        tx_error = e
    t.join(60)
    return (got[0] if got else None), (errors[0] if errors else None), tx_error


def test_a_shared_secret_lets_the_invited_peer_in_and_refuses_a_wrong_one_before_any_page():
    _need_ucx()
    with mk.Arena(**KW) as src, mk.Arena(**KW) as dst:
        r, _, _ = filled(src, 9, seed=5)
        blob = r.export()
        port = {}

        def rx_with(secret):
            def make():
                u = mk.Ucx.listen("127.0.0.1", 0, timeout_ms=20000, secret=secret)
                port["p"] = u.port
                return u
            return make
        got, rx_err, tx_err = _transfer(rx_with(b"open sesame"),
                                        lambda rx: mk.Ucx.connect("127.0.0.1", port["p"], timeout_ms=20000,
                                                                  secret=b"open sesame"), src, dst, r)
        assert rx_err is None and tx_err is None, (rx_err, tx_err)
        assert got.export() == blob
        free = dst.stats().free_pages
        got2, rx_err, tx_err = _transfer(rx_with(b"open sesame"),
                                         lambda rx: mk.Ucx.connect("127.0.0.1", port["p"], timeout_ms=20000,
                                                                   secret=b"guess"), src, dst, r)
        assert got2 is None and isinstance(rx_err, mk.DeniedError), (rx_err, tx_err)
        assert dst.stats().free_pages == free          # refused before a page was taken
        assert r.info().committed == 9                 # the sender keeps its request
        with pytest.raises(TypeError, match="secret"):
            mk.Ucx.listen("127.0.0.1", 0, secret="text")


def test_the_worker_address_rendezvous_moves_a_request():
    _need_ucx()
    with mk.Arena(**KW) as src, mk.Arena(**KW) as dst:
        r, _, _ = filled(src, 7, seed=9)
        blob = r.export()
        got, rx_err, tx_err = _transfer(lambda: mk.Ucx.listen_address(timeout_ms=20000),
                                        lambda rx: mk.Ucx.connect_address(rx.address, timeout_ms=20000),
                                        src, dst, r)
        assert rx_err is None and tx_err is None, (rx_err, tx_err)
        assert got.export() == blob
        with pytest.raises(TypeError, match="address"):
            mk.Ucx.connect_address("not bytes")


def test_nothing_in_doubt_after_a_clean_transfer_and_resolve_says_so():
    _need_ucx()
    with mk.Ucx.listen("127.0.0.1", 0, timeout_ms=2000) as u:
        assert u.in_doubt() == (0, None)
        with pytest.raises(mk.BadStateError):
            u.resolve(True)


def test_message_bytes_outside_4096_to_256_mib_is_refused_and_its_ends_are_fine():
    _need_ucx()
    for bad in (1, 4095, (256 << 20) + 1):
        with pytest.raises(mk.InvalidArgumentError):
            mk.Ucx.listen("127.0.0.1", 0, message_bytes=bad)
    for good in (0, 4096, 256 << 20):
        with mk.Ucx.listen("127.0.0.1", 0, message_bytes=good) as u:
            assert u.port > 0
