"""The program edge every supervised daemon shares (SPEC S2.1, S2.3; STYLE habit 8).

Owns: what `python -m rq.queue`, `rq.timers`, `rq.scandir` and `web` do before their own
loop runs, in one order: the command line (`--root`, `--lifeline-fd`, `--ready-fd` and the
daemon's own options), making the inherited pipe fds ours (non-inheritable), the working
directory (the root, S1.2), logging (log/queuemgr.log under the daemon's role, and stderr
when no manager runs it), the process title (S2.1), the main config, and the two ways a
start can fail: `StartError` is a reason no retry can fix (`fatal REASON` on the ready pipe,
exit 2: FATAL at the manager, S2.3); any other exception is a crash (logged, exit 1: BACKOFF).

Each daemon describes itself with a `DaemonSpec` in its `__main__` and calls `run_daemon`;
this module knows none of them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import setproctitle

from rq.config import MainConfig, load_main_config
from rq.errors import ConfigError, StartError
from rq.logs import setup_logging
from rq.proc import ReadyPipe


@dataclass(frozen=True)
class Context:
    """What a daemon's `serve` gets from the edge: config is read once, here (STYLE 12)."""
    root: str
    args: argparse.Namespace
    config: MainConfig
    env: Mapping[str, str]
    ready: ReadyPipe
    lifeline_fd: int | None


@dataclass(frozen=True)
class DaemonSpec:
    """One daemon's program edge.  In `role`, `title` and `crash_text`, `{name}` and the
    other options are filled in from the command line (`{role}` too, in crash_text)."""
    prog: str                      # argparse's prog, shown in usage errors
    logger: str                    # the daemon's logger; also the stderr prefix of fatal lines
    role: str                      # the log role (S1.5), e.g. "rq-timers"
    title: str                     # the process title (S2.1), e.g. "[rq-timers]"
    serve: Callable[[Context], int]
    options: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # (flag, add_argument kwargs)
    fatal_text: str = "{reason}"   # after `fatal ` on the ready pipe (web: "ERROR: {reason}")
    stderr_text: str = "{logger}: {line}"  # the fatal line on stderr when run by hand
    crash_text: str = "{role} crashed"

    def parse(self, argv: list[str] | None) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog=self.prog)
        parser.add_argument("--root", required=True)
        for flag, kwargs in self.options:
            parser.add_argument(flag, **kwargs)
        parser.add_argument("--lifeline-fd", type=int)
        parser.add_argument("--ready-fd", type=int)
        # `rq-mgr run` asks its children to copy their log to stderr too (S1.5, issue 16):
        # run by hand (no ready pipe) a daemon does so anyway.
        parser.add_argument("--log-stderr", action="store_true")
        return parser.parse_args(argv)


def run_daemon(spec: DaemonSpec, argv: list[str] | None = None,
               args: argparse.Namespace | None = None) -> int:
    """Start the daemon `spec` describes and serve until it stops; its exit code.  `args`:
    `argv` parsed already (by the queue fork server without argparse: issue 17)."""
    args = spec.parse(argv) if args is None else args
    log = logging.getLogger(spec.logger)
    fields = vars(args)
    role = spec.role.format(**fields)
    root = os.path.abspath(args.root)
    for fd in (args.lifeline_fd, args.ready_fd):  # passed to us inheritable; keep them ours
        if fd is not None:
            os.set_inheritable(fd, False)
    ready = ReadyPipe(args.ready_fd)
    try:
        os.chdir(root)
        setup_logging(root, role, stderr=args.ready_fd is None or args.log_stderr)
    except OSError as exc:
        return report_fatal(spec, ready, log,
                            f"cannot open log/queuemgr.log: {exc.strerror or exc}")
    setproctitle.setproctitle(spec.title.format(**fields))
    try:
        config = read_main_config(root)
        return spec.serve(Context(root, args, config, os.environ, ready, args.lifeline_fd))
    except StartError as exc:
        return report_fatal(spec, ready, log, str(exc))
    except Exception:  # a crash is a BACKOFF at the manager (S2.3)
        log.exception(spec.crash_text.format(role=role, **fields))
        return 1


def read_main_config(root: str) -> MainConfig:
    try:
        return load_main_config(root)
    except ConfigError as exc:
        raise StartError(f"bad config file config/config.json: {exc}") from exc


def report_fatal(spec: DaemonSpec, ready: ReadyPipe, log: logging.Logger, reason: str) -> int:
    """A start-up error that retrying cannot fix: FATAL at the manager (S2.3)."""
    log.error("cannot start: %s", reason)
    line = spec.fatal_text.format(reason=reason)
    if ready.fd is None:
        print(spec.stderr_text.format(logger=spec.logger, line=line), file=sys.stderr)
    ready.send(f"fatal {line}")
    return StartError.exit_code
