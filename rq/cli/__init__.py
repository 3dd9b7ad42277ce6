"""The `rq` command (SPEC S19), split by what the commands are about:
`base` (argument rules, the registry, reply output), `messages` (messages,
queues, fsck, analytics), `pull` (reserve/report/renew, watch), `shell` (push/pop) and `entry`
(dispatch), `app` (the same as a click command).  `main` is the console
script."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run `rq` on `argv` (default sys.argv[1:])."""
    from rq.cli.entry import main as entry_main

    return entry_main(argv)
