"""Safe outputs: atomic writes, output directories we own, and JSON configs read strictly.

Every output directory opsnn-quant writes carries a marker file (:data:`MARKER`) naming the kind
of output (``calibrate``, ``probe``, ``quant``, ``report``...). A directory is replaced only when
it is empty or carries the marker of the same kind, unless the caller forces it; anything else is
refused with one line naming the path. Directories are built in a ``<name>.tmp-*`` sibling and
swapped in by two renames (the old one aside to ``<name>.old-*``, the new one into place); a run
killed between the two is repaired by the next one, which restores or removes what we left.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from opsnn_quant.errors import ConfigError, InputError

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)

MARKER = ".opsnn-quant.json"
MARKER_SCHEMA = 1
# errno values that mean "this output location cannot be written" (a user's problem, exit 2).
WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.ENOTDIR}


class OutputError(InputError):
    """An output path that cannot or must not be written (exists, not ours, read-only, full)."""


def _umask() -> int:
    # os.umask can only be read by setting it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _follow_umask(path: Path, mode: int) -> None:
    # mkstemp/mkdtemp create private (0600/0700) entries; outputs are ordinary files.
    path.chmod(mode & ~_umask())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temporary sibling of ``path`` and rename it into place.

    Raises:
        OutputError: ``path`` is a directory, or its location cannot be written.
    """
    target = Path(path)
    if target.is_dir():
        raise OutputError(f"{target} is a directory; give a file path")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    except OSError as exc:
        raise write_error(target, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _follow_umask(Path(tmp), 0o666)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_error(path: Path, exc: OSError) -> OutputError:
    """A one-line :class:`OutputError` for an OSError raised while writing ``path``."""
    reason = exc.strerror or str(exc)
    return OutputError(f"cannot write {path}: {reason}")


def _marker_kind(directory: Path) -> str | None:
    """The kind recorded in ``directory``'s marker (None: no readable marker)."""
    try:
        data = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("tool") != "opsnn-quant":
        return None
    kind = data.get("kind")
    return kind if isinstance(kind, str) else None


def _write_marker(directory: Path, kind: str) -> None:
    doc = {"tool": "opsnn-quant", "kind": kind, "schema_version": MARKER_SCHEMA}
    (directory / MARKER).write_text(json.dumps(doc, sort_keys=True) + "\n", encoding="utf-8")


def _is_within(path: Path, ancestor: Path) -> bool:
    return path == ancestor or ancestor in path.parents


def _ours(path: Path) -> bool:
    return path.is_dir() and _marker_kind(path) is not None


def repair_siblings(path: str | os.PathLike[str]) -> list[str]:
    """Finish or undo what an interrupted run left beside ``path``; returns what was done.

    Only entries carrying our marker are touched: a ``<name>.old-*`` directory is the previous
    output renamed aside by a swap that did not finish: it is put back when ``path`` is missing,
    removed when ``path`` is there; a ``<name>.tmp-*`` directory is an unfinished output and is
    removed.
    """
    target = Path(path)
    parent = target.parent
    if not parent.is_dir():
        return []
    done = []
    for old in sorted(parent.glob(f"{target.name}.old-*")):
        if not _ours(old):
            continue
        if not target.exists():
            os.replace(old, target)
            done.append(f"restored {target} from {old.name} (a previous run stopped mid-swap)")
        else:
            shutil.rmtree(old, ignore_errors=True)
            done.append(f"removed {old} (left by a previous run)")
    for tmp in sorted(parent.glob(f"{target.name}.tmp-*")):
        if _ours(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            done.append(f"removed {tmp} (unfinished output of a previous run)")
    for line in done:
        log.warning("%s", line)
    return done


def check_output_dir(
    path: str | os.PathLike[str],
    kind: str,
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Refuse an output directory we must not replace, before any work is done.

    Args:
        path: the output directory.
        kind: the kind of output the command writes (its marker).
        force: replace an existing directory or file that is not an output of this kind.
        inputs: paths the command reads (recipe, model directory, data): the output may not be
            one of them or contain one.

    Returns:
        ``path`` as a Path.

    Raises:
        OutputError: ``path`` is the working directory or contains it, is or contains an input,
            has a file as parent, exists and is not ours (without ``force``), or its parent
            cannot be written.
    """
    target = Path(path)
    resolved = target.resolve()
    cwd = Path.cwd().resolve()
    if _is_within(cwd, resolved):
        raise OutputError(
            f"output {target} is the working directory or contains it; choose a new directory"
        )
    for item in inputs:
        src = Path(item).resolve()
        if _is_within(src, resolved):
            raise OutputError(f"output {target} would replace the input {item}; choose another")
    for parent in resolved.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"output {target}: {parent} is a file, not a directory")
            break
    repair_siblings(target)
    if target.is_file() or target.is_symlink():
        if not force:
            raise OutputError(f"output {target} is an existing file; remove it or pass --force")
    elif target.is_dir() and any(target.iterdir()):
        found = _marker_kind(target)
        if found != kind and not force:
            what = "not an opsnn-quant output" if found is None else f"a '{found}' output"
            raise OutputError(
                f"output {target} exists and is {what}; choose another or pass --force"
            )
    _check_writable(target)
    return target


def _check_writable(target: Path) -> None:
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise write_error(target, exc) from exc


@contextlib.contextmanager
def atomic_dir(
    path: str | os.PathLike[str], kind: str = "output", *, force: bool = False
) -> Iterator[Path]:
    """Build a directory in ``<path>.tmp-*`` and swap it into place when the block succeeds.

    On an exception (Ctrl-C and SIGTERM included) the temporary directory is removed and
    ``path`` keeps its previous contents. The swap renames the old directory aside first, so at
    no point is a half-written ``path`` visible; a crash between the two renames is repaired by
    :func:`repair_siblings` on the next run.

    Args:
        path: the output directory.
        kind: the kind of output, recorded in its marker; an existing ``path`` is replaced only
            when it is empty or an output of this kind.
        force: replace ``path`` whatever it is.

    Raises:
        OutputError: see :func:`check_output_dir`; also when writing fails for lack of space or
            permission (the previous output is left as it was).
    """
    target = Path(path)
    check_output_dir(target, kind, force=force)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
        _follow_umask(tmp, 0o777)
        _write_marker(tmp, kind)
    except OSError as exc:
        raise write_error(target, exc) from exc
    try:
        yield tmp
    except OutputError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        # A nested output (OUT/quant) failed: name it where the user will look for it.
        raise OutputError(str(exc).replace(str(tmp), str(target))) from exc
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in WRITE_ERRNOS:
            raise write_error(target, exc) from exc
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap(tmp, target)


def _swap(tmp: Path, target: Path) -> None:
    old = None
    if target.is_dir() and not target.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f"{target.name}.old-", dir=target.parent))
        old.rmdir()
        os.replace(target, old)
        if not _ours(old):
            # A forced replacement of a foreign directory: mark the aside copy as ours so that a
            # crash right here is repaired like any other swap.
            _write_marker(old, "replaced")
    elif target.exists() or target.is_symlink():
        target.unlink()  # a file, replaced with --force (check_output_dir refused it otherwise)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def load_json_model(cls: type[_M], path: str | os.PathLike[str]) -> _M:
    """Read a JSON file and validate it as the pydantic model ``cls``.

    Raises:
        ConfigError: Missing file, bad JSON, not UTF-8 or a schema violation; the message names
            the file and the first offending field.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p} not found")
    try:
        return cls.model_validate_json(read_text(p))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{p}: {where}: {first['msg']}") from exc


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's contents.

    Raises:
        ConfigError: missing, unreadable or not UTF-8 (the message names the file and the byte).
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{p} not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{p} is a directory, not a file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc


# ---- JSON files and node maps ----------------------------------------------------------------


def write_json_atomic(
    path: str | os.PathLike[str], doc: object, *, indent: int | None = 1, sort_keys: bool = True
) -> Path:
    """Write ``doc`` as JSON through :func:`atomic_write_text`; returns the path.

    Raises:
        OutputError: as :func:`atomic_write_bytes`.
    """
    return atomic_write_text(path, json.dumps(doc, indent=indent, sort_keys=sort_keys))


def load_node_map(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Module -> ONNX node names from ``<model>.nodes.json`` (or a plain ``{module: [nodes]}``).

    ``path`` may name the ``.onnx`` file: its ``.nodes.json`` sibling is read. A light JSON
    reader (no torch, no onnx) for the ATC exports and the ONNX tools alike.

    Raises:
        ConfigError: missing file, invalid JSON, or not a mapping of lists of strings.
    """
    p = Path(path)
    if p.suffix == ".onnx":
        p = p.with_suffix(".nodes.json")
    if not p.is_file():
        raise ConfigError(f"node map {p} not found")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    nodes = doc.get("nodes", doc) if isinstance(doc, dict) else None
    if not isinstance(nodes, dict) or not all(
        isinstance(v, list) and all(isinstance(x, str) for x in v) for v in nodes.values()
    ):
        raise ConfigError(f"{p}: expected {{module name: [ONNX node names]}} (or under 'nodes')")
    return {str(k): list(v) for k, v in nodes.items()}
