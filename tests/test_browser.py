"""The HTML pages in a real browser (SPEC S16): headless Chromium driven by
Playwright against a real rq-web over a real rq-mgr root.

Covers what only a browser shows: the dashboard refreshing itself from q.json
(a new queue appears, counts change without a reload), admin buttons, the
new-message form and upload form posting to web.actions, the message page
following its message to `done`, and the tail view rendering a running job's
output (ANSI colours included) as it is written.  Screenshots of the pages go
to tests/artifacts/ (gitignored) for a human look.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import browser_unavailable, screenshot
from rqtest import make_queue, short_id, wait_for, write_script
from webtest import build_root, running

from rq import client

UNAVAILABLE = browser_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no browser: {UNAVAILABLE}")

# Writes a red line, waits for the file named by param1, then a green one.
ANSI_SCRIPT = r"""#!/bin/sh
printf '\033[31mred alert\033[0m first line\n'
echo "run waiting for go" >&3
while [ ! -e "$RQ_PARAM1" ]; do sleep 0.05; done
printf 'second line \033[32mall green\033[0m\n'
echo "done finished" >&3
"""


@dataclass
class Site:
    root: Path
    base: Path
    url: str  # ends with ROOT's "/"

    def queue(self, name: str, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.root), name, cmd, arg, timeout=30)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("browser")
    root = build_root(base)
    make_queue(root, "slow", script=write_script(base / "ansi.sh", ANSI_SCRIPT))
    make_queue(root, "nightly", script=base / "done.sh",
               schedule=[{"cron": "0 3 * * *", "param1": "full"}])
    make_queue(root, "relay", script=base / "done.sh")  # a builtin name (S3.8)
    with running(root, web=True) as web:
        yield Site(root, base, web.url)


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect
    return pw_expect(locator)


def rgb(locator: Any) -> tuple[int, ...]:
    color = locator.evaluate("e => getComputedStyle(e).color")
    return tuple(int(n) for n in re.findall(r"\d+", color)[:3])


# ---------------------------------------------------------------- dashboard


def test_dashboard_shows_a_new_queue_and_live_counts(site: Site, page: Any) -> None:
    page.goto(site.url)
    expect(page.locator("#status")).to_have_text("OPERATIONAL")
    expect(page.locator("#live")).to_have_class(re.compile(r"\bon\b"))  # q.json answered
    expect(page.locator('#builtin-queues tr[data-queue]')).to_have_count(1)
    page.evaluate("window.__sameDocument = true")

    reply = client.call_mgr(str(site.root), "create_queue",
                            {"name": "fresh", "script": str(site.base / "done.sh"),
                             "exec_prefix": "", "num_workers": 1})
    assert reply[0] == "success", reply
    row = page.locator('#custom-queues tr[data-queue="fresh"]')
    expect(row).to_be_visible()
    expect(row.locator("td.name a")).to_have_attribute("href", re.compile(r"/q/fresh$"))
    expect(row.locator('[data-k="status"]')).to_have_text("UP")

    prep = row.locator('[data-k="prep"]')
    expect(prep).to_have_text("0")
    for _ in range(2):
        assert site.queue("fresh", "prep_message", {"dest": "fresh"})[0] == "ok"
    expect(prep).to_have_text("2")
    expect(page.locator('[data-total="prep"]')).to_have_text(re.compile(r"^[1-9]\d*$"))
    assert page.evaluate("window.__sameDocument") is True, "the dashboard reloaded itself"
    # the new row's buttons post to the new queue
    expect(row.locator('form[data-suffix="adminoper"]')).to_have_attribute(
        "action", re.compile(r"/q/fresh/adminoper$"))


def test_dashboard_puts_a_live_added_analytics_queue_among_the_builtins(site: Site,
                                                                      page: Any) -> None:
    """S3.8, issue 16 item 8: dashboard.js knew no `analytics`, so a row added live landed
    among the custom queues; the page now gives it the server's one builtin list."""
    page.goto(site.url)
    expect(page.locator("#live")).to_have_class(re.compile(r"\bon\b"))
    reply = client.call_mgr(str(site.root), "create_queue",
                            {"name": "analytics", "script": str(site.base / "done.sh"),
                             "exec_prefix": "", "num_workers": 1})
    assert reply[0] == "success", reply
    expect(page.locator('#builtin-queues tr[data-queue="analytics"]')).to_be_visible()
    expect(page.locator('#custom-queues tr[data-queue="analytics"]')).to_have_count(0)


def test_dashboard_screenshot_and_schedule(site: Site, page: Any) -> None:
    assert site.queue("test", "create_message", {"dest": "test", "param1": "shot"})[0] == "ok"
    page.goto(site.url)
    row = page.locator('#custom-queues tr[data-queue="nightly"]')
    expect(row.locator(".sched code.cron")).to_have_text("0 3 * * *")
    expect(row.locator(".sched time.rel")).to_have_text(re.compile(r"^in \d+ (s|min|h)$"))
    expect(row.get_by_role("button", name="Run Now")).to_be_visible()
    expect(page.locator("#live")).to_have_class(re.compile(r"\bon\b"))
    path = screenshot(page, "dashboard.png")
    assert path.stat().st_size > 10_000


def test_new_queue_form_creates_a_queue(site: Site, page: Any) -> None:
    page.goto(site.url)
    page.locator("#new-queue").click()
    page.fill("#queue_name", "from_form")
    page.fill("#queue_script", str(site.base / "done.sh"))
    page.fill("#queue_exec_prefix", "")
    page.check('input[name="queue[coalesce_params][]"][value="2"]')
    page.locator("#new-queue-form input[type=submit]").click()
    expect(page.locator("ul.flash")).to_contain_text("queue created")
    expect(page).to_have_url(re.compile(r"/q/from_form$"))
    expect(page.locator("#queue-status")).to_have_text("UP")  # the page refreshes itself
    page.locator("details.config summary").click()
    expect(page.locator("#queue-config")).to_be_visible()
    config = json.loads(page.locator("#queue-config").text_content())
    assert config["name"] == "from_form" and config["coalesce_params"] == [2]


