"""What the phases of one ``calibrate`` run share, instead of 7-9 loose arguments each."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from opsnn_quant.formats.calibrate_output import CalibrateOutput
from opsnn_quant.models import load_adapter
from opsnn_quant.models.base import ModelAdapter
from opsnn_quant.pipeline.quantizers import Quantizer
from opsnn_quant.pipeline.recipe import Recipe
from opsnn_quant.pipeline.resume import Journal
from opsnn_quant.pipeline.run import CalibrateRun
from opsnn_quant.pipeline.sharing import Sharing
from opsnn_quant.policy.schema import ResolvedPolicy
from opsnn_quant.policy.targets import Target
from opsnn_quant.recording import RecordedRoots
from opsnn_quant.sources import Source
from opsnn_quant.types import Modality, Progress


@dataclass
class RunContext:
    """One calibrate run, as every phase sees it.

    Attributes:
        run: the run, resolved once (recipe, seed, target, suites, quantizer).
        adapter: the model (float until the quantize phase swaps its modules in place).
        out: the output being built (a temporary sibling, renamed into place at the end).
        say: progress callback, told about each phase.
        timings: wall-clock seconds per phase (``timings.json``; nothing else holds times).
        journal: the phases finished (by an interrupted run this one resumes, or by this one).
        sharing: rank 0 of a distributed run, whose probe pass 1 is shared (None: one process).
        holdout_roots: the float model's recorded root calls on the held-out data, once
            recorded (by the decision that measured on them, or by the float references).
        holdout_figures: the figures on ``holdout_roots`` of each policy the decision measured
            there, by :func:`measured_key` of its resolution: the measure phase does not
            measure the same quantization on the same calls again.
    """

    run: CalibrateRun
    adapter: ModelAdapter
    out: CalibrateOutput
    say: Progress
    timings: dict[str, float] = field(default_factory=dict)
    journal: Journal = field(default_factory=lambda: Journal({}))
    sharing: Sharing | None = None
    holdout_roots: RecordedRoots | None = None
    holdout_figures: dict[str, dict[Modality, dict[str, float]]] = field(default_factory=dict)

    @property
    def recipe(self) -> Recipe:
        """The run's recipe (the command line's overrides applied)."""
        return self.run.recipe

    @property
    def seed(self) -> int:
        """The run's seed."""
        return self.run.seed

    @property
    def quantizer(self) -> Quantizer:
        """Who quantizes: ``opsnn`` (our exact Ascend arithmetic) or ``amct``
        (:mod:`opsnn_quant.pipeline.quantizers`)."""
        return self.run.quantizer

    @property
    def target(self) -> Target:
        """The run's deployment target."""
        return self.run.target

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall-clock seconds of the ``with`` body to ``timings[phase]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - t0


def load_recipe_model(recipe: Recipe, source: Source | None = None) -> ModelAdapter:
    """The recipe's model, through its adapter (a fresh float copy on every call); ``source``:
    its model source as the run resolved it (None: resolved from the recipe's text)."""
    m = recipe.model
    return load_adapter(
        m.family,
        source if source is not None else m.source,
        device=m.device,
        dtype=m.dtype,
        allow_pickle=m.allow_pickle,
        max_memory=m.max_memory,  # the blocks beyond it offloaded (BlockOffload)
        **recipe.settings_dict(),
    )


def measured_key(resolved: ResolvedPolicy) -> str:
    """What makes two resolutions the same quantization of one model: every module's spec or
    precision and the SmoothQuant groups (a policy's rules and notes may differ)."""
    groups = sorted((k, sorted(v)) for k, v in resolved.smoothing_groups.items())
    return repr((sorted(resolved.specs.items()), groups))
