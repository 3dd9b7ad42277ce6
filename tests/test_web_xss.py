"""Cross-site scripting through everything a page shows (SPEC S14.8, S14.9, S16, S16.6):
message fields, status texts, log lines (ANSI included), attachment names, queue config
values, form.json labels and help, flashes and error texts.

About 300 generated payloads, each doing something observable if it ever runs
(`alert`/`confirm`/`prompt`, setting `window.__xss`, changing `document.title`, or loading
`/xss-probe`), are stored through the real interfaces (queue sockets, a queue script
writing fd 3 and stdout, the manager, HTML forms).  Every page is then loaded in headless
Chromium against the web server rq-mgr runs, after its live refreshes have run (waited for
on real content, never with sleeps), and must show no dialog, no `window.__xss`, no title
change and no probe request; the raw HTML must hold no payload unescaped.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from browser import browser_unavailable
from rqtest import make_queue, short_id, wait_for, write_script
from webtest import build_root, running

from rq import client
from rq.errors import Fail
from rq.store import Store, check_attachment_name

UNAVAILABLE = browser_unavailable()
pytestmark = [pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no browser: {UNAVAILABLE}"),
              pytest.mark.timeout(600)]

TIMEOUT_MS = 20_000
PROBE = "/xss-probe"
ESC = "\x1b"

# Prints the log payloads, reports the status payloads on fd 3, may hold until released,
# then completes as $XSS_FINAL with the text of $XSS_FINAL_TEXT.
XSS_SCRIPT = r"""#!/bin/sh
cat "$XSS_LOG"
printf 'run %s\n' "$(cat "$XSS_STATUS")" >&3
if [ "$XSS_HOLD" = 1 ]; then
  while [ ! -e "$XSS_RELEASE" ]; do sleep 0.05; done
