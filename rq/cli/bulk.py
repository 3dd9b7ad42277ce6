"""`rq requeue` and `rq purge` (issue 16 item 6): bulk retry and clean-up of one queue.

Each is one request to the queue process (`requeue_messages`, `purge_messages`, see
rq.queue.bulkmove), which moves the messages in batches, each message by the same atomic,
logged transition as a single command (S13); the reply counts them.  This module only
turns flags into that request and the reply into one line.

    rq requeue --queue Q [--state err|done|relayed] [--search FIELD=VALUE [--exact]] [--dry-run]
    rq purge --queue Q --older-than AGE [--state done,err,relayed] [--search ...] [--dry-run]

AGE is a number with an optional unit: `s` (the default), `m`, `h`, `d` or `w`, e.g. `7d`.
"""

from __future__ import annotations

from rq import protocol
from rq.cli.base import CliError, Invocation, call_queue, command, is_ok, optional, \
    print_reply, require
from rq.errors import ProtocolError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

BULK_TIMEOUT = 3600.0  # a purge of a large hashdir takes a while; the reply waits for it
SEARCH_FLAGS = ("search", "exact", "dry-run")


def parse_age(text: str) -> float:
    """`7d` → 604800.0; `90` → 90.0 seconds (rq.protocol.parse_age)."""
    try:
        return protocol.parse_age(text)
    except ProtocolError:
        raise CliError(f"invalid --older-than {text} (a number with s, m, h, d or w, e.g. 7d)") \
            from None


def search_args(inv: Invocation) -> dict[str, Any]:
    """`--search FIELD=VALUE` (a field of the message as read, as GET /search's
    query[FIELD]=VALUE: contained, or equal with `--exact`) and `--dry-run`."""
    arg: dict[str, Any] = {}
    search = optional(inv, "search")
    if search is not None:
        field, sep, value = search.partition("=")
        if not sep or not field:
            raise CliError(f"invalid --search {search} (FIELD=VALUE, e.g. param1=report)")
        arg["query"] = {field: value}
        arg["exact"] = inv.flags.get("exact") is True
    if inv.flags.get("dry-run") is True:
        arg["dry_run"] = True
    return arg


def print_count(inv: Invocation, reply: Any, done: str) -> int:
    """`ok N messages <done>` (or `would be <done>` for a dry run); a failure as S19.3."""
    if not is_ok(reply) or not isinstance(reply[1], int):
        return print_reply(inv, reply)
    verb = f"would be {done}" if inv.flags.get("dry-run") is True else done
    inv.say(f"ok {reply[1]} message{'' if reply[1] == 1 else 's'} {verb}")
    return 0


@command("requeue", "queue", "state", *SEARCH_FLAGS)
def requeue(inv: Invocation) -> int:
    name = require(inv, "queue")
    arg = {"state": optional(inv, "state") or "err", **search_args(inv)}
    return print_count(inv, call_queue(inv, name, "requeue_messages", arg, BULK_TIMEOUT),
                       "requeued")


@command("purge", "queue", "state", "older-than", *SEARCH_FLAGS)
def purge(inv: Invocation) -> int:
    name = require(inv, "queue")
    older = parse_age(require(inv, "older-than"))
    states = (optional(inv, "state") or "done,err,relayed").split(",")
    arg = {"states": states, "older_than": older, **search_args(inv)}
    return print_count(inv, call_queue(inv, name, "purge_messages", arg, BULK_TIMEOUT),
                       "purged")
