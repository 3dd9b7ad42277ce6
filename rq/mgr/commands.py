"""Manager socket commands (SPEC S7.2, S3.5 flags, S3.7 create/delete/restart).

Owns: one thin handler per command, run in the socket server's threads.
Anything that reads or changes the supervised children goes through
`Manager.call_in_loop`, so the children table is only ever touched by the
manager's loop thread.  Files that no process owns (admin flag files, a queue
directory being built) are handled here directly.

`reserve`, `report` and `renew` (S8.4) are handled by rq.mgr.consumer, `create_message`
(a fan-out to every queue whose topic matches `dest`, issue 18 item 2) by rq.mgr.fanout.
`subscribe` and `unsubscribe` hand the connection to rq.mgr.substream (S8.8).  A bad frame
or a non-JSON ARG never reaches this module: the Rq1Server answers `["fail","bad request"]` (S7.1).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol

import rq
from rq import protocol
from rq.client import call_queue, queue_socket_problem
from rq.config import MainConfig, QueueConfig, validate_queue_config
from rq.errors import ConfigError, ConnectError
from rq.fsops import FsOps
from rq.mgr import queuedirs, timercmds
from rq.mgr.consumer import Consumers
from rq.mgr.cursors import cursor_commands
from rq.mgr.events_hub import EventHub
from rq.mgr.fanout import Fanout
from rq.mgr.substream import serve_subscription

log = logging.getLogger(__name__)

NUDGE_TIMEOUT = 0.5
# S3.5: command -> (verb in the failure text, flag file suffix, create the flag?)
FLAG_COMMANDS = {
    "up_queue": ("up", "down", False),
    "down_queue": ("down", "down", True),
    "pause_queue": ("pause", "pause", True),
    "resume_queue": ("resume", "pause", False),
}
Reply = list[Any]


class Supervisor(Protocol):
    """What the commands need of rq.mgr.supervisor.Manager, which imports this module
    (so this one does not import it).  `queue_names` … `start_new_queue` touch the
    children table: the commands call them through `call_in_loop` only."""
    root: str
    config: MainConfig
    fs: FsOps
    events_hub: EventHub
    env: dict[str, str]  # the manager's environment (rq.mgr.daemon), as its children get it

    def call_in_loop(self, func: Callable[..., Any], *args: Any) -> Any: ...
    def uptime(self) -> int: ...
    def has_config(self, name: str) -> bool: ...
    def queue_names(self) -> list[str]: ...
    def status(self) -> dict[str, Any]: ...
    def reload_now(self) -> None: ...
    def restart_queue(self, name: str) -> bool: ...
    def delete_queue(self, name: str) -> bool: ...
    def queue_is_running(self, name: str) -> bool: ...
    def start_new_queue(self, name: str) -> None: ...


def config_text(config: QueueConfig) -> bytes:
    """The S3.3 normalised config as written to `queue/NAME/config.json`."""
    return (json.dumps(config.normalised(), indent=2, ensure_ascii=False) + "\n").encode()


class Commands:
    def __init__(self, manager: Supervisor) -> None:
        self.mgr = manager
        self.root = manager.root
        self.queue_root = os.path.join(manager.root, "queue")
        self.fs = manager.fs
        self.consumers = Consumers(manager.root)
        # Built once, by Manager.start (S2.2): the fan-outs a crash left are finished from
        # now on, in the background.  RQ_FANOUT_KILL: rq.mgr.fanout's test seam.
        self.fanout = Fanout(manager.root, manager.fs, manager.env.get("RQ_FANOUT_KILL"))
        self.fanout.start()
        self.table: dict[str, Callable[[str | None], Reply]] = {
            "ping": lambda arg: ["pong"],
            "environment": lambda arg: [self.mgr.config.env],
            "version": lambda arg: [rq.__version__],
            "uptime": lambda arg: [self.mgr.uptime()],
            "queues": lambda arg: self.mgr.call_in_loop(self.mgr.queue_names),
            "status": lambda arg: ["ok", self.mgr.call_in_loop(self.mgr.status)],
            "reload": self.reload,
            "restart_queue": self.restart_queue,
            "delete_queue": self.delete_queue,
            "create_queue": self.create_queue,
            "create_queue_link": self.create_queue_link,
            "update_queue": self.update_queue,
            # S10.8: live from the timers daemon (rq.mgr.timercmds forwards).
            "timers": lambda arg: timercmds.timers(self.root),
            "timers_status": lambda arg: timercmds.timers_status(self.root),
            # S8.2-S8.4: pull consumers (rq.mgr.consumer asks the queues).
            "reserve": self.consumers.reserve,
            "report": self.consumers.report,
            "renew": self.consumers.renew,
            # issue 18 item 2: one copy in every queue whose topic matches `dest`
            "create_message": self.fanout.create,
        }
        # issue 18 item 3: named cursors (rq.mgr.cursors)
        self.table.update(cursor_commands(manager.events_hub.cursors))
        for cmd, (verb, suffix, create) in FLAG_COMMANDS.items():
            self.table[cmd] = self._flag_handler(verb, suffix, create)
        # S8.8: these keep the connection (rq.mgr.substream streams on it).
        self.streams = frozenset({"subscribe", "unsubscribe"})

    def handle(self, cmd: str, arg: str | None, conn: socket.socket) -> Any:
        if cmd in self.streams:
            return serve_subscription(self.mgr.events_hub, cmd, arg, conn)
        handler = self.table.get(cmd)
        if handler is None:
            return ["error"]
        return handler(arg)

    # ------------------------------------------------------------ supervision

    def reload(self, arg: str | None) -> Reply:
        self.mgr.call_in_loop(self.mgr.reload_now)
        return ["ok"]

    def restart_queue(self, name: str | None) -> Reply:
        if not protocol.valid_queue_name(name):
            return ["fail", "invalid queue name"]
        if not self.mgr.call_in_loop(self.mgr.restart_queue, name):
            return ["fail", "invalid queue name"]
        return ["ok", name]

    def delete_queue(self, name: str | None) -> Reply:
        if not protocol.valid_queue_name(name):
            return ["fail", "no such queue"]
        if not self.mgr.call_in_loop(self.mgr.delete_queue, name):
            return ["fail", "no such queue"]
        return ["ok", "started deleting queue"]

    # ------------------------------------------------------------ admin flags (S3.5)

    def _flag_handler(self, verb: str, suffix: str,
                      create: bool) -> Callable[[str | None], Reply]:
        def handler(name: str | None) -> Reply:
            if not protocol.valid_queue_name(name) or not self.mgr.has_config(str(name)):
                return ["fail", "invalid queue name"]
            path = os.path.join(self.root, "config", f"{name}.{suffix}")
            try:
                if create:
                    self.fs.write_file_atomic(path, b"")
                elif os.path.lexists(path):
                    self.fs.unlink(path)
            except OSError as exc:
                log.warning("cannot %s queue %s: %s", verb, name, exc)
                return ["fail", f"not allowed to {verb}"]
            self.nudge(str(name))
            return ["ok", name]

        return handler

    def nudge(self, name: str) -> None:
        """Any request makes a queue run a scheduler pass (S2.6), so the new
        flag takes effect now rather than within 5 s.  Best effort."""
        try:
            call_queue(self.root, name, "ping", timeout=NUDGE_TIMEOUT)
        except ConnectError:
            pass

    # ------------------------------------------------------------ create (S3.7)

    def create_queue(self, arg: str | None) -> Reply:
        data = protocol.parse_json_arg(arg)  # invalid JSON -> ["fail","bad request"]
        try:
            config, _ = validate_queue_config(data)
        except ConfigError as exc:
            return ["fail", str(exc)]
        text = config_text(config)

        def write_config(qdir: str) -> None:
            self.fs.write_file_atomic(os.path.join(qdir, "config.json"), text)

        return self.publish_queue(config, write_config)

    def update_queue(self, arg: str | None) -> Reply:
        """(new, issue 16 item 5: `rq configqueue`) ARG: the whole new config of an existing
        queue.  Validated as at create (S3.4), written over `queue/NAME/config.json` (a
        temporary file, fsync, rename: readers see the old or the new file), then a reload
        (S2.4: SIGHUP, the queue re-reads it, S3.6).  A config.json that is a link
        (`create_queue_link`) is not replaced: its file is the user's own."""
        data = protocol.parse_json_arg(arg)
        try:
            config, _ = validate_queue_config(data)
        except ConfigError as exc:
            return ["fail", str(exc)]
        name = config.name
        if not self.mgr.has_config(name):
            return ["fail", "no such queue"]
        path = os.path.join(self.queue_root, name, "config.json")
        if os.path.islink(path):
            return ["fail", f"the config of queue {name} is a link to "
                            f"{os.path.realpath(path)}: change that file, then reload"]
        try:
            self.fs.write_file_atomic(path, config_text(config))
        except OSError as exc:
            log.error("queue %s: config not changed: %s", name, exc)
            return ["fail", "queue config not changed"]
        log.info("queue %s: config changed", name)
        self.mgr.call_in_loop(self.mgr.reload_now)
        return ["ok", name]

    def create_queue_link(self, arg: str | None) -> Reply:
        given = arg or ""
        path = os.path.join(self.root, given)  # an absolute `given` wins in join
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as exc:
            return ["fail", f"could not read queue config [ {given} ]: {exc.strerror or exc}"]
        except ValueError as exc:
            return ["fail", f"could not read queue config [ {given} ]: {exc}"]
        try:
            config, _ = validate_queue_config(data)
        except ConfigError as exc:
            return ["fail", str(exc)]
        if self.mgr.call_in_loop(self.mgr.queue_is_running, config.name):
            return ["fail", "queue is already running"]
        real = os.path.realpath(path)

        def link_config(qdir: str) -> None:
            os.symlink(real, os.path.join(qdir, "config.json"))

        return self.publish_queue(config, link_config)

    def publish_queue(self, config: QueueConfig, write_config: Callable[[str], None]) -> Reply:
        """Build the queue directory under a private (invalid, so never
        loaded) name, then publish it with one rename that refuses to clobber."""
        name = config.name
        qdir = os.path.join(self.queue_root, name)
        if os.path.lexists(qdir):
            return ["fail", "already created"]
        problem = queue_socket_problem(self.root, name)
        if problem:
            return ["fail", problem]
        tmp = os.path.join(self.queue_root, f".{name}.new.{os.getpid()}.{threading.get_ident()}")
        try:
            os.makedirs(self.queue_root, exist_ok=True)
            self.fs.mkdir(tmp)
            for state in queuedirs.STATE_DIRS:
                self.fs.mkdir(os.path.join(tmp, state))
            write_config(tmp)
            self.fs.fsync_dir(tmp)
            self.fs.rename_noreplace(tmp, qdir)
            self.fs.fsync_dir(self.queue_root)
        except FileExistsError:
            self._discard(tmp)
            return ["fail", "already created"]
        except OSError as exc:
            log.error("queue %s not created: %s", name, exc)
            self._discard(tmp)
            return ["fail", "queue not created"]
        log.info("queue %s created", name)
        self.mgr.call_in_loop(self.mgr.start_new_queue, name)
        return ["success", "queue created - awesome"]

    def _discard(self, tmp: str) -> None:
        try:
            self.fs.rmtree(tmp)
        except OSError:
            pass
