"""The `rq` entry point (S19): usage and help, root discovery (S1.2), the
dispatch to the registered command, and every failure turned into one line on
stderr with an exit code (S0.3.3).

Only the module that registers the command given is imported (rq.cli.base's
COMMAND_MODULES), and the help texts only for `--help` (rq.cli.helptext): a
shell loop of `rq sendmesg` pays for what `sendmesg` uses (issue 15)."""

from __future__ import annotations

import os
import sys

from rq import root as rqroot
from rq.cli.base import (
    HELP_ARGS,
    Invocation,
    check_text,
    load_command,
    one_line,
    parse_flags,
    positional_args,
    silence,
    split_command,
    usage_text,
)
from rq.errors import RootError, RQError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import TextIO

# Commands that also work outside any RQ root (their root is "" then).
ROOTLESS_COMMANDS = frozenset({"completion"})

# ---------------------------------------------------------------- entry point


def dispatch(argv: Sequence[str], env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """S19.2 usage and help first (they need no root), then S1.2, then the command."""
    name, args = split_command(argv)
    if HELP_ARGS.intersection(argv):
        from rq.cli import helptext  # the texts are loaded for help only (issue 16 item 4)

        print(helptext.help_text(name), file=out)
        return 0
    if name is None:
        print(usage_text(), file=err)
        return 1
    cmd = load_command(name)
    if cmd is None:
        print(f"Command not found: {name}", file=err)
        return 1
    flags = parse_flags(args, cmd.accumulating)
    check_text(flags)
    for flag in flags:
        if flag not in cmd.flags:
            print(f"rq: warning: ignoring unknown flag --{flag}", file=err)
    try:
        root, _ = rqroot.find_root("rq", list(argv), env)
    except RootError:
        # --url (issue 16): the command speaks HTTP to a remote RQ and needs no root
        if name not in ROOTLESS_COMMANDS and not ("url" in cmd.flags and "url" in flags):
            raise
        root = ""
    return cmd.run(Invocation(root, flags, out, err, positional_args(args)))


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
    except BrokenPipeError:  # `rq completion bash | head`: the reader is done, say nothing
        silence(out)
        return 0
    except Exception as exc:  # noqa: BLE001 -- S0.3.3: one line, never a traceback
        print(one_line(exc), file=err)
        return 1


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run `rq` on `argv` (default sys.argv[1:]).

    No argument parser runs first: S19.1's rules are not getopt's, so `dispatch`
    reads the raw list itself, and a shell loop of `rq sendmesg` pays only for the
    modules the command uses (issue 15).  rq.cli.app wraps the same `run` as a
    click command for programs that embed it."""
    return run(sys.argv[1:] if argv is None else list(argv), os.environ, sys.stdout, sys.stderr)
