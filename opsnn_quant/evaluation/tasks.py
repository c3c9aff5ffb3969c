"""The task table: one :class:`Task` per kind of suite (``t2i``, ``t2v``, ``asr``).

A task says what a model's outputs are, how a suite's data becomes inputs, how the outputs of
the float baseline and the candidate are compared (the comparison every metric of the task
reads, :class:`~.metrics.Compared`), and which figure tells how close the candidate stays to
the float model. The metrics that apply to a task are the metric table's whose ``tasks`` name it
(:mod:`.metrics`). The built-in tasks are registered by their modules (:mod:`.t2i`,
:mod:`.t2v`, :mod:`.asr`); :func:`register_task` adds another (its module, its metrics), and
:mod:`.registry` holds the lookups. Nothing else in :mod:`opsnn_quant.evaluation` tests a
task's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opsnn_quant.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from opsnn_quant.evaluation.quality import QualityResult
    from opsnn_quant.evaluation.suite_schema import SuiteSpec
    from opsnn_quant.models.base import ModelAdapter


@dataclass(frozen=True)
class TaskInputs:
    """What the quality metrics of a suite read beside both models' outputs: the inputs and
    records they came from, and what the suite's task loads for them once (:attr:`Task.prepare`:
    the reference transcripts; the CLIP scorer and the FD features).

    The evaluation's :class:`~.evaluate.TaskInputs` is one, able to load and measure itself.
    """

    suite: SuiteSpec
    records: list[dict[str, Any]]
    inputs: list[Any]
    references: list[str]
    clip: Any
    features: Any


@dataclass(frozen=True)
class Task:
    """A kind of suite: what its models generate and how two models' outputs are compared.

    Attributes:
        name: the suite's ``task`` (and the models' :attr:`~ModelAdapter.task`).
        outputs: what a model generates, in words (``images``).
        unit: the samples the figures are over, and their intervals resample (``prompts``).
        doing: the progress line of a generation, ``{count}`` outputs
            (``generating {count} images``).
        seeded: a model's outputs depend on a seed: one pass over the inputs per suite seed
            (seed ``s + i`` for input ``i``), the outputs seed-major; else one output per input.
        inputs_file: the file of a data folder that holds the inputs (``prompts.txt``); None:
            the folder itself (audio files and transcripts).
        reference_images: a suite may name reference images (``data.reference``).
        prepare: what the metrics read beside the outputs, loaded once: a
            :class:`TaskInputs` with the suite's inputs and records -> the same with the
            task's own (CLIP and features, reference transcripts); the model's adapter
            and ``allow_pickle`` given.
        compare: both models' outputs (on a :class:`TaskInputs`' inputs, with
            the FD features the ranks extracted already, if any, and the interval level or
            None) -> the :class:`~.quality.QualityResult` of every metric of the task.
        fidelity: the metric (key) of a suite that tells how close the candidate's outputs stay
            to the float model's, what ranks a measured search's candidates of equal coverage.
    """

    name: str
    outputs: str
    unit: str
    doing: str
    seeded: bool
    inputs_file: str | None
    reference_images: bool
    prepare: Callable[[TaskInputs, ModelAdapter, bool], TaskInputs]
    compare: Callable[
        [TaskInputs, list[Any], list[Any], tuple[torch.Tensor, torch.Tensor] | None,
         float | None],
        QualityResult,
    ]  # fmt: skip
    fidelity: Callable[[SuiteSpec], str]

    def outputs_of(self, inputs: int, seeds: int) -> int:
        """How many outputs a model generates for ``inputs`` inputs and ``seeds`` seeds."""
        return inputs * (seeds if self.seeded else 1)


TASKS: dict[str, Task] = {}  # name -> task, in registration order


def register_task(task: Task) -> Task:
    """Add ``task``: suites may name it, and metrics apply to it by its name.

    Raises:
        ConfigError: the name is taken.
    """
    if task.name in TASKS:
        raise ConfigError(f"task {task.name!r} is registered already")
    TASKS[task.name] = task
    return task


def check_task(suite: SuiteSpec, adapter: ModelAdapter, where: str = "") -> None:
    """Refuse a model of another task than the suite's (a model that names none fits any).

    Raises:
        ConfigError: the tasks differ.
    """
    if adapter.task and adapter.task != suite.task:
        raise ConfigError(
            f"{where}suite {suite.name} is a {suite.task} suite, but {adapter.model_id} is a "
            f"{adapter.task} model"
        )
