"""`rq-install`: turn a directory into an RQ root (SPEC S20).

Owns the first-time layout of a root (S1.3): `config/config.json`, the spool directories and the
builtin queues `relay`, `webhook`, `cleaner` (S3.8, S12) and `analytics` (issue 5).  It only
writes files: it starts no process (fix: the original forked throwaway queue processes), so it
is safe to run while nothing else of RQ exists yet.  It depends on nothing of rq but `errors`, so
it works from any checkout.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rq.errors import UsageError

PROG = "rq-install"
BUILTIN_QUEUES = ("relay", "webhook", "cleaner", "analytics")  # analytics: issue 5
STATE_DIRS = ("prep", "que", "run", "done", "relayed", "err")
ROOT_DIRS = ("config", "queue", "scandir", "timers", "log", os.path.join("log", "events"))
VALUE_FLAGS = ("env", "host", "port", "addr", "tmpdir", "root")
USAGE = (
    f"usage: {PROG} [--root PATH] [--env ENV] [--host HOST] [--port PORT] [--addr ADDR]\n"
    "                  [--tmpdir DIR] [--allow-new-queue | --no-allow-new-queue] [--force]\n"
    f"       {PROG} [--root PATH] --systemd   (print a systemd unit running rq-mgr for it)\n"
)
# S6.1: an exec_prefix containing any of these (or whitespace inside the path) would be run
# through /bin/sh -c or split wrongly, so an interpreter path with them is not used as prefix.
SHELL_SPECIALS = set("*?{}[]<>()~&|\\$;'`\"#=%")


@dataclass(frozen=True)
class Options:
    root: str
    env: str
    host: str
    port: int
    addr: str
    tmpdir: str
    allow_new_queue: bool
    force: bool


def parse_flags(argv: Sequence[str]) -> dict[str, str | bool]:
    """Split `--k v` / `--k=v` flags (S20) into a dict; raise UsageError on anything else."""
    flags: dict[str, str | bool] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--"):
            raise UsageError(f"{PROG}: unexpected argument: {arg}")
        name, eq, value = arg[2:].partition("=")
        if name in VALUE_FLAGS:
            if not eq:
                if not args:
                    raise UsageError(f"{PROG}: option --{name} needs a value")
                value = args.pop(0)
            flags[name] = value
        elif name in ("force", "allow-new-queue", "no-allow-new-queue", "systemd") and not eq:
            flags[name] = True
        else:
            raise UsageError(f"{PROG}: unknown option: {arg}")
    return flags


def default_host() -> str:
    """The machine's fully qualified name, else `localhost` (S20)."""
    try:
        name = socket.getfqdn()
    except OSError:
        name = ""
    return name or "localhost"


