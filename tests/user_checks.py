#!/usr/bin/env python3
"""user_checks.py - what a new user does first, checked: copy the README's C
code, zero-initialise the library's structs, install the headers and build
against them with pkg-config.

  * Every ```c block of README.md, python/README.md, demo/README.md and
    docs/*.md is compiled as C99
    (gcc) and as C++17 (g++) with -Wall -Wextra -pedantic -Werror, run, and
    what it prints is compared with its "prints:" comment (if it has one).
    A block with a main function is a whole program. A block whose first
    line is FRAGMENT_MARK is the body of main in the README's app.c: the
    prelude below, then "int main(void) {", the block, "return 0; }".
    Any other block fails: nothing in a README goes unchecked.
  * Every public struct of the three headers (read from the headers, so a new one
    is covered) accepts MSKV_ZERO_INIT with every warning as an error in C99
    and C++17 under gcc and clang, and the C idiom {0} as well (in C++ only
    the two warnings C++ compilers give for {0} in any struct are allowed:
    -Wmissing-field-initializers, -Wmissing-braces).
  * make install PREFIX=<temporary directory> puts the headers, mstar_kv.pc
    and the CMake package there; a program built with `pkg-config --cflags
    --libs mstar_kv` against them runs, and so does one built by cmake with
    find_package(mstar_kv) and the target mstar_kv::mstar_kv; make uninstall
    removes every file again.

One test per README block, each named after the section it sits in. Output
follows tests/mskv_test.h: "[ RUN  ]", "[  OK  ]", "[ FAIL ]", "[ SKIP ]"
lines and the closing "N passed, N failed, N skipped". Options: --list,
--filter SUBSTRING. CC / CXX / CLANG / CLANGXX choose the compilers.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# every page a user reads: the README, the manual in docs/, the demo's and the package's
READMES = ["README.md", "python/README.md", "demo/README.md"] + sorted(
    "docs/" + f for f in os.listdir(os.path.join(ROOT, "docs"))
    if f.endswith(".md") and f != "api.md")   # api.md: generated declarations, checked by tools/gen_api.py
HEADERS = ["mstar_kv.h", "mstar_kv_cuda.h", "mstar_kv_ucx.h"]   # what make install puts in include/
FRAGMENT_MARK = "/* fragment: runs inside main() of app.c */"
# what the README's app.c has above main: the include idiom
PRELUDE = """#define MSTAR_KV_IMPLEMENTATION
#include "mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "mstar_kv_cuda.h"
#include <stdio.h>
"""
WARN = ["-Wall", "-Wextra", "-pedantic", "-Werror"]
LIBS = ["-ldl", "-lpthread", "-lm"]
CC = os.environ.get("CC") or "gcc"
CXX = os.environ.get("CXX") or "g++"
CLANG = os.environ.get("CLANG") or "clang"
CLANGXX = os.environ.get("CLANGXX") or "clang++"


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def compile_c(compiler, lang_flags, src, out, extra=(), libs=LIBS, include=ROOT):
    r = run([compiler] + lang_flags + WARN + list(extra) + ["-O0", "-I", include, src, "-o", out] + list(libs))
    if r.returncode != 0:
        raise Failure("%s %s failed:\n%s" % (compiler, " ".join(lang_flags), (r.stdout + r.stderr)[-4000:]))


C99 = ["-std=c99"]
CXX17 = ["-x", "c++", "-std=c++17"]


# >>readme blocks --------------------------------------------------------------

def slug(text):
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def readme_blocks():
    """(test name, readme, line, code) for every ```c block."""
    out = []
    for readme in READMES:
        path = os.path.join(ROOT, readme)
        if not os.path.exists(path):
            continue
        section, fence, code, start, n = "top", None, [], 0, 0
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines, 1):
            if fence is None:
                if line.startswith("```"):
                    fence, code, start = line[3:].strip(), [], i
                elif line.startswith("#"):
                    section = line.lstrip("#").strip()
            elif line.strip() == "```":
                if fence == "c":
                    n += 1
                    name = "%s_c_block_%d_%s_compiles_and_runs_as_c99_and_cxx" % (
                        slug(readme.replace(".md", "")), n, slug(section))
                    out.append((name, readme, start, "\n".join(code) + "\n"))
                fence = None
            else:
                code.append(line)
    return out


