"""A zoo cache directory is built in a temporary sibling and renamed into place."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsnn_quant.zoo.cache_dir import build_cache_dir


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