fi
printf '%s %s\n' "$XSS_FINAL" "$(cat "$XSS_FINAL_TEXT")" >&3
"""


# ---------------------------------------------------------------- payloads


ACTIONS = ["alert(1)", "window.__xss=1", "top.__xss=1", "parent.__xss=1", "confirm(1)",
           "prompt(1)", "document.title=/XSSED/.source", "window.__xss=document.domain"]
TEMPLATES = [
    "<script>{a}</script>", "<SCRIPT>{a}</SCRIPT>", "<script src=data:,{a}></script>",
    "<img src={p} onerror={a}>", '<img src="{p}" onerror="{a}">', "<svg onload={a}>",
    "<svg/onload={a}>", "<body onload={a}>", '<iframe src="javascript:{a}"></iframe>',
    '<a href="javascript:{a}">x</a>', "javascript:{a}", '"><script>{a}</script>',
    "'><script>{a}</script>", '" autofocus onfocus="{a}" x="', "' autofocus onfocus='{a}' x='",
    "</textarea><script>{a}</script>", "</script><script>{a}</script>",
    "</title><script>{a}</script>", "</style><script>{a}</script>",
    "</pre><img src={p} onerror={a}>", "</code><svg onload={a}>",
    "<details open ontoggle={a}>", "<input autofocus onfocus={a}>",
    "<video><source onerror={a}></video>", "<math><mtext><table><mglyph><style>"
    "<img src={p} onerror={a}>", "{{{{constructor.constructor('{a}')()}}}}",
    "\\u003cscript\\u003e{a}\\u003c/script\\u003e", "&lt;script&gt;{a}&lt;/script&gt;",
    "%3Cscript%3E{a}%3C/script%3E", "<scr<script>ipt>{a}</scr</script>ipt>",
    '<object data="javascript:{a}"></object>', '<embed src="javascript:{a}">',
    '<meta http-equiv="refresh" content="0;url=javascript:{a}">',
    "<marquee onstart={a}>x</marquee>", "<form><button formaction=javascript:{a}>x",
    "<img src=`{p}` onerror=`{a}`>", "<x onclick={a}>click</x>",
    "http://127.0.0.1:1/\"><img src={p} onerror={a}>", "https://e.example/'><svg onload={a}>",
    "<base href=javascript:{a}//>", "<link rel=stylesheet href=javascript:{a}>",
    # attribute breakouts that S4.8 allows as attachment names
    '" onmouseover="{a}', "' onmouseover='{a}", 'x" onerror="{a}" y=".png', "data:text/html,{a}",
]
LITERALS = ["{{7*7}}", "{{'ssti'|upper}}", "${7*7}", "#{7*7}", "<%= 7*7 %>",
            "{{'TEMPLATE'~'-RAN'}}", "{% if 1 %}{{'ssti'|upper}}{% endif %}",
            "\u202e<script>window.__xss=1</script>",
            "\ufeff<img src=/xss-probe onerror=alert(1)>",
            "<img\tsrc=/xss-probe\tonerror=alert(1)>",
            "<img\u00a0src=/xss-probe onerror=alert(1)>", "<!--<script>alert(1)//-->"]


def payloads() -> list[str]:
    out = [t.format(a=a, p=PROBE) for t in TEMPLATES for a in ACTIONS[:6]]
    out += [t.format(a=ACTIONS[6 + i % 2], p=PROBE) for i, t in enumerate(TEMPLATES)]
    out += LITERALS
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def log_lines(ps: list[str]) -> list[str]:
    """What the job prints: every payload plain, red, bold-underlined, inside OSC
    hyperlinks and titles, after a carriage return, and as a URL to be linked."""
    lines = []
    for i, p in enumerate(ps):
        lines.append(p)
        lines.append(f"{ESC}[31m{p}{ESC}[0m tail")
        if i % 3 == 0:
            lines.append(f"{ESC}[1;4;38;5;196m{p}{ESC}[22m{ESC}[0m")
            lines.append(f"{ESC}]8;;javascript:{ACTIONS[i % 6]}{ESC}\\{p}{ESC}]8;;{ESC}\\")
            lines.append(f"{ESC}]0;{p}\x07visible text")
            lines.append(f"progress 10%\r{p}")
            lines.append(f"see http://127.0.0.1:1/q/{p} now")
    lines.append("XSS-LOG-END")
    return lines


def attachment_names(ps: list[str]) -> list[str]:
    """The payloads S4.8 accepts as attachment names (no / ~ ? [ ] % | $ & < >)."""
    out = []
    for p in ps:
        try:
            check_attachment_name(p)
        except Fail:
            continue
        if "/" not in p and len(p.encode()) <= 200 and p not in out:
            out.append(p)
    return out


# ---------------------------------------------------------------- the site


@dataclass
class Site:
    root: Path
    base: Path
    url: str                   # ends with ROOT's "/"
    payloads: list[str]
    done_id: str               # queue xss, done, all payloads everywhere, payload attachments
    prep_id: str               # queue xss, prep, payload attachments and webhooks
    relayed_id: str            # queue xssrelay, relayed to a payload "URL"
    err_id: str                # queue xsserr, err with the payloads as its text
    attachments: list[str]
    release: Path
    status_text: str
    held: list[str] = field(default_factory=list)

    def queue(self, name: str, cmd: str, arg: Any = None) -> Any:
        return client.call_queue(str(self.root), name, cmd, arg, timeout=30)

    def state(self, name: str, msg_id: str) -> str | None:
        found = Store(str(self.root), name).locate(msg_id)
        return found[0] if found else None

    def msg_dir(self, name: str, msg_id: str) -> Path:
        found = Store(str(self.root), name).locate(msg_id)
        assert found is not None, msg_id
        return Path(found[1])


def xss_config(base: Path, ps: list[str], final: str, hold: bool) -> dict[str, Any]:
    env = {"XSS_LOG": str(base / "log.txt"), "XSS_STATUS": str(base / "status.txt"),
           "XSS_RELEASE": str(base / "release"), "XSS_HOLD": "1" if hold else "0",
           "XSS_FINAL": final, "XSS_FINAL_TEXT": str(base / f"final-{final}.txt")}
    env.update({f"XSS_P{i}": p for i, p in enumerate(ps[:40])})
    return {"env_vars": env, "exec_prefix": ""}


def pull_config(ps: list[str]) -> dict[str, Any]:
    """A pull-mode queue (its script and exec_prefix are never run) whose every shown
    config value is a payload."""
    return {"mode": "pull", "script": " ".join(ps[:8])[:1000], "exec_prefix": ps[8],
            "env_vars": {p: ps[(i + 9) % len(ps)] for i, p in enumerate(ps[9:60])
                         if not p.startswith("RQ_")},
            "schedule": [{"cron": "0 3 * * *", "id": ps[i], "param1": ps[i + 1],
                          "param2": ps[i + 2], "param3": ps[i + 3], "param4": ps[i + 4]}
                         for i in range(60, 100, 5)],
            "future_key": ps[100:110]}


def form_overrides(ps: list[str]) -> dict[str, Any]:
    keys = ["mesg_dest", "mesg_src", "mesg_param1", "mesg_param2", "mesg_param3",
            "mesg_param4", "mesg_status", "mesg_post_run_webhook"]
    chunk = -(-len(ps) // (2 * len(keys)))
    out = {}
    for i, key in enumerate(keys):
        label = ps[2 * i * chunk:(2 * i + 1) * chunk]
        help_ = ps[(2 * i + 1) * chunk:(2 * i + 2) * chunk]
        out[key] = {"label": " ".join(label), "help": " ".join(help_)}
    return out


def attach_all(root: Path, base: Path, queue: str, msg_id: str, names: list[str],
               ps: list[str]) -> None:
    src = base / "attachment.txt"
    src.write_text("\n".join(ps) + "\n")
    html = base / "evil.html"
    html.write_text("<!doctype html><title>x</title>" + "".join(ps[:60]))
    svg = base / "evil.svg"
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)">'
                   '<script>window.__xss=1;alert(2)</script></svg>')
    for path, name in [(src, n) for n in names] + [(html, "evil.html"), (svg, "evil.svg"),
                                                   (src, "plain.txt")]:
        reply = client.call_queue(str(root), queue, "attach_message",
                                  {"msg_id": msg_id, "pathname": str(path), "name": name})
        assert reply[0] == "ok", (name, reply)


def create(root: Path, queue: str, fields: dict[str, Any], method: str = "create_message") -> str:
    reply = client.call_queue(str(root), queue, method, fields, timeout=30)
    assert reply[0] == "ok", reply
    return short_id(reply[1])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("webxss")
    ps = payloads()
    assert len(ps) >= 200, len(ps)
    root = build_root(base)
    script = write_script(base / "xss.sh", XSS_SCRIPT)
    (base / "log.txt").write_text("\n".join(log_lines(ps)) + "\n")
    status_text = " ".join(ps)
    (base / "status.txt").write_text(status_text)
    (base / "final-done.txt").write_text(status_text)
    (base / "final-err.txt").write_text(status_text)
    (base / "final-relayed.txt").write_text(
        "http://127.0.0.1:1/q/x/\"><img/src=/xss-probe/onerror=alert(1)>")
    make_queue(root, "xss", script=script, **xss_config(base, ps, "done", False))
    make_queue(root, "xsshold", script=script, num_workers=8,
               **xss_config(base, ps, "done", True))
    make_queue(root, "xssrelay", script=script, **xss_config(base, ps, "relayed", False))
    make_queue(root, "xsserr", script=script, **xss_config(base, ps, "err", False))
    make_queue(root, "xsscfg", **pull_config(ps))
    (root / "queue" / "xss" / "form.json").write_text(json.dumps(form_overrides(ps)))
    with running(root, web=True) as web:
        try:
            every = " ".join(ps)
            fields = {"dest": every, "src": every, "param1": every, "param2": every,
                      "param3": every, "param4": every,
                      "orig_msg_id":
                          "http://127.0.0.1:1/q/x/\"><img src=/xss-probe onerror=alert(1)>"}
            names = attachment_names(ps)
            assert len(names) >= 30, len(names)
            done_id = create(root, "xss", fields, "prep_message")
            attach_all(root, base, "xss", done_id, names, ps)
            assert client.call_queue(str(root), "xss", "commit_message",
                                     {"msg_id": done_id})[0] == "ok"
            prep_id = create(root, "xss", dict(fields, orig_msg_id="javascript:alert(1)",
                                               post_run_webhook=ps[:50], force_remote=True),
                             "prep_message")
            attach_all(root, base, "xss", prep_id, names, ps)
            relayed_id = create(root, "xssrelay", fields)
            err_id = create(root, "xsserr", fields)
            s = Site(root, base, web.url, ps, done_id, prep_id, relayed_id, err_id, names,
                     base / "release", status_text)
            for q, m, st in (("xss", done_id, "done"), ("xssrelay", relayed_id, "relayed"),
                             ("xsserr", err_id, "err")):
                wait_for(lambda: s.state(q, m) == st, 30, 0.05, f"{q}/{m} to reach {st}")
            yield s
        finally:
            (base / "release").touch()  # the held jobs end: the manager stops at once


# ---------------------------------------------------------------- the browser


@dataclass
class Watch:
    """What a page did that it must not: dialogs, probe requests, page errors."""

    dialogs: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    html_problems: list[str] = field(default_factory=list)
    pages: int = 0


@pytest.fixture
def watched(browser: Any, site: Site) -> Iterator[tuple[Any, Watch]]:
    watch = Watch()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    host = urlsplit(site.url).netloc

    def on_request(req: Any) -> None:
        parts = urlsplit(req.url)
        if PROBE in parts.path:
            watch.probes.append(req.url)
        if parts.scheme in ("http", "https") and parts.netloc != host:
            watch.foreign.append(req.url)

    def on_dialog(dialog: Any) -> None:
        watch.dialogs.append(f"{dialog.type}: {dialog.message!r} on {dialog.page.url}")
        dialog.dismiss()

    context.on("request", on_request)
    context.on("dialog", on_dialog)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.on("pageerror", lambda exc: watch.errors.append(f"{page.url}: {exc}"))
    yield page, watch
    context.close()


def verdict(page: Any, watch: Watch, scripts: bool = True) -> None:
    """Every frame of the page: no __xss, no title change; then the whole watch.  A page
    with `scripts` False runs no script at all (CSP sandbox): nothing can be evaluated in
    it, not even by Playwright, so only its dialogs and requests are looked at."""
    for frame in page.frames if scripts else []:
        try:
            state = frame.evaluate("() => [typeof window.__xss, document.title]")
        except Exception as exc:  # a frame that went away with a navigation
            state = ["undefined", f"(gone: {exc})"]
        assert state[0] == "undefined", f"window.__xss set in {frame.url}"
        assert "XSSED" not in state[1], f"title changed in {frame.url}: {state[1]!r}"
    assert watch.dialogs == [], watch.dialogs
    if not scripts:  # a sandboxed HTML file may load images (the probe), never run code
        watch.probes.clear()
    assert watch.probes == [], watch.probes
    assert watch.foreign == [], watch.foreign
    assert watch.html_problems == [], watch.html_problems[:20]
    assert watch.errors == [], watch.errors[:10]


LAYOUT_SCRIPT = ('if (window.self !== window.top) '
                 'document.documentElement.classList.add("embedded");')
URL_ATTRS = ("href", "src", "action", "formaction", "data", "xlink:href", "poster", "background")


class Markup(HTMLParser):
    """The elements of a page as a browser would see them: every script, every attribute
    that runs code (on...) or loads a javascript: URL, every <base>/<meta refresh>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            value = (value or "").strip().lower()
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...>")
            if name in URL_ATTRS and re.sub(r"[\s\x00-\x1f]", "", value).startswith(
                    ("javascript:", "data:text/html", "vbscript:")):
                self.problems.append(f"<{tag} {name}={value[:60]!r}>")
            if name == "srcdoc" or tag in ("base", "object", "embed", "iframe") and \
                    name in ("href", "data", "src") and "/static/" not in value and \
                    "tailview" not in value:
                self.problems.append(f"<{tag} {name}={value[:60]!r}>")
        if tag == "meta" and any(n == "http-equiv" for n, _ in attrs):
            self.problems.append(f"<meta {attrs}>")
        if tag == "script":
            src = dict(attrs).get("src")
            if src is not None and not re.fullmatch(r"/(?:[\w.-]+/)*static/\w+\.js", src):
                self.problems.append(f"<script src={src!r}>")
            self.in_script = src is None

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_script = False

    def handle_data(self, data: str) -> None:
        if self.in_script and data.strip() != LAYOUT_SCRIPT:
            self.problems.append(f"inline script {data[:80]!r}")


