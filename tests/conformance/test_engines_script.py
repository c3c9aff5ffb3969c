"""engines.sh names no package index: what it fetches is pinned by file name and sha256 and
located through pip's own index configuration (the brief: never write a registry's host name
into the repository)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The hosts of the public Python package index and its file store, built from parts so that
# this test file itself does not hold them.
HOSTS = (".".join(("pypi", "org")), ".".join(("files", "pythonhosted", "org")))


def _tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    return [REPO / n.decode() for n in names if n]


def test_no_tracked_file_names_a_package_registry_host():
    found = []
    for path in _tracked():
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", "replace").lower()
        found += [f"{path.relative_to(REPO)}: {h}" for h in HOSTS if h in text]
    assert found == []


def test_engines_script_locates_its_files_through_pips_indexes():
    script = (REPO / "tests/conformance/engines.sh").read_text(encoding="utf-8")
    # the two pinned downloads name their project (looked up on pip's indexes), never an address
    assert 'fetch "$VLLM_WHEEL" vllm "$VLLM_SHA256"' in script
    assert 'fetch "$ASCEND_SDIST" vllm-ascend "$ASCEND_SHA256"' in script
    assert "https://" not in script and "http://" not in script
    assert 'pip", "config", "list"' in script.replace("'", '"')
