"""A run resolved once (pipeline/run.py): each file it names is read once, each name becomes an
object once, and what the phases read (target, source, suites, probe) is on the run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from opsnn_quant.pipeline.recipe import load_recipe
from opsnn_quant.pipeline.run import resolve_run
from opsnn_quant.policy.targets import get_target
from opsnn_quant.sources import Source
from tests.tiny_pipelines import save_tiny_sd, tiny_sd_recipe


def _suite(path: Path, name: str) -> Path:
    path.write_text(
        f"schema_version: 1\nname: {name}\ntask: t2i\ndata: {{folder: eval, samples: 2}}\n"
        "generation: {steps: 2, guidance_scale: 5.0, batch_size: 2}\n"
        "metrics: {fid_features: null, thresholds: {psnr_min: 5.0}}\n"
    )
    return path


def test_every_file_of_a_run_is_read_once_and_every_name_resolved_once(tmp_path, monkeypatch):
    import opsnn_quant.evaluation.suite as suite_module
    import opsnn_quant.pipeline.run as run_module
    import opsnn_quant.sources as sources

    save_tiny_sd(tmp_path / "pipe")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "prompts.txt").write_text("a red circle\na blue square\na circle\n")
    accept, metric = _suite(tmp_path / "accept.yaml", "a"), _suite(tmp_path / "metric.yaml", "m")
    budget = f"budget: {{metric: {{suite: {metric}, samples: 1, start: 2, psnr_min: 5.0}}}}\n"
    recipe = load_recipe(str(tiny_sd_recipe(tmp_path, "tiny", extra=budget)))
    reads: Counter[str] = Counter()
    real_read = suite_module.read_text
    monkeypatch.setattr(suite_module, "read_text", lambda p: reads.update([str(p)]) or real_read(p))
    splits: Counter[str] = Counter()
    real_split = sources.split_source
    monkeypatch.setattr(sources, "split_source", lambda s: splits.update([s]) or real_split(s))
    targets: list[object] = []
    real_target = run_module.get_target
    monkeypatch.setattr(run_module, "get_target", lambda n: targets.append(n) or real_target(n))
    run = resolve_run(recipe, tmp_path / "out", suite=str(accept))
    assert reads == {str(accept): 1, str(metric): 1}  # before: each twice
    assert splits[recipe.model.source] == 1  # the model source, split at the entry alone
    assert isinstance(run.source, Source) and run.source.text == recipe.model.source
    assert targets == [recipe.target] and run.target is get_target(recipe.target)
    assert run.suite is not None and run.suite.name == "a"
    assert run.metric_suite is not None and run.metric_suite.name == "m"
    # the probe a run makes: the target's schemes on its module types, the recipe's seed
    assert run.probe.schemes == tuple(run.target.schemes()) and run.probe.seed == recipe.seed
    assert run.probe.type_schemes == run.target.probe_config().type_schemes


def test_max_memory_is_the_recipes_and_applied_once(tmp_path):
    from opsnn_quant.pipeline.recipe_flags import RecipeEdits

    save_tiny_sd(tmp_path / "pipe")
    recipe = load_recipe(str(tiny_sd_recipe(tmp_path, "tiny")))
    edited = RecipeEdits(max_memory=1 << 40).apply(recipe)
    assert edited.model.max_memory == 1 << 40 and recipe.model.max_memory is None
    assert RecipeEdits().apply(recipe) is recipe  # nothing given: the recipe as it is
    run = resolve_run(edited, tmp_path / "out")
    assert run.recipe.model.max_memory == 1 << 40
