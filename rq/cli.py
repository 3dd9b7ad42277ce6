"""The `rq` command (SPEC S19), including `rq fsck`.

Owns: the S19.1 argument rules (which are not getopt's, so we parse the raw
argument list ourselves), the S19.2 usage texts, and one small function per
command that turns flags into one request to a queue or the manager and the
reply into the S19.3 output.  It never touches the spool itself: every change
goes through the owning daemon's socket (rq.client), and the only files it
looks at are `queue/NAME/config.json` (to say "queue not found") and, for
`attachmesg`, the file to attach (the S4.8 checks done locally first).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import click

from rq import client, config, protocol
from rq.errors import ConfigError, ConnectError, Fail, ProtocolError, RQError

FlagValue = str | bool | list[str | bool]
Flags = dict[str, FlagValue]

# Flags passed through to create_message / prep_message / single_que; the
# queue normalises them (S4.4), so they travel as the strings (or `true`) given.
MESSAGE_FLAGS = ("dest", "src", "count", "max_count", "param1", "param2", "param3",
                 "param4", "due", "force_remote", "post_run_webhook")
# S19.1: `--pattern` does not keep its last value; nor do `rq analytics`'s `--input`/`--conf`
# (issue 5: one or more event-log trees, any number of Spark settings).
ACCUMULATING_FLAGS = frozenset({"pattern", "input", "conf"})
HELP_ARGS = frozenset({"-h", "--help"})
ADMIN_OPS = {"pause": "pause_queue", "resume": "resume_queue", "down": "down_queue",
             "up": "up_queue", "restart": "restart_queue"}
STATUS_TIMEOUT = 5.0  # `rq queues` asks each queue; a wedged one must not hang the listing


class CliError(RQError):
    """A local S19.3 error: printed as `rq: <text>` on stderr, exit 1."""


@dataclass(frozen=True)
class Invocation:
    """Everything a command needs: the root (S1.2), its flags and the streams."""

    root: str
    flags: Flags
    out: TextIO
    err: TextIO

    def say(self, text: str) -> None:
        print(text, file=self.out)


CommandFunc = Callable[[Invocation], int]


@dataclass(frozen=True)
class Command:
    name: str
    run: CommandFunc
    flags: frozenset[str]


COMMANDS: dict[str, Command] = {}


def command(name: str, *flags: str) -> Callable[[CommandFunc], CommandFunc]:
    """Register `func` as `rq NAME`, knowing `flags` (others draw a warning)."""

    def register(func: CommandFunc) -> CommandFunc:
        COMMANDS[name] = Command(name, func, frozenset(flags))
        return func

    return register


# ---------------------------------------------------------------- S19.1 / S19.2 parsing


def split_command(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(command, the arguments after it) with `--root PATH`/`--root=PATH`
    taken out wherever they are (S1.2 rule 1); the root itself is found by
    config.find_root."""
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--root":
            next(args, None)
        elif not arg.startswith("--root="):
            rest.append(arg)
    return (rest[0], rest[1:]) if rest else (None, [])


def parse_flags(args: Sequence[str]) -> Flags:
    """S19.1: `--k=v`; `--k v` when v exists and does not start with `--`;
    else `--k` is true.  Other arguments are ignored; the last value wins,
    except for `--pattern`, which accumulates."""
    flags: Flags = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        val: str | bool = value if eq else True
        if not eq and i < len(args) and not args[i].startswith("--"):
            val = args[i]
            i += 1
        if name in ACCUMULATING_FLAGS:
            prior = flags.get(name)
            flags[name] = [*(prior if isinstance(prior, list) else []), val]
        else:
            flags[name] = val
    return flags


def usage_text() -> str:
    """S19.2: `Valid commands are:` and the sorted names, two-space indented."""
    return "\n".join(["Valid commands are:", *(f"  {name}" for name in sorted(COMMANDS))])


# ---------------------------------------------------------------- helpers for commands


def require(inv: Invocation, flag: str) -> str:
    """The value of a required flag; bare (`true`) or empty counts as missing."""
    value = inv.flags.get(flag)
    if not isinstance(value, str) or not value:
        raise CliError(f"missing required argument --{flag}")
    return value


def optional(inv: Invocation, flag: str) -> str | None:
    value = inv.flags.get(flag)
    return value if isinstance(value, str) and value else None


