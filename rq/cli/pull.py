"""`rq` commands of pull consumers (S8.6: reserve, report, renew) and the
event stream (S8.8: watch)."""

from __future__ import annotations

import os

from rq import client, protocol
from rq.cli.base import (
    CliError,
    Invocation,
    command,
    msg_ref,
    optional,
    print_json,
    print_reply,
    require,
    silence,
)
from rq.errors import ConnectError, Fail

TYPE_CHECKING = False  # typing is not imported at run time (issue 15)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# ---------------------------------------------------------------- pull consumers (S8.6)

RESERVE_SLACK = 30.0  # seconds on top of --wait for the manager's reply


def call_mgr_json(inv: Invocation, cmd: str, arg: dict[str, Any],
                  timeout: float = 60.0) -> Any:
    try:
        return client.call_mgr(inv.root, cmd, arg, timeout=timeout)
    except ConnectError:
        raise CliError("cannot connect to rq-mgr (is it running?)") from None


def string_flags(inv: Invocation, *names: str) -> dict[str, Any]:
    return {name: value for name in names if (value := optional(inv, name)) is not None}


@command("reserve", "pattern", "lease", "wait", "consumer", "json")
def reserve(inv: Invocation) -> int:
    """S8.2: `ok <compact JSON of RES>` or `ok null`; with `--json` RES (or null) alone."""
    given = inv.flags.get("pattern")
    patterns = [p for v in (given if isinstance(given, list) else [])
                if isinstance(v, str) for p in v.split(",") if p]
    if not patterns:
        raise CliError("missing required argument --pattern")
    arg = {"patterns": patterns, **string_flags(inv, "lease", "wait", "consumer")}
    try:
        wait = min(max(float(arg.get("wait", 0)), 0.0), 60.0)
    except ValueError:
        wait = 0.0
    reply = call_mgr_json(inv, "reserve", arg, wait + RESERVE_SLACK)
    if inv.as_json():
        return print_json(inv, reply, lambda res: res)
    return print_reply(inv, reply)


@command("report", "msg_id", "token", "line")
def report(inv: Invocation) -> int:
    """S8.3: `ok <state>`, `ok <NEW_FULL_ID>` for a dup, or `fail <reason>`."""
    _, _, ref = msg_ref(inv)
    arg = {"msg_id": ref, "token": require(inv, "token"), "line": require(inv, "line")}
    return print_reply(inv, call_mgr_json(inv, "report", arg))


@command("renew", "msg_id", "token", "lease")
def renew(inv: Invocation) -> int:
    """S8.3: `ok <expiry epoch>`."""
    _, _, ref = msg_ref(inv)
    arg = {"msg_id": ref, "token": require(inv, "token"), **string_flags(inv, "lease")}
    return print_reply(inv, call_mgr_json(inv, "renew", arg))


# ---------------------------------------------------------------- watch (S8.8)


def watch_line(event: Mapping[str, Any]) -> str:
    """`<time> <queue> <msg_id> <from> -> <to> <status>`: time as in S6.3
    (local, `YYYY-MM-DD HH:MM:SS ±HHMM`), `-` for a null `from`, the status
    left out when null, newlines in it turned to spaces (one line per event)."""
    import time

    ts = event.get("ts")
    when = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(
        ts if isinstance(ts, (int, float)) else 0))
    frm = event.get("from")
    line = (f"{when} {event.get('queue')} {event.get('msg_id')} "
            f"{'-' if frm is None else frm} -> {event.get('to')}")
    status = event.get("status")
    return line if status is None else f"{line} {' '.join(str(status).splitlines())}"


def watch_patterns(inv: Invocation) -> list[str]:
    given = inv.flags.get("pattern")
    values = given if isinstance(given, list) else []
    patterns = [p.strip() for v in values if isinstance(v, str) for p in v.split(",")
                if p.strip()]
    if not patterns:
        raise CliError("missing required argument --pattern")
    return patterns


