"""The model exports of a calibrate output: ``export/ascendv1/`` and ``export/atc/``.

Shared by ``calibrate`` (its export phase) and ``opsnn-quant export-weights``. Each directory is
written atomically; its notes (modules not exported in their quantized form, graphs that could
not be exported) go to ``export/<name>.notes.txt`` and are returned.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from torch import nn

from opsnn_quant.deploy.atc import write_atc
from opsnn_quant.deploy.exporter import export_ascendv1
from opsnn_quant.deploy.smooth_fold import Call
from opsnn_quant.io import atomic_dir, atomic_write_text
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.policy.schema import PrecisionPolicy

log = logging.getLogger(__name__)
MIXLIST = "atc_modify_mixlist.json"


def _mixlist(export_dir: Path) -> str | None:
    """``../atc_modify_mixlist.json`` when the policy export wrote one that adds OpTypes."""
    path = export_dir / MIXLIST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    adds = doc.get("black-list", {}).get("to-add", []) if isinstance(doc, dict) else []
    return f"../{MIXLIST}" if adds else None


def write_model_exports(
    adapter: ModelAdapter,
    policy: PrecisionPolicy,
    modules: Mapping[str, str],
    calls: Mapping[str, Sequence[Call]],
    export_dir: Path,
    wanted: Sequence[str],
    *,
    float_model: nn.Module | None = None,
    force: bool = False,
    say: Callable[[str], None] = log.info,
) -> list[str]:
    """Write the ``wanted`` model exports (``ascendv1``, ``atc``) into ``export_dir``.

    Args:
        adapter: the adapter holding the quantized model.
        policy: its policy (target, fp32 pins).
        modules: the module inventory.
        calls: recorded calls per root (SmoothQuant folding, ONNX shapes).
        export_dir: the ``export/`` directory.
        wanted: which exports.
        float_model: the float model (ATC's float graphs); None: only QDQ graphs.
        force: replace existing directories that are not ours.
        say: progress callback.

    Returns:
        The notes, each prefixed by its export's name.
    """
    notes: list[str] = []
    if "ascendv1" in wanted:
        say("exporting AscendV1 weights (MindIE / vLLM-Ascend / SGLang)")
        result = export_ascendv1(adapter, export_dir / "ascendv1", calls=calls, force=force)
        notes += _write_notes(export_dir, "ascendv1", result.notes)
    if "atc" in wanted:
        with atomic_dir(export_dir / "atc", "atc", force=force) as tmp:
            atc_notes = write_atc(
                adapter.model, float_model, list(adapter.roots()), calls, policy, modules, tmp,
                mixlist=_mixlist(export_dir), say=say,
            )  # fmt: skip
        notes += _write_notes(export_dir, "atc", atc_notes)
    return notes


def _write_notes(export_dir: Path, name: str, lines: list[str]) -> list[str]:
    path = export_dir / f"{name}.notes.txt"
    if lines:
        atomic_write_text(path, "\n".join(lines) + "\n")
    elif path.exists():
        path.unlink()
    for line in lines:
        log.info("%s: %s", name, line)
    return [f"{name}: {line}" for line in lines]
