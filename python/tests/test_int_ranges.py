"""Integer arguments against their C types. ctypes converts a Python int by
truncation (2**32 + 1 into an int32_t is 1, -1 into a size_t is SIZE_MAX);
the package checks every integer before it is stored in a mirrored struct or
passed to a C function: OverflowError when it does not fit, ValueError when
it is negative where C takes an unsigned value (or a field the mirror marks
non-negative), naming the field or parameter, and nothing changes.

The cases are generated from the mirrors: every integer parameter of every
prototype (_ffi.DECLARATIONS), every integer field of every struct
(_ffi.STRUCTS), and every public entry point (the table below names the
mirror each integer goes through; a test checks the table covers every
integer parameter the package passes on from its caller)."""
import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _ffi

# the C types, written out here (not taken from the package's own tables)
C_TYPES = {"int": (32, True), "int32_t": (32, True), "int64_t": (64, True), "uint16_t": (16, False),
           "uint32_t": (32, False), "uint64_t": (64, False), "size_t": (64, False), "mskv_dtype": (32, True),
           "mskv_pos_mode": (32, True), "mskv_result": (32, True), "mskv_cu_ptr": (64, False),
           "mskv_cpu_isa": (32, True)}


def limits(bits, signed):
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def bad_values(lo, hi):
    """(value, exception) pairs just outside [lo, hi], and the wrap-arounds the issue names."""
    out = [(hi + 1, OverflowError), (2 * hi + 2, OverflowError), (1 << 64, OverflowError)]
    if lo == 0:
        out += [(-1, ValueError), (-(1 << 63), ValueError), (-(1 << 64), ValueError)]
    else:
        out += [(lo - 1, OverflowError), (-(1 << 64), OverflowError)]
    return [(v, e) for v, e in out if not lo <= v <= hi]


def int_params():
    """(function, index, parameter name, C type) of every integer parameter."""
    for name, params in _ffi.parameters().items():
        for i, (ctext, pname) in enumerate(params):
            base = ctext.replace("const", "").strip()
            if "*" not in base and base in C_TYPES:
                yield name, i, pname, base
            else:
                assert "*" in base or base in ("mskv_request", "mskv_lockstep") or \
                    base in ("mskv_cu_stream", "float", "mskv_allreduce_min_fn"), \
                    "%s: parameter %s has a type this test does not know: %r" % (name, pname, ctext)


class Recorder:
    """Stands in for a ctypes function: records its calls."""

    def __init__(self, argtypes):
        self.argtypes, self.restype, self.calls = argtypes, ctypes.c_int, []

    def __call__(self, *args):
        self.calls.append(args)
        return 0


