"""``opsnn-quant calibrate`` and ``opsnn-quant probe``.

Every input (recipe, strategy, engine, suite, output path, data) is checked before a model is
loaded; the work itself is :func:`opsnn_quant.pipeline.calibrate.run_calibrate` and
:func:`opsnn_quant.pipeline.probe.run_probe_job`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opsnn_quant import distributed as dist
from opsnn_quant.cli import _ui
from opsnn_quant.core.numerics import fmt_db, fmt_share
from opsnn_quant.formats.calibrate_output import PROBE_FILE, TIMINGS_FILE

if TYPE_CHECKING:
    from opsnn_quant.pipeline.calibrate import CalibrateResult
    from opsnn_quant.pipeline.probe import ProbeJob
    from opsnn_quant.pipeline.recipe import Recipe
    from opsnn_quant.pipeline.run import CalibrateRun
    from opsnn_quant.pipeline.sharing import Sharing
    from opsnn_quant.probe.report import Fp16Stats, SensitivityReport

FORCE_HELP = _ui.FORCE_HELP
DEVICE_HELP = "place the model on cpu | npu | npu:N | cuda:N [default: the recipe's, else cpu]"
DTYPE_HELP = "load the model in float32 | float16 | bfloat16 [default: the recipe's, else float32]"
# The placement options calibrate and probe share.
DeviceOpt = Annotated[str | None, typer.Option(help=DEVICE_HELP)]
DtypeOpt = Annotated[str | None, typer.Option(help=DTYPE_HELP)]
AllowPickleOpt = Annotated[bool, typer.Option("--allow-pickle", help=_ui.ALLOW_PICKLE_HELP)]
# Which column and split of a datasets source (calibrate and probe).
DataColumnOpt = Annotated[
    str | None,
    typer.Option(
        help="column of a datasets source [default: audio, else prompt/text/caption/sentence]"
    ),
]
SplitOpt = Annotated[str | None, typer.Option(help="split of a datasets source [default: train]")]
# Sharing the probe's statistics pass among processes (calibrate and probe).
NprocOpt = Annotated[
    int | None, typer.Option("--nproc", help=_ui.NPROC_HELP.format(command="calibrate/probe"))
]
DistBackendOpt = Annotated[str | None, typer.Option("--dist-backend", help=_ui.DIST_BACKEND_HELP)]
MaxMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        help="host memory a model call may take, e.g. 64GiB: a diffusion pipeline's sizes "
        "whose floor exceeds it are refused before loading [default: what is free]; the "
        "model's blocks beyond it are also offloaded to disk, one block in memory at a time "
        "(same files; calibrate also reads a recipe's model.max_memory)",
    ),
]
FAIL_EXIT = 3  # --evaluate's FAIL; INCONCLUSIVE exits 4 (as evaluate: verdict_exit_code)
# calibrate's own arguments and options
RecipeArg = Annotated[
    str | None,
    typer.Argument(
        help="recipe YAML path or built-in name [default: shapes-t2i, or none with --model]"
    ),
]
OutOpt = Annotated[
    Path | None, typer.Option("-o", "--out", help="output directory [default: out/NAME]")
]
ForceOpt = Annotated[bool, typer.Option("--force", help=FORCE_HELP)]
SeedOpt = Annotated[int | None, typer.Option(help="override the recipe's seed")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress display")]
EngineOpt = Annotated[
    str, typer.Option(help="opsnn (exact Ascend arithmetic) or amct (needs CANN's AMCT)")
]
EvaluateOpt = Annotated[
    str | None,
    typer.Option(
        "--evaluate",
        help="acceptance suite to run after (exit 3 on FAIL, 4 on INCONCLUSIVE)",
    ),
]
StrategyOpt = Annotated[
    str | None,
    typer.Option(
        help="override the recipe: search | all-w8a8-minmax | all-w8a8-dynamic | "
        "all-w8a8-minmax-a8 | all-w8a8-dynamic-a8 | all-fp16"
    ),
]
SearchOpt = Annotated[
    str | None,
    typer.Option(
        help="override the recipe's search: first (measure the naive full-coverage baselines "
        "first; the estimators only where none meets the budget) | full (always the estimators)"
    ),
]
LatencyOpt = Annotated[
    str,
    typer.Option(help="with --evaluate, what to time: target | all | none (see evaluate)"),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="the model (a directory or zoo:NAME): no recipe needed, or over the recipe's"
    ),
]
DataOpt = Annotated[str | None, typer.Option(help="calibration data source (over the recipe's)")]
TargetOpt = Annotated[
    str | None,
    typer.Option(help="deployment target [default: the recipe's, or the family's engine]"),
]
FamilyOpt = Annotated[str | None, typer.Option(help="model family with --model [default: guessed]")]
LimitOpt = Annotated[int | None, typer.Option(help="use the first N calibration samples")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="model setting KEY=VALUE (repeatable), e.g. steps=20"),
]
HoldoutOpt = Annotated[
    str | None,
    typer.Option(
        help="held-out data the quantized model is measured on (over the recipe's "
        "data.holdout; same forms as --data)"
    ),
]
BudgetOpt = Annotated[
    str | None,
    typer.Option(
        "--budget",
        help="the recipe's budget, replaced: a YAML file or inline YAML, e.g. "
        "'{metric: {suite: whisper-tiny-en, wer_delta_max_points: 0.5}}'",
    ),
]
FromProbeOpt = Annotated[
    Path | None,
    typer.Option(
        "--from-probe",
        help="reuse an earlier probe (a probe/calibrate output or its probe.json) made "
        "with the same settings on the same model and data",
    ),
]
AllowBrokenBaselineOpt = Annotated[
    bool,
    typer.Option(
        "--allow-broken-baseline",
        help="with --evaluate: judge the candidate even when the float baseline is broken "
        "(outputs mostly empty, flat or one token repeated, WER above 100%, NaN)",
    ),
]
ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="go on from the phases (probe, policy) an interrupted run of the same command "
        "finished; a run without it starts over",
    ),
]


# One line when a run measured nothing beyond the probe's estimates (an own model without a
# recipe, typically): what was not checked and how to check it.
UNJUDGED = (
    "note: nothing was judged: no held-out data (--holdout SRC), no measured budget "
    "(--budget '{metric: {suite: SUITE, ...}}') and no acceptance suite (--evaluate SUITE); "
    "the policy rests on the probe's estimates alone"
)


def _summary_table(name: str, target: str, result: CalibrateResult) -> _ui.Table:
    columns = [("modality", "left"), ("chosen", "left")]
    columns += [(c, "right") for c in ("fp32", "bf16", "fp16", "int8", "pred/meas", "MAC%", "all%")]
    t = _ui.table(
        f"{name}: policy for {target}",
        columns,
        caption="module counts per precision; pred/meas: predicted / measured SQNR of the "
        "modality's output, dB (cpu-reference backend); MAC%: share of the Linear/Conv2d MACs in "
        "int8 (the layers a target runs in int8; with attention's SDPA where the target runs "
        "int8 attention); all%: share of all the modality's MACs in int8, counting also "
        "Conv1d/Conv3d and the attention the target runs in float",
    )
    for row in result.rows:
        measured = result.measured.get(row.modality, {}).get("sqnr_db")
        pred, meas = (fmt_db(v, unit="", none="-") for v in (row.predicted_sqnr_db, measured))
        t.add_row(
            row.modality.value, row.chosen, str(row.fp32), str(row.bf16), str(row.fp16),
            str(row.int8), f"{pred}/{meas}", fmt_share(row.int8_mac_share),
            "-" if row.int8_share_of_all_macs is None else fmt_share(row.int8_share_of_all_macs),
        )  # fmt: skip
    return t


def attention_line(result: CalibrateResult) -> str | None:
    """The share of each modality's attention MACs in int8, where the probe measured attention
    for int8 (a target that runs it; None elsewhere): a line under the table, which has no
    room for a tenth column in 80."""
    parts = [
        f"{row.modality.value} {fmt_share(row.attention_int8_share)}"
        for row in result.rows
        if row.attention_int8_share is not None
    ]
    return f"attention MACs in int8 (a8): {', '.join(parts)}" if parts else None


PROBE_NAME_WIDTH = 24  # 80 columns: module 24, type 10, fp16 9, int8, e2e, rank, borders


def _fp16_cell(fp16: Fp16Stats | None) -> str:
    """``ok``, or ``ovf`` with the larger of the module's fp32 input/output maxima (``1.2e6``:
    two digits and the exponent, to fit 80 columns; ``probe.json`` has the exact figure)."""
    if fp16 is None or not fp16.overflow:
        return "ok"
    peak = max(fp16.input_absmax, fp16.output_absmax)
    if peak < 1e4:
        return f"ovf {peak:.3g}"
    mantissa, exponent = f"{peak:.1e}".split("e")
    return f"ovf {mantissa}e{int(exponent)}"


def _short(text: str, width: int = 10) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def overflow_lines(report: SensitivityReport) -> list[str]:
    """One line per module the probe found overflowing fp16 (or too close), with its reasons."""
    return [
        f"fp16 {m.name}: {'; '.join(m.fp16.reasons) or 'overflow'}"
        for m in report.modules
        if m.fp16 is not None and m.fp16.overflow
    ]


def _probe_table(report: SensitivityReport) -> _ui.Table:
    t = _ui.table(
        f"{report.model}: riskiest modules per modality ({report.backend})",
        [("module", "left"), ("type", "left"), ("fp16", "left")]
        + [(c, "right") for c in ("int8", "e2e", "rank")],
        caption="fp16: ovf |x|max = overflows or too little headroom (why: below the table); "
        "int8: best local SQNR, dB; e2e: share of the modality's estimated int8 output noise",
        first_width=PROBE_NAME_WIDTH,
    )
    for modality, summary in report.modalities.items():
        t.add_row(
            f"[b]{modality}[/b]: {summary.modules} modules, {summary.overflowing} overflow; "
            f"all-int8 pred. {fmt_db(summary.predicted_sqnr_db_all_w8a8, none='-')}",
            end_section=True,
        )
        mods = [
            m
            for m in report.by_modality(modality)
            if m.e2e is not None or (m.fp16 and m.fp16.overflow)
        ]
        mods.sort(key=lambda m: (not (m.fp16 and m.fp16.overflow), m.e2e.rank if m.e2e else 10**9))
        total = sum(m.e2e.contribution for m in report.by_modality(modality) if m.e2e) or 1.0
        for m in mods[:5]:
            best = max((s.sqnr_db for s in m.w8a8.values() if s.sqnr_db is not None), default=None)
            t.add_row(
                _ui.wrap_name(m.name, PROBE_NAME_WIDTH), _short(m.type), _fp16_cell(m.fp16),
                fmt_db(best, unit="", none="-"), f"{m.e2e.contribution / total:.0%}" if m.e2e else "-",
                str(m.e2e.rank) if m.e2e else "-",
                end_section=m is mods[min(len(mods), 5) - 1],
            )  # fmt: skip
    return t


def calibrate(
    recipe: RecipeArg = None,
    out: OutOpt = None,
    force: ForceOpt = False,
    seed: SeedOpt = None,
    quiet: QuietOpt = False,
    engine: EngineOpt = "opsnn",
    evaluate: EvaluateOpt = None,
    strategy: StrategyOpt = None,
    search: SearchOpt = None,
    latency: LatencyOpt = "target",
    model: ModelOpt = None,
    data: DataOpt = None,
    target: TargetOpt = None,
    family: FamilyOpt = None,
    limit: LimitOpt = None,
    sets: SetOpt = None,
    data_column: DataColumnOpt = None,
    split: SplitOpt = None,
    holdout: HoldoutOpt = None,
    budget: BudgetOpt = None,
    from_probe: FromProbeOpt = None,
    allow_broken_baseline: AllowBrokenBaselineOpt = False,
    resume: ResumeOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    allow_pickle: AllowPickleOpt = False,
    nproc: NprocOpt = None,
    dist_backend: DistBackendOpt = None,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Probe, decide the policy, quantize, save and export: OUT/probe.json, policy.yaml,
    quant/, export/ (and report/ with --evaluate), OUT/recipe.yaml (the effective recipe, to
    repeat the run); wall-clock times in OUT/timings.json.

    Under torchrun (or with --nproc) the probe's statistics pass is shared by rank (whole
    batches each, merged exactly); rank 0 does the rest and writes."""
    from opsnn_quant.core.user_config import check_seed
    from opsnn_quant.models.footprint import parse_size
    from opsnn_quant.pipeline.recipe_flags import RecipeEdits, RecipeFlags, effective_recipe

    check_seed(seed)  # the flag's own message (the run checks a Python caller's seed too)
    memory = parse_size(max_memory) if max_memory is not None else None
    edits = RecipeEdits(device, dtype, strategy, allow_pickle, memory, search)
    flags = RecipeFlags(model, data, family, target, limit, tuple(sets or ()), data_column, split,
                        holdout, budget)  # fmt: skip
    r = edits.apply(effective_recipe(recipe, flags))  # 1. the recipe the command line means
    out = out if out is not None else Path("out") / r.name
    # a setting's message names the flag where settings came from flags (as probe's does)
    where = "--set " if sets or recipe is None else "model.settings."
    command = CalibrateCommand(r, out, recipe, seed, engine, evaluate, force, latency,
                               from_probe, allow_broken_baseline, resume, where)  # fmt: skip
    result = command.launch(quiet, nproc, dist_backend, dtype)  # 2. the run, in its processes
    if result is not None:  # 3. what it did (rank 0)
        print_calibrate(result, command, quiet)


