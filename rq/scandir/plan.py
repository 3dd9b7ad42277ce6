"""What one scandir pass must do (SPEC S11.1-S11.4), pure: no IO.

Owns: the queue config a scandir entry stands for (S11.2), the ownership
record `scandir.json` (S11.3), and `plan()`, which compares the qualifying
entries of `scandir/` with the queue directories and the queues scandir owns
and returns the actions of the pass.  rq.scandir.daemon gathers the facts and
carries the actions out through the manager socket.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rq.config import validate_queue_config
from rq.errors import ConfigError

SCANDIR_DEFAULTS: Mapping[str, Any] = {"num_workers": 1, "exec_prefix": ""}  # S11.2


@dataclass(frozen=True)
class Ownership:
    """S11.3 `queue/NAME/scandir.json`."""

    link: str | None
    run: str | None
    config_stat: str | None

    def to_json(self) -> dict[str, Any]:
        return {"link": self.link, "run": self.run, "config_stat": self.config_stat}

    @classmethod
    def from_json(cls, data: object) -> Ownership:
        """A damaged record still means "owned"; it just matches no entry, so
        the next pass rewrites the queue from its entry."""
        if not isinstance(data, dict):
            return cls(None, None, None)

        def text(key: str) -> str | None:
            v = data.get(key)
            return v if isinstance(v, str) else None

        return cls(text("link"), text("run"), text("config_stat"))


@dataclass(frozen=True)
class Entry:
    """A qualifying `scandir/NAME` (S11.1) as a pass saw it."""

    name: str
    link: str                      # the resolved entry directory
    run: str                       # real path of its executable `run`
    config_stat: str | None        # "dev:ino:size:mtime_ns" of config.json, None if absent
    config: object = None          # parsed config.json (None if absent)
    config_error: str | None = None  # config.json unreadable or not JSON
    form: str | None = None        # real path of form.json, if present

    @property
    def ownership(self) -> Ownership:
        return Ownership(self.link, self.run, self.config_stat)


@dataclass(frozen=True)
class Action:
    """kind: create, update, delete, keep (owned and unchanged: only the form
    link is checked), ignore (a queue scandir did not create), invalid (its
    `ownership` is the owned queue's record, None for a queue not created)."""

    kind: str
    name: str
    config: Mapping[str, Any] | None = None
    ownership: Ownership | None = None
    form: str | None = None
    reason: str = ""


def stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def queue_config(entry: Entry) -> dict[str, Any]:
    """S11.2: config.json overlaid with name and script, defaults for
    num_workers and exec_prefix, validated by S3.4 and normalised (S3.3).
    Raises ConfigError with the reason."""
    if entry.config_error is not None:
        raise ConfigError(entry.config_error)
    data = entry.config if entry.config is not None else {}
    if not isinstance(data, dict):
        raise ConfigError("config.json is not a JSON object")
    merged = {**SCANDIR_DEFAULTS, **data, "name": entry.name, "script": entry.run}
    config, _ = validate_queue_config(merged)
    return config.normalised()


def config_text(config: Mapping[str, Any]) -> bytes:
    return (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode()


def plan(entries: Mapping[str, Entry], owned: Mapping[str, Ownership],
         queue_dirs: set[str]) -> list[Action]:
    """S11.4, one action per name, in name order.

    `entries`: qualifying entries; `owned`: queues with a scandir.json;
    `queue_dirs`: every name with a directory in queue/."""
    actions = []
    for name in sorted(set(entries) | set(owned)):
        entry = entries.get(name)
        if entry is None:
            actions.append(Action("delete", name))  # only owned names get here
            continue
        if name in queue_dirs and name not in owned:
            actions.append(Action("ignore", name))
            continue
        try:
            config = queue_config(entry)
        except ConfigError as exc:
            actions.append(Action("invalid", name, ownership=owned.get(name), reason=str(exc)))
            continue
        if name not in queue_dirs:
            kind = "create"
        elif owned[name] != entry.ownership:
            kind = "update"
        else:
            kind = "keep"
        actions.append(Action(kind, name, config, entry.ownership, entry.form))
    return actions