def as_program(code):
    if re.search(r"\bint\s+main\s*\(", code):
        return code
    first = code.lstrip("\n").split("\n", 1)[0].strip()
    if first != FRAGMENT_MARK:
        raise Failure("neither a whole program (no main) nor a fragment (first line %s): make it one or the other"
                      % FRAGMENT_MARK)
    body = "\n".join("    " + l if l else l for l in code.rstrip("\n").split("\n"))
    return PRELUDE + "\nint main(void) {\n" + body + "\n    return 0;\n}\n"


def expected_output(code):
    """The lines its "prints:" comments promise, in order (None: not stated)."""
    found = re.findall(r"prints:\s*(.*?)\s*\*/", code)
    return found or None


def check_block(readme, line, code):
    prog = as_program(code)
    want = expected_output(code)
    with tempfile.TemporaryDirectory(prefix="mskv_snippet_") as tmp:
        src = os.path.join(tmp, "app.c")
        with open(src, "w") as f:
            f.write(prog)
        for compiler, lang, name in ((CC, C99, "c99"), (CXX, CXX17, "c++17")):
            exe = os.path.join(tmp, "app_" + name.replace("+", "x"))
            try:
                compile_c(compiler, lang, src, exe)
            except Failure as e:
                raise Failure("%s:%d as %s: %s" % (readme, line, name, e))
            r = run([exe], cwd=tmp, timeout=120)
            if r.returncode != 0:
                raise Failure("%s:%d as %s exited with %d:\n%s%s" % (readme, line, name, r.returncode, r.stdout,
                                                                    r.stderr))
            if want is not None:
                got = [l.rstrip() for l in r.stdout.strip("\n").split("\n")] if r.stdout.strip() else []
                if got != want:
                    raise Failure("%s:%d as %s printed %r, its comment says %r" % (readme, line, name, got, want))
        said = "; ".join(l for l in r.stdout.strip().split("\n") if l)
        print("  %s:%d: %s" % (readme, line, "; ".join(want) if want else
                               "ran, printed %r (no prints: comment to compare)" % said))


def test_readme_c_blocks_are_found():
    """The extractor sees the pages' blocks (a changed fence would otherwise check nothing): the
    README's program, and the manual's examples in the pages that carry them."""
    found = {}
    for b in readme_blocks():
        found[b[1]] = found.get(b[1], 0) + 1
    want = {"README.md": 1, "docs/c-api.md": 4, "docs/concepts.md": 1, "docs/cpu.md": 1, "docs/gpu.md": 2,
            "docs/migration.md": 1}
    short = ["%s: %d, expected at least %d" % (p, found.get(p, 0), n) for p, n in want.items() if found.get(p, 0) < n]
    if short:
        raise Failure("too few ```c blocks found: " + "; ".join(short))


# >>struct initialisation ---------------------------------------------------------

def public_structs():
    names = []
    for h in HEADERS:
        with open(os.path.join(ROOT, h), encoding="utf-8") as f:
            for m in re.finditer(r"^typedef struct (mskv_[a-z0-9_]+) \{", f.read(), re.M):
                if not m.group(1).startswith("mskv__"):
                    names.append(m.group(1))
    return names


