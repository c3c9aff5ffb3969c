"""``opsnn-quant``: the command line. Parses, loads, calls the public API, prints.

Each command group lives in its own module and registers itself on :data:`app`. Errors the user
can fix (:class:`~opsnn_quant.errors.InputError`) print one line and exit 2; other
:class:`~opsnn_quant.errors.OpsnnQuantError` exit 1.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

import typer

from opsnn_quant.errors import OpsnnQuantError

app = typer.Typer(
    name="opsnn-quant",
    help="Probe, decide, calibrate and evaluate precision for Ascend NPU deployment.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log progress details"),
) -> None:
    """Probe, decide, calibrate and evaluate precision for Ascend NPU deployment."""
    if verbose:
        logging.getLogger("opsnn_quant").setLevel(logging.INFO)


def _register() -> None:
    # Imported here so that `import opsnn_quant.cli` stays cheap and each group stays separate.
    from opsnn_quant.cli import calibrate, demo, evaluate, policy

    calibrate.register(app)
    evaluate.register(app)
    policy.register(app)
    demo.register(app)


def _reproducible_math() -> None:
    # MKL may pick different kernels run to run (buffer alignment) and so round differently;
    # strict conditional numerical reproducibility makes the same inputs give the same bits,
    # which byte-identical policies and checkpoints rely on. Read when MKL loads (with torch).
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    # Idle OpenMP threads spin by default, which starves other work on small shared machines.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _quiet_third_parties() -> None:
    # Hugging Face libraries print progress bars and advice on every load; the CLI shows its own
    # progress, so keep theirs to errors (set before they are imported).
    for var, value in (
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("DIFFUSERS_VERBOSITY", "error"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"),
        ("KINETO_LOG_LEVEL", "5"),  # torch.profiler's C++ start/stop lines
    ):
        os.environ.setdefault(var, value)
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*torchvision.*")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _reproducible_math()
    _quiet_third_parties()
    _register()
    try:
        rv = app(args=argv, standalone_mode=False)
        if isinstance(rv, int):  # typer.Exit(code) comes back as the return value here
            return rv
    except OpsnnQuantError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # typer/click exits (e.g. --help)
        return int(exc.code or 0)
    except Exception as exc:  # click usage errors carry an exit code
        code = getattr(exc, "exit_code", None)
        if code is not None:
            show = getattr(exc, "show", None)
            if callable(show):
                show()
            return int(code)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
