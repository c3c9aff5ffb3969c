"""What the pipeline tests share: one calibrate run of a tiny SD pipeline, and how two runs'
files are compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from opsnn_quant.cli import main
from opsnn_quant.output.ownership import MARKER
from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe

# Files whose bytes differ between any two runs: the wall-clock times and the run's own token.
PER_RUN = {"timings.json", MARKER}


def run_files(root: Path) -> dict[str, bytes]:
    """Every file's bytes under ``root`` (by relative path) but :data:`PER_RUN`'s."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in PER_RUN
    }


@pytest.fixture(scope="session")
def tiny_sd_calibrated(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(root, recipe, out)``: a tiny SD pipeline in ``root/pipe``, its recipe (two prompts,
    target ascend910b-atc, ``search: full``: the whole probe, estimators included) and a
    finished ``calibrate`` of it in ``out`` (read only)."""
    root = tmp_path_factory.mktemp("tiny-sd-calibrated")
    save_tiny_sd(root / "pipe")
    recipe = tiny_sd_recipe(root, "tiny", extra="search: full\n")  # the estimators' path
    out = root / "out"
    assert main(["calibrate", str(recipe), "-o", str(out), "--quiet"]) == 0
    return root, recipe, out


@pytest.fixture(scope="session")
def tiny_whisper_calibrated(tmp_path_factory) -> tuple[Path, Path]:
    """``(model, out)``: a random Whisper of 16 decoder positions (the family's default
    max_new_tokens, 64, does not fit it) calibrated with ``--set max_new_tokens=8`` for
    ascend910b-vllm-ascend, the search's whole probe (read only)."""
    from tests.tiny_pipelines import save_tiny_whisper

    root = tmp_path_factory.mktemp("tiny-whisper-calibrated")
    model = save_tiny_whisper(root / "w")
    out = root / "out"
    argv = ["calibrate", "--model", str(model), "--data", "zoo:speech/eval", "--limit", "2",
            "--set", "max_new_tokens=8", "--set", "batch_size=2", "--target",
            "ascend910b-vllm-ascend", "--strategy", "search", "--search", "full", "-o", str(out),
            "--quiet"]  # fmt: skip
    assert main(argv) == 0
    return model, out


@pytest.fixture
def offloads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``BlockOffload`` the test's runs make (``--max-memory``), in order."""
    from opsnn_quant.models import offload

    made: list[offload.BlockOffload] = []
    init = offload.BlockOffload.__init__

    def record(self: offload.BlockOffload, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(offload.BlockOffload, "__init__", record)
    return made
