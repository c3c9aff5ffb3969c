"""ATC precision files: ``--keep_dtype``, ``--customize_dtypes``, ``--modify_mixlist``.

Formats (ATC manual, CANN 8.5 and earlier):

* ``--keep_dtype``: one original-model node name (or ``OpType::TypeName``) per line.
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/atctool/atlasatcparam_16_0074.html
* ``--customize_dtypes``: ``Opname::InputDtype:dtype1,...,OutputDtype:dtype1,...`` per line, one
  dtype per operator input/output.
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/atctool/atlasatcparam_16_0075.html
* ``--modify_mixlist``: JSON ``{"black-list": {"to-add": [...], "to-remove": [...]},
  "white-list": {...}}`` of Ascend IR OpTypes (not node names).
  https://www.hiascend.com/document/detail/zh/canncommercial/latest/devaids/atctool/atlasatcparam_16_0071.html

The line files carry no comments: GraphEngine's keep_dtype parser (``keep_dtype_option.cc``,
``DealKeepDtypeOption``) treats every non-empty line as an op name and fails the build (E10042)
on a name that is not in the graph. Provenance notes go to ``<file>.notes.txt`` instead.

Node names. With a node map (``<model>.nodes.json`` from ``opsnn_quant.formats.atc.onnx.export``) the
exact names are used. Without one, the names of ``torch.onnx.export(..., dynamo=False)`` are
derived. Checked on torch 2.13 (opset 17): a node is ``/<scope>/.../<OpType>`` where each scope
is the last part of a module's name, or the last two when that part is a ModuleList/Sequential
index (``/enc/layers.0/fc/MatMul``, ``/enc/inner/seq/seq.0/MatMul``); ModuleList/ModuleDict
containers add no scope (``enc.d.a`` -> ``/enc/a``); a 3-D Linear gives ``MatMul`` + ``Add``,
a 2-D one ``Gemm``; a second call of a module gets ``<scope>_1``. The dynamo exporter (torch's
default since 2.9) names nodes ``node_<op>_<n>``: derived names do not apply to it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.result import ExportResult
from opsnn_quant.policy.schema import Resolved, ResolvedPolicy
from opsnn_quant.types import Precision

if TYPE_CHECKING:
    from opsnn_quant.formats.result import PolicyExportOptions

ATC_FORMATS = ("atc-keep-dtype", "atc-customize-dtypes", "atc-modify-mixlist")

# ONNX ops each module type becomes under torch.onnx.export(dynamo=False, opset_version=17),
# checked with torch 2.13 (Linear: 3-D input with bias; Constant nodes left out, ATC folds them).
TORCH_EXPORT_OPS: dict[str, tuple[str, ...]] = {
    "Linear": ("MatMul", "Add"),
    "Conv2d": ("Conv",),
    "LayerNorm": ("LayerNormalization",),
    "GroupNorm": ("InstanceNormalization", "Mul", "Add"),
    "Softmax": ("Softmax",),
    "ReLU": ("Relu",),
    "GELU": ("Div", "Erf", "Add", "Mul", "Mul_1"),
    # Residual blocks: their own ops only (the residual sums, ResnetBlock2D's temb add and output
    # scale), the nodes an fp16 overflow of the residual stream needs kept in fp32.
    "CLIPEncoderLayer": ("Add", "Add_1"),
    "WhisperEncoderLayer": ("Add", "Add_1"),
    "WhisperDecoderLayer": ("Add", "Add_1", "Add_2"),
    "BasicTransformerBlock": ("Add", "Add_1", "Add_2"),
    "ResnetBlock2D": ("Add", "Add_1", "Div"),
    # Attention (eager): the score matmul, its scaling, the softmax and the probability matmul,
    # the nodes an fp16 overflow of the softmax input needs kept in fp32.
    "CLIPAttention": ("MatMul", "Mul", "Softmax", "MatMul_1"),
    "WhisperAttention": ("MatMul", "Mul_1", "Softmax", "MatMul_1"),
    "Attention": ("Mul", "Mul_1", "MatMul", "Softmax", "MatMul_1"),
}
# (inputs, outputs) of ONNX ops, for --customize_dtypes when no ONNX model is given.
ONNX_OP_IO: dict[str, tuple[int, int]] = {
    "MatMul": (2, 1), "Add": (2, 1), "Mul": (2, 1), "Div": (2, 1), "Gemm": (3, 1),
    "Conv": (3, 1), "LayerNormalization": (3, 1), "InstanceNormalization": (3, 1),
    "Softmax": (1, 1), "Relu": (1, 1), "Erf": (1, 1),
}  # fmt: skip
_CONTAINERS = {"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}
_DTYPES = {Precision.FP32: "float32", Precision.BF16: "bfloat16"}


def torch_scope(name: str, modules: Mapping[str, str]) -> str:
    """The scope path torch.onnx.export(dynamo=False) gives module ``name``."""
    parts = name.split(".")
    scopes = []
    for i, part in enumerate(parts):
        qual = ".".join(parts[: i + 1])
        nxt = parts[i + 1] if i + 1 < len(parts) else None
        kind = modules.get(qual)
        # A container that is never called adds no scope; when its type is unknown, a numeric
        # child is taken as a sign of a ModuleList (diffusers/transformers blocks).
        if kind in _CONTAINERS or (kind is None and nxt is not None and nxt.isdigit()):
            continue
        scopes.append(f"{parts[i - 1]}.{part}" if part.isdigit() and i > 0 else part)
    return "/" + "/".join(scopes)


def _nodes(
    name: str,
    modules: Mapping[str, str],
    node_map: Mapping[str, Sequence[str]] | None,
    notes: list[str],
) -> list[str]:
    if node_map is not None:
        found = list(node_map.get(name, ()))
        if not found:
            notes.append(f"{name}: not in the node map; not listed")
        return found
    ops = TORCH_EXPORT_OPS.get(modules[name])
    if ops is None:
        notes.append(
            f"{name} ({modules[name]}): no derived ONNX node names for this type; not listed"
        )
        return []
    scope = torch_scope(name, modules)
    return [f"{scope}/{op}" for op in ops]


def _source_note(node_map: object) -> str:
    if node_map is not None:
        return "node names: from the node map (<model>.nodes.json)"
    return (
        "node names: derived for torch.onnx.export(dynamo=False, opset 17) "
        "('/<scope>/<OpType>', 3-D Linear = MatMul+Add); ATC rejects names not in the graph "
        "(E10042), so pass --nodes <model>.nodes.json for an exact list"
    )


def _pinnable(
    policy: ResolvedPolicy, node_map: Mapping[str, Sequence[str]] | None
) -> dict[str, Resolved]:
    """The resolved modules whose nodes a precision file can name. Containers' children carry
    most nodes; a container's own ops (a residual block's sums) are in the node map under its
    name, or derived for the block types TORCH_EXPORT_OPS knows."""
    modules = policy.modules
    parents = {n.rsplit(".", 1)[0] for n in modules if "." in n}
    return {
        n: r
        for n, r in policy.resolution.items()
        if n not in parents or node_map is not None or modules.get(n) in TORCH_EXPORT_OPS
    }


def keep_dtype(fmt: str, policy: ResolvedPolicy, options: PolicyExportOptions) -> ExportResult:
    """``--keep_dtype``: the nodes of the modules the policy pins to fp32 (the ``atc-keep-dtype``
    writer of the format table)."""
    modules, node_map = policy.modules, options.node_map
    notes: list[str] = []
    resolved = _pinnable(policy, node_map)
    pins = [
        n for n, r in resolved.items() if r.precision == Precision.FP32 and r.rule != "unassigned"
    ]
    lines = [node for n in pins for node in _nodes(n, modules, node_map, notes)]
    notes.insert(0, _source_note(node_map))
    return ExportResult(fmt, "".join(f"{x}\n" for x in lines), tuple(notes))


def customize_dtypes(
    fmt: str, policy: ResolvedPolicy, options: PolicyExportOptions
) -> ExportResult:
    """``--customize_dtypes``: fp32 pins and bf16 modules, one dtype per input and output (the
    ``atc-customize-dtypes`` writer of the format table)."""
    modules, node_map = policy.modules, options.node_map
    notes: list[str] = []
    lines = []
    for name, res in _pinnable(policy, node_map).items():
        dtype = _DTYPES.get(res.precision)
        if dtype is None or res.rule == "unassigned":
            continue
        for node in _nodes(name, modules, node_map, notes):
            io = _io_of(node, options.node_io)
            if io is None:
                notes.append(f"{node}: unknown input/output count; not listed (pass --onnx)")
                continue
            ins, outs = io
            lines.append(
                f"{node}::InputDtype:{','.join([dtype] * ins)},OutputDtype:{','.join([dtype] * outs)}"
            )
    notes.insert(0, _source_note(node_map))
    notes.insert(
        1,
        "dtype counts follow the ONNX node (from --onnx, else a table of ONNX ops); ATC wants one "
        "per input/output of the Ascend IR operator it maps to: check a line ATC rejects against "
        "the operator's inputs",
    )
    return ExportResult(fmt, "".join(f"{x}\n" for x in lines), tuple(notes))


def modify_mixlist(fmt: str, policy: ResolvedPolicy, options: PolicyExportOptions) -> ExportResult:
    """``--modify_mixlist``: the OpTypes whose every module the policy pins to fp32, moved to the
    black list (the ``atc-modify-mixlist`` writer of the format table)."""
    return _mixlist(dict(policy.resolution), policy.modules, options.op_types or {}, [])


def _io_of(node: str, node_io: Mapping[str, tuple[str, int, int]] | None) -> tuple[int, int] | None:
    if node_io is not None and node in node_io:
        _, ins, outs = node_io[node]
        return ins, outs
    op = re.sub(r"_\d+$", "", node.rsplit("/", 1)[-1])
    return ONNX_OP_IO.get(op)


def _mixlist(
    resolved: Mapping[str, Resolved],
    modules: Mapping[str, str],
    op_types: Mapping[str, str],
    notes: list[str],
) -> ExportResult:
    # The mixlist works on whole OpTypes: blacklist a type only when the policy pins every module
    # of that class to fp32, so no other module loses fp16 through it.
    by_type: dict[str, list[Precision]] = {}
    parents = {n.rsplit(".", 1)[0] for n in modules if "." in n}
    for name, res in resolved.items():
        if name not in parents:
            by_type.setdefault(modules[name], []).append(res.precision)
    add = []
    for cls, precisions in by_type.items():
        if not all(p == Precision.FP32 for p in precisions):
            continue
        optype = op_types.get(cls)
        if optype is None:
            notes.append(
                f"all {cls} modules are fp32, but no Ascend IR OpType is known for {cls} "
                "(pass --optype CLASS=OPTYPE); pinned through --keep_dtype node names instead"
            )
        elif optype not in add:
            add.append(optype)
    doc = {"black-list": {"to-add": add}}
    return ExportResult("atc-modify-mixlist", json.dumps(doc, indent=2) + "\n", tuple(notes))


def onnx_node_io(path: str) -> dict[str, tuple[str, int, int]]:
    """ONNX node name -> (op type, non-empty inputs, outputs) of a model file (needs ``onnx``).

    Raises:
        MissingDependencyError: onnx is not installed.
        ConfigError: ``path`` is missing, unreadable, empty or not an ONNX model with a graph.
    """
    from opsnn_quant.errors import MissingDependencyError

    try:
        import onnx
        from google.protobuf.message import DecodeError  # onnx's own dependency
    except ImportError as exc:
        raise MissingDependencyError(
            "reading an ONNX model needs onnx: pip install 'opsnn-quant[onnx]'"
        ) from exc
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read ONNX model {path}: {exc.strerror or exc}") from exc
    # protobuf parses zero bytes as an empty message: an empty file would give no node counts
    # and silently fall back to the op table it was meant to replace.
    if not data:
        raise ConfigError(f"ONNX model {path} is empty (0 bytes)")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError) as exc:  # protobuf: DecodeError; onnx's own checks: ValueError
        raise ConfigError(f"{path} is not an ONNX model: {exc}") from exc
    if not model.graph.node:
        raise ConfigError(f"{path} is not an ONNX model: it has no graph nodes")
    return {
        n.name: (n.op_type, sum(1 for i in n.input if i), sum(1 for o in n.output if o))
        for n in model.graph.node
    }


def load_node_map(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Module -> ONNX node names from ``<model>.nodes.json`` (or a plain ``{module: [nodes]}``).

    ``path`` may name the ``.onnx`` file: its ``.nodes.json`` sibling is read. A light JSON
    reader (no torch, no onnx) for the ATC exports and the ONNX tools alike.

    Raises:
        ConfigError: missing file, invalid JSON, or not a mapping of lists of strings.
    """
    p = Path(path)
    if p.suffix == ".onnx":
        p = p.with_suffix(".nodes.json")
    if not p.is_file():
        raise ConfigError(f"node map {p} not found")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    nodes = doc.get("nodes", doc) if isinstance(doc, dict) else None
    if not isinstance(nodes, dict) or not all(
        isinstance(v, list) and all(isinstance(x, str) for x in v) for v in nodes.values()
    ):
        raise ConfigError(f"{p}: expected {{module name: [ONNX node names]}} (or under 'nodes')")
    return {str(k): list(v) for k, v in nodes.items()}
