"""Where an output may go: never over an input, the working directory or the package, a home
directory, a filesystem root or mount point, a directory holding a ``.git`` or one that is not
an opsnn-quant output; nor where nothing can be written. Each check says why in one line."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from opsnn_quant.errors import OutputError
from opsnn_quant.output.files import write_error
from opsnn_quant.output.ownership import first_foreign_entry, manifest_of, read_marker


def _is_within(path: Path, ancestor: Path) -> bool:
    return path == ancestor or ancestor in path.parents


PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The opsnn-quant package: an input of every command (its built-in models, recipes, suites)."""


def check_not_an_input(target: Path, inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse ``target`` where it is, contains or lies in the working directory, an input or
    the package.

    Raises:
        OutputError: it is.
    """
    resolved = target.resolve()
    if _is_within(Path.cwd().resolve(), resolved):
        raise OutputError(
            f"output {target} is the working directory or contains it; choose a new directory"
        )
    named = [(str(item), Path(item).resolve()) for item in inputs]
    named.append(("the opsnn-quant package (its built-in models, recipes and suites)", PACKAGE_DIR))
    for item, src in named:
        if _is_within(src, resolved):
            raise OutputError(f"output {target} would replace the input {item}; choose another")
        if _is_within(resolved, src):
            raise OutputError(f"output {target} is inside the input {item}; choose another")


def check_parents(target: Path) -> None:
    """Refuse ``target`` where its nearest existing ancestor is a file.

    Raises:
        OutputError: it is.
    """
    for parent in target.resolve().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"output {target}: {parent} is a file, not a directory")
            return


# How a refusal that --force cannot lift ends: of what is there, and of where it is.
NEVER_FORCED = "choose a new or empty directory (--force replaces only opsnn-quant outputs)"


NEVER_HERE = "choose a new directory inside it (--force replaces only opsnn-quant outputs)"


def _homes() -> list[Path]:
    """The user's home directories: ``$HOME`` and the password database's (they may differ)."""
    found = [os.environ.get("HOME", "")]
    with contextlib.suppress(ImportError, KeyError, OSError):  # no pwd (Windows), no entry
        import pwd

        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    return [Path(h).resolve() for h in dict.fromkeys(found) if h and os.path.isabs(h)]


def why_never_at(target: Path) -> str | None:
    """Why the location ``target`` is never replaced, ``--force`` or not: a filesystem root or
    mount point, a home directory or a directory holding one (None: it may be)."""
    # what would be replaced: the entry itself (a link is replaced, not what it points to)
    plain = target.name not in ("", ".", "..")
    where = target.absolute().parent.resolve() / target.name if plain else target.resolve()
    if where == Path(where.anchor) or (not target.is_symlink() and os.path.ismount(where)):
        return "is a filesystem root or mount point"
    for home in _homes():
        if where == home:
            return "is your home directory"
        if _is_within(home, where):
            return f"holds your home directory {home}"
    return None


def _first_git(directory: Path) -> str | None:
    """The first ``.git`` under ``directory`` (relative path), or None; links not followed."""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            if name == ".git":
                return (Path(root) / name).relative_to(directory).as_posix()
    return None


def why_never_replaced(directory: Path) -> str | None:
    """Why the existing, non-empty ``directory`` is not ours to replace even with ``--force``
    (None: it is an opsnn-quant output, perhaps edited since or of another kind)."""
    found = read_marker(directory)
    if found.kind is None:
        return "exists and is not an opsnn-quant output"
    git = _first_git(directory)  # walked only in our outputs (a home is refused without it)
    if git is not None:
        return f"holds {git} (a version-control repository)"
    if found.marker is not None:
        held = manifest_of(directory)
        if held and not set(held) & set(found.marker.manifest):
            return (
                f"holds {min(held)} but none of the files its opsnn-quant marker lists (a "
                "marker copied there vouches for nothing)"
            )
    return None


def why_not_replaceable(target: Path, kind: str) -> str | None:
    """Why ``target`` (an existing, non-empty directory) is not ours to replace, or None."""
    found = read_marker(target)
    if found.kind is None:
        return "exists and is not an opsnn-quant output"
    if found.kind != kind:
        return f"exists and is a '{found.kind}' output"
    if found.marker is None:
        return "exists and its marker lists no contents (an older opsnn-quant wrote it)"
    foreign = first_foreign_entry(target, found.marker)
    if foreign is not None:
        return (
            f"holds {foreign}, which is not part of the {kind} output opsnn-quant wrote there "
            "(added or changed since)"
        )
    return None


def link_text(target: Path) -> str:
    """``a symbolic link to X``, for a refusal naming the link ``target``."""
    try:
        return f"a symbolic link to {os.readlink(target)}"
    except OSError:
        return "a symbolic link"


def check_writable(target: Path) -> None:
    """Refuse ``target`` where its nearest existing ancestor cannot be written (nothing is
    left behind).

    Raises:
        OutputError: it cannot.
    """
    # Probe the nearest existing ancestor: a refusal after this check (the next output of the
    # same command) must not leave directories behind, so nothing is created here.
    parent = next(p for p in (target.absolute().parent, *target.absolute().parents) if p.exists())
    try:
        probe = tempfile.mkdtemp(prefix=f".{target.name}.probe-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise write_error(target, exc) from exc
