"""rq/protocol.py: the wire protocols as pure functions, tested table-driven.

Covers rq1 framing (S7.1), queue names (S3.1), short and full ids (S4.1, S4.2),
dest resolution (S4.3), job pipe lines (S6.4, S6.5), line reassembly (S6.4)
and the exit-status texts of S6.6.
"""

from __future__ import annotations

import json

import pytest

from rq import protocol
from rq.errors import ProtocolError
from rq.protocol import LineBuffer, PipeLine

ID = "20100625.0127.35.122.7509656"
ID2 = "20170508.1234.56.789.42"


# ================================================================ S7.1 framing

@pytest.mark.parametrize("payload, frame", [
    (b"", b"rq1 00000000 "),
    (b"ping", b"rq1 00000004 ping"),
    ("h\u00e9".encode(), b"rq1 00000003 h\xc3\xa9"),          # SIZE counts bytes
    (b"x" * 12345678, b"rq1 12345678 " + b"x" * 12345678),
])
def test_s7_1_encode_frame_pads_size_to_8_digits(payload: bytes, frame: bytes) -> None:
    assert protocol.encode_frame(payload) == frame


def test_s7_1_encode_frame_refuses_a_size_that_needs_9_digits() -> None:
    class Huge(bytes):
        def __len__(self) -> int:
            return 100_000_000
    with pytest.raises(ProtocolError):
        protocol.encode_frame(Huge())


@pytest.mark.parametrize("cmd, arg, raw, frame", [
    ("ping", None, False, b"rq1 00000004 ping"),
    ("get_message", {"msg_id": ID}, False,
     b'rq1 00000053 get_message {"msg_id":"' + ID.encode() + b'"}'),
    ("up_queue", "test", True, b"rq1 00000013 up_queue test"),
    ("create_message", {"dest": "t\u00e9"}, False,
     'rq1 00000029 create_message {"dest":"t\u00e9"}'.encode()),
])
def test_s7_1_encode_request(cmd: str, arg: object, raw: bool, frame: bytes) -> None:
    assert protocol.encode_request(cmd, arg, raw=raw) == frame


@pytest.mark.parametrize("obj, frame", [
    (["pong"], b'rq1 00000008 ["pong"]'),
    (["ok", {"a": 1}], b'rq1 00000014 ["ok",{"a":1}]'),
])
def test_s7_1_encode_reply_is_compact_json(obj: object, frame: bytes) -> None:
    assert protocol.encode_reply(obj) == frame


def test_s0_3_5_dumps_refuses_nan() -> None:
    with pytest.raises(ValueError):
        protocol.dumps({"x": float("nan")})


@pytest.mark.parametrize("header, size", [
    (b"rq1 00000000 ", 0),
    (b"rq1 00000042 ", 42),
    (b"rq1 01048576 ", 1048576),
])
def test_s7_1_parse_header_valid(header: bytes, size: int) -> None:
    assert protocol.parse_header(header) == size


@pytest.mark.parametrize("header", [
    b"rq2 00000042 ",        # bad magic
    b"RQ1 00000042 ",
    b"rq100000042  ",
    b"rq1 0000042 ",         # short (12 bytes): a short read
    b"rq1 000000042 ",       # long
    b"",
    b"rq1 0000004x ",        # size not decimal
    b"rq1 -0000042 ",
    b"rq1 +0000042 ",
    b"rq1  0000042 ",
    b"rq1 00000042x",        # no space after SIZE
    b"rq1 \xd9\xa0\xd9\xa1\xd9\xa2\xd9\xa3 ",  # non-ASCII digits
    b"rq1 99999999 ",        # larger than any frame a server accepts
])
def test_s7_1_parse_header_errors(header: bytes) -> None:
    with pytest.raises(ProtocolError, match="bad request"):
        protocol.parse_header(header)


@pytest.mark.parametrize("payload, expected", [
    (b"ping", ("ping", None)),
    (b"get_message {}", ("get_message", "{}")),
    (b"cmd ", ("cmd", "")),
    (b"cmd a b  c", ("cmd", "a b  c")),
    ("up_queue t\u00e9".encode(), ("up_queue", "t\u00e9")),
])
def test_s7_1_split_request(payload: bytes, expected: tuple[str, str | None]) -> None:
    assert protocol.split_request(payload) == expected


