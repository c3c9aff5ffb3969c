"""Output safety: markers, refusals, the two-rename swap and its repair, permissions."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

from opsnn_quant.errors import OutputChangedError, OutputError
from opsnn_quant.output.directories import (
    atomic_dir,
    check_adoptable,
    check_output_dir,
    repair_siblings,
    unfinished_output,
)
from opsnn_quant.output.files import atomic_write_text
from opsnn_quant.output.locks import output_lock
from opsnn_quant.output.loose import (
    check_output_file,
    remove_output_file,
    write_output_file,
    write_output_files,
)
from opsnn_quant.output.ownership import MARKER, Marker


def _ours(path, kind="calibrate", text="old\n"):
    """A finished output of ``kind`` holding policy.yaml, written the way every run writes one."""
    with atomic_dir(path, kind) as tmp:
        (tmp / "policy.yaml").write_text(text)
    return path


def _marker(path):
    return json.loads((path / MARKER).read_text())


def test_a_directory_of_the_same_kind_is_replaced_and_marked(tmp_path):
    out = _ours(tmp_path / "out")
    first = _marker(out)
    with atomic_dir(out, "calibrate") as tmp:
        (tmp / "policy.yaml").write_text("new!\n")
        (tmp / "quant").mkdir()
        (tmp / "quant" / "w.bin").write_bytes(b"12345")
    assert (out / "policy.yaml").read_text() == "new!\n"
    marker = _marker(out)
    assert set(marker) == {"tool", "kind", "schema_version", "token", "manifest"}
    assert (marker["tool"], marker["kind"], marker["schema_version"]) == (
        "opsnn-quant",
        "calibrate",
        2,
    )
    assert re.fullmatch(r"[0-9a-f]{32}", marker["token"]) and marker["token"] != first["token"]
    # the manifest: every file with its size (5 bytes of "new!\n", 5 of w.bin), marker excluded
    assert marker["manifest"] == {"policy.yaml": 5, "quant/w.bin": 5}
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
    if kind is None:  # issue 58 §2: not ours, so --force does not replace it either
        with pytest.raises(OutputError, match="--force replaces only opsnn-quant outputs"):
            check_output_dir(out, "calibrate", force=True)
        assert (out / "notes.txt").read_text() == "precious\n"
        return
    # another command's output: --force replaces it
    with atomic_dir(out, "calibrate", force=True) as tmp:
        (tmp / "policy.yaml").write_text("new\n")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "policy.yaml"]


@pytest.mark.parametrize("force", [False, True])
def test_an_existing_file_is_refused_whatever_the_flags(tmp_path, force):
    # issue 58 §2: a user's file where the output goes is never ours (--force removed it)
    out = tmp_path / "out"
    out.write_text("precious\n")
    with pytest.raises(
        OutputError,
        match=r"is an existing file, not an opsnn-quant output; choose a new or empty directory "
        r"\(--force replaces only opsnn-quant outputs\)",
    ):
        check_output_dir(out, "probe", force=force)
    with (
        pytest.raises(OutputError, match="is an existing file"),
        atomic_dir(out, "probe", force=force),
    ):
        pass
    assert out.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


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


_KILLED_MID_SWAP = """
import os, sys
from pathlib import Path
import opsnn_quant.output.directories as io

real, count = os.replace, []

def dying(src, dst):  # kill -9 right after rename number N: no handler, no cleanup runs
    real(src, dst)
    count.append(1)
    if len(count) == int(sys.argv[2]):
        os._exit(9)

io.os.replace = dying
with io.atomic_dir(sys.argv[1], "calibrate") as tmp:
    (tmp / "policy.yaml").write_text("new\\n")
