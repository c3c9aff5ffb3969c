"""``opsnn-quant builtins``: the recipes and suites shipped in the package, each validated, and
the registered model families with the recipe and suite a model of each starts from."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add ``builtins`` to ``app``."""

    @app.command("builtins")
    def builtins_cmd(
        names: Annotated[
            list[str] | None,
            typer.Argument(help="load and validate these (default: every built-in)"),
        ] = None,
    ) -> None:
        """List the built-in recipes and suites with their paths, loading each one (a check
        that an installed package ships them intact), then the model families (a plug-in's
        too): the recipe and suite to copy for a model of each, and its usual target."""
        from opsnn_quant.core.resources import builtin_files
        from opsnn_quant.evaluation.suite import load_suite
        from opsnn_quant.models.family import families
        from opsnn_quant.pipeline.recipe import load_recipe

        recipes, suites = builtin_files("recipes"), builtin_files("suites")
        wanted = names or sorted({*recipes, *suites})
        for name in wanted:
            found = False
            if name in recipes:
                load_recipe(name)
                typer.echo(f"recipe  {name:20} {recipes[name]}")
                found = True
            if name in suites:
                load_suite(name)
                typer.echo(f"suite   {name:20} {suites[name]}")
                found = True
            if not found:
                load_recipe(name)  # the recipe loader's error names what is built in
        for family in families() if not names else []:
            starts = ", ".join(
                f"{what} {name}"
                for what, name in (("recipe", family.recipe), ("suite", family.suite))
                if name
            )
            typer.echo(f"family  {family.name:20} {starts or '-'}; target {family.target}")
