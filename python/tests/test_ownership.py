"""Whatever the C side points into is owned by the object that handed the
pointer over. A mirrored struct keeps the array (or Buf, or ctypes object)
each of its pointer fields was given; the package's objects expose what the
C side writes through as read-only attributes, so rebinding one (view.k =
view.k.copy()) or clearing one (plan.buffers.clear()) raises instead of
leaving the C side writing into memory another array now owns.

The rebinding cases are generated from the classes: every public attribute
(properties, instance attributes, and the mirror fields a class forwards)
of every class that holds C pointers."""
import ctypes
import gc

import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _ffi

SENTINEL = 0x5A


def _rig():
    a = mk.Arena(num_pages=32, page_size=4, num_layers=2, kv_heads=2, head_dim=8)
    rng = np.random.default_rng(20261202)
    r = a.add_request()
    a.admit([(r, 20)])
    plan = a.plan_build([(r, 20)], mk.Plan(1, 20, 16))
    for layer in range(2):
        kv = rng.standard_normal((20, 2, 8)).astype(np.float32)
        a.write_kv(layer, plan, kv, -kv)
    a.commit([(r, 20)])
    a.publish([(r, 20)])
    r.protect_prefix(10)
    return a, r


def _decoy(value):
    if isinstance(value, np.ndarray):
        return np.full(value.shape, SENTINEL, value.dtype)
    if isinstance(value, dict) or hasattr(value, "keys"):
        return {}
    return None


def _same(now, before):
    if isinstance(before, np.ndarray):
        return now.ctypes.data == before.ctypes.data and np.array_equal(now, before)
    if isinstance(before, ctypes.Structure):
        return bytes(now) == bytes(before)
    if hasattr(before, "keys"):
        return dict(now) == dict(before)
    return now is before or now == before


def _public_names(obj):
    cls = type(obj)
    names = {n for n in dir(cls) if not n.startswith("_") and isinstance(getattr(cls, n), property)}
    names |= {n for n in getattr(obj, "__dict__", {}) if not n.startswith("_")}
    s = getattr(obj, "_s", None)
    if isinstance(s, ctypes.Structure) and "__getattr__" in vars(cls):
        names |= {f for f, _ in s._fields_}          # fields a class forwards from its mirror
    return sorted(names)


def _owners():
    """(label, object) for every class of the package that holds a C pointer or a C object."""
    a, r = _rig()
    plan = a.plan_build([(r, 0)], mk.Plan(2, 8, 16))
    st = object.__new__(mk.CudaStore)      # no GPU needed: its attributes, not its calls
    st._ptr, st._cuda, st._arenas, st._desc = None, None, (), _ffi.mskv_cuda_store_desc(head_dim=8)
    cache = mk.CausalKVCache(a, mk.Retention(4, sink_chunks=1, window_chunks=1), batch=2)
    return a, [("Arena", a), ("Request", r), ("Plan", plan), ("PrefixView", r.prefix_view(16)),
               ("Session", a.session(a.add_request(), mk.Retention(4, window_chunks=1))), ("Cpu", mk.Cpu()),
               ("Schedule", mk.Schedule(8, 4)), ("Retention", mk.Retention(4, window_chunks=2)),
               ("Rope", mk.Rope()), ("DevicePlan", mk.DevicePlan(plan, _ffi.mskv_cuda_dplan())),
               ("CudaStore", st), ("CpuBackend", a.backend()), ("CudaBackend", mk.CudaBackend(st)),
               ("CausalKVCache", cache), ("LayerCache", cache.layers[1])]


def test_no_public_attribute_of_an_owner_can_be_rebound_or_cleared():
    a, owners = _owners()
    rebound = []
    for label, obj in owners:
        names = _public_names(obj)
        assert names or label in ("Cpu",), label
        for name in names:
            safe = label != "CudaStore" or name in ("desc", "cuda")   # the store's others call C
            value = getattr(obj, name) if safe else None
            try:
                setattr(obj, name, _decoy(value))
                rebound.append("%s.%s" % (label, name))
            except AttributeError:
                pass
            if safe and hasattr(value, "clear") and not isinstance(value, np.ndarray):
                with pytest.raises((AttributeError, TypeError)):
                    value.clear()
            if safe:
                assert _same(getattr(obj, name), value), "%s.%s changed" % (label, name)
    assert not rebound, "rebindable: " + ", ".join(rebound)
    a.close()


def test_prefix_view_buffers_cannot_be_rebound_and_gather_writes_only_into_its_own():
    a, r = _rig()
    view = r.prefix_view(16)
    k, v = view.k, view.v
    with pytest.raises(AttributeError):
        view.k = view.k.copy()          # the reproducer: gather() then wrote into the dropped array
    with pytest.raises(AttributeError):
        view.v = None
    with pytest.raises(AttributeError):
        view.arena = mk.Arena(num_pages=4, page_size=4, num_layers=4, kv_heads=4, head_dim=64)
    gc.collect()
    decoys = [np.full(k.shape, SENTINEL, k.dtype) for _ in range(8)]   # memory a dropped buffer would be reused as
    view.gather()
    assert view.k is k and view.v is v
    assert view.k.ctypes.data == view._s.k and view.v.ctypes.data == view._s.v
    pages = r.pages()
    for layer in range(2):
        pool = a.pool(layer, "k").reshape(-1, 2, 8)
        rows = np.concatenate([pool[p * 4:(p + 1) * 4] for p in pages[:3]])[:10]
        assert np.array_equal(view.layer(layer)[0], rows) and np.array_equal(view.layer(layer)[1], -rows)
    assert all((d == SENTINEL).all() for d in decoys)
    a.close()


