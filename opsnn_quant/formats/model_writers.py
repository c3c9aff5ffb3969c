"""What a model export's writer takes and returns: the interface of the format table's
``model`` entries (:mod:`opsnn_quant.formats.registry`).

Each format's writer lives in its own folder (``formats/<format>/model_export.py`` for the
built-in ones) and is named by its :class:`~opsnn_quant.formats.base.Format`'s ``handler``:
``(ModelExportContext, directory) -> ExportOutcome``, writing into the new or empty directory it
is given. The commands run them (:func:`opsnn_quant.pipeline.model_exports.write_model_exports`),
each into its own output directory, which they own, and hand each what its format declares it
reads (:attr:`~opsnn_quant.formats.base.Format.root_calls`,
:attr:`~opsnn_quant.formats.base.Format.float_model`, :meth:`~opsnn_quant.formats.base.Format.stage`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.policy.schema import ResolvedPolicy
from opsnn_quant.recording import Call


@dataclass(frozen=True)
class ExportOutcome:
    """What a model export's handler returns: its notes and the modules it wrote in int8
    (full names: what deploys quantized, whatever the policy asked)."""

    notes: list[str]
    int8: list[str]


@dataclass(frozen=True)
class ModelExportContext:
    """What a model export's writer (``(ctx, directory) -> ExportOutcome``, the format table's
    ``model`` kind) takes.

    Attributes:
        adapter: the adapter holding the quantized model.
        policy: its resolved policy (target, fp32 pins, module inventory).
        calls: recorded calls per root (empty unless the format reads them:
            :meth:`~opsnn_quant.formats.base.Format.needs_root_calls`).
        export_dir: the ``export/`` directory the format's own directory is in.
        float_model: the float model (None unless the format reads it and it was loaded:
            ``export-weights``).
        staged: what the format's :meth:`~opsnn_quant.formats.base.Format.stage` made from the
            float model before it was quantized (``calibrate``; None otherwise).
        say: progress callback.
    """

    adapter: ModelAdapter
    policy: ResolvedPolicy
    calls: Mapping[str, Sequence[Call]]
    export_dir: Path
    float_model: nn.Module | None
    staged: Any
    say: Callable[[str], None]


def full_name(component: str, name: str) -> str:
    """``name`` of a module in ``component`` as a name in the whole model."""
    return f"{component}.{name}" if component else name
