"""What in a directory opsnn-quant wrote, and may therefore replace or remove.

Three records, each proving ownership of exactly the bytes it names and nothing more:

- The **marker** (:data:`MARKER`) of an output directory: the kind of output (``calibrate``,
  ``probe``, ``quant``, ``report``...), a random token of the run that wrote it, and the
  **manifest** of the directory when it was swapped into place (relative path -> size of every
  file). A directory is ours only entry by entry: a file the manifest does not list, or whose
  size changed, is the user's (a marker copied into a user's folder vouches for nothing in it).
- The **ledger** (:data:`LEDGER`) of loose files written into a directory that is not ours
  (``policy export -o FILE``, the notes of ``export-weights -o DIR``): file name -> kind and
  SHA-256 of what was written. A file is ours when its bytes are still those.
- The **token** in the names of a run's temporary siblings, ``<name>.tmp-<token>`` (the output
  being built, its marker holding the same token) and ``<name>.old-<token>`` (the previous
  output renamed aside by the swap of the run with that token). Only such debris, of the same
  kind, is removed or restored by a later run; a user's ``run.old-keep`` is not debris.

A run holds an exclusive ``flock`` on its temporary directory's marker while it builds it, so
another run to the same output sees it is live and leaves it alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

MARKER = ".opsnn-quant.json"
LEDGER = ".opsnn-quant-files.json"
MARKER_SCHEMA = 2
TOOL = "opsnn-quant"
_TOKEN = re.compile(r"^[0-9a-f]{32}$")


def new_token() -> str:
    """A fresh run token (128 random bits, hex)."""
    return secrets.token_hex(16)


def is_token(text: str) -> bool:
    """Whether ``text`` has the shape of a run token."""
    return _TOKEN.match(text) is not None


@dataclass(frozen=True)
class Marker:
    """An output directory's marker.

    Attributes:
        kind: the kind of output.
        token: the token of the run that wrote it.
        manifest: relative path -> size of each file of the output (the marker excluded).
        hashes: relative path -> SHA-256 of each file, recorded only in an unfinished output
            kept for ``--resume`` (a same-length edit changes no size); empty elsewhere (an
            output swapped into place is not hashed: nothing reads it).
    """

    kind: str
    token: str
    manifest: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The marker file's text (``sha256`` only when there are hashes: a finished output's
        marker is the same bytes as before they existed, but for its token)."""
        doc: dict[str, object] = {
            "tool": TOOL,
            "schema_version": MARKER_SCHEMA,
            "kind": self.kind,
            "token": self.token,
            "manifest": self.manifest,
        }
        if self.hashes:
            doc["sha256"] = self.hashes
        return json.dumps(doc, sort_keys=True, indent=1) + "\n"


@dataclass(frozen=True)
class MarkerFound:
    """What a directory's marker file says: nothing of ours, an older marker, or a marker.

    Attributes:
        marker: the marker, when it is a complete one of this schema.
        legacy_kind: the kind named by an older marker that carries no manifest.
    """

    marker: Marker | None = None
    legacy_kind: str | None = None

    @property
    def kind(self) -> str | None:
        """The kind of output named, whichever marker it is."""
        return self.marker.kind if self.marker is not None else self.legacy_kind


def read_marker(directory: Path) -> MarkerFound:
    """Read ``directory``'s marker (empty :class:`MarkerFound` when absent or not ours)."""
    try:
        doc = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return MarkerFound()
    if not isinstance(doc, dict) or doc.get("tool") != TOOL or not isinstance(doc.get("kind"), str):
        return MarkerFound()
    token, manifest = doc.get("token"), doc.get("manifest")
    hashes = doc.get("sha256", {})  # absent in markers written before hashes were kept
    if (
        not isinstance(token, str)
        or not is_token(token)
        or not isinstance(manifest, dict)
        or not all(isinstance(k, str) and type(v) is int for k, v in manifest.items())
        or not isinstance(hashes, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items())
    ):
        return MarkerFound(legacy_kind=doc["kind"])
    return MarkerFound(Marker(doc["kind"], token, dict(manifest), dict(hashes)))


