"""Helpers for the browser tests (tests/test_browser.py): a real rq-web serving a
root run by a real rq-mgr, and headless Chromium driven by Playwright.

The web server is the one rq-mgr supervises when the manager runs one (S2.2);
otherwise `create_app(root)` is served by waitress in a thread of the test
process, on the root's configured address and port, so full ids (S4.2) are
URLs the browser can follow.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rqtest import wait_for

from rq import client

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
TIMEOUT_MS = 20_000  # Playwright's waits (actions, expect) in the browser tests


def browser_unavailable() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def supervised_web(root: Path) -> bool:
    """True when rq-mgr runs the web server itself (its `status` names a web child)."""
    reply = client.call_mgr(str(root), "status", timeout=10)
    return isinstance(reply, list) and len(reply) == 2 and bool((reply[1] or {}).get("web"))


class WebServer:
    """The dashboard of `root` at `self.url` (ends with ROOT's '/')."""

    def __init__(self, root: Path) -> None:
        from rq.config import load_main_config
        self.main = load_main_config(str(root))
        self.url = f"http://127.0.0.1:{self.main.port}{self.main.relative_root}"
        self.server: Any = None
        self.thread: threading.Thread | None = None
        if not supervised_web(root):
            self.serve_in_thread(root)
        wait_for(lambda: http_status(self.url) == 200, 30, 0.05, "the dashboard to answer 200")

    def serve_in_thread(self, root: Path) -> None:
        import waitress

        from rq.web import create_app
        app = create_app(str(root))
        self.server = waitress.create_server(
            app, host=self.main.addr, port=self.main.port, threads=16,
            clear_untrusted_proxy_headers=False, channel_request_lookahead=1,
            log_socket_errors=False, ident="rq-web-test")
        self.thread = threading.Thread(target=self.server.run, name="rq-web-test", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is None:
            return
        from waitress import wasyncore
        server = self.server
        # The socket map belongs to waitress's loop thread: close everything there,
        # after which its loop ends on its own.
        server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        if self.thread is not None:
            self.thread.join(10)


def launch_browser(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@contextmanager
def chromium(expect_timeout_ms: int = TIMEOUT_MS) -> Iterator[Any]:
    """Headless Chromium for a module's tests; Playwright's expect() waits this long."""
    from playwright.sync_api import expect, sync_playwright
    expect.set_options(timeout=expect_timeout_ms)
    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        yield browser
        browser.close()


@contextmanager
def checked_page(browser: Any, timeout_ms: int, *, accept_dialogs: bool = False) -> Iterator[Any]:
    """A page in a context of its own; when the block ends, no JavaScript error may have
    happened on it.  `accept_dialogs` answers confirm() (data-confirm buttons) with OK."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(timeout_ms)
    if accept_dialogs:
        pg.on("dialog", lambda dialog: dialog.accept())
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path