"""


def _crash_mid_swap(tmp_path, after):
    """A swap of ``out`` killed (-9) right after rename number ``after`` (1 or 2)."""
    out = _ours(tmp_path / "out")
    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_SWAP, str(out), str(after)])
    assert proc.returncode == 9
    return out


def _leave_unlocked_tmp(tmp_path, name="out", kind="calibrate"):
    """What a run killed with -9 while building leaves: a marked tmp-<token>, no lock held."""
    token = "ab" * 16
    tmp = tmp_path / f"{name}.tmp-{token}"
    tmp.mkdir()
    from opsnn_quant.output.ownership import Marker

    (tmp / MARKER).write_text(Marker(kind, token).to_json())
    (tmp / "half.bin").write_bytes(b"x")
    return tmp


def test_a_crash_between_the_two_renames_is_repaired_next_time(tmp_path):
    # The swap renamed the old output aside (out.old-<token>) and died before renaming the new
    # one in (out.tmp-<same token>): OUT is missing; the next run puts the old one back.
    out = _crash_mid_swap(tmp_path, after=1)
    assert not out.exists()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n.split("-")[0] for n in names] == ["out.old", "out.tmp"]
    assert names[0].split("-")[1] == names[1].split("-")[1]  # one token: one run's swap
    done = repair_siblings(out, "calibrate")
    assert (out / "policy.yaml").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert any("restored" in line for line in done) and any("removed" in line for line in done)


def test_a_crash_after_the_second_rename_is_finished_next_time(tmp_path):
    out = _crash_mid_swap(tmp_path, after=2)
    assert (out / "policy.yaml").read_text() == "new\n"
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("out.old-")]
    assert old.name == f"out.old-{_marker(out)['token']}"
    repair_siblings(out, "calibrate")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_unfinished_output_of_a_killed_run_is_removed(tmp_path):
    _ours(tmp_path / "out")
    tmp = _leave_unlocked_tmp(tmp_path)
    assert repair_siblings(tmp_path / "out", "calibrate") == [
        f"removed {tmp} (unfinished output of a previous run)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_only_our_own_debris_is_touched(tmp_path, caplog):
    # issue 28 §1: a user's backups and look-alikes are left alone, each with one warning.
    out = _ours(tmp_path / "run", text="current\n")
    keep = _ours(tmp_path / "keep", text="my backup\n")
    keep.rename(tmp_path / "run.old-keep")  # mv run run.old-keep (then a new run)
    (tmp_path / "run.old-keep" / "added.txt").write_text("mine\n")
    shutil.copytree(out, tmp_path / "run.old-2025")  # cp -r OUT run.old-2025
    other = _ours(tmp_path / "x", kind="quant")
    other.rename(tmp_path / f"run.old-{_marker(other)['token']}")  # a token, but not this run's
    wrong_kind = _leave_unlocked_tmp(tmp_path, "run", kind="probe")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with caplog.at_level("WARNING", logger="opsnn_quant.output.directories"):
        assert repair_siblings(out, "calibrate") == []
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    left = [r.getMessage() for r in caplog.records]
    assert len(left) == 4 and all("left " in m and "alone" in m for m in left)
    assert any(str(wrong_kind) in m for m in left)
    caplog.clear()
    with caplog.at_level("WARNING", logger="opsnn_quant.output.directories"):
        check_output_dir(out, "calibrate")  # a command checks its output more than once
    assert not caplog.records  # one warning line each, per process


def test_the_output_name_is_not_a_glob(tmp_path):
    out = tmp_path / "x[ab]"
    stray = _leave_unlocked_tmp(tmp_path, "xa")  # xa.tmp-<token>: matches the glob x[ab].tmp-*
    with atomic_dir(out, "calibrate") as tmp:
        (tmp / "f").write_text("1")
    assert stray.is_dir() and (out / "f").is_file()


def test_a_live_run_is_not_disturbed(tmp_path):
    # Two runs to the same -o: the second sees the first's locked temporary directory and stops.
    out = tmp_path / "out"
    with atomic_dir(out, "calibrate") as tmp:
        (tmp / "f").write_text("1")
        code = (
            "import sys; from opsnn_quant.output.directories import check_output_dir\n"
            f"check_output_dir({str(out)!r}, 'calibrate')"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert proc.returncode != 0 and "being written by another opsnn-quant run" in proc.stderr
        assert (tmp / "f").is_file()
    assert (out / "f").read_text() == "1"


def test_a_copied_marker_does_not_make_a_folder_ours(tmp_path):
    # issue 28 §1: cp OUT/.opsnn-quant.json u/; a run to u must not delete u/thesis.tex.
    done = _ours(tmp_path / "done", kind="quant")
    user = tmp_path / "u"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work\n")
    shutil.copy(done / MARKER, user / MARKER)
    for force in (False, True):  # issue 58 §2: nor does it with --force
        with pytest.raises(
            OutputError, match=r"holds thesis.tex but none of the files its opsnn-quant marker"
        ):
            check_output_dir(user, "quant", force=force)
    # the same for a file added to a real output, or one whose size changed
    (done / "notes.txt").write_text("mine\n")
    with pytest.raises(OutputError, match=r"holds notes\.txt"):
        check_output_dir(done, "quant")
    (done / "notes.txt").unlink()
    (done / "policy.yaml").write_text("edited by hand\n")
    with pytest.raises(OutputError, match=r"holds policy\.yaml"):
        check_output_dir(done, "quant")
    assert (user / "thesis.tex").read_text() == "years of work\n"


def test_an_older_marker_without_a_manifest_vouches_for_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"tool": "opsnn-quant", "kind": "calibrate"}))
    (out / "policy.yaml").write_text("x\n")
    with pytest.raises(OutputError, match="marker lists no contents"):
        check_output_dir(out, "calibrate")
    check_output_dir(out, "calibrate", force=True)


def test_a_nested_output_replaced_later_stays_ours(tmp_path):
    # export-weights redoes OUT/export/ascendv1 (its own marker) and writes a notes file beside
    # it (the ledger): OUT stays replaceable by the next calibrate.
    out = tmp_path / "out"
    with (
        atomic_dir(out, "calibrate") as tmp,
        atomic_dir(tmp / "export" / "ascendv1", "ascendv1") as inner,
    ):
        (inner / "w.safetensors").write_bytes(b"a")
    with atomic_dir(out / "export" / "ascendv1", "ascendv1") as inner:
        (inner / "w.safetensors").write_bytes(b"bigger")
    write_output_file(out / "export" / "ascendv1.notes.txt", "note\n", "ascendv1.notes")
    assert check_output_dir(out, "calibrate") == out


def test_symlinked_output_says_what_it_is(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OutputError, match=f"is a symbolic link to {real}"):
        check_output_dir(tmp_path / "link", "probe")


def test_outputs_inside_an_input_are_refused_even_forced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cand = tmp_path / "cand"
    (cand / "quant").mkdir(parents=True)
    with pytest.raises(OutputError, match="is inside the input"):
        check_output_dir(cand / "quant" / "report", "report", force=True, inputs=[cand / "quant"])
    import opsnn_quant

    inside = Path(opsnn_quant.__file__).parent / "zoo" / "weights" / "shapes-t2i"
    with pytest.raises(OutputError, match="the opsnn-quant package"):
        check_output_dir(inside, "calibrate", force=True)


def test_loose_files_are_replaced_only_when_ours(tmp_path):
    # issue 28 §1: policy export and export-weights' notes overwrote users' files.
    path = tmp_path / "amct.cfg"
    path.write_text("a user's config\n")
    for force in (False, True):  # issue 58: --force replaced a file we never wrote
        with pytest.raises(OutputError, match="exists and is not an opsnn-quant file; remove it"):
            write_output_file(path, "ours\n", "amct-cfg", force=force)
    assert path.read_text() == "a user's config\n"
    path.unlink()
    write_output_file(path, "ours\n", "amct-cfg")
    write_output_file(path, "ours, again\n", "amct-cfg")  # ours, unchanged: replaced
    with pytest.raises(OutputError, match="not an opsnn-quant amct-eager file"):
        check_output_file(path, "amct-eager")
    assert not remove_output_file(path, "amct-eager")
    path.write_text("edited\n")  # changed by the user: no longer ours
    assert not remove_output_file(path, "amct-cfg") and path.read_text() == "edited\n"
    with pytest.raises(OutputError, match="not an opsnn-quant amct-cfg file"):
        check_output_file(path, "amct-cfg")
    assert check_output_file(path, "amct-cfg", force=True) == path  # ours, changed: --force
    with pytest.raises(OutputError, match="would replace the input"):
        check_output_file(path, "amct-cfg", force=True, inputs=[path])
    write_output_file(tmp_path / "n.txt", "x\n", "notes")
    assert remove_output_file(tmp_path / "n.txt", "notes") and not (tmp_path / "n.txt").exists()


def test_an_exception_leaves_the_previous_output_and_no_temporary(tmp_path):
    out = _ours(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt), atomic_dir(out, "calibrate") as tmp:
        (tmp / "policy.yaml").write_text("half\n")
        raise KeyboardInterrupt
    assert (out / "policy.yaml").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_finished_work_is_kept_on_an_exception_and_a_resumed_block_builds_on_it(tmp_path):
    out = _ours(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt), atomic_dir(out, "calibrate", keep_if=".done") as tmp:
        (tmp / "probe.json").write_text("{}\n")
        (tmp / ".done").write_text("probe\n")
        raise KeyboardInterrupt
    kept = unfinished_output(out, "calibrate")
    assert kept == tmp and (kept / "probe.json").is_file()
    assert (out / "policy.yaml").read_text() == "old\n"  # the previous output is untouched
    # only with resume= is it taken over; the caller removes its record before the swap
    with atomic_dir(out, "calibrate", resume=kept, keep_if=".done") as again:
        assert again == kept
        (again / ".done").unlink()
        (again / "policy.yaml").write_text("new\n")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "policy.yaml", "probe.json"]
    assert (out / "policy.yaml").read_text() == "new\n"
    assert _marker(out)["token"] == kept.name.rsplit("-", 1)[1]
    assert unfinished_output(out, "calibrate") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_without_the_record_or_without_resume_nothing_is_kept(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(out, "calibrate", keep_if=".done") as tmp:
        (tmp / "probe.json").write_text("{}\n")  # no phase recorded yet
        raise RuntimeError("boom")
    assert unfinished_output(out, "calibrate") is None
    with pytest.raises(RuntimeError), atomic_dir(out, "calibrate", keep_if=".done") as tmp:
        (tmp / ".done").write_text("probe\n")
        raise RuntimeError("boom")
    assert unfinished_output(out, "calibrate") == tmp
    assert unfinished_output(out, "probe") is None  # another command's kind: not ours to resume
    check_output_dir(out, "calibrate", keep_unfinished=True)
    assert tmp.is_dir()
    check_output_dir(out, "calibrate")  # a run that does not resume starts over
    assert not tmp.exists() and list(tmp_path.iterdir()) == []


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


def test_checks_create_nothing(tmp_path):
    # A refusal after a passed check (the second output of one command) leaves no directory.
    check_output_dir(tmp_path / "a" / "b" / "out", "calibrate")
    check_output_file(tmp_path / "c" / "amct.cfg", "amct-cfg")
    assert list(tmp_path.iterdir()) == []
    with atomic_dir(tmp_path / "a" / "b" / "out", "calibrate") as tmp:
        (tmp / "f").write_text("1")
    assert (tmp_path / "a" / "b" / "out" / "f").is_file()


# ---- issue 41 §2: data loss at the swap, copied sub-outputs, two commands, adopted trees ----


@pytest.mark.parametrize("existed", [False, True])
def test_a_file_put_into_the_output_while_a_run_builds_it_is_never_removed(tmp_path, existed):
    # probe ... -o X; meanwhile mkdir X; echo mine > X/precious.txt: the swap deleted it.
    out = _ours(tmp_path / "out") if existed else tmp_path / "out"
    with pytest.raises(OutputChangedError) as err, atomic_dir(out, "calibrate") as tmp:
        (tmp / "policy.yaml").write_text("new\n")
        out.mkdir(exist_ok=True)
        (out / "precious.txt").write_text("mine\n")
    msg = str(err.value)
    assert f"output {out} changed while this run built it" in msg and "precious.txt" in msg
    assert (out / "precious.txt").read_text() == "mine\n"  # the user's file, where it was
    if existed:
        assert (out / "policy.yaml").read_text() == "old\n"  # nothing replaced
    # the finished output is kept where the message says, whole
    assert f"the new output is in {tmp}" in msg and (tmp / "policy.yaml").read_text() == "new\n"


def test_a_file_put_where_the_output_goes_is_never_replaced(tmp_path):
    out = tmp_path / "out"
    with (
        pytest.raises(OutputChangedError, match="is now a file or a link"),
        atomic_dir(out, "probe"),
    ):
        out.write_text("mine\n")
    assert out.read_text() == "mine\n"


def test_an_emptied_or_unchanged_output_is_still_swapped(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out, "calibrate") as tmp:
        (tmp / "f").write_text("1")
        out.mkdir()  # an empty directory holds nothing of anyone's
    assert (out / "f").read_text() == "1"
    with atomic_dir(out, "calibrate") as tmp:  # ours, unchanged during the run
        (tmp / "f").write_text("2")
    assert (out / "f").read_text() == "2"


def test_a_copied_sub_output_is_the_users(tmp_path):
    # cp -a OUT/quant OUT/quant.bak; calibrate -o OUT deleted quant.bak: the copy's marker
    # vouched for it.
    out = tmp_path / "out"
    with atomic_dir(out, "calibrate") as tmp, atomic_dir(tmp / "quant", "quant") as inner:
        (inner / "model.safetensors").write_bytes(b"weights")
    shutil.copytree(out / "quant", out / "quant.bak", symlinks=True)
    with pytest.raises(OutputError, match=r"holds quant\.bak/\.opsnn-quant\.json, which is not"):
        check_output_dir(out, "calibrate")
    with pytest.raises(OutputError, match=r"holds quant\.bak/"), atomic_dir(out, "calibrate"):
        pass
    assert (out / "quant.bak" / "model.safetensors").read_bytes() == b"weights"
    # the same for a copied loose file with its ledger (export-weights' notes)
    shutil.rmtree(out / "quant.bak")
    write_output_file(out / "export" / "a.notes.txt", "note\n", "ascendv1.notes")
    assert check_output_dir(out, "calibrate") == out  # written into OUT: recorded in its manifest
    shutil.copytree(out / "export", out / "export.bak")
    with pytest.raises(OutputError, match=r"holds export\.bak/"):
        check_output_dir(out, "calibrate")


def test_a_nested_output_added_later_is_recorded_up_every_enclosing_output(tmp_path):
    # export-weights -f atc adds OUT/export/atc, which calibrate never wrote there
    out = tmp_path / "out"
    with atomic_dir(out, "calibrate") as tmp, atomic_dir(tmp / "export", "export") as inner:
        (inner / "amct.cfg").write_text("x\n")
    with atomic_dir(out / "export" / "atc", "atc") as inner:
        (inner / "model.onnx").write_bytes(b"graph")
    assert _marker(out)["manifest"]["export/atc/model.onnx"] == 5
    assert _marker(out / "export")["manifest"]["atc/model.onnx"] == 5
    assert check_output_dir(out, "calibrate") == out
    assert check_output_dir(out / "export", "export") == out / "export"
    (out / "export" / "mine.txt").write_text("user\n")  # a user's file stays the user's
    with atomic_dir(out / "export" / "atc", "atc") as inner:
        (inner / "model.onnx").write_bytes(b"graph2")
    with pytest.raises(OutputError, match=r"holds export/mine\.txt"):
        check_output_dir(out, "calibrate")


_HOLD = """
import sys, time
from opsnn_quant.output.locks import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_two_commands_writing_into_one_output_exclude_each_other(tmp_path):
    # export-weights OUT and calibrate -o OUT at once mixed a new checkpoint with an old export
    out = _ours(tmp_path / "out")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(OutputError, match="being written by another opsnn-quant run"),
            atomic_dir(out, "calibrate") as tmp,
        ):
            (tmp / "policy.yaml").write_text("new\n")
        with pytest.raises(OutputError, match="being written by another"), output_lock(out):
            pass
    finally:
        holder.kill()
        holder.wait()
    assert (out / "policy.yaml").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # and the other way round: a run building OUT holds it against an export-weights
    code = "import sys; from opsnn_quant.output.locks import output_lock\nwith output_lock(sys.argv[1]): pass"
    with atomic_dir(out, "calibrate") as tmp:
        (tmp / "policy.yaml").write_text("new\n")
        proc = subprocess.run(
            [sys.executable, "-c", code, str(out)], capture_output=True, text=True
        )
        assert proc.returncode != 0 and "being written by another" in proc.stderr
    with output_lock(out):  # free again
        pass


