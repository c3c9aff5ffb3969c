"""``opsnn_quant``'s public names: lazy at run time, real imports for type checkers, py.typed."""

import ast
import tomllib
from pathlib import Path

import opsnn_quant

ROOT = Path(opsnn_quant.__file__).parent


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse((ROOT / "__init__.py").read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_type_checking_imports_are_the_lazy_exports():
    assert _type_checking_imports() == opsnn_quant._EXPORTS
    assert sorted(opsnn_quant.__all__) == sorted(opsnn_quant._EXPORTS)


def test_the_workflow_is_public():
    for name in ("probe", "build_policy", "quantize", "save_quantized", "load_quantized",
                 "export_policy", "evaluate", "load_records", "load_adapter", "QuantModule",
                 "register_quant_module"):  # fmt: skip
        assert name in opsnn_quant.__all__, name
    for name in opsnn_quant.__all__:
        obj = getattr(opsnn_quant, name)
        assert obj is not None and name in dir(opsnn_quant)
    from opsnn_quant.quant.modules import QuantModule

    assert opsnn_quant.QuantModule is QuantModule


def test_py_typed_ships_with_the_package():
    assert (ROOT / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["*"]
