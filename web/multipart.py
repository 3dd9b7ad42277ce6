"""Multipart bodies parsed without compiling two regular expressions per request.

werkzeug's MultipartDecoder compiles two patterns around each body's boundary
(`LB?--BOUNDARY(--WS*LB?|WS*LB)` and the same with the line break required),
and a boundary is new on every request, so the `re` cache never helps: about
1 ms of CPU per upload, more than the rest of parsing a small form.  Here the
same search is a `find` of `--BOUNDARY` plus one precompiled pattern for what
follows it, with the regex engine's leftmost-first choice kept exactly: the
earliest start position wins, and at one position a line break is tried
before none, `\\r\\n` before `\\n` before `\\r` (tests/test_web_multipart.py
compares both on generated bodies).

`install()` makes werkzeug's form parser (the one module-level name it builds
its decoder from) use `Decoder`: werkzeug's decoder but for its two patterns.
"""

from __future__ import annotations

import re
from typing import Any

from werkzeug import formparser
from werkzeug.sansio.multipart import MultipartDecoder, State

# what follows --BOUNDARY in both of werkzeug's patterns (group 1 there and here)
AFTER = re.compile(rb"(--[^\S\n\r]*(?:\r\n|\n|\r)?|[^\S\n\r]*(?:\r\n|\n|\r))")
BREAKS = (b"\r\n", b"\n", b"\r")


class Found:
    """The part of re.Match the decoder uses."""

    __slots__ = ("_start", "_end", "_after")

    def __init__(self, start: int, end: int, after: bytes) -> None:
        self._start, self._end, self._after = start, end, after

    def start(self) -> int:
        return self._start

    def end(self) -> int:
        return self._end

    def group(self, index: int) -> bytes:
        assert index == 1
        return self._after


class BoundarySearch:
    """`search(data, pos)` of werkzeug's boundary pattern for one boundary: with
    `break_needed` the boundary_re (a line break before `--BOUNDARY`), without it
    the preamble_re (the line break optional)."""

    def __init__(self, boundary: bytes, break_needed: bool) -> None:
        self.dashed = b"--" + boundary
        self.leads = BREAKS if break_needed else (*BREAKS, b"")

    def search(self, data: Any, pos: int = 0) -> Found | None:
        at = data.find(self.dashed, pos)
        while at != -1:
            # a match that uses this occurrence starts 2, 1 or 0 bytes before it; the
            # starts are tried in order, as the engine tries them (an earlier one that
            # failed for another occurrence fails again: match_at depends on start only)
            for start in (at - 2, at - 1, at):
                if start >= pos:
                    found = self.match_at(data, start)
                    if found is not None:
                        return found
            at = data.find(self.dashed, at + 1)
        return None

    def match_at(self, data: Any, start: int) -> Found | None:
        for lead in self.leads:
            if data.startswith(lead, start) and \
                    data.startswith(self.dashed, start + len(lead)):
                after = AFTER.match(data, start + len(lead) + len(self.dashed))
                if after is not None:
                    return Found(start, after.end(), bytes(after.group(1)))
        return None


class Decoder(MultipartDecoder):
    """werkzeug's decoder (3.1) with BoundarySearch for its two patterns; the
    fields are the ones its __init__ sets (tests/test_web_multipart.py checks)."""

    def __init__(self, boundary: bytes, max_form_memory_size: int | None = None, *,
                 max_parts: int | None = None) -> None:
        self.buffer = bytearray()
        self.complete = False
        self.max_form_memory_size = max_form_memory_size
        self.max_parts = max_parts
        self.state = State.PREAMBLE
        self.boundary = boundary
        self.preamble_re = BoundarySearch(boundary, False)  # type: ignore[assignment]
        self.boundary_re = BoundarySearch(boundary, True)  # type: ignore[assignment]
        self._search_position = 0
        self._parts_decoded = 0


def install() -> None:
    formparser.MultipartDecoder = Decoder  # type: ignore[misc]