def check_struct_init(init, cxx_allow=()):
    structs = public_structs()
    if len(structs) < 20:
        raise Failure("found only %d public structs in the headers: the pattern is out of date" % len(structs))
    body = "".join("    { %s x = %s; (void)x; }\n" % (t, init) for t in structs)
    prog = "".join('#include "%s"\n' % h for h in HEADERS) + "int main(void) {\n%s    return 0;\n}\n" % body
    compilers = [(CC, C99, ()), (CLANG, C99, ()), (CXX, CXX17, cxx_allow), (CLANGXX, CXX17, cxx_allow)]
    missing = [c for c, _, _ in compilers if not shutil.which(c)]
    if missing:
        raise Skip("compiler not installed: %s" % ", ".join(missing))
    with tempfile.TemporaryDirectory(prefix="mskv_init_") as tmp:
        src = os.path.join(tmp, "init.c")
        with open(src, "w") as f:
            f.write(prog)
        for compiler, lang, extra in compilers:
            r = run([compiler] + lang + WARN + list(extra) + ["-I", ROOT, "-fsyntax-only", src])
            if r.returncode != 0:
                raise Failure("%s %s: %s" % (compiler, " ".join(lang), r.stderr[-3000:]))
    print("  %d structs: %s" % (len(structs), " ".join(structs)))


def test_every_public_struct_zero_initialises_with_MSKV_ZERO_INIT_in_c_and_cxx():
    check_struct_init("MSKV_ZERO_INIT")


def test_every_public_struct_accepts_brace_zero_in_c_and_cxx():
    check_struct_init("{0}", ("-Wno-missing-field-initializers", "-Wno-missing-braces"))


# >>install ----------------------------------------------------------------------

def make_env():
    env = dict(os.environ)
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        env.pop(k, None)   # a make inside make test: no jobserver to inherit
    return env


def files_under(d):
    return sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs)


INSTALLED_PROGRAM = r"""#define MSTAR_KV_IMPLEMENTATION
#include <mstar_kv.h>
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include <mstar_kv_cuda.h>
#define MSTAR_KV_UCX_IMPLEMENTATION
#include <mstar_kv_ucx.h>
#include <stdio.h>
int main(void) {
    mskv_arena_desc d = MSKV_ZERO_INIT;
    mskv_arena *a = NULL;
    char why[512];
    d.num_pages = 8; d.page_size = 4;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return 1;
    mskv_arena_destroy(a);
    (void)mskv_cuda_probe(NULL, why, sizeof why);   /* links the GPU layer's -ldl */
    (void)mskv_ucx_probe(NULL, why, sizeof why);    /* and the UCX layer's */
    printf("installed mstar_kv %d.%d.%d\n", MSKV_VERSION_MAJOR, MSKV_VERSION_MINOR, MSKV_VERSION_PATCH);
    return 0;
}
"""


