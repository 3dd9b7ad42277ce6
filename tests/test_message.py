"""rq.message: S4.4 input rules, computed status (S0.2), hashdir bucket (S3.2), id time (S4.1)."""

from __future__ import annotations

import calendar
from typing import Any

import pytest

from rq.errors import Fail, ProtocolError
from rq.message import STORED_FIELDS, bucket, computed_status, id_epoch, normalize_input

NOW = 1_700_000_000.75


def test_stored_fields_follow_the_s4_4_table() -> None:
    assert STORED_FIELDS == (
        "msg_id", "dest", "src", "param1", "param2", "param3", "param4", "due", "count",
        "max_count", "orig_msg_id", "post_run_webhook", "force_remote", "cloned_from", "dups",
        "dup",
    )


def test_minimal_input_gets_defaults() -> None:
    assert normalize_input({"dest": "test"}, NOW) == {
        "dest": "test", "due": 1_700_000_000, "count": 0, "max_count": 15}


def test_only_input_keys_are_taken() -> None:
    """S4.4: every key but the listed input keys is dropped (including stored-only ones)."""
    msg = normalize_input({
        "dest": "q", "_method": "put", "x_format": "json", "status": "done", "state": "run",
        "path": "/x", "msg_id": "20170508.1234.56.789.42", "cloned_from": "x", "dups": [],
        "dup": "x", "mesg": {"param1": "a"},
    }, NOW)
    assert set(msg) == {"dest", "due", "count", "max_count"}


def test_every_input_key() -> None:
    msg = normalize_input({
        "dest": "http://h:3333/q/test", "src": "cron", "param1": "a", "param2": "b",
        "param3": "c", "param4": "d", "due": 5, "count": 1, "max_count": 3,
        "orig_msg_id": "http://h:3333/q/test/20170508.1234.56.789.42",
        "post_run_webhook": ["http://a/1"], "force_remote": True,
    }, NOW)
    assert msg == {
        "dest": "http://h:3333/q/test", "src": "cron", "param1": "a", "param2": "b",
        "param3": "c", "param4": "d", "due": 5, "count": 1, "max_count": 3,
        "orig_msg_id": "http://h:3333/q/test/20170508.1234.56.789.42",
        "post_run_webhook": ["http://a/1"], "force_remote": True,
    }
    assert set(msg) <= set(STORED_FIELDS)


DEST_MISSING = 'input missing required "dest" parameter'


@pytest.mark.parametrize("data", [
    {}, {"dest": ""}, {"dest": None}, {"dest": 5}, {"dest": ["q"]}, {"param1": "a"},
    None, [], "dest", 5,
])
def test_dest_required(data: object) -> None:
    with pytest.raises(Fail) as exc:
        normalize_input(data, NOW)
    assert str(exc.value) == DEST_MISSING


@pytest.mark.parametrize("value, stored", [
    ("text", "text"), ("", ""), (5, "5"), (-1.5, "-1.5"), (True, "true"), (False, "false"),
    ({"a": 1, "b": [1, 2]}, '{"a":1,"b":[1,2]}'), ([1, "x"], '[1,"x"]'), (["é"], '["é"]'),
    (None, None),
])
@pytest.mark.parametrize("key", ["param1", "param2", "param3", "param4", "src", "orig_msg_id"])
def test_params_as_text(key: str, value: object, stored: str | None) -> None:
    """S4.4: numbers/booleans as JSON text, objects/arrays as compact JSON, null = absent.
    `src` and `orig_msg_id` follow the same rule."""
    msg = normalize_input({"dest": "q", key: value}, NOW)
    if key == "orig_msg_id" and stored == "":
        stored = None  # an empty orig_msg_id means "default to the message's own id"
    assert msg.get(key) == stored
    assert (key in msg) is (stored is not None)


@pytest.mark.parametrize("value, stored", [
    (None, 1_700_000_000), (0, 0), (1234567890, 1234567890), (12.5, 12.5), (12.0, 12),
    ("1234567890", 1234567890), ("1234567890.25", 1234567890.25), ("12.0", 12),
    (" 42 ", 42), ("-5", -5), ("1e3", 1000),
])
def test_due(value: object, stored: float) -> None:
    due = normalize_input({"dest": "q", "due": value}, NOW)["due"]
    assert due == stored
    assert type(due) is type(stored)


@pytest.mark.parametrize("value", [
    "", "soon", "12abc", "nan", "inf", True, False, [], {}, float("nan"), float("inf"),
])
def test_due_invalid(value: object) -> None:
    with pytest.raises(Fail) as exc:
        normalize_input({"dest": "q", "due": value}, NOW)
    assert str(exc.value) == "invalid due value"


@pytest.mark.parametrize("key, default", [("count", 0), ("max_count", 15)])
@pytest.mark.parametrize("value, stored", [
    (None, None), (0, 0), (7, 7), ("0", 0), ("12", 12), (3.0, 3),
])
def test_counts(key: str, default: int, value: object, stored: int | None) -> None:
    got = normalize_input({"dest": "q", key: value}, NOW)[key]
    assert got == (default if stored is None else stored)
    assert type(got) is int


