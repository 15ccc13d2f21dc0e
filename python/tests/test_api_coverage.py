"""The package binds the whole C API: every public function of the three
headers (an MSKV_API declaration before the implementation) is declared in
_ffi (DECLARATIONS, UCX_DECLARATIONS: compiled against the headers by
test_layout.py) and called by the package's Python code, or is on the
short, commented exclusion list _ffi.EXCLUDED."""
import re
from pathlib import Path

import pytest

from mstar_kv import _ffi

PACKAGE = Path(_ffi.__file__).resolve().parent
HEADERS = ("mstar_kv.h", "mstar_kv_cuda.h", "mstar_kv_ucx.h")


def public_functions(text):
    """Names of the MSKV_API functions declared before the implementation part."""
    cut = re.search(r"^#ifdef MSTAR_KV_\w*IMPLEMENTATION\b", text, re.M)
    api = text[:cut.start()] if cut else text
    names = []
    for m in re.finditer(r"^MSKV_API\b([^;{]*?)\b(mskv_\w+)\s*\(", api, re.M):
        names.append(m.group(2))
    return names


def declared(text):
    return set(re.findall(r"\b(mskv_\w+)\s*\(", text))


def package_source():
    return "\n".join(p.read_text() for p in sorted(PACKAGE.glob("*.py")) if p.name != "_ffi.py") + \
        "\n" + (PACKAGE / "_ffi.py").read_text().split("DECLARATIONS = \"\"\"")[0]


def unbound(public, decls, source, excluded):
    """Public functions neither declared and used by the package, nor excluded."""
    return [n for n in public if n not in excluded and (n not in decls or not re.search(r"\b%s\b" % n, source))]


@pytest.fixture
def public(headers):
    out = {}
    for h in HEADERS:
        for name in public_functions((headers / h).read_text()):
            out.setdefault(name, h)
    return out


def test_every_public_function_is_bound_or_excluded_with_a_reason(public):
    decls = declared(_ffi.DECLARATIONS + _ffi.UCX_DECLARATIONS)
    missing = unbound(list(public), decls, package_source(), _ffi.EXCLUDED)
    bound = len(public) - len(missing) - len([n for n in public if n in _ffi.EXCLUDED])
    print("public %d, bound %d, excluded %d" % (len(public), bound, len(_ffi.EXCLUDED)))
    assert not missing, "public functions with no Python binding (bind them, or add them to _ffi.EXCLUDED " \
                        "with the reason):\n" + "\n".join("%s (%s)" % (n, public[n]) for n in missing)


def test_the_exclusion_list_is_short_current_and_says_why(public):
    assert len(_ffi.EXCLUDED) <= 8
    for name, why in _ffi.EXCLUDED.items():
        assert name in public, "%s is excluded but is no public function any more" % name
        assert len(why) > 20, "%s: the exclusion needs its reason" % name


def test_the_header_parse_finds_every_declaration(headers):
    names = public_functions((headers / "mstar_kv.h").read_text())
    assert len(names) == len(set(names)) > 90
    assert "mskv_lockstep_create" in names and "mskv_arena_create" in names
    cuda = public_functions((headers / "mstar_kv_cuda.h").read_text())
    assert len(cuda) == len(set(cuda)) and "mskv_cuda_graph_launch" in cuda   # not the definitions too


def test_the_check_fails_for_a_function_that_is_declared_but_never_called():
    """The check above can fail: a declared, unused, unexcluded function is reported, and so is an undeclared one."""
    decls = {"mskv_used", "mskv_declared_only"}
    source = "lib.mskv_used(x)"
    assert unbound(["mskv_used", "mskv_declared_only", "mskv_new"], decls, source, {}) == \
        ["mskv_declared_only", "mskv_new"]
    assert unbound(["mskv_new"], decls, source, {"mskv_new": "why"}) == []
