"""The scandir daemon (SPEC S11), supervised by rq-mgr (S2.1).

`plan()` is tested as a table; the rest runs real `rq-mgr` processes in temp
roots.  RQ_RESCAN_SECONDS (read by the daemon's main) sets the periodic
rescan: 3600 leaves only the watchdog notifications, so a queue that appears
at once proves them; 1 makes the rescan cases quick.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import REPO, make_queue, wait_for, write_script
from webtest import DONE_SCRIPT, Mgr, build_root, rq_mgr

from rq.client import call_mgr, call_queue
from rq.scandir.plan import Entry, Ownership, plan, queue_config

DEADLINE = 45.0

# ---------------------------------------------------------------- pure rules (S11.2-S11.4)


def entry(name: str, **kw: Any) -> Entry:
    return Entry(name, f"/e/{name}", f"/e/{name}/run", kw.pop("config_stat", None), **kw)


def test_s11_2_config_overlay_and_defaults() -> None:
    config = queue_config(entry("q", config={"num_workers": "3", "name": "other",
                                              "script": "/x", "timeout": 5}))
    assert config["name"] == "q" and config["script"] == "/e/q/run"
    assert config["num_workers"] == 3 and config["exec_prefix"] == "" and config["timeout"] == 5
    assert queue_config(entry("q"))["num_workers"] == 1


@pytest.mark.parametrize("name, entries, owned, dirs, kind", [
    ("new", {"new": entry("new")}, {}, set(), "create"),
    ("hand", {"hand": entry("hand")}, {}, {"hand"}, "ignore"),
    ("own", {"own": entry("own")}, {"own": Ownership("/e/own", "/e/own/run", None)}, {"own"},
     "keep"),
    ("own", {"own": entry("own", config_stat="1:2:3:4")},
     {"own": Ownership("/e/own", "/e/own/run", None)}, {"own"}, "update"),
    ("own", {"own": entry("own")}, {"own": Ownership("/old/own", "/e/own/run", None)}, {"own"},
     "update"),
    ("own", {"own": entry("own")}, {"own": Ownership(None, None, None)}, {"own"}, "update"),
    ("own", {}, {"own": Ownership("/e/own", "/e/own/run", None)}, {"own"}, "delete"),
    ("own", {"own": entry("own", config_error="bad config.json: x")},
     {"own": Ownership("/e/own", "/e/own/run", None)}, {"own"}, "invalid"),
    ("new", {"new": entry("new", config=[1])}, {}, set(), "invalid"),
    ("new", {"new": entry("new", config={"num_workers": 0})}, {}, set(), "invalid"),
])
def test_s11_4_plan(name: str, entries: dict[str, Entry], owned: dict[str, Ownership],
                    dirs: set[str], kind: str) -> None:
    actions = plan(entries, owned, dirs)
    assert [(a.name, a.kind) for a in actions] == [(name, kind)]


def test_s11_4_invalid_reason_is_the_s3_4_text() -> None:
    [action] = plan({"q": entry("q", config={"num_workers": 0})}, {}, set())
    assert action.reason == "json config has invalid num_workers field (out of range 1..128)"


def test_s11_4_notifications_ignore_reads() -> None:
    """Reading the watched files during a pass must not wake the daemon again."""
    from watchdog.events import (
        DirModifiedEvent,
        FileClosedEvent,
        FileClosedNoWriteEvent,
        FileCreatedEvent,
        FileDeletedEvent,
        FileOpenedEvent,
    )

    from rq.dirwatch import _Waker
    wakes: list[str] = []
    waker = _Waker(lambda: wakes.append("w"))
    for event in (FileOpenedEvent("/d/run"), FileClosedNoWriteEvent("/d/config.json")):
        waker.dispatch(event)
    assert wakes == []
    for event in (FileCreatedEvent("/d/x"), FileClosedEvent("/d/x"), FileDeletedEvent("/d/x"),
                  DirModifiedEvent("/d")):
        waker.dispatch(event)
    assert len(wakes) == 4


# ---------------------------------------------------------------- real rq-mgr processes


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    root = build_root(tmp_path)
    yield root
    rq_mgr(root, "stop")


def make_entry(base: Path, name: str, config: Any = None, form: Any = None) -> Path:
    """A script directory somewhere else, as linked in with `ln -s` (S11.1)."""
    directory = base / "entries" / name
    directory.mkdir(parents=True)
    write_script(directory / "run", DONE_SCRIPT)
    if config is not None:
        replace_json(directory / "config.json", config)
    if form is not None:
        replace_json(directory / "form.json", form)
    return directory


def replace_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(data if isinstance(data, str) else json.dumps(data))
    os.replace(tmp, path)


def status(root: Path) -> dict[str, Any]:
    reply = call_mgr(str(root), "status", timeout=30)
    assert reply[0] == "ok", reply
    return reply[1]


def running_pid(root: Path, name: str) -> int | None:
    child = status(root)["queues"].get(name)
    return child["pid"] if child and child["state"] == "RUNNING" else None


def queue_config_of(root: Path, name: str) -> dict[str, Any]:
    reply = call_queue(str(root), name, "config", timeout=30)
    assert reply[0] == "ok", reply
    return reply[1]


def log_text(root: Path) -> str:
    return (root / "log" / "queuemgr.log").read_text(errors="replace")


def wait_log(root: Path, text: str) -> None:
    wait_for(lambda: text in log_text(root), DEADLINE, what=f"log line {text!r}")


def stat_key(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def run_message(root: Path, queue: str, **fields: str) -> str:
    reply = call_queue(str(root), queue, "create_message", {"dest": queue, **fields},
                       timeout=30)
    assert reply[0] == "ok", reply
    msg_id = reply[1].rsplit("/", 1)[1]

    def state() -> str | None:
        got = call_queue(str(root), queue, "get_message_state", {"msg_id": msg_id}, timeout=30)
        return got[1] if got[0] == "ok" and got[1] in ("done", "err") else None
    assert wait_for(state, DEADLINE, what=f"{queue} message finished") == "done"
    return msg_id


def test_s11_create_update_invalid_remove_and_hand_made_queue(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RQ_RESCAN_SECONDS", "3600")  # only watchdog can notice anything
    make_queue(root, "hand", script=tmp_path / "done.sh", num_workers=1)
    hand_config = (root / "queue" / "hand" / "config.json").read_text()
    Mgr(root)
    wait_for(lambda: status(root)["scandir"]["state"] == "RUNNING", DEADLINE,
             what="scandir RUNNING")

    # Create (S11.4): the link appears, the queue follows (watchdog: no rescan before 3600 s).
    alpha = make_entry(tmp_path, "alpha", {"num_workers": 2, "env_vars": {"A": "1"}},
                       form={"default": "hidden"})
    linked = time.monotonic()
    os.symlink(alpha, root / "scandir" / "alpha")
    qdir = root / "queue" / "alpha"
    wait_for(lambda: (qdir / "scandir.json").exists(), DEADLINE, what="alpha created")
    assert time.monotonic() - linked < 5.0  # S11.4 SHOULD: 2 s; slack for a loaded machine
    pid = wait_for(lambda: running_pid(root, "alpha"), DEADLINE, what="alpha RUNNING")
    config = queue_config_of(root, "alpha")
    assert config["script"] == str((alpha / "run").resolve())
    assert (config["num_workers"], config["exec_prefix"], config["env_vars"]) == (2, "", {"A": "1"})
    assert json.loads((qdir / "scandir.json").read_text()) == {
        "link": str(alpha.resolve()), "run": str((alpha / "run").resolve()),
        "config_stat": stat_key(alpha / "config.json")}
    assert os.readlink(qdir / "form.json") == str((alpha / "form.json").resolve())
    assert os.path.isabs(os.readlink(qdir / "form.json"))
    run_message(root, "alpha")

    # A hand-made queue is never adopted, and the exact S11.4 line is logged.
    os.symlink(make_entry(tmp_path, "hand"), root / "scandir" / "hand")
    wait_log(root, "rq-scandir[")
    wait_log(root, "WARNING scandir: queue hand exists and was not created by scandir; ignored")
    assert (root / "queue" / "hand" / "config.json").read_text() == hand_config
    assert not (root / "queue" / "hand" / "scandir.json").exists()

    # Update: a changed config.json rewrites the queue's config and restarts it.
    replace_json(alpha / "config.json", {"num_workers": 3})
    new_pid = wait_for(lambda: (p := running_pid(root, "alpha")) not in (None, pid) and p,
                       DEADLINE, what="alpha restarted")
    assert queue_config_of(root, "alpha")["num_workers"] == 3
    owned = json.loads((qdir / "scandir.json").read_text())
    assert owned["config_stat"] == stat_key(alpha / "config.json")

    # Invalid config.json: logged, the owned queue left as it is.
    replace_json(alpha / "config.json", "{")
    wait_log(root, "scandir: queue alpha: invalid config.json: bad config.json: ")
    replace_json(alpha / "config.json", {"num_workers": 0})
    wait_log(root, "scandir: queue alpha: invalid config.json: json config has invalid "
             "num_workers field (out of range 1..128); queue left unchanged")
    assert running_pid(root, "alpha") == new_pid
    assert queue_config_of(root, "alpha")["num_workers"] == 3
    assert json.loads((qdir / "scandir.json").read_text()) == owned

    # Remove: the entry goes, the queue goes to the trash (S3.7) with its ownership file.
    os.unlink(root / "scandir" / "alpha")
    wait_for(lambda: not qdir.exists(), DEADLINE, what="alpha trashed")
    [trash] = (root / "queue").glob("alpha.deleted.*")
    assert (trash / "scandir.json").exists()
    assert "alpha" not in call_mgr(str(root), "queues", timeout=30)
    assert (root / "queue" / "hand" / "config.json").read_text() == hand_config
    assert running_pid(root, "hand") is not None


def test_s11_rescan_recreates_and_examples_run(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RQ_RESCAN_SECONDS", "1")
    for name in ("sh-example", "debug"):                    # the repository's examples
        os.symlink(REPO / "scandir" / name, root / "scandir" / name)
    beta = make_entry(tmp_path, "beta")
    os.symlink(beta, root / "scandir" / "beta")
    os.symlink(make_entry(tmp_path, "bad.name"), root / "scandir" / "bad.name")
    fifo = make_entry(tmp_path, "fifo")
    os.mkfifo(fifo / "config.json")  # must not block the daemon
    os.symlink(fifo, root / "scandir" / "fifo")
    make_entry(tmp_path, "plain")  # a plain directory works as well as a link
    os.rename(tmp_path / "entries" / "plain", root / "scandir" / "plain")
    Mgr(root)
    for name in ("sh-example", "debug", "beta", "plain"):
        wait_for(lambda n=name: running_pid(root, n), DEADLINE, what=f"{name} RUNNING")
    assert not (root / "queue" / "bad.name").exists()
    wait_log(root, "scandir: queue fifo: invalid config.json: bad config.json: not a regular "
             "file; queue not created")
    assert not (root / "queue" / "fifo").exists()
    assert queue_config_of(root, "sh-example")["num_workers"] == 1          # S11.2 defaults
    assert queue_config_of(root, "debug")["num_workers"] == 2               # its config.json
    json.loads((root / "queue" / "plain" / "scandir.json").read_text())

    msg_id = run_message(root, "debug", param1="hello")
    [log] = (root / "queue" / "debug").glob(f"done/*/*/*/{msg_id}/job/stdio.log")
    assert "RQ_PARAM1=hello" in log.read_text()
    run_message(root, "sh-example", param1="two words")                      # resend, then done

    # S11.5: deleted through the manager while its entry exists: back at the next pass.
    assert call_mgr(str(root), "delete_queue", "beta", raw=True, timeout=30)[0] == "ok"
    wait_for(lambda: list((root / "queue").glob("beta.deleted.*")), DEADLINE, what="trash")
    wait_for(lambda: running_pid(root, "beta"), DEADLINE, what="beta re-created")

    # An entry whose run is no longer executable stops qualifying: trashed.
    (beta / "run").chmod(0o644)
    wait_for(lambda: len(list((root / "queue").glob("beta.deleted.*"))) == 2, DEADLINE,
             what="beta trashed again")
    assert "beta" not in call_mgr(str(root), "queues", timeout=30)
    assert status(root)["scandir"]["restarts"] == 0