def msg_ref(inv: Invocation) -> tuple[str, str, str]:
    """(queue, short id, full id as given) from `--msg_id`: the CLI needs a
    full id (S4.2), since only that names the queue; host and prefix are
    ignored, so the local queue of that name is used."""
    ref = require(inv, "msg_id")
    try:
        queue, short = protocol.parse_msg_ref(ref)
    except ProtocolError as exc:
        raise CliError(str(exc)) from None
    if queue is None:
        raise CliError(f"invalid msg_id: {ref}")
    return queue, short, ref


def check_queue(root: str, name: str) -> None:
    """S19.3 `queue not found` when there is no queue/NAME/config.json (an
    invalid name never reaches the filesystem, so `..` cannot escape queue/)."""
    if not protocol.valid_queue_name(name) or not os.path.exists(
            os.path.join(root, "queue", name, "config.json")):
        raise CliError(f"queue not found: {name}")


def call_queue(inv: Invocation, name: str, cmd: str, arg: Any = None) -> Any:
    check_queue(inv.root, name)
    try:
        return client.call_queue(inv.root, name, cmd, arg)
    except ConnectError:
        raise CliError(f"cannot connect to queue {name} (is rq-mgr running?)") from None


def call_mgr(inv: Invocation, cmd: str, arg: str | None = None) -> Any:
    try:
        return client.call_mgr(inv.root, cmd, arg, raw=True)
    except ConnectError:
        raise CliError("cannot connect to rq-mgr (is it running?)") from None


