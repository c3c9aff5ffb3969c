"""Output safety: markers, refusals, the two-rename swap and its repair, permissions."""

from __future__ import annotations

import json
import os
import stat

import pytest

from opsnn_quant.io import (
    MARKER,
    OutputError,
    atomic_dir,
    atomic_write_text,
    check_output_dir,
    repair_siblings,
)


def _ours(path, kind="calibrate"):
    path.mkdir(parents=True)
    (path / MARKER).write_text(json.dumps({"tool": "opsnn-quant", "kind": kind}))
    (path / "policy.yaml").write_text("old\n")
    return path


def test_a_directory_of_the_same_kind_is_replaced_and_marked(tmp_path):
    out = _ours(tmp_path / "out")
    with atomic_dir(out, "calibrate") as tmp:
        (tmp / "policy.yaml").write_text("new\n")
    assert (out / "policy.yaml").read_text() == "new\n"
    marker = json.loads((out / MARKER).read_text())
    assert marker == {"tool": "opsnn-quant", "kind": "calibrate", "schema_version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("kind", [None, "probe"])
def test_anything_else_is_refused_and_left_alone(tmp_path, kind):
    out = tmp_path / "out"
    if kind is None:
        out.mkdir()
        (out / "notes.txt").write_text("precious\n")
    else:
        _ours(out, kind)
    with pytest.raises(OutputError, match="exists and is") as info, atomic_dir(out, "calibrate"):
        pass
    assert str(out) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # --force replaces it
    with atomic_dir(out, "calibrate", force=True) as tmp:
        (tmp / "policy.yaml").write_text("new\n")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "policy.yaml"]


def test_an_existing_file_is_refused_unless_forced(tmp_path):
    out = tmp_path / "out"
    out.write_text("precious\n")
    with pytest.raises(OutputError, match="is an existing file"):
        check_output_dir(out, "probe")
    assert out.read_text() == "precious\n"
    with atomic_dir(out, "probe", force=True) as tmp:
        (tmp / "probe.json").write_text("{}")
    assert (out / "probe.json").is_file()


def test_outputs_that_would_eat_the_inputs_or_the_cwd_are_refused(tmp_path, monkeypatch):
    model = tmp_path / "models" / "pipe"
    model.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for out, match in (
        (".", "working directory"),
        (str(tmp_path.parent), "working directory"),
        (str(tmp_path / "models"), "would replace the input"),
        (str(model), "would replace the input"),
    ):
        with pytest.raises(OutputError, match=match):
            check_output_dir(out, "calibrate", force=True, inputs=[model])
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        check_output_dir(tmp_path / "file.txt" / "out", "calibrate")


def test_a_crash_between_the_two_renames_is_repaired_next_time(tmp_path):
    # The swap renamed the old output aside and died before renaming the new one in: OUT is
    # missing, the old output is under .old-*, the finished new one under .tmp-*.
    out = tmp_path / "out"
    old = _ours(tmp_path / "out.old-abc123")
    _ours(tmp_path / "out.tmp-def456")
    foreign = tmp_path / "out.tmp-notours"
    foreign.mkdir()
    done = repair_siblings(out)
    assert (out / "policy.yaml").read_text() == "old\n" and not old.exists()
    assert not (tmp_path / "out.tmp-def456").exists()
    assert foreign.is_dir()  # not ours: left alone
    assert any("restored" in line for line in done) and any("removed" in line for line in done)
    # the swap completed but the old copy was not deleted: it goes
    _ours(tmp_path / "out.old-zzz")
    repair_siblings(out)
    assert not (tmp_path / "out.old-zzz").exists() and out.is_dir()


def test_an_exception_leaves_the_previous_output_and_no_temporary(tmp_path):
    out = _ours(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt), atomic_dir(out, "calibrate") as tmp:
        (tmp / "policy.yaml").write_text("half\n")
        raise KeyboardInterrupt
    assert (out / "policy.yaml").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_no_space_while_writing_is_one_output_error(tmp_path):
    import errno

    out = _ours(tmp_path / "out")
    with pytest.raises(OutputError, match="No space left on device"), atomic_dir(out, "calibrate"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert (out / "policy.yaml").read_text() == "old\n"


def test_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_dir(tmp_path / "out", "probe") as tmp:
            (tmp / "probe.json").write_text("{}")
        atomic_write_text(tmp_path / "policy.yaml", "x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "policy.yaml").stat().st_mode) == 0o640