@pytest.mark.parametrize("payload", [b"", b" ping", b"\xff\xfe", b"cmd \xc3"])
def test_s7_1_split_request_errors(payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="bad request"):
        protocol.split_request(payload)


@pytest.mark.parametrize("arg, value", [
    ("{}", {}), ('{"msg_id":"x"}', {"msg_id": "x"}), ("[1,2]", [1, 2]), ('"s"', "s"),
    ("null", None),
])
def test_s7_1_parse_json_arg(arg: str, value: object) -> None:
    assert protocol.parse_json_arg(arg) == value


@pytest.mark.parametrize("arg", [None, "", "{", "{'a': 1}", "nope", "{} x",
                                 "[" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
                                 '{"param1": %s}' % ("9" * 5000)])
def test_s7_1_parse_json_arg_errors(arg: str | None) -> None:
    """Bombs too (issue 13, D9): nested 100,000 deep, or an integer too long to convert."""
    with pytest.raises(ProtocolError, match="bad request"):
        protocol.parse_json_arg(arg)


JSON_DOCS = ['{"a":[1,{"b":null}],"\u00fc":"x"}', '  [true, false, 0, -1, 1.5e300] ', '"\\ud800"',
             '{"a":1,"a":2}', "NaN", "-Infinity", "1e999", '"\u2028\\u0000"', "", " ", "{} x",
             "[1,2", '"\t"', "\ufeff1", "[" * 100_000, '{"p": %s}' % ("9" * 5000)]


@pytest.mark.parametrize("text", JSON_DOCS)
def test_s0_3_5_jsonwire_decodes_as_json_loads(text: str) -> None:
    """rq.jsonwire (the CLI's JSON without the json package, issue 15) is json.loads: the
    same value, or the same exception type, for str and UTF-8 bytes."""
    from rq import jsonwire

    def outcome(fn, doc):
        try:
            return ("value", repr(fn(doc)))
        except Exception as exc:  # noqa: BLE001 - the exception type is what is compared
            return ("error", type(exc).__name__)
    for doc in (text, text.encode("utf-8", "surrogatepass")):
        assert outcome(jsonwire.loads, doc) == outcome(json.loads, doc)


@pytest.mark.parametrize("obj", [None, True, 0, 10**30, 1.5, "é\u2028\x00\"\\", [], {},
                                 {"a": [1, {"b": None}], "ü": ["x", 2.0]}, [[[]]], ""])
def test_s0_3_5_jsonwire_encodes_as_compact_json_dumps(obj: object) -> None:
    from rq import jsonwire
    assert jsonwire.dumps(obj) == json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                                             allow_nan=False)


@pytest.mark.parametrize("obj, error", [(float("nan"), ValueError), ({1j: 1}, TypeError),
                                        (object(), TypeError)])
def test_s0_3_5_jsonwire_refuses_what_json_dumps_refuses(obj: object, error: type) -> None:
    from rq import jsonwire
    with pytest.raises(error):
        jsonwire.dumps(obj)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        jsonwire.dumps(loop)


def test_s7_1_request_round_trip() -> None:
    frame = protocol.encode_request("create_message", {"dest": "x", "param1": "\u00e9 \n"})
    size = protocol.parse_header(frame[:protocol.HEADER_LEN])
    payload = frame[protocol.HEADER_LEN:]
    assert size == len(payload)
    cmd, arg = protocol.split_request(payload)
    assert cmd == "create_message"
    assert protocol.parse_json_arg(arg) == {"dest": "x", "param1": "\u00e9 \n"}


# ================================================================ S3.1 queue names

FORBIDDEN = list("/. ,;:@\"(){}\\+='^`#~?[]%|$&<>*")


@pytest.mark.parametrize("ch", FORBIDDEN, ids=[f"U+{ord(c):04X}" for c in FORBIDDEN])
@pytest.mark.parametrize("where", ["alone", "start", "middle", "end"])
def test_s3_1_every_forbidden_character_is_refused(ch: str, where: str) -> None:
    name = {"alone": ch, "start": ch + "abc", "middle": "ab" + ch + "c", "end": "abc" + ch}[where]
    assert protocol.valid_queue_name(name) is False


WHITESPACE_AND_CONTROL = ["\t", "\n", "\r", "\x0b", "\x0c", "\x00", "\x01", "\x1b", "\x1f",
                          "\x7f", "\x85", "\u00a0", "\u2003", "\u2028", "\u3000"]


