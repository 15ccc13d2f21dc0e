"""Arrays and tensors from any protocol, and bad ones refused with a clear
TensorError before any C call (the no_c_calls fixture fails a test that
reaches the library)."""
import re
import weakref

import numpy as np
import pytest

import mstar_kv as mk
from conftest import filled


class ArrayInterfaceOnly:
    """Host memory seen only through __array_interface__."""

    def __init__(self, a):
        self._a = a
        self.__array_interface__ = a.__array_interface__


class DLPackOnly:
    """A DLPack producer (backed by a NumPy array) with nothing else."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class FakeCudaArray:
    """Device memory as CuPy or Numba describe it (nothing is read from it here)."""

    def __init__(self, shape, typestr="<f2", ptr=0x7F0000000000, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


@pytest.fixture
def step(arena):
    """A plan of 5 new tokens after 7 committed ones, K/V written."""
    r, _, _ = filled(arena, 7)
    arena.admit([(r, 5)])
    plan = arena.plan_build([(r, 5)], mk.Plan(1, 16, 16))
    kv = np.random.default_rng(1).standard_normal((5, 2, 8)).astype(np.float32)
    arena.write_kv(0, plan, kv, kv)
    return plan


def _q(n=5, heads=4, dim=8, dtype=np.float32):
    return np.random.default_rng(2).standard_normal((n, heads, dim)).astype(dtype)


def test_array_interface_and_dlpack_inputs_give_the_numpy_result(arena, step):
    q = _q()
    expect = mk.attention(arena, 0, step, q)
    assert np.array_equal(mk.attention(arena, 0, step, ArrayInterfaceOnly(q)), expect)
    assert np.array_equal(mk.attention(arena, 0, step, DLPackOnly(q)), expect)


def test_outputs_are_written_in_place_through_dlpack_and_array_interface(arena, step):
    q = _q()
    expect = mk.attention(arena, 0, step, q)
    for wrap in (ArrayInterfaceOnly, DLPackOnly):
        out = np.zeros_like(q)
        mk.attention(arena, 0, step, q, out=wrap(out))
        assert np.array_equal(out, expect)


def test_bf16_is_taken_as_uint16_bits():
    with mk.Arena(num_pages=64, page_size=4, num_layers=1, kv_heads=2, head_dim=8, dtype="bf16") as a:
        r = a.add_request()
        a.admit([(r, 5)])
        plan = a.plan_build([(r, 5)], mk.Plan(1, 8, 8))
        kv = mk.to_bf16(np.ones((5, 2, 8), np.float32))
        a.write_kv(0, plan, kv, kv)
        o = mk.attention(a, 0, plan, mk.to_bf16(_q()))
        assert o.dtype == np.uint16 and np.allclose(mk.from_bf16(o), 1.0)


BAD_Q = [
    ("dtype float64", lambda: _q(dtype=np.float64)),
    ("dtype int32", lambda: _q(dtype=np.int32)),
    ("shape (5, 4, 4)", lambda: _q(dim=4)),
    ("shape (6, 4, 8)", lambda: _q(n=6)),
    ("shape (5, 32)", lambda: _q().reshape(5, 32)),
    ("not C-contiguous", lambda: _q(heads=8)[:, ::2]),
    ("not C-contiguous", lambda: np.ascontiguousarray(_q().transpose(2, 1, 0)).transpose(2, 1, 0)),
    ("not aligned to 4 bytes", lambda: np.ndarray((5, 4, 8), np.float32, np.zeros(641, np.uint8).data, offset=1)),
    ("is on cuda", lambda: FakeCudaArray((5, 4, 8), "<f4")),
    ("expected an array or tensor", lambda: [[0.0] * 8] * 5),
    ("not a multiple of the 2 kv heads", lambda: _q(heads=3)),
]


@pytest.mark.parametrize("message,make", BAD_Q, ids=[m for m, _ in BAD_Q])
def test_bad_query_is_refused_before_any_c_call(arena, step, no_c_calls, message, make):
    with pytest.raises(mk.TensorError, match=re.escape(message)):
        mk.attention(arena, 0, step, make())
    assert no_c_calls.called == []


BAD_OUT = [
    ("is read-only", lambda q: np.frombuffer(np.zeros_like(q).tobytes(), np.float32).reshape(q.shape)),
    ("overlaps q", lambda q: q),
    ("dtype float16", lambda q: np.zeros(q.shape, np.float16)),
    ("shape", lambda q: np.zeros((5, 4, 9), np.float32)),
]


@pytest.mark.parametrize("message,make", BAD_OUT, ids=[m for m, _ in BAD_OUT])
def test_bad_output_is_refused_before_any_c_call(arena, step, no_c_calls, message, make):
    q = _q()
    with pytest.raises(mk.TensorError, match="out: " + re.escape(message)):
        mk.attention(arena, 0, step, q, out=make(q))


def test_bad_lse_is_refused_before_any_c_call(arena, step, no_c_calls):
    with pytest.raises(mk.TensorError, match="lse: dtype float64"):
        mk.attention(arena, 0, step, _q(), lse=np.zeros((5, 4)))


def test_bad_kv_is_refused_before_any_c_call(arena, step, no_c_calls):
    k = np.zeros((5, 2, 8), np.float32)
    with pytest.raises(mk.TensorError, match="k and v: dtypes differ"):
        arena.write_kv(0, step, k, k.astype(np.float16))
    with pytest.raises(mk.TensorError, match=r"v: shape \(5, 2, 7\)"):
        arena.write_kv(0, step, k, np.zeros((5, 2, 7), np.float32))
    with pytest.raises(mk.TensorError, match="k: is on cuda"):
        arena.write_kv(0, step, FakeCudaArray((5, 2, 8), "<f4"), k)


def test_bad_rope_input_is_refused_before_any_c_call(no_c_calls):
    x = np.zeros((4, 2, 8), np.float32)
    rope = mk.Rope(mode="3d")
    with pytest.raises(mk.TensorError, match="positions: dtype int64"):
        rope.apply(x, np.zeros((4, 3), np.int64))
    with pytest.raises(mk.TensorError, match=r"positions: shape \(4,\)"):
        rope.apply(x, np.zeros(4, np.int32))
    x.flags.writeable = False
    with pytest.raises(mk.TensorError, match="x: is read-only"):
        rope.apply_(x, np.zeros((4, 3), np.int32))   # in place needs writable memory; apply copies


def test_bad_merge_input_is_refused_before_any_c_call(no_c_calls):
    o = np.zeros((3, 2, 8), np.float32)
    lse = np.zeros((3, 2), np.float32)
    with pytest.raises(mk.TensorError, match=r"lse_b: shape \(3, 3\)"):
        mk.merge(o, lse, o.copy(), np.zeros((3, 3), np.float32))


def _no_context():
    """A Cuda object that was never opened: a store built on it fails at its
    first C call, so anything raised before that came from the checks."""
    cu = object.__new__(mk.Cuda)
    cu._ptr, cu._stores = None, weakref.WeakSet()
    return cu


def _pools(**kw):
    shape = kw.pop("shape", (16, 4, 2, 64))
    return [(FakeCudaArray(shape, **kw), FakeCudaArray(shape, ptr=0x7F0000100000))]


BAD_POOLS = [
    ("pools[0].k: dtype float32", _pools(typestr="<f4")),
    ("pools[0].k: shape (16, 4, 2, 32)", _pools(shape=(16, 4, 2, 32))),
    ("pools[0].k: address 0x7f0000000008 is not aligned to 16 bytes", _pools(ptr=0x7F0000000008)),
    ("pools[0].k: not C-contiguous", _pools(strides=(1024, 256, 2, 4))),
    ("pools[0].k: is on cpu", [(np.zeros((16, 4, 2, 64), np.float16), FakeCudaArray((16, 4, 2, 64)))]),
    ("pools: 2 (k, v) pairs for 1 layers", _pools() * 2),
]


@pytest.mark.parametrize("message,pools", BAD_POOLS, ids=[m for m, _ in BAD_POOLS])
def test_bad_device_pools_are_refused_before_any_c_call(no_c_calls, message, pools):
    with pytest.raises(mk.TensorError, match=re.escape(message)):
        mk.CudaStore(_no_context(), num_pages=16, page_size=4, num_layers=1, kv_heads=2, head_dim=64,
                     dtype="f16", pools=pools)


def test_good_device_pools_pass_the_checks_and_reach_the_store_create():
    with pytest.raises(mk.MskvError, match="closed"):   # the first thing after the checks needs a context
        mk.CudaStore(_no_context(), num_pages=16, page_size=4, num_layers=1, kv_heads=2, head_dim=64,
                     dtype="f16", pools=_pools())
