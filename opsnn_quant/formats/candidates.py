"""A directory a user passes, loaded as an evaluation candidate in the dtype its engine runs.

What the directory is, is :func:`opsnn_quant.formats.registry.recognise`'s answer (a format of
the table, or a model source); this module loads it (:func:`load_candidate`) and holds the dtype
rule of the engines (:func:`run_dtype`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.formats.base import Format, run_dtype

if TYPE_CHECKING:
    import torch

    from opsnn_quant.models.base import ModelAdapter
    from opsnn_quant.probe.report import SensitivityReport

__all__ = ["cast_adapter", "load_candidate", "run_dtype"]


def load_candidate(
    out_dir: Path,
    family: str | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    baseline: str | None = None,
    allow_pickle: bool = False,
    fmt: Format | None = None,
    settings: dict[str, Any] | None = None,
) -> tuple[ModelAdapter, SensitivityReport | None]:
    """The candidate at ``out_dir``, whatever it is
    (:func:`~opsnn_quant.formats.registry.recognise`), in the dtype its engine runs
    (:meth:`~opsnn_quant.formats.base.Format.run_dtype`); an engine directory is loaded into the
    float ``baseline`` (default: the source our export recorded). ``allow_pickle``: the float
    model may have pickle weights only (see :func:`~opsnn_quant.models.load_adapter`).

    ``fmt``: what ``out_dir`` is, when the caller recognised it already. ``settings``: the
    family's settings it runs with (e.g. a suite's decoding length), checked against the
    model's config files as it loads; left out, a calibrate output's own (its ``recipe.yaml``),
    else the family's defaults.

    Raises:
        ConfigError: an engine directory without a known float model (pass ``baseline``).
        AscendV1Error: an AscendV1 directory that breaks the format's contract.
        ModelLoadError: a float model that cannot be loaded (pickle-only weights without
            ``allow_pickle`` included).
    """
    from opsnn_quant.formats.registry import recognise

    fmt = fmt or recognise(out_dir)  # a command passes what it recognised once
    placement = {"device": device, "dtype": fmt.run_dtype(out_dir, dtype),
                 "allow_pickle": allow_pickle, **(settings or {})}  # fmt: skip
    return fmt.load_candidate(out_dir, family, baseline, placement)


def cast_adapter(adapter: ModelAdapter, dtype: torch.dtype) -> None:
    """Run the adapter's float modules in ``dtype`` (int8 buffers of quantized modules stay)."""
    from opsnn_quant.quant.modules import is_quant_module

    for module in adapter.model.modules():
        if is_quant_module(module):
            continue
        for _name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_floating_point():
                module._buffers[name] = b.to(dtype)
