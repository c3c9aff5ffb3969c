"""``opsnn-quant policy ...``: build a policy from a probe; export it to the files AMCT and ATC
read; show a summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.calibrate_output import PROBE_FILE
from opsnn_quant.formats.registry import exporters

if TYPE_CHECKING:
    from opsnn_quant.policy.schema import ResolvedPolicy
    from opsnn_quant.probe.report import SensitivityReport


def _probe_path(policy_path: Path, probe: Path | None) -> Path:
    path = probe if probe is not None else policy_path.parent / PROBE_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path} not found: the policy's module list comes from the probe report; "
            "pass --probe probe.json"
        )
    return path


def _resolved(policy_path: Path, probe: Path | None) -> tuple[ResolvedPolicy, SensitivityReport]:
    """The policy resolved against the probe report's module inventory, and the report."""
    from opsnn_quant.policy.schema import PrecisionPolicy
    from opsnn_quant.probe.report import SensitivityReport

    policy = PrecisionPolicy.load(policy_path)
    report = SensitivityReport.load(_probe_path(policy_path, probe))
    return policy.resolved(report.inventory(), report.weight_shapes(), tied=report.tied()), report


def _op_types(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        cls, sep, optype = pair.partition("=")
        if not sep or not cls or not optype:
            raise ConfigError(
                f"--optype takes CLASS=OPTYPE (e.g. LayerNorm=LayerNorm), got {pair!r}"
            )
        out[cls] = optype
    return out


def export(
    policy: Annotated[Path, typer.Argument(help="policy.yaml")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help=" | ".join(e.name for e in exporters("policy")),  # the format table's
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("-o", "--out", help="output file (an earlier export of it is replaced)"),
    ],
    nodes: Annotated[
        Path | None, typer.Option(help="<model>.nodes.json: module -> ONNX node names")
    ] = None,
    probe: Annotated[
        Path | None,
        typer.Option(help="probe.json with the module list (default: beside POLICY)"),
    ] = None,
    onnx: Annotated[
        Path | None,
        typer.Option(help="ONNX model: exact input/output counts for customize_dtypes"),
    ] = None,
    optype: Annotated[
        list[str] | None,
        typer.Option(help="CLASS=OPTYPE (Ascend IR) for the mixlist; repeatable"),
    ] = None,
    batch_num: Annotated[int, typer.Option(min=1, help="AMCT calibration batches")] = 1,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="replace FILE when opsnn-quant wrote it there and it was changed since (never a file it did not write)",
        ),
    ] = False,
) -> None:
    """Write POLICY in a format AMCT or ATC reads (never over one of its inputs)."""
    from opsnn_quant.formats.atc.precision import load_node_map, onnx_node_io
    from opsnn_quant.formats.policy_files import export_policy
    from opsnn_quant.formats.result import export_files
    from opsnn_quant.output.loose import write_output_files

    result = export_policy(
        _resolved(policy, probe)[0],
        fmt,
        node_map=load_node_map(nodes) if nodes is not None else None,
        node_io=onnx_node_io(str(onnx)) if onnx is not None else None,
        op_types=_op_types(optype or []),
        batch_num=batch_num,
    )
    read = [policy, probe or policy.parent / PROBE_FILE, nodes, onnx]
    files, stale = export_files(result, out)
    inputs = [p for p in read if p is not None]
    written = write_output_files(files, force=force, inputs=inputs, stale=stale)
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(", ".join(str(p) for p in written))


def show(
    policy: Annotated[Path, typer.Argument(help="policy.yaml")],
    probe: Annotated[Path | None, typer.Option(help="probe.json (default: beside POLICY)")] = None,
) -> None:
    """Print per-modality precisions, module counts and predicted SQNR."""
    from opsnn_quant.cli import _ui
    from opsnn_quant.core.numerics import fmt_db, fmt_share
    from opsnn_quant.policy.summary import summarize

    resolved, report = _resolved(policy, probe)  # as strict as policy export
    pol = resolved.policy
    columns = [("modality", "left"), ("chosen", "left")]
    columns += [(c, "right") for c in ("fp32", "bf16", "fp16", "int8", "pred", "MAC%")]
    table = _ui.table(
        f"{pol.model} on {pol.target}",
        columns,
        caption="module counts per precision; pred: predicted SQNR of the modality's "
        "output, dB; MAC%: share of MACs in int8",
    )
    for row in summarize(resolved, report):
        table.add_row(
            row.modality.value, row.chosen, str(row.fp32), str(row.bf16), str(row.fp16),
            str(row.int8), fmt_db(row.predicted_sqnr_db, unit="", none="-"), fmt_share(row.int8_mac_share),
        )  # fmt: skip
    _ui.print_table(table)


def build(
    probe: Annotated[Path, typer.Argument(help="probe.json, or a probe/calibrate output")],
    target: Annotated[str, typer.Option(help="deployment target (e.g. ascend910b-atc)")],
    budget: Annotated[
        str,
        typer.Option(
            help="budget: a YAML file, or inline YAML such as "
            "'{limits: {denoiser: {min_sqnr_db: 30}}, min_int8_mac_share: 0.5}'"
        ),
    ] = "{}",
    out: Annotated[Path, typer.Option("-o", "--out", help="policy file to write")] = Path(
        "policy.yaml"
    ),
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="replace OUT when it is a policy opsnn-quant wrote that was changed since (never a file it did not write)",
        ),
    ] = False,
) -> None:
    """Decide a policy from an earlier probe under another budget or target (no model run)."""
    from opsnn_quant.pipeline.policy_build import build_from_probe

    policy = build_from_probe(probe, target, budget, out, force=force)
    typer.echo(str(policy))
    typer.echo(f"wrote {out}")


def register(app: typer.Typer) -> None:
    """Add the ``policy`` command group to ``app``."""
    group = typer.Typer(
        help="Precision policies: build from a probe, export for AMCT/ATC, summaries.",
        no_args_is_help=True,
    )
    group.command("build")(build)
    group.command("export")(export)
    group.command("show")(show)
    app.add_typer(group, name="policy")
