"""What the manager runs (SPEC S2.1, S2.2, S6.2): the supervised daemons' command lines
and environment.

Owns: the kinds of child (a queue process per queue directory, and the singleton services),
the module each kind runs as `python -m MODULE --root ROOT [--name NAME]` (each a program
you can run by hand, STYLE habit 8), the start-up order of the services and the
environment every child gets.  It starts nothing: rq.mgr.supervisor does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rq import proc
from rq.config import MainConfig

# kind -> module run as `python -m MODULE --root ROOT [--name NAME]`.
DAEMON_MODULES: dict[str, str] = {
    "queue": "rq.queue",
    "web": "rq.web",
    "scandir": "rq.scandir",
    "timers": "rq.timers",
}
# Singleton daemons, stopped after the queues (S2.5).  Adding one: its module
# above and its kind here, e.g. "scandir".  The web server is started before
# the queues and waited for (S2.2 step 4); the others after them (step 6).
SERVICES: tuple[str, ...] = ("web", "scandir", "timers")
WEB = "web"
STATUS_SERVICES = ("web", "scandir", "timers")  # keys of the S7.2 status reply

ArgvBuilder = Callable[[str, str], list[str]]


def default_argv(root: str, kind: str, name: str, *, log_stderr: bool = False) -> list[str]:
    """The command line of a supervised daemon (proc.spawn_daemon appends
    `--lifeline-fd F --ready-fd F`).  `log_stderr` (`rq-mgr run`, S1.5): the child
    copies its log to the stderr it inherits from the manager, as the manager does;
    rq.daemon cannot tell by itself, since a child of the manager always has a ready pipe."""
    argv = [*proc.python_argv(DAEMON_MODULES[kind]), "--root", root]
    argv += ["--name", name] if kind == "queue" else []
    return [*argv, "--log-stderr"] if log_stderr else argv


def child_env(base: Mapping[str, str], config: MainConfig) -> dict[str, str]:
    """S6.2: the manager's environment plus RQ_ENV, RQ_ROOT and TMPDIR, less NOTIFY_SOCKET."""
    env = dict(base)
    env.pop("NOTIFY_SOCKET", None)  # systemd's readiness socket is the manager's alone
    env["RQ_ENV"] = config.env
    env["RQ_ROOT"] = config.root
    if config.tmpdir:
        env["TMPDIR"] = config.tmpdir
    return env
