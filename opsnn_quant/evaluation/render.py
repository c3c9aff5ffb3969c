"""Render an acceptance report (its :class:`~.report_schema.ReportSchema`) as ``report.json``,
``report.md`` and ``report.html``.

The HTML page is self-contained: CSS inline, figures and image pairs as base64 PNG data URIs,
no script and no external URL, so it opens from an archive or an air-gapped machine. Markdown
links the same PNGs under ``plots/``. The directory is written atomically.

Every string that reaches a page is text, never markup: prompts, transcripts, suite, model and
module names, notes and policy keys come from users and models, so the HTML escapes them and
the Markdown escapes them (:func:`md_text`) — a ``<script>`` prompt shows as the characters
``<script>`` in any CommonMark/GFM renderer, and a ``|`` cannot split a table cell.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from opsnn_quant.evaluation.images import ImageBatch, as_uint8_nhwc
from opsnn_quant.evaluation.plots import (
    frame_strip,
    interval_chart,
    latency_chart,
    pair_strip,
    sensitivity_chart,
)
from opsnn_quant.evaluation.report_schema import (
    SENSITIVITY_NOTE,
    SENSITIVITY_UNIT,
    Criterion,
    ImagePairRow,
    ReportSchema,
    TranscriptRow,
    fmt,
)
from opsnn_quant.output.files import empty_dir

OUTPUT_KIND = "report"
RUN_TIMES = "Run times"  # the one section whose figures differ between two runs of one command

_MB = 1024 * 1024
MAX_VIDEO_PAIRS = 6  # a video pair's strip is a row of frames each: a few are enough


class PairKind(NamedTuple):
    """How a report names its output pairs: the table's title and the strips' heading."""

    table: str
    strips: str


_IMAGES = PairKind(
    "Image pairs (worst PSNR first)", "Image pairs: baseline | candidate | |diff| ×4"
)
_VIDEOS = PairKind(
    "Video pairs (worst mean per-frame PSNR first)",
    "Video pairs: baseline frames (top row) above candidate frames (bottom row)",
)


def pair_kind(pairs: Sequence[ImagePairRow]) -> PairKind:
    """Video pairs (a row with ``frames``) or image pairs."""
    return _VIDEOS if any(p.frames for p in pairs) else _IMAGES


class Section(NamedTuple):
    """A report section: a table (``header`` empty: none) and lines printed under it."""

    title: str
    header: list[str]
    rows: list[list[str]]
    lines: Sequence[str] = ()


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / _MB:.1f}"


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return fmt(v)
    return str(v)


def _pct(v: float | None) -> str:
    # Three significant digits: sensitivities span decades (6 % down to 0.0003 %).
    return "-" if v is None else f"{v:.3g}"


# Column titles of the policy's per-modality figures (policy_summary); other keys are spelt out.
_POLICY_COLUMNS = {
    "predicted_sqnr_db": "predicted SQNR dB",
    "measured_sqnr_db": "measured SQNR dB (held-out)",
    "int8_mac_share": "int8 MAC share",
    "int8_share_of_all_macs": "int8 share of all MACs",
    "attention_int8_share": "attention int8 share",
}
_ROW_NAMES = {"modalities": "modality"}


def _policy_sections(policy: dict[str, Any]) -> list[Section]:
    """Scalars as one key/value table; each mapping of mappings (``modalities``) as its own."""
    scalars = [[str(k), _cell(v)] for k, v in policy.items() if not isinstance(v, dict)]
    out = [Section("Precision policy", ["key", "value"], scalars)] if scalars else []
    for key, value in policy.items():
        if not isinstance(value, dict):
            continue
        if not all(isinstance(v, dict) for v in value.values()):
            rows = [[str(k), _cell(v)] for k, v in value.items()]
            out.append(Section(f"Precision policy: {key}", ["key", "value"], rows))
            continue
        cols: list[str] = []
        for inner in value.values():
            cols += [c for c in inner if c not in cols]
        header = [_ROW_NAMES.get(key, str(key))]
        header += [_POLICY_COLUMNS.get(c, c.replace("_", " ")) for c in cols]
        rows = [[str(k), *(_cell(inner.get(c)) for c in cols)] for k, inner in value.items()]
        out.append(Section(f"Precision policy: {key}", header, rows))
    return out


def _latency_lines(r: ReportSchema) -> list[str]:
    judged = ", ".join(r.latency_judged_on)
    if r.target is None:
        lines = ["latency criteria are judged on no backend: no deployment target is known"]
    elif judged:
        lines = [f"latency criteria are judged on {judged} only (target {r.target})"]
    else:
        lines = [f"latency criteria are judged on no backend (target {r.target}, narrowed by "
                 "the suite's enforce_backends)"]  # fmt: skip
    lines.append(f"measured with --latency {r.latency_mode}")
    lines += [f"skipped: {x}" for x in r.latency_skipped]
    return lines


def interval_text(c: Criterion) -> str:
    """A criterion's interval as ``[low, high] (95%)``; ``-`` when it has none."""
    if c.ci_low is None or c.ci_high is None:
        return "-"
    level = "" if c.ci_level is None else f" ({100 * c.ci_level:g}%)"
    return f"[{fmt(c.ci_low)}, {fmt(c.ci_high)}]{level}"


