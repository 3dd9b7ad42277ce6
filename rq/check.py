"""`check_rq`: a Nagios-style check of a running RQ over HTTP (SPEC S22).

Owns only the client side of `GET ROOTq.txt` and `GET ROOTq/NAME.txt` (S15, S15.2) and the
threshold rules.  It needs no RQ root and no RQ daemon's code: it speaks HTTP to any RQ, local or
remote, with the builtin jobs' stdlib client (rq.builtin.jobhttp; a monitor runs it every few
minutes per check, and importing `requests` cost each call ~90 ms of CPU).  Exit codes are
Nagios's: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from rq.builtin.jobhttp import Client

PROG = "check_rq"
OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
USAGE = (
    "usage: check_rq [-s|--server HOST] [-p|--port PORT] [-r|--relative-root PATH]\n"
    "                [-a|--auth USER:PASS] [-t|--thresh a:b:c:d:e:f | a:b:e:f]\n"
    "                [-T|--timeout SECS] [-d|--dump] [-h|--help]\n"
    "  backlog (prep+que+run) warning >= a, critical >= b; done or relayed warning >= e,\n"
    "  critical >= f; err > 0 or a status other than UP is critical.\n"
    "  defaults: server 127.0.0.1, port $RQ_PORT or 3333, relative root /,\n"
    "  thresholds 10:20:2000:2500:3000:3500, timeout 10 s per request\n"
)
SHORT = {"-s": "server", "-p": "port", "-r": "relative-root", "-a": "auth", "-t": "thresh",
         "-T": "timeout", "-d": "dump"}
VALUE_OPTS = {"server", "port", "relative-root", "auth", "thresh", "timeout"}
SWITCHES = {"dump"}


class OptionError(Exception):
    """A bad option or threshold: one line on stderr, exit 3 (UNKNOWN)."""


class FetchError(Exception):
    """A fetch failure; str() is the whole CRITICAL line to print."""


@dataclass(frozen=True)
class Thresholds:
    backlog_warn: int
    backlog_crit: int
    finished_warn: int  # done or relayed
    finished_crit: int


@dataclass(frozen=True)
class Options:
    server: str = "127.0.0.1"
    port: int = 3333
    relative_root: str = "/"
    auth: tuple[str, str] | None = None
    thresholds: Thresholds = Thresholds(10, 20, 3000, 3500)  # a:b:e:f of the default list
    timeout: float = 10.0
    dump: bool = False


def parse_thresholds(text: str) -> Thresholds:
    """`a:b:c:d:e:f` (c and d accepted, unused) or the four-value form `a:b:e:f`."""
    parts = text.split(":")
    if len(parts) not in (4, 6) or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise OptionError(f"{PROG}: invalid threshold list: {text} (want a:b:c:d:e:f or a:b:e:f)")
    nums = [int(p) for p in parts]
    a, b, e, f = (nums[0], nums[1], nums[4], nums[5]) if len(nums) == 6 else nums
    return Thresholds(a, b, e, f)


def split_args(argv: Sequence[str]) -> dict[str, str | bool]:
    """-x VALUE, -xVALUE, --long VALUE and --long=VALUE; switches take no value."""
    found: dict[str, str | bool] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
        elif arg[:2] in SHORT:
            name, value = SHORT[arg[:2]], arg[2:]
            eq = "=" if value else ""
        else:
            raise OptionError(f"{PROG}: unknown option: {arg}")
        if name in SWITCHES and not eq:
            found[name] = True
        elif name in VALUE_OPTS:
            if not eq:
                if not args:
                    raise OptionError(f"{PROG}: option {arg} needs a value")
                value = args.pop(0)
            found[name] = value
        else:
            raise OptionError(f"{PROG}: unknown option: {arg}")
    return found


def parse_options(argv: Sequence[str], env: dict[str, str]) -> Options:
    found = split_args(argv)
    port_text = str(found.get("port") or env.get("RQ_PORT") or "3333")
    if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 1 <= int(port_text) <= 65535:
        raise OptionError(f"{PROG}: invalid port: {port_text}")
    timeout_text = str(found.get("timeout", "10"))
    try:
        timeout = float(timeout_text)
    except ValueError:
        timeout = -1.0
    if not 0 < timeout < float("inf"):
        raise OptionError(f"{PROG}: invalid timeout: {timeout_text}")
    auth = None
    if "auth" in found:
        user, colon, password = str(found["auth"]).partition(":")
        if not colon:
            raise OptionError(f"{PROG}: invalid auth (want USER:PASS): {found['auth']}")
        auth = (user, password)
    server = str(found.get("server", "127.0.0.1"))
    if not server:
        raise OptionError(f"{PROG}: invalid server: empty")
    kw = {"thresholds": parse_thresholds(str(found["thresh"]))} if "thresh" in found else {}
    prefix = str(found.get("relative-root", "/")).strip("/")
    return Options(server=server, port=int(port_text), auth=auth, timeout=timeout,
                   relative_root=f"/{prefix}/" if prefix else "/",
                   dump=bool(found.get("dump")), **kw)


def base_url(opts: Options) -> str:
    host = opts.server
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{opts.port}"


def fetch(client: Client, opts: Options, path: str) -> str:
    """GET one path; any failure raises FetchError with the exact S22 line."""
    try:
        status, body = client.get(base_url(opts) + path)
    except TimeoutError:  # connecting or reading alike
        raise FetchError("CRITICAL: Timed out") from None
    except client.errors:
        raise FetchError("CRITICAL: Could not connect") from None
    if status != 200:
        raise FetchError(f"CRITICAL: Could not Fetch {path}")
    return body.decode("utf-8", "replace")


def parse_values(text: str) -> dict[str, str]:
    """The `key: value` lines of S15.2 (blank lines separate groups and are skipped)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            values[key.strip()] = value.strip()
    return values