@pytest.mark.parametrize("ch", WHITESPACE_AND_CONTROL,
                         ids=[f"U+{ord(c):04X}" for c in WHITESPACE_AND_CONTROL])
def test_s3_1_whitespace_and_control_characters_are_refused(ch: str) -> None:
    assert protocol.valid_queue_name("ab" + ch + "c") is False


@pytest.mark.parametrize("name", [
    "test", "a", "A-Z_0-9", "relay", "my-queue", "x!", "a" * 128,
    "\u00e9" * 64,                      # 128 bytes of UTF-8
    "\u20ac" * 42 + "ab",              # 126 + 2 = 128 bytes
    "\u961f\u5217",                    # CJK letters
    "\U0001f600" * 32,                 # 4-byte characters, 128 bytes
])
def test_s3_1_valid_names(name: str) -> None:
    assert len(name.encode()) <= 128
    assert protocol.valid_queue_name(name) is True


@pytest.mark.parametrize("name", [
    "", "a" * 129,
    "\u00e9" * 64 + "a",                # 129 bytes though only 65 characters
    "\u20ac" * 43,                     # 129 bytes
    "\U0001f600" * 32 + "a",
    "\udc80abc",                       # lone surrogate: not encodable
    None, 5, b"test", ["test"],
])
def test_s3_1_invalid_names_by_size_or_type(name: object) -> None:
    assert protocol.valid_queue_name(name) is False


# ================================================================ S4.1 / S4.2 ids

@pytest.mark.parametrize("msg_id", [ID, ID2, "20100625.0127.35.122.0", "99999999.9999.99.999.1"])
def test_s4_1_valid_msg_id(msg_id: str) -> None:
    assert protocol.valid_msg_id(msg_id) is True


@pytest.mark.parametrize("msg_id", [
    "", "x", "20100625.0127.35.122", "20100625.0127.35.122.", "2010062.0127.35.122.7",
    "20100625.127.35.122.7", "20100625.0127.5.122.7", "20100625.0127.35.12.7",
    "20100625.0127.35.122.7a", "20100625-0127.35.122.7", " " + ID, ID + " ",
    ID + "\n",                                      # "$" must not match before a newline
    "\u0662" + ID[1:],                             # Arabic-indic digit
    "\uff12" + ID[1:],                             # fullwidth digit
    "q/test/" + ID, None, 20100625,
])
def test_s4_1_invalid_msg_id(msg_id: object) -> None:
    assert protocol.valid_msg_id(msg_id) is False


@pytest.mark.parametrize("base, queue, full", [
    ("http://127.0.0.1:3333/", "test", f"http://127.0.0.1:3333/q/test/{ID}"),
    ("http://rq.example.com:3333/therq/", "test", f"http://rq.example.com:3333/therq/q/test/{ID}"),
])
def test_s4_2_full_id(base: str, queue: str, full: str) -> None:
    assert protocol.full_id(base, queue, ID) == full


@pytest.mark.parametrize("ref, expected", [
    (ID, (None, ID)),
    (f"http://127.0.0.1:3333/q/test/{ID}", ("test", ID)),
    (f"http://rq.example.com:3333/therq/q/test/{ID}", ("test", ID)),
    (f"https://other.example:443/a/b/q/test_2/{ID}", ("test_2", ID)),   # scheme/host ignored
    (f"http://h:1/q/test/{ID}/", ("test", ID)),
    (f"/q/test/{ID}", ("test", ID)),
    (f"/therq/q/test/{ID}", ("test", ID)),
    (f"http://h:3333/q/q/test/{ID}", ("test", ID)),       # a prefix that is itself "/q/"
    (f"http://h:3333/q/q/{ID}", ("q", ID)),               # a queue named q
    (f"http://h:3333/q/my-queue/{ID}", ("my-queue", ID)),
])
def test_s4_2_parse_msg_ref(ref: str, expected: tuple[str | None, str]) -> None:
    assert protocol.parse_msg_ref(ref) == expected


@pytest.mark.parametrize("ref", [
    "", "garbage", "20100625.0127.35.122", f"http://h:3333/q/test/{ID}x",
    "http://h:3333/q/test/", f"http://h:3333/test/{ID}", f"http://q/test/{ID}",
    f"http://h:3333/q/te.st/{ID}", f"http://h:3333/q/te st/{ID}", f"http://h:3333/q//{ID}",
    f"http://h:3333/q/test/{ID}/extra", ID + "\n", 5, None,
])
def test_s4_2_parse_msg_ref_errors(ref: object) -> None:
    with pytest.raises(ProtocolError) as info:
        protocol.parse_msg_ref(ref)  # type: ignore[arg-type]
    assert str(info.value) == f"invalid msg_id: {ref}"