@pytest.mark.parametrize("key", ["count", "max_count"])
@pytest.mark.parametrize("value", [-1, "-1", "1.5", 1.5, "x", "", " 3", True, False, [], {}])
def test_counts_invalid(key: str, value: object) -> None:
    with pytest.raises(Fail) as exc:
        normalize_input({"dest": "q", key: value}, NOW)
    assert str(exc.value) == f"invalid {key} value"


@pytest.mark.parametrize("value, stored", [
    (["http://a/1", "http://b/2"], ["http://a/1", "http://b/2"]),
    ("http://a/1 http://b/2\nhttp://c/3", ["http://a/1", "http://b/2", "http://c/3"]),
    ("  http://a/1  ", ["http://a/1"]),
    (["http://a/1", ""], ["http://a/1"]),
    ("", None), ("   ", None), ([], None), ([""], None), (None, None),
])
def test_post_run_webhook(value: object, stored: list[str] | None) -> None:
    """S4.4: an array, or a string split on whitespace; empty means absent."""
    assert normalize_input({"dest": "q", "post_run_webhook": value}, NOW).get(
        "post_run_webhook") == stored


@pytest.mark.parametrize("value", [5, True, {"url": "x"}, ["http://a/1", 5], [None]])
def test_post_run_webhook_invalid(value: object) -> None:
    with pytest.raises(Fail) as exc:
        normalize_input({"dest": "q", "post_run_webhook": value}, NOW)
    assert str(exc.value) == "invalid post_run_webhook value"


@pytest.mark.parametrize("value, stored", [
    (True, True), (1, True), ("true", True), ("yes", True), ("1", True),
    (False, None), (0, None), ("false", None), ("no", None), ("", None), (None, None),
    ("on", None), (2, None),
])
def test_force_remote(value: object, stored: bool | None) -> None:
    """S4.4: stored as true only when TRUTHY (S3.3), else not stored."""
    assert normalize_input({"dest": "q", "force_remote": value}, NOW).get(
        "force_remote") is stored


def test_first_failure_is_reported_in_field_order() -> None:
    with pytest.raises(Fail, match="invalid due value"):
        normalize_input({"dest": "q", "due": "x", "count": "x"}, NOW)


def test_large_input_accepted() -> None:
    """S4.4: messages of at least 1 MiB of JSON."""
    big = "x" * (1 << 20)
    assert normalize_input({"dest": "q", "param1": big}, NOW)["param1"] == big


# ---------------------------------------------------------------- S0.2 computed status


@pytest.mark.parametrize("state, text, status", [
    ("done", "done sleeping", "done - done sleeping"),
    ("relayed", "http://h:3333/q/test/ID2", "relayed - http://h:3333/q/test/ID2"),
    ("err", "by design", "err - by design"),
    ("run", "just started", "run - just started"),
    ("que", None, "que"),
    ("que", "", "que"),
])
def test_computed_status(state: str, text: str | None, status: str) -> None:
    assert computed_status(state, text) == status


# ---------------------------------------------------------------- S3.2 bucket, S4.1 id time


@pytest.mark.parametrize("msg_id, path", [
    ("20170508.1234.56.789.42", "20170508/12/34"),
    ("20100625.0127.35.122.7509656", "20100625/01/27"),
    ("19991231.2359.59.999.1", "19991231/23/59"),
])
def test_bucket(msg_id: str, path: str) -> None:
    assert bucket(msg_id) == path


@pytest.mark.parametrize("msg_id, epoch", [
    ("20170508.1234.56.789.42", calendar.timegm((2017, 5, 8, 12, 34, 56)) + 0.789),
    ("20100625.0127.35.122.7509656", 1277429255.122),
    ("19700101.0000.00.000.1", 0.0),
    ("20240229.2359.59.001.3", calendar.timegm((2024, 2, 29, 23, 59, 59)) + 0.001),
])
def test_id_epoch(msg_id: str, epoch: float) -> None:
    assert id_epoch(msg_id) == pytest.approx(epoch, abs=1e-6)


@pytest.mark.parametrize("msg_id", [
    "", "x", "20170508.1234.56.789", "2017050.1234.56.789.1", "20170508-1234.56.789.1",
    "20170508.1234.56.789.42/", "q/test/20170508.1234.56.789.42",
])
@pytest.mark.parametrize("func", [bucket, id_epoch])
def test_bad_ids(func: Any, msg_id: str) -> None:
    with pytest.raises(ProtocolError, match="invalid msg_id"):
        func(msg_id)


@pytest.mark.parametrize("msg_id", [
    "20171308.1234.56.789.1", "20170230.1234.56.789.1", "20170508.2434.56.789.1",
    "20170508.1260.56.789.1", "20170508.1234.60.789.1", "20170500.1234.56.789.1",
])
def test_id_epoch_impossible_time(msg_id: str) -> None:
    with pytest.raises(ProtocolError, match="invalid msg_id"):
        id_epoch(msg_id)