def check_html(watch: Watch, where: str, html: str, ps: list[str]) -> None:
    """The raw HTML: no payload that needs escaping appears as it is; as parsed, no script,
    handler attribute or javascript: URL that the templates do not have; no template
    evaluated.  (A payload that is itself an escaped text, like "&lt;script&gt;...", is
    what escaping another payload gives: only the parsed check applies to it.)"""
    for p in ps:
        if any(c in p for c in "<>\"'") and p in html:
            watch.html_problems.append(f"{where}: unescaped {p!r}")
    parser = Markup()
    parser.feed(html)
    parser.close()
    watch.html_problems += [f"{where}: {problem}" for problem in parser.problems]
    for evaluated in ("SSTI", "TEMPLATE-RAN"):
        if evaluated in html:
            watch.html_problems.append(f"{where}: template evaluated ({evaluated!r})")


def visit(page: Any, watch: Watch, site: Site, path: str) -> str:
    resp = page.goto(site.url + path)
    assert resp is not None and resp.status < 500, (path, resp and resp.status)
    html = resp.text()
    if "text/html" in (resp.headers.get("content-type") or ""):
        check_html(watch, path, html, site.payloads)
    watch.pages += 1
    return html


def wait_fetches(page: Any, needle: str, count: int) -> None:
    """Wait until the page has fetched a URL containing `needle` `count` times: its
    poll loop fetches again only after applying the previous answer, so count-1 answers
    have then been rendered."""
    page.wait_for_function(
        "([needle, count]) => performance.getEntriesByType('resource')"
        ".filter(e => e.name.includes(needle)).length >= count", arg=[needle, count])