def test_a_kept_output_changed_since_is_not_adopted(tmp_path):
    # --resume adopted a kept OUT.tmp-* whose export/ was replaced by a link: ~30 files were
    # written outside OUT.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def kept_run():
        out = tmp_path / "out"
        with pytest.raises(KeyboardInterrupt), atomic_dir(out, "calibrate", keep_if=".done") as t:
            (t / "export").mkdir()
            (t / "export" / "a.cfg").write_text("a\n")
            (t / ".done").write_text("probe\n")
            raise KeyboardInterrupt
        return out, unfinished_output(out, "calibrate")

    out, kept = kept_run()
    assert kept is not None
    shutil.rmtree(kept / "export")
    (kept / "export").symlink_to(elsewhere, target_is_directory=True)
    with (
        pytest.raises(OutputError, match=r"export is not a regular file or directory"),
        atomic_dir(out, "calibrate", resume=kept, keep_if=".done") as again,
    ):
        (again / "export" / "b.cfg").write_text("outside\n")
    assert list(elsewhere.iterdir()) == [] and not out.exists()
    # a file added (or changed) since it was kept: refused too, by the recorded manifest
    shutil.rmtree(kept)
    out, kept = kept_run()
    (kept / "export" / "extra.bin").write_bytes(b"x")
    with (
        pytest.raises(OutputError, match=r"export/extra\.bin was added, removed or changed"),
        atomic_dir(out, "calibrate", resume=kept, keep_if=".done"),
    ):
        pass
    (kept / "export" / "extra.bin").unlink()
    with atomic_dir(out, "calibrate", resume=kept, keep_if=".done") as again:  # untouched: fine
        (again / ".done").unlink()
    assert (out / "export" / "a.cfg").read_text() == "a\n"