def test_plan_buffers_cannot_be_cleared_and_builds_write_only_into_them():
    a, r = _rig()
    plan = mk.Plan(1, 8, 16)
    before = {n: b.ctypes.data for n, b in plan.buffers.items()}
    with pytest.raises(AttributeError):
        plan.buffers.clear()            # the reproducer: the next build wrote into freed memory
    with pytest.raises(TypeError):
        plan.buffers["slot_mapping"] = np.zeros(8, np.int64)
    with pytest.raises(AttributeError):
        plan.buffers = {}
    with pytest.raises(AttributeError):
        plan.pos_mode = 2
    gc.collect()
    decoys = [np.full(b.shape, SENTINEL, b.dtype) for b in plan.buffers.values() for _ in range(4)]
    a.admit([(r, 3)])
    a.plan_build([(r, 3)], plan, pos="1d")
    assert {n: b.ctypes.data for n, b in plan.buffers.items()} == before
    assert plan.slot_mapping.tolist() == [r.slot(20 + i) for i in range(3)] and plan.positions.tolist() == [20, 21, 22]
    assert all((d == SENTINEL).all() for d in decoys)
    a.abort([(r, 3)])
    a.close()


def test_a_session_keeps_its_arena_and_refuses_once_the_arena_is_closed():
    a = mk.Arena(num_pages=16, page_size=4, num_layers=1, kv_heads=1, head_dim=8)
    s = a.session(a.add_request(), mk.Retention(4, window_chunks=1))
    with pytest.raises(AttributeError):
        s.arena = None
    s.begin_chunk(4)
    s.abort_chunk()
    a.close()
    gc.collect()
    with pytest.raises(mk.MskvError, match="closed"):
        s.begin_chunk(4)                # before: a call into the destroyed arena
    with s:
        pass                            # leaving it does not touch the closed arena


def test_the_store_description_is_a_copy():
    st = object.__new__(mk.CudaStore)
    st._desc = _ffi.mskv_cuda_store_desc(head_dim=64, kv_heads=2)
    st.desc.head_dim = 128              # the shape checks stay the store's
    assert st.desc.head_dim == 64 and st._desc.head_dim == 64


def pointer_fields():
    for s in _ffi.STRUCTS + _ffi.UCX_STRUCTS:
        for name, t in s._fields_:
            if t is ctypes.c_void_p:
                yield s, name


@pytest.mark.parametrize("struct,field", list(pointer_fields()),
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_every_pointer_field_owns_the_object_it_is_given(struct, field):
    s = struct()
    a = np.full(16, SENTINEL, np.uint8)
    addr = a.ctypes.data
    setattr(s, field, a)
    del a
    gc.collect()
    assert getattr(s, field) == addr and s.pinned(field).ctypes.data == addr
    assert (s.pinned(field) == SENTINEL).all()
    buf = (ctypes.c_int32 * 4)(1, 2, 3, 4)
    setattr(s, field, buf)                       # a ctypes object: kept as well
    assert getattr(s, field) == ctypes.addressof(buf) and s.pinned(field) is buf
    setattr(s, field, 0x1000)                    # a raw address: the caller keeps its memory
    assert getattr(s, field) == 0x1000 and s.pinned(field) is None
    setattr(s, field, None)
    assert not getattr(s, field)


def test_a_nested_struct_pins_on_the_struct_that_owns_its_memory():
    outer = _ffi.mskv_cuda_shard_desc()
    a = np.arange(4, dtype=np.uint64)
    outer.store.pools = a                        # outer.store is a view into outer
    del a
    gc.collect()
    assert outer.store.pinned("pools") is not None and outer.store.pools == outer.store.pinned("pools").ctypes.data
    assert outer.pinned("pools") is None         # its own field of the same name is another one


class _FakeDeviceArray:
    """A device tensor as __cuda_array_interface__ describes one (never dereferenced here)."""

    def __init__(self, shape, addr):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (addr, False), "version": 2}


def test_a_device_prefix_view_owns_the_callers_tensors():
    a, r = _rig()
    st = object.__new__(mk.CudaStore)   # no GPU: prefix_view itself makes no C call
    st._ptr, st._cuda, st._arenas, st._stream, st._dtype = None, None, (), None, "f16"
    st._desc = _ffi.mskv_cuda_store_desc(num_layers=2, kv_heads=2, head_dim=8)
    k, v = _FakeDeviceArray((2, 16, 2, 8), 0x10000), _FakeDeviceArray((2, 16, 2, 8), 0x20000)
    view = st.prefix_view(r, k, v)
    assert view._s.k == 0x10000 and view._s.v == 0x20000 and view._s.cap_tokens == 16
    assert view._s.pinned("k").keep is k and view._s.pinned("v").keep is v
    assert view.k is k and view.v is v
    for name in ("k", "v", "arena", "request"):
        with pytest.raises(AttributeError):
            setattr(view, name, None)
    a.close()
