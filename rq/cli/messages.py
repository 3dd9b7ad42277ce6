"""`rq` commands on messages and queues (SPEC S19, S4, S7.2, S7.3), `rq fsck`
and `rq analytics`: one small function per command that turns flags into one
request to a queue or the manager and the reply into the S19.3 output.  The
only files looked at are `queue/NAME/config.json` (to say "queue not found")
and, for `attachmesg`, the file to attach (the S4.8 checks done locally first).
"""

from __future__ import annotations

import os
import stat

from rq import client, protocol
from rq.cli.base import (
    ADMIN_OPS,
    MESSAGE_FLAGS,
    STATUS_TIMEOUT,
    CliError,
    Invocation,
    as_text,
    call_mgr,
    call_queue,
    command,
    is_ok,
    msg_ref,
    optional,
    print_json,
    print_message,
    print_reply,
    require,
)
from rq.errors import ConfigError, ConnectError
from rq.topics import is_pattern

TYPE_CHECKING = False  # typing is not imported at run time (issue 15)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from rq.cli.base import CommandFunc

# ---------------------------------------------------------------- sending messages

SEND_FLAGS = (*MESSAGE_FLAGS, "relay-ok")


def send_target(inv: Invocation, dest: str, cmd: str) -> str:
    """The queue that stores the message (S19 table, S4.3).  A plain queue name needs
    nothing of the main config; a path or URL dest needs its ROOT (S1.4 `relative_root`),
    so only then is config/config.json read and validated (issue 15: rq.config's records
    cost a shell loop of `rq sendmesg` a third of its time)."""
    if not dest.startswith("/") and not protocol.is_remote_dest(dest):
        return dest
    from rq import config

    try:
        prefix = config.load_main_config(inv.root).relative_root
    except ConfigError as exc:
        raise CliError(f"bad config file config/config.json: {exc}") from None
    if not protocol.is_remote_dest(dest):
        return protocol.dest_queue_name(dest, prefix)
    if cmd == "single_que":
        # "URL dests are not relayed": a URL names its queue like a full id
        # does (S4.2), so single_que goes to the local queue of the `/q/NAME`
        # segment (host ignored); a URL without one names no queue at all.
        name = protocol.resolve_dest(dest, "", prefix)[1]
        if not name:
            raise CliError(f"queue not found: {dest}")
        return name
    if "relay-ok" not in inv.flags:  # the flag's presence is the consent
        raise CliError(f"cannot relay to {dest} without --relay-ok")
    return "relay"


def send_message(inv: Invocation, cmd: str) -> int:
    dest = require(inv, "dest")
    fields = {k: inv.flags[k] for k in MESSAGE_FLAGS if k in inv.flags}
    if is_pattern(dest):
        return send_fanout(inv, dest, cmd, fields)
    return print_reply(inv, call_queue(inv, send_target(inv, dest, cmd), cmd, fields))


def send_fanout(inv: Invocation, dest: str, cmd: str, fields: dict[str, Any]) -> int:
    """Issue 18 item 2: a topic pattern `dest` (`video.*`, `reports.#`, `#`) asks rq-mgr
    for one copy in every queue whose topic matches (rq.mgr.fanout, all or nothing);
    printed as one `ok <full id>` line per copy, or the failure as S19.3's `fail <reason>`."""
    if cmd != "create_message":
        raise CliError(f"a topic pattern dest ({dest}) fans out with sendmesg only")
    reply = call_mgr(inv, "create_message", protocol.dumps(fields))
    if not is_ok(reply) or not isinstance(reply[1], list):
        return print_reply(inv, reply)
    for full in reply[1]:
        inv.say(f"ok {full}")
    return 0


@command("sendmesg", *SEND_FLAGS, "stdin", "url")
def sendmesg(inv: Invocation) -> int:
    if "stdin" in inv.flags or "url" in inv.flags:  # issues 15, 16: the producer API
        from rq.cli.produce import sendmesg_client
        return sendmesg_client(inv)
    return send_message(inv, "create_message")


