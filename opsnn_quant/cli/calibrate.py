"""``opsnn-quant calibrate`` and ``opsnn-quant probe``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from opsnn_quant.cli._ui import console, phases


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` and ``probe`` to ``app``."""

    @app.command("calibrate")
    def calibrate(
        recipe: Annotated[
            str, typer.Argument(help="recipe YAML path or built-in name")
        ] = "shapes-t2i",
        out: Annotated[Path, typer.Option("-o", "--out", help="output directory")] = Path(
            "out/shapes-t2i"
        ),
        seed: Annotated[int | None, typer.Option(help="override the recipe's seed")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress display")] = False,
        engine: Annotated[
            str, typer.Option(help="opsnn (exact Ascend arithmetic) or amct (needs CANN's AMCT)")
        ] = "opsnn",
        evaluate: Annotated[
            str | None, typer.Option("--evaluate", help="acceptance suite to run after calibration")
        ] = None,
        strategy: Annotated[
            str | None,
            typer.Option(help="override the recipe: search | all-w8a8-minmax | all-fp16"),
        ] = None,
    ) -> None:
        """Probe, decide the policy, quantize, save and export (OUT/ as in DESIGN.md)."""
        from opsnn_quant.errors import ConfigError

        if engine not in ("opsnn", "amct"):
            raise ConfigError(f"--engine must be opsnn or amct, got {engine!r}")
        from opsnn_quant.recipe import load_recipe
        from opsnn_quant.workflow import fmt_db, run_calibrate

        r = load_recipe(recipe)
        if strategy is not None:
            from opsnn_quant.policy.baselines import STRATEGIES

            if strategy not in STRATEGIES:
                raise ConfigError(
                    f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
                )
            r = r.model_copy(update={"strategy": strategy})
        if out == Path("out/shapes-t2i") and r.name != "shapes-t2i":
            out = Path("out") / r.name
        with phases(quiet) as say:
            result = run_calibrate(r, out, seed=seed, progress=say, engine=engine, suite=evaluate)
        table = Table(title=f"{r.name}: policy for {r.target} (errors: cpu-reference backend)")
        for col in (
            "modality",
            "chosen",
            "fp32",
            "bf16",
            "fp16",
            "int8",
            "pred. dB",
            "meas. dB",
            "int8 MACs",
        ):
            table.add_column(col, no_wrap=True)
        for row in result.rows:
            measured = result.measured.get(row.modality, {}).get("sqnr_db")
            table.add_row(
                row.modality.value,
                row.chosen,
                str(row.fp32),
                str(row.bf16),
                str(row.fp16),
                str(row.int8),
                fmt_db(row.predicted_sqnr_db),
                fmt_db(measured),
                f"{row.int8_mac_share:.0%}",
            )
        if not quiet:
            console.print(table)
            share = "-" if result.int8_mac_share is None else f"{result.int8_mac_share:.0%}"
            console.print(
                f"int8 MAC share overall: {share}; wall time {result.seconds['total']:.0f} s; wrote {out}/"
            )

    @app.command("probe")
    def probe_cmd(
        target: Annotated[
            str,
            typer.Argument(
                help="recipe (path or built-in name) or a model (zoo:<name> or directory)"
            ),
        ],
        out: Annotated[Path, typer.Option("-o", "--out", help="output directory for probe.json")],
        data: Annotated[
            str | None, typer.Option(help="calibration data source (when TARGET is a model)")
        ] = None,
        family: Annotated[
            str | None, typer.Option(help="model family (when TARGET is a model)")
        ] = None,
        limit: Annotated[
            int | None, typer.Option(help="use the first N calibration samples")
        ] = None,
        exhaustive: Annotated[
            bool, typer.Option(help="also run the one-module-at-a-time attribution")
        ] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    ) -> None:
        """Write OUT/probe.json: fp16 overflow, int8 sensitivity, end-to-end attribution."""
        from opsnn_quant.errors import ConfigError
        from opsnn_quant.io import atomic_dir
        from opsnn_quant.models import guess_family, load_adapter
        from opsnn_quant.models.data import load_records
        from opsnn_quant.probe.api import ProbeConfig, probe
        from opsnn_quant.recipe import builtin_recipes, load_recipe
        from opsnn_quant.workflow import fmt_db, seed_everything

        is_recipe = target.endswith((".yaml", ".yml")) or target in builtin_recipes()
        if is_recipe:
            r = load_recipe(target)
            adapter = load_adapter(r.model.family, r.model.source, **r.model.settings)
            records = load_records(
                data or r.data.calibration, limit or r.probe.data_limit or r.data.limit
            )
            cfg = ProbeConfig(
                min_headroom=r.probe.min_headroom,
                max_root_calls=r.probe.max_root_calls,
                estimator_batch=r.probe.estimator_batch,
                estimator=r.probe.estimator,
                exhaustive=exhaustive or r.probe.exhaustive,
                seed=r.seed,
            )
        else:
            if data is None:
                raise ConfigError("probing a model needs --data (e.g. zoo:shapes/calibration)")
            adapter = load_adapter(family or guess_family(target), target)
            records = load_records(data, limit)
            cfg = ProbeConfig(exhaustive=exhaustive)
        seed_everything(cfg.seed)
        with phases(quiet) as say, atomic_dir(out) as tmp:
            report = probe(adapter, adapter.forward_loop(records), cfg, progress=say)
            report.save(tmp / "probe.json")
        if quiet:
            return
        table = Table(
            title=f"{report.model}: riskiest modules per modality (backend: {report.backend})"
        )
        for col in ("modality", "module", "type", "fp16", "best int8 SQNR dB", "e2e share", "rank"):
            table.add_column(col)
        for modality, summary in report.modalities.items():
            mods = [
                m
                for m in report.by_modality(modality)
                if m.e2e is not None or (m.fp16 and m.fp16.overflow)
            ]
            mods.sort(
                key=lambda m: (not (m.fp16 and m.fp16.overflow), m.e2e.rank if m.e2e else 10**9)
            )
            total = sum(m.e2e.contribution for m in report.by_modality(modality) if m.e2e) or 1.0
            for m in mods[:5]:
                best = max(
                    (s.sqnr_db for s in m.w8a8.values() if s.sqnr_db is not None), default=None
                )
                table.add_row(
                    modality,
                    m.name,
                    m.type,
                    "OVERFLOW" if m.fp16 and m.fp16.overflow else "ok",
                    fmt_db(best),
                    f"{m.e2e.contribution / total:.0%}" if m.e2e else "-",
                    str(m.e2e.rank) if m.e2e else "-",
                )
            table.add_row(
                f"[b]{modality}[/b]",
                f"{summary.modules} modules, {summary.overflowing} overflow",
                "",
                "",
                f"median {fmt_db(summary.median_sqnr_db)}",
                f"all-int8 predicted {fmt_db(summary.predicted_sqnr_db_all_w8a8)} dB",
                "",
                end_section=True,
            )
        console.print(table)
        console.print(f"wrote {out}/probe.json")