def queue_name(path: str) -> str:
    """`ROOTq/NAME.txt` → NAME."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return urllib.parse.unquote(name[:-4] if name.endswith(".txt") else name)


def as_int(values: dict[str, str], key: str) -> int | None:
    value = values.get(key)
    return int(value) if value is not None and re.fullmatch(r"-?[0-9]+", value) else None


def queue_problems(name: str, values: dict[str, str], th: Thresholds) -> list[tuple[int, str]]:
    """(level, text) for one queue, in S22's order: status, backlog, err, done, relayed."""
    problems: list[tuple[int, str]] = []
    status = values.get("status", "")
    if status != "UP":
        problems.append((CRITICAL, f"{name}: status {status or 'unknown'}"))
    counts = [as_int(values, k) for k in ("prep", "que", "run")]
    if any(c is not None for c in counts):
        backlog = sum(c or 0 for c in counts)
        if backlog >= th.backlog_crit:
            problems.append((CRITICAL, f"{name}: backlog {backlog} >= {th.backlog_crit}"))
        elif backlog >= th.backlog_warn:
            problems.append((WARNING, f"{name}: backlog {backlog} >= {th.backlog_warn}"))
    err = as_int(values, "err")
    if err is not None and err > 0:
        problems.append((CRITICAL, f"{name}: err {err} > 0"))
    for key in ("done", "relayed"):
        n = as_int(values, key)
        if n is not None and n >= th.finished_crit:
            problems.append((CRITICAL, f"{name}: {key} {n} >= {th.finished_crit}"))
        elif n is not None and n >= th.finished_warn:
            problems.append((WARNING, f"{name}: {key} {n} >= {th.finished_warn}"))
    return problems


def check(opts: Options, out: list[str]) -> int:
    """Run the check, appending output lines to `out`; return the exit code."""
    # A monitoring probe talks to the RQ it names, never through a proxy from the environment.
    client = Client(opts.auth, opts.timeout, opts.timeout, proxies=False)
    problems: list[tuple[int, str]] = []
    try:
        index = fetch(client, opts, opts.relative_root + "q.txt")
        paths = sorted((line.strip() for line in index.splitlines() if line.strip()),
                       key=queue_name)
        for path in paths:
            name = queue_name(path)
            values = parse_values(fetch(client, opts, "/" + path.lstrip("/")))
            if opts.dump:
                out.extend(f"{name} {key}: {value}" for key, value in values.items())
            problems.extend(queue_problems(name, values, opts.thresholds))
    except FetchError as failed:
        out.append(str(failed))
        return CRITICAL
    finally:
        client.close()
    if opts.dump:
        return OK
    if not problems:
        out.append("OK: all queue tests normal")
        return OK
    level = max(level for level, _ in problems)
    label = "CRITICAL" if level == CRITICAL else "WARNING"
    out.append(f"{label}: " + ", ".join(text for _, text in problems))
    return level


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        sys.stdout.write(USAGE)
        return OK
    try:
        opts = parse_options(args, dict(os.environ))
    except OptionError as err:
        print(err, file=sys.stderr)
        return UNKNOWN
    out: list[str] = []
    try:
        code = check(opts, out)
    except Exception as err:  # S0.3.3: no stack trace, ever; Nagios reads UNKNOWN
        out.append(f"UNKNOWN: {err}")
        code = UNKNOWN
    for line in out:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
