"""Start-up recovery of one queue (S2.7): memory rebuilt from the directory.

Owns what a queue process does once, before it serves: the create journal's
records replayed (rq.queue.journal: messages acknowledged but not yet settled
on disk put back), every message left in
run/ goes back to que/ (its surviving job group stopped first) unless it holds
an unexpired pull lease (S8.3), every que/ message is indexed in scheduling
order, the prep ids and the finished counts are read (STYLE habit 3: the
directory is the truth).  Runs before the socket and the loop start, so it
takes no lock.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from stat import S_ISREG

from rq import proc
from rq.fsops import read_json, unlink_quiet
from rq.queue import journal, snapshot
from rq.queue.index import QueItem, que_item
from rq.queue.leases import Leases
from rq.queue.state import QueueState
from rq.store import Store

log = logging.getLogger(__name__)
RESTARTED = "QUEUE RESTARTED - MOVING TO QUE"


def recover(state: QueueState, leases: Leases) -> None:
    now = time.time()
    store = state.store
    restored = journal.replay(store, state.fs)  # first: the spool is the truth after it
    if restored:
        log.warning("put back %d message(s) from the create journal", restored)
    for msg_id in store.list_flat("run"):
        if not leases.recover(msg_id, store.msg_path("run", msg_id), time.time()):
            requeue_running(state, msg_id)  # an unexpired pull lease stays in run/
    saved = snapshot.load(store)  # after the requeues above: they refuse it (ctime)
    if saved is not None:
        log.info("read %d queued messages from the index of the last stop", len(saved))
    state.index.load_que(que_items(store, now, snapshot.load_checkpoint(store))
                         if saved is None else saved)
    if len(state.index.que) >= snapshot.MIN_ENTRIES:  # the tables it read from are gone
        proc.release_free_memory()
    try:  # a deletion killed between its rename and its rmtree (rq.queue.bulkmove)
        if store.remove_hidden():
            log.info("removed the leftovers of an interrupted deletion")
    except OSError as exc:
        log.warning("cannot remove the leftovers of an interrupted deletion: %s", exc)
    state.index.prep = set(store.list_flat("prep"))
    state.index.counts = state.count_finished()


def que_items(store: Store, now: float,
              checkpoint: tuple[int, dict[str, QueItem]] | None = None) -> list[QueItem]:
    """The index entries of every que/ message, read once at start (a message without a
    usable due gets `now`, written back).  A million queued messages cost a million
    small reads: each is opened relative to que/, a short path lookup (issue 15,
    bench/restart.py).  With the running queue's last `checkpoint` (rq.queue.snapshot),
    a message still in que/ whose msg file is older than the checkpoint keeps its entry
    there: one stat instead of an open, a read and a close."""
    items: list[QueItem] = []
    qdir = store.state_dir("que")
    taken_ns, kept = checkpoint if checkpoint is not None else (0, {})
    before_ns = taken_ns - int(snapshot.TICK * 1e9)  # file times lag the clock by < TICK
    reused = 0
    try:
        dir_fd = os.open(qdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return items  # no que/ yet: nothing queued
    try:
        for msg_id in store.list_flat("que"):
            item = kept.get(msg_id)
            if item is not None:
                try:
                    st = os.stat(msg_id + "/msg", dir_fd=dir_fd, follow_symlinks=False)
                    if st.st_ctime_ns < before_ns and S_ISREG(st.st_mode):
                        items.append(item)
                        reused += 1
                        continue
                except OSError:
                    pass  # read below, which says what is wrong
            try:
                fields = store.read_msg(msg_id, dir_fd)
            except (OSError, ValueError) as exc:
                # S2.7.4.  After the journal's replay only an unacknowledged create cut by
                # a power loss, or damage, is left unreadable here.
                log.warning("skipping unreadable message que/%s: %s", msg_id, exc)
                continue

            due = fields.get("due")
            if not isinstance(due, (int, float)) or isinstance(due, bool):
                fields["due"] = due = int(now)
                store.write_msg(os.path.join(qdir, msg_id), fields)
            try:
                items.append(que_item(msg_id, due, fields))
            except (TypeError, ValueError, OverflowError):
                log.warning("skipping message que/%s: unusable due %r", msg_id, due)
    finally:
        os.close(dir_fd)
    if checkpoint is not None:
        log.info("que/ indexed: %d of %d entries from the running queue's last checkpoint, "
                 "the others read", reused, len(items))
    return items


def requeue_running(state: QueueState, msg_id: str) -> None:
    """run → que for a message whose job did not outlive its queue process."""
    store = state.store
    path = store.msg_path("run", msg_id)
    info = read_json(os.path.join(path, "proc.json"))
    pid = info.get("pid") if isinstance(info, dict) else None
    if isinstance(pid, int) and proc.alive_with_start(pid, info.get("start_time")):
        log.warning("run/%s: job pid %d survived; stopping it", msg_id, pid)
        stop_group_now(pid, state.cfg.kill_grace)
    elif not isinstance(info, dict):  # killed between the spawn and proc.json: look for it
        leader = proc.find_job_leader(os.path.join(path, "job"))
        if leader is not None:
            log.warning("run/%s: job pid %d survived (no proc.json); stopping it",
                        msg_id, leader)
            stop_group_now(leader, state.cfg.kill_grace)
    for leftover in ("pid", "proc.json"):
        unlink_quiet(os.path.join(path, leftover))
    try:
        store.write_status(path, RESTARTED)
        store.move(msg_id, "run", "que")
    except OSError as exc:
        log.error("cannot recover run/%s: %s", msg_id, exc)
        return
    fields = read_json(os.path.join(store.msg_path("que", msg_id), "msg")) or {}
    started = info.get("started") if isinstance(info, dict) else None
    duration = (max(0.0, time.time() - started)
                if isinstance(started, (int, float)) and not isinstance(started, bool)
                else None)
    state.events.log(msg_id, "run", "que", status=RESTARTED, count=fields.get("count"),
                     pid=pid if isinstance(pid, int) else None,   # S13.3: out of run
                     duration=duration)


def stop_group_now(pgid: int, grace: float) -> None:
    """SIGTERM a survivor's group, wait up to `grace`, then SIGKILL (S2.7)."""
    proc.signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.signal_group(pgid, signal.SIGKILL)
