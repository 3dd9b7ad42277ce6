"""Nested form field names (SPEC S14.7): `mesg[param1]`, `queue[coalesce_params][]`.

Owns the Rack-style reading of bracketed names into dicts and lists, so the
views can take `nested(request.values, "queue")` as one object.  Pure: no
request, no IO.  Conflicting shapes (`a[b]=1` then `a[b][c]=2`) never fail:
the later field replaces the earlier one, as a form has no other way to say
which it meant.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_NAME_RE = re.compile(r"([^\[\]]+)((?:\[[^\[\]]*\])*)")
_KEY_RE = re.compile(r"\[([^\[\]]*)\]")


def split_name(name: str) -> list[str]:
    """`a[b][]` -> ["a", "b", ""]; a name that is not bracketed is one part."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        return [name]
    return [match.group(1), *_KEY_RE.findall(match.group(2))]


def parse_nested(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Every (name, value) pair folded into one nested structure."""
    out: dict[str, Any] = {}
    for name, value in items:
        _assign(out, split_name(name), value)
    return out


def nested(values: Any, prefix: str) -> dict[str, Any]:
    """The `prefix[...]` fields of a MultiDict as a dict (empty when there are none)."""
    start = prefix + "["
    pairs = [(k, v) for k, v in values.items(multi=True) if k.startswith(start)]
    found = parse_nested(pairs).get(prefix)
    return found if isinstance(found, dict) else {}


def _assign(container: dict[str, Any], parts: list[str], value: Any) -> None:
    key, rest = parts[0], parts[1:]
    if not rest:
        container[key] = value
    elif rest[0] == "":
        items = container.get(key)
        if not isinstance(items, list):
            items = container[key] = []
        _append(items, rest[1:], value)
    else:
        sub = container.get(key)
        if not isinstance(sub, dict):
            sub = container[key] = {}
        _assign(sub, rest, value)


def _append(items: list[Any], rest: list[str], value: Any) -> None:
    """`a[]=v` appends v; `a[][k]=v` fills the last dict unless it has k already."""
    if not rest:
        items.append(value)
        return
    last = items[-1] if items else None
    if not isinstance(last, dict) or _has_path(last, rest):
        last = {}
        items.append(last)
    _assign(last, rest, value)


def _has_path(container: dict[str, Any], parts: list[str]) -> bool:
    key = parts[0]
    if key not in container:
        return False
    if len(parts) == 1 or parts[1] == "":
        return True
    sub = container[key]
    return isinstance(sub, dict) and _has_path(sub, parts[1:])
