"""The `rq` command's core (SPEC S19): what every command module shares.

Owns: the S19.1 argument rules (which are not getopt's, so we parse the raw
argument list ourselves), the S19.2 usage texts, the command registry that
the command modules fill (`@command`), and the helpers that turn a reply into
the S19.3 output.  Commands never touch the spool themselves: every change
goes through the owning daemon's socket (rq.client).
"""

from __future__ import annotations

import os
from rq import client, protocol
from rq.errors import ConnectError, ProtocolError, RQError
from rq.record import Record

# Issue 15: a shell loop of `rq sendmesg` pays for every module `rq` imports, so this one (on
# every command's path) imports neither typing nor dataclasses: the records below are
# rq.record's Records, frozen all the same, without collections' import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, TextIO

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


# Which module of rq.cli registers each command: `rq NAME` imports that one only (issue 15),
# and the plain S19.2 list needs no import at all.  A new command is added here too
# (tests/test_cli_help.py checks this table, the registry and rq.cli.helptext agree).
COMMAND_MODULES = {
    **dict.fromkeys(("sendmesg", "prepmesg", "single_que", "attachmesg", "commitmesg",
                     "statusmesg", "state", "statuscountmesg", "attachstatusmesg", "clone",
                     "showmesg", "deletemesg", "destroymesg", "runmesg", "queues", "admin",
                     "fsck", "analytics"), "messages"),
    **dict.fromkeys(("reserve", "report", "renew", "watch", "cursors", "deletecursor"), "pull"),
    **dict.fromkeys(("createqueue", "configqueue", "deletequeue"), "queueadmin"),
    "wait": "produce",
    **dict.fromkeys(("requeue", "purge"), "bulk"),
    **dict.fromkeys(("push", "pop"), "shell"),  # issue 18
    "completion": "completion",
}


class CliError(RQError):
    """A local S19.3 error: printed as `rq: <text>` on stderr, exit 1."""


class Invocation(Record):
    """Everything a command needs: the root (S1.2), its flags and the streams, and
    the arguments that are neither flags nor their values (`rq push QUEUE`)."""

    __slots__ = ("root", "flags", "out", "err", "args")
    defaults = ((),)
    root: str
    flags: Flags
    out: TextIO
    err: TextIO
    args: tuple[str, ...]

    def say(self, text: str) -> None:
        print(text, file=self.out)

    def as_json(self) -> bool:
        """Issue 16 item 3: `--json` asks a read command for one JSON document on stdout."""
        return "json" in self.flags

    def say_json(self, value: Any) -> None:
        print(protocol.dumps(value), file=self.out)


if TYPE_CHECKING:
    CommandFunc = Callable[[Invocation], int]


class Command(Record):
    """A registered command: its name, its function, the flags it knows and those
    of them that accumulate (wait's --msg_id) besides ACCUMULATING_FLAGS."""

    __slots__ = ("name", "run", "flags", "accumulating")
    defaults = (frozenset(),)
    name: str
    run: CommandFunc
    flags: frozenset[str]
    accumulating: frozenset[str]


COMMANDS: dict[str, Command] = {}


def command(name: str, *flags: str,
            accumulating: tuple[str, ...] = ()) -> Callable[[CommandFunc], CommandFunc]:
    """Register `func` as `rq NAME`, knowing `flags` (others draw a warning; `--help`
    is known to every command); `accumulating` flags keep every value (a list)."""

    def register(func: CommandFunc) -> CommandFunc:
        COMMANDS[name] = Command(name, func, frozenset(flags), frozenset(accumulating))
        return func

    return register


def load_command(name: str) -> Command | None:
    """The registered command `name`, importing only the module that registers it."""
    module = COMMAND_MODULES.get(name)
    if module is None:
        return None
    __import__(f"rq.cli.{module}")
    return COMMANDS.get(name)


# ---------------------------------------------------------------- S19.1 / S19.2 parsing


