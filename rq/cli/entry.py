"""The `rq` entry point (S19): usage and help, root discovery (S1.2), the
dispatch to the registered command, and every failure turned into one line on
stderr with an exit code (S0.3.3)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from rq import config
from rq.cli import messages, pull  # noqa: F401 -- importing them registers their commands
from rq.cli.base import (
    COMMANDS,
    HELP_ARGS,
    Invocation,
    check_text,
    one_line,
    parse_flags,
    split_command,
    usage_text,
)
from rq.errors import RQError

# ---------------------------------------------------------------- entry point


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
    check_text(flags)
    for flag in flags:
        if flag not in cmd.flags:
            print(f"rq: warning: ignoring unknown flag --{flag}", file=err)
    root, _ = config.find_root("rq", list(argv), env)
    return cmd.run(Invocation(root, flags, out, err))


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


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run `rq` on `argv` (default sys.argv[1:]).

    No argument parser runs first: S19.1's rules are not getopt's, so `dispatch`
    reads the raw list itself, and a shell loop of `rq sendmesg` pays only for the
    modules the command uses (issue 15).  rq.cli.app wraps the same `run` as a
    click command for programs that embed it."""
    return run(sys.argv[1:] if argv is None else list(argv), os.environ, sys.stdout, sys.stderr)
