"""``opsnn-quant export-weights``: deployable outputs from a calibrate output
(:mod:`opsnn_quant.pipeline.export_weights`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opsnn_quant.cli import _ui
from opsnn_quant.formats.registry import exporters

_MODEL = [e.name for e in exporters("model")]  # the format table's model exports, in its order


def export_weights(
    out: Annotated[Path, typer.Argument(help="calibrate output directory (holds quant/)")],
    fmt: Annotated[
        list[str] | None,
        typer.Option(
            "--format", "-f", help=f"{' | '.join(_MODEL)}; repeatable [default: {_MODEL[0]}]"
        ),
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
        bool, typer.Option("--force", help=_ui.FORCE_HELP.replace("OUT", "an export"))
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    allow_pickle: Annotated[
        bool, typer.Option("--allow-pickle", help=_ui.ALLOW_PICKLE_HELP)
    ] = False,
) -> None:
    """Write AscendV1 weights, MindIE-SD weights and/or ATC/AOE commands from a calibrate
    output."""
    from opsnn_quant.pipeline.export_weights import check_export_weights, run_export_weights

    job = check_export_weights(
        out, fmt, dest, data=data, limit=limit, force=force, allow_pickle=allow_pickle
    )
    with _ui.phases(quiet) as say:
        notes = run_export_weights(job, progress=say)
    if not quiet:
        for note in notes:
            typer.echo(f"note: {note}", err=True)
        _ui.console.print(f"wrote {', '.join(str(job.export_dir / f) for f in job.formats)}")


def register(app: typer.Typer) -> None:
    """Add ``export-weights`` to ``app``."""
    app.command("export-weights")(export_weights)
