"""Configuration: find the RQ root, load and validate its config files.

Owns the main config `config/config.json` (S1.4),
queue config validation and normalisation (S3.3, S3.4, with the schedule entry
check of S9.1) and TRUTHY (S3.3).  Config is read at a program's edge and
passed down as frozen dataclasses; this module keeps no mutable state and
reads no environment of its own.  Root discovery (S1.2) is rq.root, re-exported
here: the `rq` message commands need it without this module's dataclasses.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rq.errors import ConfigError
from rq.message import truthy
from rq.protocol import valid_queue_name
from rq.root import MAIN_CONFIG, find_root  # noqa: F401 -- S1.2 lives in rq.root, re-exported

# ---------------------------------------------------------------- values


_DECIMAL_RE = re.compile(r"^[0-9]+$")
_NUMBER_RE = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def _as_int(v: object) -> int | None:
    """An integer, an integral float or a decimal string as int; else None.

    Booleans are not numbers here (JSON `true` must not become 1).
    """
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and _DECIMAL_RE.match(v):
        return int(v)
    return None


def _as_number(v: object) -> int | float | None:
    """A finite number or plain decimal string, as int where integral (S0.3.5)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and _NUMBER_RE.match(v):
        v = float(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v) if v.is_integer() else v
    return None


# ---------------------------------------------------------------- S1.4 main config


PUSH_MAX_BYTES = 64 * 1024 ** 2  # issue 18: `rq push` reads at most this much of stdin


@dataclass(frozen=True)
class MainConfig:
    """The validated `config/config.json` of one root (S1.4)."""

    root: str
    env: str
    host: str
    port: int
    addr: str
    tmpdir: str | None
    allow_new_queue: bool
    relative_root: str  # ROOT: starts and ends with "/"
    basic_auth: Mapping[str, Any] | None = field(default=None, hash=False)
    allowed_ips: tuple[str, ...] | None = None
    session_secret: str | None = None
    csrf_trusted_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()  # (new) more Host names the web answers to (S14)
    event_retention_days: int = 30
    max_upload_bytes: int = 2 * 1024 ** 3  # (new) web upload limit, 413 above it
    max_body_bytes: int = 8 * 1024 ** 2  # (new) any other web body; S4.4 wants 1 MiB messages
    default_queue: str | None = None  # (new, issue 18) the queue of a bare `rq push`
    push_max_bytes: int = PUSH_MAX_BYTES  # (new, issue 18) the largest `rq push` body

    @property
    def host_port(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """`http://HOST:PORT` + ROOT: the prefix of every full id (S4.2)."""
        return self.host_port + self.relative_root


def load_main_config(root: str) -> MainConfig:
    """Read and validate ROOT/config/config.json; raises ConfigError(reason).

    The caller prints `ERROR: bad config file config/config.json: <reason>`.
    """
    try:
        with open(os.path.join(root, MAIN_CONFIG), encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("not a JSON object")
    for key in ("env", "host", "port", "addr"):
        if key not in data:
            raise ConfigError(f'missing required key "{key}"')
    return MainConfig(
        root=root,
        env=_string(data, "env", allow_empty=True),
        host=_string(data, "host"),
        port=_port(data["port"]),
        addr=_string(data, "addr"),
        tmpdir=_tmpdir(root, data.get("tmpdir")),
        allow_new_queue=truthy(data.get("allow_new_queue", False)),
        relative_root=_relative_root(data.get("relative_root")),
        basic_auth=_basic_auth(data.get("basic_auth")),
        allowed_ips=_strings(data, "allowed_ips"),
        session_secret=_session_secret(data.get("session_secret")),
        csrf_trusted_origins=_strings(data, "csrf_trusted_origins") or (),
        allowed_hosts=_strings(data, "allowed_hosts") or (),
        event_retention_days=_retention(data.get("event_retention_days")),
        max_upload_bytes=_byte_limit(data, "max_upload_bytes", 2 * 1024 ** 3),
        max_body_bytes=_byte_limit(data, "max_body_bytes", 8 * 1024 ** 2),
        default_queue=_default_queue(data.get("default_queue")),
        push_max_bytes=_byte_limit(data, "push_max_bytes", PUSH_MAX_BYTES),
    )


def _string(data: dict, key: str, *, allow_empty: bool = False) -> str:
    v = data[key]
    if not isinstance(v, str) or not (v or allow_empty):
        raise ConfigError(f"{key} must be a {'' if allow_empty else 'non-empty '}string")
    return v


def _port(v: object) -> int:
    port = _as_int(v)
    if port is None or not 1 <= port <= 65535:
        raise ConfigError("port must be an integer 1..65535")
    return port


def _tmpdir(root: str, v: object) -> str | None:
    if v is None:
        return None
    # Relative to the root, which is every daemon's working directory (S1.2);
    # stored absolute because jobs run elsewhere and inherit it as TMPDIR.
    path = os.path.join(root, v) if isinstance(v, str) and v else ""
    if not (path and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
        raise ConfigError(f"tmpdir {v} is not a writable directory")
    return path


def _relative_root(v: object) -> str:
    if v is None:
        return "/"
    if not isinstance(v, str) or not v.startswith("/"):
        raise ConfigError("relative_root must start with /")
    return v.rstrip("/") + "/"


def _basic_auth(v: object) -> Mapping[str, Any] | None:
    if v is None:
        return None
    realm = v.get("realm", "RQ") if isinstance(v, dict) else None
    users = v.get("users") if isinstance(v, dict) else None
    if (not isinstance(realm, str) or not isinstance(users, dict)
            or not all(isinstance(p, str) for p in users.values())):
        raise ConfigError('basic_auth must be {"realm": STRING, "users": {USER: PASSWORD, ...}}')
    return MappingProxyType({"realm": realm, "users": MappingProxyType(dict(users))})


def _strings(data: dict, key: str) -> tuple[str, ...] | None:
    v = data.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ConfigError(f"{key} must be an array of strings")
    return tuple(v)


def _session_secret(v: object) -> str | None:
    if v is None or v == "":
        return None  # the web server generates a random one (S1.4)
    if not isinstance(v, str):
        raise ConfigError("session_secret must be a string")
    return v


def _byte_limit(data: dict, key: str, default: int) -> int:
    if data.get(key) is None:
        return default
    size = _as_int(data[key])
    if size is None or size < 1:
        raise ConfigError(f"{key} must be an integer >= 1")
    return size


def _default_queue(v: object) -> str | None:
    """Issue 18 (seed 000's `default`): a queue name (S3.1), or absent."""
    if v is None or v == "":
        return None
    if not isinstance(v, str) or not valid_queue_name(v):
        raise ConfigError("default_queue must be a queue name")
    return v


def _retention(v: object) -> int:
    if v is None:
        return 30
    days = _as_int(v)
    if days is None or days < 0:
        raise ConfigError("event_retention_days must be an integer >= 0")
    return days


# ---------------------------------------------------------------- S3.3 queue config

MODES = ("script", "pull")
DEFAULT_EXEC_PREFIX = "bash -lc"


@dataclass(frozen=True)
class QueueConfig:
    """A validated queue config with S3.3 defaults applied (read-only)."""

    name: str
    script: str | None
    num_workers: int = 1
    exec_prefix: str = DEFAULT_EXEC_PREFIX
    env_vars: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}),
                                        hash=False)
    coalesce_params: tuple[int, ...] = ()
    blocking_params: tuple[int, ...] = ()
    schedule: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    timeout: int | float = 0
    kill_grace: int | float = 10
    mode: str = "script"
    topic: str = ""
    lease_timeout: int = 300

    def normalised(self) -> dict[str, Any]:
        """S3.3 normalised config: a fresh plain dict with every key."""
        return {
            "name": self.name,
            "script": self.script,
            "num_workers": self.num_workers,
            "exec_prefix": self.exec_prefix,
            "env_vars": dict(self.env_vars),
            "coalesce_params": list(self.coalesce_params),
            "blocking_params": list(self.blocking_params),
            "schedule": [copy.deepcopy(dict(entry)) for entry in self.schedule],
            "timeout": self.timeout,
            "kill_grace": self.kill_grace,
            "mode": self.mode,
            "topic": self.topic,
            "lease_timeout": self.lease_timeout,
        }


