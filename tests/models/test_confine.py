"""The one confinement rule (opsnn_quant.models.confine), and what becomes of a path the system
will not let us read: one ``error:`` line, exit 2 (issue 58 case 11)."""

from __future__ import annotations

import errno
import os
import re

import pytest

from opsnn_quant.cli import main
from opsnn_quant.errors import ModelLoadError
from opsnn_quant.models import check_weights
from opsnn_quant.models.confine import escape, not_regular
from opsnn_quant.sources import resolve_source


def _errors(stderr: str) -> list[str]:
    """stderr without the progress lines (printed when not a terminal)."""
    return [
        ln for ln in stderr.strip().splitlines() if not re.match(r"^\[\s*\d+\.\d s\]|^\s+\d", ln)
    ]


def test_a_link_loop_and_an_unresolvable_link_are_named(tmp_path, monkeypatch):
    (tmp_path / "loop").symlink_to("loop")
    assert escape(tmp_path / "loop", tmp_path) == "is a symbolic link loop"
    assert not_regular(tmp_path / "loop") == "is a symbolic link loop"
    (tmp_path / "gone").symlink_to("nowhere")
    assert escape(tmp_path / "gone", tmp_path) == "is a link to a missing file"

    def denied(path, *args, **kwargs):  # what realpath meets at /proc/1/cwd without ptrace
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(os.path, "realpath", denied)
    assert escape(tmp_path / "x", tmp_path) == "cannot be read: Permission denied"


def test_a_model_directory_we_may_not_walk_is_one_line(tmp_path, monkeypatch):
    # before: the PermissionError of a walk or a link in the model directory was a traceback
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    import opsnn_quant.models.loader_files as loader_files

    def denied(source):
        raise PermissionError(errno.EACCES, "Permission denied", f"{source}/private")

    monkeypatch.setattr(loader_files, "check_model_sources", denied)
    with pytest.raises(ModelLoadError) as err:
        check_weights(resolve_source(str(tmp_path / "m")))
    assert str(err.value) == (
        f"cannot read the model directory {tmp_path / 'm'}: {tmp_path / 'm'}/private: "
        "Permission denied"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["calibrate", "--model", "/proc", "--family", "whisper", "--data", "zoo:speech/eval"],
            "error: /proc is not a transformers model directory (no config.json)",
        ),
        (
            ["evaluate", "--candidate", "/proc", "--suite", "whisper-tiny-en"],
            "error: cannot tell the model family of /proc; pass --family",
        ),
    ],
    ids=["calibrate --model /proc", "evaluate --candidate /proc"],
)
def test_proc_as_a_model_is_one_error_line(argv, line, tmp_path, capsys):
    # before: PermissionError at /proc/1/cwd (realpath, as the model directory was walked), a
    # traceback and rc 1; only the files the loaders read are looked at now (never a walk)
    out = tmp_path / "o"
    assert main([*argv, "-o", str(out)]) == 2
    assert _errors(capsys.readouterr().err) == [line]
    assert not out.exists()


def test_any_path_the_system_refuses_is_one_error_line(tmp_path, monkeypatch, capsys):
    # a path error met by any check (/proc/1/root: EACCES; a loop: ELOOP) is the user's input
    import opsnn_quant.pipeline.run as run

    for code, said in ((errno.EACCES, "Permission denied"),
                       (errno.ELOOP, "Too many levels of symbolic links")):  # fmt: skip

        def refused(source, code=code, said=said):
            raise OSError(code, said, "/proc/1/root")

        monkeypatch.setattr(run, "check_model_source", refused)
        argv = ["calibrate", "--model", "/proc/1/root", "--family", "whisper", "--data",
                "zoo:speech/eval", "-o", str(tmp_path / "o")]  # fmt: skip
        assert main(argv) == 2
        assert _errors(capsys.readouterr().err) == [
            f"error: /proc/1/root: {said}; check the path and its permissions"
        ]

    def broken(source):
        raise OSError(errno.EIO, "Input/output error", "/dev/sda")

    monkeypatch.setattr(run, "check_model_source", broken)
    with pytest.raises(OSError, match="Input/output error"):  # ours to see: not hidden
        main(["calibrate", "--model", "x", "--family", "whisper", "--data", "zoo:speech/eval",
              "-o", str(tmp_path / "o")])  # fmt: skip