@command("prepmesg", *SEND_FLAGS)
def prepmesg(inv: Invocation) -> int:
    return send_message(inv, "prep_message")


@command("single_que", *SEND_FLAGS)
def single_que(inv: Invocation) -> int:
    return send_message(inv, "single_que")


# ---------------------------------------------------------------- attachments (S4.8)

BAD_ATTACH_CHARS = frozenset("/~?[]%|$&<>")


def check_attachment(path: str, name: str) -> None:
    """The S4.8 checks the CLI can make itself, in the spec's order."""
    try:
        st = os.stat(path)
    except OSError:
        raise CliError(f"No such file {path} to attach to message") from None
    if stat.S_ISDIR(st.st_mode):
        raise CliError(f"Attachment currently cannot be a directory {path}")
    if not os.access(path, os.R_OK):
        raise CliError(f"Attachment currently cannot be read: {path}")
    if not stat.S_ISREG(st.st_mode):
        raise CliError(f"Attachment currently not of supported type: {path}")
    if name.startswith("."):
        raise CliError(f"Attachment name as a dot-file not allowed: {name}")
    if BAD_ATTACH_CHARS.intersection(name):
        raise CliError(f"Attachment name has invalid character. not allowed: {name}")


@command("attachmesg", "msg_id", "pathname", "name", "local_fs_only")
def attachmesg(inv: Invocation) -> int:
    queue, short, full = msg_ref(inv)
    path = os.path.abspath(require(inv, "pathname"))  # relative to the cwd (S19)
    name = optional(inv, "name") or os.path.basename(path)
    check_attachment(path, name)
    arg: dict[str, Any] = {"msg_id": short, "pathname": path, "name": name}
    if "local_fs_only" in inv.flags:
        arg["local_fs_only"] = inv.flags["local_fs_only"]
    reply = call_queue(inv, queue, "attach_message", arg)
    if not isinstance(reply, list) or len(reply) < 2:
        return print_reply(inv, reply)
    inv.say(f"{reply[0]} {as_text(reply[1])} for Message: {full} attachment")
    return 0 if reply[0] == "ok" else 1


# ---------------------------------------------------------------- message commands

# Commands whose reply is printed as it comes (S19.3).
PLAIN_MESSAGE_COMMANDS = {"commitmesg": "commit_message", "clone": "clone_message",
                          "deletemesg": "delete_message", "destroymesg": "destroy_message",
                          "runmesg": "run_message"}


def plain_message_command(cmd: str) -> CommandFunc:
    def run(inv: Invocation) -> int:
        queue, short, _ = msg_ref(inv)
        return print_reply(inv, call_queue(inv, queue, cmd, {"msg_id": short}))

    return run


for _name, _cmd in PLAIN_MESSAGE_COMMANDS.items():
    command(_name, "msg_id")(plain_message_command(_cmd))


# Read commands take --json (issue 16 item 3): one JSON document on stdout, always an
# object naming the message by its full id as given.

@command("state", "msg_id", "json")
def state(inv: Invocation) -> int:
    queue, short, full = msg_ref(inv)
    reply = call_queue(inv, queue, "get_message_state", {"msg_id": short})
    if inv.as_json():
        return print_json(inv, reply, lambda st: {"msg_id": full, "state": st})
    return print_reply(inv, reply)


@command("statusmesg", "msg_id", "json")
def statusmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message_status", lambda st: [f"ok {st.get('status')}"],
                         lambda full, st: {"msg_id": full, **st})


@command("statuscountmesg", "msg_id", "json")
def statuscountmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message", lambda msg: [f"ok {msg.get('count', 0)}"],
                         lambda full, msg: {"msg_id": full, "count": msg.get("count", 0)})