def test_make_install_puts_headers_and_a_pkg_config_file_that_builds_a_program():
    if not shutil.which("make") or not shutil.which("pkg-config"):
        raise Skip("make or pkg-config is not installed")
    with tempfile.TemporaryDirectory(prefix="mskv_prefix_") as prefix:
        r = run(["make", "-s", "-C", ROOT, "install", "PREFIX=" + prefix], env=make_env())
        if r.returncode != 0:
            raise Failure("make install failed:\n" + r.stdout + r.stderr)
        got = files_under(prefix)
        want = sorted(["include/" + h for h in HEADERS] + ["lib/pkgconfig/mstar_kv.pc"] + CMAKE_FILES)
        if got != want:
            raise Failure("make install put %s, expected %s" % (got, want))
        for h in HEADERS:
            with open(os.path.join(ROOT, h), "rb") as a, open(os.path.join(prefix, "include", h), "rb") as b:
                if a.read() != b.read():
                    raise Failure("installed %s differs from the repository's" % h)
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))
        r = run(["pkg-config", "--cflags", "--libs", "mstar_kv"], env=env)
        if r.returncode != 0:
            raise Failure("pkg-config --cflags --libs mstar_kv: " + r.stderr)
        flags = r.stdout.split()
        if "-I" + os.path.join(prefix, "include") not in flags or not {"-ldl", "-lpthread", "-lm"} <= set(flags):
            raise Failure("pkg-config gives %s: expected -I%s/include -ldl -lpthread -lm" % (flags, prefix))
        r = run(["pkg-config", "--modversion", "mstar_kv"], env=env)
        ver = run(["sh", "-c", "sed -n 's/^#define MSKV_VERSION_\\(MAJOR\\|MINOR\\|PATCH\\) //p' '%s' | paste -sd."
                   % os.path.join(ROOT, "mstar_kv.h")])
        if r.stdout.strip() != ver.stdout.strip():
            raise Failure("mstar_kv.pc says version %r, the header %r" % (r.stdout.strip(), ver.stdout.strip()))
        with tempfile.TemporaryDirectory(prefix="mskv_app_") as tmp:
            src, exe = os.path.join(tmp, "app.c"), os.path.join(tmp, "app")
            with open(src, "w") as f:
                f.write(INSTALLED_PROGRAM)
            # only what pkg-config says: no -I into the repository
            r = run([CC, "-std=c99"] + WARN + [src, "-o", exe] + flags)
            if r.returncode != 0:
                raise Failure("building against the installed headers failed:\n" + r.stderr[-3000:])
            r = run([exe])
            if r.returncode != 0 or not r.stdout.startswith("installed mstar_kv " + ver.stdout.strip()):
                raise Failure("the installed program exited with %d and printed %r" % (r.returncode, r.stdout))
            print("  " + r.stdout.strip() + " (pkg-config: " + " ".join(flags) + ")")
        r = run(["make", "-s", "-C", ROOT, "uninstall", "PREFIX=" + prefix], env=make_env())
        if r.returncode != 0:
            raise Failure("make uninstall failed:\n" + r.stdout + r.stderr)
        left = files_under(prefix)
        if left:
            raise Failure("make uninstall left %s" % left)


CMAKE_FILES = ["lib/cmake/mstar_kv/mstar_kvConfig.cmake", "lib/cmake/mstar_kv/mstar_kvConfigVersion.cmake"]
CMAKE_PROJECT = """cmake_minimum_required(VERSION 3.10)
project(mskv_consumer C)
find_package(mstar_kv %s REQUIRED)
add_executable(app app.c)
target_link_libraries(app PRIVATE mstar_kv::mstar_kv)
set_target_properties(app PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(app PRIVATE -Wall -Wextra -pedantic -Werror)
"""


def header_version():
    with open(os.path.join(ROOT, "mstar_kv.h"), encoding="utf-8") as f:
        text = f.read()
    return tuple(int(re.search(r"^#define MSKV_VERSION_%s (\d+)" % k, text, re.M).group(1))
                 for k in ("MAJOR", "MINOR", "PATCH"))


def cmake_configure(prefix, tmp, version):
    """Configures (and on success builds) the consumer requesting `version`."""
    src, bld = os.path.join(tmp, "src"), os.path.join(tmp, "build-" + version)
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write(CMAKE_PROJECT % version)
    with open(os.path.join(src, "app.c"), "w") as f:
        f.write(INSTALLED_PROGRAM)
    env = dict(make_env(), CC=CC)
    r = run(["cmake", "-S", src, "-B", bld, "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_BUILD_TYPE=Release"], env=env)
    return r, bld


