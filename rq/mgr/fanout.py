"""Fan-out: one message to every queue whose topic matches a pattern, all or nothing
(issue 18 item 2: seed 004's message to all queues, seed 002's wildcards, seed 000's
write-ahead journal; docs/guide/fanout.md).

Owns the manager command `create_message {…, "dest": PATTERN}` (S7.2, new), the journal
`ROOT/fanout/ID.json` (one small file per fan-out in flight) and its completion at
start-up.  The copies are made by the target queues themselves over their sockets
(rq.queue.fanoutprep): this module never touches a queue directory.

A fan-out, for a pattern (S8.1, S8.7) matching the topics of queues T1..Tn (sorted by
name; the builtin queues of S3.8 are never targets):
1. choose one short id (S4.1, with an N far above the queues' own counters) shared by
   every copy; write and fsync the journal `{"id", "phase": "prep", "queues", "msg"}`;
2. `fanout_prep` in every Ti at once (their fsyncs overlap): the copy is durable in
   Ti's prep/, which no scheduler or consumer looks at;
3. rewrite the journal with `"phase": "commit"` (fsynced): from here on the fan-out
   happens;
4. `fanout_commit` in every Ti at once (prep → que, fsynced by the queue before its ok);
5. remove the journal (unlink, fsync of `fanout/`), then `["ok", [FULL_ID, …]]`.
A refusal in step 2 (a queue DOWN, not running, an S4.4 failure) aborts the copies
made so far (`fanout_abort`) and answers `["fail", "queue Ti: <reason>"]`.  A crash
at any step leaves the journal: at start-up (and whenever a fan-out could not finish)
a background thread finishes it, retrying until every target queue answers: phase
`prep` → every copy aborted (none was ever committed), phase `commit` → every copy
committed.  So after recovery either every target holds its copy or none does, and
an `ok` is never sent before every copy is durable in que/.

`kill_at` is a test seam (RQ_FANOUT_KILL in the manager's environment): the name of
the step after which the manager SIGKILLs itself (`journal`, `prep-N` after the Nth
answer, `commit-phase`, `commit-N`, `done`; `abort-N` after a refusal).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any

from rq import client, protocol
from rq.config import load_queue_config
from rq.errors import ConfigError, ConnectError, Fail, NoReply
from rq.fsops import FsOps, remove_stale_temps
from rq.install import BUILTIN_QUEUES
from rq.message import normalize_input
from rq.store import new_msg_id
from rq.topics import matches, pattern_problem

log = logging.getLogger(__name__)

JOURNAL_DIR = "fanout"
CALL_TIMEOUT = 30.0       # one queue request
COMMIT_WAIT = 30.0        # a commit phase retried this long before the reply says so
ABORT_WAIT = 5.0          # the copies of a refused fan-out: then the recovery thread's
RETRY_PAUSE = 0.25        # seconds between passes over queues that did not answer
RECOVER_PAUSE = 1.0       # the recovery thread's pause while journals remain
POOL_THREADS = 16         # queue requests in flight at once, over all fan-outs
N_LOW, N_HIGH = 10**12, 10**13  # a copy's N (S4.1): never one of a queue's own counters
MISSING_DEST = 'input missing required "dest" parameter'
NO_MATCH = "no queue matches pattern: "
Reply = list[Any]


def is_ok(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) >= 2 and reply[0] == "ok"


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def reason(reply: Any) -> str:
    if isinstance(reply, list) and len(reply) >= 2 and reply[0] == "fail":
        return str(reply[1])
    return "no answer" if reply is None else protocol.dumps(reply)


class Fanout:
    def __init__(self, root: str, fs: FsOps, kill_at: str | None = None) -> None:
        self.root = root
        self.fs = fs
        self.kill_at = kill_at
        self.dir = os.path.join(root, JOURNAL_DIR)
        self._live: set[str] = set()      # ids of fan-outs this process is running
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(POOL_THREADS, "rq-fanout")

    # ------------------------------------------------------------ the command
    def create(self, arg: str | None) -> Reply:
        data = protocol.parse_json_arg(arg or "null")  # bad JSON: ["fail","bad request"]
        dest = data.get("dest") if isinstance(data, dict) else None
        if dest is None or dest == "":
            raise Fail(MISSING_DEST)
        problem = pattern_problem(dest)
        if problem:
            raise Fail(problem)
        normalize_input(data, time.time())  # the S4.4 failures, before any queue is asked
        targets = self.matching_queues(dest)
        if not targets:
            raise Fail(f"{NO_MATCH}{dest}")
        fid = new_msg_id(time.time(), random.randrange(N_LOW, N_HIGH))
        with self._lock:
            self._live.add(fid)
        try:
            return self.run(fid, targets, data)
        finally:
            with self._lock:
                self._live.discard(fid)

    def run(self, fid: str, targets: list[str], msg: dict[str, Any]) -> Reply:
        journal = {"id": fid, "phase": "prep", "queues": targets, "msg": msg,
                   "started": time.time()}
        try:
            self.write(journal)              # durable before the first copy
        except OSError as exc:
            raise Fail(f"fan-out journal not written: {exc.strerror or exc}") from exc
        self.step("journal")
        replies = self.each(targets, lambda name: self.call(
            name, "fanout_prep", {"msg_id": fid, "msg": msg}), "prep")
        refused = [name for name in targets if not is_ok(replies[name])]
        if refused:
            name = refused[0]
            log.info("fan-out %s refused by queue %s: %s", fid, name, reason(replies[name]))
            # A queue's own refusal made no copy; without a reply, one may exist.
            touched = [n for n in targets if replies[n] is None or is_ok(replies[n])]
            if not self.finish(journal, ABORT_WAIT, live=True, queues=touched):
                self._wake.set()             # the recovery thread aborts the rest
            return ["fail", f"queue {name}: {reason(replies[name])}"]
        try:
            self.write({**journal, "phase": "commit"})  # from here on, the fan-out happens
        except OSError as exc:
            return self.undo(journal, f"fan-out journal not written: {exc.strerror or exc}")
        journal["phase"] = "commit"
        self.step("commit-phase")
        if not self.finish(journal, COMMIT_WAIT, live=True):
            self._wake.set()
            return ["fail", f"fan-out {fid} not yet committed in every queue (a queue does "
                            "not answer); rq-mgr commits it when the queue is back"]
        self.step("done")
        return ["ok", [str(replies[name][1]) for name in targets]]

    def undo(self, journal: dict[str, Any], why: str) -> Reply:
        """The commit decision could not be written: the journal on disk may say either
        phase, so it is written again as `prep` before any copy is aborted.  When even
        that fails, the recovery thread finishes it as the file on disk says."""
        try:
            self.write(journal)
        except OSError:
            self._wake.set()
            return ["fail", f"{why}; fan-out {journal['id']} is finished by rq-mgr as its "
                            "journal says (all copies or none)"]
        if not self.finish(journal, ABORT_WAIT, live=True):
            self._wake.set()
        return ["fail", why]

    def each(self, names: list[str], ask: Callable[[str], Any],
             step: str | None = None) -> dict[str, Any]:
        """`ask(name)` for every queue at once (each queue fsyncs its own directories:
        the waits overlap); name -> result.  `step`: a kill point after each answer."""
        if len(names) == 1:
            futures = {names[0]: _done(ask(names[0]))}
        else:
            futures = {name: self._pool.submit(ask, name) for name in names}
        for n, _ in enumerate(as_completed(futures.values()), 1):
            if step is not None:
                self.step(f"{step}-{n}")
        return {name: f.result() for name, f in futures.items()}

    # ------------------------------------------------------------ finishing a journal
    def finish(self, journal: dict[str, Any], wait: float = 0.0, *, live: bool = False,
               queues: list[str] | None = None) -> bool:
        """Abort (phase prep) or commit (phase commit) every copy (in `queues`, by
        default every target), passing over the queues that do not answer until `wait`
        seconds are up; then remove the journal.  True when it is done.  `live`: a
        fan-out of this process (its steps are kill points)."""
        cmd = "fanout_commit" if journal["phase"] == "commit" else "fanout_abort"
        pending = list(journal["queues"] if queues is None else queues)
        deadline = time.monotonic() + wait
        verb = "commit" if cmd == "fanout_commit" else "abort"
        while pending:
            settled = self.each(pending, lambda name: self.settle(journal["id"], name, cmd),
                                verb if live else None)
            pending = [name for name in pending if not settled[name]]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(RETRY_PAUSE)
        if pending:
            return False
        try:
            self.fs.unlink(self.path(journal["id"]))
            self.fs.fsync_dir(self.dir)      # gone for good before the reply
        except FileNotFoundError:
            pass
        except OSError as exc:  # every copy is finished: the recovery thread removes it later
            log.warning("fan-out %s: journal not removed: %s", journal["id"], exc)
            self._wake.set()
        return True

    def settle(self, fid: str, name: str, cmd: str) -> bool:
        """One copy committed or aborted (or gone with its queue)?"""
        if not os.path.isfile(os.path.join(self.root, "queue", name, "config.json")):
            log.warning("fan-out %s: queue %s no longer exists", fid, name)
            return True
        reply = self.call(name, cmd, {"msg_id": fid})
        if isinstance(reply, list) and reply[:1] == ["ok"]:
            return True
        if reply in (["fail", "cannot find message"], ["fail", "msg not in prep"]):
            # removed (cmd commit) or committed (cmd abort) by hand meanwhile: nothing to do
            log.warning("fan-out %s: queue %s: %s", fid, name, reason(reply))
            return True
        return False

    # ------------------------------------------------------------ recovery
    def start(self) -> None:
        """Finish the journals a previous manager left, in the background: the queues
        answer only once this manager has started them."""
        threading.Thread(target=self._recover_loop, name="rq-fanout", daemon=True).start()

    def _recover_loop(self) -> None:
        remove_stale_temps(self.dir)  # a crashed manager's half-written journals, once
        while True:
            try:
                left = self.recover_once()
            except Exception:  # a bug: logged, tried again later
                log.exception("fan-out recovery failed")
                left = 1
            self._wake.wait(RECOVER_PAUSE if left else None)
            self._wake.clear()

    def recover_once(self) -> int:
        """One pass over the journals no running fan-out owns; how many remain."""
        left = 0
        for fid in self.journal_ids():
            with self._lock:
                if fid in self._live:
                    continue
            try:
                with open(self.path(fid), encoding="utf-8") as f:
                    journal = json.load(f)
            except FileNotFoundError:
                continue
            if self.finish(journal):
                verb = "committed" if journal["phase"] == "commit" else "rolled back"
                log.info("fan-out %s %s in %s", fid, verb, ", ".join(journal["queues"]))
            else:
                left += 1
        return left

    def journal_ids(self) -> list[str]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))

    # ------------------------------------------------------------ helpers
    def matching_queues(self, pattern: str) -> list[str]:
        """Queues (not builtin, S3.8) whose topic (S8.1, default the name) matches."""
        try:
            names = sorted(os.listdir(os.path.join(self.root, "queue")))
        except OSError:
            return []
        out = []
        for name in names:
            if not protocol.valid_queue_name(name) or name in BUILTIN_QUEUES:
                continue
            try:
                cfg, _ = load_queue_config(self.root, name)
            except (ConfigError, OSError):
                continue
            if matches(pattern, cfg.topic):
                out.append(name)
        return out

    def path(self, fid: str) -> str:
        return os.path.join(self.dir, f"{fid}.json")

    def write(self, journal: dict[str, Any]) -> None:
        """The journal, durable (data, name and `fanout/` itself) on return."""
        if not os.path.isdir(self.dir):
            os.makedirs(self.dir, exist_ok=True)
            self.fs.fsync_dir(self.root)
        data = json.dumps(journal, ensure_ascii=False).encode()
        self.fs.write_file_atomic(self.path(journal["id"]), data)

    def call(self, name: str, cmd: str, arg: Any) -> Any:
        """The queue's reply; a refusal when the request could not be sent; None
        when it was sent but no reply came (it may have been acted on)."""
        try:
            return client.call_queue(self.root, name, cmd, arg, timeout=CALL_TIMEOUT)
        except NoReply:
            return None
        except ConnectError:
            return ["fail", "cannot connect (is the queue running?)"]

    def step(self, name: str) -> None:
        if self.kill_at == name:  # the test seam: a crash right after this step
            os.kill(os.getpid(), signal.SIGKILL)
