"""S8.1 / S8.7 pattern validation and the wildcard matching table."""

from __future__ import annotations

import pytest

from rq.errors import Fail
from rq.topics import check_patterns, matches, pattern_problem

TABLE = [
    ("video.*", "video.encode", True),
    ("video.*", "video.thumbs", True),
    ("video.*", "video", False),
    ("video.*", "video.encode.hd", False),
    ("*", "hello", True),
    ("*", "video.encode", False),
    ("*.encode", "video.encode", True),
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("video.encode", "video.encode", True),
    ("video.encode", "Video.encode", False),
    ("video.#", "video", True),
    ("video.#", "video.encode", True),
    ("video.#", "video.encode.hd", True),
    ("video.#", "videos.encode", False),
    ("video.#", "audio", False),
    ("#", "anything", True),
    ("#", "a.b.c.d", True),
    ("*.#", "a", True),
    ("*.#", "a.b.c", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c", True),
]


@pytest.mark.parametrize(("pattern", "topic", "expected"), TABLE)
def test_matching_table(pattern: str, topic: str, expected: bool) -> None:
    assert pattern_problem(pattern) is None
    assert matches(pattern, topic) is expected


@pytest.mark.parametrize("bad", ["", ".", "a.", ".a", "a..b", "#.a", "a.#.b", "a b", "a/b",
                                 "x" * 256, "a.#x", "a.*x"])
def test_invalid_patterns(bad: str) -> None:
    assert pattern_problem(bad) == f"invalid pattern: {bad}"
    with pytest.raises(Fail):
        check_patterns([bad])


def test_pattern_list_limits() -> None:
    assert check_patterns(["a", "b.*"]) == ("a", "b.*")
    for bad in ([], "a", ["a"] * 33, [1]):
        with pytest.raises(Fail):
            check_patterns(bad)
