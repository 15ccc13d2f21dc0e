"""The package as a Python user meets it: every public function and method
documented and annotated (help() is the reference), reprs that show the
state, the header's enums as IntEnum / IntFlag, and errors that say what
is wrong (the argument, its value, the limit)."""
import enum
import inspect

import numpy as np
import pytest

import mstar_kv as mk
from mstar_kv import _enums, _ffi


# ---- help() is the reference ---------------------------------------------------------------------

def public_api(pkg):
    """(qualified name, function) of every public function and method the package exports."""
    out = []
    for name in sorted(dir(pkg)):
        obj = getattr(pkg, name)
        if name.startswith("_"):
            continue
        if inspect.isfunction(obj) and obj.__module__.startswith("mstar_kv"):
            out.append((name, obj))
        elif inspect.isclass(obj) and obj.__module__.startswith("mstar_kv") and \
                not issubclass(obj, (BaseException, enum.Enum, tuple)):
            for mname, m in inspect.getmembers(obj):
                if mname.startswith("_") and mname != "__init__":
                    continue
                raw = inspect.getattr_static(obj, mname)
                if isinstance(raw, (staticmethod, classmethod)):
                    m = raw.__func__
                if inspect.isfunction(m) and m.__module__.startswith("mstar_kv"):
                    out.append(("%s.%s" % (name, mname), m))
    return out


def problems(items):
    """Missing docstrings and annotations: a public parameter without one, a function without a return type."""
    bad = []
    for name, fn in items:
        init = name.endswith(".__init__")
        if not init and not (fn.__doc__ or "").strip():
            bad.append("%s: no docstring" % name)
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name not in ("self", "cls") and not p.name.startswith("_") and p.annotation is p.empty:
                bad.append("%s: parameter %s has no annotation" % (name, p.name))
        if not init and sig.return_annotation is sig.empty:
            bad.append("%s: no return annotation" % name)
    return bad


def test_every_public_function_and_method_has_a_docstring_and_annotations():
    items = public_api(mk)
    assert len(items) > 150
    bad = problems(items)
    assert not bad, "\n".join(bad)


def test_the_walk_catches_a_missing_docstring_and_a_missing_annotation():
    def documented(x: int) -> int:
        """Has both."""
        return x

    def bare(x):
        return x
    assert problems([("documented", documented)]) == []
    assert problems([("bare", bare)]) == ["bare: no docstring", "bare: parameter x has no annotation",
                                         "bare: no return annotation"]


def test_the_package_says_it_is_typed():
    import importlib.resources as res
    assert (res.files("mstar_kv") / "py.typed").is_file()


# ---- reprs -------------------------------------------------------------------------------------------

def test_reprs_show_the_state(arena):
    r = arena.add_request()
    arena.admit([(r, 6)])
    plan = arena.plan_build([(r, 6)], mk.Plan(2, 8, 8), pos="1d")
    assert repr(arena) == ("Arena(pages=64, page_size=4, layers=2, kv_heads=2, head_dim=8, dtype=f32, free=61, "
                           "requests=1, step=1)")
    assert repr(r) == "Request(id=0x%x, committed=0, reserved=6, prefix=0, pages=2, resident)" % r.id
    assert repr(plan) == "Plan(batch=1, total_q=6, num_page_ids=2, page_size=4, pos=1d, step=1, capacity=(2, 8, 8))"
    arena.commit([(r, 6)])
    s = arena.session(arena.add_request(), mk.Retention(chunk_size=4, window_chunks=1))
    s.begin_chunk(4)
    assert repr(s) == "Session(request=0x%x, chunk_size=4, chunks_done=0, open_chunk=4, released_total=0)" % \
        s.request.id
    s.abort_chunk()
    g = arena.lockstep([arena.add_request(), arena.add_request()])
    assert repr(g).startswith("LockstepGroup(") and "members=2" in repr(g)
    arena.close()
    assert repr(arena) == "Arena(closed)" and repr(r) == "Request(id=0x%x, stale)" % r.id


