"""YAML helpers: deterministic dumping and pydantic errors mapped back to YAML lines."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from opsnn_quant.errors import ConfigError
from opsnn_quant.policy.form import DocumentError, FlowMap

M = TypeVar("M", bound=BaseModel)

# libyaml's parser when PyYAML was built with it (about five times faster on a large policy);
# a file it refuses is parsed again by the pure-Python one, whose messages the errors quote.
_FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Wide enough that PyYAML never folds a reason string over several lines (folding is
# deterministic too, but one reason per line is easier to read and to grep).
_WIDTH = 1 << 16


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes a :class:`~opsnn_quant.policy.form.FlowMap` on one line."""


def _flow_map(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)


_Dumper.add_representer(FlowMap, _flow_map)


def dump(data: Any, header: str = "") -> str:
    """YAML text of plain data, keys in insertion order; same data -> same bytes. A
    :class:`~opsnn_quant.policy.form.FlowMap` is written on one line."""
    body = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=_WIDTH,
    )
    lines = "".join(f"# {h}\n" if h else "#\n" for h in header.splitlines()) if header else ""
    return lines + body


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """1-based line of the YAML node that ``loc`` (a pydantic error location) points at."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            if key == "[key]":  # pydantic's marker for "the dict key itself is bad"
                return line
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(key):
                    line = k.start_mark.line + 1
                    node = v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            if not 0 <= key < len(node.value):
                return line
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _parse(text: str, loader_cls: type[yaml.SafeLoader]) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for line numbers) and its data, from one parse."""
    loader = loader_cls(text)
    try:
        root = loader.get_single_node()
        return root, None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


@dataclass
class _Open:
    """A collection the event scan is inside: how many nodes it holds so far."""

    mapping: bool
    limit: int | None = None  # the most entries it may hold (a counted top-level value)
    line: int = 0  # of its key
    nodes: int = 0

    def entries(self) -> int:
        return (self.nodes + 1) // 2 if self.mapping else self.nodes


def _overlong(
    text: str, limits: Mapping[str, int], loader_cls: type[yaml.SafeLoader]
) -> tuple[str, int, int] | None:
    """The first top-level key of ``limits`` whose sequence or mapping holds more entries than
    its limit: (key, limit, line of the key); None when none does, or when the text is
    not valid YAML (the parse proper reports that). Reads parser events only (no node is built,
    no tag resolved) and stops at the first entry past the limit, so that a file of a million
    rules is refused in the time its first few thousand take."""
    stack: list[_Open] = []
    key: object = None
    key_line = 0
    try:
        for ev in yaml.parse(text, Loader=loader_cls):
            if isinstance(ev, yaml.CollectionEndEvent):
                stack.pop()
                continue
            if not isinstance(ev, yaml.NodeEvent):
                continue
            if stack:
                top = stack[-1]
                top.nodes += 1
                if top.limit is not None and top.entries() > top.limit:
                    return str(key), top.limit, top.line
                if len(stack) == 1 and top.mapping and top.nodes % 2:  # a top-level key
                    key = ev.value if isinstance(ev, yaml.ScalarEvent) else None
                    key_line = ev.start_mark.line + 1 if ev.start_mark is not None else 0
            if isinstance(ev, yaml.CollectionStartEvent):
                value_of = stack[0] if len(stack) == 1 and stack[0].mapping else None
                is_value = value_of is not None and value_of.nodes % 2 == 0
                limit = limits.get(key) if is_value and isinstance(key, str) else None
                stack.append(_Open(isinstance(ev, yaml.MappingStartEvent), limit, key_line))
    except yaml.YAMLError:
        return None
    return None


def load_model(
    cls: type[M],
    text: str,
    source: str = "<string>",
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    limits: Mapping[str, int] | None = None,
) -> M:
    """Parse YAML ``text`` and validate it as ``cls``.

    Args:
        cls: the pydantic model.
        text: the YAML text.
        source: the file name in messages.
        prepare: turns the document into the model's data first (e.g. a file form's presets
            into rules); a :class:`~opsnn_quant.policy.form.DocumentError` it raises is
            reported at its location.
        limits: top-level key -> the most entries its sequence (or mapping) may hold; checked
            on the parser's events before the document is built.

    Raises:
        ConfigError: bad YAML, a collection past its limit, or a schema violation; the message
            names the field path and the line in ``source``.
    """
    over = _overlong(text, limits, _FAST_LOADER) if limits else None
    if over is not None:
        key, limit, at_line = over
        raise ConfigError(
            f"{source}: {key}: more than the {limit} entries it may hold (line {at_line})"
        )
    try:
        try:
            root, data = _parse(text, _FAST_LOADER)
        except yaml.YAMLError:
            if _FAST_LOADER is yaml.SafeLoader:
                raise
            root, data = _parse(text, yaml.SafeLoader)  # raises again, with its own message
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    if prepare is not None:
        try:
            data = prepare(data)
        except DocumentError as exc:
            where = ".".join(str(x) for x in exc.loc) or "<root>"
            line = _line_of(root, list(exc.loc))
            at = f" (line {line})" if line is not None else ""
            raise ConfigError(f"{source}: {where}: {exc}{at}") from exc
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # An unknown key is the most precise complaint (a misspelt field also shows up as a
        # missing one, located only at its parent), so report it first.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = [x for x in first["loc"] if x != "[key]"] or ["<root>"]
        where = ".".join(str(x) for x in loc)
        line = _line_of(root, list(first["loc"]))
        at = f" (line {line})" if line is not None else ""
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{source}: {where}: {msg}{at}{more}") from exc