@dataclasses.dataclass(frozen=True)
class CalibrateCommand:
    """One ``calibrate`` command's recipe and options, before they are resolved (rank 0
    resolves them once: :meth:`resolve`)."""

    recipe: Recipe
    out: Path
    recipe_arg: str | None
    seed: int | None
    engine: str
    suite: str | None
    force: bool
    latency: str
    from_probe: Path | None
    allow_broken_baseline: bool
    resume: bool
    settings_where: str = "model.settings."

    def resolve(self, *, distributed: bool) -> CalibrateRun:
        """The run, every name resolved and everything checked before any load (the recipe
        file is one of its inputs: no output replaces it)."""
        from opsnn_quant.pipeline.recipe import resolve_recipe
        from opsnn_quant.pipeline.run import resolve_run

        read = [str(resolve_recipe(self.recipe_arg))] if self.recipe_arg is not None else []
        return resolve_run(
            self.recipe, self.out, seed=self.seed, engine=self.engine, suite=self.suite,
            force=self.force, latency=self.latency, from_probe=self.from_probe,
            allow_broken_baseline=self.allow_broken_baseline, resume=self.resume, inputs=read,
            distributed=distributed, settings_where=self.settings_where,
        )  # fmt: skip

    def launch(
        self, quiet: bool, nproc: int | None, backend: str | None, dtype: str | None
    ) -> CalibrateResult | None:
        """The run in its processes: ``nproc`` of them started here (``--nproc``: this one
        waits and exits with their code), or this one alone or as a rank of torchrun's.
        Returns the result on rank 0 (None on the other ranks).

        Raises:
            OpsnnQuantError: bad input, refused before any process starts where it can be.
        """
        from opsnn_quant.pipeline.calibrate import contribute_statistics
        from opsnn_quant.pipeline.run import check_offload_unshared
        from opsnn_quant.pipeline.sharing import Sharing

        r = self.recipe
        check_offload_unshared(r.model.max_memory, nproc is not None or dist.launched())
        if nproc is not None and not dist.launched():
            check_launch(r.model.device, nproc, backend)
            self.resolve(distributed=True)  # refused here, before the processes start
            calib = r.data.load(r.data.calibration, r.data.limit)
            records = min(len(calib), r.probe.data_limit or len(calib))
            batch = int(getattr(r.model.settings, "batch_size", 1) or 1)
            raise typer.Exit(launch(nproc, records, batch))
        world = dist.init_world(r.model.device, backend)
        try:
            run = self
            if world.distributed:  # each rank loads the model on its own device
                run = dataclasses.replace(self, recipe=r.with_placement(world.device, dtype))
            sharing = Sharing.of(world) if world.distributed else None
            if sharing is None or world.is_main:
                return run.main(quiet, sharing)
            seed = self.seed
            sharing.lockstep.run(lambda: contribute_statistics(run.recipe, sharing, seed=seed))
            return None
        finally:
            dist.finish_world()

    def main(self, quiet: bool, sharing: Sharing | None) -> CalibrateResult:
        """Resolve and run (rank 0 of a distributed run: alone after the shared statistics,
        meeting the others when done)."""

        def work() -> CalibrateResult:
            from opsnn_quant.pipeline.calibrate import execute_calibrate

            run = self.resolve(distributed=sharing is not None)
            with _ui.reporter(quiet) as rep, dist.alone():
                result = execute_calibrate(run, progress=rep.phase, sharing=sharing)
            if sharing is not None:
                sharing.done()
            return result

        return work() if sharing is None else sharing.lockstep.run(work)


