"""Power loss, kept as a test (issue 13, part 2; S0.3, S2.7, S4.1, S9.3, S12.1, S13).

One real run of two hosts is recorded: rq-mgr with rq-web on each, the `local` root with
four queues and the builtin `relay`, the `remote` root with the queue `test` the relay
delivers to.  Every daemon is started with RQ_FS_RECORD, so each spool operation of either
host is appended to one operation log (rq/fsrecord.py) as it takes effect; the relay job's
own durable file (job/relay_id, S12.1) is recorded at the OS seam by a wrapper (RELAY).
Clients create messages over the queue socket and over HTTP (`POST /q/NAME/new_message`)
and for the remote host through the relay queue, and log `ack QUEUE ID` right after each
`ok`; the queue script finishes them done, asks a resend first, fails them to err, or dups
them to another queue (S6.4, S6.5, logging the copy's id as an ack once the dup is
answered); a coalescing queue finishes dups with their parent (S5.3), a cron entry fires
(S9.3), and the relay preps, commits and marks `relayed` (S12.1's two-phase commit).

tests/crashstates.py then builds the disk of both hosts after a power loss at many log
positions, under a model that also drops every write no fsync had made durable yet (names,
contents, and any subset or reordering of them).  Each state is checked (`check_hosts`),
then recovered as a queue process recovers at start (S2.7, in-process) and checked again; a
sample is restarted with real daemons until every acknowledged message has finished.  The
checks:

* every message acknowledged before the crash point exists, in exactly one state, and not
  in prep (`rq fsck` finds no problem on either host: notes about an unacknowledged prep/
  are allowed);
* the event log reads: every complete line decodes (S13.4 allows a torn tail, which a
  queue reopening the file moves to a sidecar: issue 18 item 4);
* the cron entry never fired twice for one slot (S9.3);
* across the hosts (`relay_problems`): a message the sender holds as `relayed` has its copy
  committed at the remote, never two copies, and a message the remote committed that is
  still pending at the sender keeps the job/relay_id naming that copy (else its retry would
  prep a second one: run twice);
* after a real restart every acknowledged message ends done, or err when the workload
  asked for err, relay ones `relayed` with their remote copy done.

Scale knobs: RQ_POWER_MESSAGES (socket creates, default 40; HTTP adds half as many, the
relay a quarter), RQ_POWER_STATES (crash states checked, default 520), RQ_POWER_RESTARTS
(states restarted with real daemons, default 3), RQ_POWER_SEED.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from crashstates import MODES, Recording
from rqtest import (QueueProc, free_port, make_queue, make_root, short_id, wait_for,
                    write_script)
from webtest import EnvMgr, install_builtin

from rq import client
from rq.config import load_main_config, load_queue_config
from rq.events import decode_line
from rq.fsck import Report, check_root
from rq.fsops import FsOps
from rq.fsrecord import OpLog
from rq.queue import journal
from rq.queue.leases import Leases
from rq.queue.recovery import recover
from rq.queue.state import QueueState

pytestmark = pytest.mark.timeout(900)

MESSAGES = int(os.environ.get("RQ_POWER_MESSAGES", "40"))
STATES = int(os.environ.get("RQ_POWER_STATES", "520"))
RESTARTS = int(os.environ.get("RQ_POWER_RESTARTS", "3"))
SEED = int(os.environ.get("RQ_POWER_SEED", "20261213"))
QUEUES = ("work", "copies", "coal", "cron", "relay")
KINDS = ("done", "resend", "err", "dup")
NO_PROXY = {k: None for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy",
                              "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy")}

# The relay builtin (S12.1) as the relay queue's script, with its own file operations (the
# durable job/relay_id that guards against a second remote copy after a crash) recorded in
# the operation log as the daemons' are: the job does them itself, outside rq/fsops.py, so
# they are recorded at the OS seam (os.fsync, os.rename, os.unlink), a file's content when
# it is fsynced.  Jobs get no RQ_* variable of their daemon (S6.2): hence POWER_TEST_OPLOG.
RELAY = r"""
import os, sys
from rq.builtin import relay
from rq.fsrecord import OpLog

