"""rq-install (SPEC S20, S1.1, S3.3, S3.8) run as a real program from the checkout's bin/."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RQ_INSTALL = REPO / "bin" / "rq-install"
BUILTINS = ("relay", "webhook", "cleaner", "analytics")
STATES = ("prep", "que", "run", "done", "relayed", "err")
QUEUE_KEYS = ["name", "script", "num_workers", "exec_prefix", "env_vars", "coalesce_params",
              "blocking_params", "schedule", "timeout", "kill_grace", "mode", "topic",
              "lease_timeout"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RQ_ROOT"}
    env.update(extra)
    return env


def install(*args: str, cwd: Path, env: dict[str, str] | None = None,
            program: Path | str = RQ_INSTALL) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(program), *args], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=60)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def created_lines(root: Path, verb: str = "Created") -> str:
    return "".join(f"{verb} queue {q}\n" for q in BUILTINS) + f"RQ installed in {root}\n"


def test_fresh_install_in_cwd_lays_out_the_root(tmp_path: Path) -> None:
    res = install(cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == created_lines(tmp_path)
    config = load(tmp_path / "config" / "config.json")
    assert config == {"env": "development", "host": socket.getfqdn() or "localhost",
                      "port": 3333, "addr": "127.0.0.1", "tmpdir": "/tmp",
                      "allow_new_queue": True}
    for sub in ("config", "queue", "scandir", "timers", "log", "log/events"):
        assert (tmp_path / sub).is_dir(), sub


def test_builtin_queues_get_a_normalised_config(tmp_path: Path) -> None:
    assert install(cwd=tmp_path).returncode == 0
    for name in BUILTINS:
        qdir = tmp_path / "queue" / name
        assert all((qdir / s).is_dir() for s in STATES)
        config = load(qdir / "config.json")
        assert list(config) == QUEUE_KEYS
        assert config == {
            "name": name, "script": config["script"], "num_workers": 1,
            "exec_prefix": config["exec_prefix"], "env_vars": {}, "coalesce_params": [],
            "blocking_params": [], "schedule": [], "timeout": 0, "kill_grace": 10,
            "mode": "script", "topic": name, "lease_timeout": 300}
        script = Path(config["script"])
        assert script.is_absolute() and script.is_file()
        assert script.resolve() == (REPO / "rq" / "builtin" / f"{name}.py").resolve()
        # S20: run with the interpreter RQ runs under (an absolute python path).
        prefix = Path(config["exec_prefix"])
        assert prefix.is_absolute() and os.access(prefix, os.X_OK)
        assert "python" in prefix.name
        # S20: no process was started, so no queue process left its pid or socket behind.
        assert not (qdir / "queue.pid").exists() and not (qdir / "queue.sock").exists()


def test_builtin_scripts_are_executable_python(tmp_path: Path) -> None:
    for name in BUILTINS:
        script = REPO / "rq" / "builtin" / f"{name}.py"
        assert script.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"
        assert script.read_text().startswith("#!/usr/bin/env python3\n")


def test_target_is_root_flag_then_rq_root_then_cwd(tmp_path: Path) -> None:
    flag, env_root, cwd = tmp_path / "flag", tmp_path / "env", tmp_path / "cwd"
    cwd.mkdir()
    res = install("--root", str(flag), cwd=cwd, env=clean_env(RQ_ROOT=str(env_root)))
    assert res.returncode == 0 and res.stdout.endswith(f"RQ installed in {flag}\n")
    res = install(cwd=cwd, env=clean_env(RQ_ROOT=str(env_root)))
    assert res.returncode == 0 and res.stdout.endswith(f"RQ installed in {env_root}\n")
    res = install(cwd=cwd)
    assert res.returncode == 0 and res.stdout.endswith(f"RQ installed in {cwd}\n")
    # A relative --root (=form) is made absolute against the current directory.
    res = install("--root=rel/dir", cwd=cwd)
    assert res.stdout.endswith(f"RQ installed in {cwd / 'rel' / 'dir'}\n")
    assert (cwd / "rel" / "dir" / "config" / "config.json").is_file()


@pytest.mark.parametrize("style", ["space", "equals"])
def test_flags_in_both_forms(tmp_path: Path, style: str) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    values = {"env": "production", "host": "rq.example.com", "port": "4444",
              "addr": "127.0.0.1", "tmpdir": str(tmpdir)}
    args: list[str] = []
    for key, value in values.items():
        args += [f"--{key}", value] if style == "space" else [f"--{key}={value}"]
    res = install(*args, "--no-allow-new-queue", "--root", str(tmp_path / "r"), cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert load(tmp_path / "r" / "config" / "config.json") == {
        "env": "production", "host": "rq.example.com", "port": 4444, "addr": "127.0.0.1",
        "tmpdir": str(tmpdir), "allow_new_queue": False}


def test_allow_new_queue_last_flag_wins(tmp_path: Path) -> None:
    res = install("--no-allow-new-queue", "--allow-new-queue", cwd=tmp_path)
    assert res.returncode == 0
    assert load(tmp_path / "config" / "config.json")["allow_new_queue"] is True


def test_already_installed_without_force(tmp_path: Path) -> None:
    assert install(cwd=tmp_path).returncode == 0
    before = (tmp_path / "config" / "config.json").read_text()
    res = install("--port", "5555", cwd=tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (1, "", "Already installed\n")
    assert (tmp_path / "config" / "config.json").read_text() == before


def test_force_updates_configs_and_keeps_messages(tmp_path: Path) -> None:
    assert install(cwd=tmp_path).returncode == 0
    relay = tmp_path / "queue" / "relay"
    msg_dirs = [relay / "que" / "20240101.0000.00.000.1",
                relay / "done" / "20240101" / "00" / "00" / "20240101.0000.00.000.2",
                tmp_path / "queue" / "cleaner" / "err" / "20240101.0000.00.000.3"]
    for d in msg_dirs:
        d.mkdir(parents=True)
        (d / "msg").write_text('{"dest": "x"}')
    (relay / "config.json").write_text('{"name": "relay", "script": "/bin/true"}')
    main_config = tmp_path / "config" / "config.json"
    config = load(main_config)
    config["basic_auth"] = {"realm": "rq", "users": {"u": "p"}}
    main_config.write_text(json.dumps(config))

    res = install("--force", "--port=4000", cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == created_lines(tmp_path, "Updated")
    assert all((d / "msg").read_text() == '{"dest": "x"}' for d in msg_dirs)
    assert list(load(relay / "config.json")) == QUEUE_KEYS
    config = load(main_config)
    assert config["port"] == 4000
    # Keys an operator added (S1.4 optional ones) survive a forced re-install.
    assert config["basic_auth"] == {"realm": "rq", "users": {"u": "p"}}


def test_force_on_a_fresh_directory_creates(tmp_path: Path) -> None:
    res = install("--force", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == created_lines(tmp_path)


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_tmpdir_not_a_writable_directory(tmp_path: Path, kind: str) -> None:
    bad = tmp_path / "nope"
    if kind == "file":
        bad.write_text("")
    res = install("--tmpdir", str(bad), "--root", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"rq-install: tmpdir {bad} is not a writable directory\n"
    assert not (tmp_path / "r" / "config" / "config.json").exists()


@pytest.mark.parametrize("args", [
    ["--port", "0"], ["--port", "65536"], ["--port=abc"], ["--port", "-1"], ["--port"],
    ["--bogus"], ["--env="], ["stray"], ["--force=yes"],
])
def test_bad_flags_one_line_on_stderr_exit_1(tmp_path: Path, args: list[str]) -> None:
    res = install(*args, "--root", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("rq-install: ")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "r" / "config" / "config.json").exists()


def test_port_limits_accepted(tmp_path: Path) -> None:
    for port in ("1", "65535"):
        res = install("--port", port, "--root", str(tmp_path / port), cwd=tmp_path)
        assert res.returncode == 0
        assert load(tmp_path / port / "config" / "config.json")["port"] == int(port)


def test_help_goes_to_stdout(tmp_path: Path) -> None:
    res = install("--help", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("usage: rq-install")
    assert not (tmp_path / "config").exists()


def test_console_script_behaves_like_the_wrapper(tmp_path: Path) -> None:
    console = Path(sys.executable).parent / "rq-install"
    if not console.exists():
        console = Path(shutil.which("rq-install") or "")
    if not console.is_file():
        pytest.skip("rq-install console script not installed (run scripts/bootstrap)")
    for name, program in (("a", RQ_INSTALL), ("b", console)):
        (tmp_path / name).mkdir()
        res = install(cwd=tmp_path / name, program=program)
        assert res.stdout == created_lines(tmp_path / name)
        again = install(cwd=tmp_path / name, program=program)
        assert (again.returncode, again.stderr) == (1, "Already installed\n")
    strip = {"script", "exec_prefix"}  # the interpreter path may differ between the two
    for q in BUILTINS:
        a, b = (load(tmp_path / n / "queue" / q / "config.json") for n in "ab")
        assert {k: v for k, v in a.items() if k not in strip} == \
               {k: v for k, v in b.items() if k not in strip}


def test_repo_config_dir_is_not_a_root() -> None:
    # S1.1: a fresh checkout must never be mistaken for an installed root.
    assert not (REPO / "config" / "config.json").exists()
    example = json.loads((REPO / "config" / "config.json.example").read_text())
    assert {"env", "host", "port", "addr"} <= set(example)
