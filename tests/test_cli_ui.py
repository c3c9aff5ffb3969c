"""The piped progress log (opsnn_quant.cli._ui.LineReporter): one line per phase, counts only
where they say something."""

from __future__ import annotations

import io
import re

from opsnn_quant.cli._ui import LineReporter


def test_phases_are_lines_and_a_single_item_count_is_not():
    out = io.StringIO()
    rep = LineReporter(out)
    rep.phase("loading")
    rep.start(1, "batch")
    rep.advance()
    rep.phase("probing")
    rep.start(3, "batch")
    rep.advance(3)
    rep.phase("quantizing")
    rep.start(None, "module")
    rep.advance(2)
    rep.close()
    lines = out.getvalue().splitlines()
    assert [re.sub(r"^\[\s*[\d.]+ s\] ", "", ln).strip() for ln in lines] == [
        "loading", "probing", "3/3 batches", "quantizing", "2 modules",
    ]  # fmt: skip


def test_on_a_terminal_finished_phases_stay_and_80_columns_keep_the_counters():
    from rich.console import Console

    from opsnn_quant.cli._ui import RichReporter, progress_bar

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    bar = progress_bar(console)
    rep = RichReporter(bar)
    with bar:
        rep.phase("loading the calibration data")
        rep.phase("end-to-end attribution: audio_encoder (24 modules, 2 replayed calls) " * 2)
        rep.start(7, "batch")
        rep.advance(3)
        bar.refresh()
        live = out.getvalue()
        rep.close()
    text = out.getvalue()
    # the finished phases stay, each with its start and duration
    assert re.search(r"\[\s*0\.\d s\] loading the calibration data \(\d+\.\d s\)", text)
    assert re.search(r"end-to-end attribution: audio_encoder .* \(\d+\.\d s\)", text)
    # the live line of a long phase keeps the count at 80 columns (its description shrinks)
    assert "3/7" in live


def test_a_phase_without_counted_work_shows_no_count():
    from rich.progress import Progress

    from opsnn_quant.cli._ui import CountColumn

    bar = Progress(CountColumn())
    task = bar.add_task("attribution", total=None)
    assert CountColumn().render(bar.tasks[task]).plain == ""
    bar.advance(task, 2)
    assert CountColumn().render(bar.tasks[task]).plain == "2"
    bar.update(task, total=5)
    assert CountColumn().render(bar.tasks[task]).plain == "2/5"


def test_the_calibrate_summary_fits_80_columns_with_both_int8_shares():
    from pathlib import Path

    from rich.console import Console

    from opsnn_quant.cli.calibrate import _summary_table
    from opsnn_quant.pipeline.calibrate import CalibrateResult
    from opsnn_quant.policy.summary import ModalitySummaryRow as Row
    from opsnn_quant.types import Modality

    rows = [
        Row(Modality.AUDIO_ENCODER, "int8", 0, 0, 2, 100, 35.5, 1.0, 0.575),
        Row(Modality.IMAGE_DECODER, "int8", 0, 0, 28, 25, 35.5, 0.999, 0.998),
        Row(Modality.OTHER, "fp16", 0, 0, 38, 0, None, 0.0, None),  # not counted: "-"
    ]
    result = CalibrateResult(Path("out"), rows, {Modality.AUDIO_ENCODER: {"sqnr_db": 34.9}})
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(_summary_table("whisper", "ascend910b-vllm-ascend", result))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    cells = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    # the encoder: every Linear in int8, 57.5 % of all its MACs (its convolutions, attention)
    assert [c.strip() for c in cells["audio_encoder"].split("│")[7:10]] == [
        "35.5/34.9", "100%", "57%",
    ]  # fmt: skip
    assert [c.strip() for c in cells["image_decoder"].split("│")[8:10]] == [">99%", ">99%"]
    assert [c.strip() for c in cells["other"].split("│")[7:10]] == ["-/-", "0%", "-"]


def test_the_attention_line_names_each_modality_whose_attention_was_measured() -> None:
    from types import SimpleNamespace

    from opsnn_quant.cli.calibrate import attention_line
    from opsnn_quant.policy.summary import ModalitySummaryRow
    from opsnn_quant.types import Modality

    def row(modality: Modality, attention: float | None) -> ModalitySummaryRow:
        return ModalitySummaryRow(modality, "int8", 0, 0, 1, 2, None, 0.5, 0.4, attention)

    rows = [
        row(Modality.TEXT_ENCODER, 1.0),
        row(Modality.DENOISER, 0.75),
        row(Modality.OTHER, None),
    ]
    line = attention_line(SimpleNamespace(rows=rows))  # type: ignore[arg-type]
    assert line == "attention MACs in int8 (a8): text_encoder 100%, denoiser 75%"
    assert attention_line(SimpleNamespace(rows=rows[2:])) is None  # type: ignore[arg-type]
