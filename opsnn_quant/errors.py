"""Exception types. The CLI prints ``str(err)`` and exits 2 for :class:`InputError` subclasses."""

from __future__ import annotations


class OpsnnQuantError(Exception):
    """Base class of every error opsnn-quant raises on purpose.

    Messages are one line and say what the user should fix.
    """

    exit_code = 1


class InputError(OpsnnQuantError):
    """Bad input from the user: files, shapes, dtypes, configs. CLI exit code 2."""

    exit_code = 2


class ShapeError(InputError):
    """Tensor shapes or dtypes that an operator or a module cannot take."""


class CalibrationError(InputError):
    """Calibration data that cannot be used (NaN/Inf, empty, never reached a module)."""


class CheckpointError(InputError):
    """A quantized checkpoint that is missing, corrupt or does not fit the model."""


class OutputError(InputError):
    """An output path that cannot or must not be written (exists, not ours, read-only, full)."""


class OutputChangedError(OutputError):
    """The output location changed while a run built its replacement (a user's file appeared
    there): nothing was replaced, and the finished output is kept in its temporary sibling."""


class ConfigError(InputError):
    """A recipe, policy, suite or mapping that is invalid or names nothing."""


class ModelLoadError(InputError):
    """A model directory, family or zoo entry that cannot be loaded."""


class CacheError(InputError):
    """A file of opsnn-quant's cache that is no regular file inside the cache (a FIFO, a device,
    a link loop or a link out of it), or a cache entry that does not match its stamp where the
    cache cannot be rewritten."""


class DeviceUnavailableError(InputError):
    """A device this machine does not have (no torch_npu, no CUDA, no such index): the user
    names another one, so it is bad input, not a failure of a backend."""


class BackendError(OpsnnQuantError):
    """A backend (e.g. torch_npu) that is unavailable or rejected an operation."""


class MissingDependencyError(InputError):
    """An optional dependency is not installed; the message names the extra to install."""
