"""The scandir daemon's loop and IO (SPEC S11).

Owns: reading `scandir/` and the queue directories, the ownership files
`queue/NAME/scandir.json`, the `queue/NAME/form.json` links and the
`config.json` of the queues it owns, and asking the manager (its socket:
`create_queue`, `restart_queue`, `delete_queue`) for everything that starts,
restarts or trashes a queue.  It never changes a queue without scandir.json.
A pass runs when rq.scanloop, its loop, says a scan is due (watchdog events,
SIGHUP, every RESCAN s); rq.scandir.plan decides what a pass does.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from rq import protocol
from rq.client import call_mgr
from rq.config import MainConfig
from rq.errors import ConnectError
from rq.fsops import FsOps
from rq.proc import ReadyPipe
from rq.scandir.plan import Action, Entry, Ownership, config_text, plan, stat_key
from rq.scanloop import RESCAN, ScanLoop

log = logging.getLogger("rq.scandir")

DELETE_REPEAT = 30.0    # ask again to delete a queue still there after this long
MGR_TIMEOUT = 60.0
OWNERSHIP = "scandir.json"


def read_json(path: str) -> tuple[Any, str | None]:
    """(data, None) or (None, error text)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except (OSError, ValueError) as exc:
        return None, str(exc)


def read_entry(scandir: str, name: str) -> Entry | None:
    """S11.1: `scandir/NAME` with a valid name resolving to a directory that
    holds an executable regular file `run`; else None."""
    if not protocol.valid_queue_name(name):
        return None
    link = os.path.realpath(os.path.join(scandir, name))
    run = os.path.join(link, "run")
    if not os.path.isdir(link) or not os.path.isfile(run) or not os.access(run, os.X_OK):
        return None
    config_path = os.path.join(link, "config.json")
    try:
        config_stat: str | None = stat_key(os.stat(config_path))
    except FileNotFoundError:
        config_stat = None
    except OSError as exc:
        return Entry(name, link, os.path.realpath(run), None,
                     config_error=f"cannot read config.json: {exc.strerror or exc}")
    config: Any = None
    error: str | None = None
    if config_stat is not None and not os.path.isfile(config_path):  # a FIFO would block us
        error = "not a regular file"
    elif config_stat is not None:
        config, error = read_json(config_path)
    form = os.path.join(link, "form.json")
    return Entry(name, link, os.path.realpath(run), config_stat, config,
                 None if error is None else f"bad config.json: {error}",
                 os.path.realpath(form) if os.path.isfile(form) else None)


