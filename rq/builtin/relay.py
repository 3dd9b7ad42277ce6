#!/usr/bin/env python3
"""The `relay` builtin queue script (SPEC S12.1): delivers a message to a remote RQ over HTTP.

Every message whose `dest` is an `http(s)://` URL lands in the `relay` queue; this job copies it
to the remote RQ with a two-phase commit: prep a remote message (`_method=prep`), upload each
attachment with its MD5 checked, then commit it.  The remote full id is kept in `job/relay_id`
(written atomically) so that a retry first asks the remote for that message's state (step 4)
instead of prepping a second copy; with the remote's idempotent commit (S7.3) a reply lost at any
step never creates a duplicate on the remote side.

Layout: the protocol decisions (the steps 1-8, the prep message, what each remote reply means)
are pure functions returning a `Decision`; `Remote` does the HTTP (jobhttp, on http.client;
connect timeout 30 s, read 120 s; credentials embedded in the URL go out as Basic auth on
every request, the multipart uploads included) and `JobFiles` the job directory.  `relay()`
drives the steps.

Log lines `<pid> - <time> - <text>` go to stdout (the job's stdio.log); status lines go to fd 3
(RQ_WRITE, S6.3) and are echoed to the log (S12).  Standalone on purpose: nothing of rq is
imported but its neighbour jobio and jobhttp (stdlib only), so it also runs by hand (`python
rq/builtin/relay.py` in a message's job directory with the RQ_* variables set).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

if __package__:  # imported as rq.builtin.relay
    from rq.builtin import jobhttp, jobio
else:  # run as a file (S12): python put this folder first on sys.path
    import jobhttp  # type: ignore[no-redef]
    import jobio  # type: ignore[no-redef]

MAX_RQ_COUNT = 15
CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 120.0
RELAY_ID = "relay_id"
LOOP_TEXT = "Relay loop detected: RQ_DEST queue same as RQ_ORIG_MSG_ID"
# S12.1 step 5: the keys copied into the remote message (not `due`, not `force_remote`).
PREP_KEYS = ("dest", "src", "count", "max_count", "param1", "param2", "param3", "param4",
             "post_run_webhook", "orig_msg_id")
# A remote full id (S4.2): http(s)://HOST:PORT[/PREFIX]/q/QUEUE/SHORT_ID
FULL_ID_RE = re.compile(r"^https?://[^/\s]+(/[^\s]*)?/q/[^/\s]+/\d{8}\.\d{4}\.\d{2}\.\d{3}\.\d+$")
RESEND_STEP = 10  # seconds × RQ_COUNT²


# ================================================================ pure protocol decisions


class Step(Enum):
    """Where the relay goes next (S12.1); the last three end the job."""
    CHECK = "check remote state"   # step 4
    PREP = "prep"                  # step 5
    ATTACH = "attach"              # step 6 (also: "this attachment is in, go on")
    COMMIT = "commit"              # step 7
    RELAYED = "relayed"            # step 8
    RESEND = "resend"              # soft fail
    FAIL = "fail"                  # hard fail (steps 1 and 2)


class Decision(NamedTuple):
    """Immutable (a NamedTuple rather than a frozen dataclass: dataclasses imports inspect,
    a fifth of this job's import time)."""
    step: Step
    reason: str = ""                 # RESEND: why
    forget: bool = False             # delete job/relay_id before going on
    relay_id: str | None = None      # PREP success: the remote full id to store
    lines: tuple[str, ...] = ()      # FAIL: the status lines to send


def is_loop(orig_msg_id: str, dest: str) -> bool:
    """S12.1 step 2: the message started out in the very queue it is relayed to.  Full ids
    never carry credentials, so a dest's `user:pass@` is left out of the comparison."""
    bare = jobio.split_credentials(dest)[0]
    return orig_msg_id.startswith(bare.rstrip("/") + "/")


def start(count: int, orig_msg_id: str, dest: str, has_relay_id: bool) -> Decision:
    """Steps 1, 2 and the choice between step 4 (a stored relay_id) and step 5."""
    if count > MAX_RQ_COUNT:
        return Decision(Step.FAIL, lines=(f"run RQ_COUNT > {MAX_RQ_COUNT} - failing",
                                          f"fail RQ_COUNT > {MAX_RQ_COUNT} FAIL"))
    if is_loop(orig_msg_id, dest):
        return Decision(Step.FAIL, lines=(f"fail {LOOP_TEXT}",))
    return Decision(Step.CHECK if has_relay_id else Step.PREP)


def parse_reply(body: bytes) -> Any:
    """The JSON of a reply body, or None when it is not JSON."""
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def describe(what: str, code: int, body: bytes) -> str:
    """`<what> got HTTP <code>: <body start>` for a soft-fail reason."""
    text = body[:jobio.REASON_MAX].decode("utf-8", "replace")
    return jobio.one_line(f"{what} got HTTP {code}: {text}")


def is_ok(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) >= 1 and reply[0] == "ok"


def is_lost(reply: Any) -> bool:
    """The remote no longer has the prep message (e.g. removed by its cleaner)."""
    return reply == ["fail", "cannot find message"]


def after_state(code: int, body: bytes) -> Decision:
    """Step 4: `GET <relay_id>/state.json`."""
    reply = parse_reply(body)
    if code == 404:
        return Decision(Step.PREP, forget=True)
    if code == 200 and isinstance(reply, list) and len(reply) == 1 and isinstance(reply[0], str):
        if reply[0] == "prep":
            return Decision(Step.ATTACH)
        return Decision(Step.RELAYED)   # committed earlier: its "ok" reply was lost
    return Decision(Step.RESEND, reason=describe("state check", code, body))


def after_prep(code: int, body: bytes) -> Decision:
    """Step 5: `POST <dest>/new_message` with `_method=prep`."""
    reply = parse_reply(body)
    if (code == 200 and is_ok(reply) and len(reply) == 2 and isinstance(reply[1], str)
            and FULL_ID_RE.match(reply[1])):
        return Decision(Step.ATTACH, relay_id=reply[1])
    return Decision(Step.RESEND, reason=describe("prep", code, body))


def after_attach(name: str, md5: str, code: int, body: bytes) -> Decision:
    """Step 6: one attachment upload; the remote must echo our MD5."""
    reply = parse_reply(body)
    if code == 200 and reply == ["ok", f"{md5}-Attached successfully"]:
        return Decision(Step.ATTACH)
    if is_lost(reply):
        return Decision(Step.RESEND, forget=True,
                        reason=describe(f"attach {name}", code, body))
    if code == 200 and is_ok(reply):
        return Decision(Step.RESEND, reason=jobio.one_line(
            f"attach {name}: md5 mismatch: sent {md5}, remote replied {reply[1:]}"))
    return Decision(Step.RESEND, reason=describe(f"attach {name}", code, body))


def after_commit(code: int, body: bytes) -> Decision:
    """Step 7: `POST <relay_id>` with `_method=commit` (idempotent on the remote, S7.3)."""
    reply = parse_reply(body)
    if code == 200 and is_ok(reply):
        return Decision(Step.RELAYED)
    if is_lost(reply):
        return Decision(Step.RESEND, forget=True, reason=describe("commit", code, body))
    return Decision(Step.RESEND, reason=describe("commit", code, body))


def prep_message(fields: Mapping[str, Any], orig_fallback: str) -> dict[str, Any]:
    """Step 5's remote message: the PREP_KEYS present, `count` + 1, `_method` = prep."""
    msg = {key: fields[key] for key in PREP_KEYS if fields.get(key) is not None}
    msg["count"] = jobio.as_count(fields.get("count")) + 1
    msg.setdefault("orig_msg_id", orig_fallback)
    msg["_method"] = "prep"
    return msg


def prep_form(fields: Mapping[str, Any], orig_fallback: str) -> dict[str, str]:
    return {"x_format": "json",
            "mesg": json.dumps(prep_message(fields, orig_fallback), separators=(",", ":"))}


def commit_form(relay_id: str) -> dict[str, str]:
    return {"msg_id": remote_short_id(relay_id), "_method": "commit", "x_format": "json"}


def attach_form(relay_id: str, name: str) -> dict[str, str]:
    return {"pathname": name, "msg_id": remote_short_id(relay_id), "x_format": "json"}


def remote_short_id(full_id: str) -> str:
    return full_id.rstrip("/").rsplit("/", 1)[-1]


def prep_url(dest: str) -> str:
    return dest.rstrip("/") + "/new_message"


def resend_line(count: int, reason: str) -> str:
    """Soft fail: `resend <RQ_COUNT² × 10>-<reason>` (backoff 0, 10, 40, 90 … s)."""
    return jobio.resend_status(count, reason, RESEND_STEP)


# ================================================================ IO: files, HTTP


class JobFiles:
    """The message's job directory: `../msg`, `../attach/`, and `relay_id` (S4.6)."""

    def __init__(self, job_dir: str) -> None:
        self.job_dir = job_dir
        self.msg_dir = os.path.dirname(os.path.abspath(job_dir))
        self.relay_id_path = os.path.join(job_dir, RELAY_ID)

    def read_msg(self) -> dict[str, Any]:
        with open(os.path.join(self.msg_dir, "msg"), encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("msg is not a JSON object")
        return data

    def read_relay_id(self) -> str | None:
        """The stored remote full id; an unusable file is removed and counts as absent."""
        try:
            with open(self.relay_id_path, encoding="utf-8") as f:
                text = f.read().strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as err:
            text = f"<unreadable: {err}>"
        if FULL_ID_RE.match(text):
            return text
        jobio.log(f"ignoring invalid relay_id {text[:200]!r}")
        self.forget_relay_id()
        return None

    def write_relay_id(self, full_id: str) -> None:
        """S0.3.1: temp file in the same directory, fsync, rename, fsync the directory."""
        import tempfile  # only when a prep succeeded: not on every start
        fd, tmp = tempfile.mkstemp(prefix=f".{RELAY_ID}.", dir=self.job_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(full_id + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, self.relay_id_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.sync_dir()

    def forget_relay_id(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.relay_id_path)
            self.sync_dir()

    def sync_dir(self) -> None:
        dir_fd = os.open(self.job_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def attachments(self) -> Iterator[tuple[str, str]]:
        """(name, path) of each regular file in ../attach/ (dot-files and symlinks skipped),
        sorted by name."""
        attach_dir = os.path.join(self.msg_dir, "attach")
        try:
            names = sorted(os.listdir(attach_dir))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(attach_dir, name)
            try:
                regular = stat.S_ISREG(os.lstat(path).st_mode)  # never follow a symlink
            except OSError:
                continue
            if regular and not name.startswith("."):
                yield name, path


def file_md5(path: str) -> str:
    import hashlib  # only for attachments
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Remote(jobhttp.Client):
    """HTTP to the remote RQ (jobhttp: http.client, not requests: this job runs once per
    relay attempt, and importing requests cost about twice the rest of its start-up,
    python -X importtime); connect timeout 30 s, read 120 s; every call returns (status
    code, body).  Redirects are not followed: an RQ answers these JSON requests directly,
    and anything else (a login page, a moved server) is a soft fail whose reason shows the
    3xx.  The environment's proxy settings (HTTP_PROXY, NO_PROXY) are honoured."""

    def __init__(self, auth: tuple[str, str] | None) -> None:
        super().__init__(auth, CONNECT_TIMEOUT, READ_TIMEOUT)


# ================================================================ the steps


def relay(env: Mapping[str, str], job: JobFiles, remote: Remote, fields: Mapping[str, Any],
          dest: str, first: Decision) -> tuple[Decision, str | None]:
    """Steps 4-7 against the remote, from `first` (CHECK or PREP); returns the final
    decision (RELAYED or RESEND) and the remote full id."""
    relay_id = job.read_relay_id() if first.step is Step.CHECK else None
    decision = first if relay_id else Decision(Step.PREP)
    while decision.step not in (Step.RELAYED, Step.RESEND, Step.FAIL):
        step = decision.step
        try:
            decision = do_step(step, env, job, remote, fields, dest, relay_id)
        except remote.errors as err:
            decision = Decision(Step.RESEND, reason=f"{step.value} failed: {err}")
        if decision.relay_id:
            relay_id = decision.relay_id
        if decision.forget:
            jobio.log(f"forgetting relay_id: {relay_id}")
            job.forget_relay_id()
            relay_id = None
    return decision, relay_id


def do_step(step: Step, env: Mapping[str, str], job: JobFiles, remote: Remote,
            fields: Mapping[str, Any], dest: str, relay_id: str | None) -> Decision:
    """One of steps 4-7: its request(s) and what the reply means."""
    if step is Step.PREP:
        jobio.log(f"attempting remote {dest}")
        orig = env.get("RQ_ORIG_MSG_ID") or env.get("RQ_FULL_MSG_ID", "")
        decision = after_prep(*remote.post_form(prep_url(dest), prep_form(fields, orig)))
        if decision.relay_id:
            job.write_relay_id(decision.relay_id)
            jobio.log(f"Now using relay_id: {decision.relay_id}")
        return decision
    assert relay_id is not None
    if step is Step.CHECK:
        jobio.log(f"checking remote state of relay_id: {relay_id}")
        return after_state(*remote.get(relay_id + "/state.json"))
    if step is Step.ATTACH:
        return attach_all(job, remote, relay_id)
    jobio.log(f"committing {relay_id}")
    return after_commit(*remote.post_form(relay_id, commit_form(relay_id)))


def attach_all(job: JobFiles, remote: Remote, relay_id: str) -> Decision:
    """Step 6 for every attachment (re-attaching is harmless: same name replaces)."""
    for name, path in job.attachments():
        md5 = file_md5(path)
        jobio.log(f"attaching {name} (md5 {md5})")
        decision = after_attach(name, md5, *remote.post_file(
            relay_id + "/attach/new", attach_form(relay_id, name), name, path))
        if decision.step is not Step.ATTACH:
            return decision
    return Decision(Step.COMMIT)


def run(env: Mapping[str, str]) -> int:
    fd = int(env.get("RQ_WRITE") or 3)
    count = jobio.as_count(env.get("RQ_COUNT"))
    raw_dest = env.get("RQ_DEST", "")
    job = JobFiles(env.get("RQ_MSG_DIR") or os.getcwd())
    first = start(count, env.get("RQ_ORIG_MSG_ID", ""), raw_dest,
                  os.path.lexists(job.relay_id_path))
    if first.step is Step.FAIL:
        for line in first.lines:
            jobio.send(line, fd)
        return 0
    jobio.log(f"dest - {raw_dest}")
    if env.get("RQ_FORCE_REMOTE"):
        jobio.log("FORCE REMOTE")
    try:
        fields = job.read_msg()
    except (OSError, ValueError) as err:
        jobio.send(f"fail cannot read ../msg: {jobio.one_line(str(err))}", fd)
        return 0
    dest, auth = jobio.split_credentials(raw_dest)
    remote = Remote(auth)
    try:
        decision, relay_id = relay(env, job, remote, fields, dest, first)
    finally:
        remote.close()
    if decision.step is Step.RELAYED:
        # job/relay_id is kept (S12.1 step 8 deletes it first): the message leaves run/ with
        # this line, and should a crash requeue it before that, the retry finds relay_id,
        # sees the remote copy committed (step 4) and never preps a second one.
        jobio.send(f"relayed {relay_id}", fd)
    else:
        jobio.send(resend_line(count, decision.reason), fd)
    return 0


def main() -> int:
    return jobio.run_or_resend(run, "relay", RESEND_STEP)


if __name__ == "__main__":
    sys.exit(main())
