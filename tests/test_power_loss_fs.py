"""Power loss on a real file system, frozen under a loop device (issue 13, part 2, first
model; SPEC S0.3, S2.7, S4.1, S12.1).

Two roots live on one small ext4 file system mounted from a loop device: `local` runs the
power-loss workload of tests/test_power_loss.py (creates over the queue socket and over
HTTP, jobs finishing done, resending, failing to err, dup'ing to another queue, a coalescing
queue, a cron entry) plus the builtin `relay` queue, which relays messages to the `remote`
root's queue over HTTP with S12.1's two-phase commit (prep, commit, then `relayed`).  While
the clients keep creating, the file system is frozen at random moments (`fsfreeze
--freeze`: writes block, what was written is on the device), the block device is copied,
and it is thawed again.  An ack counts for a state when the client had it before the freeze
began; the script of a dup logs the copy's ack to a file outside the file system.

After the run each copy is mounted where the original was (so every absolute path in the
configs holds; mounting replays ext4's journal as after a power loss) and checked:

* every acknowledged message exists, in one state, not in prep; `rq fsck` finds no problem
  in either root; the event logs read; cron never fired twice for a slot;
* S12.1: a message the local relay queue holds as `relayed` has its copy committed at the
  remote, no local message has two committed copies there, and one the remote committed
  that is still pending locally keeps the job/relay_id naming that copy
  (test_power_loss.relay_problems, shared with the op-log model);
* after the in-process recovery of S2.7 the same holds, with nothing left in `run`;
* a sample is started with real rq-mgr daemons on both roots until every acknowledged
  message has finished (relay ones `relayed`, their remote copies done).

Needs root, losetup/mount/mkfs.ext4/fsfreeze and a free loop device; skipped with the
reason otherwise.  Knobs: RQ_FREEZE_STATES (default 40), RQ_FREEZE_RESTARTS (default 3),
RQ_POWER_SEED.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from rqtest import free_port, make_queue, make_root, short_id, wait_for, write_script
from test_power_loss import (KINDS, NO_PROXY, SCRIPT, check_state, recover_in_process,
                             relay_problems, remote_copies)
from webtest import DONE_SCRIPT, EnvMgr, install_builtin

from rq import client
from rq.errors import RQError
from rq.fsck import check_root

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

STATES = int(os.environ.get("RQ_FREEZE_STATES", "40"))
RESTARTS = int(os.environ.get("RQ_FREEZE_RESTARTS", "3"))
SEED = int(os.environ.get("RQ_POWER_SEED", "20261213"))
FS_MB = 48
TOOLS = ("losetup", "mount", "umount", "mkfs.ext4", "fsfreeze", "dd")
# The workload's script, but a dup whose target queue is not answering yet (a restart starts
# every queue at once, S6.5 then replies `fail couldn't connect to queue - copies`) is
# resent a second later instead of failed: that is no message lost.
FS_SCRIPT = SCRIPT.replace(
    '    *) echo "err dup refused',
    '    "fail couldn\'t connect"*) echo "resend 1-target not answering yet" >&3; exit 0 ;;\n'
    '    *) echo "err dup refused')
assert FS_SCRIPT != SCRIPT

def run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (losetup, mount, fsfreeze)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    return None


class FrozenFs:
    """An ext4 image mounted at `mnt` through a loop device; frozen copies of it."""

    def __init__(self, image: Path, mnt: Path) -> None:
        self.image, self.mnt = image, mnt
        with open(image, "wb") as fh:
            fh.truncate(FS_MB * 2**20)
        run("mkfs.ext4", "-q", "-F", str(image))
        mnt.mkdir()
        self.device = run("losetup", "--find", "--show", str(image)).strip()
        try:
            run("mount", self.device, str(mnt))
        except RuntimeError:
            run("losetup", "--detach", self.device)
            raise

    def snapshot(self, dest: Path) -> None:
        """Freeze (dirty data reaches the device, writers block), copy the device, thaw."""
        run("fsfreeze", "--freeze", str(self.mnt))
        try:
            run("dd", f"if={self.device}", f"of={dest}", "bs=4M", "iflag=direct",
                "conv=sparse", "status=none")
        finally:
            run("fsfreeze", "--unfreeze", str(self.mnt))

    def close(self) -> None:
        try:
            run("umount", str(self.mnt))
        except RuntimeError:  # still busy after a failure: detach it lazily
            run("umount", "--lazy", str(self.mnt))
        run("losetup", "--detach", self.device)


class Mounted:
    """A copy mounted at `mnt` (journal replayed) for the length of a `with` block."""

    def __init__(self, copy: Path, mnt: Path) -> None:
        self.copy, self.mnt = copy, mnt

    def __enter__(self) -> Path:
        run("mount", "-o", "loop", str(self.copy), str(self.mnt))
        return self.mnt

    def __exit__(self, *exc: object) -> None:
        run("umount", str(self.mnt))


# ---------------------------------------------------------------- the run


def build(mnt: Path, outside: Path) -> tuple[Path, Path, int]:
    """The local root (the power-loss queues plus `relay`) and the remote root on the
    file system; the scripts outside it."""
    script = write_script(outside / "power.sh", FS_SCRIPT)
    local = make_root(mnt / "local", port=free_port())
    make_queue(local, "work", script=script, num_workers=3)
    make_queue(local, "copies", script=script, num_workers=2)
    make_queue(local, "coal", script=script, num_workers=1, coalesce_params=[1])
    make_queue(local, "cron", script=script, schedule=[{"cron": "* * * * *", "id": "minute"}])
    install_builtin(local, "relay", num_workers=2)
    remote_port = free_port()
    remote = make_root(mnt / "remote", port=remote_port)
    make_queue(remote, "test", script=write_script(outside / "done.sh", DONE_SCRIPT))
    return local, remote, remote_port


class Clients:
    """Creates over the socket, HTTP and the relay queue until stopped; `acks` in order."""

    def __init__(self, root: Path, remote_port: int, copies: Path) -> None:
        self.root, self.copies = root, copies
        self.url = f"http://127.0.0.1:{json.loads(config_text(root))['port']}/q/work/new_message"
        self.dest = f"http://127.0.0.1:{remote_port}/q/test"
        self.acks: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def acked(self) -> list[dict[str, Any]]:
        """Every ack received so far, the dup copies' included (read before a freeze)."""
        with self.lock:
            acks = list(self.acks)
        lines = self.copies.read_text().splitlines() if self.copies.exists() else []
        return acks + [json.loads(line) for line in lines if line.endswith("}")]

    def loop(self, create: Callable[[random.Random, int], tuple[str, str, Any]],
             rng: random.Random) -> None:
        i = 0
        while not self.stop.is_set():
            queue, kind, reply = create(rng, i)
            if isinstance(reply, list) and reply[:1] == ["ok"]:
                with self.lock:
                    self.acks.append({"queue": queue, "id": short_id(reply[1]), "kind": kind})
            else:
                self.errors.append(f"{queue} {kind}: {reply}")
            i += 1

    def by_socket(self, rng: random.Random, i: int) -> tuple[str, str, Any]:
        time.sleep(rng.uniform(0.01, 0.06))  # pacing: a few hundred messages per run
        queue, kind = ("coal", f"slow{i % 3}") if i % 4 == 3 else ("work", rng.choice(KINDS))
        return queue, kind, client.call_queue(str(self.root), queue, "create_message",
                                              {"dest": queue, "param1": kind}, timeout=60)

    def by_http(self, rng: random.Random, i: int) -> tuple[str, str, Any]:
        time.sleep(rng.uniform(0.01, 0.06))
        kind = rng.choice(KINDS)
        reply = requests.post(self.url, json={"dest": "work", "param1": kind}, timeout=60)
        return "work", kind, reply.json()

    def by_relay(self, rng: random.Random, i: int) -> tuple[str, str, Any]:
        time.sleep(rng.uniform(0.05, 0.2))  # pacing: relaying costs two HTTP round trips
        return "relay", "relay", client.call_queue(
            str(self.root), "relay", "create_message",
            {"dest": self.dest, "param1": f"r{i}"}, timeout=60)


