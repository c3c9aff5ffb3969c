"""A zoo cache directory is built in a temporary sibling and renamed into place."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from opsnn_quant.errors import CacheError
from opsnn_quant.zoo.cache_dir import build_cache_dir, check_entry, file_sha256


class Unwritable(Exception):
    pass


def _fill(text: str):
    def fill(tmp: Path) -> None:
        (tmp / "data").write_text(text)
        (tmp / "stamp").write_text("ok")  # the trust marker, last

    return fill


def _valid(final: Path, text: str):
    return lambda: (final / "stamp").is_file() and (final / "data").read_text() == text


def test_built_replaces_a_stale_directory_and_leaves_no_sibling(tmp_path: Path):
    final = tmp_path / "cache" / "set"
    final.mkdir(parents=True)
    (final / "data").write_text("stale")
    assert build_cache_dir(final, _fill("new"), _valid(final, "new"), Unwritable) == final
    assert (final / "data").read_text() == "new"
    assert sorted(p.name for p in final.parent.iterdir()) == ["set"]  # no .tmp- / .old- left
    assert oct(final.stat().st_mode & 0o777) == oct(0o755)


def test_a_failing_fill_leaves_the_old_directory_and_nothing_else(tmp_path: Path):
    final = tmp_path / "set"
    final.mkdir()
    (final / "data").write_text("old")

    def fill(tmp: Path) -> None:
        (tmp / "data").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        build_cache_dir(final, fill, lambda: False, Unwritable)
    assert (final / "data").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_another_process_s_valid_directory_is_kept(tmp_path: Path):
    final = tmp_path / "set"

    def fill(tmp: Path) -> None:  # another process finishes first, while this one fills
        final.mkdir()
        _fill("theirs")(final)
        _fill("ours")(tmp)

    assert build_cache_dir(final, fill, _valid(final, "theirs"), Unwritable) == final
    assert (final / "data").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_an_unwritable_cache_raises_the_callers_error(tmp_path: Path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")  # fails even for root
    with pytest.raises(Unwritable):
        build_cache_dir(blocker / "set", _fill("x"), lambda: False, Unwritable)
    assert blocker.read_text().startswith("a file")


def test_file_sha256_is_the_standard_digest(tmp_path: Path):
    from opsnn_quant.zoo.cache_dir import file_sha256

    f = tmp_path / "abc"
    f.write_bytes(b"abc")  # FIPS 180-2's example
    assert file_sha256(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


# ---- issue 58: what is read back from the cache is the cache's own (cases 4, 8, 11) --------


class StillRunning(BaseException):
    """Raised by :func:`within`: no ``except OSError`` or ``except Exception`` swallows it (a
    TimeoutError is an OSError, which a reader's own handler would take for a missing file)."""


@contextmanager
def within(seconds: float):
    """Fail (:class:`StillRunning`, again every ``seconds``) rather than hang when the block
    takes longer than ``seconds``."""

    def expire(signum, frame):
        raise StillRunning(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _entry(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cache"
    (root / "set").mkdir(parents=True)
    (root / "set" / "data").write_bytes(b"abc")
    return root, root / "set"


def test_a_fifo_in_the_cache_is_refused_at_once_never_opened(tmp_path: Path):
    # before: file_sha256 opened it and waited for a writer forever
    root, entry = _entry(tmp_path)
    os.mkfifo(entry / "stamp")
    started = time.perf_counter()
    with within(1.0):
        with pytest.raises(CacheError) as err:
            file_sha256(entry / "stamp", root)
        with pytest.raises(CacheError):
            file_sha256(entry / "stamp")  # without the cache's root: the descriptor is checked
        with pytest.raises(CacheError):
            check_entry(entry, root)
    assert time.perf_counter() - started < 1.0
    assert str(err.value) == (
        f"cache file {entry / 'stamp'} is a named pipe (FIFO), not a regular file; opsnn-quant "
        f"keeps only directories and regular files in its cache {root}: remove it and run "
        "again (the entry is rebuilt)"
    )
    assert stat.S_ISFIFO(os.lstat(entry / "stamp").st_mode)  # refused, not deleted


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda e, out: (e / "stamp").symlink_to("/dev/zero"), "resolves to /dev/zero, outside"),
        (lambda e, out: (e / "stamp").symlink_to(out), "resolves to"),
        (lambda e, out: (e / "stamp").symlink_to("stamp"), "is a symbolic link loop;"),
        (lambda e, out: (e / "sub").symlink_to(e.parent.parent), "resolves to"),
    ],
    ids=["a link to /dev/zero", "a link out", "a link loop", "a folder link out"],
)
def test_links_out_of_the_cache_and_loops_are_refused(make, said, tmp_path: Path):
    root, entry = _entry(tmp_path)
    (tmp_path / "secret").write_bytes(b"not the cache's")
    make(entry, tmp_path / "secret")
    with within(1.0), pytest.raises(CacheError, match=re.escape(said)):
        check_entry(entry, root)
    if (entry / "stamp").is_symlink():
        with within(1.0), pytest.raises(CacheError, match=re.escape(said)):
            file_sha256(entry / "stamp", root)


