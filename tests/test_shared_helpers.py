"""Small helpers shared across parts: ``types.match_prefix`` and ``numerics.fmt_db``."""

import math
import subprocess
import sys

import pytest

from opsnn_quant.core.numerics import fmt_db
from opsnn_quant.types import match_prefix


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("unet.conv_in", "unet"),
        ("unet", "unet"),
        ("unet2.conv_in", ""),  # a prefix covers dotted descendants only
        ("vae.decoder.conv_in", "vae.decoder"),  # the longest prefix wins
        ("vae.encoder.conv_in", ""),
        ("vae", ""),
    ],
)
def test_match_prefix_is_the_longest_dotted_ancestor(name, expected):
    assert match_prefix(name, ["", "unet", "vae.decoder"]) == expected


def test_match_prefix_without_a_cover_is_none():
    assert match_prefix("vae.conv", {"unet": 1, "vae.decoder": 2}) is None
    assert match_prefix("anything", []) is None


def test_fmt_db_policy_and_table_forms():
    assert fmt_db(31.25) == "31.2 dB"
    assert fmt_db(None) == "inf dB"  # None = no error at all in probe and policy figures
    assert fmt_db(math.inf) == "inf dB"
    assert fmt_db(-math.inf) == "-inf dB"
    assert fmt_db(31.25, unit="") == "31.2"
    assert fmt_db(None, unit="", none="-") == "-"
    assert fmt_db(math.nan, unit="") == "nan"


def test_fmt_db_does_not_import_torch():
    code = (
        "import sys, opsnn_quant.core.numerics as n; n.fmt_db(1.0); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