def parse_port(value: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", value) or not 1 <= int(value) <= 65535:
        raise UsageError(f"{PROG}: invalid port: {value} (must be an integer 1..65535)")
    return int(value)


def build_options(argv: Sequence[str], env: dict[str, str], cwd: str) -> Options:
    """Apply S20's defaults and checks; the target is --root > RQ_ROOT > cwd."""
    flags = parse_flags(argv)
    root = str(flags.get("root") or env.get("RQ_ROOT") or cwd)
    for name in ("env", "host", "addr", "tmpdir", "root"):
        if flags.get(name) == "":
            raise UsageError(f"{PROG}: option --{name} needs a non-empty value")
    tmpdir = os.path.abspath(str(flags.get("tmpdir", "/tmp")))
    if not (os.path.isdir(tmpdir) and os.access(tmpdir, os.W_OK | os.X_OK)):
        raise UsageError(f"{PROG}: tmpdir {tmpdir} is not a writable directory")
    return Options(
        root=os.path.abspath(os.path.join(cwd, root)),
        env=str(flags.get("env", "development")),
        host=str(flags.get("host") or default_host()),
        port=parse_port(str(flags.get("port", "3333"))),
        addr=str(flags.get("addr", "127.0.0.1")),  # S20; D5: never every address by default
        tmpdir=tmpdir,
        # Allowed by default; the last of the two flags given wins.
        allow_new_queue=not _last_wins_no(argv),
        force=bool(flags.get("force")),
    )


def _last_wins_no(argv: Sequence[str]) -> bool:
    seen = [a for a in argv if a in ("--allow-new-queue", "--no-allow-new-queue")]
    return bool(seen) and seen[-1] == "--no-allow-new-queue"


def write_json_atomic(path: str, data: object) -> None:
    """S0.3.1: temp file in the same directory, fsync, rename over the target, fsync the dir."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; other RQ users (web, operators) read it
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def main_config(opts: Options, existing: dict[str, Any]) -> dict[str, Any]:
    """S20's six keys; with --force, other keys an operator added (basic_auth, …) are kept."""
    config = dict(existing)
    config.update(env=opts.env, host=opts.host, port=opts.port, addr=opts.addr,
                  tmpdir=opts.tmpdir, allow_new_queue=opts.allow_new_queue)
    return config


def builtin_script(name: str) -> str:
    """Absolute path of the packaged builtin queue script rq/builtin/<name>.py (S12)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin", f"{name}.py")


def interpreter_prefix() -> str:
    """exec_prefix that runs a builtin with the interpreter (and so the venv) RQ runs under.

    sys.executable is deliberately not resolved: a venv's python is a symlink, and resolving it
    would lose the venv's packages.  A path S6.1 could not pass as a plain prefix falls back to
    "" (the builtin scripts are executable with a python3 shebang).
    """
    exe = os.path.abspath(sys.executable) if sys.executable else ""
    if not exe or any(c.isspace() or c in SHELL_SPECIALS for c in exe):
        return ""
    return exe


def builtin_queue_config(name: str) -> dict[str, Any]:
    """The normalised S3.3 config of a builtin queue, keys in the table's order."""
    return {
        "name": name,
        "script": builtin_script(name),
        "num_workers": 1,
        "exec_prefix": interpreter_prefix(),
        "env_vars": {},
        "coalesce_params": [],
        "blocking_params": [],
        "schedule": [],
        "timeout": 0,
        "kill_grace": 10,
        "mode": "script",
        "topic": name,
        "lease_timeout": 300,
    }


def install_queue(root: str, name: str) -> str:
    """Create or refresh one builtin queue, keeping its messages; return the line to print."""
    qdir = os.path.join(root, "queue", name)
    config_path = os.path.join(qdir, "config.json")
    existed = os.path.lexists(config_path)
    for state in STATE_DIRS:
        os.makedirs(os.path.join(qdir, state), exist_ok=True)
    write_json_atomic(config_path, builtin_queue_config(name))
    return f"{'Updated' if existed else 'Created'} queue {name}"


def read_existing(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def install(opts: Options) -> list[str]:
    """Lay out the root; return the lines to print.  Raises UsageError or OSError."""
    config_path = os.path.join(opts.root, "config", "config.json")
    if os.path.lexists(config_path) and not opts.force:
        raise UsageError("Already installed")
    for sub in ROOT_DIRS:
        os.makedirs(os.path.join(opts.root, sub), exist_ok=True)
    lines = [install_queue(opts.root, name) for name in BUILTIN_QUEUES]
    # config.json marks a finished root (S1.1, S1.2), so it is written last: an install that
    # failed half-way is not "Already installed" and can simply be run again.
    write_json_atomic(config_path, main_config(opts, read_existing(config_path)))
    lines.append(f"RQ installed in {opts.root}")
    return lines


def systemd_unit(root: str) -> str:
    """The packaged rq-mgr unit (rq/mgr/rq-mgr.service, also config/rq-mgr.service; issue
    16 item 7) for `root`: ExecStart runs the rq-mgr installed beside this Python (else
    the one on PATH) on `root`, as the user and group that own it (else ours)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mgr",
                           "rq-mgr.service"), encoding="utf-8") as f:
        text = f.read()
    mgr = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "rq-mgr")
    if not os.access(mgr, os.X_OK):
        mgr = shutil.which("rq-mgr") or mgr
    try:
        st = os.stat(root)
        uid, gid = st.st_uid, st.st_gid
    except OSError:
        uid, gid = os.getuid(), os.getgid()
    for path in (mgr, root):  # systemd splits ExecStart on whitespace; `%` is a specifier
        if any(c.isspace() or c in "%\\\"'" for c in path):
            raise UsageError(f"{PROG}: cannot write a systemd unit for the path {path}")
    values = {"ExecStart": f"{mgr} --root {root} run", "User": _name(pwd.getpwuid, uid),
              "Group": _name(grp.getgrgid, gid)}
    for key, value in values.items():
        text = re.sub(rf"(?m)^{key}=.*$", f"{key}={value}".replace("\\", "\\\\"), text)
    return text


def _name(lookup: Any, ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if "-h" in args or "--help" in args:
            sys.stdout.write(USAGE)
            return 0
        opts = build_options(args, dict(os.environ), os.getcwd())
        if "--systemd" in args:
            sys.stdout.write(systemd_unit(opts.root))
            return 0
        lines = install(opts)
    except UsageError as err:
        print(err, file=sys.stderr)
        return err.exit_code
    except OSError as err:
        where = f": {err.filename}" if err.filename else ""
        print(f"{PROG}: {err.strerror or err}{where}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
