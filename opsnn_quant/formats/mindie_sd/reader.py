"""Load a MindIE-SD quantized component as ``mindiesd.quantize`` does, and run its Linears.

Written from MindIE-SD's source (``mindiesd`` 3.1.0 from PyPI; first written at ``Ascend/
MindIE-SD`` 3066189), without importing it (it imports torch_npu at module level):

* files (``quantize.py`` ``get_cfg_and_weights`` lines 247-291, ``utils.py``
  ``replace_rank_suffix`` lines 194-218, ``utils/file_utils.py`` lines 39-146): the description may
  have any name, but one ending in ``_<digits>`` asks for a distributed rank; the weight file is
  ``quant_model_weight_{model_quant_type.lower()}.safetensors`` beside it; each file must be a
  regular file, not a symbolic link, owned by the user (or its group, or read by root), no
  more permissive than 0o640, at most 10 GiB (description) / 100 GiB (weights);
  ``model_quant_type`` an exact ``QuantAlgorithm`` value (``mode.py`` lines 226-249);
* layers (``quantize.py`` lines 53-61, 93-95, 147-149, 213-236, 382-421): every ``nn.Linear``
  of the module passed in, by its ``named_modules()`` name ``p``; keys ``p.linear.weight``,
  ``p.weight``, ``p``, ``p.fa_q.scale``, ``p.quant_type`` are looked up in that order; any of
  them ``FLOAT`` leaves the layer as loaded, else the first valid type decides;
  ``p.div.mul_scale`` in the weights moves the other tensors under ``p.linear``;
* tensors and their load-time casts (``layer.py`` lines 182-453): see :class:`MindieSdLinear`.
  Its output is in the engine dtype whatever the input's (lines 347-363);
* the dtype (:func:`engine_dtype`): ``QuantConfig.dtype`` (``config.py`` 120, 138), bfloat16
  by default or float16; a static Linear hands ``deq_scale`` as stored to ``npu_quant_matmul``
  (``layer.py`` 279-280, 347-348; 436-437 for W8A8_TIMESTEP), whose bfloat16 output refuses an
  int64 scale: msModelSlim's files of a float16 or float32 model (its
  ``deqscale2int64_by_dtype`` packs their ``deq_scale`` as int64) run in float16 only;
* which module a description is for (:func:`apply_mindie_sd_dir`): ``quantize(module, desc)``
  is given it, the names are relative to it; msModelSlim writes one component's files flat.

The arithmetic is :mod:`opsnn_quant.ascend.engines` (``mindie_sd_*``, ``weight_only``).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from opsnn_quant.ascend import engines
from opsnn_quant.core.safetensors_header import read_safetensors_header
from opsnn_quant.core.timesteps import current_step
from opsnn_quant.errors import CheckpointError
from opsnn_quant.quant.engines import MINDIE_SD

DESCRIPTION_MAX_BYTES = 10 * 2**30  # file_utils.MAX_FILE_SIZE
WEIGHT_MAX_BYTES = 100 * 2**30  # utils.MAX_WEIGHT_SIZE
MAX_PERMISSION = 0o640  # file_utils CONFIG_FILE_PERMISSION, SAFEOPEN_FILE_PERMISSION
# mode.py QuantAlgorithm values (W4A4_MXFP4's member is W4A4_MXFP4_DYNAMIC; "MIXED_PERCISION" sic)
QUANT_ALGORITHMS = frozenset(
    {"W8A8", "W8A8_TIMESTEP", "W8A8_DYNAMIC", "W4A4_DYNAMIC", "W8A8_MXFP8", "W4A4_MXFP4",
     "W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W8A16_GPTQ", "W4A16_GPTQ", "W8A8_PER_CHANNEL",
     "W8A8_PER_TENSOR", "W8A8_PER_CHANNEL_PER_TOKEN", "W8A8_PER_CHANNEL_PER_TENSOR",
     "W8A8_PER_TENSOR_PER_TOKEN", "INT8", "MIXED_PERCISION", "FP8_DYNAMIC", "NO_QUANT",
     "W4A4_MXFP4_SVD", "W4A4_MXFP4_DUALSCALE"}
)  # fmt: skip
# The algorithms run here: smooth_quantize_w8a8 gives W8A8 and W8A8_PER_* the static
# W8A8QuantLinear, W8A8_DYNAMIC the dynamic one; weight_quantize gives W8A16 WeightQuantLinear.
STATIC = frozenset(
    {"W8A8", "W8A8_PER_CHANNEL", "W8A8_PER_TENSOR", "W8A8_PER_CHANNEL_PER_TOKEN",
     "W8A8_PER_CHANNEL_PER_TENSOR", "W8A8_PER_TENSOR_PER_TOKEN"}
)  # fmt: skip
TIMESTEP = "W8A8_TIMESTEP"
SUPPORTED = STATIC | {"W8A8_DYNAMIC", "W8A16", TIMESTEP}
# The deq_scale dtypes (safetensors names) torch_npu's npu_quant_matmul takes per output dtype,
# without a per-token scale (its documented table for Atlas A2/A3, as the CPU reference checks
# it: opsnn_quant/ascend/_qmm_checks.py _check_combination): bfloat16 output a float32 or
# bfloat16 scale, float16 output an int64 (the packed form) or float32 one.
DEQ_SCALE_DTYPES = {"bfloat16": frozenset({"F32", "BF16"}), "float16": frozenset({"I64", "F32"})}
_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64"}


class MindieSdError(CheckpointError):
    """A component directory MindIE-SD would refuse (one line, naming the file or tensor)."""


def check_file(path: Path, max_bytes: int) -> None:
    """MindIE-SD's checks of one file (``standardize_path``, ``check_file_safety``).

    Raises:
        MindieSdError: a symbolic link, missing, not a regular file, too large, owned by
            another user and group, or more permissive than 0o640.
    """
    if path.is_symlink():
        raise MindieSdError(f"{path}: a symbolic link (MindIE-SD refuses links)")
    if not path.exists():
        raise MindieSdError(f"{path}: not found")
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise MindieSdError(f"{path}: not a regular file")
    if st.st_size > max_bytes:
        raise MindieSdError(f"{path}: {st.st_size} bytes, over MindIE-SD's {max_bytes}")
    uid = os.geteuid()
    if not (uid == 0 or st.st_uid == uid or st.st_gid == os.getgid()):
        raise MindieSdError(f"{path}: owned by another user and group (check_owner)")
    mode = st.st_mode & 0o777
    if mode | MAX_PERMISSION != MAX_PERMISSION:
        raise MindieSdError(
            f"{path}: mode {oct(mode)} is more permissive than {oct(MAX_PERMISSION)} "
            f"(check_max_permission); chmod {MAX_PERMISSION:o} it"
        )


@dataclass
class MindieSdCheckpoint:
    """A component's description and its weight file, opened as MindIE-SD opens them.

    Attributes:
        description: the description's entries.
        model_quant_type: its ``model_quant_type``.
        weights: the weight file's path.
    """

    description: dict[str, Any]
    model_quant_type: str
    weights: Path

    def __post_init__(self) -> None:
        self._file = safe_open(str(self.weights), framework="pt")
        self.keys = frozenset(self._file.keys())

    def load(self, name: str) -> torch.Tensor:
        """One tensor (``get_quant_weight``: a missing one is a critical error)."""
        if name not in self.keys:
            raise MindieSdError(f"{name}: Critical parameter missing (in {self.weights.name})")
        return self._file.get_tensor(name).clone()  # not a view of the mapped file


def read_mindie_sd(description: str | Path) -> MindieSdCheckpoint:
    """Open a component as ``mindiesd.quantize(module, description)`` does.

    Raises:
        MindieSdError: a file check fails, a rank-suffixed name, a description that is not a
            JSON object, a ``model_quant_type`` missing or not a ``QuantAlgorithm`` value, or a
            weight file whose safetensors header is malformed
            (:func:`~opsnn_quant.core.safetensors_header.read_safetensors_header`).
    """
    path = Path(description)
    if path.stem.rpartition("_")[2].isdigit():
        raise MindieSdError(
            f"{path.name}: a name ending in _<digits> makes MindIE-SD read the files of "
            "torch.distributed's rank instead (and requires it initialized)"
        )
    check_file(path, DESCRIPTION_MAX_BYTES)
    try:
        desc = json.loads(path.read_text(encoding="utf-8"), strict=False)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MindieSdError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(desc, dict) or not desc:
        raise MindieSdError(f"{path}: an empty or non-object description")
    qtype = desc.get("model_quant_type")
    if not isinstance(qtype, str) or qtype not in QUANT_ALGORITHMS:
        raise MindieSdError(
            f"{path}: model_quant_type {qtype!r} is not a MindIE-SD QuantAlgorithm "
            "(exact, upper case: W8A8, W8A8_DYNAMIC, W8A16, ...)"
        )
    weights = path.parent / f"quant_model_weight_{qtype.lower()}.safetensors"
    check_file(weights, WEIGHT_MAX_BYTES)
    # its header checked before safetensors maps the file (a tampered one: one line, not a
    # SafetensorError traceback nor an allocation of the size it claims)
    read_safetensors_header(weights, error=MindieSdError)
    return MindieSdCheckpoint(desc, qtype, weights)


def deq_scale_dtypes(directory: Path) -> dict[str, str]:
    """Every ``deq_scale`` of the components of ``directory`` (the static Linears' and the
    W8A8_TIMESTEP tables'): ``<component>/<tensor>`` -> its safetensors dtype (``I64``, ``F32``...),
    read from the weight files' headers.

    Raises:
        MindieSdError: any check of :func:`read_mindie_sd`.
    """
    found: dict[str, str] = {}
    for component, desc in component_descriptions(directory).items():
        header = read_safetensors_header(read_mindie_sd(desc).weights, error=MindieSdError)
        for name, entry in header.tensors.items():
            if name.endswith(".deq_scale"):
                found[f"{component}/{name}" if component else name] = entry.dtype
    return found


def engine_dtype(directory: Path, dtype: str) -> str:
    """The dtype MindIE-SD runs the files of ``directory`` in when ``dtype`` is asked for.

    ``dtype`` itself when it is one MindIE-SD runs (``QuantConfig.dtype``: bfloat16 or float16)
    and ``npu_quant_matmul`` takes every ``deq_scale`` of the files in it; for another (float32)
    the first of MindIE-SD's dtypes that takes them all: bfloat16 (its default), else float16
    (msModelSlim's static files of a float16 or float32 model: their ``deq_scale`` is int64).

    Raises:
        MindieSdError: ``dtype`` is one MindIE-SD runs but its matmul refuses a ``deq_scale`` of
            the files (the engine fails there too), or no dtype takes them all.
    """
    found = deq_scale_dtypes(directory)
    takes = [d for d in MINDIE_SD.run_dtypes if set(found.values()) <= DEQ_SCALE_DTYPES[d]]
    if dtype in takes or (dtype not in MINDIE_SD.run_dtypes and takes):
        return dtype if dtype in takes else takes[0]
    refused = dtype if dtype in MINDIE_SD.run_dtypes else MINDIE_SD.run_dtypes[0]
    name, kind = next(
        (n, k) for n, k in sorted(found.items()) if k not in DEQ_SCALE_DTYPES[refused]
    )
    fix = (
        f"; it runs in {takes[0]} (--dtype {takes[0]})"
        if takes
        else (f"; no dtype takes them all (deq_scale dtypes {sorted(set(found.values()))})")
    )
    raise MindieSdError(
        f"{name}: {_DTYPE_NAMES.get(kind, kind)} deq_scale, which MindIE-SD's static Linear in "
        f"{refused} hands to npu_quant_matmul, whose {refused} output takes "
        f"{' or '.join(_DTYPE_NAMES[k] for k in sorted(DEQ_SCALE_DTYPES[refused]))} only "
        f"(the engine refuses it){fix}"
    )


def described_layers(description: dict[str, Any]) -> set[str]:
    """The modules a description gives an algorithm (``<p>.weight``, or ``<p>.linear.weight``
    with ``<p>.div.mul_scale``: the smoothed form), by name relative to the module it is for."""
    names = set()
    for key, value in description.items():
        if not (key.endswith(".weight") and isinstance(value, str)):
            continue
        if value.upper() not in QUANT_ALGORITHMS:
            continue
        name = key.removesuffix(".weight")
        smoothed = name.endswith(".linear") and f"{name.removesuffix('.linear')}.div.mul_scale"
        names.add(name.removesuffix(".linear") if smoothed and smoothed in description else name)
    return names


def _fits(module: nn.Module, names: set[str]) -> bool:
    """Every described name is a module of ``module`` (MindIE-SD would otherwise leave it float)."""
    return names <= {n for n, _ in module.named_modules()}


def layer_algorithm(name: str, description: dict[str, Any]) -> str | None:
    """The algorithm MindIE-SD gives Linear ``name``: None when a candidate key says FLOAT or
    none names a valid algorithm (the layer stays as loaded)."""
    # mindiesd 3.1.0 quantization/quantize.py get_key_patterns (lines 53-61), in its order
    keys = (f"{name}.linear.weight", f"{name}.weight", name, f"{name}.fa_q.scale",
            f"{name}.quant_type")  # fmt: skip
    if any(description.get(k) == "FLOAT" for k in keys):
        return None
    for key in keys:
        value = description.get(key)
        if isinstance(value, str) and value.upper() in QUANT_ALGORITHMS:
            return value.upper()
    return None


class MindieSdLinear(nn.Module):
    """One Linear as MindIE-SD replaces it, holding its tensors after the load-time casts.

    * static (``_init_static_quant_param``): ``weight`` int8 [N, K], ``quant_bias`` int32,
      ``deq_scale`` as stored, ``input_scale`` [1] cast to bfloat16 in a bfloat16 model (float32
      in a float16 one), ``input_offset`` [1] cast to bfloat16 in a bfloat16 model and int8 in
      a float16 one (3.1.0 lines 294-297; the same integer either way, held here as int8);
      ``bias`` read (unused) where the float layer has one;
    * dynamic (``_init_dynamic_quant_param``): ``weight_scale`` [N, 1] squeezed and cast to the
      engine dtype (through float16 to float32 in a float16 model), ``bias`` to the engine dtype;
    * W8A16 (``WeightQuantLinear``): ``weight_scale`` [N, 1] to the engine dtype; ``bias`` to
      float32 in a bfloat16 model;
    * W8A8_TIMESTEP (``W8A8TimeStepQuantLinear``, lines 395-453): the dynamic tensors, then one
      static row per denoising step (``input_scale``/``input_offset`` [T, 1], ``deq_scale`` and
      ``quant_bias`` [T, N]). The step index is this package's sampling-loop clock
      (:mod:`opsnn_quant.core.timesteps`) where MindIE-SD's is ``TimestepManager``; every step below
      T runs the static row, as after ``TimestepPolicyConfig().register(range(T), "static",
      target="w8a8_static_linear")`` (3.1.0's default target, ``w4a4_linear``, has no static);
      outside a sampling loop the dynamic branch runs (MindIE-SD's default strategy). Both
      branches multiply the input by ``mul_scale`` where the file has one (lines 422-423,
      440-441; this package's export writes no such layer, a third party's file may).
    """

    def __init__(
        self,
        layer: nn.Linear,
        prefix: str,
        algorithm: str,
        ckpt: MindieSdCheckpoint,
        mul_scale: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.algorithm, self.dtype = algorithm, dtype
        self.in_features, self.out_features = layer.in_features, layer.out_features
        weight = ckpt.load(f"{prefix}.weight")
        if weight.dtype != torch.int8 or tuple(weight.shape) != (
            self.out_features,
            self.in_features,
        ):
            raise MindieSdError(
                f"{prefix}.weight: {weight.dtype} {list(weight.shape)}, expected int8 "
                f"[{self.out_features}, {self.in_features}]"
            )
        # an int8 ``weight`` as MindIE-SD's classes hold one (libraries read its dtype: T5 keeps
        # its activations float when the projection's weight is int8)
        self.register_buffer("weight", weight)
        self.weight_t = weight.t()
        self.mul_scale = None if mul_scale is None else mul_scale.to(dtype)
        has_bias = isinstance(layer.bias, nn.Parameter)
        bias = ckpt.load(f"{prefix}.bias") if has_bias else None
        if algorithm in STATIC:
            self._static(prefix, ckpt)
        elif algorithm == TIMESTEP:
            self._dynamic(prefix, ckpt, bias)
            self._step_table(prefix, ckpt)
        elif algorithm == "W8A8_DYNAMIC":
            self._dynamic(prefix, ckpt, bias)
        else:
            self.weight_scale = ckpt.load(f"{prefix}.weight_scale").reshape(-1).to(dtype)
            self.bias = bias if bias is None or dtype != torch.bfloat16 else bias.float()

    def _dynamic(self, prefix: str, ckpt: MindieSdCheckpoint, bias: torch.Tensor | None) -> None:
        scale = ckpt.load(f"{prefix}.weight_scale").squeeze()
        d = self.dtype
        self.weight_scale = scale.to(d) if d == torch.bfloat16 else _via_fp16(scale)
        self.bias = None if bias is None else bias.to(d)

    def _step_table(self, prefix: str, ckpt: MindieSdCheckpoint) -> None:
        scale = ckpt.load(f"{prefix}.input_scale")
        if scale.dim() != 2 or scale.shape[1] != 1:
            raise MindieSdError(
                f"{prefix}.input_scale: shape {list(scale.shape)}; W8A8_TIMESTEP takes one row "
                "per step, [T, 1]"
            )
        self.input_scale = scale.to(self.dtype if self.dtype == torch.bfloat16 else torch.float32)
        self.input_offset = ckpt.load(f"{prefix}.input_offset").to(torch.int8)
        self.quant_bias = ckpt.load(f"{prefix}.quant_bias")
        self.deq_scale = ckpt.load(f"{prefix}.deq_scale")

    def _static(self, prefix: str, ckpt: MindieSdCheckpoint) -> None:
        scale = ckpt.load(f"{prefix}.input_scale")
        if scale.dim() != 1 or scale.numel() != 1:
            raise MindieSdError(
                f"{prefix}.input_scale: shape {list(scale.shape)}; MindIE-SD repeats a [1] "
                "scale to K (npu_quantize takes a 1-D scale)"
            )
        self.input_scale = scale.to(self.dtype if self.dtype == torch.bfloat16 else torch.float32)
        self.input_offset = ckpt.load(f"{prefix}.input_offset").reshape(1).to(torch.int8)
        self.quant_bias = ckpt.load(f"{prefix}.quant_bias")
        self.deq_scale = ckpt.load(f"{prefix}.deq_scale")
        if self.dtype == torch.bfloat16 and self.deq_scale.dtype == torch.int64:
            raise MindieSdError(
                f"{prefix}.deq_scale: int64, but npu_quant_matmul with bfloat16 output takes a "
                "float32 or bfloat16 scale"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        step = current_step() if self.algorithm == TIMESTEP else None
        if self.algorithm in STATIC:
            y = engines.mindie_sd_static(
                x2d, self.weight_t, self.deq_scale, self.quant_bias, self.input_scale,
                self.input_offset, self.mul_scale, self.dtype,
            )  # fmt: skip
        elif step is not None:  # the step's static row
            if not 0 <= step < self.input_scale.shape[0]:
                raise MindieSdError(
                    f"denoising step {step} has no row in the {self.input_scale.shape[0]}-step table"
                )
            y = engines.mindie_sd_static(
                x2d, self.weight_t, self.deq_scale[step], self.quant_bias[step],
                self.input_scale[step], self.input_offset[step], self.mul_scale, self.dtype,
            )  # fmt: skip
        elif self.algorithm in ("W8A8_DYNAMIC", TIMESTEP):
            y = engines.mindie_sd_dynamic(
                x2d, self.weight_t, self.weight_scale, self.bias, self.mul_scale, self.dtype
            )
        else:  # WeightQuantLinear accepts a mul_scale and never applies it
            y = engines.weight_only(x2d, self.weight_t, self.weight_scale, self.bias, self.dtype)
        # in the engine's dtype, whatever came in: mindiesd 3.1.0 quantization/layer.py 347-363
        # (output_dtype=self.dtype); an fp32 pipeline around it fails as it does on the NPU
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.algorithm}"


def _via_fp16(scale: torch.Tensor) -> torch.Tensor:
    return scale.to(torch.float16).to(torch.float32)


@torch.no_grad()
def apply_mindie_sd(
    model: nn.Module, ckpt: MindieSdCheckpoint, *, dtype: torch.dtype = torch.bfloat16
) -> list[str]:
    """Replace ``model``'s Linears as ``mindiesd.quantize(model, ...)`` does (in place).

    Args:
        model: the float component (the module ``mindiesd.quantize`` is given).
        ckpt: from :func:`read_mindie_sd`.
        dtype: MindIE-SD's ``dtype`` argument (bfloat16 by default; float16 or bfloat16).

    Returns:
        The names of the Linears replaced.

    Raises:
        MindieSdError: an algorithm not run here, a missing tensor, a wrong weight shape or a
            deq_scale the engine's matmul refuses.
    """
    if dtype not in (torch.float16, torch.bfloat16):
        raise MindieSdError(f"dtype must be float16 or bfloat16, got {dtype}")
    replaced: dict[str, nn.Module] = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, nn.Linear):
            continue
        algorithm = layer_algorithm(name, ckpt.description)
        if algorithm is None:
            continue
        if algorithm not in SUPPORTED:
            raise MindieSdError(f"{name}: {algorithm} is not run by this consumer")
        mul_key = f"{name}.div.mul_scale"
        mul = ckpt.load(mul_key) if mul_key in ckpt.keys else None
        prefix = f"{name}.linear" if mul is not None else name
        replaced[name] = MindieSdLinear(layer, prefix, algorithm, ckpt, mul, dtype)
    for name, module in replaced.items():  # applied after the walk, as modify_graph does
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, module)
    return list(replaced)


def component_descriptions(directory: Path) -> dict[str, Path]:
    """The MindIE-SD descriptions of an ``export/mindie-sd`` directory: component -> its
    ``quant_model_description_<type>.json`` (``""``: the directory itself holds one).

    Raises:
        MindieSdError: a directory holding several descriptions (which one is meant?).
    """
    found: dict[str, Path] = {}
    for name, d in [
        ("", directory),
        *((p.name, p) for p in sorted(directory.iterdir()) if p.is_dir()),
    ]:
        descs = sorted(d.glob("quant_model_description_*.json"))
        if len(descs) > 1:
            raise MindieSdError(f"{d}: {len(descs)} descriptions; MindIE-SD is given one")
        if descs:
            found[name] = descs[0]
    return found


def is_mindie_sd_dir(directory: Path) -> bool:
    """A directory MindIE-SD's files are in (itself, or its component subdirectories)."""
    return directory.is_dir() and bool(_descriptions(directory))


def _descriptions(directory: Path) -> list[Path]:
    dirs = [directory, *(p for p in sorted(directory.iterdir()) if p.is_dir())]
    return [f for d in dirs for f in sorted(d.glob("quant_model_description_*.json"))]


def apply_mindie_sd_dir(
    model: nn.Module, directory: Path, *, dtype: torch.dtype = torch.bfloat16
) -> list[str]:
    """Apply every component of ``directory`` to ``model`` as ``mindiesd.quantize`` would be
    called on each; the names replaced.

    A component subdirectory is for the model's component of that name; a description in
    ``directory`` itself for the model, or else for the one component its names are relative
    to (msModelSlim writes a pipeline's ``transformer`` flat).

    Raises:
        MindieSdError: a component the model lacks, a description naming a module its component
            (or, flat, the model and every component) lacks, or any check of
            :func:`read_mindie_sd` and :func:`apply_mindie_sd`.
    """
    replaced = []
    for component, desc in component_descriptions(directory).items():
        ckpt = read_mindie_sd(desc)
        names = described_layers(ckpt.description)
        if component:
            target = getattr(model, component, None)
            if not isinstance(target, nn.Module):
                raise MindieSdError(f"{desc}: the model has no component {component!r}")
            parts = [(component, target)]
        else:
            parts = [("", model), *model.named_children()]
        fitting = [(n, m) for n, m in parts if _fits(m, names)]
        if not fitting:
            missing = sorted(names - {n for n, _ in parts[0][1].named_modules()})
            what = f"component {component!r}" if component else "neither the model nor a component"
            raise MindieSdError(
                f"{desc}: its layer names fit {what} (it names "
                f"{missing[0] if missing else 'no layer'}; MindIE-SD would leave such a layer "
                "float): is the baseline the model it was made from?"
            )
        name, target = fitting[0]
        done = apply_mindie_sd(target, ckpt, dtype=dtype)
        replaced += [f"{name}.{n}" if name else n for n in done]
    return replaced
