"""Every Python snippet of README.md and docs/*.md runs as written (in a scratch directory: its
outputs are relative paths)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [
    (page.relative_to(ROOT).as_posix(), code)
    for page in PAGES
    for code in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
]


def test_the_readme_has_python_snippets():
    assert any(page == "README.md" for page, _ in SNIPPETS), "README.md lost its Python example"


def test_the_readme_links_only_to_files_that_exist():
    # the README is a front door to docs/: a link that leads nowhere is a broken door
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def _headings(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings (lower case, punctuation dropped, spaces to
    hyphens), outside code blocks."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    titles = re.findall(r"^#+\s+(.*?)\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", t.lower()).replace(" ", "-") for t in titles}


def test_the_docs_link_only_to_headings_that_exist():
    # a link to a section (page.md#section) that was renamed or moved lands at the page's top
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#:]*)#([^)]+)\)", text):
            linked = page.parent / target if target else page
            assert anchor in _headings(linked), f"{page.name} links to missing {target}#{anchor}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "index", range(len(SNIPPETS)), ids=[f"{p}-{i}" for i, (p, _) in enumerate(SNIPPETS)]
)
def test_a_readme_snippet_runs_as_written(index, tmp_path):
    # a fresh interpreter, as a reader pasting it would run it (set_reproducible first)
    page, code = SNIPPETS[index]
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, f"{page}: {done.stderr[-3000:]}"
    if "out/report" in code:
        assert (tmp_path / "out" / "report" / "report.html").is_file()
        assert done.stdout.strip().splitlines()[-1] in ("PASS", "FAIL", "INCONCLUSIVE")
