"""JSON of the wire (S0.3.5, S7.1) on `_json`, the stdlib json package's own C codec.

Owns `dumps` (compact, UTF-8 kept as text, no NaN/Infinity) and `loads` (a str or UTF-8
bytes holding one JSON document).  Both run exactly the C encoder and scanner that
`json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)` and
`json.loads` run, built from the same options (bytes: UTF-8 only); only the `json` package
is not imported: its import pulls in `re`, `enum` and `functools`, about 11 ms of CPU that
every `rq` call from a shell paid on top of the interpreter's ~14 ms (issue 15 item 3).  A
failed decode raises json's own JSONDecodeError (a ValueError; `_json` imports json.decoder
to raise it).
Falls back to the json package on an interpreter without `_json`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"   # JSON's whitespace (RFC 8259), as json.decoder skips it


def _default(obj: Any) -> Any:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def _constant(name: str) -> float:
    """NaN, Infinity and -Infinity, which json.loads accepts (as its parse_constant does)."""
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


class _Context:
    """The options the C scanner reads from a JSONDecoder: json.loads's defaults."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)


try:
    import _json
except ImportError:  # pragma: no cover - every CPython builds _json
    import json

    _ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def dumps(obj: Any) -> str:
        return _ENCODER.encode(obj)

    def loads(text: str | bytes | bytearray) -> Any:
        return json.loads(text)
else:
    _scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # reads its attributes

    def dumps(obj: Any) -> str:
        """Compact plain JSON: `json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
        allow_nan=False)`."""
        if isinstance(obj, str):
            return _json.encode_basestring(obj)
        # JSONEncoder.iterencode's one-shot call: c_make_encoder(markers, default, encoder,
        # indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan), with a new
        # markers dict each time (check_circular).
        encode = _json.make_encoder({}, _default, _json.encode_basestring, None, ":", ",",
                                    False, False, False)
        return "".join(encode(obj, 0))

    def loads(text: str | bytes | bytearray) -> Any:
        """One JSON document surrounded by optional whitespace; bytes are UTF-8, a leading
        BOM dropped as json.loads drops it (the wire is UTF-8: no UTF-16/32 detection)."""
        if not isinstance(text, str):
            data = bytes(text)
            text = (data[3:] if data[:3] == b"\xef\xbb\xbf" else data).decode("utf-8")
        start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            obj, end = _scan(text, start)
        except StopIteration as exc:
            raise _error("Expecting value", text, exc.value) from None
        if text[end:].strip(_WHITESPACE):
            raise _error("Extra data", text, end)
        return obj

    def _error(msg: str, text: str, pos: int) -> ValueError:
        from json import JSONDecodeError  # an error path: the package's import is paid here
        return JSONDecodeError(msg, text, pos)
