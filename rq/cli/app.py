"""`rq` as a click command, for programs that embed it in their own click
application (and for click's CliRunner): the raw arguments go to
rq.cli.entry.run untouched, since S19.1 is not getopt (click would eat a bare
`--` and answer `-h` itself).  The console script does not need click at all."""

from __future__ import annotations

import os
import sys

import click

from rq.cli.entry import run


class RawArgsCommand(click.Command):
    """A click command that keeps its arguments untouched."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.obj = list(args)
        return []


@click.command(cls=RawArgsCommand, add_help_option=False)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """The `rq` command; see `rq --help`."""
    ctx.exit(run(ctx.obj, os.environ, sys.stdout, sys.stderr))
