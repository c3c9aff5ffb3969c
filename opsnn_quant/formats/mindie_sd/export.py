"""``export/mindie-sd/``: the quantized Linears of each component as ``mindiesd.quantize`` loads them.

One directory per model component holding an int8 Linear (``transformer/``, ``unet/``,
``text_encoder/`` of a diffusers pipeline; the directory itself for a single model), each with
``quant_model_description_<type>.json`` and ``quant_model_weight_<type>.safetensors``, as
msModelSlim's ``mindie_format_saver`` names them (``save/mindie_format.py`` ``post_run`` at
3de0a3c). The user's call, for each component::

    mindiesd.quantize(pipe.transformer, "<OUT>/export/mindie-sd/transformer/"
                      "quant_model_description_w8a8.json")

Loader rules followed (``mindiesd`` 3.1.0 ``mindiesd/quantization/quantize.py``,
``get_cfg_and_weights`` lines 247-291; ``utils/file_utils.py`` lines 115-146, unchanged since
3066189):

* the weight file is ``quant_model_weight_{model_quant_type.lower()}.safetensors`` beside the
  description, one file (no shards); ``model_quant_type`` an exact ``QuantAlgorithm`` value;
* no ``_<digits>`` ending of the description's name (that asks for a distributed rank);
* both files no more permissive than 0o640 (``check_max_permission``): written 0o640
  (msModelSlim's saver leaves the safetensors at the umask's 0o644, which MindIE-SD refuses);
* names relative to the component passed to ``mindiesd.quantize`` (its ``named_modules()``);
  only ``nn.Linear`` is replaced, a layer whose keys say ``FLOAT`` is left as loaded.

Tensors per Linear ``p`` (``mindie_format.py`` ``on_w8a8_static``, ``on_w8a8_dynamic_per_channel``;
``layer.py`` ``W8A8QuantLinear``, ``WeightQuantLinear``): W8A8: ``weight`` int8 [N, K],
``quant_bias`` int32 [N], ``input_scale``/``input_offset`` float32 [1], ``deq_scale`` float32 [N]
(the saver writes float32 whatever the dtype; MindIE-SD passes it to ``npu_quant_matmul`` as is);
W8A8_DYNAMIC / W8A16: ``weight``, ``weight_scale`` and zero ``weight_offset`` float32 [N, 1]; and
``bias`` float32 [N] tagged ``FLOAT`` where the float Linear has one (MindIE-SD reads it then). A
SmoothQuant-smoothed Linear is written in the non-fusion form (``on_non_fusion_smooth_quant_
wrapper``): ``p.div.mul_scale`` = 1 / s in the engine dtype, tagged ``FLOAT``, and the Linear's
tensors under ``p.linear.*``. Every other parameter of the component is written too, tagged
``FLOAT`` (the saver's ``on_float_module``); MindIE-SD never loads those.

A module made for MindIE-SD's arithmetic (its spec's engine the table's
:data:`~opsnn_quant.quant.engines.MINDIE_SD`) computes exactly what MindIE-SD computes on these
files. One made for this package's own (a Linear of a model
calibrated for another target) is written with the same tensors; MindIE-SD then rounds its
``input_scale`` and ``mul_scale`` to the engine dtype, which the notes say.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from opsnn_quant.core.timesteps import group_of
from opsnn_quant.folding.fold_check import dequantized_weight, effective_bias
from opsnn_quant.formats.safetensors_io import LazyTensor, Tensorish, write_safetensors
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.models.offload import BlockOffload, offload_of
from opsnn_quant.output.files import empty_dir
from opsnn_quant.quant.engine import TORCH_DTYPES, mul_scale_of
from opsnn_quant.quant.engines import MINDIE_SD
from opsnn_quant.quant.modules import QuantLinear, QuantModule
from opsnn_quant.types import Precision

OUTPUT_KIND = "mindie-sd"
PERMISSION = 0o640  # mindiesd/utils/file_utils.py: CONFIG_FILE_PERMISSION, MODELDATA_...
# QuantAlgorithm values this writer uses, and the tie order of model_quant_type
TYPES = {Precision.W8A8: "W8A8", Precision.W8A8_DYNAMIC: "W8A8_DYNAMIC", Precision.W8A16: "W8A16"}
TIMESTEP = "W8A8_TIMESTEP"  # static scales per denoising step (W8A8TimeStepQuantLinear)


def description_name(model_quant_type: str) -> str:
    """``quant_model_description_<type>.json`` (``mindie_format.py`` ``post_run``)."""
    return f"quant_model_description_{model_quant_type.lower()}.json"


def weight_name(model_quant_type: str) -> str:
    """``quant_model_weight_<type>.safetensors``, the name MindIE-SD derives from
    ``model_quant_type`` (``quantize.py`` line 232)."""
    return f"quant_model_weight_{model_quant_type.lower()}.safetensors"


@dataclass
class ComponentFiles:
    """One component's MindIE-SD files.

    Attributes:
        tensors: tensor name -> tensor, in the description's order (a model whose blocks are
            offloaded: their tensors are :class:`~opsnn_quant.formats.safetensors_io.LazyTensor`
            read again from the block's file when written).
        description: tensor name -> type, ``model_quant_type`` last.
        exported_float: quantized module -> why it is written FLOAT.
        int8: the quantized Linears written in int8 (component-relative names).
        other_arithmetic: int8 Linears made for another engine's arithmetic.
        off: the model's offloader (None: all in memory).
    """

    tensors: dict[str, Tensorish] = field(default_factory=dict)
    description: dict[str, str] = field(default_factory=dict)
    exported_float: dict[str, str] = field(default_factory=dict)
    int8: list[str] = field(default_factory=list)
    other_arithmetic: list[str] = field(default_factory=list)
    off: BlockOffload | None = field(default=None, repr=False, compare=False)

    def add(self, name: str, kind: str, tensor: Tensorish) -> None:
        """One tensor and its description entry (a view of an offloaded block's tensor:
        read again from the block's file when written)."""
        make = (
            self.off.deferred(tensor)
            if self.off is not None and isinstance(tensor, torch.Tensor)
            else None
        )
        if make is not None:
            self.tensors[name] = LazyTensor(tensor.dtype, tuple(tensor.shape), make)
        elif isinstance(tensor, torch.Tensor):
            self.tensors[name] = tensor.detach().cpu().contiguous()
        else:
            self.tensors[name] = tensor
        self.description[name] = kind


@dataclass
class MindieSdExport:
    """What :func:`export_mindie_sd` wrote: component -> its files, and the notes."""

    path: Path
    components: dict[str, ComponentFiles] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def component_files(
    component: nn.Module,
    dtype: torch.dtype,
    steps: int | None = None,
    *,
    off: BlockOffload | None = None,
    prefix: str = "",
) -> ComponentFiles:
    """The MindIE-SD tensors and description of one component (names relative to it).

    Args:
        component: a module holding frozen quantized modules.
        dtype: the engine dtype (``mul_scale`` is written in it; MindIE-SD's default bfloat16).
        steps: the denoising steps a per-step module's table has a row for (None: such a
            module is written FLOAT).
        off: the model's offloader (``--max-memory``): each block is opened in turn, and
            what is taken from its tensors is read again from its file when written.
        prefix: the component's name in the offloaded model, with its dot ("" for the model).
    """
    out = ComponentFiles(off=off)
    quantized = {n: m for n, m in component.named_modules() if isinstance(m, QuantModule)}
    with off.window() if off is not None else contextlib.nullcontext():
        for name, module in quantized.items():
            why = _float_reason(module, steps)
            if off is not None:
                off.touch(prefix + name)
            if why is None:
                _add_linear(out, name, module, dtype, steps)
            else:
                out.exported_float[name] = why
        inside = tuple(f"{q}." for q in quantized)
        for name, param in component.named_parameters():
            if name.startswith(inside):
                continue
            # every float parameter, as on_float_module writes it
            if off is not None and off.owner(prefix + name) is not None:
                full = prefix + name
                out.add(name, "FLOAT", LazyTensor(param.dtype, tuple(param.shape),
                                                  partial(_stored, off, full)))  # fmt: skip
            else:
                out.add(name, "FLOAT", param)
        for name in out.exported_float:  # their float equivalents, tagged FLOAT
            module = quantized[name]
            if off is not None:
                off.touch(prefix + name)
            weight = dequantized_weight(module).to(dtype)
            if off is not None and off.owner(prefix + name) is not None:
                make = partial(_dequantized, off, prefix + name, module, dtype)
                out.add(f"{name}.weight", "FLOAT", LazyTensor(dtype, tuple(weight.shape), make))
            else:
                out.add(f"{name}.weight", "FLOAT", weight)
            del weight
            bias = effective_bias(module)
            if bias is not None:
                out.add(f"{name}.bias", "FLOAT", bias.to(dtype))
    out.description["model_quant_type"] = model_quant_type(out)
    return out


def _stored(off: BlockOffload, name: str) -> torch.Tensor:
    return off.stored(name).cpu().contiguous()


def _dequantized(
    off: BlockOffload, name: str, module: QuantModule[Any], dtype: torch.dtype
) -> torch.Tensor:
    with off.opened(name):
        return dequantized_weight(module).to(dtype).cpu().contiguous()


def model_quant_type(files: ComponentFiles) -> str:
    """The most frequent int8 type of the component's Linears (ties: W8A8, W8A8_DYNAMIC,
    W8A16). msModelSlim's saver keeps the last handler's; MindIE-SD uses it for the weight file's
    name only and replaces each Linear by its own type."""
    counts = Counter(
        v for k, v in files.description.items() if v != "FLOAT" and k.endswith(".weight")
    )
    order = [*TYPES.values(), TIMESTEP]
    return max(order, key=lambda t: (counts[t], -order.index(t)))


def _float_reason(module: QuantModule[Any], steps: int | None) -> str | None:
    spec = module.spec
    if type(module) is not QuantLinear:
        return "MindIE-SD quantizes nn.Linear only"
    if spec.precision not in TYPES:
        return f"{spec.precision.value}: MindIE-SD's WeightQuantLinear takes per-channel scales"
    if spec.timestep_bounds and spec.smoothquant:
        # W8A8TimeStepQuantLinear does multiply by mul_scale (mindiesd 3.1.0 layer.py 422-423,
        # 440-441), and the reader follows it; the calibration side does not make the pair yet
        return "per-step scales on smoothed inputs: not exported for MindIE-SD yet"
    if spec.timestep_bounds and not steps:
        return "per-step scales: the number of denoising steps (rows of the table) is unknown"
    return None


def _add_linear(
    out: ComponentFiles, name: str, module: QuantModule[Any], dtype: torch.dtype, steps: int | None
) -> None:
    spec, iq = module.spec, module.input_quantizer
    qtype = TIMESTEP if spec.timestep_bounds else TYPES[spec.precision]
    n = module.out_n
    prefix = name
    smooth = getattr(iq, "smooth", None)
    if smooth is not None:  # the non-fusion form: x * (1 / s) before the quantized Linear
        mul = getattr(iq, "mul_scale", None)
        if mul is None:  # made for our arithmetic: the engine rounds 1 / s to its dtype
            mul = mul_scale_of(smooth, dtype)[0]
        out.add(f"{name}.div.mul_scale", "FLOAT", mul.to(dtype))
        prefix = f"{name}.linear"
    if spec.engine_def is not MINDIE_SD:
        out.other_arithmetic.append(name)
    out.add(f"{prefix}.weight", qtype, module.weight.reshape(n, -1))
    if spec.timestep_bounds:
        assert steps is not None  # _float_reason
        _add_step_table(out, prefix, module, steps)
    elif spec.static_activations:
        out.add(f"{prefix}.quant_bias", qtype, module.quant_bias)
        out.add(f"{prefix}.input_scale", qtype, iq.scale.reshape(1).to(torch.float32))
        out.add(f"{prefix}.input_offset", qtype, iq.offset.reshape(1).to(torch.float32))
        out.add(f"{prefix}.deq_scale", qtype, module.deq_scale.to(torch.float32))
    else:
        scale = module.weight_quantizer.scale.to(torch.float32).reshape(n, 1)
        out.add(f"{prefix}.weight_scale", qtype, scale)
        out.add(f"{prefix}.weight_offset", qtype, torch.zeros_like(scale))
    bias = effective_bias(module)
    if bias is not None and module.float_had_bias:
        out.add(f"{prefix}.bias", "FLOAT", bias)
    out.int8.append(name)


def _add_step_table(out: ComponentFiles, prefix: str, module: QuantModule[Any], steps: int) -> None:
    """W8A8_TIMESTEP's tensors (msModelSlim's legacy ``complex_quantifier.py`` lines 408-447;
    MindIE-SD ``W8A8TimeStepQuantLinear``, ``layer.py`` lines 224-271): one row per step (the
    row of its group of steps), ``input_scale``/``input_offset`` [T, 1], ``deq_scale`` and
    ``quant_bias`` [T, N], and the per-channel ``weight_scale`` its dynamic branch reads."""
    iq = module.input_quantizer
    bounds = module.spec.timestep_bounds or (0,)
    rows = torch.tensor([group_of(t, bounds) for t in range(steps)], dtype=torch.long)
    out.add(f"{prefix}.quant_bias", TIMESTEP, module.quant_bias[rows])
    out.add(f"{prefix}.input_scale", TIMESTEP, iq.scale[rows].reshape(-1, 1).to(torch.float32))
    out.add(f"{prefix}.input_offset", TIMESTEP, iq.offset[rows].reshape(-1, 1).to(torch.float32))
    out.add(f"{prefix}.deq_scale", TIMESTEP, module.deq_scale[rows].to(torch.float32))
    scale = module.weight_quantizer.scale.to(torch.float32).reshape(module.out_n, 1)
    out.add(f"{prefix}.weight_scale", TIMESTEP, scale)
    out.add(f"{prefix}.weight_offset", TIMESTEP, torch.zeros_like(scale))


def _components(adapter: ModelAdapter) -> dict[str, nn.Module]:
    """Component name -> module: a diffusers pipeline's components, or the model itself."""
    from opsnn_quant.sources import model_path

    source = model_path(adapter.model_id)
    model = adapter.model
    if not (source / "model_index.json").is_file():
        return {"": model}
    return {n: m for n, m in model.named_children() if (source / n).is_dir()}


def export_mindie_sd(adapter: ModelAdapter, out: str | Path) -> MindieSdExport:
    """Write every component holding an int8 Linear into ``out``, as MindIE-SD loads it.

    Args:
        adapter: an adapter whose model holds frozen quantized modules.
        out: a new or empty directory (see :func:`~opsnn_quant.output.files.empty_dir`).

    Returns:
        The :class:`MindieSdExport`; the same model gives the same bytes.
    """
    result = MindieSdExport(Path(out))
    steps = getattr(getattr(adapter, "settings", None), "steps", None)
    off = offload_of(adapter.model)
    tmp = empty_dir(out)
    for cname, component in _components(adapter).items():
        dtype = _engine_dtype(component)
        prefix = f"{cname}." if cname else ""
        files = component_files(component, dtype, steps, off=off, prefix=prefix)
        if not files.int8:
            result.notes += _notes(cname, files)
            continue
        _write(files, tmp / cname if cname else tmp)
        result.components[cname] = files
        result.notes += _notes(cname, files)
    return result


def _engine_dtype(component: nn.Module) -> torch.dtype:
    """The engine dtype the component's MindIE-SD modules were made for (bfloat16, MindIE-SD's
    default, when none was)."""
    dtypes = Counter(
        m.spec.output_dtype
        for m in component.modules()
        if isinstance(m, QuantModule) and m.spec.engine_def is MINDIE_SD
    )
    return TORCH_DTYPES[dtypes.most_common(1)[0][0]] if dtypes else torch.bfloat16


def _write(files: ComponentFiles, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    qtype = files.description["model_quant_type"]
    weights = directory / weight_name(qtype)
    write_safetensors(files.tensors, weights)
    desc = directory / description_name(qtype)
    # json.dump(indent=4), insertion order, no trailing newline: as the saver's JsonWriter
    desc.write_text(json.dumps(files.description, indent=4), encoding="utf-8")
    for path in (weights, desc):
        os.chmod(path, PERMISSION)


def _notes(cname: str, files: ComponentFiles) -> list[str]:
    where = cname or "model"
    full = (lambda n: f"{cname}.{n}") if cname else (lambda n: n)
    notes = []
    by_reason: dict[str, list[str]] = {}
    for name, why in files.exported_float.items():
        by_reason.setdefault(why, []).append(full(name))
    for why, names in by_reason.items():
        shown = ", ".join(names[:3]) + (f", +{len(names) - 3}" if len(names) > 3 else "")
        notes.append(f"{len(names)} quantized module(s) written FLOAT ({shown}): {why}")
    if files.other_arithmetic:
        notes.append(
            f"{where}: {len(files.other_arithmetic)} int8 Linear(s) were calibrated for another "
            "target's arithmetic; MindIE-SD rounds their input_scale and mul_scale to its dtype "
            "(calibrate for ascend910b-mindie-sd to compute exactly what it computes)"
        )
    if not files.int8:
        notes.append(f"{where}: no int8 Linear; nothing written")
    return notes


def quantized_share(files: Mapping[str, ComponentFiles]) -> dict[str, list[str]]:
    """Component -> its Linears written in int8 (full names), for the deployed MAC share."""
    return {c: [f"{c}.{n}" if c else n for n in f.int8] for c, f in files.items()}
