"""report.json/.md/.html and plots on disk; the HTML is self-contained and renders in Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from opsnn_quant.evaluation.render import md_text, render_html, render_markdown, write_report
from opsnn_quant.evaluation.report import AcceptanceReport
from opsnn_quant.output.directories import atomic_dir
from opsnn_quant.output.ownership import MARKER
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
    # as the commands write it: the report's files into the directory they own and swap in
    with atomic_dir(out, "report") as tmp:
        write_report(report, tmp, baseline_images=base, candidate_images=cand, max_pairs=3)
    return out


def test_files_written(t2i_dir: Path):
    names = sorted(p.relative_to(t2i_dir).as_posix() for p in t2i_dir.rglob("*") if p.is_file())
    assert names == [
        MARKER, "plots/intervals.png", "plots/latency.png", "plots/pair-0000.png", "plots/pair-0001.png", "plots/pair-0003.png",
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
    assert text.count("data:image/png;base64,") == 3 + 3  # three plots, three pairs
    assert "a blue &lt;square&gt; &amp; co" in text  # prompts are escaped
    assert "FAIL" in text and "cpu-reference" in text
    # the pairs: a grid of small strips after every table, not a column of full-width images
    pairs = text.index("<div class='pairs'>")
    assert pairs > text.rindex("</table>", 0, pairs) and text.count("<div class='pairs'>") == 1


def test_markdown(t2i_dir: Path):
    md = (t2i_dir / "report.md").read_text()
    assert md.startswith("# Acceptance report: sample-t2i — **FAIL**")
    assert "![sensitivity](plots/sensitivity.png)" in md and "](plots/pair-" in md
    assert "![intervals](plots/intervals.png)" in md
    assert "| mean SSIM vs baseline |" in md and "| FAIL |" in md
    # the pipes of "max |diff|" are escaped: 8 header cells over the 8-cell delimiter row
    assert ("| \\# | prompt | seed | PSNR dB | SSIM | MAE | max \\|diff\\| | CLIP b/c |\n"
            "|---|---|---|---|---|---|---|---|\n") in md  # fmt: skip
    for link in re.findall(r"\]\((plots/[^)]+)\)", md):
        assert (t2i_dir / link).is_file()


def test_criteria_rows_name_their_backend(t2i_dir: Path):
    md = (t2i_dir / "report.md").read_text()
    assert "| criterion | backend | value | interval | n | threshold | status | note |" in md
    # 140 / 100 ms on cpu-reference for an Ascend (npu) policy: reported, not judged.
    assert ("| p99 latency candidate / baseline | cpu-reference | 1.400 | - | - | &lt;= 1.000 "
            "| NOT JUDGED "
            "| not judged on cpu-reference: the policy targets ascend910b-eager (judged on npu) |"
            ) in md  # fmt: skip
    assert "| median PSNR vs baseline (dB) | cpu-reference |" in md
    # each quality figure with its interval (one identical pair: PSNR inf at the top) and n;
    # FD, a set statistic, with none
    assert ("| median PSNR vs baseline (dB) | cpu-reference | 32.691 | \\[32.612, inf\\] (95%) "
            "| 4 | &gt;= 20.000 | PASS |") in md  # fmt: skip
    assert "| - | 4 | &lt;= 100.000 | PASS | no interval: a set statistic" in md
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


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16)


def _columns(png: bytes, rgb: tuple[int, int, int]) -> np.ndarray:
    """x positions of the pixels within 30 of ``rgb`` in every channel."""
    import io

    from PIL import Image

    px = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    hit = (np.abs(px - np.array(rgb)) < 30).all(axis=2)
    return np.nonzero(hit.any(axis=0))[0]


@pytest.mark.parametrize(
    ("comparator", "threshold", "interval", "status", "bar_left_of_bound"),
    [
        ("<=", 1.0, (-0.5, 0.8), "PASS", True),  # a WER delta under its bound
        (">=", 40.0, (35.0, 38.0), "FAIL", True),  # a PSNR below its floor
        ("<=", 0.0, (0.5, 1.5), "FAIL", False),
    ],
)
def test_interval_chart_draws_the_interval_against_the_bound(
    comparator: str,
    threshold: float,
    interval: tuple[float, float],
    status: str,
    bar_left_of_bound: bool,
):
    from opsnn_quant.evaluation.plots import (
        _BOUND_COLOR,
        _STATUS_COLOR,
        interval_chart,
        interval_span,
    )
    from opsnn_quant.evaluation.report_schema import Criterion

    lo, hi = interval
    c = Criterion(key="k", label="k", measured_key="k", value=(lo + hi) / 2, threshold=threshold,
                  comparator=comparator, status=status, ci_low=lo, ci_high=hi, ci_level=0.95,
                  n=64)  # type: ignore[arg-type]  # fmt: skip
    span = interval_span(c)
    assert span[0] < min(lo, threshold) and span[1] > max(hi, threshold)
    assert interval_chart([c.model_copy(update={"ci_low": None, "ci_high": None})]) is None
    png = interval_chart([c])
    assert png is not None
    bar = _columns(png, _rgb(_STATUS_COLOR[status]))
    bound = _columns(png, _rgb(_BOUND_COLOR))  # the dashed threshold line
    assert bar.size > 20 and 0 < bound.size < 6
    if bar_left_of_bound:
        assert bar.max() < bound.min() + 3, (bar.max(), bound.min())
    else:
        assert bar.min() > bound.max() - 3, (bar.min(), bound.max())


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


# --- user text is text: report.md through a CommonMark renderer, report.html through a parser ---

# What users and models write (prompts, transcripts, suite, label and module names, notes, policy
# keys), at its most hostile: raw HTML, a javascript: link and autolink, every inline construct,
# a table pipe, an entity, a trailing backslash and a line break that would start a new block.
HOSTILE = ("<script>alert(1)</script> [x](javascript:alert(1)) <javascript:alert(1)> a|b *bold* "
           "_em_ `code` ~~gone~~ &amp; <img src=x onerror=alert(1)>\n# line two\n\n<b>raw</b> \\ #")  # fmt: skip
# The characters a reader must see: the same, the line breaks as spaces.
SHOWN = HOSTILE.replace("\n", " ")


def _commonmark() -> Any:
    """markdown-it (CommonMark, raw HTML on) with GFM tables and strikethrough. Its own link
    filter is switched off: the report must be safe in renderers that do not filter links."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    return md


