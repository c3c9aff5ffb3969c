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
