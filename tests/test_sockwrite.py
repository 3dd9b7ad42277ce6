"""The cap on replies not yet read (rq/sockwrite.py, S7.1, issue 13 part 5), on real
Unix socket pairs: which connection the cap drops.  The whole server under a flood of
deaf clients is tests/test_hostile_load.py; here each rule on its own, with no clock to
wait on: a client that has read some of its reply is a reader and stays, a deaf one is
dropped, and a reader that took nothing for `stalled` seconds counts as deaf."""

from __future__ import annotations

import os
import selectors
import socket
import sys
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from rq.sockwrite import UnsentReplies, Writing, unread

BIG = 900_000
CAP = BIG + BIG // 2  # one reply fits, two do not


@pytest.fixture
def ends() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def replies_with(stalled: float) -> UnsentReplies:
    return UnsentReplies(selectors.DefaultSelector(), lambda: None, max_unsent=CAP,
                         timeout=30.0, stalled=stalled)


def hand_over(replies: UnsentReplies, ends: ExitStack, read: int = 0
              ) -> tuple[Writing, socket.socket]:
    """A reply of BIG bytes handed over as a worker does after its non-blocking send,
    its client having read `read` bytes meanwhile and then paused with its socket full;
    the reply's Writing (before any drop) and the client's end, non-blocking."""
    server, client_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ends.enter_context(client_end)
    server.setblocking(False)
    data = b"x" * BIG
    sent = server.send(data)
    got = 0
    while got < read:
        got += len(client_end.recv(read - got))
        sent += server.send(data[sent:])  # the worker's send goes on while its client reads
    fd = server.fileno()
    replies.add(server, data, sent)
    client_end.setblocking(False)
    return replies.writing[fd], client_end


def kept(replies: UnsentReplies) -> list[int]:
    return [id(w) for w in replies.writing.values()]


def close(replies: UnsentReplies) -> None:
    replies.end_all()
    replies.sel.close()


def dropped(client_end: socket.socket) -> bool:
    """Read what is there without blocking: True when the server closed its end."""
    while True:
        try:
            if not client_end.recv(1 << 20):
                return True
        except BlockingIOError:
            return False


def test_unread_counts_what_the_peer_has_not_read() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        a.setblocking(False)
        sent = a.send(b"x" * BIG)
        assert unread(a) >= sent  # never short: a deaf client never counts as reading
        got = 0
        while got < sent:
            got += len(b.recv(sent - got))
        assert unread(a) == 0


def test_unread_of_a_pipe_is_unknown_and_counts_as_not_reading() -> None:
    r, w = os.pipe()
    try:
        with open(r, "rb", closefd=False) as f:
            assert unread(f) == sys.maxsize  # type: ignore[arg-type]  # ENOTTY: an OSError
    finally:
        os.close(r)
        os.close(w)


def test_over_the_cap_the_deaf_client_goes_and_the_paused_reader_stays(
        ends: ExitStack) -> None:
    """The reader's hand-over is the older and its socket takes nothing now: ordered by
    the last progress alone (the code before), it was the one dropped."""
    replies = replies_with(stalled=60.0)
    reader, reader_end = hand_over(replies, ends, read=400_000)
    deaf, deaf_end = hand_over(replies, ends)
    assert reader.moved and not deaf.moved
    newest, _ = hand_over(replies, ends)  # over the cap: an older one must go
    try:
        assert replies.dropped == 1
        assert kept(replies) == [id(reader), id(newest)]
        assert dropped(deaf_end) and not dropped(reader_end)
    finally:
        close(replies)


def test_a_reader_stalled_for_the_set_seconds_counts_as_deaf(ends: ExitStack) -> None:
    replies = replies_with(stalled=0.0)  # every reader has taken nothing for 0 s
    reader, reader_end = hand_over(replies, ends, read=400_000)
    deaf, deaf_end = hand_over(replies, ends)
    newest, _ = hand_over(replies, ends)
    try:
        # the deaf one (never read) first, then the stalled reader, until under the cap
        assert replies.dropped == 2
        assert kept(replies) == [id(newest)]
        assert dropped(deaf_end) and dropped(reader_end)
    finally:
        close(replies)
