# The README's "From Python" example runs as written.
import contextlib
import io
import re

from conftest import ROOT


def test_readme_example_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## From Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) == 5
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    first, second = out.getvalue().splitlines()
    assert first.split()[0] in ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "hsdp")
    assert "reshard_after_forward" in second