def _interval_lines(r: ReportSchema) -> list[str]:
    """How the intervals were made and judged, when the report has any."""
    if not any(c.ci_low is not None for c in r.criteria):
        return []
    return [
        "interval: paired percentile bootstrap over the n utterances or prompts (baseline and "
        "candidate resampled together; WER/CER as corpus ratios within each resample; KID with "
        "each drawn prompt's reference image, pairs of copies of one prompt left out; seeded)",
        "PASS: the whole interval meets the threshold; FAIL: none of it does; INCONCLUSIVE: "
        "it straddles the threshold (more samples would decide it); a criterion without an "
        "interval is judged on its value",
    ]


def conditions_line(conditions: dict[str, Any]) -> str:
    """``batch_size 8, threads 2, ...``: what a rerun must match to give the same outputs."""
    return ", ".join(f"{k} {v}" for k, v in conditions.items())


def world_line(world: dict[str, Any]) -> str:
    """One line for a distributed run: processes, hosts, backend, each rank's device."""
    devices = ", ".join(f"rank {i} {d}" for i, d in enumerate(world.get("devices", [])))
    return (
        f"{world.get('world_size')} processes on {world.get('nodes')} host(s), backend "
        f"{world.get('backend')}: {devices}"
    )


def _sections(r: ReportSchema) -> list[Section]:
    """Every section as plain strings, shared by md and html."""
    out: list[Section] = []
    if r.criteria:
        out.append(Section(
            "Acceptance criteria",
            ["criterion", "backend", "value", "interval", "n", "threshold", "status", "note"],
            [[c.label, c.backend or "-", fmt(c.value), interval_text(c), _cell(c.n),
              f"{c.comparator} {fmt(c.threshold)}", c.status, c.note] for c in r.criteria],
            _interval_lines(r),
        ))  # fmt: skip
    if r.quality:
        out.append(Section(
            "Quality",
            ["metric", r.baseline_label, r.candidate_label, "delta", "unit", "note"],
            [[q.metric, fmt(q.baseline), fmt(q.candidate), fmt(q.delta), q.unit, q.note]
             for q in r.quality],
        ))  # fmt: skip
    if r.latency or r.latency_skipped or r.onnxruntime is not None:
        header = ["model", "backend", "runs", "p50 ms", "p90 ms", "p99 ms", "mean ms",
                  "items/s", "peak MB", "memory method"] if r.latency else []  # fmt: skip
        out.append(Section(
            "Latency", header,
            [[x.label, x.result.backend, str(x.result.runs), fmt(x.result.p50_ms),
              fmt(x.result.p90_ms), fmt(x.result.p99_ms), fmt(x.result.mean_ms),
              fmt(x.result.throughput_per_s), _mb(x.result.peak_memory_bytes),
              x.result.memory_method] for x in r.latency],
            _latency_lines(r),
        ))  # fmt: skip
    if r.onnxruntime is not None:
        o = r.onnxruntime
        out.append(Section(
            f"ONNX Runtime ({o.qdq.backend})", ["model", "p50 ms", "p99 ms", "mean ms", "file MB"],
            [["fp32", fmt(o.fp32.p50_ms), fmt(o.fp32.p99_ms), fmt(o.fp32.mean_ms),
              _mb(o.fp32_file_bytes)],
             ["QDQ", fmt(o.qdq.p50_ms), fmt(o.qdq.p99_ms), fmt(o.qdq.mean_ms),
              _mb(o.qdq_file_bytes)],
             ["fp32 / QDQ", fmt(o.p50_speedup), "-", fmt(o.mean_speedup), fmt(o.size_ratio)]],
        ))  # fmt: skip
    for label, stages in r.stages.items():
        out.append(Section(
            f"Stages: {label}",
            ["stage", "module", "calls", "total ms", "mean ms", "p90 ms", "first ms"],
            [[s.stage, s.module, str(s.calls), fmt(s.total_ms), fmt(s.mean_ms), fmt(s.p90_ms),
              fmt(s.first_ms)] for s in stages],
        ))  # fmt: skip
    for label, mods in r.top_modules.items():
        out.append(Section(
            f"Top modules by CPU time: {label}", ["module", "type", "calls", "total ms", "share"],
            [[m.name, m.type, str(m.calls), fmt(m.total_ms), f"{100 * m.share:.1f}%"]
             for m in mods],
        ))  # fmt: skip
    if r.stability:
        out.append(Section(
            "Stability",
            ["model", "backend", "K", "first-decile ms", "last-decile ms", "drift",
             "memory growth MB", "method"],
            [[k, s.backend, str(s.k), fmt(s.first_decile_median_ms),
              fmt(s.last_decile_median_ms), fmt(s.drift_ratio),
              f"{s.memory_growth_bytes / _MB:.2f}", s.memory_method]
             for k, s in r.stability.items()],
        ))  # fmt: skip
    return out + _detail_sections(r)


