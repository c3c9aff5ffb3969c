"""The probe: fp16 overflow, local int8 errors and end-to-end attribution per module.

``opsnn_quant.probe`` is this package and, as the workflow's first step, the function
:func:`opsnn_quant.probe.api.probe`: once any of its modules is imported, Python binds the
package to the attribute ``opsnn_quant.probe``, so the package itself is callable and runs the
function (``oq.probe(adapter, loop)`` works whatever was imported before).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableProbe(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from opsnn_quant.probe.api import probe

        return probe(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableProbe
