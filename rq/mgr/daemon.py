"""The manager's program edge: `python -m rq.mgr --root ROOT [--foreground]
[--ready-fd F]`, also called in-process by `rq-mgr run`.

Owns: reading the main config (S2.2 step 1), the process title
`[rq-mgr] <root>` (S2.1), logging set-up (S1.5, role `rq-mgr`), the working
directory (the root, S1.2), the children's environment (S6.2), the fs seam
choice (RQ_FS_FAULTS) and the manager's own ready pipe towards `rq-mgr start`:
one line, `ready` or `fatal <the ERROR line to print>`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping

import setproctitle

from rq import fsops
from rq.config import load_main_config
from rq.errors import ConfigError, RQError
from rq.logs import setup_logging
from rq.mgr import pidfile
from rq.mgr.children import Policy
from rq.mgr.programs import ArgvBuilder, child_env, default_argv
from rq.mgr.supervisor import Manager
from rq.proc import ReadyPipe

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rq.mgr")
    parser.add_argument("--root", required=True)
    parser.add_argument("--foreground", action="store_true", help="also log to stderr")
    parser.add_argument("--ready-fd", type=int, default=None)
    args = parser.parse_args(argv)
    return run_daemon(os.path.abspath(args.root), stderr_log=args.foreground,
                      ready_fd=args.ready_fd)


def run_daemon(root: str, *, stderr_log: bool = False, ready_fd: int | None = None,
               argv_for: ArgvBuilder | None = None, policy: Policy | None = None) -> int:
    """Start the manager for `root` and serve until stopped: 0, or 1 after a
    start-up failure (its ERROR line on stderr and on the ready pipe)."""
    ready = ReadyPipe(ready_fd)
    try:
        config = load_main_config(root)
    except ConfigError as exc:
        return startup_failed(f"ERROR: bad config file config/config.json: {exc}", ready)
    try:
        os.chdir(root)
        setup_logging(root, "rq-mgr", stderr=stderr_log)
    except OSError as exc:
        return startup_failed(f"ERROR: cannot open log/queuemgr.log: {exc.strerror}", ready)
    setproctitle.setproctitle(pidfile.title(root))  # before the pid file names us
    if argv_for is None:  # S1.5: under `rq-mgr run` the children's lines reach stderr too
        argv_for = functools.partial(default_argv, root, log_stderr=stderr_log)
    notify = systemd_notifier(os.environ)

    def on_ready() -> None:
        ready.send("ready")
        notify("READY=1\nSTATUS=serving")

    manager = NotifyingManager(root, config, env=child_env(os.environ, config),
                               argv_for=argv_for, policy=policy,
                               fs=fsops.from_environment(os.environ), on_ready=on_ready)
    manager.notify = notify
    try:
        manager.start()
    except RQError as exc:
        log_to_file(logging.ERROR, f"start-up failed: {exc}")
        return startup_failed(str(exc), ready)
    return manager.run()


class NotifyingManager(Manager):
    """The supervisor, telling systemd when its graceful stop begins (STOPPING=1); READY=1
    goes with the ready line (on_ready).  Kept here, at the program edge, so the
    supervisor itself knows nothing of systemd."""

    notify: Callable[[str], None] = staticmethod(lambda state: None)

    def handle_term(self, now: float) -> None:
        if not self.stopping:
            self.notify("STOPPING=1")
        super().handle_term(now)


def systemd_notifier(env: Mapping[str, str]) -> Callable[[str], None]:
    """sd_notify over $NOTIFY_SOCKET when systemd runs us as Type=notify (issue 16 item
    7; config/rq-mgr.service), else a no-op.  sdnotify drops a failed send silently:
    systemd then times the start out, which its log explains."""
    if not env.get("NOTIFY_SOCKET"):
        return lambda state: None
    import sdnotify  # only under systemd

    return sdnotify.SystemdNotifier().notify


def log_to_file(level: int, text: str) -> None:
    """Log to log/queuemgr.log only: `rq-mgr run` prints the exact line itself,
    and S0.3.3 wants one line on stderr, not two."""
    record = log.makeRecord(log.name, level, __file__, 0, text, (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def startup_failed(line: str, ready: ReadyPipe) -> int:
    print(line, file=sys.stderr)
    ready.send(f"fatal {line}")
    return 1