def _with_user_text(report: AcceptanceReport, u: str) -> AcceptanceReport:
    """``report`` with ``u`` in every field a user or model writes."""
    from opsnn_quant.evaluation.report import DiffChunkRow, TranscriptRow

    pairs = [p.model_copy(update={"prompt": u}) for p in report.image_pairs]
    # a report.json edited by hand (or a hostile one) can point an image anywhere
    pairs[:1] = [p.model_copy(update={"image": "javascript:alert(1)"}) for p in pairs[:1]]
    diff = [DiffChunkRow(op="equal", ref=u, hyp=u), DiffChunkRow(op="replace", ref=u, hyp=u)]
    transcript = TranscriptRow(index=0, reference=u, baseline=u, candidate=u, ref_words=3,
                               baseline_errors=0, candidate_errors=1, agreement_errors=1, diff=diff)  # fmt: skip
    return report.model_copy(update={
        "suite": u, "baseline_label": u, "candidate_label": u, "target": u, "created": u,
        "backends": {u: u}, "notes": [u],
        "world": {"world_size": u, "nodes": 1, "backend": u, "devices": [u]},
        "criteria": [c.model_copy(update={"label": u, "note": u}) for c in report.criteria],
        "quality": [q.model_copy(update={"metric": u, "note": u}) for q in report.quality],
        "sensitivity": [s.model_copy(update={"name": u, "type": u}) for s in report.sensitivity],
        "stages": dict.fromkeys([u], next(iter(report.stages.values()), [])),
        "top_modules": dict.fromkeys([u], next(iter(report.top_modules.values()), [])),
        "policy": {"model": u, u: u, "modalities": {u: {"chosen": u, u: 1.0}}},
        "image_pairs": pairs, "transcripts": [transcript], "timings": {u: 1.0},
        "latency_skipped": [u],
    })  # fmt: skip


