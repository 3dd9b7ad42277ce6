"""`rq` commands built on the producer API (rq.producer): `rq wait` (issue 16
item 2) and `rq sendmesg --stdin` (issue 15 item 3; `rq sendmesg` without
`--stdin` or `--url` stays rq.cli.messages'), both over the root's sockets or,
with `--url`, over HTTP.

`rq wait --msg_id ID [--msg_id ID2 …] [--timeout SECS]` prints `<full id>
<status>` per message once every one has ended; exit 0 when all ended done or
relayed, 1 when one ended in err (or is gone), 2 on timeout (as `tsp -w`).

`rq sendmesg --dest Q --stdin` reads one message per line: a JSON object of
message fields (S4.4; the other flags are its defaults), or a plain line taken
as `param1`; blank lines are skipped.  Lines are sent in batches on one stream
(rq.queue.createstream), a batch going out when BATCH lines are read or no more input
is waiting; one full id is printed per line, in input order, as its batch is
answered.  The first refused line stops it: `rq: line N: <reason>`, exit 1;
the lines before it are queued and printed, none after it is.
"""

from __future__ import annotations

import json
import os
import select
import sys
from collections.abc import Iterator
from typing import Any

from rq.topics import is_pattern

from rq.cli.base import (
    MESSAGE_FLAGS,
    CliError,
    Invocation,
    command,
    optional,
    require,
    silence,
)

BATCH = 256                 # lines per frame at most
BATCH_BYTES = 4 << 20       # and at most this much JSON
READ_SIZE = 1 << 16
EXIT_TIMEOUT = 2


def producer(inv: Invocation) -> Any:
    """A Client over the root's sockets, or over HTTP with `--url`."""
    from rq.producer import Client
    url = optional(inv, "url")
    if "url" in inv.flags and url is None:
        raise CliError("missing required argument --url")
    return Client(url=url) if url is not None else Client(inv.root)


def target(inv: Invocation, client: Any, dest: str) -> str:
    """The queue of `dest` (S19 sendmesg): a URL needs `--relay-ok`."""
    from rq import protocol
    if protocol.is_remote_dest(dest) and "relay-ok" not in inv.flags:
        raise CliError(f"cannot relay to {dest} without --relay-ok")
    return str(client.queue_for(dest, relay_ok=True))


# ---------------------------------------------------------------- rq wait


def wait_ids(inv: Invocation) -> list[str]:
    given = inv.flags.get("msg_id")
    ids = [v for v in (given if isinstance(given, list) else [given]) if isinstance(v, str) and v]
    if not ids:
        raise CliError("missing required argument --msg_id")
    return ids


def wait_timeout(inv: Invocation) -> float | None:
    raw = inv.flags.get("timeout")
    if raw is None:
        return None
    try:
        secs = float(raw) if isinstance(raw, str) else -1.0
    except ValueError:
        secs = -1.0
    if not 0 <= secs < float("inf"):
        raise CliError(f"invalid --timeout: {raw if isinstance(raw, str) else ''} (seconds)")
    return secs


@command("wait", "msg_id", "timeout", "url", accumulating=("msg_id",))
def wait(inv: Invocation) -> int:
    """Issue 16 item 2: block until the messages end (S8.8 events), print each status."""
    from rq.producer import Refused, WaitTimeout
    ids, timeout = wait_ids(inv), wait_timeout(inv)
    try:
        statuses = producer(inv).wait(ids, timeout)
    except WaitTimeout as exc:
        statuses, code = exc.statuses, EXIT_TIMEOUT
    except Refused as exc:
        raise CliError(exc.reason) from None
    else:
        code = 0 if all(s.ok for s in statuses) else 1
    for status in statuses:
        inv.say(f"{status.msg_id} {status.status}")
    return code


# ---------------------------------------------------------------- rq sendmesg --stdin


def line_message(text: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """One input line as message fields; CliError for a `{` line that is not valid JSON,
    naming what is wrong and where (a line is one JSON text: its column, not its line)."""
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
        return {**defaults, **obj}  # a JSON text that starts with `{` is an object
    return {**defaults, "param1": text}


def input_lines(fd: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line without its newline) per input line; (0, None) whenever
    no more input is waiting, so the caller can send what it holds."""
    number, rest = 0, b""
    while True:
        if not select.select([fd], [], [], 0)[0]:
            yield 0, None
        chunk = os.read(fd, READ_SIZE)
        if not chunk:
            if rest:
                yield number + 1, rest
            return
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            number += 1
            yield number, line


def sendmesg_client(inv: Invocation) -> int:
    """`rq sendmesg` with `--stdin` and/or `--url` (the plain one is rq.cli.messages')."""
    if "stdin" not in inv.flags:
        return send_one(inv)
    dest = require(inv, "dest")
    if is_pattern(dest):
        raise CliError(f"a topic pattern dest ({dest}) fans out one message: not with --stdin")
    defaults = {k: inv.flags[k] for k in MESSAGE_FLAGS if k in inv.flags}
    from rq.producer import BulkRefused, Refused
    client = producer(inv)
    try:
        sender = client.bulk(dest, queue=target(inv, client, dest))
    except Refused as exc:
        raise CliError(exc.reason) from None
    numbers: list[int] = []    # line number of each message sent, in order
    try:
        with sender:
            send_lines(inv, sender, defaults, numbers)
    except BulkRefused as exc:
        print_ids(inv, exc.ids)
        raise CliError(f"line {numbers[exc.index]}: {exc.reason}") from None
    except BrokenPipeError:
        silence(inv.out)
        return 1
    return 0


def send_lines(inv: Invocation, sender: Any, defaults: dict[str, Any],
               numbers: list[int]) -> None:
    batch: list[dict[str, Any]] = []
    size = 0
    for number, raw in input_lines(sys.stdin.fileno()):
        if raw is not None:
            text = raw.decode("utf-8", "surrogateescape").rstrip("\r")
            if not text.strip():
                continue
            try:
                text.encode("utf-8")
                msg = line_message(text, defaults)
            except (CliError, UnicodeEncodeError) as exc:
                print_ids(inv, sender.send(batch) + sender.flush() if batch else sender.flush())
                reason = exc if isinstance(exc, CliError) else "not valid UTF-8 text"
                raise CliError(f"line {number}: {reason}") from None
            batch.append(msg)
            numbers.append(number)
            size += len(raw)
        if batch and (raw is None or len(batch) >= BATCH or size >= BATCH_BYTES):
            print_ids(inv, sender.send(batch))
            batch, size = [], 0
        if raw is None:  # the input is idle: show what has been queued so far
            print_ids(inv, sender.flush())
    if batch:
        print_ids(inv, sender.send(batch))
    print_ids(inv, sender.flush())


def print_ids(inv: Invocation, ids: list[str]) -> None:
    if ids:
        inv.out.write("".join(f"{i}\n" for i in ids))
        inv.out.flush()


def send_one(inv: Invocation) -> int:
    """`rq sendmesg --url URL --dest Q …`: one message over HTTP, printed as S19.3's `ok ID`."""
    from rq.producer import Refused
    dest = require(inv, "dest")
    fields = {k: inv.flags[k] for k in MESSAGE_FLAGS if k in inv.flags}
    client = producer(inv)
    try:  # a topic pattern: every copy's id (issue 18 item 2, rq.mgr.fanout)
        ids = client.transport.fanout(fields) if is_pattern(dest) else \
            [client.transport.create(target(inv, client, dest), fields)]
    except Refused as exc:
        inv.say(f"fail {exc.reason}")
        return 1
    for full in ids:
        inv.say(f"ok {full}")
    return 0