def config_text(root: Path) -> str:
    return (root / "config" / "config.json").read_text()


def answers(root: Path, queue: str) -> bool:
    try:
        return client.call_queue(str(root), queue, "ping", timeout=5) == ["pong"]
    except RQError:
        return False


def start_pair(local: Path, remote: Path, copies: Path | None = None) -> list[EnvMgr]:
    """rq-mgr on both roots, no proxy; the dup copies' acks logged to `copies`."""
    mgrs = [EnvMgr(remote, NO_PROXY)]
    mgrs.append(EnvMgr(local, {**NO_PROXY, "POWER_TEST_ACKS": str(copies or "")}))
    for root, queue in ((remote, "test"), (local, "relay"), (local, "work")):
        wait_for(lambda r=root, q=queue: answers(r, q), 60, what=f"queue {queue} up")
    return mgrs


def record(fs: FrozenFs, local: Path, remote: Path, remote_port: int, outside: Path,
           copies_dir: Path) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Run the workload and take STATES frozen copies; each with the acks before it."""
    copies = outside / "copies.acks"
    mgrs = start_pair(local, remote, copies)
    clients = Clients(local, remote_port, copies)
    rng = random.Random(SEED)
    threads = [threading.Thread(target=clients.loop, args=(fn, random.Random(rng.random())))
               for fn in (clients.by_socket, clients.by_http, clients.by_relay)]
    taken: list[tuple[Path, list[dict[str, Any]]]] = []
    try:
        for t in threads:
            t.start()
        for n in range(STATES):
            clients.stop.wait(rng.uniform(0.1, 0.6))  # a random moment, not a synchronisation
            acks = clients.acked()
            dest = copies_dir / f"s{n}.img"
            fs.snapshot(dest)
            taken.append((dest, acks))
        clients.stop.set()
        for t in threads:
            t.join(120)
        assert not clients.errors, clients.errors[:5]
        final = clients.acked()
        wait_for(lambda: finished(local, remote, final), 120, interval=0.5,
                 what="every acknowledged message of the real run to finish")
    finally:
        clients.stop.set()
        for mgr in reversed(mgrs):
            mgr.stop()
    return taken


# ---------------------------------------------------------------- the checks


def finished(local: Path, remote: Path, acks: list[dict[str, Any]]) -> bool:
    states = check_root(str(local)).states
    ends = {"relay": ("relayed",)}
    if not all(states.get(a["queue"], {}).get(a["id"]) in ends.get(a["queue"], ("done", "err"))
               for a in acks):
        return False
    done = check_root(str(remote)).states.get("test", {})
    relayed = [a["id"] for a in acks if a["queue"] == "relay"]
    copies = remote_copies(remote)
    return all(copies.get(i) and done.get(copies[i][0].split("/")[-1]) == "done"
               for i in relayed)


def status_of(root: Path, ack: dict[str, Any]) -> str:
    """The stored status of an acknowledged message (S4.3), for a failure's text."""
    for path in (root / "queue" / ack["queue"]).glob(f"*/**/{ack['id']}/msg"):
        return str(json.loads(path.read_bytes()).get("status"))
    return "(not found)"


