"""The RQ web dashboard and REST API (SPEC S14–S18): a Flask application.

`create_app(root)` builds the app for one RQ root (config read at the edge and
frozen); `python -m web --root ROOT` serves it with waitress, supervised by
rq-mgr.  Blueprints: `api` (read-only JSON and text routes, metrics), `actions`
(every POST route: messages, attachments, admin operations, queues), `files`
(logs and attachments with Range, the log stream, tail views), `ui` (HTML
pages) and `stats` (the analytics Stats pages, issue 5).
Every change goes through the owning queue process or the manager.
"""

from __future__ import annotations

import secrets
from typing import Any

from flask import Flask

from rq import __version__
from rq.config import MainConfig, load_main_config
from web import errors, security
from web.backend import Backend
from web.wsgi import AccessLog, RootMiddleware



def create_app(root: str | None = None, *, main: MainConfig | None = None,
               overrides: dict[str, Any] | None = None) -> Flask:
    if main is None:
        assert root is not None
        main = load_main_config(root)
    app = Flask(__name__)
    app.config.update(
        RQ_MAIN=main,
        RQ_BACKEND=Backend(main.root),
        RQ_VERSION=__version__,
        SECRET_KEY=main.session_secret or secrets.token_hex(32),
        MAX_CONTENT_LENGTH=main.max_upload_bytes,
        MAX_FORM_MEMORY_SIZE=64 * 1024 * 1024,  # a form field may hold a >= 1 MiB message (S4.4)
        SESSION_COOKIE_NAME="rq_session",
        SESSION_COOKIE_SAMESITE="Lax",
        JSON_SORT_KEYS=False,
    )
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.config.update(overrides or {})
    errors.install(app)
    security.install(app)
    from web import actions, api, consumer, events, files, stats, ui
    for blueprint in (api.bp, actions.bp, files.bp, ui.bp, stats.bp, events.bp, consumer.bp):
        app.register_blueprint(blueprint)

    @app.context_processor
    def layout_values() -> dict[str, Any]:
        return {"rq_env": main.env, "rq_version": __version__, "rq_main": main}

    app.wsgi_app = AccessLog(RootMiddleware(app.wsgi_app, main.relative_root))  # type: ignore
    return app

