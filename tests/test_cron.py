"""Cron schedules, pure part (SPEC S9.1-S9.3, rq/cron.py): keys, slots, time zones,
daylight-saving changes and the firing decision, against hand-computed instants."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from rq import cron
from rq.cron import CATCH_UP, FIRE, SKIP, Entry, Track


def utc(*a: int) -> int:
    return int(datetime(*a, tzinfo=timezone.utc).timestamp())  # type: ignore[misc]


def slots(spec: str, tz: str | None, after: float, n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        nxt = cron.next_slot(spec, tz, after)
        assert nxt is not None
        out.append(nxt)
        after = nxt
    return out


def entry(spec: str, **kw: object) -> Entry:
    return Entry.from_config({"cron": spec, **kw})


# ---------------------------------------------------------------- S9.2 keys

def test_s9_2_key_is_id_when_given() -> None:
    assert cron.schedule_key({"cron": "* * * * *", "id": "nightly", "param1": "x"}) == "nightly"


def test_s9_2_key_without_id_is_compact_sorted_json_of_cron_tz_params() -> None:
    e = {"param2": "b", "cron": "0 * * * *", "tz": "UTC", "catch_up": True, "param1": "a"}
    assert cron.schedule_key(e) == '{"cron":"0 * * * *","param1":"a","param2":"b","tz":"UTC"}'
    assert cron.schedule_key({"cron": "0 * * * *"}) == '{"cron":"0 * * * *"}'


def test_s9_2_editing_an_entry_without_id_makes_a_new_key() -> None:
    assert (cron.schedule_key({"cron": "0 * * * *", "param1": "a"})
            != cron.schedule_key({"cron": "0 * * * *", "param1": "b"}))


def test_s9_1_entry_from_config_keeps_params_and_catch_up() -> None:
    e = Entry.from_config({"cron": "@daily", "id": "d", "tz": "UTC", "catch_up": True,
                           "param1": "a", "param3": "c", "param4": None})
    assert (e.key, e.cron, e.tz, e.catch_up, dict(e.params)) == (
        "d", "@daily", "UTC", True, {"param1": "a", "param3": "c"})
    assert e.message("q", 60) == {"dest": "q", "src": "cron", "param1": "a", "param3": "c",
                                  "due": 60}
    assert entry("@daily").catch_up is False


# ---------------------------------------------------------------- S9.1 slots in UTC

def test_s9_1_next_slot_is_strictly_after() -> None:
    assert cron.next_slot("* * * * *", "UTC", utc(2024, 5, 1, 12, 0) + 30) == utc(2024, 5, 1, 12, 1)
    assert cron.next_slot("* * * * *", "UTC", utc(2024, 5, 1, 12, 1)) == utc(2024, 5, 1, 12, 2)


def test_s9_1_lists_ranges_and_steps() -> None:
    assert slots("10-50/20 * * * *", "UTC", utc(2024, 5, 1, 12, 0), 4) == [
        utc(2024, 5, 1, 12, 10), utc(2024, 5, 1, 12, 30), utc(2024, 5, 1, 12, 50),
        utc(2024, 5, 1, 13, 10)]
    assert slots("*/15 9-10 * * *", "UTC", utc(2024, 5, 1, 10, 40), 2) == [
        utc(2024, 5, 1, 10, 45), utc(2024, 5, 2, 9, 0)]
    assert slots("5 1,13 * * *", "UTC", utc(2024, 5, 1, 2, 0), 2) == [
        utc(2024, 5, 1, 13, 5), utc(2024, 5, 2, 1, 5)]


def test_s9_1_month_and_day_names_in_any_case() -> None:
    assert cron.next_slot("0 12 1 jan,JUL *", "UTC", utc(2024, 1, 1, 12, 0)) == utc(2024, 7, 1, 12)
    # 2024-01-01 is a Monday
    assert cron.next_slot("0 0 * * Fri", "UTC", utc(2024, 1, 1)) == utc(2024, 1, 5)
    assert cron.next_slot("0 0 * * mon-WED", "UTC", utc(2024, 1, 3)) == utc(2024, 1, 8)


@pytest.mark.parametrize("dow", ["0", "7", "sun", "SUN"])
def test_s9_1_day_of_week_0_and_7_are_sunday(dow: str) -> None:
    assert cron.next_slot(f"0 0 * * {dow}", "UTC", utc(2024, 1, 1)) == utc(2024, 1, 7)


def test_s9_1_day_of_month_or_day_of_week_when_both_restricted() -> None:
    # Fridays of Jan/Feb 2024: 5 12 19 26, 2 9 16; the 13ths: Sat Jan 13, Tue Feb 13
    got = slots("0 0 13 * fri", "UTC", utc(2024, 1, 1), 9)
    assert got == [utc(2024, 1, d) for d in (5, 12, 13, 19, 26)] + [
        utc(2024, 2, d) for d in (2, 9, 13, 16)]


def test_s9_1_day_of_month_alone_when_day_of_week_is_star() -> None:
    assert slots("0 0 13 * *", "UTC", utc(2024, 1, 1), 2) == [utc(2024, 1, 13), utc(2024, 2, 13)]


@pytest.mark.parametrize("spec,expected", [
    ("@yearly", utc(2025, 1, 1)), ("@annually", utc(2025, 1, 1)), ("@monthly", utc(2024, 6, 1)),
    ("@weekly", utc(2024, 5, 19)), ("@daily", utc(2024, 5, 16)), ("@midnight", utc(2024, 5, 16)),
    ("@hourly", utc(2024, 5, 15, 11)), ("@DAILY", utc(2024, 5, 16)),
])
def test_s9_1_keywords(spec: str, expected: int) -> None:
    # 2024-05-15 is a Wednesday; @weekly is Sunday 00:00
    assert cron.next_slot(spec, "UTC", utc(2024, 5, 15, 10, 20)) == expected


def test_s9_1_leap_day_and_never_matching_specs() -> None:
    assert cron.next_slot("0 0 29 2 *", "UTC", utc(2024, 3, 1)) == utc(2028, 2, 29)
    assert cron.next_slot("0 0 31 2 *", "UTC", utc(2024, 3, 1)) is None
    assert cron.next_slot("not a spec", "UTC", utc(2024, 3, 1)) is None


# ---------------------------------------------------------------- S9.1 time zones

def test_s9_1_slots_are_minutes_in_the_entry_tz() -> None:
    # Tokyo is UTC+9 all year: 09:00 JST = 00:00 UTC; 00:00 UTC is itself a slot, so the next
    assert cron.next_slot("0 9 * * *", "Asia/Tokyo", utc(2024, 5, 1)) == utc(2024, 5, 2)
    assert cron.next_slot("0 8 * * *", "Europe/Berlin", utc(2024, 1, 15)) == utc(2024, 1, 15, 7)
    assert cron.next_slot("0 8 * * *", "Europe/Berlin", utc(2024, 7, 15)) == utc(2024, 7, 15, 6)
    # Kolkata is UTC+5:30: 00:00 UTC is 05:30 IST, a slot; the next is 06:30 IST
    assert cron.next_slot("30 * * * *", "Asia/Kolkata", utc(2024, 7, 15)) == utc(2024, 7, 15, 1)


@pytest.fixture
def local_new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_s9_1_without_tz_slots_are_in_server_local_time(local_new_york: None) -> None:
    # EST in January (UTC-5), EDT in July (UTC-4)
    assert cron.next_slot("0 8 * * *", None, utc(2024, 1, 15)) == utc(2024, 1, 15, 13)
    assert cron.next_slot("0 8 * * *", None, utc(2024, 7, 15)) == utc(2024, 7, 15, 12)
    # local DST changes follow the same rules as a tz
    assert cron.next_slot("30 2 * * *", None, utc(2024, 3, 9, 12)) == utc(2024, 3, 10, 7, 30)
    assert slots("30 * * * *", None, utc(2024, 11, 3, 5), 3) == [
        utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 6, 30), utc(2024, 11, 3, 7, 30)]


# ---------------------------------------------------------------- daylight saving (rq/cron.py)
# New York: 2024-03-10 07:00 UTC 02:00 EST -> 03:00 EDT,
#           2024-11-03 06:00 UTC 02:00 EDT -> 01:00 EST
# Berlin:   2024-03-31 01:00 UTC 02:00 CET -> 03:00 CEST,
#           2024-10-27 01:00 UTC 03:00 CEST -> 02:00 CET
NY = "America/New_York"


def test_dst_skipped_hour_fixed_time_is_shifted_forward() -> None:
    # 02:30 does not exist on 2024-03-10: it fires at 03:30 EDT (07:30 UTC), once
    assert slots("30 2 * * *", NY, utc(2024, 3, 9, 12), 3) == [
        utc(2024, 3, 10, 7, 30), utc(2024, 3, 11, 6, 30), utc(2024, 3, 12, 6, 30)]
    assert slots("30 2 * * *", "Europe/Berlin", utc(2024, 3, 30, 12), 2) == [
        utc(2024, 3, 31, 1, 30), utc(2024, 4, 1, 0, 30)]


def test_dst_skipped_hour_has_no_wildcard_slots() -> None:
    # 01:30 EST, (02:30 does not exist), 03:30 EDT
    assert slots("30 * * * *", NY, utc(2024, 3, 10, 6), 3) == [
        utc(2024, 3, 10, 6, 30), utc(2024, 3, 10, 7, 30), utc(2024, 3, 10, 8, 30)]
    assert slots("* * * * *", NY, utc(2024, 3, 10, 6, 58), 3) == [
        utc(2024, 3, 10, 6, 59), utc(2024, 3, 10, 7, 0), utc(2024, 3, 10, 7, 1)]


def test_dst_repeated_hour_fixed_time_fires_once() -> None:
    # 01:30 happens at 05:30 UTC (EDT) and 06:30 UTC (EST) on 2024-11-03: only the first
    assert slots("30 1 * * *", NY, utc(2024, 11, 2, 12), 2) == [
        utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30)]
    assert slots("30 2 * * *", "Europe/Berlin", utc(2024, 10, 26, 12), 2) == [
        utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)]


def test_dst_repeated_hour_wildcard_fires_in_both_occurrences() -> None:
    assert slots("30 * * * *", NY, utc(2024, 11, 3, 5), 3) == [
        utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 6, 30), utc(2024, 11, 3, 7, 30)]
    assert slots("* * * * *", NY, utc(2024, 11, 3, 5, 58), 3) == [
        utc(2024, 11, 3, 5, 59), utc(2024, 11, 3, 6, 0), utc(2024, 11, 3, 6, 1)]
    # from 01:50 EDT the next quarter hour is 01:00 EST, an earlier wall-clock time
    assert cron.next_slot("*/15 * * * *", NY, utc(2024, 11, 3, 5, 50)) == utc(2024, 11, 3, 6)


@pytest.mark.parametrize("start,end,count", [
    (utc(2024, 3, 10, 5), utc(2024, 3, 11, 4), 23 * 6),    # the 23-hour local day
    (utc(2024, 11, 3, 4), utc(2024, 11, 4, 5), 25 * 6),    # the 25-hour local day
])
def test_dst_slots_only_move_forward_and_never_repeat(start: int, end: int, count: int) -> None:
    got, after = [], start - 1
    while (nxt := cron.next_slot("*/10 * * * *", NY, after)) is not None and nxt < end:
        got.append(nxt)
        after = nxt
    assert len(got) == count
    assert got == sorted(set(got)) and all(b - a == 600 for a, b in zip(got, got[1:]))


def test_dst_daily_entry_fires_once_per_local_day_all_year() -> None:
    got = []
    after = utc(2024, 1, 1)
    while (nxt := cron.next_slot("30 1 * * *", NY, after)) is not None and nxt < utc(2025, 1, 1):
        got.append(nxt)
        after = nxt
    assert len(got) == 366  # 2024 is a leap year
    assert {datetime.fromtimestamp(t, cron.ZoneInfo(NY)).strftime("%H:%M") for t in got} == {
        "01:30"}


# ---------------------------------------------------------------- slot helpers

def test_last_slot_before_is_the_latest_strictly_between() -> None:
    base = utc(2024, 5, 1, 12)
    assert cron.last_slot_before("* * * * *", "UTC", base + 300, base) == base + 240
    assert cron.last_slot_before("0 * * * *", "UTC", base + 3 * 3600, base) == base + 2 * 3600
    assert cron.last_slot_before("0 * * * *", "UTC", base + 3600, base) is None
    assert cron.last_slot_before("0 0 1 1 *", "UTC", utc(2030, 6, 1), utc(2020, 6, 1)) == utc(
        2030, 1, 1)
    assert cron.last_slot_before("* 3 * * *", "UTC", utc(2024, 1, 10), utc(2024, 1, 1)) == utc(
        2024, 1, 9, 3, 59)


def test_s9_4_shown_next_skips_missed_slots() -> None:
    now = utc(2024, 5, 1, 12, 0) + 30
    assert cron.shown_next("0 * * * *", "UTC", None, now) == utc(2024, 5, 1, 13)
    assert cron.shown_next("* * * * *", "UTC", utc(2024, 5, 1, 12, 1), now) == utc(
        2024, 5, 1, 12, 2)
    assert cron.shown_next("* * * * *", "UTC", utc(2024, 5, 1, 9), now) == utc(2024, 5, 1, 12, 0)


# ---------------------------------------------------------------- S9.3 firing decision

T = utc(2024, 5, 1, 12)  # a slot of every entry below


def kinds(p: cron.Plan) -> list[tuple[str, str, int]]:
    return [(a.key, a.kind, a.last_fire) for a in p.actions]


def test_s9_2_entry_seen_first_never_fires_past_slots() -> None:
    e = entry("0 * * * *", id="h")
    p = cron.plan("q", [e], {}, True, T + 30)
    assert p.actions == ()
    assert p.base == {"h": Track(T + 30)}
    assert p.wake_at == T + 3600 - 60


def test_s9_3_seen_first_then_the_next_slot_fires_up_to_60_s_early() -> None:
    e = entry("* * * * *", id="m")
    p = cron.plan("q", [e], {}, True, T + 30)
    assert kinds(p) == [("m", FIRE, T + 60)]
    assert p.actions[0].message == {"dest": "q", "src": "cron", "due": T + 60}
    assert p.wake_at == T + 120 - 60


@pytest.mark.parametrize("now,fires", [
    (T - 61, False), (T - 60, True), (T, True), (T + 60, True),
])
def test_s9_3_fire_window_is_60_s_either_side(now: int, fires: bool) -> None:
    e = entry("0 * * * *", id="h")
    p = cron.plan("q", [e], {"h": Track(T - 3600)}, True, now)
    if fires:
        assert kinds(p) == [("h", FIRE, T)]
        assert p.actions[0].message == {"dest": "q", "src": "cron", "due": T}
    else:
        assert p.actions == () and p.wake_at == T - 60


def test_s9_3_each_slot_in_the_window_fires_once_in_order() -> None:
    e = entry("* * * * *", id="m")
    p = cron.plan("q", [e], {"m": Track(T - 60)}, True, T + 30)
    assert kinds(p) == [("m", FIRE, T), ("m", FIRE, T + 60)]
    again = cron.plan("q", [e], {"m": Track(T + 60)}, True, T + 31)
    assert again.actions == ()


def test_s9_3_missed_slots_are_skipped_without_catch_up() -> None:
    e = entry("0 * * * *", id="h")
    p = cron.plan("q", [e], {"h": Track(T - 3 * 3600, "old")}, True, T + 1800)
    assert kinds(p) == [("h", SKIP, T)]
    assert p.actions[0].message is None
    assert p.wake_at == T + 3600 - 60


def test_s9_3_catch_up_creates_exactly_one_message_due_now() -> None:
    e = entry("0 * * * *", id="h", catch_up=True, param1="x")
    now = T + 1800.25
    p = cron.plan("q", [e], {"h": Track(T - 3 * 3600)}, True, now)
    assert kinds(p) == [("h", CATCH_UP, T)]
    assert p.actions[0].message == {"dest": "q", "src": "cron", "param1": "x", "due": now}


def test_s9_3_missed_slots_then_the_slot_in_the_window() -> None:
    e = entry("0 * * * *", id="h")
    p = cron.plan("q", [e], {"h": Track(T - 3 * 3600)}, True, T + 30)
    assert kinds(p) == [("h", SKIP, T - 3600), ("h", FIRE, T)]
    c = entry("0 * * * *", id="h", catch_up=True)
    p = cron.plan("q", [c], {"h": Track(T - 3 * 3600)}, True, T + 30)
    assert [(a.kind, a.last_fire, a.message and a.message["due"]) for a in p.actions] == [
        (CATCH_UP, T - 3600, T + 30), (FIRE, T, T)]


def test_s9_3_nothing_changes_while_not_up() -> None:
    state = {"h": Track(T - 3 * 3600, "x"), "gone": Track(1)}
    e = entry("0 * * * *", id="h", catch_up=True)
    p = cron.plan("q", [e, entry("* * * * *", id="new")], state, False, T + 30)
    assert p.actions == () and p.base == state and p.wake_at is None


def test_s9_2_removed_entries_are_dropped() -> None:
    state = {"h": Track(T - 600, "a"), "gone": Track(T - 600, "b")}
    p = cron.plan("q", [entry("0 * * * *", id="h")], state, True, T - 300)
    assert p.base == {"h": Track(T - 600, "a")}


def test_s9_3_two_entries_in_the_same_minute_fire_independently() -> None:
    a, b = entry("0 * * * *", param1="a"), entry("0 12 * * *", param1="b")
    state = {a.key: Track(T - 60), b.key: Track(T - 60)}
    p = cron.plan("q", [a, b], state, True, T)
    assert kinds(p) == [(a.key, FIRE, T), (b.key, FIRE, T)]
    assert [x.message for x in p.actions] == [
        {"dest": "q", "src": "cron", "param1": "a", "due": T},
        {"dest": "q", "src": "cron", "param1": "b", "due": T}]


def test_s9_2_identical_entries_share_one_key() -> None:
    a = entry("0 * * * *", param1="a")
    p = cron.plan("q", [a, entry("0 * * * *", param1="a")], {a.key: Track(T - 60)}, True, T)
    assert kinds(p) == [(a.key, FIRE, T)]


def test_s9_3_entry_in_its_tz() -> None:
    e = entry("0 14 * * *", id="t", tz="Asia/Tokyo")  # 14:00 JST = 05:00 UTC
    slot = utc(2024, 5, 1, 5)
    p = cron.plan("q", [e], {"t": Track(slot - 86400)}, True, slot - 45)
    assert kinds(p) == [("t", FIRE, slot)]


def test_s9_3_entry_that_never_fires() -> None:
    p = cron.plan("q", [entry("0 0 31 2 *", id="x")], {}, True, T)
    assert p.actions == () and p.wake_at is None and p.base == {"x": Track(T)}


# ---------------------------------------------------------------- cron.state.json

def test_s9_2_state_codec_round_trip_and_integers() -> None:
    state = {"b": Track(T, "20240501.1200.00.000.1"), "a": Track(T + 0.5)}
    raw = cron.dump_state(state)
    assert json.loads(raw) == {"a": {"last_fire": T + 0.5, "last_msg_id": None},
                               "b": {"last_fire": T, "last_msg_id": "20240501.1200.00.000.1"}}
    assert b'"last_fire":%d,' % T in raw
    assert cron.parse_state(json.loads(raw)) == state


@pytest.mark.parametrize("data", [None, [], "x", {"k": 1}, {"k": {"last_fire": "1"}},
                                  {"k": {"last_fire": True}}, {"k": {}}])
def test_s9_2_malformed_state_is_left_out(data: object) -> None:
    assert cron.parse_state(data) == {}


def test_s9_2_state_keeps_good_keys_beside_bad_ones() -> None:
    data = {"ok": {"last_fire": 5, "last_msg_id": 7}, "bad": {"last_fire": None}}
    assert cron.parse_state(data) == {"ok": Track(5, None)}


def test_a_queue_process_imports_croniter_only_for_a_schedule() -> None:
    """Issue 14 section 4: rq.cron (croniter, zoneinfo) is loaded by a queue with a schedule
    or a tracking state only; the queue process's own modules do not pull it in."""
    import os
    import subprocess
    import sys

    from rqtest import REPO
    probe = ("import sys\nimport rq.queue.__main__, rq.queue.process\n"
             "print(sorted({'croniter', 'rq.cron', 'zoneinfo'} & set(sys.modules)))\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60, check=True)
    assert res.stdout.strip() == "[]"