def validate_queue_config(data: object, *, dirname: str | None = None,
                          lenient_schedule: bool = False) -> tuple[QueueConfig, list[str]]:
    """S3.4: validate and normalise a queue config object.

    Raises ConfigError with the exact S3.4 text.  With `lenient_schedule`
    (queue start and reload) a bad schedule entry is dropped instead and its
    reason is returned in the warnings list.
    """
    if not isinstance(data, dict):
        raise ConfigError("json config is missing name field")
    name = _queue_name(data, dirname)
    mode = data.get("mode")
    mode = "script" if mode is None else mode
    # Checked in the order S3.4 lists the reasons.
    num_workers = _num_workers(data.get("num_workers"))
    script = _script(data.get("script"), mode)
    timeout = _ranged_number(data.get("timeout"), 0, math.inf, 0, "timeout")
    kill_grace = _ranged_number(data.get("kill_grace"), 0, 3600, 10, "kill_grace")
    mode = _mode(mode)
    topic = _topic(data.get("topic"), name)
    lease_timeout = _lease_timeout(data.get("lease_timeout"))
    schedule, warnings = _schedule(data.get("schedule"), lenient_schedule)
    config = QueueConfig(
        name=name,
        script=script,
        num_workers=num_workers,
        exec_prefix=_exec_prefix(data.get("exec_prefix")),
        env_vars=MappingProxyType(_env_vars(data.get("env_vars"))),
        coalesce_params=_coalesce_params(data),
        blocking_params=_param_list(data.get("blocking_params")),
        schedule=schedule,
        timeout=timeout,
        kill_grace=kill_grace,
        mode=mode,
        topic=topic,
        lease_timeout=lease_timeout,
    )
    return config, warnings


