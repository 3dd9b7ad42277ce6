"""RQ: a Unix job-queue daemon that keeps every message as a directory on disk.

The package is split by ownership (see docs/DESIGN.md): leaves (`errors`,
`protocol`, `message`) never do IO; `fsops` is the only seam for spool file
operations; `store` is the only code that renames message directories; `proc`
is the only code that spawns, signals and reaps.  The dashboard is `rq.web`:
installed at rq/web/ (pyproject.toml maps the repository's top-level web/
folder there); in a source checkout run without installing (the bin/
wrappers put the checkout on PYTHONPATH) `CheckoutWeb` finds it in web/.
"""

from __future__ import annotations

import os
import sys

# Not typing.TYPE_CHECKING: importing typing costs every `rq` call ~3 ms (issue 15);
# type checkers treat any name TYPE_CHECKING as true.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Sequence  # collections: ~1 ms of every `rq` call
    from importlib.machinery import ModuleSpec
    from types import ModuleType

__version__ = "0.1.0"


class CheckoutWeb:
    """Meta path finder answering only for `rq.web`, with the checkout's web/
    folder; its submodules are then found through `rq.web.__path__`."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != "rq.web":
            return None
        from importlib.util import spec_from_file_location  # only when the web is imported

        return spec_from_file_location(fullname, os.path.join(self.folder, "__init__.py"),
                                       submodule_search_locations=[self.folder])


def _install_checkout_web() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.dirname(here)
    web = os.path.join(checkout, "web")
    # Only in a checkout (pyproject.toml beside rq/): next to an installed rq/, a web/ folder
    # is some other distribution's top-level package.
    if os.path.isdir(os.path.join(here, "web")) or \
            not os.path.isfile(os.path.join(checkout, "pyproject.toml")) or \
            not os.path.isfile(os.path.join(web, "__init__.py")):
        return
    if not any(isinstance(f, CheckoutWeb) for f in sys.meta_path):
        sys.meta_path.append(CheckoutWeb(web))


_install_checkout_web()


def __getattr__(name: str) -> object:
    """`from rq import Client` (issue 16): the producer API, imported on first use only,
    so `import rq` stays as cheap as the CLI needs."""
    if name == "Client":
        from rq.producer import Client
        return Client
    raise AttributeError(f"module 'rq' has no attribute {name!r}")
