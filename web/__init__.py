"""The RQ web dashboard and REST API (SPEC S14-S18): a Flask application.

`create_app(root)` (rq.web.app) builds the app for one RQ root (config read at the edge and
frozen); `python -m rq.web --root ROOT` serves it with waitress, supervised by
rq-mgr.  The folder is the repository's top-level web/, installed as the package
`rq.web` (pyproject.toml), so imports inside it are relative.

This package's own module imports nothing (PEP 562 `__getattr__` below): `python -m rq.web`
imports it first, and the daemon binds its port and reports `ready` before Flask is
imported, at the first request (web.__main__.LazyApp; issue 14 section 4).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .app import create_app


def __getattr__(name: str) -> object:
    if name == "create_app":
        from .app import create_app
        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["create_app"]
