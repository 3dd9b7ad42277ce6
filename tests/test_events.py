"""S13 event log: line layout, CRC-32, torn tails, reopening an existing file."""

from __future__ import annotations

import json
import tempfile
import zlib
from pathlib import Path

import pytest

from rq.events import (
    SCAN_CHUNK,
    EventLog,
    decode_line,
    encode_event,
    good_end,
    last_good_end,
    torn_tails,
)


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


def write_three(root: Path) -> tuple[Path, list[dict], bytes]:
    """Three records written by the real writer; the file, payloads and last line."""
    log = EventLog(str(root), "h", "q")
    payloads = [log.log(f"20261122.0000.00.00{n}.1", None, "prep", ts=1795310400.0 + n,
                        status=f"record {n}") for n in range(3)]
    log.close()
    path = next((root / "log" / "events").glob("*/q.jsonl"))
    return path, payloads, path.read_bytes().splitlines(keepends=True)[-1]


def damaged_tails(last: bytes) -> list[tuple[str, bytes]]:
    """The last record truncated at every byte, and corrupted at every byte
    (a flipped bit, and a stray newline)."""
    out = [(f"cut {k}", last[:k]) for k in range(1, len(last))]
    for i in range(len(last)):
        out.append((f"flip {i}", last[:i] + bytes([last[i] ^ 0x20]) + last[i + 1:]))
        if last[i] != 10:
            out.append((f"newline {i}", last[:i] + b"\n" + last[i + 1:]))
    return out


def test_torn_tail_recovery_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    """Issue 18 item 4 (S13.4, seed 001): a writer opening a file whose last
    record is torn or fails its CRC moves the bytes after the last good record
    to a sidecar (kept, never discarded), truncates there and appends from it;
    fsck reports the file before and the sidecar after."""
    _, _, last = write_three(tmp_path / "probe")
    cases = damaged_tails(last)
    assert len(cases) > 3 * 200
    for n, (name, tail) in enumerate(cases):
        root = tmp_path / str(n)
        path, payloads, last_line = write_three(root)
        good = path.read_bytes()[:-len(last_line)]
        path.write_bytes(good + tail)
        assert [f"torn tail, {len(tail)} bad byte(s) after offset {len(good)}" in note
                for note in torn_tails(str(root))] == [True], name
        log = EventLog(str(root), "h", "q")
        new = log.log("20261122.0000.00.009.1", "prep", "que", ts=1795310401.0)
        log.close()
        data = path.read_bytes()
        assert data == good + encode_event(new), name
        assert [decode_line(x) for x in data.splitlines(keepends=True)] == [*payloads[:2], new]
        sidecars = list(path.parent.glob("q.jsonl.torn-*"))
        assert [p.name for p in sidecars] == [f"q.jsonl.torn-{len(good)}"], name
        assert sidecars[0].read_bytes() == tail, name
        notes = torn_tails(str(root))
        assert len(notes) == 1 and "moved aside" in notes[0] and "torn-" in notes[0], name


def test_good_tail_is_left_alone_and_sidecars_never_replaced(tmp_path: Path) -> None:
    """A whole last record means no sidecar; a second tear at the same offset
    gets its own sidecar instead of replacing the first; a file with no good
    record at all is moved aside whole."""
    path, payloads, last = write_three(tmp_path)
    size = path.stat().st_size
    log = EventLog(str(tmp_path), "h", "q")
    log.log("20261122.0000.00.009.1", "prep", "que", ts=1795310401.0)
    log.close()
    assert path.stat().st_size > size and torn_tails(str(tmp_path)) == []
    path.write_bytes(path.read_bytes()[:size] + b'{"crc32":"00')
    for fragment in (b"first", b"second"):
        with open(path, "ab") as fh:
            fh.write(fragment)
        log = EventLog(str(tmp_path), "h", "q")
        log.log("20261122.0000.00.009.1", "prep", "que", ts=1795310401.0)
        log.close()
        path.write_bytes(path.read_bytes()[:size] + b'{"crc32":"00')
    names = sorted(p.name for p in path.parent.glob("q.jsonl.torn-*"))
    assert names == [f"q.jsonl.torn-{size}", f"q.jsonl.torn-{size}.1"]
    assert (path.parent / names[0]).read_bytes() == b'{"crc32":"00first'
    assert (path.parent / names[1]).read_bytes() == b'{"crc32":"00second'
    path.write_bytes(b"garbage with no good record\n")
    log = EventLog(str(tmp_path), "h", "q")
    only = log.log("20261122.0000.00.009.1", "prep", "que", ts=1795310401.0)
    log.close()
    assert path.read_bytes() == encode_event(only)
    assert (path.parent / "q.jsonl.torn-0").read_bytes() == b"garbage with no good record\n"