def test_output_files_are_all_checked_before_any_is_written(tmp_path):
    # a format's file and its notes: one of them a user's file, so neither is written
    cfg, notes = tmp_path / "x.cfg", tmp_path / "x.cfg.notes.txt"
    notes.write_text("mine\n")
    files = {cfg: ("a\n", "atc-keep-dtype"), notes: ("n\n", "atc-keep-dtype.notes")}
    with pytest.raises(OutputError, match=r"x\.cfg\.notes\.txt exists and is not an opsnn-quant"):
        write_output_files(files)
    assert not cfg.exists() and notes.read_text() == "mine\n"
    notes.unlink()
    assert write_output_files(files) == [cfg, notes]
    # the next run writes no notes: ours is removed as stale, a user's file would stay
    assert write_output_files(
        {cfg: ("b\n", "atc-keep-dtype")}, stale={notes: "atc-keep-dtype.notes"}
    ) == [cfg]
    assert not notes.exists() and cfg.read_text() == "b\n"
    notes.write_text("mine\n")
    write_output_files({cfg: ("c\n", "atc-keep-dtype")}, stale={notes: "atc-keep-dtype.notes"})
    assert notes.read_text() == "mine\n"


# ---- issue 58 §2: --force replaces only what is ours -----------------------------------------


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _scratch_home(tmp_path, monkeypatch):
    home = tmp_path / "home" / "user"
    (home / "Documents").mkdir(parents=True)
    (home / "Documents" / "thesis.txt").write_text("years of work\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def _refused_whatever_the_flags(out, match, advice="choose a new or empty directory"):
    """``out`` is refused by the check and by a whole run, --force or not; nothing changes."""
    before = _tree(out.parent)
    for force in (False, True):
        with pytest.raises(OutputError) as err:
            check_output_dir(out, "calibrate", force=force)
        assert re.search(match, str(err.value)), str(err.value)
        assert str(err.value).startswith(f"output {out} ") and "\n" not in str(err.value)
        assert str(err.value).endswith(f"; {advice} (--force replaces only opsnn-quant outputs)")
        with pytest.raises(OutputError, match=match), atomic_dir(out, "calibrate", force=force):
            raise AssertionError("the run must not start")
    assert _tree(out.parent) == before


INSIDE = "choose a new directory inside it"


def test_force_never_replaces_a_home_directory(tmp_path, monkeypatch):
    # calibrate ... -o ~ --force: rc 0 and Documents/thesis.txt gone
    home = _scratch_home(tmp_path, monkeypatch)
    _refused_whatever_the_flags(home, "is your home directory", INSIDE)
    # an opsnn-quant marker copied into it changes nothing, nor does a trailing "/." or a link
    (home / MARKER).write_text(Marker("calibrate", "cd" * 16, {"policy.yaml": 1}).to_json())
    _refused_whatever_the_flags(home, "is your home directory", INSIDE)
    with pytest.raises(OutputError, match="is your home directory"):
        check_output_dir(home / "Documents" / "..", "calibrate", force=True)
    # the directory holding it, too
    _refused_whatever_the_flags(home.parent, f"holds your home directory {home}", INSIDE)
    assert (home / "Documents" / "thesis.txt").read_text() == "years of work\n"
    # inside it is fine
    with atomic_dir(home / "out", "calibrate") as tmp:
        (tmp / "f").write_text("1")


def test_force_never_replaces_the_users_real_home(tmp_path, monkeypatch):
    # $HOME pointed elsewhere: the password database's home is still the user's
    import pwd

    real = tmp_path / "real-home"
    (real / "Documents").mkdir(parents=True)
    (real / "Documents" / "thesis.txt").write_text("years of work\n")
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: types.SimpleNamespace(pw_dir=str(real)))
    _refused_whatever_the_flags(real, "is your home directory", INSIDE)


