"""`python -m rq.mgr --root ROOT [--foreground] [--ready-fd F]`: the manager daemon."""

import sys

from rq.mgr.daemon import main

if __name__ == "__main__":
    sys.exit(main())