# ---- enums ---------------------------------------------------------------------------------------------

def test_every_enum_member_has_its_header_constant():
    assert len(_enums.ENUMS) >= 14
    for e in _enums.ENUMS:
        assert issubclass(e, (enum.IntEnum, enum.IntFlag)) and getattr(mk, e.__name__) is e
        for m in e:
            cname = e._cnames_[m.name]
            assert cname in _ffi.CONSTANTS and int(m) == _ffi.CONSTANTS[cname], cname
    # test_layout.py compares every CONSTANTS entry with the header's value, so these are the header's
    assert issubclass(mk.DebugFlags, enum.IntFlag) and mk.DebugFlags.POISON | mk.DebugFlags.CHECKSUMS == \
        mk.DebugFlags.ALL


def test_names_ints_and_members_all_work_where_an_enum_is_taken(arena):
    r = arena.add_request()
    arena.admit([(r, 4)])
    for pos in ("1d", "1D", 1, mk.PosMode.POS_1D):
        plan = arena.plan_build([(r, 4)], mk.Plan(1, 4, 4), pos=pos)
        assert plan.pos_mode is mk.PosMode.POS_1D and list(plan.positions) == [0, 1, 2, 3]
    q = np.ones((4, 2, 8), np.float32)
    a = mk.attention(arena, 0, plan, q, mask="causal")
    b = mk.attention(arena, 0, plan, q, mask=mk.Mask.CAUSAL)
    assert np.array_equal(a, b)
    assert mk.dtype_code("bfloat16") is mk.Dtype.BF16 and mk.dtype_code(np.float16) is mk.Dtype.F16
    assert r.info().location is mk.Location.RESIDENT and mk.RESIDENT == 0
    assert arena.store_info().dtype is mk.Dtype.F32
    with mk.Arena(8, 4, debug=mk.DebugFlags.POISON, retire=mk.RetireMode.FENCED) as a2:
        assert a2.add_request()
    assert mk.PosMode.parse("3d") is mk.PosMode.POS_3D and mk.Visibility.parse("exact") is mk.Visibility.EXACT
    with pytest.raises(ValueError, match="'sideways' is not one of none, causal, window"):
        mk.Mask.parse("sideways", "mask")
    with pytest.raises(TypeError, match="mask: expected one of"):
        mk.Mask.parse(1.5, "mask")


# ---- errors say what is wrong ----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, says", [
    (dict(num_pages=0, page_size=4), "num_pages 0: an arena needs at least 2 pages"),
    (dict(num_pages=8, page_size=0), "page_size 0: must be >= 1"),
    (dict(num_pages=8, page_size=4, max_requests=70000), "max_requests 70000: must be in [0, 65535]"),
    (dict(num_pages=8, page_size=4, num_layers=1), "kv_heads 0, head_dim 0: both must be >= 1"),
    (dict(num_pages=8, page_size=4, num_groups=33), "num_groups 33: must be in [0, MSKV_MAX_GROUPS = 32]"),
    (dict(num_pages=8, page_size=4, debug=4), "debug 0x4"),
])
def test_a_refused_arena_says_which_field_and_why(kw, says):
    with pytest.raises(mk.InvalidArgumentError) as e:
        mk.Arena(**kw)
    assert says in str(e.value) and e.value.detail.startswith(says.split(":")[0])


def test_cpu_calls_name_the_head_dim_limit():
    with mk.Arena(num_pages=8, page_size=4, num_layers=1, kv_heads=1, head_dim=300) as a:
        r = a.add_request()
        a.admit([(r, 2)])
        plan = a.plan_build([(r, 2)], mk.Plan(1, 2, 4))
        x = np.ones((2, 1, 300), np.float32)
        for call in (lambda: a.write_kv(0, plan, x, x), lambda: mk.attention(a, 0, plan, x)):
            with pytest.raises(mk.InvalidArgumentError, match="head_dim 300 is past MSKV_CPU_MAX_HEAD_DIM = 256"):
                call()