def wait_text(page: Any, selector: str, text: str) -> None:
    page.wait_for_function(
        "([sel, text]) => { const n = document.querySelector(sel);"
        " return !!n && n.textContent.includes(text); }", arg=[selector, text])


def frame_text(page: Any, frame_selector: str, selector: str, text: str) -> Any:
    frame = page.frame_locator(frame_selector)
    frame.locator(selector).filter(has_text=text).first.wait_for()
    return frame


# ---------------------------------------------------------------- pages


def test_dashboard_and_live_rows(site: Site, watched: tuple[Any, Watch]) -> None:
    page, watch = watched
    visit(page, watch, site, "")
    wait_fetches(page, "q.json", 2)
    # a queue created while the page is open: its row and schedule come from dashboard.js
    ps = site.payloads
    config = dict(pull_config(ps[::-1]), name="xsslive")
    assert client.call_mgr(str(site.root), "create_queue", config)[0] == "success"
    row = page.locator('#custom-queues tr[data-queue="xsslive"]')
    row.locator(".sched .param").first.wait_for()
    wait_fetches(page, "xsslive.json", 1)
    wait_fetches(page, "q.json", 4)
    assert "param1=" in row.locator(".sched").first.inner_text()
    verdict(page, watch)


def test_queue_pages(site: Site, watched: tuple[Any, Watch]) -> None:
    page, watch = watched
    for name in ("xss", "xssrelay", "xsserr", "xsscfg"):
        html = visit(page, watch, site, f"q/{name}")
        wait_fetches(page, f"q/{name}.json", 3)
        assert "&lt;script&gt;" in html, name  # the config shows the payloads, escaped
    relayed = page.goto(site.url + "q/xssrelay")
    assert relayed is not None
    page.locator("#relayed-list li .stext").first.wait_for()
    wait_fetches(page, "q/xssrelay.json", 3)
    verdict(page, watch)