def _detail_sections(r: ReportSchema) -> list[Section]:
    """The sections after the figures: policy, sensitivity, image pairs, run times."""
    out: list[Section] = []
    if r.policy:
        out += _policy_sections(r.policy)
    if r.sensitivity:
        out.append(Section(
            "Per-module sensitivity (most sensitive first)",
            ["module", "type", "modality", f"e2e noise {SENSITIVITY_UNIT}",
             f"local W8A8 noise {SENSITIVITY_UNIT}", "fp16 overflow"],
            [[s.name, s.type, s.modality, _pct(s.e2e_pct()), _pct(s.local_pct()),
              "yes" if s.fp16_overflow else ""] for s in r.sensitivity[:40]],
            [SENSITIVITY_NOTE],
        ))  # fmt: skip
    if r.image_pairs:
        out.append(Section(
            pair_kind(r.image_pairs).table,
            ["#", "prompt", "seed", "PSNR dB", "SSIM", "MAE", "max |diff|", "CLIP b/c"],
            [[str(p.index), p.prompt, "-" if p.seed is None else str(p.seed), fmt(p.psnr_db),
              fmt(p.ssim), fmt(p.mae), str(p.max_abs),
              f"{fmt(p.clip_baseline)} / {fmt(p.clip_candidate)}"] for p in r.image_pairs],
        ))  # fmt: skip
    if r.timings:
        out.append(Section(
            RUN_TIMES, ["phase", "seconds"],
            [[phase, f"{seconds:.1f}"] for phase, seconds in r.timings.items()],
            ["wall-clock time of this run on this machine (not reproducible, unlike the rest)"],
        ))  # fmt: skip
    return out


def _repeats(t: TranscriptRow) -> str:
    """What the models' transcripts repeat or make up, as text ("" when neither does)."""
    parts = [f"{who} repeats: {what}" for who, what in
             (("float", t.baseline_repeats), ("candidate", t.candidate_repeats)) if what]  # fmt: skip
    return f" ({'; '.join(parts)})" if parts else ""


def _diff_md(t: TranscriptRow) -> str:
    # The words are escaped; only the ~~ and ** around them are markup.
    parts = []
    for c in t.diff:
        if c.op == "equal":
            parts.append(md_text(c.ref))
        else:
            old = f"~~{md_text(c.ref)}~~" if c.ref else ""
            new = f"**{md_text(c.hyp)}**" if c.hyp else ""
            parts.append(" ".join(x for x in (old, new) if x))
    return " ".join(parts) or "(empty)"


def _diff_html(t: TranscriptRow) -> str:
    parts = []
    for c in t.diff:
        if c.op == "equal":
            parts.append(html.escape(c.ref))
            continue
        if c.ref:
            parts.append(f"<del>{html.escape(c.ref)}</del>")
        if c.hyp:
            parts.append(f"<ins>{html.escape(c.hyp)}</ins>")
    return " ".join(parts) or "<i>(empty)</i>"