def test_a_bad_layer_is_named(arena):
    r = arena.add_request()
    arena.admit([(r, 2)])
    plan = arena.plan_build([(r, 2)], mk.Plan(1, 2, 4))
    x = np.ones((2, 2, 8), np.float32)
    with pytest.raises(mk.OutOfRangeError, match=r"layer 5 is not in \[0, 2\)"):
        arena.write_kv(5, plan, x, x)
    with pytest.raises(mk.OutOfRangeError, match=r"layer 2 is not in \[0, 2\)"):
        mk.attention(arena, 2, plan, np.ones((2, 4, 8), np.float32))
    with pytest.raises(ValueError, match=r"pool: layer 7 is not in \[0, 2\)"):
        arena.pool(7, "k")
    assert arena.stats().free_pages == 62   # nothing changed


@pytest.mark.parametrize("call, says", [
    (lambda a, r: a.keyed_create("text", 4), r"mskv_keyed_create: key: expected an int \(C uint64_t\), got str"),
    (lambda a, r: a.admit([r]), r"segments\[0\]: expected a \(Request, n_tokens\) pair"),
    (lambda a, r: a.admit(r), "segments: expected a list of"),
    (lambda a, r: a.admit([(r, "2")]), r"segments\[0\]: n_tokens: expected an int, got str"),
    (lambda a, r: a.admit([("r", 2)]), r"segments\[0\]: expected a Request, got str"),
    (lambda a, r: r.reserve(2.5), "mskv_request_reserve: tokens: expected an int"),
    (lambda a, r: mk.Plan(1, "a", 3), "mskv_plan.cap_tokens: expected an int"),
    (lambda a, r: a.lockstep([r, 3]), r"members\[1\]"),
])
def test_a_wrong_python_type_is_a_type_error_naming_the_parameter(arena, call, says):
    r = arena.add_request()
    before = arena.digest()
    with pytest.raises(TypeError, match=says):
        call(arena, r)
    assert arena.digest() == before


def test_a_logged_c_message_reaches_the_exception():
    with mk.Arena(num_pages=8, page_size=4, num_groups=2) as a:
        r = a.add_request()
        with pytest.raises(mk.InvalidArgumentError, match=r"layer group 5 is not in \[0, 2\)"):
            r.group(5).pages()


# ---- python -m mstar_kv ----------------------------------------------------------------------------------

def _main(**env):
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "mstar_kv"], env=dict(os.environ, **env), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(line.split(": ", 1) if ": " in line else (line, "") for line in r.stdout.splitlines())


def test_python_m_mstar_kv_reports_the_installation():
    got = _main()
    assert "mstar_kv %s" % mk.__version__ in got
    assert got["library"].split(" (")[0] == mk.library_path
    with mk.Cpu() as cpu:
        isa = mk.cpu_isa_name(cpu.info().isa)
    assert got["cpu isa"].startswith(isa + " (available: ") and "portable" in got["cpu isa"]
    ok, devices, _, why = mk.cuda_probe_driver()
    assert got["cuda driver"] == ("no (%s)" % why if not ok else got["cuda driver"])
    assert got["cuda driver"].startswith("yes (%d device" % devices if ok else "no (")
    ok_c, why_c = mk.cuda_probe()
    assert got["cuda"] == ("no (%s)" % why_c if not ok_c else "yes: the GPU layer can create a context")
    assert got["nvrtc"].startswith(("yes (", "no ("))
    ok_u, why_u = mk.ucx_probe()
    assert got["ucx"] == ("yes (%s)" % why_u if ok_u else "no (%s)" % why_u)


def test_python_m_mstar_kv_shows_the_isa_the_environment_chose():
    got = _main(MSKV_CPU_ISA="portable")
    assert got["cpu isa"].startswith("portable (") and "MSKV_CPU_ISA=portable" in got["cpu isa"]