def load_queue_config(root: str, name: str, *,
                      lenient_schedule: bool = True) -> tuple[QueueConfig, list[str]]:
    """Read and validate ROOT/queue/NAME/config.json (a symlink is followed)."""
    path = os.path.join(root, "queue", name, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f"could not read queue config [ {path} ]: "
                          f"{exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"could not read queue config [ {path} ]: {exc}") from exc
    return validate_queue_config(data, dirname=name, lenient_schedule=lenient_schedule)


def _queue_name(data: dict, dirname: str | None) -> str:
    if "name" not in data:
        raise ConfigError("json config is missing name field")
    name = data["name"]
    if not isinstance(name, str):
        raise ConfigError("json config has invalid name (not String)")
    if not 1 <= len(name.encode("utf-8", "surrogatepass")) <= 128:
        raise ConfigError("json config has invalid name (size)")
    if not valid_queue_name(name):
        raise ConfigError("queue name has invalid characters")
    if dirname is not None and name != dirname:
        raise ConfigError("json config has invalid name (does not match queue directory)")
    return name


def _num_workers(v: object) -> int:
    n = 1 if v is None else _as_int(v)
    if n is None or not 1 <= n <= 128:
        raise ConfigError("json config has invalid num_workers field (out of range 1..128)")
    return n


def _script(v: object, mode: object) -> str | None:
    if mode == "pull":  # S8.1: a pull queue runs no script; keep one if given
        return v if isinstance(v, str) else None
    if v is None:
        raise ConfigError("json config is missing script field")
    if not isinstance(v, str) or not 1 <= len(v.encode("utf-8", "surrogatepass")) <= 1024:
        raise ConfigError("json config has invalid script (size)")
    return v


def _exec_prefix(v: object) -> str:
    # S3.3 names only absent and null; any other non-string is treated the same.
    return v if isinstance(v, str) else DEFAULT_EXEC_PREFIX


def _env_vars(v: object) -> dict[str, str]:
    """S3.3: string values only; `RQ_*` keys are RQ's own and are dropped."""
    if not isinstance(v, dict):
        return {}
    return {k: val for k, val in v.items()
            if isinstance(k, str) and not k.startswith("RQ_") and isinstance(val, str)}


def _param_list(v: object) -> tuple[int, ...]:
    """Param numbers 1..4, sorted and unique; anything else is ignored."""
    if not isinstance(v, list):
        return ()
    nums = (_as_int(item) for item in v)
    return tuple(sorted({n for n in nums if n is not None and 1 <= n <= 4}))


def _coalesce_params(data: dict) -> tuple[int, ...]:
    """S3.3: `coalesce_params` when present, else the legacy `coalesce` form."""
    if data.get("coalesce_params") is not None:
        return _param_list(data["coalesce_params"])
    if not truthy(data.get("coalesce")):
        return ()
    return tuple(i for i in range(1, 5) if truthy(data.get(f"coalesce_param{i}")))


def _ranged_number(v: object, lo: float, hi: float, default: int, key: str) -> int | float:
    n = default if v is None else _as_number(v)
    if n is None or not lo <= n <= hi:
        raise ConfigError(f"json config has invalid {key} field")
    return n


def _mode(v: object) -> str:
    if v not in MODES:
        raise ConfigError("json config has invalid mode field")
    return str(v)


def _topic(v: object, name: str) -> str:
    if v is None:
        return name
    if not valid_topic(v):
        raise ConfigError("json config has invalid topic field")
    return str(v)


def valid_topic(topic: object) -> bool:
    """S8.1: 1..255 bytes of dot-separated non-empty segments whose characters
    obey S3.1 (checked a character at a time: the 128-byte name limit does not
    apply to a segment)."""
    if not isinstance(topic, str) or not topic:
        return False
    if len(topic.encode("utf-8", "surrogatepass")) > 255:
        return False
    return all(seg and all(valid_queue_name(ch) for ch in seg) for seg in topic.split("."))


def _lease_timeout(v: object) -> int:
    n = 300 if v is None else _as_int(v)
    if n is None or not 1 <= n <= 86400:
        raise ConfigError("json config has invalid lease_timeout field")
    return n


# ---------------------------------------------------------------- S9.1 schedule entries


def _schedule(v: object, lenient: bool) -> tuple[tuple[Mapping[str, Any], ...], list[str]]:
    """The valid entries as given (read-only copies) and warnings for dropped ones."""
    if v is None:
        return (), []
    if not isinstance(v, list):
        reason = "json config has invalid schedule field"
        if not lenient:
            raise ConfigError(reason)
        return (), [reason]
    entries: list[Mapping[str, Any]] = []
    warnings: list[str] = []
    for i, entry in enumerate(v):
        from rq import cron  # croniter only for a queue with a schedule (a fast `rq` call)
        problem = cron.entry_problem(entry)
        if problem is None:
            entries.append(MappingProxyType(copy.deepcopy(entry)))
            continue
        reason = f"json config has invalid schedule entry {i}: {problem}"
        if not lenient:
            raise ConfigError(reason)
        warnings.append(reason)
    return tuple(entries), warnings