@command("showmesg", "msg_id", "json")
def showmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message", lambda msg: [f"ok {protocol.dumps(msg)}"],
                         lambda full, msg: msg)


def attachment_lines(msg: Mapping[str, Any]) -> list[str]:
    """`ok <N>`, then `<NAME> <MD5> <SIZE> <ABSOLUTE PATH>` sorted by name."""
    attachments = attachment_list(msg)
    return [f"ok {len(attachments)}", *(f"{a['name']} {a['md5']} {a['size']} {a['path']}"
                                        for a in attachments)]


def attachment_list(msg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The message's attachments sorted by name, each `{name, md5, size, path}`."""
    attachments = msg.get("_attachments") or {}
    return [{"name": name, "md5": attachments[name].get("md5"),
             "size": attachments[name].get("size"), "path": attachments[name].get("path")}
            for name in sorted(attachments)]


@command("attachstatusmesg", "msg_id", "json")
def attachstatusmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message", attachment_lines,
                         lambda full, msg: {"msg_id": full, "attachments": attachment_list(msg)})


# ---------------------------------------------------------------- queues, admin, fsck


def queue_status(inv: Invocation, name: str, child: Mapping[str, Any]) -> str:
    """S3.5: the queue's own status while RUNNING, else its supervision state
    (also when its socket does not answer)."""
    state = str(child.get("state"))
    if state != "RUNNING":
        return state
    try:
        reply = client.call_queue(inv.root, name, "status", timeout=STATUS_TIMEOUT)
    except ConnectError:
        return state
    return as_text(reply[0]) if isinstance(reply, list) and reply else state


def queue_counts(inv: Invocation, name: str, child: Mapping[str, Any]) -> Any:
    """S7.3 `num_messages` of a RUNNING queue ({state: count}), else null."""
    if child.get("state") != "RUNNING":
        return None
    try:
        reply = client.call_queue(inv.root, name, "num_messages", timeout=STATUS_TIMEOUT)
    except ConnectError:
        return None
    return reply if isinstance(reply, dict) else None


def queue_record(inv: Invocation, name: str, child: Mapping[str, Any]) -> dict[str, Any]:
    """`rq queues --json`: one queue's status, supervision and message counts."""
    return {"name": name, "status": queue_status(inv, name, child), "state": child.get("state"),
            "pid": child.get("pid"), "restarts": child.get("restarts"),
            "error": child.get("error"), "counts": queue_counts(inv, name, child)}


@command("queues", "json")
def queues(inv: Invocation) -> int:
    reply = call_mgr(inv, "status")
    if not is_ok(reply) or not isinstance(reply[1], dict):
        return print_json(inv, reply, dict) if inv.as_json() else print_reply(inv, reply)
    children = sorted((reply[1].get("queues") or {}).items())
    if inv.as_json():
        inv.say_json([queue_record(inv, name, child) for name, child in children])
        return 0
    for name, child in children:
        inv.say(f"{name} {queue_status(inv, name, child)}")
    return 0


@command("admin", "queue", "op")
def admin(inv: Invocation) -> int:
    name = require(inv, "queue")
    op = require(inv, "op")
    if op not in ADMIN_OPS:
        raise CliError(f"invalid --op {op} (one of: {', '.join(ADMIN_OPS)})")
    return print_reply(inv, call_mgr(inv, ADMIN_OPS[op], name))


@command("fsck")
def fsck(inv: Invocation) -> int:
    from rq import fsck as fsck_mod  # imported lazily: only this command needs it

    return fsck_mod.main(inv.root, inv.out, inv.err)


@command("analytics", "since", "until", "input", "output", "master", "conf", "full")
def analytics(inv: Invocation) -> int:
    """Issue 5: the PySpark job over the event log (docs/analytics.md)."""
    from rq.analytics import job  # imported lazily: pyspark is heavy and needs Java

    return job.main(inv.root, inv.flags, inv.out, inv.err)
