"""ATC and AOE command lines, as the CANN manuals spell them, and their checks.

Flag lists: ATC's user-facing flags are those its help text documents (``hicann/ge``
``api/atc/main_impl.cc`` ``SetUsageMessage``, the same set as the manual's overview "参数概览",
https://www.hiascend.com/document/detail/zh/canncommercial/900/devaids/atctool/atlasatc_16_0039.html);
AOE's are the overview of the AOE manual
(https://www.hiascend.com/document/detail/zh/canncommercial/900/devaids/aoe/aoepar_16_001.html)
plus its advanced-function list (``.../82RC1alpha001/devaids/aoe/aoepar_16_026.html``).

Value rules checked by :func:`check_atc` / :func:`check_aoe` (manual page, and the ATC source
check that enforces it):

* ``--framework``: 0 Caffe, 1 MindSpore, 3 TensorFlow, 5 ONNX (atlasatcparam_16_0014).
* ``--model``, ``--output``, ``--soc_version`` required for ATC mode 0 (``CheckFlags``);
  ``--output`` has no ``.om`` suffix (ATC appends it).
* ``--precision_mode`` values (atlasatcparam_16_0068, ``CheckPrecisionModeParamValid``);
  ``--precision_mode_v2`` values ``fp16``, ``origin``, ``cube_fp16in_fp32out``,
  ``mixed_float16``, ``mixed_bfloat16`` (atctool_000093); never both (E10056).
* ``--modify_mixlist`` needs a mixed-precision mode (``CheckModifyMixlistParamValid``, E10001).
* ``--keep_dtype`` needs a precision mode (atlasatcparam_16_0074) and does nothing with
  ``must_keep_origin_dtype`` / ``origin``; we refuse that combination.
* ``--input_shape``: ``"name1:d1,d2;name2:d1"`` (atlasatcparam_16_0016).
* ``--input_format`` for ONNX: ``NCHW``, ``ND``, ``NCDHW`` (``kONNXFormatSupport``).
* AOE: ``--job_type`` 1 (subgraph tuning) or 2 (operator tuning) required (aoepar_16_007);
  ``--precision_mode_v2`` is in no AOE list we found, so AOE gets ``--precision_mode``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from opsnn_quant.errors import ConfigError


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


ATC_FLAGS = _words(
    "h help mode model weight om framework input_format input_shape input_hint_shape "
    "input_shape_range dynamic_batch_size dynamic_image_size dynamic_dims singleop output "
    "output_type check_report json host_env_os host_env_cpu soc_version virtual_type core_type "
    "aicore_num out_nodes input_fp16_nodes insert_op_conf op_name_map is_input_adjust_hw_layout "
    "is_output_adjust_hw_layout external_weight disable_reuse_memory fusion_switch_file "
    "enable_scope_fusion_passes enable_single_stream ac_parallel_enable tiling_schedule_optimize "
    "quant_dumpable enable_small_channel enable_compress_weight compress_weight_conf "
    "compression_optimize_conf enable_attr_compression sparsity buffer_optimize mdl_bank_path "
    "oo_level op_precision_mode allow_hf32 precision_mode precision_mode_v2 modify_mixlist "
    "keep_dtype customize_dtypes is_weight_clip op_bank_path op_select_implmode "
    "optypelist_for_implmode op_debug_level save_original_model log dump_mode debug_dir "
    "status_check op_compiler_cache_dir op_compiler_cache_mode display_model_info "
    "shape_generalized_build_mode op_debug_config atomic_clean_policy deterministic "
    "deterministic_level"
)
AOE_FLAGS = _words(
    "help h model m model_path weight w job_type j framework f input_format input_shape "
    "dynamic_batch_size dynamic_image_size dynamic_dims reload device progress_bar singleop "
    "output output_type host_env_os host_env_cpu aicore_num virtual_type out_nodes "
    "input_fp16_nodes insert_op_conf op_name_map is_input_adjust_hw_layout "
    "is_output_adjust_hw_layout disable_reuse_memory fusion_switch_file "
    "enable_scope_fusion_passes enable_single_stream enable_small_channel compress_weight_conf "
    "compression_optimize_conf buffer_optimize precision_mode op_select_implmode "
    "optypelist_for_implmode op_debug_level log tune_ops_file op_precision_mode modify_mixlist "
    "keep_dtype customize_dtypes tune_optimization_level Fdeeper_opat Fnonhomo_split Fop_format "
    "sparsity op_tune_mode op_tune_file op_tune_kernel_path soc_version init_bypass "
    "build_bypass"
)
FRAMEWORKS = {"0", "1", "3", "5"}
PRECISION_MODES = frozenset(
    {"force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16",
     "must_keep_origin_dtype", "allow_mix_precision", "allow_mix_precision_fp16",
     "allow_mix_precision_bf16", "allow_fp32_to_bf16"}
)  # fmt: skip
PRECISION_MODES_V2 = frozenset(
    {"fp16", "origin", "cube_fp16in_fp32out", "mixed_float16", "mixed_bfloat16"}
)
MIXED = frozenset(
    {"allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16",
     "mixed_float16", "mixed_bfloat16"}
)  # fmt: skip
ONNX_INPUT_FORMATS = frozenset({"NCHW", "ND", "NCDHW"})
LOG_LEVELS = frozenset({"debug", "info", "warning", "error", "null"})
_SHAPE = re.compile(
    r"^[^:;]+:(-?\d+(~\d+)?(,-?\d+(~\d+)?)*)?(;[^:;]+:(-?\d+(~\d+)?(,-?\d+(~\d+)?)*)?)*$"
)


def parse_flags(args: Sequence[str], tool: str) -> dict[str, str]:
    """``--name=value`` arguments (after the tool name) -> {name: value}.

    Raises:
        ConfigError: an argument that is not ``--name=value``, or a name given twice.
    """
    out: dict[str, str] = {}
    for arg in args:
        m = re.fullmatch(r"--([A-Za-z][A-Za-z0-9_]*)=(.*)", arg, flags=re.S)
        if m is None:
            raise ConfigError(f"{tool}: argument {arg!r} is not --name=value")
        name = m.group(1).replace("-", "_")
        if name in out:
            raise ConfigError(f"{tool}: --{name} given twice")
        out[name] = m.group(2)
    return out


def _check_common(tool: str, flags: dict[str, str], known: frozenset[str]) -> None:
    unknown = sorted(set(flags) - known)
    if unknown:
        raise ConfigError(f"{tool}: --{unknown[0]} is not a documented {tool} flag")
    if "framework" in flags and flags["framework"] not in FRAMEWORKS:
        raise ConfigError(f"{tool}: --framework must be 0, 1, 3 or 5, got {flags['framework']}")
    v1, v2 = flags.get("precision_mode"), flags.get("precision_mode_v2")
    if v1 is not None and v2 is not None:
        raise ConfigError(f"{tool}: --precision_mode and --precision_mode_v2 exclude each other")
    if v1 is not None and v1 not in PRECISION_MODES:
        raise ConfigError(f"{tool}: --precision_mode {v1!r} is not a documented value")
    if v2 is not None and v2 not in PRECISION_MODES_V2:
        raise ConfigError(f"{tool}: --precision_mode_v2 {v2!r} is not a documented value")
    mode = v1 or v2
    if "modify_mixlist" in flags and mode not in MIXED:
        raise ConfigError(f"{tool}: --modify_mixlist needs a mixed precision mode, got {mode}")
    if "keep_dtype" in flags and mode in (None, "must_keep_origin_dtype", "origin"):
        raise ConfigError(f"{tool}: --keep_dtype needs a precision mode that is not 'origin'")
    if "input_shape" in flags and not _SHAPE.match(flags["input_shape"]):
        raise ConfigError(f"{tool}: --input_shape {flags['input_shape']!r} is not name:d1,d2;...")
    fmt = flags.get("input_format")
    if fmt is not None and flags.get("framework") == "5" and fmt not in ONNX_INPUT_FORMATS:
        raise ConfigError(f"{tool}: --input_format for ONNX is NCHW, ND or NCDHW, got {fmt}")
    if "log" in flags and flags["log"] not in LOG_LEVELS:
        raise ConfigError(f"{tool}: --log {flags['log']!r} is not a documented level")
    if "soc_version" in flags and not re.fullmatch(
        r"(Ascend\w[\w-]*|\$\{?\w+\}?)", flags["soc_version"]
    ):
        raise ConfigError(f"{tool}: --soc_version {flags['soc_version']!r} is not Ascend<chip>")


def check_atc(args: Sequence[str]) -> None:
    """Check an ``atc`` command (``args[0] == "atc"``) against the manual's rules.

    Raises:
        ConfigError: the first rule it breaks (see the module docstring).
    """
    if not args or args[0] != "atc":
        raise ConfigError("not an atc command")
    flags = parse_flags(args[1:], "atc")
    _check_common("atc", flags, ATC_FLAGS)
    for name in ("framework", "model", "output", "soc_version"):
        if name not in flags:
            raise ConfigError(f"atc: --{name} is required")
    if flags["output"].endswith(".om"):
        raise ConfigError("atc: --output is a path prefix; ATC appends .om")


def check_aoe(args: Sequence[str]) -> None:
    """Check an ``aoe`` command against the AOE manual's rules.

    Raises:
        ConfigError: the first rule it breaks.
    """
    if not args or args[0] != "aoe":
        raise ConfigError("not an aoe command")
    flags = parse_flags(args[1:], "aoe")
    _check_common("aoe", flags, AOE_FLAGS)
    if flags.get("job_type") not in ("1", "2"):
        raise ConfigError("aoe: --job_type must be 1 (subgraph) or 2 (operator tuning)")
    if "model" not in flags:
        raise ConfigError("aoe: --model is required")


def shell_line(args: Sequence[str], expand: Sequence[str] = ()) -> str:
    """One shell command line, one flag per line, quoted; values in ``expand`` (such as
    ``$SOC_VERSION``) are double-quoted so that the shell expands them."""
    parts = []
    for a in args:
        name, eq, value = a.partition("=")
        if eq and value in expand:
            parts.append(f'{name}="{value}"')
        elif eq and name.startswith("--") and shlex.quote(name) == name:
            parts.append(f"{name}={shlex.quote(value)}")  # --flag='a;b': the manual's form
        else:
            parts.append(shlex.quote(a))
    return " \\\n    ".join(parts)


__all__ = ["AOE_FLAGS", "ATC_FLAGS", "check_aoe", "check_atc", "parse_flags", "shell_line"]
