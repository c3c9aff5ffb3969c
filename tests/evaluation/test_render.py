"""report.json/.md/.html and plots on disk; the HTML is self-contained and renders in Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from opsnn_quant.evaluation.render import render_html, render_markdown, write_report
from opsnn_quant.evaluation.report import AcceptanceReport
from opsnn_quant.io import MARKER, atomic_dir
from opsnn_quant.policy.targets import get_target
from tests.evaluation.sample_report import asr_report, t2i_report

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="module")
def t2i_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    report, base, cand = t2i_report()
    out = tmp_path_factory.mktemp("r") / "report"
    with atomic_dir(out, "report") as earlier:  # an earlier report
        (earlier / "stale.txt").write_text("previous run")  # replaced atomically, not merged
    return write_report(report, out, baseline_images=base, candidate_images=cand, max_pairs=3)


def test_files_written(t2i_dir: Path):
    names = sorted(p.relative_to(t2i_dir).as_posix() for p in t2i_dir.rglob("*") if p.is_file())
    assert names == [
        MARKER, "plots/latency.png", "plots/pair-0000.png", "plots/pair-0001.png", "plots/pair-0003.png",
        "plots/sensitivity.png", "report.html", "report.json", "report.md",
    ]  # fmt: skip
    for png in (t2i_dir / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = AcceptanceReport.load(t2i_dir / "report.json")
    # Worst PSNR first; the 3 worst have images, the identical pair (index 2) does not.
    psnrs = [p.psnr_db for p in back.image_pairs]
    assert psnrs == sorted(psnrs) and back.image_pairs[-1].index == 2  # pair 2 is identical
    assert [p.image is not None for p in back.image_pairs] == [True, True, True, False]
    assert back.image_pairs[0].image == f"plots/pair-{back.image_pairs[0].index:04d}.png"


def test_html_is_self_contained(t2i_dir: Path):
    text = (t2i_dir / "report.html").read_text()
    assert not re.search(r"(?:src|href)\s*=\s*['\"](?!data:)", text), "only data: URIs allowed"
    assert "http://" not in text and "https://" not in text and "<script" not in text
    assert text.count("data:image/png;base64,") == 2 + 3  # two plots, three pairs
    assert "a blue &lt;square&gt; &amp; co" in text  # prompts are escaped
    assert "FAIL" in text and "cpu-reference" in text
    # the pairs: a grid of small strips after every table, not a column of full-width images
    pairs = text.index("<div class='pairs'>")
    assert pairs > text.rindex("</table>", 0, pairs) and text.count("<div class='pairs'>") == 1


def test_markdown(t2i_dir: Path):
    md = (t2i_dir / "report.md").read_text()
    assert md.startswith("# Acceptance report: sample-t2i — **FAIL**")
    assert "![sensitivity](plots/sensitivity.png)" in md and "](plots/pair-" in md
    assert "| mean SSIM vs baseline |" in md and "| FAIL |" in md
    for link in re.findall(r"\]\((plots/[^)]+)\)", md):
        assert (t2i_dir / link).is_file()


def test_criteria_rows_name_their_backend(t2i_dir: Path):
    md = (t2i_dir / "report.md").read_text()
    assert "| criterion | backend | value | threshold | status | note |" in md
    # 140 / 100 ms on cpu-reference for an Ascend (npu) policy: reported, not judged.
    assert ("| p99 latency candidate / baseline | cpu-reference | 1.400 | <= 1.000 | NOT JUDGED "
            "| not judged on cpu-reference: the policy targets ascend910b-eager (judged on npu) |"
            ) in md  # fmt: skip
    assert "| median PSNR vs baseline (dB) | cpu-reference |" in md
    html = (t2i_dir / "report.html").read_text()
    assert "<td class='NOT-JUDGED'>NOT JUDGED</td>" in html and "td.NOT-JUDGED{" in html


def test_policy_modalities_are_a_table_not_a_dict(t2i_dir: Path):
    md = (t2i_dir / "report.md").read_text()
    assert "| target | ascend910b-eager |" in md and "| rules | 3 |" in md
    assert "## Precision policy: modalities" in md
    assert "| modality | chosen | predicted SQNR dB | int8 MAC share |" in md
    assert "| denoiser | int8 | 31.250 | 0.500 |" in md
    assert "| text_encoder | fp16 | - | 0 |" in md
    for text in (md, (t2i_dir / "report.html").read_text()):
        assert "{'" not in text and "{&#x27;" not in text  # no Python dict repr anywhere


def test_sensitivity_table_and_chart_share_the_unit(t2i_dir: Path):
    from opsnn_quant.evaluation.plots import sensitivity_bars

    md = (t2i_dir / "report.md").read_text()
    assert "| module | type | modality | e2e noise % | local W8A8 noise % | fp16 overflow |" in md
    # unet.down.5.proj: contribution 0.06 -> 6 %; SQNR 25 dB -> 100 * 10^-2.5 = 0.316 %.
    assert "| unet.down.5.proj | Linear | denoiser | 6 | 0.316 |  |" in md
    assert "- target: ascend910b-eager" in md
    back = AcceptanceReport.load(t2i_dir / "report.json")
    picked, values, xlabel = sensitivity_bars(back.sensitivity)
    assert picked[0].name == "unet.down.5.proj" and values[0] == pytest.approx(6.0)
    assert values == pytest.approx([6.0, 5.0, 4.0, 3.0, 2.0, 1.0]) and xlabel.startswith(
        "e2e noise %"
    )
    local = [r.model_copy(update={"contribution": None}) for r in back.sensitivity]
    _, lvalues, lxlabel = sensitivity_bars(local)
    # Without e2e figures the bars are the table's local column, in the rows' order.
    assert lvalues == pytest.approx([100 * 10 ** (-(25 - i) / 10) for i in range(6)])
    assert lxlabel.startswith("local W8A8 noise %")


def test_latency_section_says_what_was_skipped():
    from opsnn_quant.evaluation.gate import plan_latency
    from opsnn_quant.evaluation.runner import QualityResult, build_report
    from opsnn_quant.evaluation.suite import parse_suite

    suite = parse_suite({
        "name": "s", "task": "t2i", "data": {"dataset": "shapes", "samples": 4},
        "metrics": {"fid_features": None, "thresholds": {"psnr_min": 20.0}},
        "latency": {"profile_top": 10},
    })  # fmt: skip
    plan = plan_latency(suite, "target", target=get_target("ascend910b-atc"), baseline_backend="cpu",
                        candidate_backend="cpu-reference", onnx_possible=True)  # fmt: skip
    r = build_report(suite, QualityResult(measured={"psnr_median_db": 30.0}),
                     target=get_target("ascend910b-atc"), latency_plan=plan, created="")  # fmt: skip
    md = render_markdown(r)
    section = md.split("## Latency\n", 1)[1].split("\n## ", 1)[0]
    assert section.strip().splitlines() == [
        "- latency criteria are judged on npu only (target ascend910b-atc)",
        "- measured with --latency target",
        "- skipped: eager timing of baseline (cpu) and candidate (cpu-reference): no criterion "
        "uses it (--latency target; --latency all measures it)",
        "- skipped: stages and top-10 module profile: no criterion uses it (--latency target; "
        "--latency all measures it)",
    ]
    assert "<li>measured with --latency target</li>" in render_html(r)


def test_run_times_are_the_last_section_and_only_with_times():
    report = asr_report()
    assert "Run times" not in render_markdown(report)
    timed = report.model_copy(update={"timings": {"probe": 12.34, "baseline outputs": 5.0}})
    md = render_markdown(timed)
    section = md.split("## Run times\n", 1)[1]
    assert section.splitlines()[1:5] == ["| phase | seconds |", "|---|---|", "| probe | 12.3 |",
                                         "| baseline outputs | 5.0 |"]  # fmt: skip
    assert "\n## " not in section.split("## Transcripts", 1)[0]  # after every other table
    page = render_html(timed)
    assert "<h2>Run times</h2><table><tr><th>phase</th><th>seconds</th></tr>" in page
    assert "<tr><td>probe</td><td>12.3</td></tr>" in page


def test_transcript_diffs_render():
    report = asr_report()
    md = render_markdown(report)
    assert "~~cat~~ **bat**" in md and "~~the~~" in md
    html = render_html(report)
    assert "<del>cat</del> <ins>bat</ins>" in html and "PASS" in html


def _non_blank(png: Path) -> tuple[float, float]:
    from PIL import Image

    px = np.asarray(Image.open(png).convert("RGB"), dtype=np.float64)
    non_white = float((px.min(axis=2) < 200).mean())
    return float(px.std()), non_white


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium not installed (apt-get install chromium)"
)
def test_html_renders_in_headless_chromium(t2i_dir: Path, tmp_path: Path):
    shot = tmp_path / "shot.png"
    cmd = ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
           f"--screenshot={shot}", "--window-size=1200,1600",
           (t2i_dir / "report.html").resolve().as_uri()]  # fmt: skip
    subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    std, non_white = _non_blank(shot)
    # A blank page has std 0 and no dark pixels; the report has text, tables and a red badge.
    assert std > 20 and 0.02 < non_white < 0.9, (std, non_white)
    from PIL import Image

    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    red = (px[..., 0] > 150) & (px[..., 1] < 80) & (px[..., 2] < 80)
    assert red.sum() > 200, "the red FAIL badge should be visible at the top"
