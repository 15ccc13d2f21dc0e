"""Builds the package's one native file: a plain C shared library compiled
from mstar_kv.h + mstar_kv_cuda.h + mstar_kv_ucx.h (python/mstar_kv/_lib.c), loaded with
ctypes. setuptools' Extension machinery is used only because it knows how to
drive the platform's C compiler; the library has no Python API in it.

The headers come from python/include/ (an sdist carries them there) or from
the repository root, one folder up (`pip install ./python`)."""
import os
import re
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

try:   # setuptools 70.1 and newer have it; older ones take the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
HEADERS = ("mstar_kv.h", "mstar_kv_cuda.h", "mstar_kv_ucx.h")


def header_dir():
    for d in (HERE / "include", HERE.parent):
        if all((d / h).is_file() for h in HEADERS):
            return d
    sys.exit("mstar_kv: mstar_kv.h, mstar_kv_cuda.h and mstar_kv_ucx.h were not found in python/include/ or next to "
             "python/: run `pip install ./python` from a checkout of the repository (pip 21.3 or newer builds "
             "in place; an older pip copies python/ away from the headers), or install an sdist")


def public_functions(d):
    """The MSKV_API functions each header declares before its implementation
    part: what the library exports (the same reading as the package's API
    coverage test)."""
    names = set()
    for h in HEADERS:
        text = (d / h).read_text(encoding="utf-8")
        cut = re.search(r"^#ifdef MSTAR_KV_\w*IMPLEMENTATION\b", text, re.M)
        api = text[:cut.start()] if cut else text
        names.update(m.group(2) for m in re.finditer(r"^MSKV_API\b([^;{]*?)\b(mskv_\w+)\s*\(", api, re.M))
    return sorted(names)


def windows_compiler(compiler_type):
    return compiler_type in ("msvc", "mingw32", "cygwin")


class build_shared_library(build_ext):
    def platform_options(self, ext):
        """What this platform's compiler needs beyond the sources."""
        ctype = self.compiler.compiler_type
        if ctype == "unix":
            ext.extra_compile_args += ["-std=c99"]
            ext.libraries += ["dl", "pthread", "m"]
        if windows_compiler(ctype):
            # a DLL exports only what is marked: MSKV_DLL with MSKV_BUILD_DLL
            # makes every MSKV_API function __declspec(dllexport)
            ext.define_macros += [("MSKV_DLL", None), ("MSKV_BUILD_DLL", None)]

    def build_extension(self, ext):
        d = header_dir()
        ext.include_dirs.append(str(d))
        # _lib.c only includes the headers: name them, or a build directory
        # left from another checkout's headers counts as up to date
        ext.depends += [str(d / h) for h in HEADERS]
        self.platform_options(ext)
        # a build directory from before the library lost its interpreter tag
        # holds a stale _libmstar_kv.cpython-*.so that would ship beside it
        target = Path(self.get_ext_fullpath(ext.name))
        for old in target.parent.glob(target.name.split(".")[0] + ".*"):
            if old.name != target.name:
                old.unlink()
        super().build_extension(ext)

    def get_ext_filename(self, ext_name):
        # the interpreter-neutral suffix (".so", ".pyd"): a ctypes library loads
        # from any Python 3, as the wheel's py3-none tag says
        import importlib.machinery
        return os.path.join(*ext_name.split(".")) + importlib.machinery.EXTENSION_SUFFIXES[-1]

    def get_export_symbols(self, ext):
        # not a Python extension module: no PyInit_ function to export (the
        # default would ask the linker for one). MSVC's link is also given
        # every public function by name (/EXPORT:), beside the headers'
        # __declspec(dllexport), so the DLL exports the C API either way;
        # ELF shared objects export every extern function as they are.
        if self.compiler is not None and self.compiler.compiler_type == "msvc":
            return public_functions(header_dir())
        return []


class bdist_wheel_ctypes(bdist_wheel):
    """The wheel holds a plain C library loaded with ctypes, no extension
    module: any Python 3 on the platform loads it, so it is tagged
    py3-none-<platform> rather than for one interpreter and ABI."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False   # platform-specific: it carries a shared library

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


class sdist_with_headers(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        inc = Path(base_dir) / "include"
        inc.mkdir(exist_ok=True)
        for h in HEADERS:
            shutil.copy2(header_dir() / h, inc / h)


setup(
    ext_modules=[Extension("mstar_kv._libmstar_kv", sources=["mstar_kv/_lib.c"])],
    cmdclass={"build_ext": build_shared_library, "sdist": sdist_with_headers, "bdist_wheel": bdist_wheel_ctypes},
)
