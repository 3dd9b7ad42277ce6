"""The Stats pages in a real browser (issue 5, "a browser check that the Stats page
renders its charts from a real result"): headless Chromium against a real rq-web over a
real rq-mgr root, and a result made by the real analytics job over real messages.

The whole path is driven from the page: the empty Stats page's "Run analytics now"
button posts to stats/run (S14.5 same-origin POST), which queues a message on the builtin
`analytics` queue (configured as rq-install does), whose script runs the real PySpark job
(default local master) over the root's event log (S13); static/stats.js then notices the newly
published result and offers a reload, and the reloaded page draws its SVG charts from it.
The counts the page shows are checked against the messages the test sent.  Screenshots go
to tests/artifacts/ (gitignored) for a human look.

Skipped, with the reason, while the analytics job (rq/analytics/, the builtin script),
pyspark or Java is missing.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import WebServer, browser_unavailable, screenshot
from rqtest import REPO, make_queue, short_id, wait_for, write_script
from webtest import build_root, running

from rq import client
from rq.install import builtin_queue_config


def analytics_unavailable() -> str | None:
    if not (REPO / "rq" / "analytics" / "__main__.py").exists() or \
            not (REPO / "rq" / "builtin" / "analytics.py").exists():
        return "the analytics job (rq/analytics/, rq/builtin/analytics.py) does not exist yet"
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed"
    if shutil.which("java") is None:
        return "java is not installed"
    return None


UNAVAILABLE = browser_unavailable() or analytics_unavailable()
pytestmark = [pytest.mark.skipif(UNAVAILABLE is not None, reason=f"cannot run: {UNAVAILABLE}"),
              pytest.mark.timeout(900)]

JOB_TIMEOUT_MS = 420_000  # one Spark run on a busy 2-core machine
# param1 "err" fails the message with a status text, anything else completes it.
FLAKY_SCRIPT = """#!/bin/sh
if [ "$RQ_PARAM1" = err ]; then echo "err boom <b>$RQ_PARAM2</b>" >&3; exit 1; fi
echo "done fine" >&3
"""
SENT = {"test": (12, 0), "flaky": (2, 4)}  # queue -> (done, err)


@dataclass
class Site:
    root: Path
    url: str  # ends with ROOT's "/"


def state(root: Path, queue: str, full: str) -> str | None:
    reply = client.call_queue(str(root), queue, "get_message_state", {"msg_id": short_id(full)},
                              timeout=10)
    return reply[1] if reply[0] == "ok" else None


def send(root: Path, queue: str, **fields: str) -> str:
    reply = client.call_queue(str(root), queue, "create_message", {"dest": queue, **fields},
                              timeout=30)
    assert reply[0] == "ok", reply
    return str(reply[1])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("browser_stats")
    root = build_root(base)
    make_queue(root, "flaky", script=write_script(base / "flaky.sh", FLAKY_SCRIPT))
    make_queue(root, **builtin_queue_config("analytics"))  # as rq-install creates it
    with running(root):
        sent = [("test", send(root, "test")) for _ in range(SENT["test"][0])]
        sent += [("flaky", send(root, "flaky", param1="err", param2=str(i)))
                 for i in range(SENT["flaky"][1])]
        sent += [("flaky", send(root, "flaky")) for _ in range(SENT["flaky"][0])]
        for queue, full in sent:
            wait_for(lambda: state(root, queue, full) in ("done", "err"), 60,  # noqa: B023
                     what=f"{full} to finish")
        web = WebServer(root)
        try:
            yield Site(root, web.url)
        finally:
            web.stop()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect
    return pw_expect(locator)


def tile(page: Any, key: str) -> Any:
    return page.locator(f'#summary [data-k="{key}"]')


def test_run_button_then_charts_from_the_real_result(site: Site, page: Any) -> None:
    page.goto(site.url + "stats")
    expect(page.locator("#stats-empty")).to_contain_text("No analytics run yet")
    screenshot(page, "stats_empty.png")

    page.get_by_role("button", name="Run analytics now").click()
    expect(page.locator("ul.flash")).to_contain_text("Analytics run queued as message")
    assert page.url == site.url + "stats"
    notice = page.locator("#new-result")
    expect(notice).to_be_visible(timeout=JOB_TIMEOUT_MS)  # stats.js saw the new run
    notice.get_by_role("link").click()

    expect(page.locator("svg.chart")).to_have_count(4)
    expect(page.locator("#stats-empty")).to_have_count(0)
    expect(page.locator("#run-id")).to_have_text(re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$"))
    expect(page.locator("#run-time")).to_have_text(re.compile(r"ago$|^now$"))  # relative
    expect(page.locator("#run-clock")).to_have_text(re.compile(r"^\(\d{4}-\d\d-\d\d "))
    expect(tile(page, "done")).to_have_text(str(sum(d for d, _ in SENT.values())))
    expect(tile(page, "err")).to_have_text(str(sum(e for _, e in SENT.values())))
    assert page.locator("#chart-throughput rect.s-done").count() >= 1
    assert page.locator("#chart-throughput rect.s-err").count() >= 1
    assert page.locator("#chart-wait rect.s-wait").count() >= 1
    assert page.locator("#chart-run circle.l-p50").count() >= 1
    assert page.locator("#chart-error-rate circle.l-err").count() >= 1
    rows = page.locator("#queue-stats tbody tr[data-queue]")
    expect(rows.filter(has_text="flaky")).to_have_count(1)
    shot = screenshot(page, "stats.png")
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}", file=sys.stderr)

    rows.filter(has_text="flaky").get_by_role("link").click()
    expect(page.locator("h1")).to_have_text("Stats · flaky")
    expect(tile(page, "done")).to_have_text(str(SENT["flaky"][0]))
    expect(tile(page, "err")).to_have_text(str(SENT["flaky"][1]))
    expect(tile(page, "error_rate")).to_have_text("67 %")
    top = page.locator("#top-errors tbody tr")
    expect(top.first).to_contain_text("boom <b>")  # the status text, escaped, as text
    assert page.locator("#top-errors b").count() == 0
    expect(page.locator("#slowest tbody tr").first).to_contain_text("flaky")
    screenshot(page, "stats_queue.png")

    page.goto(site.url + "q/test/stats")
    expect(tile(page, "done")).to_have_text(str(SENT["test"][0]))
    expect(tile(page, "error_rate")).to_have_text("0 %")
    expect(page.locator("#top-errors")).to_contain_text("No errors.")


def test_hostile_texts_in_a_result_never_run(site: Site, page: Any) -> None:
    """Every text of the result (queue names, status texts, ids, run facts) as a payload
    that does something observable if it ever runs (as tests/test_web_xss.py)."""
    from test_web_stats import XSS, XSS_QUEUE, hourly_row, publish, qsum, summary
    payload = "<svg onload=alert(1)>"
    hostile = qsum(3, 2, 0, slowest=[{"queue": XSS_QUEUE, "msg_id": XSS, "run_s": 1.0}])
    result = dict(summary(run_id=XSS, **{XSS_QUEUE: hostile, payload: qsum(1, 1, 0)}),
                  master=payload, inputs=[XSS],
                  lines={"read": 1, "skipped_by_reason": {payload: 1}})
    rows = [hourly_row(XSS_QUEUE, 1_763_776_800, 3, 2, 0, (1.0, 2.0, 3.0))]
    shutil.rmtree(site.root / "analytics", ignore_errors=True)
    publish(site.root, {"summary.json": result, "hourly.json": rows}, run_id="hostile")
    dialogs: list[str] = []
    probes: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: probes.append(r.url) if "xss-probe" in r.url else None)
    page.goto(site.url + "stats")
    expect(page.locator("#run-id")).to_have_text(XSS)
    expect(page.locator("#queue-stats")).to_contain_text(XSS_QUEUE)
    expect(page.locator("#top-errors")).to_contain_text(XSS)
    assert page.evaluate("window.__xss") is None
    assert page.title().startswith("Stats")
    assert not dialogs and not probes
    screenshot(page, "stats_hostile.png")