if os.environ.get("POWER_TEST_OPLOG"):  # not in a restarted state
    log = OpLog(os.environ["POWER_TEST_OPLOG"])
    mine = os.path.dirname(os.path.abspath(os.environ.get("RQ_MSG_DIR") or os.getcwd()))
    real_fsync, real_rename, real_unlink = os.fsync, os.rename, os.unlink

    def fsync(fd):
        real_fsync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not path.startswith(mine):
            return
        if os.path.isdir(path):
            log.add("fsyncdir", path=path)
        else:
            with open(path, "rb") as f:
                log.add("write", path=path, data=f.read())
            log.add("fsync", path=path)

    def rename(src, dst):
        real_rename(src, dst)
        if os.path.abspath(dst).startswith(mine):
            log.add("rename", src=os.path.abspath(src), dst=os.path.abspath(dst))

    def unlink(path):
        real_unlink(path)
        if os.path.abspath(path).startswith(mine):
            log.add("unlink", path=os.path.abspath(path))

    os.fsync, os.rename, os.unlink = fsync, rename, unlink
sys.exit(relay.main())
"""


REMOTE_SCRIPT = '#!/bin/sh\nsleep 0.2\necho "done relayed here" >&3\n'
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
def build(base: Path) -> tuple[Path, Path]:
    """Two hosts under base/hosts (the recorded tree): `local` with the workload's queues
    and the builtin relay, `remote` with the queue `test` the relay delivers to."""
    script = write_script(base / "power.sh", SCRIPT)
    root = make_root(base / "hosts" / "local", port=free_port())
    make_queue(root, "work", script=script, num_workers=3)
    make_queue(root, "copies", script=script, num_workers=2)
    make_queue(root, "coal", script=script, num_workers=1, coalesce_params=[1])
    make_queue(root, "cron", script=script, schedule=[{"cron": "* * * * *", "id": "minute"}])
    install_builtin(root, "relay", num_workers=2, script=str(base / "relay.py"))
    (base / "relay.py").write_text(RELAY)
    remote = make_root(base / "hosts" / "remote", port=free_port())
    # one slow worker: relayed copies wait in the remote's que/, where a commit acknowledged
    # before its fsync would be lost (with an instant job the move to run/ hid it)
    make_queue(remote, "test", script=write_script(base / "remote.sh", REMOTE_SCRIPT),
               num_workers=1)
    return root, remote


class Clients:
    """Socket and HTTP creates; an ack line in the operation log after every ok."""

    def __init__(self, root: Path, remote: Path, log: str) -> None:
        self.root, self.log = root, OpLog(log)
        self.dest = f"http://127.0.0.1:{load_main_config(str(remote)).port}/q/test"
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

    def by_relay(self, rng: random.Random) -> None:
        """Messages for the remote host: the relay's prep, commit, then `relayed` (S12.1)."""
        for i in range(MESSAGES // 4):
            reply = client.call_queue(str(self.root), "relay", "create_message",
                                      {"dest": self.dest, "param1": f"r{i}"}, timeout=30)
            self.check(reply, "relay", "relay")

    def check(self, reply: Any, queue: str, kind: str) -> None:
        if isinstance(reply, list) and reply[:1] == ["ok"]:
            self.ack(queue, reply[1], kind)
        else:
            self.errors.append(f"{queue} {kind}: {reply}")


def wait_web(root: Path) -> None:
    url = f"http://127.0.0.1:{load_main_config(str(root)).port}/q.json"

    def up() -> bool:
        try:
            return requests.get(url, timeout=2).status_code == 200
        except requests.RequestException:
            return False
    wait_for(up, 30, interval=0.1, what="rq-web")


def finished(root: Path, acks: list[dict[str, Any]]) -> bool:
    """Every acknowledged message ended: done or err, relayed for the relay with its remote
    copy done (S12.1)."""
    states = check_root(str(root)).states
    ends = {"relay": ("relayed",)}
    if not all(states.get(a["queue"], {}).get(a["id"]) in ends.get(a["queue"], ("done", "err"))
               for a in acks):
        return False
    remote = root.parent.parent / "remote" / "rqroot"
    done, copies = check_root(str(remote)).states.get("test", {}), remote_copies(remote)
    return all(copies.get(a["id"]) and done.get(copies[a["id"]][0].split("/")[-1]) == "done"
               for a in acks if a["queue"] == "relay")


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    base = tmp_path_factory.mktemp("power")
    root, remote = build(base)
    hosts = base / "hosts"
    snapshot = base / "snapshot"
    shutil.copytree(hosts, snapshot, symlinks=True)
    log = str(base / "ops.log")
    env = {**NO_PROXY, "RQ_FS_RECORD": log, "POWER_TEST_ACKS": log, "POWER_TEST_OPLOG": log}
    mgrs = [EnvMgr(remote, env)]
    try:
        mgrs.append(EnvMgr(root, env))
        wait_web(root)
        wait_web(remote)
        clients = Clients(root, remote, log)
        rng = random.Random(SEED)
        threads = [threading.Thread(target=fn, args=(random.Random(rng.random()),))
                   for fn in (clients.by_socket, clients.by_http, clients.by_relay)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not clients.errors, clients.errors[:5]

        def settled() -> bool:
            acks = Recording(str(snapshot), str(hosts), log).acks
            cron = check_root(str(root)).states.get("cron", {})
            return bool(cron) and finished(root, [a for _, a in acks])
        wait_for(settled, 90, interval=0.5, what="every acknowledged message to finish")
    finally:
        for mgr in reversed(mgrs):
            mgr.stop()
    rec = Recording(str(snapshot), str(hosts), log)
    rec.real_root = str(hosts)  # type: ignore[attr-defined]
    return rec


def roots(hosts: Path) -> tuple[Path, Path]:
    """The local and the remote root of a tree of hosts (the run's or a crash state's)."""
    return hosts / "local" / "rqroot", hosts / "remote" / "rqroot"


# ---------------------------------------------------------------- checks of one state
def check_state(root: str, acks: list[dict[str, Any]], *, recovered: bool,
                report: Report | None = None) -> list[str]:
    report = report or check_root(root)
    problems = list(report.problems)
    for ack in acks:
        state = report.states.get(ack["queue"], {}).get(ack["id"])
        if state is None or state == "prep" or (recovered and state == "run"):
            problems.append(f"acknowledged {ack['queue']}/{ack['id']} ({ack['kind']}) "
                            f"is {state or 'missing'}")
    # a queue that reopened a file moved its torn tail to a sidecar (S13.4, issue 18 item 4):
    # no undecodable line is left inside a file, before or after recovery
    problems += cron_twice(root, report) + event_log_problems(root, torn_lines=0)
    return problems


def cron_twice(root: str, report: Report) -> list[str]:
    slots: dict[Any, list[str]] = {}
    for msg_id, state in report.states.get("cron", {}).items():
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


def remote_copies(remote: Path) -> dict[str, list[str]]:
    """orig_msg_id -> the committed remote messages (S12.1 puts the local id there).  A
    copy still in prep/ whose commit is in the create journal is committed: the remote's
    next start moves it to que/ (rq.queue.journal)."""
    out: dict[str, list[str]] = {}
    qdir = remote / "queue" / "test"
    journaled = {msg_id for msg_id, _ in journal.read_records(str(qdir))}
    for state in ("prep", "que", "run", "done", "relayed", "err"):
        # os.walk, not Path.glob("**/msg"): the remote daemon moves messages meanwhile, and
        # glob raises when a directory it is about to scan has gone (os.walk skips it; the
        # caller polls again).
        paths = [Path(top) / "msg" for top, _, names in
                 os.walk(remote / "queue" / "test" / state) if "msg" in names]
        for path in paths:
            if state == "prep" and path.parent.name not in journaled:
                continue
            try:
                msg = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            out.setdefault(short_id(str(msg.get("orig_msg_id", ""))), []).append(
                f"{state}/{path.parent.name}")
    return out


def relay_problems(local: Path, remote: Path,
                   reports: tuple[Report, Report] | None = None) -> list[str]:
    """S12.1 across the two hosts: `relayed` only after the remote commit; never two
    committed copies; and a message the remote committed that is still pending at the
    sender keeps the job/relay_id naming that copy, so its retry cannot make another."""
    mine_report, remote_report = reports or (check_root(str(local)), check_root(str(remote)))
    problems = [f"remote: {p}" for p in remote_report.problems]
    copies = remote_copies(remote)
    for msg_id, state in mine_report.states.get("relay", {}).items():
        mine = copies.get(msg_id, [])
        if state == "relayed" and not mine:
            problems.append(f"relay/{msg_id} is relayed but the remote has no copy")
        if len(mine) > 1:
            problems.append(f"relay/{msg_id} has {len(mine)} remote copies: {mine}")
        if state in ("que", "run") and mine:
            try:
                relay_id = (local / "queue" / "relay" / state / msg_id / "job" /
                            "relay_id").read_text().strip()
            except OSError:
                relay_id = "(none)"
            if relay_id.rsplit("/", 1)[-1] != mine[0].split("/")[-1]:
                problems.append(f"relay/{msg_id} is {state} while the remote committed "
                                f"{mine[0]}, relay_id {relay_id}: a retry would copy it again")
    return problems


def recover_in_process(root: Path) -> None:
    """What each queue process of `root` does at start before serving (S2.7)."""
    main = load_main_config(str(root))
    for qdir in sorted((root / "queue").iterdir()):
        cfg, _ = load_queue_config(str(root), qdir.name)
        state = QueueState(main, cfg, FsOps(), lambda: None)
        recover(state, Leases(state))
        state.events.close()


def in_parallel(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` in threads; their results in order (the first exception raised)."""
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as exc:  # re-raised below, in the test's thread
            out[i] = exc
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for result in out:
        if isinstance(result, BaseException):
            raise result
    return out


def restart_and_finish(hosts: Path, acks: list[dict[str, Any]]) -> list[str]:
    """Real daemons on the state, started together: rq-mgr on the remote host (the relay
    needs its rq-web) and the local queue processes, until every acknowledged message
    finished."""
    root, remote = roots(hosts)
    procs: list[Any] = []
    try:
        # a dup's target first (S6.5 refuses a dup to a queue not answering yet)
        for wave in ([lambda: EnvMgr(remote, NO_PROXY), lambda: QueueProc(root, "copies")],
                     [lambda q=q: QueueProc(root, q) for q in QUEUES if q != "copies"]):
            procs += in_parallel(wave)
        wait_web(remote)
        wait_for(lambda: finished(root, acks), 60, interval=0.2,
                 what="every acknowledged message to finish after the restart")
    finally:
        in_parallel([proc.stop for proc in procs])
    states = check_root(str(root)).states
    wrong = [f"{a['queue']}/{a['id']} ({a['kind']}) ended {states[a['queue']][a['id']]}"
             for a in acks if (states[a["queue"]][a["id"]] == "err") != (a["kind"] == "err")]
    return wrong + check_root(str(root)).problems + relay_problems(root, remote) \
        + event_log_problems(str(root), torn_lines=0)


def check_hosts(hosts: Path, acks: list[dict[str, Any]], *, recovered: bool) -> list[str]:
    local, remote = roots(hosts)
    reports = check_root(str(local)), check_root(str(remote))
    return (check_state(str(local), acks, recovered=recovered, report=reports[0])
            + relay_problems(local, remote, reports)
            + event_log_problems(str(remote), torn_lines=0))


# ---------------------------------------------------------------- the tests
def test_the_log_replays_to_the_real_run(recording: Recording) -> None:
    """The recorder missed nothing: replaying the whole log onto the snapshot gives the
    messages of both real roots, each in the same state."""
    assert not recording.gaps, recording.gaps[:5]
    kinds = {a["kind"] for _, a in recording.acks}
    assert {"done", "resend", "err", "dup", "copy", "relay"} <= kinds or MESSAGES < 20, kinds
    target = Path(recording.root).parent / "replayed"
    recording.build(len(recording.records), "all", random.Random(0), str(target))
    for real, replayed in zip(roots(Path(recording.real_root)),  # type: ignore[attr-defined]
                              roots(target)):
        assert check_root(str(replayed)).states == check_root(str(real)).states
    local, remote = roots(target)
    assert check_root(str(local)).states["cron"], "the cron entry fired"
    assert "relayed" in check_root(str(local)).states["relay"].values()
    assert not relay_problems(local, remote)


def test_power_loss_states(recording: Recording, tmp_path: Path) -> None:
    """STATES crash states of both hosts at once: each checked, recovered in-process and
    checked again; a sample restarted with real daemons until every acked message finished."""
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
            failures += [f"{where}: {p}" for p in check_hosts(target, acks, recovered=False)]
            for root in roots(target):
                recover_in_process(root)
            failures += [f"{where}, recovered: {p}"
                         for p in check_hosts(target, acks, recovered=True)]
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