def manifest_of(directory: Path) -> dict[str, int]:
    """Relative path -> size of every file and link under ``directory``, its marker excluded."""
    out: dict[str, int] = {}
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        links = [d for d in dirs if (base / d).is_symlink()]  # never walked into
        for name in [*files, *links]:
            rel = (base / name).relative_to(directory).as_posix()
            if rel != MARKER:
                out[rel] = (base / name).lstat().st_size
    return dict(sorted(out.items()))


def hashes_of(directory: Path, manifest: dict[str, int]) -> dict[str, str]:
    """Relative path -> SHA-256 of each regular file of ``manifest`` under ``directory`` (a
    link is listed by size only: :func:`opsnn_quant.output.directories.check_adoptable` refuses links)."""
    out: dict[str, str] = {}
    for rel in manifest:
        path = directory / rel
        if path.is_file() and not path.is_symlink():
            out[rel] = file_sha256(path)
    return out


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks (a kept output may hold weights)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def first_foreign_entry(directory: Path, marker: Marker) -> str | None:
    """The first entry under ``directory`` (sorted) that its manifest does not list with the
    same size.

    Only the directory's own marker vouches for its entries: a nested output replaced later
    (``export-weights`` redoing ``export/ascendv1``) or a loose file written into it later is
    recorded in that manifest when it is written (:mod:`opsnn_quant.output`); the marker of a
    copied sub-directory (``cp -a OUT/quant OUT/quant.bak``) or a copied ledger vouches for
    nothing.
    """
    for rel, size in manifest_of(directory).items():
        if marker.manifest.get(rel) != size:
            return rel
    return None


# ---- loose files --------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_ledger(directory: Path) -> dict[str, dict[str, str]] | None:
    try:
        doc = json.loads((directory / LEDGER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("tool") == TOOL else None
    if not isinstance(files, dict):
        return None
    return {
        str(k): v
        for k, v in files.items()
        if isinstance(v, dict)
        and isinstance(v.get("kind"), str)
        and isinstance(v.get("sha256"), str)
    }


def owned_file(path: Path, kind: str | None) -> bool:
    """Whether ``path`` holds exactly the bytes opsnn-quant wrote there as a ``kind`` file
    (any kind when None), by the ledger beside it."""
    entry = (_read_ledger(path.parent) or {}).get(path.name)
    if entry is None or (kind is not None and entry["kind"] != kind):
        return False
    try:
        if path.is_symlink() or not path.is_file():
            return False
        return _sha256(path.read_bytes()) == entry["sha256"]
    except OSError:
        return False


def listed_file(path: Path) -> bool:
    """Whether the ledger beside ``path`` records a file of that name: opsnn-quant wrote one
    there, whatever its bytes are now (``--force`` may replace it; a file never recorded is
    the user's, whatever the flags)."""
    return path.name in (_read_ledger(path.parent) or {})


def ledger_text(directory: Path, name: str, kind: str, data: bytes | None) -> str:
    """The ledger of ``directory`` with ``name`` recorded as ``data`` of ``kind`` (or dropped
    when ``data`` is None); entries whose files are gone or changed are dropped too."""
    files = {
        k: v
        for k, v in (_read_ledger(directory) or {}).items()
        if k != name and owned_file(directory / k, v["kind"])
    }
    if data is not None:
        files[name] = {"kind": kind, "sha256": _sha256(data)}
    doc = {"tool": TOOL, "schema_version": 1, "files": dict(sorted(files.items()))}
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


# ---- run locks ----------------------------------------------------------------------------


def hold(marker_file: Path) -> IO[str]:
    """Open ``marker_file`` and take an exclusive lock on it for as long as it stays open."""
    f = open(marker_file, "r+", encoding="utf-8")  # noqa: SIM115 (held open by the caller)
    with contextlib.suppress(ImportError, OSError):
        import fcntl

        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    return f


def is_live(directory: Path) -> bool:
    """Whether a running process holds the lock on ``directory``'s marker."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): never take another run's directory
        return True
    try:
        with open(directory / MARKER, encoding="utf-8") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def enclosing_outputs(path: Path) -> Iterator[tuple[Path, Marker]]:
    """The outputs ``path`` lies in, innermost first (each ancestor with a complete marker)."""
    for parent in path.absolute().parents:
        marker = read_marker(parent).marker
        if marker is not None:
            yield parent, marker
