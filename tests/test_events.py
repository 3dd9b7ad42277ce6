"""S13 event log: line layout, CRC-32, torn tails, reopening an existing file."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from rq.events import EventLog, decode_line, encode_event


def test_line_layout_and_crc() -> None:
    """S13.2: payload at byte 28, crc32 of its exact bytes in lowercase hex."""
    line = encode_event({"msg_id": "x", "status": "é"})
    assert line.startswith(b'{"crc32":"') and line.endswith(b"}\n")
    payload = line[28:-2]
    assert int(line[10:18], 16) == zlib.crc32(payload)
    assert line[10:18] == line[10:18].lower()
    assert json.loads(line) == {"crc32": line[10:18].decode(), "event": json.loads(payload)}
    assert decode_line(line) == {"msg_id": "x", "status": "é"}


@pytest.mark.parametrize("mutate", [
    lambda b: b[:-1],                                   # no final newline (torn)
    lambda b: b[:40] + b"\n",                           # truncated
    lambda b: b.replace(b'"x"', b'"y"'),                # payload changed: crc mismatch
    lambda b: b[:10] + b[10:18].upper() + b[18:],       # not lowercase hex
    lambda b: b.replace(b'{"crc32"', b'{"crc33"'),      # wrong layout
    lambda b: b"garbage\n",
])
def test_bad_lines_are_skipped(mutate) -> None:
    """S13.4: a reader skips any line failing layout, CRC or JSON checks."""
    line = encode_event({"msg_id": "x", "n": 10})
    assert decode_line(mutate(line)) is None


def test_non_object_payload_is_skipped() -> None:
    body = b"[1,2]"
    line = b'{"crc32":"%08x","event":' % zlib.crc32(body) + body + b"}\n"
    assert decode_line(line) is None


def test_writer_mends_torn_tail_of_existing_file(tmp_path: Path) -> None:
    """S13.4: a writer opening a file whose last byte is not \\n appends one,
    so the torn fragment becomes exactly one skipped line; events written by a
    later process to an existing file are kept."""
    log = EventLog(str(tmp_path), "h", "q")
    first = log.log("20261122.0000.00.000.1", None, "prep", ts=1795310400.0)
    log.close()
    path = next((tmp_path / "log" / "events").glob("*/q.jsonl"))
    with open(path, "ab") as fh:
        fh.write(b'{"crc32":"0000')   # a crash mid-write
    log2 = EventLog(str(tmp_path), "h", "q")
    second = log2.log("20261122.0000.00.000.1", "prep", "que", ts=1795310400.5)
    log2.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    decoded = [decode_line(line) for line in lines]
    assert decoded == [first, None, second]
    assert second["from"] == "prep" and second["host"] == "h" and second["duration"] is None