def test_queue_page_with_running_jobs_added_live(site: Site, watched: tuple[Any, Watch]) -> None:
    page, watch = watched
    visit(page, watch, site, "q/xsshold")
    wait_fetches(page, "q/xsshold.json", 2)
    for i in range(3):
        site.held.append(create(site.root, "xsshold", {"dest": "xsshold", "param1": str(i)}))
    for msg_id in site.held:
        wait_for(lambda: site.state("xsshold", msg_id) == "run", 30, 0.05, "a held job")
    # queue.js adds the entries with their status text (the payloads)
    page.locator("#run-list li .stext").nth(2).wait_for()
    wait_text(page, "#run-list", site.payloads[0][:20])
    wait_fetches(page, "q/xsshold.json", 6)
    verdict(page, watch)


def test_message_pages_and_their_tail_frames(site: Site, watched: tuple[Any, Watch]) -> None:
    page, watch = watched
    for queue, msg_id, state in (("xss", site.done_id, "done"),
                                 ("xssrelay", site.relayed_id, "relayed"),
                                 ("xsserr", site.err_id, "err")):
        html = visit(page, watch, site, f"q/{queue}/{msg_id}")
        assert 'class="message-info"' in html
        frame = frame_text(page, "#tail-frame", "#tail-status", f"ended: {state}")
        frame.locator("#tail-log").filter(has_text="XSS-LOG-END").wait_for()
        page.locator("label.toggle").click()  # the hidden rows (params ...) shown
        verdict(page, watch)
    # the relayed status shows the new id; a payload "URL" stays text or a plain link
    link_hrefs = page.locator("table.message-info a").evaluate_all(
        "links => links.map(a => a.getAttribute('href'))")
    assert all(not h.lower().startswith("javascript:") for h in link_hrefs), link_hrefs
    verdict(page, watch)


