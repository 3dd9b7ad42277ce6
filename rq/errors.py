"""Errors: one base class, named exit codes.  Owns nothing else.

Command-line tools turn an RQError into one line on stderr and its exit code
(SPEC S0.3.3); daemons turn it into state (a `fail` reply, a message in err/,
a child in BACKOFF).
"""

from __future__ import annotations


class RQError(Exception):
    """Base class: `str(err)` is the one-line user-facing text."""

    exit_code = 1


class UsageError(RQError):
    exit_code = 1


class RootError(RQError):
    """No RQ root found, or a given root lacks config/config.json (S1.2)."""


class ConfigError(RQError):
    """A config file failed validation; the text is the exact S3.4/S1.4 reason."""


class ProtocolError(RQError):
    """A malformed rq1 frame or pipe line (S6.4, S7.1)."""


class Fail(RQError):
    """A request that must be answered with ["fail", reason] (S7.3).

    `str(err)` is the reason text that goes into the reply.
    """


class ConnectError(RQError):
    """A daemon socket could not be reached."""


class NoReply(ConnectError):
    """The request was sent but no reply came: the daemon may have acted on it."""


class StartError(RQError):
    """A daemon cannot start and retrying cannot fix it: `fatal REASON` on its ready pipe,
    exit 2, FATAL at the manager (S2.3; rq.daemon reports it)."""

    exit_code = 2
