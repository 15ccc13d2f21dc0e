#!/usr/bin/env python3
"""dll_check.py - the headers built as a shared library, as MSKV_API says.

  * ELF (gcc, g++, clang, clang++): the three implementations built with
    -fvisibility=hidden and MSKV_DLL export exactly the public functions (the
    MSKV_API declarations before each header's implementation part), and
    without MSKV_DLL none: the macro is what exports them. A program built
    with MSKV_DLL links against the library and runs.
  * MSKV_API defined by the user before the first include is taken as it is,
    with every warning an error (the headers' own definition does not
    replace it).
  * Windows (mingw-w64 gcc and g++, C and C++): a DLL built with MSKV_DLL and
    MSKV_BUILD_DLL, and -Wl,--exclude-all-symbols (so only what the headers
    mark is exported, as MSVC exports only what is marked), exports exactly
    the public functions (x86_64-w64-mingw32-objdump -p); the same with a
    user's `#define MSKV_API __declspec(dllexport)`; a consumer .exe built
    with MSKV_DLL alone (dllimport) imports them from the DLL and runs under
    wine (tests/wine.sh, in a prefix of its own so that it never stops the
    wine server of another test program running beside it).

Output follows tests/mskv_test.h: "[ RUN  ]", "[  OK  ]", "[ FAIL ]",
"[ SKIP ]" lines and the closing "N passed, N failed, N skipped". Options:
--list, --filter SUBSTRING.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = ["mstar_kv.h", "mstar_kv_cuda.h", "mstar_kv_ucx.h"]
WARN = ["-Wall", "-Wextra", "-pedantic", "-Werror"]
MINGW = "x86_64-w64-mingw32-"
LANGS = {"c": ["-std=c99"], "c++": ["-x", "c++", "-std=c++17"]}

LIBRARY = r"""#define MSTAR_KV_IMPLEMENTATION
#include "mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "mstar_kv_cuda.h"
#define MSTAR_KV_UCX_IMPLEMENTATION
#include "mstar_kv_ucx.h"
"""

CONSUMER = r"""#include "mstar_kv.h"
#include "mstar_kv_cuda.h"
#include "mstar_kv_ucx.h"
#include <stdio.h>
int main(void) {
    mskv_arena_desc d = MSKV_ZERO_INIT;
    mskv_arena *a = NULL;
    mskv_result r;
    char why[512];
    d.num_pages = 8; d.page_size = 4;
    r = mskv_arena_create(&d, &a);
    if (r != MSKV_SUCCESS) { printf("arena: %s\n", mskv_result_string(r)); return 1; }
    mskv_arena_destroy(a);
    (void)mskv_cuda_probe(NULL, why, sizeof why);
    (void)mskv_ucx_probe(NULL, why, sizeof why);
    printf("shared mstar_kv %d.%d.%d: arena created and destroyed\n", MSKV_VERSION_MAJOR, MSKV_VERSION_MINOR,
           MSKV_VERSION_PATCH);
    return 0;
}
"""


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from user_checks import Failure, Skip, run_cases  # noqa: E402  (the same harness and its output)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def public_functions():
    """The MSKV_API functions each header declares before its implementation part."""
    names = set()
    for h in HEADERS:
        with open(os.path.join(ROOT, h), encoding="utf-8") as f:
            text = f.read()
        cut = re.search(r"^#ifdef MSTAR_KV_\w*IMPLEMENTATION\b", text, re.M)
        api = text[:cut.start()] if cut else text
        names |= {m.group(2) for m in re.finditer(r"^MSKV_API\b([^;{]*?)\b(mskv_\w+)\s*\(", api, re.M)}
    if len(names) < 100:
        raise Failure("only %d public functions read from the headers: the pattern no longer fits them" % len(names))
    return names


def need(*tools):
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise Skip("not installed: %s%s" % (", ".join(missing), " (Debian: gcc-mingw-w64-x86-64 g++-mingw-w64-x86-64)" if any(m.startswith(MINGW) for m in missing) else ""))


def build(cmd, what):
    r = run(cmd)
    if r.returncode != 0:
        raise Failure("%s failed:\n%s\n%s" % (what, " ".join(cmd), (r.stdout + r.stderr)[-4000:]))


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def compare(got, want, what):
    if got != want:
        extra, missing = sorted(got - want), sorted(want - got)
        raise Failure("%s: %d exported, %d public; not public: %s; not exported: %s"
                      % (what, len(got), len(want), extra[:10], missing[:10]))


# >>ELF --------------------------------------------------------------------------

def elf_exports(lib):
    r = run(["nm", "-D", "--defined-only", lib])
    if r.returncode != 0:
        raise Failure("nm -D %s: %s" % (lib, r.stderr))
    return {l.split()[-1] for l in r.stdout.splitlines() if len(l.split()) == 3 and l.split()[1] == "T"}


def elf_library(tmp, compiler, lang, defines, prelude=""):
    src, lib = os.path.join(tmp, "lib.c"), os.path.join(tmp, "libmskvshared.so")
    write(src, prelude + LIBRARY)
    build([compiler] + LANGS[lang] + WARN + ["-O0", "-fPIC", "-shared", "-fvisibility=hidden"] + defines +
          ["-I", ROOT, src, "-o", lib, "-ldl", "-lpthread", "-lm"], "building the shared library")
    return lib


def check_elf(compiler, lang):
    need(compiler, "nm")
    want = public_functions()
    with tempfile.TemporaryDirectory(prefix="mskv_so_") as tmp:
        lib = elf_library(tmp, compiler, lang, [])
        got = elf_exports(lib)
        if got & want:
            raise Failure("without MSKV_DLL, -fvisibility=hidden still exported %s: the test cannot tell"
                          % sorted(got & want)[:5])
        lib = elf_library(tmp, compiler, lang, ["-DMSKV_DLL", "-DMSKV_BUILD_DLL"])
        compare(elf_exports(lib), want, "%s %s -DMSKV_DLL -fvisibility=hidden" % (compiler, lang))
        src, exe = os.path.join(tmp, "app.c"), os.path.join(tmp, "app")
        write(src, CONSUMER)
        build([compiler] + LANGS[lang] + WARN + ["-O0", "-DMSKV_DLL", "-I", ROOT, src, "-o", exe, "-L", tmp,
              "-lmskvshared", "-Wl,-rpath," + tmp], "building the program against the shared library")
        r = run([exe])
        if r.returncode != 0 or not r.stdout.startswith("shared mstar_kv "):
            raise Failure("the program exited with %d and printed %r" % (r.returncode, r.stdout + r.stderr))
        print("  %s (%s %s, %d functions exported)" % (r.stdout.strip(), compiler, lang, len(want)))


def test_elf_gcc_c99_MSKV_DLL_exports_exactly_the_public_functions():
    check_elf("gcc", "c")


def test_elf_gxx_MSKV_DLL_exports_exactly_the_public_functions():
    check_elf("g++", "c++")


def test_elf_clang_c99_MSKV_DLL_exports_exactly_the_public_functions():
    check_elf("clang", "c")


def test_elf_clangxx_MSKV_DLL_exports_exactly_the_public_functions():
    check_elf("clang++", "c++")


def test_a_user_defined_MSKV_API_is_used_as_it_is_without_a_warning():
    """Exports under -fvisibility=hidden only because the user's MSKV_API says so."""
    want = public_functions()
    for compiler, lang in (("gcc", "c"), ("g++", "c++"), ("clang", "c"), ("clang++", "c++")):
        need(compiler, "nm")
        with tempfile.TemporaryDirectory(prefix="mskv_api_") as tmp:
            lib = elf_library(tmp, compiler, lang, [],
                              prelude='#define MSKV_API extern __attribute__((visibility("default")))\n')
            compare(elf_exports(lib), want, "%s %s with the user's MSKV_API" % (compiler, lang))


