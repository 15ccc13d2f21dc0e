"""The READMEs' Python examples run as written, and print what they say."""
import contextlib
import io
import re

import pytest

from conftest import REPO

READMES = [REPO / "python" / "README.md", REPO / "README.md"]


def _blocks(path):
    if not path.is_file():
        return []
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


CASES = [(p.relative_to(REPO).as_posix(), i, b) for p in READMES for i, b in enumerate(_blocks(p))]


def test_both_readmes_have_a_python_example():
    assert {c[0] for c in CASES} == {"python/README.md", "README.md"}


@pytest.mark.parametrize("where,index,code", CASES, ids=["%s#%d" % (c[0], c[1]) for c in CASES])
def test_readme_python_example_runs_and_prints_what_it_says(where, index, code):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "%s[python block %d]" % (where, index), "exec"), {"__name__": "readme"})
    promised = re.findall(r"# prints: (.*)", code)
    assert out.getvalue().splitlines() == [p.strip() for p in promised]
