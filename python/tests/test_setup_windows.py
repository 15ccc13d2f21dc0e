"""python/setup.py's Windows build, checked on any platform: a Windows
compiler builds the library with MSKV_DLL and MSKV_BUILD_DLL (so the headers
mark every public function __declspec(dllexport)), and MSVC's link is also
given every public function by name; a unix compiler gets neither. The
setup() call is replaced, so nothing is built here (tests/dll_check.py
builds and runs a real DLL with mingw-w64 under wine)."""
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
import setuptools
from setuptools import Extension

SETUP = Path(__file__).resolve().parent.parent / "setup.py"

from test_api_coverage import HEADERS, public_functions as declared_public   # noqa: E402


@pytest.fixture
def setup_py(monkeypatch):
    if not SETUP.is_file():
        pytest.skip("python/setup.py not found beside the tests (an installed copy of the tests only)")
    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)
    return runpy.run_path(str(SETUP), run_name="mstar_kv_setup")


def command(setup_py, compiler_type):
    cmd = object.__new__(setup_py["build_shared_library"])
    cmd.compiler = SimpleNamespace(compiler_type=compiler_type)
    return cmd


def test_setup_reads_the_same_public_functions_as_the_api_coverage_test(setup_py):
    d = setup_py["header_dir"]()
    want = []
    for h in HEADERS:
        want += declared_public((d / h).read_text(encoding="utf-8"))
    names = setup_py["public_functions"](d)
    assert len(names) >= 100
    assert names == sorted(set(want))
    assert "mskv_arena_create" in names and "mskv_cuda_probe" in names and "mskv_ucx_probe" in names


def test_msvc_link_is_given_every_public_function_and_unix_none(setup_py):
    ext = Extension("mstar_kv._libmstar_kv", sources=["mstar_kv/_lib.c"])
    names = setup_py["public_functions"](setup_py["header_dir"]())
    assert command(setup_py, "msvc").get_export_symbols(ext) == names
    assert command(setup_py, "unix").get_export_symbols(ext) == []
    assert command(setup_py, "mingw32").get_export_symbols(ext) == []   # __declspec(dllexport) alone


@pytest.mark.parametrize("ctype", ["msvc", "mingw32"])
def test_a_windows_build_defines_MSKV_DLL_and_MSKV_BUILD_DLL(setup_py, ctype):
    ext = Extension("mstar_kv._libmstar_kv", sources=["mstar_kv/_lib.c"])
    command(setup_py, ctype).platform_options(ext)
    assert ("MSKV_DLL", None) in ext.define_macros and ("MSKV_BUILD_DLL", None) in ext.define_macros
    assert "-std=c99" not in ext.extra_compile_args and "dl" not in ext.libraries


def test_a_unix_build_exports_as_before(setup_py):
    ext = Extension("mstar_kv._libmstar_kv", sources=["mstar_kv/_lib.c"])
    command(setup_py, "unix").platform_options(ext)
    assert not any(name.startswith("MSKV_") for name, _ in ext.define_macros)
    assert ext.extra_compile_args == ["-std=c99"] and ext.libraries == ["dl", "pthread", "m"]
