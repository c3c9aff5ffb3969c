"""``Thresholds``: bounds on a quantized model's figures against its float baseline.

One schema for two uses: an acceptance suite's thresholds
(:class:`opsnn_quant.evaluation.suite.Suite`, every name explained in that module) and the
bounds a measured policy search holds its candidates to
(:class:`opsnn_quant.policy.budget.MetricBudget`). A leaf, so that both can name it.
"""

from __future__ import annotations

from pydantic import Field

from opsnn_quant.core.user_config import StrictModel

# Bounds on speed, not quality: judged only on the target's own backend.
LATENCY_BOUNDS = frozenset({"latency_p99_ratio_max", "memory_ratio_max"})


class Thresholds(StrictModel):
    """Bounds on a candidate's figures (see :mod:`opsnn_quant.evaluation.suite` for each)."""

    fid_vs_baseline_max: float | None = Field(default=None, ge=0.0)
    fid_delta_max: float | None = None
    kid_delta_max: float | None = None
    clip_score_delta_min: float | None = None
    psnr_min: float | None = Field(default=None, ge=0.0)
    ssim_min: float | None = Field(default=None, ge=-1.0, le=1.0)
    wer_delta_max_points: float | None = None
    cer_delta_max_points: float | None = None
    agreement_wer_max_points: float | None = Field(default=None, ge=0.0)
    agreement_cer_max_points: float | None = Field(default=None, ge=0.0)
    latency_p99_ratio_max: float | None = Field(default=None, gt=0.0)
    memory_ratio_max: float | None = Field(default=None, gt=0.0)

    def set_names(self) -> set[str]:
        """Names of the thresholds given."""
        return {k for k in Thresholds.model_fields if getattr(self, k) is not None}

    def bounds(self) -> Thresholds:
        """Only the bounds (a subclass's other fields left out)."""
        return Thresholds(**{k: getattr(self, k) for k in Thresholds.model_fields})

    def quality_problem(self) -> str | None:
        """Why these cannot bound a measured search (None: they can): no bound at all, or a
        speed bound, which a slice of quality measurements cannot judge."""
        names = self.set_names()
        if not names:
            return "sets no bound (e.g. wer_delta_max_points: 0.5)"
        speed = sorted(LATENCY_BOUNDS & names)
        if speed:
            return f"{', '.join(speed)} is a speed bound; a slice measures quality"
        return None
