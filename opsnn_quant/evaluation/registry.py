"""The metric and task tables with the built-in entries registered, and where callers look them
up (:mod:`.metrics`, :mod:`.tasks`).

The built-in tasks and their metrics are their modules' (:mod:`.t2i`, :mod:`.t2v`,
:mod:`.asr`), the speed metrics :mod:`.speed`'s. A suite's ``task`` and thresholds, a recipe's
``budget.metric``, the report's criteria and the measured search's figures are looked up here,
never by a name written elsewhere. :func:`register_metric` / :func:`register_task` add a team's
own, from outside the package; a metric registered before a suite is read is one the suite may
bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opsnn_quant.core.thresholds import Thresholds
from opsnn_quant.core.user_config import did_you_mean
from opsnn_quant.errors import ConfigError
from opsnn_quant.evaluation import asr, speed, t2i, t2v  # noqa: F401  (registers the built-in entries)
from opsnn_quant.evaluation.metrics import (
    TABLE,
    Compared,
    Metric,
    Range,
    register_metric,
    unregister_metric,
)
from opsnn_quant.evaluation.tasks import TASKS, Task, check_task, register_task

if TYPE_CHECKING:
    from opsnn_quant.evaluation.suite_schema import SuiteSpec

__all__ = [
    "Compared",
    "Metric",
    "Range",
    "Task",
    "bounded_by",
    "budget_problem",
    "check_task",
    "metric",
    "metrics",
    "quality_problem",
    "records_problem",
    "register_metric",
    "register_task",
    "requirements_problem",
    "task",
    "tasks",
    "thresholds_problem",
    "unregister_metric",
]


def metrics(task_name: str | None = None) -> list[Metric]:
    """The metrics (that apply to ``task_name``): the quality ones in registration order, then
    the speed ones: the order of a report's criteria."""
    chosen = [m for m in TABLE.values() if task_name is None or m.applies_to(task_name)]
    return [m for m in chosen if not m.speed] + [m for m in chosen if m.speed]


def metric(key: str) -> Metric:
    """The metric ``key``.

    Raises:
        ConfigError: no such metric (the message lists them).
    """
    if key in TABLE:
        return TABLE[key]
    raise ConfigError(f"unknown metric {key!r}{did_you_mean(key, list(TABLE))}; "
                      f"the metrics: {', '.join(TABLE)}")  # fmt: skip


def bounded_by(name: str) -> Metric | None:
    """The metric a suite threshold ``name`` bounds (None: none)."""
    return next((m for m in TABLE.values() if m.bound == name), None)


def task(name: str) -> Task:
    """The task ``name``.

    Raises:
        ConfigError: no such task (the message lists them).
    """
    if name in TASKS:
        return TASKS[name]
    raise ConfigError(f"unknown task {name!r}; the tasks: {', '.join(TASKS)}")


def tasks() -> list[Task]:
    """Every task, in registration order."""
    return list(TASKS.values())


def thresholds_problem(
    bounds: Thresholds, where: str, task_name: str | None = None, others: Sequence[str] = ()
) -> str | None:
    """Why ``bounds`` are not thresholds (None: they are): a name no metric is bounded by, a
    value its metric's bound may not take, or (with ``task_name``) a metric of another task.
    ``where`` names the bounds in the message (``metrics.thresholds``); ``others``: the keys
    written beside them (``suite``), for the hint at a misspelt one."""
    names = sorted(bounds.set_names())
    found_by: dict[str, Metric] = {}
    for name in names:
        found = bounded_by(name)
        if found is None:
            known = [m.bound for m in metrics(task_name)]
            whose = f"{task_name} " if task_name else ""
            hint = did_you_mean(name, [*known, *others])
            return (f"{where}.{name}: no metric is bounded by it{hint} "
                    f"({whose}thresholds: {', '.join(known)})")  # fmt: skip
        value = float(bounds.get(name) or 0.0)
        problem = found.bound_range.problem(value) or _fails_float(found, value)
        if problem:
            return f"{where}.{name}: {problem}"
        found_by[name] = found
    if task_name is not None:
        wrong = [n for n in names if not found_by[n].applies_to(task_name)]
        if wrong:
            return f"thresholds {wrong} do not apply to task {task_name!r}"
    return None