def check_copy(local: Path, remote: Path, acks: list[dict[str, Any]],
               restart: bool) -> list[str]:
    problems = check_state(str(local), acks, recovered=False) + relay_problems(local, remote)
    recover_in_process(local)
    recover_in_process(remote)
    problems += [f"recovered: {p}" for p in check_state(str(local), acks, recovered=True)
                 + relay_problems(local, remote)]
    if restart:
        mgrs = start_pair(local, remote)
        try:
            wait_for(lambda: finished(local, remote, acks), 120, interval=0.5,
                     what="every acknowledged message to finish after the restart")
        finally:
            for mgr in reversed(mgrs):
                mgr.stop()
        states = check_root(str(local)).states
        problems += [f"restarted: {a['queue']}/{a['id']} ({a['kind']}) ended "
                     f"{states[a['queue']][a['id']]}: {status_of(local, a)}"
                     for a in acks if a["queue"] != "relay"
                     and (states[a["queue"]][a["id"]] == "err") != (a["kind"] == "err")]
        problems += [f"restarted: {p}" for p in check_root(str(local)).problems
                     + relay_problems(local, remote)]
    return problems


# ---------------------------------------------------------------- the test


@pytest.fixture
def frozen_fs(tmp_path: Path) -> Iterator[FrozenFs]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        fs = FrozenFs(tmp_path / "fs.img", tmp_path / "m")
    except RuntimeError as exc:  # e.g. no free loop device in a container
        pytest.skip(f"cannot mount a loop device: {exc}")
    try:
        yield fs
    finally:
        if os.path.ismount(fs.mnt):
            fs.close()


def test_frozen_file_system_states_lose_no_acknowledged_message(
        frozen_fs: FrozenFs, tmp_path: Path) -> None:
    """Issue 13 part 2 (the fsfreeze model): STATES copies of a real run's file system,
    each mounted, checked, recovered and checked again; a sample restarted until every
    acknowledged message finished.  0 lost."""
    outside = tmp_path / "outside"
    outside.mkdir()
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir()
    local, remote, remote_port = build(frozen_fs.mnt, outside)
    started = time.monotonic()
    taken = record(frozen_fs, local, remote, remote_port, outside, copies_dir)
    recorded = time.monotonic() - started
    frozen_fs.close()
    rng = random.Random(SEED)
    restart = set(rng.sample(range(len(taken)), min(RESTARTS, len(taken))))
    failures: list[str] = []
    for n, (copy, acks) in enumerate(taken):
        with Mounted(copy, frozen_fs.mnt):
            failures += [f"state {n} ({len(acks)} acks): {p}"
                         for p in check_copy(local, remote, acks, n in restart)]
        copy.unlink()
    kinds: dict[str, int] = {}
    for ack in taken[-1][1]:
        kinds[ack["kind"]] = kinds.get(ack["kind"], 0) + 1
    print(f"\nfrozen file system: {len(taken)} states built and checked ({len(restart)} "
          f"restarted), up to {len(taken[-1][1])} acks {kinds}; run and copies "
          f"{recorded:.1f} s, checks {time.monotonic() - started - recorded:.1f} s")
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} failures)"