def print_calibrate(result: CalibrateResult, command: CalibrateCommand, quiet: bool) -> None:
    """What a finished calibrate did: the summary table, the search's rounds and the MAC
    shares (the path written alone with ``quiet``), then the acceptance verdict.

    Raises:
        typer.Exit: the acceptance run did not PASS (its verdict's exit code).
    """
    r, out, suite = command.recipe, command.out, command.suite
    if not quiet:
        _ui.print_table(_summary_table(r.name, r.target, result))
        attention = attention_line(result)
        if attention is not None:
            _ui.console.print(attention)
        for line in result.search.notes(timed=True) if result.search else []:
            _ui.console.print(line)
        if result.decision is not None:  # decided first: what decided, what did not run
            _ui.console.print(result.decision)
        for line in share_lines(result, r.target):
            _ui.console.print(line)
        _ui.console.print(
            f"{overall_line(result)}; wall time {result.seconds['total']:.0f} s; wrote {out}/"
        )
    else:  # quiet: still the path of what was written (and the verdict below)
        typer.echo(f"wrote {out}/")
    if suite is None and r.data.holdout is None and r.budget.metric is None:
        typer.echo(UNJUDGED, err=True)
    if result.verdict is not None:
        typer.echo(f"acceptance ({suite}): {result.verdict}; report in {out}/report/")
        for line in result.next_steps:
            typer.echo(line)
        if result.verdict != "PASS":
            from opsnn_quant.evaluation.report_schema import verdict_exit_code

            raise typer.Exit(verdict_exit_code(result.verdict))