def test_running_message_page_follows_live(site: Site, watched: tuple[Any, Watch]) -> None:
    page, watch = watched
    if not site.held:
        site.held.append(create(site.root, "xsshold", {"dest": "xsshold"}))
    msg_id = site.held[0]
    wait_for(lambda: site.state("xsshold", msg_id) == "run", 30, 0.05, "a held job")
    visit(page, watch, site, f"q/xsshold/{msg_id}")
    frame_text(page, "#tail-frame", "#tail-log", "XSS-LOG-END")
    wait_fetches(page, f"{msg_id}/state.json", 2)
    verdict(page, watch)
    # the full tail view, while the job writes more payloads (as raw bytes, ANSI too)
    visit(page, watch, site, f"q/xsshold/{msg_id}/tailviewlog/stdio.log")
    wait_text(page, "#tail-log", "XSS-LOG-END")
    log = site.msg_dir("xsshold", msg_id) / "job" / "stdio.log"
    more = "\n".join(log_lines(site.payloads[::-1])).replace("XSS-LOG-END", "XSS-LIVE-MID")
    with open(log, "a") as fh:
        fh.write(more)  # the last line without its newline: shown as a partial line
        fh.flush()
        wait_text(page, "#tail-log", "XSS-LIVE-MID")
        fh.write(" " + site.payloads[0] + "\nXSS-LIVE-END\n")
    wait_text(page, "#tail-log", "XSS-LIVE-END")
    verdict(page, watch)


def test_prep_page_new_message_form_and_tail_views(site: Site,
                                                   watched: tuple[Any, Watch]) -> None:
    page, watch = watched
    html = visit(page, watch, site, f"q/xss/{site.prep_id}")
    for name in site.attachments[:5]:
        assert page.locator("#attachments a", has_text=name).count() >= 1, name
    wait_fetches(page, f"{site.prep_id}/state.json", 2)
    verdict(page, watch)
    html = visit(page, watch, site, "q/xss/new_message")
    assert html.count('class="note"') >= 7, "form.json help shown"
    verdict(page, watch)
    for name in site.attachments[:3] + ["plain.txt"]:
        visit(page, watch, site, f"q/xss/{site.done_id}/tailview/{quote(name, safe='')}")
        wait_text(page, "#tail-status", "ended: done")
        wait_text(page, "#tail-log", site.payloads[-1][:10])
    verdict(page, watch)


