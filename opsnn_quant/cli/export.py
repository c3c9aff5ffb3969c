"""``opsnn-quant export-weights``: deployable outputs from a calibrate output.

``export-weights OUT -f ascendv1`` writes ``OUT/export/ascendv1/`` (AscendV1 weights for
MindIE / vLLM-Ascend / SGLang); ``-f atc`` writes ``OUT/export/atc/`` (ONNX graphs + ATC/AOE
commands). Both are what ``calibrate`` writes; this command redoes them from ``quant/``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from opsnn_quant.cli import _ui
from opsnn_quant.outputs import CalibrateOutput


def register(app: typer.Typer) -> None:
    """Add ``export-weights`` to ``app``."""

    @app.command("export-weights")
    def export_weights(
        out: Annotated[Path, typer.Argument(help="calibrate output directory (holds quant/)")],
        fmt: Annotated[
            list[str] | None,
            typer.Option("--format", "-f", help="ascendv1 | atc; repeatable [default: ascendv1]"),
        ] = None,
        dest: Annotated[
            Path | None, typer.Option("-o", "--out", help="export directory [default: OUT/export]")
        ] = None,
        data: Annotated[
            str | None,
            typer.Option(
                help="data to run one call per root on (zoo:<name>/<split> or a path): needed for "
                "-f atc and to fold SmoothQuant factors"
            ),
        ] = None,
        limit: Annotated[int, typer.Option(help="records of --data to use")] = 1,
        force: Annotated[
            bool, typer.Option("--force", help="replace outputs that are not ours")
        ] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
        allow_pickle: Annotated[
            bool, typer.Option("--allow-pickle", help=_ui.ALLOW_PICKLE_HELP)
        ] = False,
    ) -> None:
        """Write AscendV1 weights and/or ATC/AOE commands from a calibrate output."""
        from opsnn_quant.deploy.workflow_exports import notes_file
        from opsnn_quant.errors import ConfigError
        from opsnn_quant.io import check_output_dir, check_output_file
        from opsnn_quant.models import check_weights
        from opsnn_quant.policy.exporters import exporters
        from opsnn_quant.quant.checkpoint import read_description
        from opsnn_quant.sources import local_paths
        from opsnn_quant.user_config import check_limit

        check_limit(limit)
        model_formats = [e.name for e in exporters("model")]
        formats = list(dict.fromkeys(fmt or ["ascendv1"]))
        bad = [f for f in formats if f not in model_formats]
        if bad:
            raise ConfigError(f"--format must be {' or '.join(model_formats)}, got {bad[0]!r}")
        calib = CalibrateOutput(out)
        desc = read_description(calib.quant)  # a calibrate output, before any model loads
        if not calib.policy.is_file():
            raise ConfigError(f"{out} has no policy.yaml; give a calibrate output directory")
        smoothed = any(m.get("smoothquant_alpha") is not None for m in desc["modules"].values())
        if data is None and ("atc" in formats or smoothed):
            why = "the ATC graphs" if "atc" in formats else "folding its SmoothQuant factors"
            raise ConfigError(f"{why} need one call per root: pass --data (e.g. the recipe's data)")
        check_weights(str(desc.get("source_model") or ""), allow_pickle=allow_pickle)
        export_dir = dest or calib.export
        read = calib.read_by_consumers()
        read += local_paths(str(desc.get("source_model") or "")) if desc.get("source_model") else []
        read += local_paths(data) if data is not None else []
        for f in formats:
            check_output_dir(export_dir / f, f, force=force, inputs=read)
            path, kind = notes_file(export_dir, f)
            check_output_file(path, kind, force=force, inputs=read)
        with _ui.phases(quiet) as say:
            notes = _run(out, export_dir, formats, data, limit, force, say, allow_pickle)
        if not quiet:
            for note in notes:
                typer.echo(f"note: {note}", err=True)
            _ui.console.print(f"wrote {', '.join(str(export_dir / f) for f in formats)}")


def _run(
    out: Path,
    export_dir: Path,
    formats: list[str],
    data: str | None,
    limit: int,
    force: bool,
    say: Callable[[str], None],
    allow_pickle: bool = False,
) -> list[str]:
    from opsnn_quant.deploy.workflow_exports import write_model_exports
    from opsnn_quant.errors import ConfigError
    from opsnn_quant.evaluation.evaluate import load_candidate
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.policy.export import modules_from_report
    from opsnn_quant.policy.schema import PrecisionPolicy
    from opsnn_quant.recording import record_roots

    records = load_records(data, limit) if data is not None else []
    say("loading the quantized model")
    adapter, report = load_candidate(out, allow_pickle=allow_pickle)
    if report is None:
        raise ConfigError(
            f"{out} has no probe.json (the module inventory); give a calibrate output"
        )
    calls = {}
    if records:
        say("recording one call per root")
        calls = record_roots(adapter, adapter.forward_loop(records), 1).calls
    float_model = None
    if "atc" in formats:
        say("loading the float model for the ATC graphs")
        source = adapter.model_id
        float_model = load_adapter(None, source, allow_pickle=allow_pickle).model
    policy = PrecisionPolicy.load(CalibrateOutput(out).policy)
    return write_model_exports(
        adapter, policy, modules_from_report(report), calls, export_dir, formats,
        float_model=float_model, force=force, say=say,
    )  # fmt: skip
