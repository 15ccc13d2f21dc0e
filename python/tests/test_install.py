"""Where the library comes from: the package's own build, or MSKV_LIBRARY."""
import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import mstar_kv as mk

HEADERS = ("mstar_kv.h", "mstar_kv_cuda.h", "mstar_kv_ucx.h")


def _import_in_child(env_library):
    env = dict(os.environ, MSKV_LIBRARY=env_library)
    return subprocess.run([sys.executable, "-c", "import mstar_kv; print(mstar_kv.library_path); "
                           "print(mstar_kv.Arena(num_pages=4, page_size=2).stats().free_pages)"],
                          env=env, capture_output=True, text=True)


def test_mskv_library_selects_a_library_built_elsewhere(cc, headers, tmp_path):
    # a plain shared build of the two headers, as an application would make it
    src = tmp_path / "impl.c"
    src.write_text('#define MSTAR_KV_IMPLEMENTATION\n#include "mstar_kv.h"\n'
                   '#define MSTAR_KV_CUDA_IMPLEMENTATION\n#include "mstar_kv_cuda.h"\n')
    lib = tmp_path / "libmine.so"
    subprocess.run([cc, "-std=c99", "-O0", "-shared", "-fPIC", "-I", str(headers), str(src), "-o", str(lib),
                    "-ldl", "-lpthread", "-lm"], check=True)
    r = _import_in_child(str(lib))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(lib), "3"]
    # built without mstar_kv_ucx.h: the package loads, and UCX says why it is not there
    env = dict(os.environ, MSKV_LIBRARY=str(lib))
    r = subprocess.run([sys.executable, "-c", "import mstar_kv\ntry:\n    mstar_kv.ucx_probe()\n"
                        "except mstar_kv.UnsupportedError as e:\n    print(e)"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "built without mstar_kv_ucx.h" in r.stdout and "mskv_ucx_send" in r.stdout


def test_mskv_library_that_cannot_be_loaded_is_a_clear_import_error(tmp_path):
    r = _import_in_child(str(tmp_path / "missing.so"))
    assert r.returncode != 0
    assert "ImportError: mstar_kv: cannot load the library" in r.stderr and "MSKV_LIBRARY" in r.stderr


def test_a_library_missing_a_function_is_refused_at_import(cc, tmp_path):
    src = tmp_path / "empty.c"
    src.write_text("int mskv_nothing_here;\n")
    lib = tmp_path / "libempty.so"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    r = _import_in_child(str(lib))
    assert r.returncode != 0 and "does not export mskv_result_string" in r.stderr


def test_the_packaged_library_is_the_one_loaded_without_mskv_library():
    if os.environ.get("MSKV_LIBRARY"):
        pytest.skip("MSKV_LIBRARY is set for this run: the packaged library is not the one in use")
    here = os.path.dirname(mk.__file__)
    assert os.path.dirname(mk.library_path) == here
    assert os.path.basename(mk.library_path).startswith("_libmstar_kv")


def test_the_sdist_carries_the_headers(tmp_path):
    """pip install of an sdist has no repository around it: the headers travel inside."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(pkg, "setup.py")):
        pytest.skip("not run from the source tree (python/setup.py absent)")
    try:
        import setuptools  # noqa: F401
    except ImportError:
        pytest.skip("setuptools is not installed in this environment")
    work = tmp_path / "src"
    shutil.copytree(pkg, work, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    # the copy has no repository around it: setup.py must find the headers one level up, as in the checkout
    for h in HEADERS:
        shutil.copy2(os.path.join(pkg, "..", h), tmp_path / h)
    r = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=work,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import tarfile
    (dist,) = (tmp_path / "dist").iterdir()
    names = tarfile.open(dist).getnames()
    for h in ("include/mstar_kv.h", "include/mstar_kv_cuda.h", "include/mstar_kv_ucx.h", "mstar_kv/_lib.c",
              "mstar_kv/_core.py", "mstar_kv/py.typed", "LICENSE", "README.md"):
        assert any(n.endswith("/" + h) for n in names), h


def test_the_wheel_is_tagged_py3_none_platform_with_complete_metadata(tmp_path):
    """ctypes only, no extension module: one wheel per platform serves every Python 3."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(pkg, "setup.py")):
        pytest.skip("not run from the source tree (python/setup.py absent)")
    pytest.importorskip("build", reason="the wheel is built with `python -m build` (pip install build)")
    pytest.importorskip("wheel", reason="setuptools before 70.1 takes bdist_wheel from the wheel package")
    work = tmp_path / "python"
    shutil.copytree(pkg, work, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    for h in HEADERS:
        shutil.copy2(os.path.join(pkg, "..", h), tmp_path / h)
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(tmp_path / "dist")],
                       cwd=work, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = (tmp_path / "dist").glob("*.whl")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert whl.name == "mstar_kv-%s-py3-none-%s.whl" % (mk.__version__, plat)
    z = zipfile.ZipFile(whl)
    names = z.namelist()
    info = "mstar_kv-%s.dist-info/" % mk.__version__
    wheel_file = z.read(info + "WHEEL").decode()
    assert "Tag: py3-none-%s" % plat in wheel_file and "Root-Is-Purelib: false" in wheel_file
    meta = z.read(info + "METADATA").decode()
    head = meta.split("\n\n", 1)[0].splitlines()
    fields = {}
    for line in head:
        k, _, v = line.partition(": ")
        fields.setdefault(k, []).append(v)
    assert fields["License"] == ["MIT"] and "License :: OSI Approved :: MIT License" in fields["Classifier"]
    assert "Programming Language :: Python :: 3" in fields["Classifier"] and "Typing :: Typed" in fields["Classifier"]
    assert fields["Description-Content-Type"] == ["text/markdown"] and fields["Requires-Python"] == [">=3.8"]
    assert fields["Requires-Dist"][0].startswith("numpy")
    assert "# mstar_kv for Python" in meta.split("\n\n", 1)[1]          # the readme is the description
    licenses = [n for n in names if n.startswith(info) and n.rsplit("/", 1)[-1] == "LICENSE"]
    assert licenses and z.read(licenses[0]) == open(os.path.join(pkg, "..", "LICENSE"), "rb").read()
    assert "mstar_kv/py.typed" in names
    libs = [n for n in names if n.startswith("mstar_kv/_libmstar_kv")]
    # no interpreter tag in the library's name either: any Python 3 finds it
    assert libs == ["mstar_kv/_libmstar_kv" + importlib.machinery.EXTENSION_SUFFIXES[-1]], libs


def test_the_package_license_is_the_repositorys():
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(pkg, "..", "LICENSE")):
        pytest.skip("not run from a checkout (no LICENSE next to python/)")
    assert open(os.path.join(pkg, "LICENSE"), "rb").read() == open(os.path.join(pkg, "..", "LICENSE"), "rb").read()


def test_package_version_is_the_headers_version():
    """One version for the C library and the package: mstar_kv.h's
    MSKV_VERSION_MAJOR/MINOR/PATCH, __version__ and pyproject.toml agree."""
    import re
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    with open(os.path.join(root, "mstar_kv.h")) as f:
        h = f.read()
    parts = [re.search(r"#define MSKV_VERSION_%s (\d+)" % p, h).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    with open(os.path.join(root, "python", "pyproject.toml")) as f:
        toml = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert ".".join(parts) == mk.__version__ == toml