# Characters a backslash makes literal wherever they stand in a line: code spans (`), emphasis
# (*), links and images ([ ]), GFM strikethrough (~) and table cells (|), an ATX heading's
# closing #s, and the backslash itself. ``_`` is handled apart; ``<``, ``>``, ``&`` become
# entities (below). Line-start constructs (lists, headings, quotes, setext underlines, code
# indents) need no escape: md_text leaves no line break, so user text never starts a line.
_MD_BACKSLASHED = frozenset("\\`*[]~|#")
# As entities rather than ``\<``: every Markdown dialect decodes entities in text, while some
# (Python-Markdown) do not take ``\<`` as an escape and would pass ``<script>`` through raw.
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Every line break a CommonMark renderer (\n, \r) or Python's splitlines knows.
_LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def md_text(text: object) -> str:
    """``text`` as Markdown that renders as exactly those characters, on one line.

    Safe in a table cell, a heading, a list item or a paragraph: raw HTML, autolinks, links,
    images, emphasis, code spans and strikethrough become literal text and ``|`` cannot end a
    cell. Line breaks become spaces (a table row is one line; a break could also start a block
    such as an HTML block). Deterministic: the same text gives the same bytes.

    Args:
        text: Any value; ``str()`` of it is escaped.

    Returns:
        The escaped text.
    """
    s = _LINE_BREAKS.sub(" ", str(text))
    out = []
    for i, ch in enumerate(s):
        if ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch in _MD_BACKSLASHED:
            out.append("\\" + ch)
        elif ch == "_" and not (0 < i < len(s) - 1 and s[i - 1].isalnum() and s[i + 1].isalnum()):
            # An intraword _ can neither open nor close emphasis (CommonMark flanking rules),
            # so module names like text_encoder stay readable in the raw file.
            out.append("\\_")
        else:
            out.append(ch)
    return "".join(out)


def _md_url(path: str) -> str:
    """A link destination that is a relative path whatever ``path`` holds: percent-encoded, so
    ``javascript:x`` turns into the harmless file name ``javascript%3Ax`` and spaces or
    parentheses cannot end the destination early."""
    return quote(path, safe="/")


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(md_text(c) for c in cells) + " |"


