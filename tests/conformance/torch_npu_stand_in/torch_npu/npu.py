"""The stand-in's ``torch_npu.npu`` (also ``torch.npu``): a machine with no NPU.

See the package docstring for which engine line each name satisfies.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

# torch_npu.npu.config: MindIE-SD sets allow_internal_format at import (moe_mlp.py:20)
config = SimpleNamespace(allow_internal_format=False)


def device_count() -> int:
    return 0


def is_available() -> bool:
    return False


def current_device() -> int:
    return 0


def empty_cache() -> None:
    pass


def synchronize(device: Any = None) -> None:
    pass


def get_soc_version() -> int:
    raise RuntimeError("torch_npu stand-in: no NPU, so no SoC version")


class Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Stream | None = None) -> None:
        pass

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Stream) -> None:
        pass

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        return event or Event()


class stream:  # (torch_npu.npu.stream is a context manager class, as torch.cuda's)
    def __init__(self, s: Stream | None) -> None:
        self.stream = s

    def __enter__(self) -> Stream | None:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        pass


def current_stream(device: Any = None) -> Stream:
    return Stream()


class NPUGraph:  # (annotation only: vllm_ascend/compilation/acl_graph.py:57)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("torch_npu stand-in: no NPU, so no NPU graph")


class ExternalEvent(Event):  # (annotation only: vllm_ascend/compilation/acl_graph.py:294)
    pass
