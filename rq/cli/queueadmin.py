"""`rq` commands that create, change and delete queues (issue 16 item 5) over the
manager's S7.2 commands: `createqueue` (`create_queue`), `configqueue` (`update_queue`:
validate, write, reload, S3.6) and `deletequeue` (`delete_queue`, S3.7).

A queue config comes from a JSON file (`--file`), from flags, or both (flags win);
`configqueue` starts from the queue's current `config.json`.  The manager validates
(S3.4) and does every write; this module only reads the files it is given and the
queue's config.json, and waits (polling the manager or the queue with a deadline) until
the change has taken effect, so the next command sees it.
"""

from __future__ import annotations

import json
import os
import time

from rq import client
from rq.cli.base import (
    CliError,
    Invocation,
    call_mgr,
    check_queue,
    command,
    failure_text,
    is_ok,
    optional,
    require,
)
from rq.errors import ConnectError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# S3.3 keys settable by flag: plain values go as given (the manager accepts numbers as
# strings, as from a web form); these are JSON text or comma-separated numbers.
PLAIN_KEYS = ("script", "num_workers", "exec_prefix", "timeout", "kill_grace", "mode",
              "topic", "lease_timeout")
JSON_KEYS = ("env_vars", "schedule")
LIST_KEYS = ("coalesce_params", "blocking_params")
CONFIG_FLAGS = (*PLAIN_KEYS, *JSON_KEYS, *LIST_KEYS, "file")
START_WAIT = 10.0   # seconds for a new queue to come up, a change to be seen
DRAIN_WAIT = 3600.0  # default --timeout of `deletequeue --force`
POLL = 0.05


def read_config_file(path: str) -> dict[str, Any]:
    """A JSON object from `path` (relative to the current directory), or one clear line."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CliError(f"{path}: not a JSON object")
    return data


def flag_config(inv: Invocation) -> dict[str, Any]:
    """The S3.3 keys given as flags, decoded."""
    out: dict[str, Any] = {k: v for k in PLAIN_KEYS if (v := optional(inv, k)) is not None}
    for key in JSON_KEYS:
        if (text := optional(inv, key)) is not None:
            try:
                out[key] = json.loads(text)
            except ValueError:
                raise CliError(f"--{key} is not valid JSON: {text}") from None
    for key in LIST_KEYS:
        if key in inv.flags:
            text = optional(inv, key) or ""
            items = [item.strip() for item in text.split(",") if item.strip()]
            if not all(item.isdigit() for item in items):
                raise CliError(f"--{key} takes param numbers separated by commas: {text}")
            out[key] = [int(item) for item in items]
    return out


def given_config(inv: Invocation, base: dict[str, Any]) -> dict[str, Any]:
    """`base`, then the `--file` object, then the flags, each overriding the one before."""
    path = optional(inv, "file")
    return {**base, **(read_config_file(path) if path else {}), **flag_config(inv)}


def child_state(inv: Invocation, name: str) -> dict[str, Any] | None:
    """The manager's S7.2 `status` CHILD of queue `name`, or None when it has none."""
    reply = call_mgr(inv, "status")
    if not is_ok(reply) or not isinstance(reply[1], dict):
        return None
    child = (reply[1].get("queues") or {}).get(name)
    return child if isinstance(child, dict) else None


def wait_until(check: Any, timeout: float) -> Any:
    """Poll `check()` until it returns something other than None, or None at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(POLL)


# ---------------------------------------------------------------- createqueue


def wait_running(inv: Invocation, name: str) -> None:
    """Wait for the new queue's process to leave STARTING; one line unless it is RUNNING."""
    def settled() -> dict[str, Any] | None:
        child = child_state(inv, name)
        return child if child and child.get("state") not in (None, "STARTING") else None

    child = wait_until(settled, START_WAIT) or {"state": "STARTING"}
    if child.get("state") != "RUNNING":
        why = f": {child['error']}" if child.get("error") else ""
        raise CliError(f"queue {name} created but not running ({child.get('state')}{why})")


@command("createqueue", "name", "queue", *CONFIG_FLAGS)
def createqueue(inv: Invocation) -> int:
    """`ok NAME running` once the new queue's process is RUNNING.  `--queue` is taken
    as `--name`, as every other queue command names its queue by `--queue`."""
    config = given_config(inv, {})
    for flag in ("queue", "name"):  # --name wins when both are given
        if flag in inv.flags:
            config["name"] = require(inv, flag)
    name = config.get("name")
    if not isinstance(name, str) or not name:
        raise CliError("missing required argument --name (or a \"name\" in --file)")
    reply = call_mgr(inv, "create_queue", json.dumps(config))
    if not (isinstance(reply, list) and reply[:1] == ["success"]):
        raise CliError(f"cannot create queue {name}: {failure_text(reply)}")
    wait_running(inv, name)
    inv.say(f"ok {name} running")
    return 0