def test_force_never_replaces_a_mount_point(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert os.path.ismount("/proc")
    with pytest.raises(OutputError) as err:
        check_output_dir("/proc", "calibrate", force=True)
    assert str(err.value) == (
        "output /proc is a filesystem root or mount point; choose a new directory inside it "
        "(--force replaces only opsnn-quant outputs)"
    )


@pytest.mark.parametrize("where", [".git", "sub/.git"])
def test_force_never_replaces_a_directory_holding_a_git_repository(tmp_path, where):
    out = _ours(tmp_path / "out")  # ours, but a repository was made in it since
    (out / where).mkdir(parents=True)
    (out / where / "config").write_text("[remote] token\n")
    _refused_whatever_the_flags(out, rf"holds {re.escape(where)} \(a version-control repository\)")


def test_force_never_replaces_a_directory_without_our_marker(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "notes.txt").write_text("precious\n")
    _refused_whatever_the_flags(out, "exists and is not an opsnn-quant output")


def test_force_replaces_our_output_edited_or_of_another_kind_and_an_empty_directory(tmp_path):
    out = _ours(tmp_path / "out", kind="probe")
    (out / "policy.yaml").write_text("edited by hand, longer\n")
    (out / "added.txt").write_text("mine\n")
    with pytest.raises(OutputError, match="or pass --force"):
        check_output_dir(out, "calibrate")  # without --force: refused as before
    with atomic_dir(out, "calibrate", force=True) as tmp:
        (tmp / "probe.json").write_text("{}\n")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "probe.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_dir(empty, "calibrate") as tmp:  # no --force needed
        (tmp / "f").write_text("1")
    assert (empty / "f").read_text() == "1"


def test_force_at_the_swap_keeps_a_directory_that_stopped_being_ours(tmp_path):
    # checked at the start, and again once the previous output is aside: a marker removed (or
    # a .git made) while the run built its output keeps the directory, --force or not
    for spoil, match in (
        (lambda out: (out / MARKER).unlink(), "holds policy.yaml, which is not an opsnn-quant"),
        (lambda out: (out / ".git").mkdir(), r"holds \.git \(a version-control repository\)"),
    ):
        out = _ours(tmp_path / "out")
        with (
            pytest.raises(OutputChangedError, match=match),
            atomic_dir(out, "calibrate", force=True) as tmp,
        ):
            (tmp / "new.txt").write_text("new\n")
            spoil(out)
        assert (out / "policy.yaml").read_text() == "old\n"
        shutil.rmtree(tmp_path)
        tmp_path.mkdir()


def test_force_replaces_a_link_not_what_it_points_to(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "mine.txt").write_text("precious\n")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with atomic_dir(link, "calibrate", force=True) as tmp:
        (tmp / "f").write_text("1")
    assert not link.is_symlink() and (link / "f").read_text() == "1"
    assert (real / "mine.txt").read_text() == "precious\n"


# ---- issue 58 §3: every writer holds its output's lock and those of the outputs it lies in ----

_HOLD_RAW = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the lock alone, as a writer before issue 58
print("held", flush=True)
sys.stdin.read()
"""


class _Holder:
    """Another process holding a lock until the block ends (no sleeps: it waits on its stdin)."""

    def __init__(self, code, path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def __enter__(self):
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "held"
        return self

    def __exit__(self, *exc):
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


_HOLD_OUTPUT = _HOLD.replace("time.sleep(60)", "sys.stdin.read()")


def _with_report(tmp_path):
    """A calibrate output OUT holding a report an earlier evaluate -o OUT/report wrote."""
    out = _ours(tmp_path / "out")
    with atomic_dir(out / "report", "report") as tmp:
        (tmp / "report.md").write_text("verdict: PASS\n")
    return out, _tree(out)


def test_a_nested_writer_is_refused_while_the_enclosing_output_is_written(tmp_path):
    # calibrate -o OUT & then evaluate -o OUT/report: the report was written, then swapped away
    out, before = _with_report(tmp_path)
    with _Holder(_HOLD_OUTPUT, out):  # what a calibrate -o OUT holds for its whole run
        lies_in = (
            f"output {out / 'report'} lies in the output {out}, which another opsnn-quant run "
            "is writing; wait for it to finish or choose another output"
        )
        with pytest.raises(OutputError) as err, atomic_dir(out / "report", "report") as tmp:
            (tmp / "report.md").write_text("verdict: FAIL\n")
        assert str(err.value) == lies_in
        with pytest.raises(OutputError, match="lies in the output"):
            check_output_dir(out / "report", "report")  # refused before any work, too
        with pytest.raises(OutputError, match="lies in the output"):
            check_output_dir(out / "report" / "plots", "plots")  # however deep
        with pytest.raises(OutputError, match="lies in the output"):
            write_output_file(out / "amct.cfg", "x\n", "amct-cfg")  # a loose file as well
    assert _tree(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_the_enclosing_swap_never_removes_a_report_being_written(tmp_path):
    out, before = _with_report(tmp_path)
    # evaluate -o OUT/report holds OUT's lock too: a calibrate -o OUT is refused at its start
    with _Holder(_HOLD_OUTPUT, out / "report"):
        with pytest.raises(OutputError) as err, atomic_dir(out, "calibrate", force=True) as tmp:
            (tmp / "policy.yaml").write_text("new\n")
        assert str(err.value) == (
            f"output {out} is being written by another opsnn-quant run; wait for it to finish "
            "or choose another output"
        )
    assert _tree(out) == before
    # a writer holding the report's lock alone (an older opsnn-quant): the swap, --force or not,
    # puts OUT back and keeps its own output aside
    for force in (False, True):
        live = "holds report, which another opsnn-quant run is writing"
        with (
            _Holder(_HOLD_RAW, out / "report"),
            pytest.raises(OutputChangedError, match=live),
            atomic_dir(out, "calibrate", force=force) as tmp,
        ):
            (tmp / "policy.yaml").write_text("new\n")
        assert _tree(out) == before
        shutil.rmtree(tmp)
    # and one building OUT/report.tmp-<token> (its marker locked), --force: the same
    building = (
        "import sys\nfrom pathlib import Path\nfrom opsnn_quant.output.directories import _open_tmp\n"
        "tmp, _, lock = _open_tmp(Path(sys.argv[1]), 'report')\n"
        "print('held', flush=True)\nsys.stdin.read()\n"
    )
    with _Holder(building, out / "report"):
        (busy,) = [p for p in out.iterdir() if p.name.startswith("report.tmp-")]
        with (
            pytest.raises(OutputChangedError, match=f"holds {busy.name}, which another"),
            atomic_dir(out, "calibrate", force=True) as tmp,
        ):
            (tmp / "policy.yaml").write_text("new\n")
        assert (busy / MARKER).is_file()
        assert {k: v for k, v in _tree(out).items() if not k.startswith(busy.name)} == before
    assert (out / "report" / "report.md").read_text() == "verdict: PASS\n"


def test_nested_writers_of_one_run_share_its_locks(tmp_path):
    # export-weights holds OUT and writes OUT/export/ascendv1 and its notes: not a second writer
    out, _ = _with_report(tmp_path)
    with output_lock(out), output_lock(out):
        with atomic_dir(out / "export" / "ascendv1", "ascendv1") as tmp:
            (tmp / "w.bin").write_bytes(b"w")
        write_output_file(out / "export" / "ascendv1.notes.txt", "n\n", "ascendv1.notes")
    assert check_output_dir(out, "calibrate") == out  # recorded, still ours
    # another thread is another writer
    import threading

    seen = []
    with output_lock(out):
        worker = threading.Thread(target=lambda: seen.append(_try(out / "report")))
        worker.start()
        worker.join()
    assert seen == ["lies in the output"]
    with output_lock(out / "report"):  # all released
        pass


def _try(path):
    try:
        with atomic_dir(path, "report"):
            pass
    except OutputError as exc:
        return "lies in the output" if "lies in the output" in str(exc) else str(exc)
    return "written"


# ---- issue 58 §14: --resume compares contents, not sizes -------------------------------------


def _kept(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), atomic_dir(out, "calibrate", keep_if=".done") as tmp:
        (tmp / "policy.yaml").write_text("unet.*: int8\n")
        (tmp / ".done").write_text("policy\n")
        raise KeyboardInterrupt
    kept = unfinished_output(out, "calibrate")
    assert kept is not None
    return out, kept


def test_a_same_length_edit_of_a_kept_file_is_not_adopted(tmp_path):
    out, kept = _kept(tmp_path)
    assert _marker(kept)["sha256"] == {
        ".done": hashlib.sha256(b"policy\n").hexdigest(),
        "policy.yaml": hashlib.sha256(b"unet.*: int8\n").hexdigest(),
    }
    (kept / "policy.yaml").write_text("unet.*: fp16\n")  # the same 13 bytes
    with pytest.raises(OutputError) as err:
        check_adoptable(kept)
    assert str(err.value) == (
        f"--resume: {kept / 'policy.yaml'} was added, removed or changed since the interrupted "
        "run kept its output; run without --resume"
    )
    with (
        pytest.raises(OutputError, match=r"policy\.yaml was added, removed or changed"),
        atomic_dir(out, "calibrate", resume=kept, keep_if=".done"),
    ):
        pass
    assert (kept / "policy.yaml").read_text() == "unet.*: fp16\n" and not out.exists()
    (kept / "policy.yaml").write_text("unet.*: int8\n")  # put back: adopted
    with atomic_dir(out, "calibrate", resume=kept, keep_if=".done") as again:
        (again / ".done").unlink()
    assert "sha256" not in _marker(out)  # a finished output's marker: as before, no hashes


def test_a_kept_output_of_a_version_without_hashes_is_compared_by_size(tmp_path):
    _, kept = _kept(tmp_path)
    doc = _marker(kept)
    del doc["sha256"]
    (kept / MARKER).write_text(json.dumps(doc))
    (kept / "policy.yaml").write_text("unet.*: fp16\n")
    assert check_adoptable(kept).token == doc["token"]  # sizes only, as that version recorded
    (kept / "policy.yaml").write_text("unet.*: fp32!\n")
    with pytest.raises(OutputError, match=r"policy\.yaml was added, removed or changed"):
        check_adoptable(kept)