# ================================================================ S4.3 dest resolution

HP = "http://rq.example.com:3333"


@pytest.mark.parametrize("dest, root, expected", [
    # remote: RQ_DEST as given, RQ_DEST_QUEUE the segment after /q/ (empty if none)
    ("http://other:3333/q/foo", "/", ("http://other:3333/q/foo", "foo")),
    (f"http://other:3333/q/foo/{ID}", "/", (f"http://other:3333/q/foo/{ID}", "foo")),
    ("https://other/q/foo", "/", ("https://other/q/foo", "foo")),
    ("HTTPS://Other/therq/q/foo", "/therq/", ("HTTPS://Other/therq/q/foo", "foo")),
    ("Http://other/q/foo", "/", ("Http://other/q/foo", "foo")),
    ("http://other:3333/", "/", ("http://other:3333/", "")),
    ("http://other:3333", "/", ("http://other:3333", "")),
    ("http://other/elsewhere/x", "/", ("http://other/elsewhere/x", "")),
    ("http://other/q", "/", ("http://other/q", "")),
    # ROOT + q/ path
    ("/q/foo", "/", (f"{HP}/q/foo", "foo")),
    (f"/q/foo/{ID}", "/", (f"{HP}/q/foo/{ID}", "foo")),
    ("/therq/q/foo", "/therq/", (f"{HP}/therq/q/foo", "foo")),
    # /q/ path under a relative_root: the prefix is inserted (fix)
    ("/q/foo", "/therq/", (f"{HP}/therq/q/foo", "foo")),
    (f"/q/foo/{ID}", "/a/b/", (f"{HP}/a/b/q/foo/{ID}", "foo")),
    # anything else is a bare queue name
    ("foo", "/", (f"{HP}/q/foo", "foo")),
    ("foo", "/therq/", (f"{HP}/therq/q/foo", "foo")),
    ("my-queue", "/", (f"{HP}/q/my-queue", "my-queue")),
    ("ftp://x/q/foo", "/", (f"{HP}/q/ftp://x/q/foo", "ftp://x/q/foo")),
    ("/elsewhere", "/", (f"{HP}/q//elsewhere", "/elsewhere")),
    ("/therq/q/foo", "/", (f"{HP}/q//therq/q/foo", "/therq/q/foo")),
])
def test_s4_3_resolve_dest(dest: str, root: str, expected: tuple[str, str]) -> None:
    assert protocol.resolve_dest(dest, HP, root) == expected


@pytest.mark.parametrize("dest, root, name", [
    ("http://h/q/x", "/", "relay"), ("https://h/q/x", "/", "relay"),
    ("/q/foo", "/", "foo"), (f"/q/foo/{ID}", "/", "foo"), ("/therq/q/foo", "/therq/", "foo"),
    ("/q/foo", "/therq/", "foo"), ("foo", "/", "foo"), ("my-queue", "/", "my-queue"),
])
def test_s19_s6_5_dest_queue_name(dest: str, root: str, name: str) -> None:
    assert protocol.dest_queue_name(dest, root) == name


@pytest.mark.parametrize("dest, remote", [
    ("http://x", True), ("https://x", True), ("HTTP://X", True), ("hTtPs://x/q/a", True),
    ("http:/x", False), ("httpx://x", False), ("ftp://x", False), ("x", False),
    ("/q/http://x", False),
])
def test_s4_3_is_remote_dest(dest: str, remote: bool) -> None:
    assert protocol.is_remote_dest(dest) is remote


# ================================================================ S6.4 / S6.5 pipe lines