def test_recovery_scans_back_past_one_chunk() -> None:
    """The backward scan reads more when the bad tail is longer than a chunk."""
    line = encode_event({"msg_id": "x"})
    data = line * 3 + b"x" * (SCAN_CHUNK * 2) + b"\n" + b"y" * 10
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        assert last_good_end(fh.fileno(), len(data)) == len(line) * 3
    assert good_end(data, whole=True) == len(line) * 3
    assert good_end(data[-100:], whole=False) is None


def test_fsck_reports_torn_tails_and_sidecars(tmp_path: Path) -> None:
    """`rq fsck` (rq.fsck.main) notes a file whose tail is bad and, once a
    writer has moved it aside, the sidecar; neither is a problem (exit 0)."""
    import io

    from rq import fsck

    root = tmp_path / "root"
    (root / "queue").mkdir(parents=True)
    path, _, _ = write_three(root)
    day = path.parent.name
    with open(path, "ab") as fh:
        fh.write(b'{"crc32":"0')
    out = io.StringIO()
    assert fsck.main(str(root), out, io.StringIO()) == 0
    size = path.stat().st_size
    assert out.getvalue() == (
        f"note: log/events/{day}/q.jsonl: torn tail, 11 bad byte(s) after offset {size - 11} "
        "(moved aside when its queue next writes this file)\n"
        "fsck: 0 queue(s), 0 message(s): OK\n")
    log = EventLog(str(root), "h", "q")
    log.log("20261122.0000.00.009.1", "prep", "que", ts=1795310401.0)
    log.close()
    out = io.StringIO()
    assert fsck.main(str(root), out, io.StringIO()) == 0
    assert out.getvalue() == (
        f"note: log/events/{day}/q.jsonl.torn-{size - 11}: 11 bad byte(s) moved aside from a "
        "torn event-log tail, kept for inspection\n"
        "fsck: 0 queue(s), 0 message(s): OK\n")


def test_s13_1_each_event_goes_to_the_file_of_its_utc_day(tmp_path: Path) -> None:
    """Across midnight and back (an event dated earlier, as a recovery may write): the
    writer keeps today's file open between events but never writes into another day's."""
    log = EventLog(str(tmp_path), "h", "q")
    midnight = 1795392000.0  # 2026-11-23 00:00:00 UTC
    stamps = [midnight - 0.002, midnight - 0.001, midnight, midnight + 0.5, midnight - 30,
              midnight + 86399.999, midnight + 86400, midnight + 1]
    for n, ts in enumerate(stamps):
        log.log(f"20261122.0000.00.00{n}.1", None, "prep", ts=ts)
    log.close()
    days: dict[str, list[float]] = {}
    for path in sorted((tmp_path / "log" / "events").glob("*/q.jsonl")):
        for line in path.read_bytes().splitlines(keepends=True):
            event = decode_line(line)
            assert event is not None
            days.setdefault(path.parent.name, []).append(event["ts"])
    assert days == {"20261122": [midnight - 0.002, midnight - 0.001, midnight - 30],
                    "20261123": [midnight, midnight + 0.5, midnight + 86399.999, midnight + 1],
                    "20261124": [midnight + 86400]}
