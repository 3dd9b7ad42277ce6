"""Frozen records for the modules every `rq` call imports (issue 15 item 3).

Owns `Record`: a slotted, immutable record built from positional or keyword arguments with
trailing defaults, equal and hashed by its fields, with a readable repr.  It stands in for
collections.namedtuple where a shell loop of `rq sendmesg` pays for the import: collections
and the class each namedtuple compiles at import cost ~3 ms of a ~21 ms call.  A subclass
lists its fields in `__slots__` and their trailing defaults in `defaults`.  Leaf: imports
nothing.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Record:
    __slots__: tuple[str, ...] = ()
    defaults: tuple[Any, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        cls = type(self).__name__
        if len(args) > len(names):
            raise TypeError(f"{cls}() takes {len(names)} arguments, {len(args)} given")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in values:
                raise TypeError(f"{cls}() got an unexpected or repeated argument {key!r}")
            values[key] = value
        first_default = len(names) - len(self.defaults)
        for i, name in enumerate(names):
            if name not in values:
                if i < first_default:
                    raise TypeError(f"{cls}() missing argument {name!r}")
                values[name] = self.defaults[i - first_default]
            object.__setattr__(self, name, values[name])

    def fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.fields() == other.fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.fields()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({inner})"
