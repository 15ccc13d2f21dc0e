"""The ctypes mirrors against the C compiler: every mirrored struct's size
and every field's offset, every mirrored constant, and every prototype (the
declarations the package turns into argtypes are compiled against the
headers: a signature that drifts is a compile error)."""
import ctypes
import subprocess

from mstar_kv import _ffi


def _compile_and_run(cc, headers, tmp_path, body, name):
    src = tmp_path / (name + ".c")
    exe = tmp_path / name
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "mstar_kv.h"\n#include "mstar_kv_cuda.h"\n#include "mstar_kv_ucx.h"\n'
                   + body)
    r = subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(headers), str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, "compile failed:\n" + r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


def test_every_mirrored_struct_has_the_c_size_and_field_offsets(cc, headers, tmp_path):
    lines, expect = [], {}
    for s in _ffi.STRUCTS + _ffi.UCX_STRUCTS:
        n = s.__name__
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (n, n))
        expect[n] = ctypes.sizeof(s)
        for f in s._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (n, f[0], n, f[0]))
            expect["%s.%s" % (n, f[0])] = getattr(s, f[0]).offset
    got = _compile_and_run(cc, headers, tmp_path, "int main(void) {\n%s\nreturn 0;\n}\n" % "\n".join(lines), "layout")
    diffs = ["%s: C %s, Python %d" % (k, got.get(k), v) for k, v in expect.items() if got.get(k) != str(v)]
    assert not diffs, "mirrors out of date:\n" + "\n".join(diffs)


def test_every_mirrored_constant_has_the_header_value(cc, headers, tmp_path):
    body = "int main(void) {\n%s\nreturn 0;\n}\n" % "\n".join(
        'printf("%s %%lld\\n", (long long)%s);' % (k, k) for k in _ffi.CONSTANTS)
    got = _compile_and_run(cc, headers, tmp_path, body, "constants")
    diffs = ["%s: C %s, Python %d" % (k, got[k], v) for k, v in _ffi.CONSTANTS.items() if got[k] != str(v)]
    assert not diffs, "\n".join(diffs)


def test_every_prototype_compiles_against_the_headers(cc, headers, tmp_path):
    # a redeclaration with other parameter or return types is a C error
    body = _ffi.DECLARATIONS + _ffi.UCX_DECLARATIONS + "\nint main(void) { return 0; }\n"
    _compile_and_run(cc, headers, tmp_path, body, "prototypes")


def test_a_drifted_prototype_fails_the_prototype_check(cc, headers, tmp_path):
    """The check above can fail: an int32_t count where the header has int64_t is caught."""
    src = tmp_path / "drift.c"
    src.write_text('#include "mstar_kv.h"\nmskv_result mskv_request_reserve(mskv_arena *a, mskv_request r, int32_t t);\n')
    r = subprocess.run([cc, "-std=c99", "-Werror", "-I", str(headers), "-c", str(src), "-o", str(tmp_path / "d.o")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "mskv_request_reserve" in r.stderr


def test_declarations_become_argtypes_of_the_loaded_library():
    protos = _ffi.parse_declarations()
    assert protos["mskv_request_reserve"] == (ctypes.c_int, [ctypes.c_void_p, _ffi.mskv_request, ctypes.c_int64])
    assert protos["mskv_result_string"][0] is ctypes.c_char_p
    assert protos["mskv_cuda_store_pool"][0] is ctypes.c_uint64
    for name, (restype, argtypes) in protos.items():
        fn = getattr(_ffi.lib, name)
        assert fn.argtypes == argtypes and fn.restype is restype, name
