"""How much host memory a run of a diffusion pipeline needs at least, from its config files and
settings alone, so that a size the model cannot run here is refused before anything loads.

The estimate is a floor, not a forecast: the weights as stored (the sum of the component
files' sizes) plus three copies (an op's input, its output, one temporary) of the largest
single activation of one pipeline call, which the sizes decide:

- the VAE decoder's last block runs at the full image size on ``block_out_channels[0]``
  channels: ``batch x channels x frames x height x width`` fp32 values;
- a UNet's first level runs at the latent size on ``block_out_channels[0]`` channels, times 8
  where that level holds transformer blocks (the GEGLU feed-forward's projection:
  ``2 x 4 x channels``), for the conditional and unconditional halves of classifier-free
  guidance;
- a transformer denoiser runs ``tokens x inner_dim`` per sample, times 4 in its feed-forward.

Attention score matrices are left out (PyTorch's CPU attention kernels work in blocks), and so
is everything smaller: a run the estimate passes may still need more, one it refuses cannot fit.
Whisper's activations are a fixed 30 s window and its settings are capped; its estimate is the
weights only. Reads JSON and file sizes only: no torch, no model library.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import ConfigError

if TYPE_CHECKING:
    from opsnn_quant.models.settings import DiTSettings, SDSettings
    from opsnn_quant.sources import Source

FP32 = 4
COPIES = 3  # an op's input, its output and one temporary
GIB = 1 << 30
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class Footprint:
    """The floor of a run's host memory.

    Attributes:
        weights: bytes of the component files (as stored).
        activation: bytes of the largest activation of one call, times :data:`COPIES`.
        where: which activation that is, in words.
    """

    weights: int
    activation: int
    where: str

    @property
    def total(self) -> int:
        """Weights plus activations."""
        return self.weights + self.activation


def parse_size(text: str, option: str = "--max-memory") -> int:
    """``64GiB``, ``512M``, ``1.5T`` or a plain byte count as bytes (binary units).

    Raises:
        ConfigError: not a size, or not positive.
    """
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"{option} takes a size such as 64GiB or 512MiB, got {text!r}")
    unit = (m.group(2) or "").upper().replace("I", "").replace("B", "") or ""
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"{option} must be a positive size, got {text!r}")
    return int(value)


_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def fmt_size(n: int, digits: int = 1) -> str:
    """``n`` bytes in the largest binary unit it reaches (``16.3 KiB``, ``2.0 GiB``), or in
    bytes below 1 KiB, with ``digits`` decimals."""
    for unit, size in _BINARY:
        if abs(n) >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n} B"


def fmt_sizes(*sizes: int) -> list[str]:
    """:func:`fmt_size` of each, with as many decimals (up to 3, then bytes) as it takes for
    sizes that differ to read differently (``1.0 GiB`` beside ``1.0 GiB`` says nothing)."""
    for digits in (1, 2, 3):
        shown = [fmt_size(n, digits) for n in sizes]
        if len(set(shown)) == len(set(sizes)):
            return shown
    return [f"{n} B" for n in sizes]


def available_memory() -> int | None:
    """Bytes this process may still allocate: the kernel's ``MemAvailable``, lowered to the
    cgroup's limit less its usage where one is set; None where neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text(encoding="ascii").strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text(encoding="ascii").strip()
        if limit.isdigit() and used.isdigit():
            found.append(max(int(limit) - int(used), 0))
    except OSError:
        pass
    return min(found) if found else None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


def _first_channels(config: dict[str, Any]) -> int | None:
    blocks = config.get("block_out_channels")
    return _int(blocks[0]) if isinstance(blocks, list) and blocks else None


def weights_bytes(model_dir: Path) -> int:
    """The sizes of the ``*.safetensors`` files of ``model_dir`` and its components."""
    total = 0
    for root, _dirs, files in os.walk(model_dir):
        total += sum(
            (Path(root) / f).stat().st_size
            for f in files
            if f.endswith(".safetensors") and (Path(root) / f).is_file()
        )
    return total