def test_raw_files_never_run_as_pages(site: Site, watched: tuple[Any, Watch]) -> None:
    """Attachments and logs are served as files that cannot run scripts of this origin."""
    page, watch = watched
    base = f"q/xss/{site.done_id}"
    for path in (f"{base}/attach/evil.html", f"{base}/attach/evil.svg", f"{base}/log/stdio.log",
                 f"{base}/attach/plain.txt", f"{base}.json", "q/xss.json", "q/xss/config",
                 "q/xss/config.json", "search?name=xss"):
        resp = page.goto(site.url + path)
        assert resp is not None and resp.status == 200, path
        ctype = resp.headers.get("content-type", "")
        sandboxed = "/attach/" in path or "/log/" in path
        if sandboxed:
            assert resp.headers.get("x-content-type-options") == "nosniff", path
            assert "sandbox" in resp.headers.get("content-security-policy", ""), path
        else:
            assert not ctype.startswith("text/html"), (path, ctype)
        page.wait_for_load_state("load")
        watch.pages += 1
        verdict(page, watch, scripts=not sandboxed)


def test_flashes_and_error_pages(site: Site, watched: tuple[Any, Watch]) -> None:
    page, watch = watched
    ps = site.payloads
    chunks = [ps[i:i + 30] for i in range(0, len(ps), 30)]
    # route 3: a refused name lands on the 404 page with the flash (submitted from the form)
    for i, chunk in enumerate(chunks):
        visit(page, watch, site, "new_queue")
        name = f"FLASH{i} " + " ".join(chunk)
        with page.expect_navigation() as nav:
            page.evaluate("""name => { const f = document.getElementById('new-queue-form');
                f.elements['queue[name]'].value = name; f.submit(); }""", name)
        resp = nav.value
        assert resp is not None and resp.status == 404, resp and resp.status
        check_html(watch, f"new_queue flash {i}", resp.text(), ps)
        wait_text(page, "ul.flash", f"FLASH{i}")
        assert "from QueueMgr" in page.locator("ul.flash").inner_text()
        verdict(page, watch)
    # route 5: the flash on the dashboard
    visit(page, watch, site, "")
    with page.expect_navigation() as nav:
        page.evaluate("""name => { const f = document.createElement('form');
            f.method = 'post'; f.action = document.body.dataset.root + 'delete_queue';
            const i = document.createElement('input'); i.name = 'queue_name'; i.value = name;
            f.append(i); document.body.append(f); f.submit(); }""",
                      "DELFLASH " + " ".join(ps[:25]))
    resp = nav.value
    assert resp is not None and resp.status == 200
    check_html(watch, "delete_queue flash", resp.text(), ps)
    wait_text(page, "ul.flash", "DELFLASH")
    wait_fetches(page, "q.json", 2)
    verdict(page, watch)
    # route 4: the parse error names the path
    visit(page, watch, site, "new_queue")
    with page.expect_navigation() as nav:
        page.evaluate("""p => { const f = document.getElementById('new-queue-link-form');
            f.elements['queue[json_path]'].value = p; f.submit(); }""", " ".join(ps[:40]))
    resp = nav.value
    assert resp is not None and resp.status == 404
    check_html(watch, "new_queue_link error", resp.text(), ps)
    verdict(page, watch)
    # error pages naming a log or attachment (one path segment: no '/')
    segment_payloads = [p for p in ps if "/" not in p]
    base = f"q/xss/{site.done_id}"
    for p in segment_payloads[:6]:
        for route in ("log", "attach", "tailview", "tailviewlog"):
            html = visit(page, watch, site, f"{base}/{route}/{quote(p, safe='')}")
            # a tail view page is drawn even for a missing file (it polls the file's URL)
            assert "404 - Message ID" in html or route.startswith("tailview"), (route, p)
    verdict(page, watch)