def share_lines(result: CalibrateResult, target: str) -> list[str]:
    """One line per written artifact: the share of the MACs it deploys in int8."""
    own = result.target.export if result.target is not None else None
    lines = []
    for fmt, shares in result.deployed.items():
        whose = f" ({target}'s engine loads it)" if fmt == own else ""
        lines.append(
            f"int8 MAC share as written in export/{fmt}: {fmt_share(shares['overall'])}{whose}"
        )
    return lines


def overall_line(result: CalibrateResult) -> str:
    """The int8 share of the Linear/Conv2d MACs (and attention's, where the probe measured it
    for int8), and of all the model's MACs where counted."""
    share = "-" if result.int8_mac_share is None else fmt_share(result.int8_mac_share)
    every = result.int8_share_of_all_macs
    # the two weigh the modalities differently (see opsnn_quant.policy.summary): said so
    of_all = "" if every is None else f"; {fmt_share(every)} of all MACs over the run"
    attention = any(row.attention_int8_share is not None for row in result.rows)
    kinds = "Linear/Conv2d/SDPA" if attention else "Linear/Conv2d"
    return f"int8 MAC share overall: {share} of the {kinds} MACs per forward call{of_all}"


def check_launch(device: str, nproc: int, backend: str | None) -> None:
    """``--nproc N`` on this host: N devices of the recipe's kind, a backend that runs on it.

    Raises:
        ConfigError: too few devices, or a backend that does not run on them.
    """
    kind = device.split(":")[0]
    dist.check_devices(kind, nproc)
    dist.check_backend(backend or {"npu": "hccl", "cuda": "nccl"}.get(kind, "gloo"))