# >>Windows ----------------------------------------------------------------------

def pe_exports(dll):
    """The names in the DLL's export name table (objdump -p)."""
    r = run([MINGW + "objdump", "-p", dll])
    if r.returncode != 0:
        raise Failure("objdump -p %s: %s" % (dll, r.stderr))
    names, inside = set(), False
    for line in r.stdout.splitlines():
        if line.startswith("[Ordinal/Name Pointer] Table"):
            inside = True
        elif inside:
            m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s*$", line)
            if not m:
                break
            names.add(m.group(1))
    return names


def pe_imports(exe, dll_name):
    r = run([MINGW + "objdump", "-p", exe])
    out, names, inside = r.stdout.splitlines(), set(), False
    for line in out:
        if line.strip().startswith("DLL Name:"):
            inside = line.split(":", 1)[1].strip().lower() == dll_name.lower()
        elif inside:
            m = re.match(r"\s*[0-9a-f]+\s+\d+\s+(mskv_\w+)\s*$", line)
            if m:
                names.add(m.group(1))
    return names


def mingw_dll(tmp, compiler, lang, defines, prelude=""):
    src, dll = os.path.join(tmp, "lib.c"), os.path.join(tmp, "mskv.dll")
    write(src, prelude + LIBRARY)
    build([MINGW + compiler] + LANGS[lang] + WARN + ["-O1", "-shared"] + defines +
          ["-I", ROOT, src, "-o", dll, "-Wl,--exclude-all-symbols", "-Wl,--out-implib," + os.path.join(tmp, "libmskv.dll.a"),
           "-static"], "building the DLL")
    return dll