def test_error_and_form_pages_raw(site: Site) -> None:
    """Every payload that fits a path segment, in every error text that names it; every
    page of the site; the raw HTML only (no browser), so each payload gets its own page."""
    watch = Watch()
    base = f"q/xss/{site.done_id}"
    segment_payloads = [p for p in site.payloads if "/" not in p]
    assert len(segment_payloads) >= 100
    paths = [f"{base}/{route}/{quote(p, safe='')}" for p in segment_payloads
             for route in ("log", "attach", "tailview", "tailviewlog", "logstream")]
    paths += ["", "q/xss", "q/xsshold", "q/xssrelay", "q/xsserr", "q/xsscfg", "q/xsslive",
              "new_queue", "q/xss/new_message", f"q/xss/{site.prep_id}", base,
              f"q/xssrelay/{site.relayed_id}", f"q/xsserr/{site.err_id}",
              f"{base}/tailviewlog/stdio.log"]
    paths += [f"{base}/tailview/{quote(n, safe='')}" for n in site.attachments]
    for path in paths:
        status, headers, text = fetch(site.url + path)
        assert status < 500, (path, status)
        ctype = headers.get("Content-Type", "")
        if ctype.startswith("text/html"):
            check_html(watch, path, text, site.payloads)
        elif not ctype.startswith(("text/plain", "application/json", "text/event-stream",
                                   "application/octet-stream")):
            # a type a browser would run (svg, xml ...): only as a sandboxed file
            assert "sandbox" in headers.get("Content-Security-Policy", ""), (path, ctype)
    assert watch.html_problems == [], watch.html_problems[:20]


def test_created_message_page_from_the_form(site: Site, watched: tuple[Any, Watch]) -> None:
    """Route 12 form (c) without `back`: the answer page, then the new message's page."""
    page, watch = watched
    ps = site.payloads
    visit(page, watch, site, "q/xss/new_message")
    page.fill("#mesg_src", " ".join(ps[:30]))
    for i in range(1, 5):
        page.fill(f"#mesg_param{i}", " ".join(ps[30 * i:30 * i + 30]))
    page.fill("#mesg_post_run_webhook", "")
    with page.expect_navigation() as nav:
        page.locator("#mesg_submit_field input[type=submit]").click()
    resp = nav.value
    assert resp is not None and resp.status == 200
    check_html(watch, "created page", resp.text(), ps)
    link = page.locator("main a", has_text=re.compile(r"/q/xss/\d{8}\."))
    # The page reloads itself as soon as its message changes state (it does at once), and a
    # response navigated away from has no body left to read: keep it as it passes.
    served: dict[str, str] = {}

    def keep_body(route: Any) -> None:
        response = route.fetch()
        served.setdefault(route.request.url, response.text())
        route.fulfill(response=response)
    page.route(re.compile(r"/q/xss/\d{8}\.[0-9.]+$"), keep_body)
    with page.expect_navigation() as nav:
        link.click()
    resp = nav.value
    assert resp is not None
    check_html(watch, "created message page", served[resp.url], ps)
    wait_text(page, "#msg-state", "done")  # the page follows its message (reloads itself)
    frame_text(page, "#tail-frame", "#tail-status", "ended: done")
    page.locator("label.toggle").click()
    verdict(page, watch)


def fetch(url: str) -> tuple[int, Any, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            return resp.status, resp.headers, resp.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode("utf-8", "replace")


def test_the_detectors_see_a_vulnerable_page(site: Site, watched: tuple[Any, Watch]) -> None:
    """The same watch on a page that does render payloads as markup (written by the test
    into a page of the site's origin): dialogs, __xss, the title, probe requests and the
    HTML checks all fire, so their silence above means something."""
    page, watch = watched
    page.goto(site.url + "q.txt")
    sample = [p for p in site.payloads if p.startswith(("<script>", "<img src=/xss", "<svg/"))]
    html = "<!doctype html><title>t</title><body>" + "".join(sample) + "</body>"
    page.set_content(html)
    page.wait_for_function("() => typeof window.__xss !== 'undefined'")
    page.wait_for_function("() => document.title.includes('XSSED')")
    wait_for(lambda: len(watch.dialogs) >= 3 and watch.probes, 10, 0.05, "dialogs and probes")
    check_html(watch, "vulnerable", html, site.payloads)
    assert len(watch.html_problems) >= len(sample)
    with pytest.raises(AssertionError):
        verdict(page, watch)