# ---------------------------------------------------------------- configqueue


def current_config(inv: Invocation, name: str) -> dict[str, Any]:
    check_queue(inv.root, name)
    return read_config_file(os.path.join(inv.root, "queue", name, "config.json"))


def wait_reloaded(inv: Invocation, name: str, config: dict[str, Any]) -> bool:
    """True once the queue answers `config` with `config` normalised (S3.6), False when it
    is not running (it reads the file when it starts); one line after START_WAIT s."""
    from rq.config import validate_queue_config  # what the queue will answer (S3.3)

    wanted = validate_queue_config(config)[0].normalised()

    def applied() -> bool | None:
        try:
            got = client.call_queue(inv.root, name, "config", timeout=2.0)
        except ConnectError:
            return False
        return True if got == ["ok", wanted] else None

    done = wait_until(applied, START_WAIT)
    if done is None:
        raise CliError(f"queue {name}: config saved but not yet reloaded after {START_WAIT:g} s")
    return bool(done)


@command("configqueue", "queue", *CONFIG_FLAGS)
def configqueue(inv: Invocation) -> int:
    """`ok NAME reloaded` once the queue uses the new config, or `ok NAME saved` when it
    is not running."""
    name = require(inv, "queue")
    config = given_config(inv, current_config(inv, name))
    if config.get("name") != name:
        raise CliError(f"the name of queue {name} cannot change (--file names "
                       f"{config.get('name')})")
    reply = call_mgr(inv, "update_queue", json.dumps(config))
    if not is_ok(reply):
        raise CliError(f"cannot change queue {name}: {failure_text(reply)}")
    inv.say(f"ok {name} {'reloaded' if wait_reloaded(inv, name, config) else 'saved'}")
    return 0


# ---------------------------------------------------------------- deletequeue


def running_count(inv: Invocation, name: str) -> int:
    """Messages of the queue in run/ (jobs and leases, S7.3 `num_messages`); 0 when its
    process is not running (nothing runs without it)."""
    try:
        counts = client.call_queue(inv.root, name, "num_messages", timeout=5.0)
    except ConnectError:
        return 0
    return int(counts.get("run", 0)) if isinstance(counts, dict) else 0


def drain(inv: Invocation, name: str) -> None:
    """`--force`: pause the queue (no new job starts, S3.5), then wait for the running
    ones to end, up to `--timeout` seconds."""
    reply = call_mgr(inv, "pause_queue", name)
    if not is_ok(reply):
        raise CliError(f"cannot pause queue {name}: {failure_text(reply)}")
    raw = optional(inv, "timeout") or str(DRAIN_WAIT)
    try:
        timeout = float(raw)
    except ValueError:
        raise CliError(f"invalid --timeout: {raw} (seconds)") from None
    if wait_until(lambda: True if running_count(inv, name) == 0 else None, timeout) is None:
        raise CliError(f"queue {name} still runs {running_count(inv, name)} message(s) after "
                       f"{timeout:g} s; it is left paused")


@command("deletequeue", "queue", "force", "timeout")
def deletequeue(inv: Invocation) -> int:
    """S3.7 delete: `ok NAME deleted` once queue/NAME has moved to the trash.  Refused
    while messages run, since the graceful stop would end their jobs (S2.5)."""
    name = require(inv, "queue")
    check_queue(inv.root, name)
    if "force" in inv.flags:
        drain(inv, name)
    elif (running := running_count(inv, name)) > 0:
        raise CliError(f"queue {name} is running {running} message(s): wait for them, or "
                       "use --force to pause it and delete it once they end")
    reply = call_mgr(inv, "delete_queue", name)
    if not is_ok(reply):
        raise CliError(f"cannot delete queue {name}: {failure_text(reply)}")
    qdir = os.path.join(inv.root, "queue", name)
    if not wait_until(lambda: True if not os.path.lexists(qdir) else None, START_WAIT + 60):
        raise CliError(f"queue {name} is stopping but not deleted yet")
    inv.say(f"ok {name} deleted")
    return 0