@pytest.mark.parametrize("line, expected", [
    ("run hello", PipeLine("run", "hello")),
    ("run", PipeLine("run", "")),
    ("run ", PipeLine("run", "")),
    ("run  two spaces", PipeLine("run", " two spaces")),      # split at the FIRST space
    ("run a\tb", PipeLine("run", "a\tb")),
    ("done", PipeLine("done", "")),
    ("done done sleeping", PipeLine("done", "done sleeping")),
    ("err by design", PipeLine("err", "by design")),
    ("fail connection refused", PipeLine("err", "connection refused")),
    ("fails x", PipeLine("err", "x")),
    (f"relayed http://h:3333/q/test/{ID}", PipeLine("relayed", f"http://h:3333/q/test/{ID}")),
    ("resend 0", PipeLine("resend", "0", secs=0)),
    ("resend 5", PipeLine("resend", "5", secs=5)),
    ("resend 300-waiting for remote", PipeLine("resend", "300-waiting for remote", secs=300)),
    ("resend 7-a-b-c", PipeLine("resend", "7-a-b-c", secs=7)),
    ("resend 2-", PipeLine("resend", "2-", secs=2)),
    ("dup 0-X-other", PipeLine("dup", "0-X-other", due=0.0, newdest="other")),
    ("dup 10-X-my-other-queue", PipeLine("dup", "10-X-my-other-queue", due=10.0,
                                         newdest="my-other-queue")),
    ("dup 1.5-X-http://h:3333/q/a-b", PipeLine("dup", "1.5-X-http://h:3333/q/a-b", due=1.5,
                                               newdest="http://h:3333/q/a-b")),
    ("dup 0-X-/q/other", PipeLine("dup", "0-X-/q/other", due=0.0, newdest="/q/other")),
    ("dup 3-FLAG-x", PipeLine("dup", "3-FLAG-x", due=3.0, newdest="x")),
    ("dup 3--x", PipeLine("dup", "3--x", due=3.0, newdest="x")),
])
def test_s6_4_parse_pipe_line(line: str, expected: PipeLine) -> None:
    parsed = protocol.parse_pipe_line(line)
    assert (parsed.kind, parsed.text) == (expected.kind, expected.text)
    if expected.kind == "resend":
        assert parsed.secs == expected.secs
    if expected.kind == "dup":
        assert (parsed.due, parsed.newdest) == (expected.due, expected.newdest)
    assert not protocol.is_malformed_dup(parsed)


@pytest.mark.parametrize("line", [
    "", "bogus", "bogus text here", "DONE x", "Done x", " done x", "done\tx", "running x",
    "resend", "resend ", "resend abc", "resend -5", "resend 1.5", "resend 5x", "resend x-5",
    "resend  ", "\ufffd\ufffd",
])
def test_s6_4_malformed_lines_keep_the_whole_line(line: str) -> None:
    parsed = protocol.parse_pipe_line(line)
    assert parsed.kind == "malformed"
    assert parsed.text == line
    assert not protocol.is_malformed_dup(parsed)


@pytest.mark.parametrize("line", [
    "dup", "dup ", "dup garbage", "dup 0-X-", "dup 0-X", "dup -X-q", "dup x-X-q", "dup 1.-X-q",
    "dup 0 X other", "dup 0-X-   ",
])
def test_s6_5_malformed_dup_is_flagged_for_a_fail_reply(line: str) -> None:
    parsed = protocol.parse_pipe_line(line)
    assert parsed.kind == "malformed"
    assert parsed.text == line
    assert protocol.is_malformed_dup(parsed)


# ================================================================ S6.4 line reassembly

@pytest.mark.parametrize("chunks, lines", [
    ([b"done hello\n"], ["done hello"]),
    ([b"done hel", b"lo\n"], ["done hello"]),
    ([b"do", b"ne", b" he", b"llo", b"\n"], ["done hello"]),
    ([b"a\nb\nc\n"], ["a", b"b".decode(), "c"]),
    ([b"a\nb", b"\nc\n"], ["a", "b", "c"]),
    ([b"run x\r\n"], ["run x"]),
    ([b"run x\r", b"\n"], ["run x"]),
    ([b"run a\rb\n"], ["run a\rb"]),              # only a trailing \r is removed
    ([b"run x\r\r\n"], ["run x\r"]),
    ([b"\n", b"\n\r\n", b"\n"], []),             # empty lines are ignored
    ([b"\nrun x\n\n"], ["run x"]),
    ([b"run \xe2\x82", b"\xac\n"], ["run \u20ac"]),  # a UTF-8 character split across reads
    ([b"run \xff\xfe ok\n"], ["run \ufffd\ufffd ok"]),  # S0.3.4
    ([b"no newline yet"], []),
])
def test_s6_4_line_buffer_feed(chunks: list[bytes], lines: list[str]) -> None:
    buf = LineBuffer()
    got: list[str] = []
    for chunk in chunks:
        got.extend(buf.feed(chunk))
    assert got == lines


