"""The RQ web dashboard and REST API (SPEC S14–S18): a Flask application.

`create_app(root)` builds the app for one RQ root (config read at the edge and
frozen); `python -m rq.web --root ROOT` serves it with waitress, supervised by
rq-mgr.  The folder is the repository's top-level web/, installed as the package
`rq.web` (pyproject.toml), so imports inside it are relative.

Blueprints: `api` (read-only JSON and text routes, metrics), `actions` (every
POST route: messages, attachments, admin operations, queues), `bulkcreate`
(`POST /q/NAME/new_messages`, many messages in one request), `files` (logs and
attachments with Range, the log stream, tail views), `ui` (HTML pages) and
`stats` (the analytics Stats pages, issue 5).
Every change goes through the owning queue process or the manager.
"""

from __future__ import annotations

import secrets
from typing import Any

from flask import Flask
from flask.sessions import SecureCookieSessionInterface

from rq import __version__
from rq.config import MainConfig, load_main_config
from . import errors, limits, security
from .backend import Backend
from .queues import Counters
from .wsgi import AccessLog, RootMiddleware


class FrozenKeySessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie session (flashes after 303 redirects, S14.10), with
    the signing serializer built once per secret key instead of on every
    request: the config is frozen, so the key does not change.  (Building it
    was about a tenth of the web's CPU per API request.)"""

    def __init__(self) -> None:
        self._serializers: dict[Any, Any] = {}

    def get_signing_serializer(self, app: Flask) -> Any:
        key = (app.secret_key, tuple(app.config.get("SECRET_KEY_FALLBACKS") or ()))
        serializer = self._serializers.get(key)
        if serializer is None:
            serializer = super().get_signing_serializer(app)
            self._serializers = {key: serializer}  # one key at a time
        return serializer


def create_app(root: str | None = None, *, main: MainConfig | None = None,
               overrides: dict[str, Any] | None = None) -> Flask:
    if main is None:
        assert root is not None
        main = load_main_config(root)
    app = Flask(__name__)
    app.session_interface = FrozenKeySessionInterface()
    app.config.update(
        RQ_MAIN=main,
        RQ_BACKEND=Backend(main.root),
        RQ_VERSION=__version__,
        SECRET_KEY=main.session_secret or secrets.token_hex(32),
        # Every body but an upload's (web.actions raises it to max_upload_bytes) is read
        # only up to max_body_bytes; above it 413 before a byte is read (issue 13 D9).
        MAX_CONTENT_LENGTH=min(main.max_body_bytes, main.max_upload_bytes),
        MAX_FORM_MEMORY_SIZE=main.max_body_bytes,  # a field may hold a >= 1 MiB message (S4.4)
        SESSION_COOKIE_NAME="rq_session",
        SESSION_COOKIE_SAMESITE="Lax",
        JSON_SORT_KEYS=False,
    )
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.config.update(overrides or {})
    app.extensions["rq_counters"] = Counters(main.root)
    errors.install(app)
    security.install(app)
    limits.install(app)
    from . import actions, api, bulkcreate, consumer, cursors, events, files, stats, ui
    for blueprint in (api.bp, actions.bp, bulkcreate.bp, files.bp, ui.bp, stats.bp, events.bp,
                      consumer.bp, cursors.bp):
        app.register_blueprint(blueprint)

    @app.context_processor
    def layout_values() -> dict[str, Any]:
        return {"rq_env": main.env, "rq_version": __version__, "rq_main": main}

    app.wsgi_app = AccessLog(RootMiddleware(app.wsgi_app, main.relative_root))  # type: ignore
    return app