def _plain(inline: Any) -> str:
    """The text an inline token renders to, asserting it is nothing but text (no markup)."""
    kinds = {c.type for c in inline.children}
    assert kinds <= {"text"}, (kinds, inline.content)
    return "".join(c.content for c in inline.children)


def _structure(tokens: list[Any]) -> list[tuple[str, ...]]:
    """Block and inline token kinds, in order: what the page is built of, not what it says."""
    return [(t.type, t.tag, *(c.type for c in t.children or ())) for t in tokens]


@pytest.fixture(scope="module")
def hostile(t2i_dir: Path) -> list[tuple[AcceptanceReport, AcceptanceReport]]:
    """(hostile, benign) pairs of a t2i and an asr report: the same report with HOSTILE or "x"
    in every user-written field."""
    t2i = AcceptanceReport.load(t2i_dir / "report.json")
    return [(_with_user_text(r, HOSTILE), _with_user_text(r, "x")) for r in (t2i, asr_report())]


def test_md_text_escapes_markup_and_keeps_names_readable():
    assert md_text("<script>&") == "&lt;script&gt;&amp;"
    assert md_text("a|b\nc\r\nd") == "a\\|b c d"
    assert md_text("*b* [l](u) `c` ~~s~~ #") == "\\*b\\* \\[l\\](u) \\`c\\` \\~\\~s\\~\\~ \\#"
    assert md_text("_em_ x_") == "\\_em\\_ x\\_" and md_text("a\\") == "a\\\\"
    # intraword underscores cannot make emphasis: module and policy names stay as written
    assert md_text("text_encoder.down_blocks.0") == "text_encoder.down_blocks.0"


def test_markdown_user_text_renders_as_text(hostile):
    md = _commonmark()
    for bad, benign in hostile:
        source = render_markdown(bad)
        tokens = md.parse(source)
        # user text adds or removes no block, link, emphasis, code or HTML: the page is built of
        # the same tokens as with "x" in its place
        assert _structure(tokens) == _structure(md.parse(render_markdown(benign)))
        page = md.render(source)
        assert "<script" not in page and "<img src=x" not in page and "<b>" not in page
        kinds = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or ()}
        assert not kinds & {"html_block", "html_inline", "link_open", "code_inline", "em_open"}
        for child in [c for t in tokens for c in t.children or ()]:
            for value in (child.attrs or {}).values():
                assert "javascript:" not in str(value).lower(), (child.type, value)
        # and a reader sees exactly what was written, the line breaks as spaces
        inlines = [t for t in tokens if t.type == "inline"]
        assert f"note: {SHOWN}" in [_plain(t) for t in inlines if t.content.startswith("note:")]
        heading = next(t for t in inlines if t.content.startswith("Acceptance report:"))
        assert heading.children[0].content == f"Acceptance report: {SHOWN} — "
        transcript = next(t for t in inlines if t.content.startswith("#0 errors"))
        parts = [c for c in transcript.children if c.content or c.type != "text"]
        assert [c.type for c in parts] == [
            "text", "hardbreak", "text", "s_open", "text", "s_close", "text", "strong_open",
            "text", "strong_close"]  # fmt: skip
        words = [c.content for c in parts if c.type == "text"]
        assert words == [f"#0 errors 0 → 1 of 3 words; reference: {SHOWN}", f"{SHOWN} ",
                         SHOWN, " ", SHOWN]  # fmt: skip


