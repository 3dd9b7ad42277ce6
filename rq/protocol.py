"""Wire protocols as pure functions, shared by both ends; no IO here.

Owns: rq1 socket framing (SPEC S7.1), the job pipe line protocol (S6.4, S6.5),
queue-name and message-id syntax (S3.1, S4.1), full ids (S4.2), dest
resolution (S4.3) and the human text of a job's exit status (S6.6).
"""

from __future__ import annotations

from rq.errors import ProtocolError
from rq.jsonwire import dumps, loads
from rq.record import Record

# Not typing / dataclasses / signal at import: every `rq` call imports this module, and those
# cost a shell loop of `rq sendmesg` ~12 ms a call (issue 15).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAGIC = b"rq1 "
HEADER_LEN = 13  # "rq1 " + 8 digits + " "
MAX_FRAME = 64 * 1024 * 1024
KEEP_CMD = "keep"  # the connection carries more requests (rq.sockread, issue 15)
KEPT = ["ok"]      # the reply to it

# ---------------------------------------------------------------- S7.1 framing


def encode_frame(payload: bytes) -> bytes:
    """Frame `payload` as `rq1 SIZE PAYLOAD` with SIZE zero-padded to 8 digits."""
    if len(payload) > 99_999_999:
        raise ProtocolError("frame too large")
    return MAGIC + b"%08d " % len(payload) + payload


def encode_request(cmd: str, arg: Any = None, *, raw: bool = False) -> bytes:
    """A request frame: CMD, then ARG as JSON (or as a raw string when `raw`)."""
    if arg is None:
        return encode_frame(cmd.encode())
    text = arg if raw else dumps(arg)
    return encode_frame(f"{cmd} {text}".encode())


def encode_reply(obj: Any) -> bytes:
    return encode_frame(dumps(obj).encode())


def parse_header(header: bytes) -> int:
    """Return the payload size announced by a 13-byte frame header."""
    if len(header) != HEADER_LEN or not header.startswith(MAGIC) or header[12:13] != b" ":
        raise ProtocolError("bad request")
    digits = header[4:12]
    if not digits.isdigit():
        raise ProtocolError("bad request")
    size = int(digits)
    if size > MAX_FRAME:
        raise ProtocolError("bad request")
    return size