class ScandirDaemon(ScanLoop):
    role = "rq-scandir"

    def __init__(self, config: MainConfig, fs: FsOps, *, lifeline_fd: int | None,
                 ready: ReadyPipe, rescan: float = RESCAN) -> None:
        super().__init__(config, fs, lifeline_fd=lifeline_fd, ready=ready, rescan=rescan)
        self.scandir = os.path.join(self.root, "scandir")
        self.queue_root = os.path.join(self.root, "queue")
        self.reported: dict[str, str] = {}      # name -> last problem logged
        self.deleting: dict[str, float] = {}    # name -> when delete_queue was asked
        self.unwritten: dict[str, Ownership] = {}  # created, scandir.json not written yet

    # ------------------------------------------------------------ one pass (S11.4)

    def scan(self, mono: float) -> None:
        """One pass: plan what scandir/ asks for against queue/, then carry it out."""
        try:
            names = os.listdir(self.scandir)
        except OSError as exc:
            # Without a readable scandir/ we cannot tell a removed entry from
            # an unreadable one: change nothing.
            self.problem("/scandir", f"scandir: cannot read scandir/: {exc.strerror or exc}")
            self.watcher.watch([])
            return
        self.reported.pop("/scandir", None)  # keys with a slash are no queue names
        entries = {e.name: e for e in (read_entry(self.scandir, n) for n in names) if e}
        try:
            self.finish_ownership()
        except OSError as exc:
            self.problem("/ownership", f"scandir: cannot write scandir.json: {exc.strerror or exc}")
        queue_dirs, owned = self.read_queues()
        self.deleting = {n: t for n, t in self.deleting.items() if n in owned}
        self.watcher.watch({self.scandir, *(e.link for e in entries.values())})
        for action in plan(entries, owned, queue_dirs):
            if self.stopping:
                return
            try:
                self.carry_out(action, mono)
            except ConnectError as exc:
                self.problem(action.name, f"scandir: queue {action.name}: rq-mgr did not "
                             f"answer ({exc}); will retry")
            except OSError as exc:
                self.problem(action.name, f"scandir: queue {action.name}: "
                             f"{exc.strerror or exc}; will retry")

    def read_queues(self) -> tuple[set[str], dict[str, Ownership]]:
        queue_dirs, owned = set(), {}
        try:
            names = os.listdir(self.queue_root)
        except OSError:
            names = []
        for name in names:
            qdir = os.path.join(self.queue_root, name)
            if not protocol.valid_queue_name(name) or not os.path.isdir(qdir):
                continue
            queue_dirs.add(name)
            path = os.path.join(qdir, OWNERSHIP)
            if os.path.lexists(path):
                owned[name] = Ownership.from_json(read_json(path)[0])
        return queue_dirs, owned

    def carry_out(self, action: Action, mono: float) -> None:
        name = action.name
        if action.kind != "delete":
            self.deleting.pop(name, None)
        if action.kind == "ignore":
            self.problem(name, f"scandir: queue {name} exists and was not created by "
                         "scandir; ignored")
        elif action.kind == "invalid":
            outcome = "queue not created" if action.ownership is None else "queue left unchanged"
            self.problem(name, f"scandir: queue {name}: invalid config.json: "
                         f"{action.reason}; {outcome}")
        elif action.kind == "create":
            self.create(action)
        elif action.kind == "update":
            self.update(action)
        elif action.kind == "delete":
            self.delete(name, mono)
        else:
            self.reported.pop(name, None)
            self.link_form(name, action.form)

    # ------------------------------------------------------------ actions

    def create(self, action: Action) -> None:
        name = action.name
        assert action.config is not None and action.ownership is not None
        reply = call_mgr(self.root, "create_queue", dict(action.config), timeout=MGR_TIMEOUT)
        if not (isinstance(reply, list) and reply[:1] == ["success"]):
            self.problem(name, f"scandir: queue {name}: create_queue failed: "
                         f"{protocol.dumps(reply)}")
            return
        # Until scandir.json is written the new queue looks hand-made: keep
        # the record until it is on disk, or the queue would be ours no more.
        self.unwritten[name] = action.ownership
        self.finish_ownership()
        self.link_form(name, action.form)
        self.reported.pop(name, None)
        log.info("scandir: queue %s created from %s", name, action.ownership.link)

    def finish_ownership(self) -> None:
        for name, ownership in list(self.unwritten.items()):
            if not os.path.isdir(os.path.join(self.queue_root, name)):
                del self.unwritten[name]  # gone meanwhile
                continue
            self.write_ownership(name, ownership)  # OSError: kept, tried again next pass
            del self.unwritten[name]

    def update(self, action: Action) -> None:
        """Config first, then the ownership record, then the restart: a crash
        in between leaves the record stale, so the next pass does it again."""
        name = action.name
        assert action.config is not None and action.ownership is not None
        qdir = os.path.join(self.queue_root, name)
        self.fs.write_file_atomic(os.path.join(qdir, "config.json"), config_text(action.config))
        self.write_ownership(name, action.ownership)
        self.link_form(name, action.form)
        reply = call_mgr(self.root, "restart_queue", name, raw=True, timeout=MGR_TIMEOUT)
        self.reported.pop(name, None)
        log.info("scandir: queue %s updated from %s, restart: %s", name,
                 action.ownership.link, protocol.dumps(reply))

    def delete(self, name: str, mono: float) -> None:
        asked = self.deleting.get(name)
        if asked is not None and mono - asked < DELETE_REPEAT:
            return  # still stopping; the manager trashes it when it has stopped
        self.deleting[name] = mono
        reply = call_mgr(self.root, "delete_queue", name, raw=True, timeout=MGR_TIMEOUT)
        self.reported.pop(name, None)
        log.info("scandir: queue %s: entry gone, deleting: %s", name, protocol.dumps(reply))

    def write_ownership(self, name: str, ownership: Ownership) -> None:
        data = (json.dumps(ownership.to_json(), indent=2) + "\n").encode()
        self.fs.write_file_atomic(os.path.join(self.queue_root, name, OWNERSHIP), data)

    def link_form(self, name: str, form: str | None) -> None:
        """S11.4: queue/NAME/form.json is a symlink to the entry's form.json by
        its absolute real path; a form.json that is not a symlink is left alone."""
        path = os.path.join(self.queue_root, name, "form.json")
        current = os.readlink(path) if os.path.islink(path) else None
        if form is None:
            if current is not None:
                self.fs.unlink(path)
            return
        if current == form or (current is None and os.path.lexists(path)):
            return
        tmp = os.path.join(self.queue_root, name, f".form.json.tmp{os.getpid()}")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(form, tmp)
        self.fs.rename(tmp, path)  # replaces an old link in one step

    def problem(self, key: str, text: str) -> None:
        """Log a problem once, until it changes or goes away."""
        if self.reported.get(key) != text:
            self.reported[key] = text
            log.warning("%s", text)
