"""Power loss, kept as a test (issue 13, part 2; S0.3, S2.7, S4.1, S13).

One real run is recorded: rq-mgr with rq-web and four queues, every daemon started with
RQ_FS_RECORD so each spool operation is appended to one operation log (rq/fsrecord.py) as
it takes effect.  Clients create messages over the queue socket and over HTTP
(`POST /q/NAME/new_message`) and log `ack QUEUE ID` right after each `ok`; the queue script
finishes them done, asks a resend first, fails them to err, or dups them to another queue
(S6.4, S6.5, logging the copy's id as an ack once the dup is answered); a coalescing queue
finishes dups with their parent (S5.3), and a cron entry fires (S9.3).

tests/crashstates.py then builds the disk after a power loss at many log positions, under
a model that also drops every write no fsync had made durable yet (names, contents, and any
subset or reordering of them).  Each state is checked (`check_state`), then recovered as a
queue process recovers at start (S2.7, in-process) and checked again; a sample is restarted
with real queue processes until every acknowledged message has finished.  The checks:

* every message acknowledged before the crash point exists, in exactly one state, and not
  in prep (`rq fsck` finds no problem: notes about an unacknowledged prep/ are allowed);
* the event log reads: every complete line decodes (S13.4 allows a torn tail, which a
  queue reopening the file moves to a sidecar: issue 18 item 4);
* the cron entry never fired twice for one slot (S9.3);
* after a real restart every acknowledged message ends done, or err when the workload
  asked for err.

Scale knobs: RQ_POWER_MESSAGES (socket creates, default 40; HTTP adds half as many),
RQ_POWER_STATES (crash states checked, default 520), RQ_POWER_RESTARTS (states restarted
with real queue processes, default 6), RQ_POWER_SEED.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from crashstates import MODES, Recording
from rqtest import QueueProc, free_port, make_queue, make_root, short_id, wait_for, write_script
from webtest import EnvMgr

from rq import client
from rq.config import load_main_config, load_queue_config
from rq.events import decode_line
from rq.fsck import check_root
from rq.fsops import FsOps
from rq.fsrecord import OpLog
from rq.queue.leases import Leases
from rq.queue.recovery import recover
from rq.queue.state import QueueState

pytestmark = pytest.mark.timeout(900)

MESSAGES = int(os.environ.get("RQ_POWER_MESSAGES", "40"))
STATES = int(os.environ.get("RQ_POWER_STATES", "520"))
RESTARTS = int(os.environ.get("RQ_POWER_RESTARTS", "6"))
SEED = int(os.environ.get("RQ_POWER_SEED", "20261213"))
QUEUES = ("work", "copies", "coal", "cron")
KINDS = ("done", "resend", "err", "dup")

SCRIPT = r"""#!/bin/sh
# The power-loss workload's queue script: RQ_PARAM1 says what to do.
case "$RQ_PARAM1" in
resend)
    if [ "$RQ_COUNT" = 0 ]; then echo "resend 0-once more" >&3; exit 0; fi ;;
err)
    echo "err asked to fail" >&3; exit 0 ;;
dup)
    [ "$RQ_DEST_QUEUE" = copies ] && { echo "done a copy" >&3; exit 0; }  # a copy keeps param1
    echo "dup 0-X-copies" >&3
    read -r reply <&4
    case "$reply" in
    "ok "*)
        if [ -n "$POWER_TEST_ACKS" ]; then
            printf '{"op":"ack","pid":%s,"queue":"copies","id":"%s","kind":"copy"}\n' \
                $$ "${reply##*/}" >> "$POWER_TEST_ACKS"
        fi ;;
    *) echo "err dup refused: $reply" >&3; exit 0 ;;
    esac ;;
slow*)
    sleep 0.15 ;;
