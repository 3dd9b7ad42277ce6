"""`python -m rq` is the `rq` command (SPEC S1.1)."""

import sys

from rq.cli import main

if __name__ == "__main__":
    sys.exit(main())
