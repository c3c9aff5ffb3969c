"""Every Python snippet of README.md runs as written (in a scratch directory: its outputs are
relative paths)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_snippets():
    assert SNIPPETS, "README.md lost its Python example"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_a_readme_snippet_runs_as_written(index, tmp_path):
    # a fresh interpreter, as a reader pasting it would run it (set_reproducible first)
    script = tmp_path / "snippet.py"
    script.write_text(SNIPPETS[index], encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    if "out/report" in SNIPPETS[index]:
        assert (tmp_path / "out" / "report" / "report.html").is_file()
        assert done.stdout.strip().splitlines()[-1] in ("PASS", "FAIL", "INCONCLUSIVE")
