"""Hand a policy to AMCT (``amct_pytorch``, shipped with CANN, not on PyPI) when it is installed.

The calls follow AMCT's PyTorch post-training quantization API:

* ``create_quant_config(config_file, model, input_data, skip_layers=None, batch_num=1,
  activation_offset=True, config_defination=None)``; with ``config_defination`` (a simplified
  ``.cfg``) the other three settings are read from the file.
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/amct/atlasamct_16_0085.html
* ``calibration_model = quantize_model(config_file, modfied_onnx_file, record_file, model,
  input_data, input_names=None, output_names=None, dynamic_axes=None)``.
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/amct/atlasamct_16_0087.html
* ``batch_num`` forward passes of the calibration model, then
  ``save_model(modfied_onnx_file, record_file, save_path)``, which writes ``*fake_quant*`` and
  ``*deploy*`` ONNX models (``save_path`` includes the model name prefix).
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/amct/atlasamct_16_0088.html
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import CalibrationError, MissingDependencyError
from opsnn_quant.formats.amct.config import export_amct_cfg
from opsnn_quant.output.files import atomic_write_text
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.types import ForwardLoop

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

_MISSING = (
    "AMCT (amct_pytorch) is not installed: it ships with the CANN toolkit, not PyPI; install "
    "CANN's AMCT package and source its set_env.sh, or use 'opsnn-quant policy export'"
)


@dataclass(frozen=True)
class AmctRun:
    """Files of one AMCT run.

    Attributes:
        simplified_config: the ``.cfg`` exported from the policy.
        config_file: AMCT's JSON config written by ``create_quant_config``.
        modified_onnx: the fused ONNX model of ``quantize_model``.
        record_file: the quantization factor record.
        save_prefix: ``save_path`` given to ``save_model``.
        outputs: files ``save_model`` wrote (``*deploy*`` / ``*fake_quant*``), if found.
        batches: calibration forward passes counted.
        notes: what the simplified config could not express.
    """

    simplified_config: Path
    config_file: Path
    modified_onnx: Path
    record_file: Path
    save_prefix: Path
    outputs: tuple[Path, ...] = ()
    batches: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)


def import_amct() -> Any:
    """CANN's ``amct_pytorch`` (call before any work: AMCT ships with CANN and may be absent).

    Raises:
        MissingDependencyError: AMCT is not installed.
    """
    try:
        return importlib.import_module("amct_pytorch")
    except ImportError as exc:
        raise MissingDependencyError(_MISSING) from exc


def run_amct(
    model: nn.Module,
    policy: PrecisionPolicy,
    input_data: Sequence[Any],
    out_dir: str | Path,
    *,
    forward_loop: ForwardLoop,
    batch_num: int = 1,
    use_simplified_config: bool = True,
    name: str = "model",
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    dynamic_axes: Mapping[str, Any] | None = None,
) -> AmctRun:
    """Quantize ``model`` with AMCT as ``policy`` says and save the deploy model for ATC.

    Args:
        model: the float model (fp32), weights loaded.
        policy: the precision policy; its static W8A8 Linear/Conv2d modules are quantized,
            every other quantizable layer is skipped.
        input_data: example inputs (a tuple), used by AMCT to trace the graph.
        out_dir: directory for AMCT's files.
        forward_loop: runs the calibration model over ``batch_num`` batches of data.
        batch_num: calibration batches (AMCT computes the factors after this many passes).
        use_simplified_config: pass the exported ``.cfg`` as ``config_defination`` (keeps
            per-layer deviations); else pass ``skip_layers``/``batch_num``/``activation_offset``.
        name: model name prefix of the saved files.
        input_names, output_names, dynamic_axes: passed to ``quantize_model``.

    Raises:
        MissingDependencyError: amct_pytorch is not importable.
        ConfigError: the policy does not fit the model or its target.
        CalibrationError: the forward loop ran fewer than ``batch_num`` passes.
    """
    amct = import_amct()
    # rules match, target can run it: fail before AMCT traces anything
    resolved = policy.resolved_for(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    exported = export_amct_cfg(resolved, batch_num=batch_num)
    cfg_path = atomic_write_text(out / "amct.cfg", exported.text)
    config_file = out / "config.json"
    data = tuple(input_data)
    if use_simplified_config:
        amct.create_quant_config(
            config_file=str(config_file), model=model, input_data=data,
            config_defination=str(cfg_path),
        )  # fmt: skip
    else:
        skip, offset = _skip_and_offset(exported.text)
        amct.create_quant_config(
            config_file=str(config_file), model=model, input_data=data,
            skip_layers=skip, batch_num=batch_num, activation_offset=offset,
        )  # fmt: skip
    modified = out / "modified_model.onnx"
    record = out / "scale_offset_record.txt"
    calib_model = amct.quantize_model(
        str(config_file), str(modified), str(record), model, data,
        input_names=input_names, output_names=output_names,
        dynamic_axes=dict(dynamic_axes) if dynamic_axes is not None else None,
    )  # fmt: skip
    batches = _calibrate(calib_model, forward_loop)
    if batches < batch_num:
        raise CalibrationError(
            f"AMCT needs {batch_num} calibration batches before save_model; the forward loop "
            f"ran {batches}"
        )
    prefix = out / name
    amct.save_model(str(modified), str(record), str(prefix))
    outputs = tuple(
        sorted(p for p in out.glob(f"{name}*") if "deploy" in p.name or "fake_quant" in p.name)
    )
    log.info("AMCT wrote %s", ", ".join(p.name for p in outputs) or "no files under the prefix")
    return AmctRun(
        cfg_path, config_file, modified, record, prefix, outputs, batches, exported.notes
    )


def _calibrate(calib_model: Any, forward_loop: ForwardLoop) -> int:
    """Run the forward loop on AMCT's calibration model, counting top-level forward calls."""
    import torch

    calls = 0

    def count(*_: object) -> None:
        nonlocal calls
        calls += 1

    handle = (
        calib_model.register_forward_pre_hook(count)
        if hasattr(calib_model, "register_forward_pre_hook")
        else None
    )
    try:
        with torch.no_grad():
            forward_loop(calib_model)
    finally:
        if handle is not None:
            handle.remove()
    return calls


def _skip_and_offset(cfg_text: str) -> tuple[list[str], bool]:
    """skip_layers and activation_offset back from the exported ``.cfg`` text."""
    skip, offset = [], False
    for line in cfg_text.splitlines():
        key, _, value = (x.strip() for x in line.partition(":"))
        if key == "skip_layers":
            skip.append(value.strip('"').replace('\\"', '"').replace("\\\\", "\\"))
        elif key == "activation_offset":
            offset = value == "true"
    return skip, offset
