"""Dotted topics and the patterns that match them (SPEC S8.1, S8.7); pure.

Owns: pattern validation and matching, shared by pull consumers (`reserve`,
S8.2) and event subscriptions (S8.8).  Topics themselves are validated with
the queue config (`rq.config.valid_topic`).

A pattern is dot-separated segments, each `*` (exactly one topic segment), a
literal segment, or, as the last segment only, `#` (zero or more remaining
segments: `video.#` matches `video`, `video.encode` and `video.encode.hd`; `#`
alone matches every topic).
"""

from __future__ import annotations

from rq.errors import Fail
from rq.protocol import valid_queue_name

TYPE_CHECKING = False  # typing and collections stay off every `rq` call's path (issue 15)
if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_PATTERN_BYTES = 255


def pattern_problem(pattern: object) -> str | None:
    """None when `pattern` is valid, else the S8.1 failure text."""
    if not isinstance(pattern, str) or not pattern:
        return f"invalid pattern: {'' if pattern is None else pattern}"
    if len(pattern.encode("utf-8", "surrogatepass")) > MAX_PATTERN_BYTES:
        return f"invalid pattern: {pattern}"
    segs = pattern.split(".")
    for i, seg in enumerate(segs):
        if seg == "*":
            continue
        if seg == "#" and i == len(segs) - 1:
            continue
        if not seg or not all(valid_queue_name(ch) for ch in seg):
            return f"invalid pattern: {pattern}"
    return None


def check_patterns(patterns: object, *, max_count: int = 32) -> tuple[str, ...]:
    """Validate a request's `patterns` list (1..max_count strings).  Raises
    Fail with the S8.1 text for the first bad one."""
    if not isinstance(patterns, list) or not patterns or len(patterns) > max_count:
        raise Fail("invalid patterns")
    for p in patterns:
        problem = pattern_problem(p)
        if problem:
            raise Fail(problem)
    return tuple(patterns)


def matches(pattern: str, topic: str) -> bool:
    """S8.1/S8.7: does a (valid) pattern match a topic?"""
    pat = pattern.split(".")
    top = topic.split(".")
    for i, seg in enumerate(pat):
        if seg == "#" and i == len(pat) - 1:
            return True  # zero or more remaining segments
        if i >= len(top):
            return False
        if seg != "*" and seg != top[i]:
            return False
    return len(pat) == len(top)


def is_pattern(dest: object) -> bool:
    """Does a message `dest` ask for a fan-out (issue 18 item 2, rq.mgr.fanout):
    dot-separated segments one of which is `*` or `#`?  Neither character may appear
    in a queue name (S3.1), so no dest that names a queue is taken for one."""
    return isinstance(dest, str) and any(seg in ("*", "#") for seg in dest.split("."))


def matches_any(patterns: Iterable[str], topic: str) -> bool:
    return any(matches(p, topic) for p in patterns)