def split_request(payload: bytes) -> tuple[str, str | None]:
    """Split a request payload into (CMD, raw ARG text or None)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("bad request") from exc
    cmd, sep, arg = text.partition(" ")
    if not cmd:
        raise ProtocolError("bad request")
    return cmd, (arg if sep else None)


def parse_json_arg(arg: str | None) -> Any:
    """Decode a JSON ARG; a missing or invalid one is a bad request (S7.1).

    Bounded: a document nested deeper than the interpreter's recursion limit
    (a "JSON bomb" such as 100,000 `[`) and an integer of more digits than
    int() converts are bad requests too, never an internal error (issue 13,
    D9).  Numbers that overflow a float (`1e999`) decode as infinities; the
    rules that take numbers refuse them (S0.3.5 plain JSON)."""
    if arg is None:
        raise ProtocolError("bad request")
    try:
        return loads(arg)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("bad request") from exc


# dumps: compact plain JSON (S0.3.5): no NaN/Infinity, UTF-8 kept as text; loads: one
# document.  Both from rq.jsonwire (json's C codec without the json package's imports).


# ---------------------------------------------------------------- names and ids

_BAD_NAME_CHARS = set("/. ,;:@\"(){}\\+='^`#~?[]%|$&<>*")
# ASCII digits only, and no trailing newline (re's "$" would accept one): S4.1.
# The patterns of this module are compiled on first use (re caches them), not at
# import: a shell loop of `rq sendmesg` pays for every import (issue 15 item 3).
MSG_ID_PATTERN = r"\d{8}\.\d{4}\.\d{2}\.\d{3}\.\d+"


def valid_queue_name(name: Any) -> bool:
    """S3.1: 1..128 bytes, none of the reserved characters, no whitespace/control."""
    if not isinstance(name, str) or not name:
        return False
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if size > 128:
        return False
    for ch in name:
        if ch in _BAD_NAME_CHARS or ch.isspace() or ord(ch) < 32 or ord(ch) == 127:
            return False
        if not ch.isprintable():
            return False
    return True


_MSG_ID_WIDTHS = (8, 4, 2, 3)   # MSG_ID_PATTERN's fixed-width fields; the serial is 1+ digits


def valid_msg_id(msg_id: Any) -> bool:
    """S4.1: MSG_ID_PATTERN, checked without `re` (imported by neither the CLI nor this module
    at start: issue 15 item 3)."""
    if not isinstance(msg_id, str) or len(msg_id) >= 64 or not msg_id.isascii():
        return False
    fields = msg_id.split(".")
    return (len(fields) == 5 and fields[4].isdigit()
            and all(len(f) == w and f.isdigit() for f, w in zip(fields, _MSG_ID_WIDTHS)))


def full_id(base_url: str, queue: str, msg_id: str) -> str:
    """`base_url` is `http://HOST:PORT` + ROOT (ending in '/')."""
    return f"{base_url}q/{queue}/{msg_id}"


def parse_msg_ref(ref: str) -> tuple[str | None, str]:
    """Split a full id (S4.2) or a short id into (queue or None, short id).

    The queue is the first path segment after `/q/` and the id the one after
    it; scheme, host, port and prefix are ignored.  Raises ProtocolError with
    the text `invalid msg_id: <ref>`.
    """
    if not isinstance(ref, str):
        raise ProtocolError(f"invalid msg_id: {ref}")
    if valid_msg_id(ref):
        return None, ref
    path = ref
    if "://" in ref:
        path = ref.split("://", 1)[1]
        path = path[path.find("/"):] if "/" in path else ""
    parts = [p for p in path.split("/")]
    for i in range(len(parts) - 2):
        if parts[i] == "q" and valid_queue_name(parts[i + 1]) and valid_msg_id(parts[i + 2]):
            if all(p == "" for p in parts[i + 3:]):
                return parts[i + 1], parts[i + 2]
    raise ProtocolError(f"invalid msg_id: {ref}")


def is_remote_dest(dest: str) -> bool:
    return dest[:8].lower().startswith(("http://", "https://"))


def resolve_dest(dest: str, host_port: str, root: str) -> tuple[str, str]:
    """S4.3: (RQ_DEST, RQ_DEST_QUEUE) for `dest`.

    `host_port` is `http://HOST:PORT`; `root` is ROOT (starts and ends with '/').
    """
    if is_remote_dest(dest):
        rest = dest.split("://", 1)[1]
        path = rest[rest.find("/"):] if "/" in rest else ""
        return dest, _segment_after_q(path)
    if dest.startswith(root + "q/"):
        return host_port + dest, _segment_after_q(dest[len(root) - 1:])
    if dest.startswith("/q/"):
        return host_port + root + dest[1:], _segment_after_q(dest)
    return f"{host_port}{root}q/{dest}", dest


def _segment_after_q(path: str) -> str:
    parts = path.split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "q":
            return parts[i + 1]
    return ""


def dest_queue_name(dest: str, root: str) -> str:
    """The local queue a CLI `--dest` maps to (S19 sendmesg): `/q/NAME`,
    `ROOTq/NAME` or a bare name.  Remote dests map to `relay`."""
    if is_remote_dest(dest):
        return "relay"
    for prefix in (root + "q/", "/q/"):
        if dest.startswith(prefix):
            return dest[len(prefix):].split("/", 1)[0]
    return dest


# ---------------------------------------------------------------- S6.4 pipe lines

COMPLETIONS = {"done": "done", "err": "err", "fail": "err", "fails": "err",
               "relayed": "relayed", "resend": "resend"}


class PipeLine(Record):
    """One parsed job line (a frozen record).  `kind` is run, done, err, relayed, resend,
    dup or malformed; `text` is the new status text (the whole line when malformed);
    `secs` the resend delay, `due` a dup's seconds from now, `newdest` a dup's target.
    A Record rather than a dataclass or a namedtuple: see the imports above."""

    __slots__ = ("kind", "text", "secs", "due", "newdest")
    defaults = (0, 0.0, "")
    kind: str
    text: str
    secs: int
    due: float
    newdest: str


_INT_PATTERN = r"^\d+$"
_DUP_PATTERN = r"^(\d+(?:\.\d+)?)-([^-]*)-(.+)$"


def parse_pipe_line(line: str) -> PipeLine:
    """Parse one line (without its newline) written by a job on fd 3."""
    import re  # the daemons' path; a module-level import would cost every `rq` call
    cmd, _, text = line.partition(" ")
    if cmd == "run":
        return PipeLine("run", text)
    if cmd in ("done", "err", "fail", "fails", "relayed"):
        return PipeLine(COMPLETIONS[cmd], text)
    if cmd == "resend":
        secs, dash, rest = text.partition("-")
        if re.match(_INT_PATTERN, secs.strip()):
            return PipeLine("resend", text, secs=int(secs.strip()))
        return PipeLine("malformed", line)
    if cmd == "dup":
        m = re.match(_DUP_PATTERN, text, re.DOTALL)
        if m and m.group(3).strip():
            return PipeLine("dup", text, due=float(m.group(1)), newdest=m.group(3).strip())
        return PipeLine("malformed", line, newdest="\0dup")
    return PipeLine("malformed", line)


def is_malformed_dup(parsed: PipeLine) -> bool:
    return parsed.kind == "malformed" and parsed.newdest == "\0dup"


MAX_LINE = 2 * 1024 * 1024  # S6.4 asks for at least 1 MiB; longer lines are cut


class LineBuffer:
    """Reassembles a byte stream into lines split on b'\\n' only (S6.4).

    Linear in what it is fed (a bytearray grows in place), and bounded: of a
    line longer than `limit` bytes the first `limit` are kept and the line ends
    with a marker saying how many bytes were cut (issue 13, D3: a job that
    never writes a newline must not take the queue's memory or time)."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._cut = 0

    def feed(self, data: bytes) -> list[str]:
        """The complete lines in `data` (with what came before), decoded; empty
        lines left out."""
        return [t for t in map(decode_line, self.feed_raw(data)) if t]

    def feed_raw(self, data: bytes) -> list[bytes]:
        """feed() without decoding (a caller may skip lines it does not need)."""
        parts = data.split(b"\n")
        self._append(parts[0])
        if len(parts) == 1:
            return []
        lines = [self._take()]
        for raw in parts[1:-1]:
            if len(raw) > self.limit:
                self._append(raw)
                lines.append(self._take())
            else:
                lines.append(raw)
        self._append(parts[-1])
        return lines

    def flush(self) -> list[str]:
        text = decode_line(self._take())
        return [text] if text else []

    def _append(self, chunk: bytes) -> None:
        room = self.limit - len(self._buf)
        if len(chunk) <= room:
            self._buf += chunk
        else:
            self._buf += chunk[:max(room, 0)]
            self._cut += len(chunk) - max(room, 0)

    def _take(self) -> bytes:
        raw = bytes(self._buf)
        if self._cut:
            raw = raw.removesuffix(b"\r") + f" [... {self._cut} bytes cut]".encode()
        self._buf.clear()
        self._cut = 0
        return raw


def decode_line(raw: bytes) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw.decode("utf-8", errors="replace")


# ---------------------------------------------------------------- exit status text


def exit_text(pid: int, returncode: int, core: bool = False) -> str:
    """S6.6: `pid N exit C` or `pid N SIGKILL (signal 9)`.

    `returncode` follows subprocess: negative means killed by that signal.
    """
    if returncode >= 0:
        return f"pid {pid} exit {returncode}"
    import signal  # only the daemons name signals; see the imports above

    num = -returncode
    try:
        name = signal.Signals(num).name
    except ValueError:
        name = f"SIG{num}"
    return f"pid {pid} {name} (signal {num})" + (" (core dumped)" if core else "")


def describe_exit(returncode: int) -> str:
    """One human text for a child's exit, used by the supervisor's logs."""
    if returncode >= 0:
        return f"exit status {returncode}"
    import signal  # see exit_text

    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


# ---------------------------------------------------------------- ages (issue 16: bulk purge)
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_PATTERN = (r"(\d{1,9}(?:\.\d{1,6})?) ?(?:(s|sec|secs|seconds?)|(m|min|mins|minutes?)"
                r"|(h|hours?)|(d|days?)|(w|weeks?))?")


def parse_age(text: str) -> float:
    """An age as `rq purge --older-than` and the queue page take it: a number with an
    optional unit `s` (the default), `m`, `h`, `d` or `w`, or its word (`7d`, `7 days`,
    `36h`, `90`) → seconds.  Raises ProtocolError."""
    import re  # see parse_pipe_line
    m = re.fullmatch(_AGE_PATTERN, text.strip().lower(), re.ASCII)
    if m is None:
        raise ProtocolError(f"invalid age {text} (a number with s, m, h, d or w, e.g. 7d)")
    unit = next((u for u, g in zip("smhdw", m.groups()[1:]) if g), "s")
    return float(m.group(1)) * AGE_UNITS[unit]