def _fails_float(found: Metric, value: float) -> str | None:
    """Why the bound ``value`` of a difference against the float model fails the float model
    itself (None: it does not): its own difference is 0, so ``<= -1`` or ``>= +0.5`` fails every
    candidate and the float model alike (a search would keep nothing in int8 and still not pass)."""
    if not found.signed:
        return None
    if (found.comparator == "<=" and value < 0) or (found.comparator == ">=" and value > 0):
        side = ">= 0" if found.comparator == "<=" else "<= 0"
        return (
            f"{value:g} fails the float model itself ({found.key} is candidate - float model: 0 "
            f"for the float model); a bound of a difference is {side}"
        )
    return None


def requirements_problem(suite: SuiteSpec) -> str | None:
    """What a suite that bounds a metric does not set but the metric needs (its
    :attr:`~.metrics.Metric.requires`, e.g. reference images), every bound with the same
    problem named; None: nothing."""
    names = suite.metrics.thresholds.set_names()
    problems: dict[str, list[str]] = {}
    for m in metrics():
        problem = m.requires(suite) if m.bound in names and m.requires is not None else None
        if problem:
            problems.setdefault(problem, []).append(m.bound)
    for problem, bounds in problems.items():
        return problem.replace("{names}", ", ".join(bounds))
    return None


def records_problem(suite: SuiteSpec, records: Sequence[dict[str, Any]]) -> str | None:
    """What the suite's ``records`` lack that a metric the suite bounds reads (its
    :attr:`~.metrics.Metric.requires_records`, e.g. a motion label per record), every bound
    with the same problem named; None: nothing."""
    names = suite.metrics.thresholds.set_names()
    problems: dict[str, list[str]] = {}
    for m in metrics():
        check = m.requires_records if m.bound in names else None
        problem = None if check is None else check(records)
        if problem:
            problems.setdefault(problem, []).append(m.bound)
    for problem, bounds in problems.items():
        return problem.replace("{names}", ", ".join(bounds))
    return None


def _example() -> str:
    """A bound of each task's first metric that has a typical one (``psnr_min: 18``)."""
    seen: list[str] = []
    for t in tasks():
        first = next((m for m in metrics(t.name) if m.default_bound is not None), None)
        if first is not None:
            seen.append(f"{first.bound}: {first.default_bound:g}")
    return ", ".join(seen)


def quality_problem(bounds: Thresholds) -> str | None:
    """Why ``bounds`` cannot hold a measured search's candidates (None: they can): no bound at
    all, or a speed bound, which a slice of quality measurements cannot judge."""
    names = bounds.set_names()
    if not names:
        return f"sets no bound (e.g. {_example()})"
    speed_bounds = sorted(n for n in names if (m := bounded_by(n)) is not None and m.speed)
    if speed_bounds:
        return f"{', '.join(speed_bounds)} is a speed bound; a slice measures quality"
    return None


def budget_problem(
    bounds: Thresholds, task_name: str | None = None, others: Sequence[str] = ()
) -> str | None:
    """Why ``bounds`` (a recipe's ``budget.metric``) cannot hold a measured search's
    candidates (None: they can): :func:`thresholds_problem` (with the suite's task when known)
    or :func:`quality_problem`; the message names the field first (``budget.metric...: ``)."""
    where = "budget.metric"
    problem = thresholds_problem(bounds, where, task_name, others)
    if problem is None:
        problem = quality_problem(bounds)
    if problem is None or problem.startswith(f"{where}."):
        return problem
    return f"{where}: {problem}"