def watch_since(inv: Invocation) -> float | None:
    raw = inv.flags.get("since")
    if raw is None:
        return None
    try:
        since = float(raw) if isinstance(raw, str) else -1.0
    except ValueError:
        since = -1.0
    if not since >= 0 or since == float("inf"):
        raise CliError(f"invalid --since: {raw if isinstance(raw, str) else ''} "
                       "(an epoch in seconds)")
    return since


@command("watch", "pattern", "since", "json", "cursor")
def watch(inv: Invocation) -> int:
    """S8.8: one line (or the JSON) per event until interrupted; exit 0 on SIGINT.
    With `--cursor NAME` (issue 18) the stream resumes where the cursor was
    acknowledged, and each event is acknowledged once printed and flushed."""
    cursor = optional(inv, "cursor")
    patterns = watch_patterns(inv) if cursor is None or inv.flags.get("pattern") else []
    since = watch_since(inv)
    try:
        try:
            sub = client.subscribe(inv.root, patterns, since, cursor=cursor)
        except Fail as exc:
            return print_reply(inv, ["fail", str(exc)])
        except ConnectError:
            raise CliError("cannot connect to rq-mgr (is it running?)") from None
        with sub:
            follow(inv, sub)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `rq watch | head`: the reader is done
        silence(inv.out)
        return 0
    return 0


def follow(inv: Invocation, sub: client.Subscription) -> None:
    """Print events until the stream ends or SIGINT; a cursor's are acknowledged
    after the output was flushed, once per burst (the last one of what is here).
    The wait also watches a signal wakeup pipe: a SIGINT that lands between the
    interpreter's last check and the wait wakes it instead of being lost."""
    import signal
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        print_events(inv, sub, r)
    finally:
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)


def print_events(inv: Invocation, sub: client.Subscription, wake: int) -> None:
    as_json = "json" in inv.flags
    unacked = None
    while True:
        try:
            event = sub.next(wake=wake)
        except ConnectError:
            raise CliError("lost the connection to rq-mgr") from None
        if isinstance(event, list) and event[:1] == ["fail"]:
            raise CliError(str(event[1]) if len(event) > 1 else "rq-mgr refused")
        if not isinstance(event, dict):
            continue
        kind = event.get("event")
        if kind == "overflow" and not as_json:
            print(f"rq: warning: {event.get('dropped')} events dropped "
                  "(this watcher fell behind)", file=inv.err, flush=True)
        elif kind == "gap" and not as_json:
            print(f"rq: warning: {event.get('lost')} events were removed by retention "
                  "before this cursor read them", file=inv.err, flush=True)
        else:
            shown = {k: v for k, v in event.items() if k != "pos"}
            print(protocol.dumps(shown) if as_json else watch_line(event),
                  file=inv.out, flush=True)
        unacked = event.get("pos") or unacked
        if unacked and not sub.buffered():
            sub.ack(unacked)
            unacked = None


@command("cursors", "json")
def cursors(inv: Invocation) -> int:
    """Issue 18: every named cursor, one line each: name, position, lag, last ack."""
    reply = call_mgr_json(inv, "cursors", {})
    if inv.as_json():
        return print_json(inv, reply, lambda rows: rows)
    if not (isinstance(reply, list) and reply[:1] == ["ok"]):
        return print_reply(inv, reply)
    for row in reply[1]:
        if row.get("state") == "corrupt":
            inv.say(f"{row['name']} CORRUPT {row.get('problem')}")
            continue
        acked = row.get("acked_at")
        when = "never" if acked is None else protocol_time(acked)
        inv.say(f"{row['name']} position={row['position']} lag={row['lag']} "
                f"gap={row['gap']} last_ack={when} {row['state']} "
                f"patterns={','.join(row['patterns'])}")
    return 0


def protocol_time(epoch: float) -> str:
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@command("deletecursor", "cursor")
def deletecursor(inv: Invocation) -> int:
    """Issue 18: delete a named cursor (a damaged state file is moved aside)."""
    try:
        reply = client.call_mgr(inv.root, "delete_cursor", require(inv, "cursor"), raw=True)
    except ConnectError:
        raise CliError("cannot connect to rq-mgr (is it running?)") from None
    return print_reply(inv, reply)