def is_ok(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok"


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else protocol.dumps(value)


def print_reply(inv: Invocation, reply: Any) -> int:
    """S19.3: `<reply[0]> <reply[1]>`, exit 0 iff `ok`; a reply that is not a
    non-empty list is printed as JSON, exit 1."""
    if not isinstance(reply, list) or not reply:
        inv.say(protocol.dumps(reply))
        return 1
    inv.say(" ".join(as_text(part) for part in reply[:2]))
    return 0 if reply[0] == "ok" else 1


def print_message(inv: Invocation, cmd: str,
                  render: Callable[[dict[str, Any]], list[str]]) -> int:
    """Ask the message's queue with `cmd` and print `render(reply[1])` on
    success, or the failure reply as it is."""
    queue, short, _ = msg_ref(inv)
    reply = call_queue(inv, queue, cmd, {"msg_id": short})
    if not is_ok(reply) or not isinstance(reply[1], dict):
        return print_reply(inv, reply)
    for line in render(reply[1]):
        inv.say(line)
    return 0


# ---------------------------------------------------------------- sending messages

SEND_FLAGS = (*MESSAGE_FLAGS, "relay-ok")


def send_target(inv: Invocation, dest: str, cmd: str) -> str:
    """The queue that stores the message (S19 table, S4.3)."""
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
    return print_reply(inv, call_queue(inv, send_target(inv, dest, cmd), cmd, fields))


@command("sendmesg", *SEND_FLAGS)
def sendmesg(inv: Invocation) -> int:
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
PLAIN_MESSAGE_COMMANDS = {"commitmesg": "commit_message", "state": "get_message_state",
                          "clone": "clone_message", "deletemesg": "delete_message",
                          "destroymesg": "destroy_message", "runmesg": "run_message"}


def plain_message_command(cmd: str) -> CommandFunc:
    def run(inv: Invocation) -> int:
        queue, short, _ = msg_ref(inv)
        return print_reply(inv, call_queue(inv, queue, cmd, {"msg_id": short}))

    return run


for _name, _cmd in PLAIN_MESSAGE_COMMANDS.items():
    command(_name, "msg_id")(plain_message_command(_cmd))


@command("statusmesg", "msg_id")
def statusmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message_status", lambda st: [f"ok {st.get('status')}"])


@command("statuscountmesg", "msg_id")
def statuscountmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message", lambda msg: [f"ok {msg.get('count', 0)}"])


@command("showmesg", "msg_id")
def showmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message", lambda msg: [f"ok {protocol.dumps(msg)}"])


def attachment_lines(msg: Mapping[str, Any]) -> list[str]:
    """`ok <N>`, then `<NAME> <MD5> <SIZE> <ABSOLUTE PATH>` sorted by name."""
    attachments = msg.get("_attachments") or {}
    lines = [f"ok {len(attachments)}"]
    for name in sorted(attachments):
        info = attachments[name]
        lines.append(f"{name} {info.get('md5')} {info.get('size')} {info.get('path')}")
    return lines


@command("attachstatusmesg", "msg_id")
def attachstatusmesg(inv: Invocation) -> int:
    return print_message(inv, "get_message", attachment_lines)


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


@command("queues")
def queues(inv: Invocation) -> int:
    reply = call_mgr(inv, "status")
    if not is_ok(reply) or not isinstance(reply[1], dict):
        return print_reply(inv, reply)
    for name, child in sorted((reply[1].get("queues") or {}).items()):
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


@command("analytics", "since", "until", "input", "output", "master", "conf")
def analytics(inv: Invocation) -> int:
    """Issue 5: the PySpark job over the event log (docs/analytics.md)."""
    from rq.analytics import job  # imported lazily: pyspark is heavy and needs Java

    return job.main(inv.root, inv.flags, inv.out)


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


@command("reserve", "pattern", "lease", "wait", "consumer")
def reserve(inv: Invocation) -> int:
    """S8.2: `ok <compact JSON of RES>` or `ok null`."""
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
    return print_reply(inv, call_mgr_json(inv, "reserve", arg, wait + RESERVE_SLACK))


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


@command("watch", "pattern", "since", "json")
def watch(inv: Invocation) -> int:
    """S8.8: one line (or the JSON) per event until interrupted; exit 0 on SIGINT."""
    patterns, since = watch_patterns(inv), watch_since(inv)
    as_json = "json" in inv.flags
    try:
        try:
            sub = client.subscribe(inv.root, patterns, since)
        except Fail as exc:
            return print_reply(inv, ["fail", str(exc)])
        except ConnectError:
            raise CliError("cannot connect to rq-mgr (is it running?)") from None
        with sub:
            while True:
                try:
                    event = sub.next()
                except ConnectError:
                    raise CliError("lost the connection to rq-mgr") from None
                if not isinstance(event, dict):
                    continue
                if event.get("event") == "overflow" and not as_json:
                    print(f"rq: warning: {event.get('dropped')} events dropped "
                          "(this watcher fell behind)", file=inv.err, flush=True)
                    continue
                print(protocol.dumps(event) if as_json else watch_line(event),
                      file=inv.out, flush=True)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `rq watch | head`: the reader is done
        silence(inv.out)
        return 0


def silence(out: TextIO) -> None:
    """Point a closed pipe's descriptor at /dev/null, so the flush at exit
    does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


# ---------------------------------------------------------------- entry point


def one_line(exc: BaseException) -> str:
    """`rq: <error>` on one line; RootError texts already carry `rq: `."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if text.startswith("rq: ") else f"rq: {text}"


def dispatch(argv: Sequence[str], env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """S19.2 usage and help first (they need no root), then S1.2, then the command."""
    if HELP_ARGS.intersection(argv):
        print(usage_text(), file=out)
        return 0
    name, args = split_command(argv)
    if name is None:
        print(usage_text(), file=err)
        return 1
    cmd = COMMANDS.get(name)
    if cmd is None:
        print(f"Command not found: {name}", file=err)
        return 1
    flags = parse_flags(args)
    for flag in flags:
        if flag not in cmd.flags:
            print(f"rq: warning: ignoring unknown flag --{flag}", file=err)
    root, _ = config.find_root("rq", list(argv), env)
    return cmd.run(Invocation(root, flags, out, err))


class RawArgsCommand(click.Command):
    """A click command that keeps its arguments untouched: S19.1 is not getopt
    (click would eat a bare `--` and answer `-h` itself)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.obj = list(args)
        return []


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """`dispatch`, with every failure turned into one line on `err` (S0.3.3)."""
    try:
        return dispatch(argv, env, out, err)
    except RQError as exc:  # CliError, RootError, ConfigError, UsageError ...
        print(one_line(exc), file=err)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rq: interrupted", file=err)
        return 130
    except Exception as exc:  # noqa: BLE001 -- S0.3.3: one line, never a traceback
        print(one_line(exc), file=err)
        return 1


@click.command(cls=RawArgsCommand, add_help_option=False)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """The `rq` command; see `rq --help`."""
    ctx.exit(run(ctx.obj, os.environ, sys.stdout, sys.stderr))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run `rq` on `argv` (default sys.argv[1:])."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        # standalone_mode=False: click hands back ctx.exit's code instead of
        # calling sys.exit, so main() can be called from tests.
        return int(cli.main(args=args, prog_name="rq", standalone_mode=False))
    except Exception as exc:  # noqa: BLE001 -- a failure inside click: still one line
        print(one_line(exc), file=sys.stderr)
        return 1