def test_markdown_tables_hold_their_shape(hostile):
    from markdown_it.rules_block.table import escapedSplit  # the renderer's own cell splitter

    md = _commonmark()
    for bad, _ in hostile:
        source = render_markdown(bad)
        lines = source.splitlines()
        tokens = md.parse(source)
        tables = [i for i, t in enumerate(tokens) if t.type == "table_open"]
        # every table the renderer wrote is one a CommonMark/GFM renderer draws (a header with
        # a cell count other than the delimiter row's is not a table at all)
        assert len(tables) == sum(ln.startswith("|---|") for ln in lines) > 0
        for i in tables:
            start, end = tokens[i].map
            counts = {len(escapedSplit(ln.strip()[1:-1])) for ln in lines[start:end]}
            assert len(counts) == 1, lines[start:end]  # every row has the header's cells
            head = tokens[i:]
            head = head[: next(k for k, t in enumerate(head) if t.type == "tr_close")]
            assert counts == {sum(t.type == "th_open" for t in head)}
        cells = [_plain(t) for t in tokens if t.type == "inline" and t.map and
                 lines[t.map[0]].startswith("|")]  # fmt: skip
        assert cells.count(SHOWN) >= 3  # user text is one whole cell, never split or cut
    t2i = render_markdown(hostile[0][0])
    tokens = md.parse(t2i)
    start = next(i for i, t in enumerate(tokens)
                 if t.type == "inline" and t.content == "Image pairs (worst PSNR first)")  # fmt: skip
    table = tokens[start:]
    table = table[: next(i for i, t in enumerate(table) if t.type == "table_close")]
    header = [_plain(t) for t, o in zip(table[1:], table[:-1], strict=True) if o.type == "th_open"]
    assert header == ["#", "prompt", "seed", "PSNR dB", "SSIM", "MAE", "max |diff|", "CLIP b/c"]
    body = [_plain(t) for t, o in zip(table[1:], table[:-1], strict=True) if o.type == "td_open"]
    assert body[1::8] == [SHOWN] * 4 and body[2::8] == ["0"] * 4  # prompt, then its seed


def test_markdown_image_links_stay_relative(hostile):
    md = _commonmark()
    tokens = md.parse(render_markdown(hostile[0][0], {"latency": "plots/latency.png"}))
    srcs = [c.attrs["src"] for t in tokens for c in t.children or () if c.type == "image"]
    # the hand-edited javascript: path is a file name in the report's directory, not a scheme
    assert srcs == ["plots/latency.png", "javascript%3Aalert%281%29", "plots/pair-0000.png",
                    "plots/pair-0003.png"]  # fmt: skip


class _Page(HTMLParser):
    """Every start tag with its attributes, the text, and each table's rows' cell counts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.rows: list[list[int]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "table":
            self.rows.append([])
        elif tag == "tr":
            self.rows[-1].append(0)
        elif tag in ("td", "th"):
            self.rows[-1][-1] += 1

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_user_text_is_escaped(hostile):
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "span", "ul", "li",
               "b", "i", "table", "tr", "th", "td", "figure", "img", "figcaption", "div", "del",
               "ins"}  # fmt: skip
    for bad, benign in hostile:
        pngs = {p.index: b"png" for p in bad.image_pairs}
        page = _Page()
        page.feed(render_html(bad, {"latency": b"png"}, pngs))
        twin = _Page()
        twin.feed(render_html(benign, {"latency": b"png"}, pngs))
        assert [t for t, _ in page.tags] == [t for t, _ in twin.tags]  # no tag from user text
        assert {t for t, _ in page.tags} <= allowed
        for tag, attrs in page.tags:
            assert not any(k.startswith("on") or k == "href" for k in attrs), (tag, attrs)
            if "src" in attrs:
                assert (attrs["src"] or "").startswith("data:image/png;base64,")
        assert page.rows == twin.rows and all(len(set(t)) == 1 for t in page.rows)
        text = "".join(page.text)
        assert text.count(HOSTILE) >= 5  # shown as written, in cells, notes and captions
