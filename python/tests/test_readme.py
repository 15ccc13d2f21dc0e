"""The Python examples of the READMEs and of the manual (docs/*.md) run as
written, and print what they say. An example that imports torch is skipped,
saying so, where torch is not installed. A block whose first line is
"# sketch: ..." (a GPU-only outline) is parsed, and skipped with that line's
reason, which names the program that runs the real thing."""
import contextlib
import io
import re

import pytest

from conftest import REPO

READMES = [REPO / "python" / "README.md", REPO / "README.md"] + sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "api.md")


def _blocks(path):
    if not path.is_file():
        return []
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


CASES = [(p.relative_to(REPO).as_posix(), i, b) for p in READMES for i, b in enumerate(_blocks(p))]


def test_the_readmes_and_the_python_page_have_python_examples():
    assert {"python/README.md", "README.md", "docs/python.md"} <= {c[0] for c in CASES}


@pytest.mark.parametrize("where,index,code", CASES, ids=["%s#%d" % (c[0], c[1]) for c in CASES])
def test_readme_python_example_runs_and_prints_what_it_says(where, index, code):
    sketch = re.match(r"# sketch: (.*)", code)
    if sketch:   # a GPU-only outline: it must still parse; the runnable version is named in its first line
        compile(code, "%s[python block %d]" % (where, index), "exec")
        pytest.skip("a sketch, parsed but not run here: " + sketch.group(1))
    if re.search(r"^import torch", code, flags=re.M):
        pytest.importorskip("torch", reason="this example uses PyTorch, which is not installed (MSKV_TORCH=1 make test installs it)")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "%s[python block %d]" % (where, index), "exec"), {"__name__": "readme"})
    promised = re.findall(r"# prints: (.*)", code)
    assert out.getvalue().splitlines() == [p.strip() for p in promised]