def split_command(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(command, the arguments after it) with `--root PATH`/`--root=PATH`
    taken out wherever they are (S1.2 rule 1); the root itself is found by
    rq.root.find_root."""
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--root":
            next(args, None)
        elif not arg.startswith("--root="):
            rest.append(arg)
    return (rest[0], rest[1:]) if rest else (None, [])


def parse_flags(args: Sequence[str], accumulating: frozenset[str] = frozenset()) -> Flags:
    """S19.1: `--k=v`; `--k v` when v exists and does not start with `--`;
    else `--k` is true.  Other arguments are ignored; the last value wins,
    except for `--pattern` (and a command's own `accumulating`), which accumulate."""
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
        if name in ACCUMULATING_FLAGS or name in accumulating:
            prior = flags.get(name)
            flags[name] = [*(prior if isinstance(prior, list) else []), val]
        else:
            flags[name] = val
    return flags


def positional_args(args: Sequence[str]) -> tuple[str, ...]:
    """The arguments parse_flags ignores (S19.1 "other arguments"), in order:
    `rq push QUEUE`, `rq pop QUEUE` (issue 18) read them."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            out.append(arg)
        elif "=" not in arg and i < len(args) and not args[i].startswith("--"):
            i += 1
    return tuple(out)


def check_text(flags: Flags) -> None:
    """S0.3.4: text is UTF-8.  An argument whose bytes are not (Python keeps
    them as lone surrogates) is refused with one line, before any request
    (issue 13, D10: it used to end in the codec's own error text)."""
    for name, value in flags.items():
        for text in (name, *(value if isinstance(value, list) else [value])):
            if isinstance(text, str) and not _is_utf8(text):
                shown = name.encode("utf-8", "replace").decode()
                raise CliError(f"--{shown} is not valid UTF-8 text")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def usage_text() -> str:
    """S19.2: `Valid commands are:` and the sorted names, two-space indented."""
    return "\n".join(["Valid commands are:", *(f"  {name}" for name in sorted(COMMAND_MODULES))])


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


def call_queue(inv: Invocation, name: str, cmd: str, arg: Any = None,
               timeout: float | None = 60.0) -> Any:
    check_queue(inv.root, name)
    try:
        return client.call_queue(inv.root, name, cmd, arg, timeout=timeout)
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


def print_message(inv: Invocation, cmd: str, render: Callable[[dict[str, Any]], list[str]],
                  shape: Callable[[str, dict[str, Any]], Any] | None = None) -> int:
    """Ask the message's queue with `cmd` and print `render(reply[1])` on
    success, or the failure reply as it is; with `--json`, `shape(full id, reply[1])`."""
    queue, short, full = msg_ref(inv)
    reply = call_queue(inv, queue, cmd, {"msg_id": short})
    if shape is not None and inv.as_json():
        return print_json(inv, reply, lambda value: shape(full, value))
    if not is_ok(reply) or not isinstance(reply[1], dict):
        return print_reply(inv, reply)
    for line in render(reply[1]):
        inv.say(line)
    return 0


def print_json(inv: Invocation, reply: Any, shape: Callable[[Any], Any]) -> int:
    """Issue 16 item 3: an `ok` reply as one JSON document, `shape(reply[1])`, on stdout;
    anything else is an error: one line on stderr (`rq: <reason>`), exit 1, stdout empty."""
    if not is_ok(reply):
        raise CliError(failure_text(reply))
    inv.say_json(shape(reply[1]))
    return 0


def failure_text(reply: Any) -> str:
    """The reason of a `["fail", reason]` reply; any other reply as compact JSON."""
    if isinstance(reply, list) and len(reply) >= 2 and isinstance(reply[1], str):
        return reply[1]
    return protocol.dumps(reply)


def one_line(exc: BaseException) -> str:
    """`rq: <error>` on one line; RootError texts already carry `rq: `."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if text.startswith("rq: ") else f"rq: {text}"


def silence(out: TextIO) -> None:
    """Point a closed pipe's descriptor at /dev/null, so the flush at exit
    does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
