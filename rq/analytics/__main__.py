"""`python -m rq.analytics [FLAGS]`: the same as `rq analytics [FLAGS]` (S19 flag rules)."""

from __future__ import annotations

import sys

from rq import cli

if __name__ == "__main__":
    sys.exit(cli.main(["analytics", *sys.argv[1:]]))