def test_a_cache_entry_that_is_a_self_looping_link_is_one_line(tmp_path: Path):
    # before: _read_stamp said None, then os.replace(tmp, the link) raised NotADirectoryError
    root = tmp_path / "cache"
    root.mkdir()
    (root / "set").symlink_to("set")
    with pytest.raises(CacheError, match=r"cache file .*set is a symbolic link loop; "):
        check_entry(root / "set", root)
    # build_cache_dir itself moves a dangling link aside rather than fail on it
    (root / "set").unlink()
    (root / "set").symlink_to("nowhere")
    assert build_cache_dir(root / "set", _fill("x"), lambda: False, Unwritable) == root / "set"
    assert (root / "set").is_dir() and not (root / "set").is_symlink()


def test_a_regular_entry_passes_and_a_rewritten_file_is_hashed_again(tmp_path: Path):
    root, entry = _entry(tmp_path)
    (entry / "inner").mkdir()
    (entry / "inner" / "f").write_bytes(b"x")
    (entry / "link").symlink_to("data")  # a link inside the cache: its own file
    check_entry(entry, root)
    check_entry(root / "missing", root)
    first = file_sha256(entry / "data", root)
    mtime = os.stat(entry / "data").st_mtime_ns
    (entry / "data").write_bytes(b"abd")  # same size, mtime put back (touch -r)
    os.utime(entry / "data", ns=(mtime, mtime))
    assert file_sha256(entry / "data", root) == hashlib.sha256(b"abd").hexdigest() != first


def test_a_file_hashed_once_is_not_read_again_until_it_changes(tmp_path: Path, monkeypatch):
    import opsnn_quant.zoo.cache_dir as cache_dir

    root, entry = _entry(tmp_path)
    reads = []
    real = hashlib.file_digest
    monkeypatch.setattr(
        cache_dir.hashlib, "file_digest", lambda f, d: reads.append(1) or real(f, d)
    )
    file_sha256(entry / "data", root)
    file_sha256(entry / "data", root)
    assert len(reads) == 2  # written just now: within a filesystem tick, not remembered
    later = time.time_ns() + 10 * 10**9  # as if it had been written 10 s ago
    monkeypatch.setattr(cache_dir.time, "time_ns", lambda: later)
    file_sha256(entry / "data", root)
    assert file_sha256(entry / "data", root) == hashlib.sha256(b"abc").hexdigest()
    assert len(reads) == 3  # the fourth: remembered
    (entry / "data").write_bytes(b"abcd")  # another size: another key on any filesystem
    assert file_sha256(entry / "data", root) == hashlib.sha256(b"abcd").hexdigest()
    assert len(reads) == 4
