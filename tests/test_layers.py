"""The three wings, held by the imports: the library computes values, ``formats/`` owns the bytes
of each format, and only the command layer (``pipeline/``, ``cli/``) owns an output directory."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opsnn_quant"
COMMANDS = ("pipeline", "cli")


def _modules() -> dict[str, ast.Module]:
    return {
        p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _imported(tree: ast.Module) -> set[str]:
    """Every module and name an ``import`` or ``from ... import`` of the file names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_only_the_command_layer_owns_an_output_directory():
    owners = sorted(
        path for path, tree in _modules().items()
        if any(n.endswith(".atomic_dir") for n in _imported(tree))
    )  # fmt: skip
    assert owners and all(p.split("/")[0] in COMMANDS for p in owners), owners


def test_the_library_never_imports_the_command_layer():
    upward = {
        path: sorted(n for n in _imported(tree)
                     if n.split(".")[:2] in (["opsnn_quant", "pipeline"], ["opsnn_quant", "cli"]))
        for path, tree in _modules().items()
        if path.split("/")[0] not in COMMANDS and path not in ("__main__.py", "__init__.py")
    }  # fmt: skip
    assert {p: n for p, n in upward.items() if n} == {}


def test_the_format_table_names_no_handler_in_the_command_layer():
    from opsnn_quant.formats.registry import exporters

    assert [e.handler for e in exporters() if e.handler.startswith("opsnn_quant.pipeline")] == []


def test_every_format_module_imports_first():
    # an import circle shows only when a module of it is imported before the others (a test
    # module that imported the shared safetensors reader first broke on one): each format module
    # is imported first in a fresh module table, in one child process
    import subprocess
    import sys

    names = sorted(
        "opsnn_quant." + p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        .removesuffix(".__init__")
        for p in (PACKAGE / "formats").rglob("*.py")
    )  # fmt: skip
    script = (
        "import importlib, sys\n"
        "bad = []\n"
        f"for name in {names!r}:\n"
        "    for m in [m for m in sys.modules if m.startswith('opsnn_quant')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        bad.append(f'{name}: {exc}')\n"
        "print('\\n'.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""


def test_no_command_imports_another_commands_module():
    # shared helpers live below the commands (recipe.py, formats/, pipeline/context.py ...)
    commands = ("calibrate", "probe", "evaluate", "export_weights", "policy_build")
    modules = _modules()
    crossing = {
        cmd: sorted(n for n in _imported(modules[f"pipeline/{cmd}.py"])
                    for other in commands if other != cmd
                    if n == f"opsnn_quant.pipeline.{other}"
                    or n.startswith(f"opsnn_quant.pipeline.{other}."))
        for cmd in commands
    }  # fmt: skip
    assert {c: n for c, n in crossing.items() if n} == {}


def _file_edges() -> dict[str, set[str]]:
    """File -> the package files it imports (every import, a lazy one inside a function too;
    ``pkg.mod.func`` names ``pkg/mod.py``)."""
    modules = _modules()
    name_of = {
        "opsnn_quant." + p.removesuffix(".py").replace("/", ".").removesuffix(".__init__"): p
        for p in modules
    }

    def target(name: str) -> str | None:
        while name and name not in name_of:  # "pkg.mod.func" -> "pkg.mod"
            name = name.rpartition(".")[0]
        return name_of.get(name)

    return {p: {t for n in _imported(tree) if (t := target(n)) and t != p}
            for p, tree in modules.items()}  # fmt: skip


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return circles


def test_no_file_imports_itself_back():
    # 0 import circles, counting every import (a lazy one inside a function too): a circle that
    # only a lazy import keeps from breaking at load time still ties the files together
    edges = {p: {t for t in ts if not t.endswith("__init__.py")} for p, ts in _file_edges().items()}
    assert _circles(edges) == []


def test_no_folder_imports_itself_back():
    # the same one level up: a folder (or a file of the package root) is one room, and no two
    # rooms import each other, however indirectly (core/ is the leaves' room: a file there that
    # imports a root file which imports core/ would tie them, as producers.py once did)
    def room(path: str) -> str:
        return path.split("/")[0]

    rooms: dict[str, set[str]] = {}
    for p, targets in _file_edges().items():
        if p in ("__init__.py", "__main__.py"):
            continue  # the package's face and its entry point import from everywhere
        rooms.setdefault(room(p), set()).update(
            room(t) for t in targets if room(t) != room(p) and t != "__init__.py"
        )
    assert _circles(rooms) == []