# ---------------------------------------------------------------- queue page


def test_pause_and_resume_from_the_queue_page(site: Site, page: Any) -> None:
    page.goto(site.url + "q/test")
    expect(page.locator("#queue-status")).to_have_text("UP")
    page.get_by_role("button", name="Pause", exact=True).click()
    expect(page.locator("ul.flash")).to_contain_text("Successfully paused queue test")
    expect(page).to_have_url(re.compile(r"/q/test$"))
    expect(page.locator("#queue-status")).to_have_text("PAUSE")
    assert (site.root / "config" / "test.pause").exists()

    page.get_by_role("button", name="Resume", exact=True).click()
    expect(page.locator("ul.flash")).to_contain_text("Successfully resumed queue test")
    expect(page.locator("#queue-status")).to_have_text("UP")
    assert not (site.root / "config" / "test.pause").exists()
    screenshot(page, "queue.png")


def test_queue_page_lists_new_messages_live(site: Site, page: Any) -> None:
    page.goto(site.url + "q/fresh")
    page.evaluate("window.__sameDocument = true")
    reply = site.queue("fresh", "prep_message", {"dest": "fresh", "src": "live<list>"})
    msg_id = short_id(reply[1])
    entry = page.locator(f'#prep-list li[data-id="{msg_id}"]')
    expect(entry.locator("a.mid")).to_have_attribute("href", re.compile(f"/q/fresh/{msg_id}$"))
    expect(entry.locator("time.rel")).to_have_text(re.compile(r"(ago|now)$"))
    expect(page.locator('#prep-list [data-size="prep"]').first).to_have_text(
        str(site.queue("fresh", "num_messages")["prep"]))
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "queue_live.png")


# ---------------------------------------------------------------- messages


def test_message_from_the_form_runs_to_done(site: Site, page: Any) -> None:
    page.goto(site.url + "q/test/new_message")
    page.fill("#mesg_param1", "from the <form>")
    screenshot(page, "new_message.png")
    page.locator("#mesg_submit_field input[type=submit]").click()
    link = page.locator("main a", has_text=re.compile(r"/q/test/\d{8}\."))
    expect(link).to_be_visible()
    link.click()
    expect(page.locator("#msg-state")).to_have_text("done")  # the page follows the message
    info = page.locator("table.message-info")
    expect(info).to_contain_text("done - ok")
    param_row = info.locator("tr.hideme", has_text="param1")
    expect(param_row).to_be_hidden()
    page.locator("label.toggle").click()
    expect(param_row).to_be_visible()
    expect(param_row).to_contain_text("from the <form>")
    expect(page.locator("#tail-frame")).to_be_visible()
    expect(page.frame_locator("#tail-frame").get_by_text("hello from")).to_be_visible()
    screenshot(page, "message.png")


def test_attachment_uploaded_on_the_prep_page(site: Site, page: Any) -> None:
    msg_id = short_id(site.queue("test", "prep_message", {"dest": "test", "src": "upload"})[1])
    data = b'name,"quoted, value"\nrq,1\n'
    upload = site.base / "report.csv"
    upload.write_bytes(data)
    page.goto(site.url + f"q/test/{msg_id}")
    expect(page.locator("#msg-state")).to_have_text("prep")
    page.set_input_files("#filedata", str(upload))
    page.locator("#upload-form button[type=submit]").click()
    expect(page.locator("ul.flash")).to_contain_text("Attached message successfully")
    row = page.locator("#attachments tbody tr", has_text="report.csv")
    expect(row.locator("td.md5")).to_have_text(hashlib.md5(data).hexdigest())
    expect(row.locator("a")).to_have_attribute("href", re.compile(r"/attach/report\.csv$"))
    screenshot(page, "prep.png")

    page.get_by_role("button", name="Commit").click()
    expect(page.locator("ul.flash")).to_contain_text("Message committed successfully")
    expect(page.locator("#msg-state")).to_have_text("done")
    expect(page.locator("#attachments")).to_contain_text("report.csv")


def test_tail_view_follows_a_running_job_with_colours(site: Site, page: Any) -> None:
    go = site.base / "go-tail"
    msg_id = short_id(site.queue("slow", "create_message",
                                 {"dest": "slow", "param1": str(go)})[1])
    wait_for(lambda: site.queue("slow", "get_message_state", {"msg_id": msg_id}) == ["ok", "run"],
             20, 0.05, "the job to start")
    page.goto(site.url + f"q/slow/{msg_id}")
    expect(page.locator("#msg-state")).to_have_text("run")
    expect(page.frame_locator("#tail-frame").get_by_text("red alert")).to_be_visible()

    page.locator("#full-tail").click()
    red = page.locator("#tail-log span", has_text="red alert")
    expect(red).to_be_visible()
    r, g, b = rgb(red)
    assert r > 150 and g < 100 and b < 100, (r, g, b)
    expect(page.locator("#tail-log")).not_to_contain_text("\x1b")
    expect(page.locator("#tail-log")).not_to_contain_text("all green")

    go.touch()
    green = page.locator("#tail-log span", has_text="all green")
    expect(green).to_be_visible()
    r, g, b = rgb(green)
    assert g > 150 and r < 100, (r, g, b)
    wait_for(lambda: site.queue("slow", "get_message_state", {"msg_id": msg_id})
             == ["ok", "done"], 20, 0.05, "the job to finish")
    screenshot(page, "tail.png")
