"""The queue page's bulk requeue and purge (issue 16 item 6): `POST /q/NAME/bulk` against a
real rq-mgr.  A form post first gets a confirmation page counting what would move (a dry
run: nothing moves), then the confirmed post moves them and flashes the count; JSON clients
get the queue's reply.  Cross-origin posts are refused like every POST (S14.5)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from rqtest import wait_for, write_script

from rq import client as rqclient

ERR_SH = '#!/bin/sh\necho "err by design $RQ_PARAM1" >&3\n'


def counts(root: Path, name: str) -> dict[str, int]:
    return rqclient.call_queue(str(root), name, "num_messages")


@pytest.fixture(scope="module")
def failing(mgr_root: Path) -> str:
    """Queue `failing`, whose jobs all end in err; three of its messages there."""
    script = write_script(mgr_root.parent / "err.sh", ERR_SH)
    reply = rqclient.call_mgr(str(mgr_root), "create_queue",
                              {"name": "failing", "script": str(script), "exec_prefix": ""})
    assert reply[0] == "success", reply
    wait_for(lambda: rqclient.call_queue(str(mgr_root), "failing", "ping") == ["pong"]
             if (mgr_root / "queue" / "failing" / "queue.sock").exists() else False,
             what="queue failing up")
    for n in range(3):
        reply = rqclient.call_queue(str(mgr_root), "failing", "create_message",
                                    {"dest": "failing", "param1": f"p{n}"})
        assert reply[0] == "ok", reply
    wait_for(lambda: counts(mgr_root, "failing")["err"] == 3, what="three messages in err")
    return "failing"


def flashes(client: FlaskClient) -> list[str]:
    with client.session_transaction() as session:
        return [text for _, text in session.pop("_flashes", [])]


def test_queue_page_has_the_bulk_forms(client: FlaskClient, failing: str) -> None:
    body = client.get(f"/q/{failing}").get_data(as_text=True)
    for form in ("bulk-requeue", "bulk-purge"):
        assert re.search(rf'<form [^>]*action="/q/{failing}/bulk" id="{form}"', body)
    assert 'name="older_than" value="7d"' in body


def test_requeue_asks_with_the_count_then_moves_and_flashes_it(
        mgr_root: Path, client: FlaskClient, failing: str) -> None:
    resp = client.post(f"/q/{failing}/bulk", data={"action": "requeue", "state": "err"})
    body = resp.get_data(as_text=True)
    assert resp.status_code == 200 and "<h1>Requeue 3 messages?</h1>" in body
    assert '<input type="hidden" name="confirm" value="yes">' in body
    assert '<input type="hidden" name="action" value="requeue">' in body
    assert counts(mgr_root, failing)["err"] == 3  # a dry run moved nothing

    resp = client.post(f"/q/{failing}/bulk",
                       data={"action": "requeue", "state": "err", "confirm": "yes"})
    assert resp.status_code == 303 and resp.location.endswith(f"/q/{failing}")
    assert flashes(client) == ["Requeued 3 messages"]
    # they ran again (and failed again, count kept: S6.6)
    wait_for(lambda: counts(mgr_root, failing)["err"] == 3 and
             counts(mgr_root, failing)["que"] + counts(mgr_root, failing)["run"] == 0,
             what="the requeued messages to fail again")


def test_search_narrows_the_requeue(mgr_root: Path, client: FlaskClient, failing: str) -> None:
    resp = client.post(f"/q/{failing}/bulk", data={
        "action": "requeue", "state": "err", "query[status]": "design p1", "x_format": "json",
        "dry_run": "1"})
    assert resp.get_json() == ["ok", 1]


def test_purge_json_and_bad_input(mgr_root: Path, client: FlaskClient, failing: str) -> None:
    resp = client.post(f"/q/{failing}/bulk", data={"action": "purge", "older_than": "1w",
                                                   "x_format": "json"})
    assert resp.get_json() == ["ok", 0]  # none is a week old
    resp = client.post(f"/q/{failing}/bulk", data={"action": "purge", "older_than": "x"})
    assert resp.status_code == 400 and "400 - Invalid older_than" in resp.get_data(as_text=True)
    resp = client.post(f"/q/{failing}/bulk", data={"action": "nuke", "x_format": "json"})
    assert (resp.status_code, resp.get_json()) == (400, ["fail", "Invalid bulk action"])
    resp = client.post("/q/nosuch/bulk", data={"action": "purge", "older_than": "0"})
    assert resp.status_code == 404

    resp = client.post(f"/q/{failing}/bulk", data={"action": "purge", "older_than": "0",
                                                   "state": "err"})
    assert "<h1>Purge 3 messages?</h1>" in resp.get_data(as_text=True)
    resp = client.post(f"/q/{failing}/bulk", data={"action": "purge", "older_than": "0",
                                                   "state": "err", "confirm": "yes"})
    assert resp.status_code == 303 and flashes(client) == ["Purged 3 messages"]
    assert counts(mgr_root, failing)["err"] == 0


def test_cross_origin_post_is_refused(mgr_root: Path, client: FlaskClient,
                                      failing: str) -> None:
    resp: Any = client.post(f"/q/{failing}/bulk",
                            data={"action": "purge", "older_than": "0", "confirm": "yes"},
                            headers={"Origin": "http://evil.example"})
    assert resp.status_code == 403
    assert "Cross-origin request refused" in resp.get_data(as_text=True)
