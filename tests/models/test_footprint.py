"""The memory floor of a diffusion pipeline's call (issue 41 §5): sizes inside the documented
caps that the machine cannot hold are refused before anything loads."""

from __future__ import annotations

import json
import re

import pytest

from opsnn_quant.cli import main
from opsnn_quant.errors import ConfigError
from opsnn_quant.models.footprint import (
    COPIES,
    FP32,
    GIB,
    available_memory,
    check_footprint,
    diffusion_footprint,
    parse_size,
)


def _pipe(root, unet=None, transformer=None, vae_blocks=(32, 64, 64)):
    for name, cfg in (
        ("vae", {"block_out_channels": list(vae_blocks)}),
        ("unet", unet),
        ("transformer", transformer),
    ):
        if cfg is not None:
            (root / name).mkdir(parents=True)
            (root / name / "config.json").write_text(json.dumps(cfg))
    (root / "unet_weights.safetensors").write_bytes(b"\0" * 1000)
    return root


def test_a_unet_pipeline_floor_by_hand(tmp_path):
    # the zoo's shapes-t2i: VAE [32, 64, 64] (scale 4), UNet [64, 64] with cross-attention
    # blocks first; 8192 px, batch 2, guidance: the UNet's first level holds 2 x 2 x 2048 x
    # 2048 positions of 64 x 8 GEGLU values; the VAE decoder 2 x 8192 x 8192 x 32.
    pipe = _pipe(
        tmp_path,
        unet={"block_out_channels": [64, 64], "down_block_types": ["CrossAttnDownBlock2D"] * 2},
    )
    got = diffusion_footprint(pipe, batch=2, height=8192, width=8192)
    assert got.weights == 1000
    assert got.activation == 2 * 2 * 2048 * 2048 * 64 * 8 * FP32 * COPIES == 96 * GIB
    assert got.where == "the UNet's first level"
    # no guidance: the VAE's 2 x 8192^2 x 32 = 2^32 values outgrow the UNet's 2^32 too
    flat = diffusion_footprint(pipe, batch=2, height=8192, width=8192, guidance=False)
    assert flat.activation == 2 * 8192 * 8192 * 32 * FP32 * COPIES
    # no size given: the UNet's native sample size times the VAE's scale
    (pipe / "unet" / "config.json").write_text(
        json.dumps({"block_out_channels": [64], "down_block_types": ["DownBlock2D"],
                    "sample_size": 16})
    )  # fmt: skip
    native = diffusion_footprint(pipe, batch=1, height=None, width=None, guidance=False)
    assert native.activation == 64 * 64 * 32 * FP32 * COPIES  # 64 px: the VAE decides


def test_a_transformer_pipeline_floor_by_hand(tmp_path):
    # SD3-like: patch 2, 24 heads x 64 = 1536 wide, VAE [128, 256, 512, 512] (scale 8)
    pipe = _pipe(
        tmp_path,
        transformer={"patch_size": 2, "num_attention_heads": 24, "attention_head_dim": 64},
        vae_blocks=(128, 256, 512, 512),
    )
    got = diffusion_footprint(pipe, batch=4, height=1024, width=1024)
    tokens = 4 * 2 * (1024 // 8 // 2) ** 2  # guidance doubles the batch
    vae = 4 * 1024 * 1024 * 128
    assert got.activation == max(tokens * 1536 * 4, vae) * FP32 * COPIES
    assert got.where == "the VAE decoder's full-size blocks"


@pytest.mark.parametrize(
    ("text", "want"),
    [("64GiB", 64 << 30), ("512M", 512 << 20), ("1.5T", int(1.5 * (1 << 40))), ("4096", 4096),
     ("2 gb", 2 << 30)],
)  # fmt: skip
def test_sizes_read_in_binary_units(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["abc", "-1G", "0", "1e9", "nan", "12 parsecs"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ConfigError, match="--max-memory"):
        parse_size(text)


def test_the_budget_refuses_only_what_exceeds_it(tmp_path):
    pipe = _pipe(tmp_path, unet={"block_out_channels": [64], "down_block_types": ["X"]})
    need = diffusion_footprint(pipe, batch=1, height=512, width=512, guidance=False)
    check_footprint(need, "s", "fix", max_memory=need.total)  # exactly enough: fine
    with pytest.raises(ConfigError, match=r"s need at least .* more than the .* --max-memory; fix"):
        check_footprint(need, "s", "fix", max_memory=need.total - 1)
    free = available_memory()
    assert free is None or free > 0


@pytest.mark.parametrize(
    ("sets", "need_gib"),
    [
        (["--set", "height=8192", "--set", "width=8192", "--set", "batch_size=2"], 96),
        (["--set", "batch_size=1024", "--set", "height=1024", "--set", "width=1024",
          "--limit", "1024"], 768),
        (["--set", "height=512", "--set", "width=512", "--max-memory", "64MiB"], 0),
    ],
)  # fmt: skip
def test_calibrate_refuses_sizes_the_machine_cannot_hold_before_loading(
    tmp_path, capsys, sets, need_gib
):
    # 8192 px batch 2 (inside the caps) went past 14 GB RSS; 1024 px batch 1024 allocated 7 GB
    # then failed on 34 GB: both are refused up front now, with the figure and the fix.
    if need_gib and (available_memory() or 0) >= need_gib * GIB:
        pytest.skip(f"this machine has {need_gib} GiB free: the run would fit")
    out = tmp_path / "o"
    code = main(["calibrate", *sets, "-o", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert "need at least" in err[0] and "batch_size" in err[0]
    assert re.search(r"need at least \d+\.\d [KMGT]iB .* more than the \d+\.\d [KMGT]iB", err[0])
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_sizes_are_shown_in_a_unit_that_tells_them_apart():
    # issue 58: --max-memory 1KiB read "needs 0.0 GiB > 0.0 GiB"
    from opsnn_quant.models.footprint import Footprint, fmt_size, fmt_sizes

    assert [fmt_size(n) for n in (0, 1023, 1024, 16_700, 3 << 20, 5 << 30, 2 << 40)] == [
        "0 B", "1023 B", "1.0 KiB", "16.3 KiB", "3.0 MiB", "5.0 GiB", "2.0 TiB",
    ]  # fmt: skip
    assert fmt_sizes(1024 + 20, 1024) == ["1.02 KiB", "1.00 KiB"]  # one decimal: both 1.0
    assert fmt_sizes(1025, 1024) == ["1.001 KiB", "1.000 KiB"]
    assert fmt_sizes((1 << 20) + 1, 1 << 20) == ["1048577 B", "1048576 B"]  # 1.000 MiB both
    assert fmt_sizes(5 << 20, 1024) == ["5.0 MiB", "1.0 KiB"]
    need = Footprint(weights=0, activation=16_700, where="the VAE decoder's full-size blocks")
    with pytest.raises(ConfigError) as info:
        check_footprint(need, "height 64", "lower it", max_memory=1024)
    assert str(info.value) == (
        "height 64 need at least 16.3 KiB (weights 0 B + 16.3 KiB for the VAE decoder's "
        "full-size blocks), more than the 1.0 KiB --max-memory; lower it, or give --max-memory "
        "SIZE if this machine has more"
    )
