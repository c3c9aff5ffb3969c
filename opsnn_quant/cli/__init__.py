"""``opsnn-quant``: the command line. Parses, loads, calls the public API, prints.

Each command group lives in its own module and registers itself on :data:`app`; those modules
import torch and the model libraries only inside the commands, so ``--help`` stays fast. Errors
the user can fix (:class:`~opsnn_quant.errors.InputError`) print one line and exit 2; other
:class:`~opsnn_quant.errors.OpsnnQuantError` exit 1. Ctrl-C and SIGTERM end the run with one
``interrupted`` line (exit 130 / 143), after outputs in progress are removed.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import warnings
from types import FrameType

import typer

from opsnn_quant.core.determinism import set_reproducible, source_date_epoch
from opsnn_quant.errors import OpsnnQuantError

app = typer.Typer(
    name="opsnn-quant",
    help="Probe, decide, calibrate and evaluate precision for Ascend NPU deployment.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Interrupted(BaseException):
    """SIGINT or SIGTERM, raised where the process is so that outputs in progress are removed.

    Not a KeyboardInterrupt: typer turns that into a silent exit 130 before we could say so.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log progress details"),
) -> None:
    """Probe, decide, calibrate and evaluate precision for Ascend NPU deployment."""
    if verbose:
        logging.getLogger("opsnn_quant").setLevel(logging.INFO)
    # before any command imports a library that reads it (numpy.f2py fails on a huge one)
    source_date_epoch()


def _register() -> None:
    # Imported here so that `import opsnn_quant.cli` stays cheap and each group stays separate.
    from opsnn_quant.cli import builtins, calibrate, demo, evaluate, export, policy

    calibrate.register(app)
    evaluate.register(app)
    policy.register(app)
    demo.register(app)
    builtins.register(app)
    export.register(app)


def _quiet_third_parties() -> None:
    # Hugging Face libraries print progress bars, advice and deprecations on every load; the CLI
    # shows its own progress, so theirs go to the log at debug level (set before they import).
    for var, value in (
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("DIFFUSERS_VERBOSITY", "error"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"),
        ("KINETO_LOG_LEVEL", "5"),  # torch.profiler's C++ start/stop lines
        # torch sets its own loggers' levels when it loads; "-onnx" makes the exporter's
        # (e.g. "torchvision is not installed. Skipping torchvision::nms") errors-only.
        ("TORCH_LOGS", "-onnx"),
    ):
        os.environ.setdefault(var, value)
    warnings.showwarning = _warning_to_debug_log
    for name in ("torch.onnx", "transformers", "diffusers", "onnxscript", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _warning_to_debug_log(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    # Library warnings (deprecations, advice) are not the user's business on the console.
    logging.getLogger("opsnn_quant.cli").debug(
        "%s:%d: %s: %s", filename, lineno, category.__name__, message
    )


PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ELOOP, errno.ENAMETOOLONG})
"""The errors of a path itself (not of the program): what :func:`main` prints as one line."""


def path_error_line(exc: OSError) -> str:
    """``/proc/1/root: Permission denied; check the path and its permissions``."""
    where = f"{exc.filename}: " if exc.filename is not None else ""
    return f"{where}{exc.strerror or exc}; check the path and its permissions"


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    set_reproducible()
    _quiet_third_parties()
    _register()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread (e.g. a test runner's worker thread)
            break
    from opsnn_quant.cli import _ui

    _ui.ARGV[:] = list(sys.argv[1:] if argv is None else argv)  # for a relaunch (--nproc)
    try:
        rv = app(args=argv, standalone_mode=False)
        if isinstance(rv, int):  # typer.Exit(code) comes back as the return value here
            return rv
    except OpsnnQuantError as err:
        # one write (line and newline together): the ranks of a torchrun launch share stderr;
        # one line even when the message quotes a path with a newline in it
        sys.stderr.write(f"error: {_ui.one_line(str(err))}\n")
        sys.stderr.flush()
        return err.exit_code
    except OSError as exc:
        # a path the user named that the system will not let us use (unreadable, a link loop):
        # input, whatever check met it first; any other OSError is ours and stays a trace
        if exc.errno not in PATH_ERRNOS:
            raise
        sys.stderr.write(f"error: {_ui.one_line(path_error_line(exc))}\n")
        sys.stderr.flush()
        return 2
    except Interrupted as exc:
        name = "" if exc.signum == signal.SIGINT else f" ({signal.Signals(exc.signum).name})"
        print(f"interrupted{name}", file=sys.stderr)
        return 128 + exc.signum
    except (KeyboardInterrupt, typer.Abort):
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # typer/click exits (e.g. --help)
        return int(exc.code or 0)
    except Exception as exc:
        # click's usage errors (typer vendors click in newer releases: no import of it here)
        # carry their exit code and print their own message.
        code, show = getattr(exc, "exit_code", None), getattr(exc, "show", None)
        if code is None or not callable(show):
            raise
        show()
        return int(code)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
