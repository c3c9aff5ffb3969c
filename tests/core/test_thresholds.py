"""``Thresholds``: bound name -> a finite number, knowing no name (the metric table does)."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from opsnn_quant.core.thresholds import Thresholds


class _Budget(Thresholds):
    """A subclass with fields of its own, as ``MetricBudget`` is."""

    suite: str
    samples: int = Field(default=32, gt=0)
    start: int | None = None


def test_any_name_is_a_bound_and_numbers_are_floats():
    t = Thresholds.model_validate({"psnr_min": 20, "my_metric_max": "1.5", "ssim_min": None})
    assert t.set_names() == {"psnr_min", "my_metric_max"}  # None: not set
    assert (t.get("psnr_min"), t.get("my_metric_max"), t.get("nope")) == (20.0, 1.5, None)
    assert isinstance(t.get("psnr_min"), float)


@pytest.mark.parametrize(
    ("value", "message"),
    [(float("nan"), "finite number"), (float("inf"), "finite number"), ("high", "valid number")],
)
def test_a_bound_that_is_not_a_finite_number_is_refused_naming_it(value, message):
    with pytest.raises(ValidationError) as info:
        Thresholds.model_validate({"psnr_min": value})
    err = info.value.errors()[0]
    assert err["loc"] == ("psnr_min",) and message in err["msg"]


def test_a_subclass_keeps_its_fields_apart_and_writes_its_bounds_first():
    b = _Budget.model_validate({"suite": "s", "samples": 8, "wer_delta_max_points": 0.5})
    assert b.set_names() == {"wer_delta_max_points"}
    assert b.bounds() == Thresholds(wer_delta_max_points=0.5)
    assert type(b.bounds()) is Thresholds
    # the order a recipe has always been written in: bounds, then the budget's own fields
    dumped = b.model_dump(mode="json", exclude_none=True)
    assert list(dumped) == ["wer_delta_max_points", "suite", "samples"]
    assert _Budget.model_validate(dumped) == b  # written and read back: the same