def test_make_install_puts_a_cmake_package_that_builds_a_program():
    """find_package(mstar_kv VERSION) with CMAKE_PREFIX_PATH=<prefix>: the
    INTERFACE target mstar_kv::mstar_kv builds and links a program (only
    what the package says: no -I into the repository), and a later minor
    release than the installed one is refused."""
    if not shutil.which("make") or not shutil.which("cmake"):
        raise Skip("make or cmake is not installed (Debian: apt-get install cmake)")
    major, minor, patch = header_version()
    with tempfile.TemporaryDirectory(prefix="mskv_prefix_") as prefix, \
            tempfile.TemporaryDirectory(prefix="mskv_cmake_") as tmp:
        r = run(["make", "-s", "-C", ROOT, "install", "PREFIX=" + prefix], env=make_env())
        if r.returncode != 0:
            raise Failure("make install failed:\n" + r.stdout + r.stderr)
        for f in CMAKE_FILES:
            if not os.path.isfile(os.path.join(prefix, f)):
                raise Failure("make install did not write %s" % f)
        r, bld = cmake_configure(prefix, tmp, "%d.%d" % (major, minor))
        if r.returncode != 0:
            raise Failure("cmake could not configure the consumer:\n" + (r.stdout + r.stderr)[-3000:])
        r = run(["cmake", "--build", bld], env=make_env())
        if r.returncode != 0:
            raise Failure("cmake --build failed:\n" + (r.stdout + r.stderr)[-3000:])
        with open(os.path.join(bld, "CMakeCache.txt")) as f:
            cache = f.read()
        found = re.search(r"^mstar_kv_DIR:PATH=(.*)$", cache, re.M)
        if not found or os.path.realpath(found.group(1)) != os.path.realpath(os.path.join(prefix, "lib/cmake/mstar_kv")):
            raise Failure("find_package found mstar_kv at %s, not in the prefix" % (found and found.group(1)))
        r = run([os.path.join(bld, "app")])
        want = "installed mstar_kv %d.%d.%d" % (major, minor, patch)
        if r.returncode != 0 or not r.stdout.startswith(want):
            raise Failure("the CMake-built program exited with %d and printed %r" % (r.returncode, r.stdout))
        print("  " + r.stdout.strip() + " (cmake: find_package(mstar_kv %d.%d), mstar_kv::mstar_kv)" % (major, minor))
        later = "%d.%d" % (major, minor + 1)
        r, _ = cmake_configure(prefix, tmp, later)
        if r.returncode == 0 or "mstar_kv" not in r.stderr:
            raise Failure("find_package(mstar_kv %s) accepted version %d.%d.%d:\n%s"
                          % (later, major, minor, patch, (r.stdout + r.stderr)[-2000:]))
        r = run(["make", "-s", "-C", ROOT, "uninstall", "PREFIX=" + prefix], env=make_env())
        left = files_under(prefix)
        if r.returncode != 0 or left:
            raise Failure("make uninstall failed or left %s:\n%s" % (left, r.stdout + r.stderr))


# >>harness ----------------------------------------------------------------------

def all_tests():
    tests = []
    for name, readme, line, code in readme_blocks():
        tests.append((name, (lambda r=readme, l=line, c=code: check_block(r, l, c))))
    for name in sorted(k for k in globals() if k.startswith("test_")):
        tests.append((name[5:], globals()[name]))
    return tests


def run_cases(argv, tests, before=None):
    """Runs (name, fn) cases in the harness's format: --list, --filter SUBSTRING, and the
    closing totals line; fn raises Skip or Failure (any other exception is a failure too).
    tests/dll_check.py runs its cases through this as well."""
    filt, listing = None, False
    args = list(argv[1:])
    while args:
        a = args.pop(0)
        if a == "--list":
            listing = True
        elif a == "--filter" and args:
            filt = args.pop(0)
        else:
            print("usage: %s [--list] [--filter SUBSTRING]" % argv[0])
            return 2
    if before is not None:
        before()
    passed = failed = skipped = 0
    for name, fn in tests:
        if filt and filt not in name:
            continue
        if listing:
            print(name)
            continue
        print("[ RUN  ] %s" % name, flush=True)
        try:
            fn()
        except Skip as e:
            skipped += 1
            print("  skip [%s]: %s\n[ SKIP ] %s" % (name, e, name))
        except Failure as e:
            failed += 1
            print("  %s\n[ FAIL ] %s" % (str(e).replace("\n", "\n  "), name))
        except Exception as e:  # a bug here is a failure too, with its reason
            failed += 1
            print("  %s: %s\n[ FAIL ] %s" % (type(e).__name__, e, name))
        else:
            passed += 1
            print("[  OK  ] %s" % name)
        sys.stdout.flush()
    if not listing:
        print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return min(failed, 255)


def main(argv):
    return run_cases(argv, all_tests())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