def render_markdown(r: ReportSchema, figures: dict[str, str] | None = None) -> str:
    """``report.md``; ``figures`` maps a figure name to its path relative to the report."""
    figures = figures or {}
    m = md_text  # every string below that is not this function's own markup goes through it
    lines = [f"# Acceptance report: {m(r.suite)} — **{r.verdict}**", ""]
    lines.append(f"- task: {m(r.task)}; {m(r.baseline_label)} vs {m(r.candidate_label)}")
    lines.append(f"- target: {m(r.target or 'unknown')}")
    lines += [f"- backend ({m(k)}): {m(v)}" for k, v in r.backends.items()]
    if r.created:
        lines.append(f"- created: {m(r.created)}")
    if r.world:
        lines.append(f"- run: {m(world_line(r.world))}")
    if r.outputs_depend_on:
        lines.append(f"- outputs depend on: {m(conditions_line(r.outputs_depend_on))}")
    lines += [f"- note: {m(n)}" for n in r.notes]
    lines.append("")
    for sec in _sections(r):
        lines += [f"## {m(sec.title)}", ""]
        if sec.header:
            # The header is escaped too: "max |diff|" unescaped made 9 header cells over an
            # 8-cell delimiter row, and a GFM renderer then drops the table altogether.
            lines += [_md_row(sec.header), "|" + "---|" * len(sec.header)]
            lines += [_md_row(row) for row in sec.rows]
            lines.append("")
        if sec.lines:
            lines += [f"- {m(x)}" for x in sec.lines] + [""]
    for name in ("intervals", "sensitivity", "latency"):
        if name in figures:
            lines += [f"![{m(name)}]({_md_url(figures[name])})", ""]
    pairs = [p for p in r.image_pairs if p.image]
    if pairs:
        # An ATX heading is never a table row, so its pipes stay as they read.
        lines += [f"## {pair_kind(pairs).strips.replace('×', 'x')}", ""]
        lines += [f"**#{p.index}** {m(p.prompt)} (PSNR {fmt(p.psnr_db)} dB)\n\n"
                  f"![pair {p.index}]({_md_url(p.image or '')})\n" for p in pairs]  # fmt: skip
    if r.transcripts:
        lines += ["## Transcripts (largest changes both ways, worst first; ~~baseline~~ "
                  "**candidate**)", ""]  # fmt: skip
        for t in r.transcripts:
            lines.append(
                f"- #{t.index} errors {t.baseline_errors} → {t.candidate_errors} "
                f"of {t.ref_words} {t.unit}{m(_repeats(t))}; reference: {m(t.reference)}  \n  {_diff_md(t)}"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1 .PASS{color:#fff;background:#2a8a3a;padding:2px 10px;border-radius:4px}
h1 .FAIL{color:#fff;background:#c62828;padding:2px 10px;border-radius:4px}
h1 .INCONCLUSIVE{color:#fff;background:#b26a00;padding:2px 10px;border-radius:4px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f7} td.PASS{color:#2a8a3a;font-weight:bold} td.FAIL{color:#c62828;font-weight:bold}
td.INCONCLUSIVE{color:#b26a00;font-weight:bold} td.NOT-JUDGED{color:#777} img{max-width:100%} figure{margin:8px 0 16px}
del{background:#fdd;text-decoration:line-through} ins{background:#dfd;text-decoration:none}
.notes li,.lines li{color:#555}
.pairs{display:flex;flex-wrap:wrap;gap:12px} .pairs figure{margin:0;width:280px}
.pairs img{width:100%;image-rendering:pixelated} .pairs figcaption{font-size:12px}
.videos figure{margin:0 0 12px} .videos img{image-rendering:pixelated} .videos figcaption{font-size:12px}
"""


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def render_html(r: ReportSchema, figures: dict[str, bytes] | None = None,
                pair_pngs: dict[int, bytes] | None = None) -> str:  # fmt: skip
    """Self-contained ``report.html`` (figures and pair PNGs inlined as data URIs)."""
    figures = figures or {}
    pair_pngs = pair_pngs or {}
    e = html.escape
    body = [
        f"<h1>Acceptance report: {e(r.suite)} <span class='{r.verdict}'>{r.verdict}</span></h1>"
    ]
    info = [f"task: {e(r.task)}; {e(r.baseline_label)} vs {e(r.candidate_label)}"]
    info.append(f"target: <b>{e(r.target or 'unknown')}</b>")
    info += [f"backend ({e(k)}): <b>{e(v)}</b>" for k, v in r.backends.items()]
    if r.created:
        info.append(f"created: {e(r.created)}")
    if r.world:
        info.append(f"run: {e(world_line(r.world))}")
    if r.outputs_depend_on:
        info.append(f"outputs depend on: {e(conditions_line(r.outputs_depend_on))}")
    body.append("<ul>" + "".join(f"<li>{x}</li>" for x in info) + "</ul>")
    if r.notes:
        body.append("<ul class='notes'>" + "".join(f"<li>{e(n)}</li>" for n in r.notes) + "</ul>")
    for sec in _sections(r):
        body.append(f"<h2>{e(sec.title)}</h2>")
        if sec.header:
            status_col = sec.header.index("status") if "status" in sec.header else -1
            trs = []
            for row in sec.rows:
                tds = [f"<td class='{e(c.replace(' ', '-'))}'>{e(c)}</td>" if i == status_col
                       else f"<td>{e(c)}</td>" for i, c in enumerate(row)]  # fmt: skip
                trs.append("<tr>" + "".join(tds) + "</tr>")
            head = "".join(f"<th>{e(h)}</th>" for h in sec.header)
            body.append(f"<table><tr>{head}</tr>{''.join(trs)}</table>")
        if sec.lines:
            body.append("<ul class='lines'>" + "".join(f"<li>{e(x)}</li>" for x in sec.lines)
                        + "</ul>")  # fmt: skip
    captions = (("intervals", "Each criterion: value (dot), interval (bar), threshold (dashed; "
                             "the shaded side fails)"),
                ("sensitivity", "Per-module sensitivity"), ("latency", "Latency"))  # fmt: skip
    for name, caption in captions:
        if name in figures:
            body.append(f"<figure><img alt='{name}' src='{_data_uri(figures[name])}'>"
                        f"<figcaption>{caption}</figcaption></figure>")  # fmt: skip
    if pair_pngs:
        # a grid of small strips after the tables: the figures a reader looks for come first
        kind = pair_kind(r.image_pairs)
        body.append(f"<h2>{e(kind.strips)} (worst first)</h2>")
        body.append(f"<div class='{'videos' if kind is _VIDEOS else 'pairs'}'>")
        for p in r.image_pairs:
            if p.index in pair_pngs:
                body.append(
                    f"<figure><img alt='pair {p.index}' src='{_data_uri(pair_pngs[p.index])}'>"
                    f"<figcaption>#{p.index} {e(p.prompt)} — PSNR {fmt(p.psnr_db)} dB, "
                    f"SSIM {fmt(p.ssim)}</figcaption></figure>"
                )
        body.append("</div>")
    if r.transcripts:
        body.append("<h2>Transcripts (largest changes both ways, worst first; "
                    "<del>baseline</del> <ins>candidate</ins>)</h2>")  # fmt: skip
        rows_html = "".join(
            f"<tr><td>{t.index}</td><td>{t.baseline_errors} → {t.candidate_errors} / "
            f"{t.ref_words}{e(_repeats(t))}</td><td>{e(t.reference)}</td>"
            f"<td>{_diff_html(t)}</td></tr>"
            for t in r.transcripts
        )
        body.append("<table><tr><th>#</th><th>errors</th><th>reference</th>"
                    f"<th>baseline → candidate</th></tr>{rows_html}</table>")  # fmt: skip
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{e(r.suite)} {r.verdict}</title><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")  # fmt: skip


def write_report(
    report: ReportSchema,
    out_dir: str | os.PathLike[str],
    *,
    baseline_images: ImageBatch | None = None,
    candidate_images: ImageBatch | None = None,
    max_pairs: int = 16,
) -> Path:
    """Write ``report.json``, ``report.md``, ``report.html`` and ``plots/`` into ``out_dir``.

    Args:
        report: The report. Its ``image_pairs`` are kept in order (worst first); the first
            ``max_pairs`` get a side-by-side PNG when the images are given (video pairs: the
            first :data:`MAX_VIDEO_PAIRS` at most, each a frame strip, baseline row above
            candidate row).
        out_dir: A new or empty directory (see :func:`~opsnn_quant.output.files.empty_dir`; the commands
            replace an earlier report whole, atomically).
        baseline_images, candidate_images: The images (videos) ``image_pairs[*].index``
            points into (default: the report's own :attr:`~ReportSchema.outputs`, when they
            are images or videos).

    Returns:
        ``out_dir``.
    """
    figures: dict[str, bytes] = {}
    intervals = interval_chart(report.criteria)
    if intervals is not None:
        figures["intervals"] = intervals
    sens = sensitivity_chart(report.sensitivity)
    if sens is not None:
        figures["sensitivity"] = sens
    lat = latency_chart(report.latency)
    if lat is not None:
        figures["latency"] = lat
    pair_pngs: dict[int, bytes] = {}
    if baseline_images is None and candidate_images is None and report.outputs is not None:
        baseline_images, candidate_images = (_images(o) for o in report.outputs)
    if baseline_images is not None and candidate_images is not None and report.image_pairs:
        pair_pngs = _pair_pngs(report.image_pairs, baseline_images, candidate_images, max_pairs)
    pairs = [
        p.model_copy(update={"image": f"plots/pair-{p.index:04d}.png"})
        if p.index in pair_pngs else p for p in report.image_pairs
    ]  # fmt: skip
    report = report.model_copy(update={"image_pairs": pairs})
    tmp = empty_dir(out_dir)
    plots = tmp / "plots"
    plots.mkdir()
    for name, png in figures.items():
        (plots / f"{name}.png").write_bytes(png)
    for idx, png in pair_pngs.items():
        (plots / f"pair-{idx:04d}.png").write_bytes(png)
    (tmp / "report.json").write_text(report.to_json(), encoding="utf-8")
    rel = {name: f"plots/{name}.png" for name in figures}
    (tmp / "report.md").write_text(render_markdown(report, rel), encoding="utf-8")
    (tmp / "report.html").write_text(render_html(report, figures, pair_pngs), encoding="utf-8")
    return Path(out_dir)


def _pair_pngs(
    pairs: Sequence[ImagePairRow], baseline: ImageBatch, candidate: ImageBatch, max_pairs: int
) -> dict[int, bytes]:
    """The strips of the first pairs: an image pair's ``baseline | candidate | |diff|``
    (:func:`~.plots.pair_strip`), a video pair's frames (:func:`~.plots.frame_strip`)."""
    if pair_kind(pairs) is _VIDEOS:
        return {p.index: frame_strip(as_uint8_nhwc(baseline[p.index]),
                                     as_uint8_nhwc(candidate[p.index]))
                for p in pairs[: min(max_pairs, MAX_VIDEO_PAIRS)]}  # fmt: skip
    base, cand = as_uint8_nhwc(baseline), as_uint8_nhwc(candidate)
    return {p.index: pair_strip(base[p.index], cand[p.index]) for p in pairs[:max_pairs]}


def _images(outputs: list[Any]) -> list[Any] | None:
    """Outputs usable as report images or videos (arrays), else None (transcripts)."""
    if outputs and hasattr(outputs[0], "shape"):
        return list(outputs)
    return None