@pytest.mark.parametrize("function,index,pname,ctype", list(int_params()),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_every_integer_parameter_of_every_prototype_is_checked(function, index, pname, ctype):
    restype, argtypes = _ffi.parse_declarations()[function]
    rec = Recorder(argtypes)
    fn = _ffi.checked(function, rec, argtypes, _ffi.parameters()[function])
    lo, hi = limits(*C_TYPES[ctype])
    args = [0] * len(argtypes)
    for v in (lo, hi, 0, 1):
        args[index] = v
        fn(*args)
        assert rec.calls[-1][index] == v and type(rec.calls[-1][index]) is int   # passed on as it is
    args[index] = np.int64(7) if hi >= 7 else 1   # NumPy integers are integers
    fn(*args)
    assert rec.calls[-1][index] == int(args[index])
    n = len(rec.calls)
    for v, exc in bad_values(lo, hi):
        args[index] = v
        with pytest.raises(exc) as e:
            fn(*args)
        assert function in str(e.value) and pname in str(e.value) and str(v) in str(e.value)
    assert len(rec.calls) == n, "a call went through with an out-of-range integer"
    # and the loaded library's function is the checked one, over the real ctypes function
    loaded = getattr(_ffi.lib, function)
    assert loaded.raw is getattr(_ffi.lib.raw, function)
    params = _ffi.parameters()[function]
    assert [c[0] for c in loaded.checks] == [i for i, t in enumerate(argtypes) if t is not None and (
        issubclass(t, ctypes._SimpleCData) and t._type_ in "bBhHiIlLqQ" or "*" not in params[i][0] and
        t is ctypes.c_void_p)]


def test_the_loaded_library_checks_before_calling():
    with pytest.raises(OverflowError, match="mskv_f16_to_f32: h"):
        _ffi.lib.mskv_f16_to_f32(1 << 16)                  # ctypes alone computes h = 0
    assert _ffi.lib.mskv_f16_to_f32(0x3C00) == 1.0
    with pytest.raises(OverflowError, match="mskv_skipped_tokens_get: num_computed"):
        _ffi.lib.mskv_skipped_tokens_get(None, 1 << 63, None)
    assert _ffi.lib.mskv_arena_step is _ffi.lib.raw.mskv_arena_step   # no integer: nothing in between
    # a handle a caller passes as an int (a CUDA stream) is an address: ctypes alone takes -1 as 0xFFFF...
    with pytest.raises(ValueError, match="mskv_cuda_store_set_stream: stream"):
        _ffi.lib.mskv_cuda_store_set_stream(None, -1)
    with pytest.raises(OverflowError, match="mskv_cuda_store_set_stream: stream"):
        _ffi.lib.mskv_cuda_store_set_stream(None, 1 << 64)


def struct_int_fields():
    for s in _ffi.STRUCTS + _ffi.UCX_STRUCTS:
        for name, t in s._fields_:
            elem = t._type_ if isinstance(t, type) and issubclass(t, ctypes.Array) else t
            if isinstance(elem, type) and issubclass(elem, ctypes._SimpleCData) and elem._type_ in "bBhHiIlLqQ":
                yield s, name, t, elem


@pytest.mark.parametrize("struct,field,ftype,elem", list(struct_int_fields()),
                         ids=lambda x: x if isinstance(x, str) else getattr(x, "__name__", None))
def test_every_integer_field_of_every_struct_is_checked(struct, field, ftype, elem):
    bits, signed = ctypes.sizeof(elem) * 8, elem(-1).value < 0
    lo, hi = limits(bits, signed)
    if field in getattr(struct, "_nonneg_", ()):
        lo = 0
    array = ftype is not elem
    s = struct()

    def get():
        return list(getattr(s, field)) if array else getattr(s, field)

    def put(v):
        setattr(s, field, [v] * ftype._length_ if array else v)

    for v in (lo, hi, 0):
        put(v)
        assert get() == ([v] * ftype._length_ if array else v)
    put(1)
    for v, exc in bad_values(lo, hi):
        with pytest.raises(exc) as e:
            put(v)
        assert "%s.%s" % (struct.__name__, field) in str(e.value)
        assert get() == ([1] * ftype._length_ if array else 1), "a failed assignment changed the field"


def test_positional_and_keyword_construction_are_checked_too():
    with pytest.raises(OverflowError, match="mskv_retention.chunk_size"):
        _ffi.mskv_retention(1 << 63)
    with pytest.raises(OverflowError, match="mskv_attn.window_left"):
        _ffi.mskv_attn(window_left=1 << 31)
    with pytest.raises(ValueError, match="mskv_plan.cap_tokens"):
        _ffi.mskv_plan(cap_tokens=-1)
    seg = (_ffi.mskv_segment * 2)()
    with pytest.raises(OverflowError, match="mskv_request.id"):
        seg[1].request.id = 1 << 32     # a struct inside an array inside a struct
    assert seg[1].request.id == 0


def test_every_mirror_is_a_checked_struct():
    mirrors = [v for v in vars(_ffi).values() if isinstance(v, type) and issubclass(v, ctypes.Structure)
               and v.__module__ == _ffi.__name__ and v.__name__.startswith("mskv_")]
    assert sorted(m.__name__ for m in mirrors) == sorted(s.__name__ for s in _ffi.STRUCTS + _ffi.UCX_STRUCTS)
    assert all(issubclass(m, _ffi.Structure) and m.__mro__[1] is _ffi.Structure for m in mirrors)


# ---- every public entry point --------------------------------------------------------------------

def _rig():
    a = mk.Arena(num_pages=16, page_size=4, num_layers=1, kv_heads=1, head_dim=8)
    r = a.add_request()
    a.admit([(r, 8)])
    plan = a.plan_build([(r, 8)], mk.Plan(1, 8, 8))
    kv = np.ones((8, 1, 8), np.float32)
    a.write_kv(0, plan, kv, kv)
    a.commit([(r, 8)])
    a.publish([(r, 8)])
    r.protect_prefix(4)
    a.admit([(r, 2)])
    step = a.plan_build([(r, 2)], mk.Plan(1, 2, 8))
    a.test_session = a.session(a.add_request(), mk.Retention(**RET))
    return a, r, step


class _StubCuda:
    """A Cuda that fails any call: the store's integers are checked before it is used."""
    ptr = 1

    def _call(self, *args):
        raise AssertionError("a C call was made with %r" % (args,))


Q = np.ones((2, 1, 8), np.float32)
RET = dict(chunk_size=4, window_chunks=1)

# (label, mirror: ("fn", C function, parameter) or ("struct", struct, field), call(arena, request, plan, value))
ENTRY_POINTS = [
    ("Arena(num_pages)", ("struct", "mskv_arena_desc", "num_pages"), lambda a, r, p, v: mk.Arena(v, 4)),
    ("Arena(page_size)", ("struct", "mskv_arena_desc", "page_size"), lambda a, r, p, v: mk.Arena(4, v)),
    ("Arena(num_layers)", ("struct", "mskv_arena_desc", "num_layers"), lambda a, r, p, v: mk.Arena(4, 4, v, 1, 8)),
    ("Arena(kv_heads)", ("struct", "mskv_arena_desc", "kv_heads"), lambda a, r, p, v: mk.Arena(4, 4, 1, v, 8)),
    ("Arena(head_dim)", ("struct", "mskv_arena_desc", "head_dim"), lambda a, r, p, v: mk.Arena(4, 4, 1, 1, v)),
    ("Arena(max_requests)", ("struct", "mskv_arena_desc", "max_requests"),
     lambda a, r, p, v: mk.Arena(4, 4, max_requests=v)),
    ("Arena(debug)", ("struct", "mskv_arena_desc", "debug"), lambda a, r, p, v: mk.Arena(4, 4, debug=v)),
    ("arena.retire", ("fn", "mskv_arena_retire", "completed"), lambda a, r, p, v: a.retire(v)),
    ("arena.keyed_create(key)", ("fn", "mskv_keyed_create", "key"), lambda a, r, p, v: a.keyed_create(v, 4)),
    ("arena.keyed_create(n_tokens)", ("fn", "mskv_keyed_create", "n_tokens"), lambda a, r, p, v: a.keyed_create(9, v)),
    ("arena.keyed_find", ("fn", "mskv_keyed_find", "key"), lambda a, r, p, v: a.keyed_find(v)),
    ("arena.keyed_remove", ("fn", "mskv_keyed_remove", "key"), lambda a, r, p, v: a.keyed_remove(v)),
    ("arena.admit", ("struct", "mskv_segment", "n_tokens"), lambda a, r, p, v: a.admit([(r, v)])),
    ("arena.commit", ("struct", "mskv_segment", "n_tokens"), lambda a, r, p, v: a.commit([(r, v)])),
    ("arena.abort", ("struct", "mskv_segment", "n_tokens"), lambda a, r, p, v: a.abort([(r, v)])),
    ("arena.publish", ("struct", "mskv_segment", "n_tokens"), lambda a, r, p, v: a.publish([(r, v)])),
    ("arena.plan_query", ("struct", "mskv_segment", "n_tokens"), lambda a, r, p, v: a.plan_query([(r, v)])),
    ("arena.plan_build", ("struct", "mskv_segment", "n_tokens"), lambda a, r, p, v: a.plan_build([(r, v)], p)),
    ("plan_build(pos_offset)", ("struct", "mskv_plan_desc", "pos_offset"),
     lambda a, r, p, v: a.plan_build([(r, 2)], p, pos="1d", pos_offset=v)),
    ("plan_build(grid_h)", ("struct", "mskv_plan_desc", "grid_h"),
     lambda a, r, p, v: a.plan_build([(r, 2)], p, pos="3d", grid=(v, 1))),
    ("plan_build(grid_w)", ("struct", "mskv_plan_desc", "grid_w"),
     lambda a, r, p, v: a.plan_build([(r, 2)], p, pos="3d", grid=(1, v))),
    ("plan_build(pad batch)", ("struct", "mskv_plan_desc", "pad_batch"),
     lambda a, r, p, v: a.plan_build([(r, 2)], p, pad=(v, 0, 0, 0))),
    ("plan_build(pad tokens)", ("struct", "mskv_plan_desc", "pad_tokens"),
     lambda a, r, p, v: a.plan_build([(r, 2)], p, pad=(0, v, 0, 0))),
    ("plan_build(pad qo_len)", ("struct", "mskv_plan_desc", "pad_qo_len"),
     lambda a, r, p, v: a.plan_build([(r, 2)], p, pad=(0, 0, v, 0))),
    ("plan_build(pad kv_len)", ("struct", "mskv_plan_desc", "pad_kv_len"),
     lambda a, r, p, v: a.plan_build([(r, 2)], p, pad=(0, 0, 0, v))),
    ("arena.write_kv(layer)", ("fn", "mskv_cpu_write_kv", "layer"),
     lambda a, r, p, v: a.write_kv(v, p, Q[:, :1], Q[:, :1])),
    ("request.reserve", ("fn", "mskv_request_reserve", "tokens"), lambda a, r, p, v: r.reserve(v)),
    ("request.protect_prefix", ("fn", "mskv_request_protect_prefix", "n"), lambda a, r, p, v: r.protect_prefix(v)),
    ("request.release_oldest", ("fn", "mskv_request_release_oldest", "n"), lambda a, r, p, v: r.release_oldest(v)),
    ("request.slot", ("fn", "mskv_request_slot", "pos"), lambda a, r, p, v: r.slot(v)),
    ("request.prefix_view", ("struct", "mskv_prefix_view", "cap_tokens"), lambda a, r, p, v: r.prefix_view(v)),
    ("request.prefix_view(group)", ("struct", "mskv_prefix_view", "group"), lambda a, r, p, v: r.prefix_view(8, v)),
    ("Plan(cap_batch)", ("struct", "mskv_plan", "cap_batch"), lambda a, r, p, v: mk.Plan(v, 1, 1)),
    ("Plan(cap_tokens)", ("struct", "mskv_plan", "cap_tokens"), lambda a, r, p, v: mk.Plan(1, v, 1)),
    ("Plan(cap_page_ids)", ("struct", "mskv_plan", "cap_page_ids"), lambda a, r, p, v: mk.Plan(1, 1, v)),
    ("plan.validate", ("fn", "mskv_plan_validate", "num_pages"), lambda a, r, p, v: p.validate(v)),
    ("Schedule(total)", ("fn", "mskv_schedule_init", "total"), lambda a, r, p, v: mk.Schedule(v, 4)),
    ("Schedule(window)", ("fn", "mskv_schedule_init", "window"), lambda a, r, p, v: mk.Schedule(8, v)),
    ("Schedule(overlap)", ("fn", "mskv_schedule_init", "overlap"), lambda a, r, p, v: mk.Schedule(8, 4, v)),
    ("schedule.window", ("fn", "mskv_schedule_window", "k"), lambda a, r, p, v: mk.Schedule(8, 4).window(v)),
    ("schedule.decode_span(k)", ("fn", "mskv_schedule_decode_span", "k"),
     lambda a, r, p, v: mk.Schedule(8, 4).decode_span(v, 1)),
    ("schedule.decode_span(ctx)", ("fn", "mskv_schedule_decode_span", "ctx"),
     lambda a, r, p, v: mk.Schedule(8, 4).decode_span(0, v)),
    ("Retention(chunk_size)", ("struct", "mskv_retention", "chunk_size"), lambda a, r, p, v: mk.Retention(v)),
    ("Retention(sink_chunks)", ("struct", "mskv_retention", "sink_chunks"),
     lambda a, r, p, v: mk.Retention(4, sink_chunks=v)),
    ("Retention(window_chunks)", ("struct", "mskv_retention", "window_chunks"),
     lambda a, r, p, v: mk.Retention(4, window_chunks=v)),
    ("Retention(window_tokens)", ("struct", "mskv_retention", "window_tokens"),
     lambda a, r, p, v: mk.Retention(4, window_tokens=v)),
    ("retention.validate", ("fn", "mskv_retention_validate", "page_size"),
     lambda a, r, p, v: mk.Retention(**RET).validate(v)),
    ("retention.skipped_tokens", ("fn", "mskv_skipped_tokens_get", "num_computed"),
     lambda a, r, p, v: mk.Retention(**RET).skipped_tokens(v)),
    ("session.begin_chunk", ("fn", "mskv_session_begin_chunk", "n_tokens"),
     lambda a, r, p, v: a.test_session.begin_chunk(v)),
    ("arena.pool(layer)", ("fn", "mskv_store_pool", "layer"), lambda a, r, p, v: a.pool(v, "k")),
    ("Rope(dims)", ("struct", "mskv_rope", "dims"), lambda a, r, p, v: mk.Rope("3d", dims=(2, 2, v))),
    ("Cpu(num_threads)", ("struct", "mskv_cpu_desc", "num_threads"), lambda a, r, p, v: mk.Cpu(num_threads=v)),
    ("Cpu(workspace_bytes)", ("struct", "mskv_cpu_desc", "workspace_bytes"),
     lambda a, r, p, v: mk.Cpu(workspace_bytes=v)),
    ("attention(layer)", ("fn", "mskv_cpu_attention", "layer"), lambda a, r, p, v: mk.attention(a, v, p, Q)),
    ("attention(window_left)", ("struct", "mskv_attn", "window_left"),
     lambda a, r, p, v: mk.attention(a, 0, p, Q, mask="window", window_left=v)),
    ("Cpu.attention(layer)", ("fn", "mskv_cpu_attention", "layer"),
     lambda a, r, p, v: mk.Cpu().attention(a, v, p, Q)),
    ("attention_dense(layer)", ("fn", "mskv_prefix_view_layer", "layer"),
     lambda a, r, p, v: mk.attention_dense(r.prefix_view(8).gather(), v, p, Q)),
    ("attention_dense(window_left)", ("struct", "mskv_attn", "window_left"),
     lambda a, r, p, v: mk.attention_dense(r.prefix_view(8).gather(), 0, p, Q, mask="window", window_left=v)),
    ("Cuda(device)", ("struct", "mskv_cuda_desc", "device"), lambda a, r, p, v: mk.Cuda(device=v)),
    ("cuda_probe(device)", ("struct", "mskv_cuda_desc", "device"), lambda a, r, p, v: mk.cuda_probe(device=v)),
] + [("CudaStore(%s)" % f, ("struct", "mskv_cuda_store_desc", f),
      (lambda f: lambda a, r, p, v: mk.CudaStore(_StubCuda(), **dict(dict(
          num_pages=4, page_size=4, num_layers=1, kv_heads=1, head_dim=8), **{f: v})))(f))
     for f in ("num_pages", "page_size", "num_layers", "kv_heads", "head_dim", "max_batch", "max_tokens",
               "max_page_ids", "staging_bytes", "plan_ring")]


# entry points that check the value against the arena first (its layers): a ValueError naming it
OWN_RANGE_CHECK = {"arena.pool(layer)"}


def _mirror_type(mirror):
    kind, owner, name = mirror
    if kind == "fn":
        ctext = dict((p, t) for t, p in _ffi.parameters()[owner])[name]
        return limits(*C_TYPES[ctext.replace("const", "").strip()]), "%s: %s" % (owner, name)
    t = dict(getattr(_ffi, owner)._fields_)[name]
    t = t._type_ if issubclass(t, ctypes.Array) else t
    lo, hi = limits(ctypes.sizeof(t) * 8, t(-1).value < 0)
    if name in getattr(getattr(_ffi, owner), "_nonneg_", ()):
        lo = 0
    return (lo, hi), "%s.%s" % (owner, name)


@pytest.mark.parametrize("label,mirror,call", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_every_public_entry_point_refuses_integers_that_do_not_fit(label, mirror, call):
    a, r, p = _rig()
    (lo, hi), where = _mirror_type(mirror)
    before = (a.digest(), a.stats(), r.info(), p.qo_indptr.tolist(), p.slot_mapping.tolist())
    for v, exc in bad_values(lo, hi):
        if label in OWN_RANGE_CHECK:
            exc, where = ValueError, mirror[2]
        with pytest.raises(exc) as e:
            call(a, r, p, v)
        assert where in str(e.value) and str(v) in str(e.value), str(e.value)
        assert (a.digest(), a.stats(), r.info(), p.qo_indptr.tolist(), p.slot_mapping.tolist()) == before
    a.audit()
    a.close()


def test_the_issues_examples():
    a, r, p = _rig()
    good = mk.attention(a, 0, p, Q)
    for layer in (2 ** 32 + 1, 2 ** 32, 2 ** 63):      # ctypes alone: layers 1, 0, 0
        with pytest.raises(OverflowError, match="layer"):
            mk.attention(a, layer, p, Q)
    assert np.array_equal(mk.attention(a, 0, p, Q), good)
    with pytest.raises(OverflowError, match="num_threads"):
        mk.Cpu(num_threads=2 ** 40)
    with pytest.raises(ValueError, match="workspace_bytes"):
        mk.Cpu(workspace_bytes=-1)
    with pytest.raises(ValueError, match="cap_batch"):
        mk.Plan(-1, -1, -1)
    with pytest.raises(OverflowError, match=r"dims\[1\]"):
        mk.Rope("3d", dims=(8, 2 ** 32 + 8, 0))          # ctypes alone: 8
    a.close()


# signed counts C itself refuses when negative: each raises a ValueError (the C code's class) and changes nothing
NEGATIVE_COUNTS = [e for e in ENTRY_POINTS if e[0] in (
    "Arena(num_pages)", "Arena(page_size)", "Arena(max_requests)", "arena.keyed_create(n_tokens)", "arena.admit",
    "arena.plan_query", "request.reserve", "request.protect_prefix", "request.release_oldest", "request.slot",
    "request.prefix_view", "Plan(cap_batch)", "Plan(cap_tokens)", "Plan(cap_page_ids)", "plan_build(pad batch)",
    "Schedule(total)", "Schedule(overlap)", "schedule.decode_span(ctx)", "Retention(chunk_size)",
    "retention.skipped_tokens", "retention.validate", "session.begin_chunk", "Cpu(num_threads)",
    "Cpu(workspace_bytes)")]


@pytest.mark.parametrize("label,mirror,call", NEGATIVE_COUNTS, ids=[e[0] for e in NEGATIVE_COUNTS])
def test_negative_sizes_and_counts_raise_value_error(label, mirror, call):
    a, r, p = _rig()
    before = (a.digest(), a.stats(), r.info())
    with pytest.raises(ValueError):
        x = call(a, r, p, -1)
        if isinstance(x, mk.Retention):
            x.validate()
    assert (a.digest(), a.stats(), r.info()) == before
    a.close()


# integer parameters the package computes itself (shapes, buffer sizes, table codes, addresses), never
# passed on from its caller, and the GPU ones a machine without a GPU cannot reach through CudaStore (the
# prototype test above checks their wrappers all the same)
COMPUTED = {("mskv_arena_audit", "why_cap"), ("mskv_arena_audit_bytes", "why_cap"), ("mskv_cuda_probe", "why_cap"),
            ("mskv_retention_validate", "why_cap"), ("mskv_plan_validate", "why_cap"),
            ("mskv_request_pages", "cap"), ("mskv_request_export", "cap"), ("mskv_request_import", "size"),
            ("mskv_result_string", "r"), ("mskv_store_pool", "kind"), ("mskv_cuda_store_pool", "kind"),
            ("mskv_rope_apply", "dtype"), ("mskv_rope_apply", "n"), ("mskv_rope_apply", "heads"),
            ("mskv_rope_apply", "head_dim"), ("mskv_cpu_write_kv", "src_dtype"),
            ("mskv_cpu_merge", "n"), ("mskv_cpu_merge", "heads"), ("mskv_cpu_merge", "head_dim"),
            ("mskv_cuda_retire", "wait"), ("mskv_cuda_plan_upload", "pos_mode"),
            ("mskv_cuda_write_kv_ex", "src_dtype"), ("mskv_cuda_rope", "n"), ("mskv_cuda_rope", "heads")}
COMPUTED |= {(f, "n") for f in ("mskv_admit", "mskv_commit", "mskv_step", "mskv_abort", "mskv_publish", "mskv_plan_query",
                                "mskv_plan_build", "mskv_cuda_publish")}   # len(segments)
GPU_ONLY = {("mskv_cuda_store_pool", "layer"), ("mskv_cuda_write_kv_ex", "layer"), ("mskv_cuda_attention", "layer")}


def test_the_entry_point_table_covers_every_integer_the_package_passes_on():
    src = "".join((Path(mk.__file__).parent / f).read_text() for f in ("_core.py", "_cuda.py"))
    covered = {(m[1], m[2]) for _, m, _ in ENTRY_POINTS if m[0] == "fn"}
    missing = []
    for function, _, pname, ctype in int_params():
        if not re.search(r"\b%s\b" % function, src) or ctype == "mskv_cu_ptr":
            continue     # not called by the package, or a device address (from a tensor)
        if (function, pname) not in covered | COMPUTED | GPU_ONLY:
            missing.append("%s(%s)" % (function, pname))
    assert not missing, "public entry points without a range test: " + ", ".join(missing)
    assert not covered & COMPUTED