def diffusion_footprint(
    model_dir: Path,
    *,
    batch: int,
    height: int | None,
    width: int | None,
    frames: int = 1,
    guidance: bool = True,
) -> Footprint:
    """The floor of one pipeline call's memory (see the module's docstring).

    Args:
        model_dir: the pipeline directory (``vae/``, ``unet/`` or ``transformer/``).
        batch: prompts per call.
        height: image height in px (None: the denoiser's native size).
        width: image width in px (None: the denoiser's native size).
        frames: video frames (1 for an image).
        guidance: classifier-free guidance doubles the denoiser's batch.
    """
    vae = _json(model_dir / "vae" / "config.json")
    unet = _json(model_dir / "unet" / "config.json")
    dit = _json(model_dir / "transformer" / "config.json")
    blocks = vae.get("block_out_channels")
    scale = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else 8
    native = _int((unet or dit).get("sample_size"))
    h = height or (native * scale if native else None)
    w = width or (native * scale if native else None)
    weights = weights_bytes(model_dir)
    if h is None or w is None:
        return Footprint(weights, 0, "no activation estimate (no image size known)")
    pixels = batch * frames * h * w
    lat = batch * (2 if guidance else 1) * frames * (h // scale) * (w // scale)
    candidates = [(pixels * (_first_channels(vae) or 0), "the VAE decoder's full-size blocks")]
    if unet:
        first = unet.get("down_block_types")
        attn = isinstance(first, list) and bool(first) and "CrossAttn" in str(first[0])
        wide = (_first_channels(unet) or 0) * (8 if attn else 1)
        candidates.append((lat * wide, "the UNet's first level"))
    if dit:
        patch = _int(dit.get("patch_size")) or 1
        heads = _int(dit.get("num_attention_heads")) or 0
        inner = heads * (_int(dit.get("attention_head_dim")) or 0) or _int(dit.get("hidden_size"))
        candidates.append((lat // (patch * patch) * 4 * (inner or 0), "the transformer's blocks"))
    values, where = max(candidates)
    return Footprint(weights, values * FP32 * COPIES, where)


def check_footprint(
    need: Footprint, describe: str, fix: str, max_memory: int | None = None
) -> None:
    """Refuse a run whose floor exceeds ``max_memory`` (default: what this machine has free).

    Args:
        need: the run's floor.
        describe: the settings that decide it, for the message (``height 8192, width 8192,
            batch 2``).
        fix: what to change, for the message.
        max_memory: the user's budget in bytes; None: :func:`available_memory`.

    Raises:
        ConfigError: the floor exceeds the budget.
    """
    budget = max_memory if max_memory is not None else available_memory()
    if budget is None or need.total <= budget:
        return
    whose = "--max-memory" if max_memory is not None else "available on this machine"
    total, limit = fmt_sizes(need.total, budget)  # each in its own unit, never equal-looking
    weights, activation = (fmt_size(n) for n in (need.weights, need.activation))
    raise ConfigError(
        f"{describe} need at least {total} (weights {weights} + {activation} for "
        f"{need.where}), more than the {limit} {whose}; {fix}, or give --max-memory SIZE if "
        "this machine has more"
    )


def check_source_memory(
    source: Source,
    settings: Any,
    *,
    records: int | None = None,
    where: str = "model.settings.",
    max_memory: int | None = None,
    offload: bool = False,
) -> None:
    """The memory check of the family whose settings ``settings`` are (its
    :attr:`~opsnn_quant.models.family.Family.footprint`) on a model source (``zoo:`` or a
    directory), before it loads; a family without an estimate and unresolved sources pass.

    Args:
        source: the model source.
        settings: its validated settings.
        records: at most this many records run (a ``--limit``): a call's batch is no larger.
        where: what the message puts before a setting's name.
        max_memory: the user's budget in bytes (None: what this machine has free).
        offload: the model's blocks are offloaded beyond ``max_memory``
            (:mod:`opsnn_quant.models.offload`): the floor is the activations alone.

    Raises:
        ConfigError: the run's floor exceeds the budget.
    """
    from opsnn_quant.models.family import family_of

    family = family_of(settings)
    if family is None or family.footprint is None:
        return
    path = source.path
    if path.is_dir():
        family.footprint(path, settings, records, where, max_memory, offload)


def check_diffusion_memory(
    path: Path,
    settings: SDSettings | DiTSettings,
    records: int | None,
    where: str,
    max_memory: int | None,
    offload: bool,
) -> None:
    """:func:`check_footprint` of a diffusion pipeline's call at ``settings`` (``batch_size``,
    ``height``, ``width``, ``guidance_scale``, ``num_frames`` if it has one) in the pipeline
    directory ``path``: the diffusion families' footprint (arguments as
    :func:`check_source_memory`'s).

    Raises:
        ConfigError: the run's floor exceeds the budget.
    """
    import dataclasses

    batch = min(settings.batch_size, records) if records else settings.batch_size
    frames = getattr(settings, "num_frames", None) or 1
    # classifier-free guidance runs at a scale above 1 (a pipeline's own default left None:
    # counted without it, the floor stays a floor)
    guidance = settings.guidance_scale is not None and settings.guidance_scale > 1.0
    need = diffusion_footprint(
        path, batch=batch, height=settings.height, width=settings.width, frames=frames,
        guidance=guidance,
    )  # fmt: skip
    if offload:
        need = dataclasses.replace(need, weights=0)
    sizes = [
        f"{where}{k} {getattr(settings, k)}" for k in ("height", "width") if getattr(settings, k)
    ]
    describe = ", ".join([*sizes, f"batch {batch}"] + ([f"{frames} frames"] if frames > 1 else []))
    check_footprint(need, describe, f"lower {where}height/width or {where}batch_size", max_memory)