esac
echo "done ok" >&3
"""


# ---------------------------------------------------------------- the recorded run
def build(base: Path) -> Path:
    root = make_root(base, port=free_port())
    script = write_script(base / "power.sh", SCRIPT)
    make_queue(root, "work", script=script, num_workers=3)
    make_queue(root, "copies", script=script, num_workers=2)
    make_queue(root, "coal", script=script, num_workers=1, coalesce_params=[1])
    make_queue(root, "cron", script=script, schedule=[{"cron": "* * * * *", "id": "minute"}])
    return root


class Clients:
    """Socket and HTTP creates; an ack line in the operation log after every ok."""

    def __init__(self, root: Path, log: str) -> None:
        self.root, self.log = root, OpLog(log)
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.acked = 0

    def ack(self, queue: str, full_id: str, kind: str) -> None:
        with self.lock:
            self.log.add("ack", queue=queue, id=short_id(full_id), kind=kind)
            self.acked += 1

    def by_socket(self, rng: random.Random) -> None:
        for i in range(MESSAGES):
            queue, kind = ("coal", f"slow{i % 3}") if i % 4 == 3 else ("work", rng.choice(KINDS))
            reply = client.call_queue(str(self.root), queue, "create_message",
                                      {"dest": queue, "param1": kind}, timeout=30)
            self.check(reply, queue, kind)

    def by_http(self, rng: random.Random) -> None:
        url = f"http://127.0.0.1:{load_main_config(str(self.root)).port}/q/work/new_message"
        for _ in range(MESSAGES // 2):
            kind = rng.choice(KINDS)
            reply = requests.post(url, json={"dest": "work", "param1": kind}, timeout=30).json()
            self.check(reply, "work", kind)

    def check(self, reply: Any, queue: str, kind: str) -> None:
        if isinstance(reply, list) and reply[:1] == ["ok"]:
            self.ack(queue, reply[1], kind)
        else:
            self.errors.append(f"{queue} {kind}: {reply}")


def wait_web(root: Path) -> None:
    url = f"http://127.0.0.1:{load_main_config(str(root)).port}/q/work.json"

    def up() -> bool:
        try:
            return requests.get(url, timeout=2).status_code == 200
        except requests.RequestException:
            return False
    wait_for(up, 30, interval=0.1, what="rq-web")


def finished(root: Path, acks: list[dict[str, Any]]) -> bool:
    states = check_root(str(root)).states
    return all(states.get(a["queue"], {}).get(a["id"]) in ("done", "err") for a in acks)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    base = tmp_path_factory.mktemp("power")
    root = build(base)
    snapshot = base / "snapshot"
    shutil.copytree(root, snapshot, symlinks=True)
    log = str(base / "ops.log")
    mgr = EnvMgr(root, {"RQ_FS_RECORD": log, "POWER_TEST_ACKS": log})
    try:
        wait_web(root)
        clients = Clients(root, log)
        rng = random.Random(SEED)
        threads = [threading.Thread(target=fn, args=(random.Random(rng.random()),))
                   for fn in (clients.by_socket, clients.by_http)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not clients.errors, clients.errors[:5]

        def settled() -> bool:
            acks = Recording(str(snapshot), str(root), log).acks
            cron = check_root(str(root)).states.get("cron", {})
            return bool(cron) and finished(root, [a for _, a in acks])
        wait_for(settled, 90, interval=0.5, what="every acknowledged message to finish")
    finally:
        mgr.stop()
    rec = Recording(str(snapshot), str(root), log)
    rec.real_root = str(root)  # type: ignore[attr-defined]
    return rec


# ---------------------------------------------------------------- checks of one state
def check_state(root: str, acks: list[dict[str, Any]], *, recovered: bool) -> list[str]:
    report = check_root(root)
    problems = list(report.problems)
    for ack in acks:
        state = report.states.get(ack["queue"], {}).get(ack["id"])
        if state is None or state == "prep" or (recovered and state == "run"):
            problems.append(f"acknowledged {ack['queue']}/{ack['id']} ({ack['kind']}) "
                            f"is {state or 'missing'}")
    # a queue that reopened a file moved its torn tail to a sidecar (S13.4, issue 18 item 4):
    # no undecodable line is left inside a file, before or after recovery
    problems += cron_twice(root) + event_log_problems(root, torn_lines=0)
    return problems


def cron_twice(root: str) -> list[str]:
    slots: dict[Any, list[str]] = {}
    for msg_id, state in check_root(root).states.get("cron", {}).items():
        path = Path(root, "queue", "cron", state)
        found = next(path.rglob(msg_id), None) if state in ("done", "relayed") else path / msg_id
        try:
            fields = json.loads(((found or path) / "msg").read_bytes())
        except (OSError, ValueError):
            continue
        if fields.get("src") == "cron":
            slots.setdefault(fields.get("due"), []).append(msg_id)
    return [f"cron fired twice for slot {due}: {ids}" for due, ids in slots.items()
            if len(ids) > 1]


def event_log_problems(root: str, *, torn_lines: int) -> list[str]:
    """Every complete line decodes, but `torn_lines` per file; a last line without its
    newline is a torn tail and allowed (S13.4)."""
    out = []
    for path in Path(root, "log", "events").rglob("*.jsonl"):
        lines = path.read_bytes().split(b"\n")[:-1]
        bad = [line for line in lines if decode_line(line + b"\n") is None]
        if len(bad) > torn_lines:
            out.append(f"{path.name}: {len(bad)} undecodable line(s), e.g. {bad[0][:60]!r}")
    return out


def recover_in_process(root: str) -> None:
    """What each queue process does at start before serving (S2.7)."""
    main = load_main_config(root)
    for name in QUEUES:
        cfg, _ = load_queue_config(root, name)
        state = QueueState(main, cfg, FsOps(), lambda: None)
        recover(state, Leases(state))
        state.events.close()


def restart_and_finish(root: Path, acks: list[dict[str, Any]]) -> list[str]:
    """Real queue processes on the state until every acknowledged message finished."""
    procs = []
    try:
        for name in ("copies", "coal", "cron", "work"):  # a dup's target first (S6.5)
            procs.append(QueueProc(root, name))
        wait_for(lambda: finished(root, acks), 60, interval=0.2,
                 what="every acknowledged message to finish after the restart")
    finally:
        for proc in procs:
            proc.stop()
    states = check_root(str(root)).states
    wrong = [f"{a['queue']}/{a['id']} ({a['kind']}) ended {states[a['queue']][a['id']]}"
             for a in acks if (states[a["queue"]][a["id"]] == "err") != (a["kind"] == "err")]
    return wrong + check_root(str(root)).problems + event_log_problems(str(root), torn_lines=0)


# ---------------------------------------------------------------- the tests
def test_the_log_replays_to_the_real_run(recording: Recording) -> None:
    """The recorder missed nothing: replaying the whole log onto the snapshot gives the
    messages of the real root, each in the same state."""
    assert not recording.gaps, recording.gaps[:5]
    kinds = {a["kind"] for _, a in recording.acks}
    assert {"done", "resend", "err", "dup", "copy"} <= kinds or MESSAGES < 20, kinds
    target = Path(recording.root).parent / "replayed"
    recording.build(len(recording.records), "all", random.Random(0), str(target))
    real = check_root(recording.real_root).states  # type: ignore[attr-defined]
    assert check_root(str(target)).states == real
    assert real["cron"], "the cron entry fired"


def test_power_loss_states(recording: Recording, tmp_path: Path) -> None:
    """STATES crash states: each checked, recovered in-process and checked again; a
    sample restarted with real queue processes until every acked message finished."""
    rng = random.Random(SEED)
    points = recording.crash_points()
    plan = [(rng.choice(points), MODES[i % len(MODES)]) for i in range(STATES)]
    restart = set(rng.sample(range(STATES), min(RESTARTS, STATES)))
    failures: list[str] = []
    started = time.monotonic()
    shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else tmp_path
    work = Path(shm, f"rq-power-{os.getpid()}")
    work.mkdir()
    try:
        for n, (k, mode) in enumerate(plan):
            target = work / f"s{n}"
            acks = recording.build(k, mode, random.Random(rng.random()), str(target))
            where = f"state {n} (crash at log line {k}, {mode})"
            failures += [f"{where}: {p}" for p in check_state(str(target), acks,
                                                               recovered=False)]
            recover_in_process(str(target))
            failures += [f"{where}, recovered: {p}"
                         for p in check_state(str(target), acks, recovered=True)]
            if n in restart:
                failures += [f"{where}, restarted: {p}"
                             for p in restart_and_finish(target, acks)]
            shutil.rmtree(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"\npower loss: {STATES} crash states built and checked ({len(restart)} restarted) "
          f"from {len(recording.records)} log lines, {len(recording.acks)} acks "
          f"{dict(Counter(a['kind'] for _, a in recording.acks))}, in {elapsed:.1f} s")
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} failures)"
