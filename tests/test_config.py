"""rq.config: root discovery (S1.2), main config (S1.4), queue config (S3.3, S3.4, S9.1)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rq.config import (
    MainConfig,
    QueueConfig,
    find_root,
    load_main_config,
    load_queue_config,
    truthy,
    valid_topic,
    validate_queue_config,
)
from rq.errors import ConfigError, RootError, UsageError
from rqtest import write_root

MAIN = {"env": "test", "host": "127.0.0.1", "port": 3333, "addr": "0.0.0.0"}


# ---------------------------------------------------------------- S3.3 TRUTHY


@pytest.mark.parametrize("value, expected", [
    (True, True), (1, True), (1.0, True), ("true", True), ("yes", True), ("1", True),
    (False, False), (0, False), (2, False), ("false", False), ("no", False), ("0", False),
    ("", False), (None, False), ("TRUE", False), ("on", False), ([1], False), ({}, False),
])
def test_truthy(value: object, expected: bool) -> None:
    assert truthy(value) is expected


# ---------------------------------------------------------------- S1.2 root discovery


@pytest.mark.parametrize("argv, rest", [
    (["--root", "{root}", "status"], ["status"]),
    (["--root={root}", "status"], ["status"]),
    (["status", "--root", "{root}"], ["status"]),
    (["sendmesg", "--dest", "x", "--root={root}", "--src", "y"],
     ["sendmesg", "--dest", "x", "--src", "y"]),
    (["--root=/nowhere", "--root={root}"], []),  # the last one wins
])
def test_find_root_option_at_any_position(tmp_path: Path, argv: list[str],
                                          rest: list[str]) -> None:
    root = write_root(tmp_path / "r", MAIN)
    argv = [a.replace("{root}", str(root)) for a in argv]
    assert find_root("rq", argv, {"RQ_ROOT": "/elsewhere"}) == (str(root), rest)


def test_find_root_option_relative_is_made_absolute(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    write_root(tmp_path / "r", MAIN)
    monkeypatch.chdir(tmp_path)
    assert find_root("rq", ["--root", "r"], {}) == (str(tmp_path / "r"), [])


def test_find_root_env(tmp_path: Path) -> None:
    root = write_root(tmp_path / "r", MAIN)
    assert find_root("rq-mgr", ["start"], {"RQ_ROOT": str(root)}) == (str(root), ["start"])


@pytest.mark.parametrize("start", [".", "queue", "queue/test/que"])
def test_find_root_walks_up_from_cwd(tmp_path: Path, start: str) -> None:
    root = write_root(tmp_path / "r", MAIN)
    (root / start).mkdir(parents=True, exist_ok=True)
    assert find_root("rq", ["ls"], {}, cwd=str(root / start)) == (str(root), ["ls"])


def test_find_root_uses_process_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_root(tmp_path / "r", MAIN)
    (root / "log").mkdir()
    monkeypatch.chdir(root / "log")
    assert find_root("rq", [], {}) == (str(root), [])


@pytest.mark.parametrize("how", ["option", "option=", "env"])
def test_find_root_given_root_without_config(tmp_path: Path, how: str) -> None:
    argv = {"option": ["--root", str(tmp_path)], "option=": [f"--root={tmp_path}"],
            "env": []}[how]
    env = {"RQ_ROOT": str(tmp_path)} if how == "env" else {}
    with pytest.raises(RootError) as exc:
        find_root("rq-mgr", argv, env, cwd=str(write_root(tmp_path / "other", MAIN)))
    assert str(exc.value) == (
        f"rq-mgr: not an RQ root: {tmp_path} (missing config/config.json)")


def test_find_root_none_found(tmp_path: Path) -> None:
    with pytest.raises(RootError) as exc:
        find_root("rq", ["status"], {"RQ_ROOT": ""}, cwd=str(tmp_path))
    assert str(exc.value) == (
        "rq: no RQ root found (use --root, set RQ_ROOT, or run inside an RQ root)")
    assert exc.value.exit_code == 1


def test_find_root_option_without_value(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        find_root("rq", ["status", "--root"], {}, cwd=str(tmp_path))


# ---------------------------------------------------------------- S1.4 main config


def test_main_config_defaults(tmp_path: Path) -> None:
    cfg = load_main_config(str(write_root(tmp_path, MAIN)))
    assert cfg == MainConfig(root=str(tmp_path), env="test", host="127.0.0.1", port=3333,
                             addr="0.0.0.0", tmpdir=None, allow_new_queue=False,
                             relative_root="/", basic_auth=None, allowed_ips=None,
                             session_secret=None, csrf_trusted_origins=(),
                             event_retention_days=30)
    assert cfg.host_port == "http://127.0.0.1:3333"
    assert cfg.base_url == "http://127.0.0.1:3333/"


def test_main_config_all_keys(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    cfg = load_main_config(str(write_root(tmp_path, {
        **MAIN, "port": "8080", "tmpdir": str(tmp_path / "tmp"), "allow_new_queue": "yes",
        "relative_root": "/therq", "basic_auth": {"realm": "R", "users": {"u": "p"}},
        "allowed_ips": ["10.0."], "session_secret": "s3",
        "csrf_trusted_origins": ["http://a:1"], "event_retention_days": 0, "other": 1,
    })))
    assert (cfg.port, cfg.tmpdir, cfg.allow_new_queue) == (8080, str(tmp_path / "tmp"), True)
    assert cfg.base_url == "http://127.0.0.1:8080/therq/"
    assert cfg.basic_auth is not None and cfg.basic_auth["users"] == {"u": "p"}
    assert cfg.allowed_ips == ("10.0.",)
    assert cfg.session_secret == "s3"
    assert cfg.csrf_trusted_origins == ("http://a:1",)
    assert cfg.event_retention_days == 0
    assert (cfg.default_queue, cfg.push_max_bytes) == (None, 64 * 1024 ** 2)  # issue 18
    cfg2 = load_main_config(str(write_root(tmp_path, {
        **MAIN, "default_queue": "jobs", "push_max_bytes": "1024"})))
    assert (cfg2.default_queue, cfg2.push_max_bytes) == ("jobs", 1024)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.basic_auth["realm"] = "x"  # type: ignore[index]


@pytest.mark.parametrize("given, root", [
    ("/", "/"), ("/therq", "/therq/"), ("/therq/", "/therq/"), ("/therq///", "/therq/"),
    ("//", "/"), ("/a/b", "/a/b/"),
])
def test_main_config_relative_root(tmp_path: Path, given: str, root: str) -> None:
    cfg = load_main_config(str(write_root(tmp_path, {**MAIN, "relative_root": given})))
    assert cfg.relative_root == root


def test_main_config_relative_tmpdir_is_under_root(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    cfg = load_main_config(str(write_root(tmp_path, {**MAIN, "tmpdir": "tmp"})))
    assert cfg.tmpdir == str(tmp_path / "tmp")


@pytest.mark.parametrize("change, reason", [
    ({"env": None}, 'missing required key "env"'),
    ({"host": None}, 'missing required key "host"'),
    ({"port": None}, 'missing required key "port"'),
    ({"addr": None}, 'missing required key "addr"'),
    ({"host": 5}, "host must be a non-empty string"),
    ({"host": ""}, "host must be a non-empty string"),
    ({"env": []}, "env must be a string"),
    ({"port": 0}, "port must be an integer 1..65535"),
    ({"port": 65536}, "port must be an integer 1..65535"),
    ({"port": "33x"}, "port must be an integer 1..65535"),
    ({"port": True}, "port must be an integer 1..65535"),
    ({"port": 33.5}, "port must be an integer 1..65535"),
    ({"relative_root": "therq"}, "relative_root must start with /"),
    ({"relative_root": ""}, "relative_root must start with /"),
    ({"tmpdir": "/no/such/dir"}, "tmpdir /no/such/dir is not a writable directory"),
    ({"tmpdir": 5}, "tmpdir 5 is not a writable directory"),
    ({"basic_auth": {"realm": "r"}},
     'basic_auth must be {"realm": STRING, "users": {USER: PASSWORD, ...}}'),
    ({"allowed_ips": "10.0."}, "allowed_ips must be an array of strings"),
    ({"csrf_trusted_origins": [1]}, "csrf_trusted_origins must be an array of strings"),
    ({"session_secret": 12}, "session_secret must be a string"),
    ({"event_retention_days": -1}, "event_retention_days must be an integer >= 0"),
    ({"default_queue": "a/b"}, "default_queue must be a queue name"),    # issue 18
    ({"default_queue": 5}, "default_queue must be a queue name"),
    ({"push_max_bytes": 0}, "push_max_bytes must be an integer >= 1"),
    ({"push_max_bytes": "x"}, "push_max_bytes must be an integer >= 1"),
])
def test_main_config_invalid(tmp_path: Path, change: dict[str, Any], reason: str) -> None:
    data = {**MAIN, **change}
    data = {k: v for k, v in data.items() if not (k in MAIN and v is None)}
    with pytest.raises(ConfigError) as exc:
        load_main_config(str(write_root(tmp_path, data)))
    assert str(exc.value) == reason


def test_main_config_tmpdir_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"^tmpdir .*/f is not a writable directory$"):
        load_main_config(str(write_root(tmp_path, {**MAIN, "tmpdir": str(tmp_path / "f")})))


@pytest.mark.parametrize("text, reason", [
    ("{", r"^invalid JSON: "), ("[1]", r"^not a JSON object$"), ("", r"^invalid JSON: "),
])
def test_main_config_unparsable(tmp_path: Path, text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        load_main_config(str(write_root(tmp_path, text)))


def test_main_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^cannot read file: "):
        load_main_config(str(tmp_path))


# ---------------------------------------------------------------- S3.3 queue config

NORMALISED_DEFAULTS = {
    "name": "test", "script": "./s.sh", "num_workers": 1, "exec_prefix": "bash -lc",
    "env_vars": {}, "coalesce_params": [], "blocking_params": [], "schedule": [],
    "timeout": 0, "kill_grace": 10, "mode": "script", "topic": "test", "lease_timeout": 300,
}


def normalised(**given: Any) -> dict[str, Any]:
    cfg, warnings = validate_queue_config({"name": "test", "script": "./s.sh", **given})
    assert warnings == []
    return cfg.normalised()


def test_queue_config_defaults() -> None:
    assert normalised() == NORMALISED_DEFAULTS
    assert normalised(exec_prefix=None, env_vars=None, schedule=None) == NORMALISED_DEFAULTS


@pytest.mark.parametrize("given, key, value", [
    ({"num_workers": 4}, "num_workers", 4),
    ({"num_workers": "128"}, "num_workers", 128),
    ({"num_workers": 2.0}, "num_workers", 2),
    ({"num_workers": None}, "num_workers", 1),
    ({"exec_prefix": ""}, "exec_prefix", ""),
    ({"exec_prefix": "python3"}, "exec_prefix", "python3"),
    ({"env_vars": {"A": "1", "RQ_ENV": "x", "N": 5}}, "env_vars", {"A": "1"}),
    ({"env_vars": ["A=1"]}, "env_vars", {}),
    ({"env_vars": "A=1"}, "env_vars", {}),
    ({"coalesce_params": [3, "1", 1, 9, "x"]}, "coalesce_params", [1, 3]),
    ({"coalesce_params": "1"}, "coalesce_params", []),
    ({"coalesce": True, "coalesce_param1": "yes", "coalesce_param3": 1,
      "coalesce_param4": "no"}, "coalesce_params", [1, 3]),
    ({"coalesce": "false", "coalesce_param1": True}, "coalesce_params", []),
    ({"coalesce_params": [2], "coalesce": True, "coalesce_param1": True},
     "coalesce_params", [2]),
    ({"blocking_params": ["4", 2, 2]}, "blocking_params", [2, 4]),
    ({"timeout": 30}, "timeout", 30),
    ({"timeout": 30.0}, "timeout", 30),
    ({"timeout": 0.5}, "timeout", 0.5),
    ({"timeout": "45"}, "timeout", 45),
    ({"kill_grace": 0}, "kill_grace", 0),
    ({"kill_grace": 3600}, "kill_grace", 3600),
    ({"kill_grace": 2.5}, "kill_grace", 2.5),
    ({"mode": "pull"}, "mode", "pull"),
    ({"mode": None}, "mode", "script"),
    ({"topic": "video.encode"}, "topic", "video.encode"),
    ({"topic": None}, "topic", "test"),
    ({"lease_timeout": 1}, "lease_timeout", 1),
    ({"lease_timeout": "86400"}, "lease_timeout", 86400),
    ({"schedule": [{"cron": "*/5 * * * *", "param1": "a", "x": [1]}]}, "schedule",
     [{"cron": "*/5 * * * *", "param1": "a", "x": [1]}]),
])
def test_queue_config_normalisation(given: dict[str, Any], key: str, value: object) -> None:
    """S3.3: defaults applied, numbers as integers where integral, sorted param lists."""
    got = normalised(**given)
    assert got[key] == value
    assert type(got[key]) is type(value)
    assert set(got) == set(NORMALISED_DEFAULTS)


def test_queue_config_pull_mode_needs_no_script() -> None:
    cfg, _ = validate_queue_config({"name": "p", "mode": "pull"})
    assert (cfg.script, cfg.mode, cfg.topic) == (None, "pull", "p")


def test_queue_config_is_read_only() -> None:
    cfg, _ = validate_queue_config({"name": "test", "script": "s", "env_vars": {"A": "1"},
                                    "schedule": [{"cron": "@daily"}]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_workers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.env_vars["B"] = "2"  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.schedule[0]["cron"] = "@hourly"  # type: ignore[index]
    out = cfg.normalised()
    out["env_vars"]["B"] = "2"
    out["schedule"][0]["cron"] = "@hourly"
    assert cfg.normalised()["env_vars"] == {"A": "1"}
    assert cfg.normalised()["schedule"] == [{"cron": "@daily"}]
    assert isinstance(cfg, QueueConfig)


def test_queue_config_input_not_kept() -> None:
    data = {"name": "test", "script": "s", "schedule": [{"cron": "@daily"}]}
    cfg, _ = validate_queue_config(data)
    data["schedule"][0]["cron"] = "@hourly"  # type: ignore[index]
    assert cfg.schedule[0]["cron"] == "@daily"


def test_normalised_round_trips() -> None:
    """create_queue writes the normalised config; it must read back the same (S3.3)."""
    first = normalised(coalesce=True, coalesce_param2=True, timeout="7",
                       schedule=[{"cron": "0 3 * * mon", "tz": "Europe/Paris", "id": "x"}])
    again, _ = validate_queue_config(json.loads(json.dumps(first)))
    assert again.normalised() == first


# ---------------------------------------------------------------- S3.4 validation

NUM_WORKERS = "json config has invalid num_workers field (out of range 1..128)"


@pytest.mark.parametrize("data, reason", [
    ({"script": "s"}, "json config is missing name field"),
    (["name"], "json config is missing name field"),
    ({"name": 5, "script": "s"}, "json config has invalid name (not String)"),
    ({"name": None, "script": "s"}, "json config has invalid name (not String)"),
    ({"name": "", "script": "s"}, "json config has invalid name (size)"),
    ({"name": "x" * 129, "script": "s"}, "json config has invalid name (size)"),
    ({"name": "é" * 65, "script": "s"}, "json config has invalid name (size)"),
    ({"name": "a.b", "script": "s"}, "queue name has invalid characters"),
    ({"name": "a b", "script": "s"}, "queue name has invalid characters"),
    ({"name": "a/b", "script": "s"}, "queue name has invalid characters"),
    ({"name": "a\tb", "script": "s"}, "queue name has invalid characters"),
    ({"name": "t", "script": "s", "num_workers": 0}, NUM_WORKERS),
    ({"name": "t", "script": "s", "num_workers": 129}, NUM_WORKERS),
    ({"name": "t", "script": "s", "num_workers": "0"}, NUM_WORKERS),
    ({"name": "t", "script": "s", "num_workers": "two"}, NUM_WORKERS),
    ({"name": "t", "script": "s", "num_workers": " 2"}, NUM_WORKERS),
    ({"name": "t", "script": "s", "num_workers": True}, NUM_WORKERS),
    ({"name": "t", "script": "s", "num_workers": 1.5}, NUM_WORKERS),
    ({"name": "t", "script": "s", "num_workers": -1}, NUM_WORKERS),
    ({"name": "t"}, "json config is missing script field"),
    ({"name": "t", "script": None}, "json config is missing script field"),
    ({"name": "t", "script": ""}, "json config has invalid script (size)"),
    ({"name": "t", "script": "s" * 1025}, "json config has invalid script (size)"),
    ({"name": "t", "script": ["s"]}, "json config has invalid script (size)"),
    ({"name": "t", "script": "s", "timeout": -1}, "json config has invalid timeout field"),
    ({"name": "t", "script": "s", "timeout": "soon"}, "json config has invalid timeout field"),
    ({"name": "t", "script": "s", "timeout": True}, "json config has invalid timeout field"),
    ({"name": "t", "script": "s", "timeout": float("nan")},
     "json config has invalid timeout field"),
    ({"name": "t", "script": "s", "timeout": float("inf")},
     "json config has invalid timeout field"),
    ({"name": "t", "script": "s", "kill_grace": 3601},
     "json config has invalid kill_grace field"),
    ({"name": "t", "script": "s", "kill_grace": -0.1},
     "json config has invalid kill_grace field"),
    ({"name": "t", "script": "s", "kill_grace": False},
     "json config has invalid kill_grace field"),
    ({"name": "t", "script": "s", "mode": "push"}, "json config has invalid mode field"),
    ({"name": "t", "script": "s", "mode": "Pull"}, "json config has invalid mode field"),
    ({"name": "t", "script": "s", "topic": ""}, "json config has invalid topic field"),
    ({"name": "t", "script": "s", "topic": "a..b"}, "json config has invalid topic field"),
    ({"name": "t", "script": "s", "topic": "a.*"}, "json config has invalid topic field"),
    ({"name": "t", "script": "s", "topic": 5}, "json config has invalid topic field"),
    ({"name": "t", "script": "s", "lease_timeout": 0},
     "json config has invalid lease_timeout field"),
    ({"name": "t", "script": "s", "lease_timeout": 86401},
     "json config has invalid lease_timeout field"),
    ({"name": "t", "script": "s", "lease_timeout": 1.5},
     "json config has invalid lease_timeout field"),
    ({"name": "t", "script": "s", "schedule": "@daily"},
     "json config has invalid schedule field"),
    # several problems: the first in S3.4 order is reported
    ({"name": "t", "num_workers": 0}, NUM_WORKERS),
    ({"name": "t", "timeout": -1}, "json config is missing script field"),
    ({"name": "t", "mode": "bad"}, "json config is missing script field"),
])
def test_queue_config_invalid(data: object, reason: str) -> None:
    with pytest.raises(ConfigError) as exc:
        validate_queue_config(data)
    assert str(exc.value) == reason


@pytest.mark.parametrize("dirname, ok", [(None, True), ("test", True), ("other", False)])
def test_queue_config_name_must_match_directory(dirname: str | None, ok: bool) -> None:
    data = {"name": "test", "script": "s"}
    if ok:
        assert validate_queue_config(data, dirname=dirname)[0].name == "test"
        return
    with pytest.raises(ConfigError) as exc:
        validate_queue_config(data, dirname=dirname)
    assert str(exc.value) == "json config has invalid name (does not match queue directory)"


@pytest.mark.parametrize("topic, ok", [
    ("video", True), ("video.encode", True), ("a.b.c", True), ("x" * 255, True),
    ("é" * 127, True), ("x" * 200 + "." + "y" * 54, True),
    ("x" * 256, False), ("é" * 128, False), ("", False), (".a", False), ("a.", False),
    ("a..b", False), ("a b", False), ("a/b", False), ("#", False), ("a.*", False),
    (None, False),
])
def test_valid_topic(topic: object, ok: bool) -> None:
    """S8.1: dot-separated S3.1 segments, 1..255 bytes."""
    assert valid_topic(topic) is ok


# ---------------------------------------------------------------- S9.1 schedule entries


@pytest.mark.parametrize("entry", [
    {"cron": "* * * * *"},
    {"cron": "*/5 1-3 * jan-dec sun-sat"},
    {"cron": "0 0 * * 7"},
    {"cron": "0 0 1,15 * MON"},
    {"cron": "0-30/10 */2 * * 1-5"},
    {"cron": "0 0 31 2 1"},  # day of month never matches, but day of week does
    {"cron": "@yearly"}, {"cron": "@annually"}, {"cron": "@monthly"}, {"cron": "@weekly"},
    {"cron": "@daily"}, {"cron": "@midnight"}, {"cron": "@hourly"},
    {"cron": "@daily", "tz": "America/New_York", "catch_up": True, "id": "nightly",
     "param1": "a", "param2": "", "param3": None, "param4": "d"},
    {"cron": "@daily", "tz": "UTC", "catch_up": False},
])
def test_schedule_entry_valid(entry: dict[str, Any]) -> None:
    cfg, warnings = validate_queue_config({"name": "t", "script": "s", "schedule": [entry]})
    assert warnings == []
    assert cfg.normalised()["schedule"] == [entry]


@pytest.mark.parametrize("entry, problem", [
    ("@daily", "not an object"),
    ({}, "missing cron"),
    ({"tz": "UTC"}, "missing cron"),
    ({"cron": ""}, 'invalid cron ""'),
    ({"cron": 5}, "invalid cron 5"),
    ({"cron": "* * * *"}, 'invalid cron "* * * *"'),
    ({"cron": "* * * * * *"}, 'invalid cron "* * * * * *"'),
    ({"cron": "61 * * * *"}, 'invalid cron "61 * * * *"'),
    ({"cron": "* * * * 8"}, 'invalid cron "* * * * 8"'),
    ({"cron": "0 0 31 2 *"}, 'invalid cron "0 0 31 2 *"'),
    ({"cron": "0 0 L * *"}, 'invalid cron "0 0 L * *"'),
    ({"cron": "0 0 ? * *"}, 'invalid cron "0 0 ? * *"'),
    ({"cron": "0 0 * * mon#2"}, 'invalid cron "0 0 * * mon#2"'),
    ({"cron": "@reboot"}, 'invalid cron "@reboot"'),
    ({"cron": "@daily", "tz": "Mars/Olympus"}, 'invalid tz "Mars/Olympus"'),
    ({"cron": "@daily", "tz": "../etc/passwd"}, 'invalid tz "../etc/passwd"'),
    ({"cron": "@daily", "tz": ""}, 'invalid tz ""'),
    ({"cron": "@daily", "tz": 1}, "invalid tz 1"),
    ({"cron": "@daily", "catch_up": "yes"}, "catch_up must be a boolean"),
    ({"cron": "@daily", "catch_up": 1}, "catch_up must be a boolean"),
    ({"cron": "@daily", "id": 7}, "id must be a string"),
    ({"cron": "@daily", "param2": 7}, "param2 must be a string"),
])
def test_schedule_entry_invalid(entry: object, problem: str) -> None:
    """S3.4: `json config has invalid schedule entry <i>: <reason>`, i 0-based."""
    data = {"name": "t", "script": "s", "schedule": [{"cron": "@hourly"}, entry]}
    with pytest.raises(ConfigError) as exc:
        validate_queue_config(data)
    assert str(exc.value) == f"json config has invalid schedule entry 1: {problem}"
    cfg, warnings = validate_queue_config(data, lenient_schedule=True)
    assert cfg.normalised()["schedule"] == [{"cron": "@hourly"}]
    assert warnings == [f"json config has invalid schedule entry 1: {problem}"]


def test_schedule_lenient_keeps_other_errors_fatal() -> None:
    with pytest.raises(ConfigError, match="num_workers"):
        validate_queue_config({"name": "t", "script": "s", "num_workers": 0,
                               "schedule": [{}]}, lenient_schedule=True)


def test_schedule_not_a_list_lenient() -> None:
    cfg, warnings = validate_queue_config({"name": "t", "script": "s", "schedule": {}},
                                          lenient_schedule=True)
    assert cfg.schedule == ()
    assert warnings == ["json config has invalid schedule field"]


# ---------------------------------------------------------------- load_queue_config


def write_queue_config(root: Path, name: str, data: object) -> Path:
    qdir = root / "queue" / name
    qdir.mkdir(parents=True)
    path = qdir / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_load_queue_config(tmp_path: Path) -> None:
    write_queue_config(tmp_path, "test", {"name": "test", "script": "s",
                                          "schedule": [{"cron": "@daily"}, {"cron": "bad"}]})
    cfg, warnings = load_queue_config(str(tmp_path), "test")
    assert cfg.name == "test"
    assert [dict(e) for e in cfg.schedule] == [{"cron": "@daily"}]
    assert warnings == ['json config has invalid schedule entry 1: invalid cron "bad"']
    with pytest.raises(ConfigError, match="invalid schedule entry 1"):
        load_queue_config(str(tmp_path), "test", lenient_schedule=False)


def test_load_queue_config_follows_link(tmp_path: Path) -> None:
    """S3.7 create_queue_link: config.json may be a symlink."""
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"name": "linked", "script": "s"}))
    (tmp_path / "queue" / "linked").mkdir(parents=True)
    os.symlink(real, tmp_path / "queue" / "linked" / "config.json")
    assert load_queue_config(str(tmp_path), "linked")[0].name == "linked"


@pytest.mark.parametrize("data, reason", [
    ({"name": "other", "script": "s"},
     r"^json config has invalid name \(does not match queue directory\)$"),
    ("{not json", r"^could not read queue config \[ .*/queue/test/config\.json \]: "),
])
def test_load_queue_config_invalid(tmp_path: Path, data: object, reason: str) -> None:
    write_queue_config(tmp_path, "test", data)
    with pytest.raises(ConfigError, match=reason):
        load_queue_config(str(tmp_path), "test")


def test_load_queue_config_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^could not read queue config \[ .* \]: "):
        load_queue_config(str(tmp_path), "nope")