@pytest.mark.parametrize("chunks, flushed", [
    ([b"done final"], ["done final"]),
    ([b"run a\ndone fin", b"al"], ["done final"]),
    ([b"done final\r"], ["done final"]),
    ([b"run a\n"], []),
    ([], []),
    ([b"\r"], []),
])
def test_s6_4_final_line_without_newline_is_flushed(chunks: list[bytes],
                                                   flushed: list[str]) -> None:
    buf = LineBuffer()
    for chunk in chunks:
        buf.feed(chunk)
    assert buf.flush() == flushed
    assert buf.flush() == []


def test_s6_4_one_mebibyte_line_across_many_reads() -> None:
    text = "x" * (1 << 20) + "\u00e9" * 1000
    data = ("done " + text + "\n").encode()
    buf = LineBuffer()
    got: list[str] = []
    for i in range(0, len(data), 65536):
        got.extend(buf.feed(data[i:i + 65536]))
    assert len(got) == 1
    assert protocol.parse_pipe_line(got[0]) == PipeLine("done", text)


# ================================================================ S6.6 exit texts

@pytest.mark.parametrize("pid, code, core, text", [
    (123, 0, False, "pid 123 exit 0"),
    (123, 1, False, "pid 123 exit 1"),
    (7, 127, False, "pid 7 exit 127"),
    (7, 255, False, "pid 7 exit 255"),
    (42, -9, False, "pid 42 SIGKILL (signal 9)"),
    (42, -15, False, "pid 42 SIGTERM (signal 15)"),
    (42, -2, False, "pid 42 SIGINT (signal 2)"),
    (42, -11, True, "pid 42 SIGSEGV (signal 11) (core dumped)"),
    (42, -6, True, "pid 42 SIGABRT (signal 6) (core dumped)"),
])
def test_s6_6_exit_text(pid: int, code: int, core: bool, text: str) -> None:
    assert protocol.exit_text(pid, code, core) == text


@pytest.mark.parametrize("code, text", [
    (0, "exit status 0"), (3, "exit status 3"), (-9, "killed by SIGKILL"),
    (-15, "killed by SIGTERM"),
])
def test_describe_exit(code: int, text: str) -> None:
    assert protocol.describe_exit(code) == text


def test_s7_1_reply_json_is_plain() -> None:
    frame = protocol.encode_reply(["ok", {"n": 1, "t": "\u00e9"}])
    assert json.loads(frame[protocol.HEADER_LEN:]) == ["ok", {"n": 1, "t": "\u00e9"}]


# ---------------------------------------------------------------- ages (issue 16: rq purge)


@pytest.mark.parametrize("text, seconds", [
    ("0", 0.0), ("90", 90.0), ("90s", 90.0), ("10min", 600.0), ("3 m", 180.0),
    ("36h", 129600.0), ("7d", 604800.0), ("7 days", 604800.0), ("1 Day", 86400.0),
    ("1.5w", 907200.0), ("2 weeks", 1209600.0),
])
def test_parse_age(text: str, seconds: float) -> None:
    assert protocol.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "-1", "7dd", "7 fortnights", "1e3", "7 d d"])
def test_parse_age_refuses(text: str) -> None:
    with pytest.raises(ProtocolError, match=r"^invalid age .* \(a number with s, m, h, d or w"):
        protocol.parse_age(text)


def test_pipe_line_is_a_frozen_record() -> None:
    """rq.record.Record (PipeLine, the CLI's Invocation and Command): defaults, keywords,
    equality and hash by fields, frozen, and a clear TypeError for a wrong call."""
    line = PipeLine("dup", "5-x-y", due=5.0, newdest="y")
    assert line == PipeLine("dup", "5-x-y", 0, 5.0, "y") != PipeLine("dup", "5-x-y")
    assert hash(line) == hash(PipeLine("dup", "5-x-y", 0, 5.0, "y"))
    assert (line.secs, line.due) == (0, 5.0)
    assert repr(PipeLine("run", "a")) == \
        "PipeLine(kind='run', text='a', secs=0, due=0.0, newdest='')"
    with pytest.raises(AttributeError):
        line.kind = "run"  # type: ignore[misc]
    for args, kwargs in [((), {}), (("run",), {}), (("a", "b", 1, 2.0, "c", "d"), {}),
                         (("run", "a"), {"kind": "x"}), (("run", "a"), {"bogus": 1})]:
        with pytest.raises(TypeError):
            PipeLine(*args, **kwargs)