def launch(nproc: int, records: int, batch: int) -> int:
    """``--nproc N``: the command again in N processes on this host (torchrun's elastic
    agent), after checking that each gets a batch of the ``records`` calibration records (in
    batches of ``batch``); returns the run's exit code."""
    from opsnn_quant.pipeline.sharing import check_processes

    check_processes(nproc, records, batch)
    return _ui.relaunch(nproc)


def probe_cmd(
    target: Annotated[
        str,
        typer.Argument(help="recipe (path or built-in name) or a model (zoo:<name> or directory)"),
    ],
    out: Annotated[Path, typer.Option("-o", "--out", help="output directory for probe.json")],
    data: Annotated[
        str | None, typer.Option(help="calibration data source (needed when TARGET is a model)")
    ] = None,
    family: Annotated[
        str | None,
        typer.Option(help="model family when TARGET is a model (default: guessed)"),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="use the first N calibration samples")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE model setting (e.g. max_new_tokens=32), checked like a recipe's "
            "model.settings; repeatable",
        ),
    ] = None,
    data_column: DataColumnOpt = None,
    split: SplitOpt = None,
    exhaustive: Annotated[
        bool, typer.Option(help="also run the one-module-at-a-time attribution (slow)")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    allow_pickle: AllowPickleOpt = False,
    nproc: NprocOpt = None,
    dist_backend: DistBackendOpt = None,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Write OUT/probe.json: fp16 overflow, int8 sensitivity, end-to-end attribution (and
    OUT/timings.json: wall-clock times).

    Under torchrun (or with --nproc) the statistics pass is shared by rank (whole batches
    each, merged exactly); rank 0 does the rest and writes."""
    from opsnn_quant.models.footprint import parse_size
    from opsnn_quant.pipeline.probe import check_probe, probe_recipe
    from opsnn_quant.pipeline.run import check_offload_unshared

    budget = parse_size(max_memory) if max_memory is not None else None
    check_offload_unshared(budget, nproc is not None or dist.launched())

    recipe = probe_recipe(target)  # read once: its device, then its fields

    def check(on: str | None) -> ProbeJob:
        return check_probe(target, recipe, out, data, family, limit, set_ or [], exhaustive, on,
                           dtype, allow_pickle, force, column=data_column, split=split,
                           max_memory=budget)  # fmt: skip

    if nproc is not None and not dist.launched():
        job = check(device)
        records = _probe_records(job)
        batch = int(job.settings.get("batch_size", 1) or 1)
        check_launch(job.device, nproc, dist_backend)
        raise typer.Exit(launch(nproc, records, batch))
    world = dist.init_world(device or (recipe.model.device if recipe else "cpu"), dist_backend)
    try:
        if world.distributed:  # rank 0 checks (the one writer); each rank its own device
            job = dataclasses.replace(
                world.from_main(lambda: check(world.device)), device=world.device
            )
        else:
            job = check(device)
        report = _probe_ranks(job, quiet or not world.is_main, world)
    finally:
        dist.finish_world()
    if report is None:  # a rank but 0: rank 0 printed
        return
    if not quiet:
        _ui.print_table(_probe_table(report))
        for line in overflow_lines(report):  # whole lines: a log reader greps them
            _ui.console.print(line, markup=False, soft_wrap=True)
        _ui.console.print(f"wrote {out / PROBE_FILE}, {out / TIMINGS_FILE}")


def _probe_records(job: ProbeJob) -> int:
    from opsnn_quant.models.data import load_records

    return len(load_records(job.data, job.limit, column=job.column, split=job.split))


def _probe_ranks(job: ProbeJob, quiet: bool, world: dist.World) -> SensitivityReport | None:
    """The probe job on this rank: the whole job in one process; rank 0's part (pass 1 over
    its share, the rest alone) or another rank's (pass 1 over its share) under torchrun."""
    from opsnn_quant.pipeline.probe import contribute_probe, run_probe_job
    from opsnn_quant.pipeline.sharing import Sharing

    if not world.distributed:
        with _ui.reporter(quiet) as rep:
            return run_probe_job(job, progress=rep.phase)
    sharing = Sharing.of(world)
    if not world.is_main:
        sharing.lockstep.run(lambda: contribute_probe(job, sharing))
        return None

    def work() -> SensitivityReport:
        with _ui.reporter(quiet) as rep, dist.alone():
            report = run_probe_job(job, progress=rep.phase, sharing=sharing)
        sharing.done()
        return report

    return sharing.lockstep.run(work)


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` and ``probe`` to ``app``."""
    app.command("calibrate")(calibrate)
    app.command("probe")(probe_cmd)
