"""What the phases of one ``calibrate`` run share, instead of 7-9 loose arguments each."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from opsnn_quant.formats.calibrate_output import CalibrateOutput
from opsnn_quant.models import load_adapter
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.pipeline.resume import Journal
from opsnn_quant.pipeline.sharing import Sharing
from opsnn_quant.recipe import Recipe
from opsnn_quant.types import Progress

Engine = Literal["opsnn", "amct"]
ENGINES: tuple[Engine, ...] = ("opsnn", "amct")


@dataclass
class RunContext:
    """One calibrate run, as every phase sees it.

    Attributes:
        adapter: the model (float until the quantize phase swaps its modules in place).
        recipe: the recipe, with the command line's overrides applied.
        out: the output being built (a temporary sibling, renamed into place at the end).
        seed: the run's seed (the recipe's unless overridden).
        engine: ``opsnn`` (our exact Ascend arithmetic) or ``amct`` (hand the policy to AMCT).
        say: progress callback, told about each phase.
        timings: wall-clock seconds per phase (``timings.json``; nothing else holds times).
        journal: the phases finished (by an interrupted run this one resumes, or by this one).
        sharing: rank 0 of a distributed run, whose probe pass 1 is shared (None: one process).
    """

    adapter: ModelAdapter
    recipe: Recipe
    out: CalibrateOutput
    seed: int
    engine: Engine
    say: Progress
    timings: dict[str, float] = field(default_factory=dict)
    journal: Journal = field(default_factory=lambda: Journal({}))
    sharing: Sharing | None = None

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall-clock seconds of the ``with`` body to ``timings[phase]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - t0


def load_recipe_model(recipe: Recipe) -> ModelAdapter:
    """The recipe's model, through its adapter (a fresh float copy on every call)."""
    m = recipe.model
    return load_adapter(
        m.family,
        m.source,
        device=m.device,
        dtype=m.dtype,
        allow_pickle=m.allow_pickle,
        max_memory=m.max_memory,  # the blocks beyond it offloaded (BlockOffload)
        **recipe.settings_dict(),
    )