def check_mingw(compiler, lang):
    need(MINGW + compiler, MINGW + "objdump")
    want = public_functions()
    with tempfile.TemporaryDirectory(prefix="mskv_dll_", dir=os.path.join(ROOT, "build")) as tmp:
        got = pe_exports(mingw_dll(tmp, compiler, lang, []))
        if got & want:
            raise Failure("without MSKV_DLL the DLL still exported %s: the test cannot tell" % sorted(got & want)[:5])
        compare(pe_exports(mingw_dll(tmp, compiler, lang, [], prelude="#define MSKV_API __declspec(dllexport)\n")),
                want, "%s%s with #define MSKV_API __declspec(dllexport)" % (MINGW, compiler))
        dll = mingw_dll(tmp, compiler, lang, ["-DMSKV_DLL", "-DMSKV_BUILD_DLL"])
        compare(pe_exports(dll), want, "%s%s %s -DMSKV_DLL -DMSKV_BUILD_DLL" % (MINGW, compiler, lang))
        src, exe = os.path.join(tmp, "app.c"), os.path.join(tmp, "app.exe")
        write(src, CONSUMER)
        build([MINGW + compiler] + LANGS[lang] + WARN + ["-O1", "-DMSKV_DLL", "-I", ROOT, src, "-o", exe,
              "-L", tmp, "-lmskv", "-static-libgcc"] + (["-static-libstdc++"] if lang == "c++" else []),
              "building the consumer against the DLL")
        used = pe_imports(exe, "mskv.dll")
        if not {"mskv_arena_create", "mskv_cuda_probe", "mskv_ucx_probe"} <= used:
            raise Failure("app.exe does not import its functions from mskv.dll (imports from it: %s)" % sorted(used))
        wine = os.path.join(ROOT, "tests", "wine.sh")
        env = dict(os.environ, MSKV_WINEPREFIX=os.path.join(ROOT, "build", "wine-prefix-dll"))
        r = run(["bash", wine, "--check"], env=env)
        if r.returncode != 0:
            raise Skip("the DLL and app.exe built and checked; not run: %s" % r.stdout.strip())
        r = run(["bash", wine, exe], env=env)
        if r.returncode != 0 or not r.stdout.startswith("shared mstar_kv "):
            raise Failure("app.exe under wine exited with %d and printed %r" % (r.returncode, r.stdout))
        print("  %s (under wine: %s%s %s, mskv.dll exports %d functions)" % (r.stdout.strip(), MINGW, compiler, lang,
                                                                            len(want)))


def test_mingw_gcc_c99_dll_exports_the_public_functions_and_a_consumer_runs_under_wine():
    check_mingw("gcc", "c")


def test_mingw_gxx_dll_exports_the_public_functions_and_a_consumer_runs_under_wine():
    check_mingw("g++", "c++")


# >>harness ----------------------------------------------------------------------

def main(argv):
    tests = [(name[5:], globals()[name]) for name in sorted(k for k in globals() if k.startswith("test_"))]
    return run_cases(argv, tests, before=lambda: os.makedirs(os.path.join(ROOT, "build"), exist_ok=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
