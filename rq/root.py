"""Root discovery (SPEC S1.2): which directory is the RQ root of a command.

Owns `find_root` and nothing else.  Kept apart from rq.config (which re-exports
it) so that a command that only needs the root, such as every `rq` message
command, does not pay for importing the config records and their validation
(issue 15: a shell loop of `rq sendmesg`).  Standard library `os` only; reads
no environment of its own (`find_root` is handed `env`).
"""

from __future__ import annotations

import os

from rq.errors import RootError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

MAIN_CONFIG = os.path.join("config", "config.json")


def find_root(prog: str, argv: list[str], env: Mapping[str, str],
              *, cwd: str | None = None) -> tuple[str, list[str]]:
    """S1.2: return (absolute root, `argv` without its `--root` options).

    `--root PATH` / `--root=PATH` may appear anywhere (the last one wins),
    then `RQ_ROOT`, then the nearest directory from `cwd` up to `/` holding
    config/config.json.  Raises RootError with the exact S1.2 texts.
    """
    given, rest = _split_root_option(prog, argv)
    if given is None and env.get("RQ_ROOT"):
        given = env["RQ_ROOT"]
    if given is not None:
        root = os.path.abspath(given) if given else given
        if not root or not os.path.isfile(os.path.join(root, MAIN_CONFIG)):
            raise RootError(f"{prog}: not an RQ root: {root} (missing config/config.json)")
        return root, rest
    found = _search_up(cwd)
    if found is None:
        raise RootError(
            f"{prog}: no RQ root found (use --root, set RQ_ROOT, or run inside an RQ root)")
    return found, rest


def _split_root_option(prog: str, argv: list[str]) -> tuple[str | None, list[str]]:
    given: str | None = None
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--root":
            given = next(args, None)
            if given is None:
                raise UsageError(f"{prog}: option --root requires a value")
        elif arg.startswith("--root="):
            given = arg[len("--root="):]
        else:
            rest.append(arg)
    return given, rest


def _search_up(cwd: str | None) -> str | None:
    try:
        here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    except OSError:  # the current directory was removed under us
        return None
    while True:
        if os.path.isfile(os.path.join(here, MAIN_CONFIG)):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
