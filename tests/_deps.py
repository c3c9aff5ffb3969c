"""Marks for tests that need a system tool `.ci/run` installs (Debian's espeak-ng): skipped on a
machine without it, never in CI (CI=true), where a missing tool is a failure."""

from __future__ import annotations

import os
import shutil

import pytest

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None and not os.environ.get("CI"),
    reason="espeak-ng is not installed (apt-get install espeak-ng); the generated speech splits "
    "need it",
)
