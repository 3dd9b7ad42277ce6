"""Messages as data: the stored fields and the input rules that produce them.

Owns the S4.4 field list and input normalisation, the computed status (S0.2),
the hashdir bucket of a short id (S3.2) and the time an id encodes (S4.1).
Pure functions only: reading and writing message directories is `rq.store`'s.
"""

from __future__ import annotations

import json
import math
import re

from rq.errors import Fail, ProtocolError
from rq.protocol import dumps, valid_msg_id

TYPE_CHECKING = False  # typing is not imported at run time (issue 15)
if TYPE_CHECKING:
    from typing import Any

# S4.4: the only fields a `msg` file may hold, in the table's order.
STORED_FIELDS: tuple[str, ...] = (
    "msg_id", "dest", "src", "param1", "param2", "param3", "param4", "due", "count",
    "max_count", "orig_msg_id", "post_run_webhook", "force_remote", "cloned_from", "dups",
    "dup",
)

PARAMS: tuple[str, ...] = ("param1", "param2", "param3", "param4")
DEFAULT_MAX_COUNT = 15

_DECIMAL_RE = re.compile(r"^[0-9]+$")
_NUMERIC_RE = re.compile(r"^\s*[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$")


def normalize_input(data: object, now: float) -> dict[str, Any]:
    """S4.4 input rules: the stored fields taken from a create request.

    Only the input keys S4.4 lists are taken; `msg_id`, `orig_msg_id`'s
    default and the rest are the store's.  Raises Fail(reason).
    """
    if not isinstance(data, dict):
        raise Fail('input missing required "dest" parameter')
    dest = data.get("dest")
    if not isinstance(dest, str) or not dest:
        raise Fail('input missing required "dest" parameter')
    msg: dict[str, Any] = {"dest": dest}
    for key in ("src", *PARAMS):
        if data.get(key) is not None:
            msg[key] = _field_text(key, data[key])
    msg["due"] = _due(data.get("due"), now)
    msg["count"] = _count(data.get("count"), 0, "count")
    msg["max_count"] = _count(data.get("max_count"), DEFAULT_MAX_COUNT, "max_count")
    if data.get("orig_msg_id") not in (None, ""):  # "" means: default to our own id
        msg["orig_msg_id"] = _field_text("orig_msg_id", data["orig_msg_id"])
    webhooks = _webhooks(data.get("post_run_webhook"))
    if webhooks:
        msg["post_run_webhook"] = webhooks
    if truthy(data.get("force_remote")):
        msg["force_remote"] = True
    _check_utf8(msg)
    return msg


def _check_utf8(msg: dict[str, Any]) -> None:
    """Refuse a field that cannot be stored: JSON may carry a lone surrogate
    (`"\\ud800"`) that no UTF-8 msg file can hold.  Checked here, per request,
    so the failure is this request's own and never its batch's (S7.3)."""
    try:
        json.dumps(msg, ensure_ascii=False).encode()
        return
    except UnicodeEncodeError:
        pass
    for key, value in msg.items():
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise Fail(f"invalid {key} value: not valid Unicode text") from None


def param_text(v: object) -> str:
    """A param as stored: strings as given, anything else as compact JSON text."""
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _field_text(key: str, v: object) -> str:
    """param_text of an input field, or Fail(`invalid KEY value`) for what
    plain JSON cannot hold (S0.3.5: an infinite number, NaN, e.g. from
    `{"param1": 1e999}`) or what is nested too deep to write back (D9)."""
    try:
        return _ENCODER_STRICT.encode(v) if not isinstance(v, str) else v
    except (ValueError, RecursionError):
        raise Fail(f"invalid {key} value") from None


_ENCODER_STRICT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def truthy(v: object) -> bool:
    """S3.3 TRUTHY: `true`, `1`, or one of the strings "true", "yes", "1"
    (used by `rq.config` too)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v == 1
    return isinstance(v, str) and v in ("true", "yes", "1")


def _due(v: object, now: float) -> int | float:
    if v is None:
        return int(now)
    if isinstance(v, str) and _NUMERIC_RE.match(v):
        v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Fail("invalid due value")
    if isinstance(v, float):
        if not math.isfinite(v):
            raise Fail("invalid due value")
        return int(v) if v.is_integer() else v
    try:
        float(v)  # the scheduler orders dues as floats; a bigger integer is no time
    except OverflowError:
        raise Fail("invalid due value") from None
    return v


def _count(v: object, default: int, key: str) -> int:
    if v is None:
        return default
    if isinstance(v, str) and _DECIMAL_RE.match(v):
        return int(v)
    if isinstance(v, float) and v.is_integer() and v >= 0:
        return int(v)
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    raise Fail(f"invalid {key} value")


def _webhooks(v: object) -> list[str]:
    """S4.4: an array of strings, or one string of whitespace-separated URLs."""
    if v is None:
        return []
    if isinstance(v, str):
        return v.split()
    if isinstance(v, list) and all(isinstance(url, str) for url in v):
        return [url for url in v if url.strip()]
    raise Fail("invalid post_run_webhook value")


def computed_status(state: str, text: str | None) -> str:
    """S0.2: `<state>`, or `<state> - <status text>` when there is a text."""
    return f"{state} - {text}" if text else state


def bucket(msg_id: str) -> str:
    """S3.2 hashdir bucket `YYYYMMDD/HH/MM` of a short id (its creation time)."""
    if not valid_msg_id(msg_id):
        raise ProtocolError(f"invalid msg_id: {msg_id}")
    return f"{msg_id[0:8]}/{msg_id[9:11]}/{msg_id[11:13]}"


def id_epoch(msg_id: str) -> float:
    """The UTC creation time an S4.1 short id encodes, as epoch seconds."""
    if not valid_msg_id(msg_id):
        raise ProtocolError(f"invalid msg_id: {msg_id}")
    day, hhmm, ss, ms = msg_id.split(".")[:4]
    parts = (int(day[0:4]), int(day[4:6]), int(day[6:8]), int(hhmm[0:2]), int(hhmm[2:4]),
             int(ss))
    mon, mday, hour, minute, sec = parts[1:]
    import calendar  # only for ids given back to us: not on the create path

    if not (1 <= mon <= 12 and 1 <= mday <= calendar.monthrange(parts[0], mon)[1]
            and hour < 24 and minute < 60 and sec < 60):
        raise ProtocolError(f"invalid msg_id: {msg_id}")
    return calendar.timegm((*parts, 0, 0, 0)) + int(ms) / 1000


def matches_query(msg: dict[str, Any], query: dict[str, str], exact: bool) -> bool:
    """S15 route 8 (`GET /search`), also the bulk commands' search (issue 16): every
    query field exists and its value (non-strings as JSON text) contains the wanted
    text, or equals it when `exact`."""
    for field, wanted in query.items():
        if field not in msg:
            return False
        value = msg[field]
        text = value if isinstance(value, str) else dumps(value)
        if (text != wanted) if exact else (wanted not in text):
            return False
    return True
