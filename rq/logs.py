"""Daemon logging set-up (SPEC S1.5): every daemon appends to
`log/queuemgr.log` as `<local ISO-8601 time> <role>[<pid>] <LEVEL> <text>`.

WatchedFileHandler reopens the file when logrotate moves it, so no SIGUSR1
handling is needed for rotation.  Configured only from a daemon's `main()`.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from datetime import datetime


class _Formatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).astimezone()
        when = stamp.isoformat(timespec="milliseconds")
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"{when} {self.role}[{record.process}] {record.levelname} {text}"


def setup_logging(root: str, role: str, *, stderr: bool = False, level: int = logging.INFO) -> None:
    logger = logging.getLogger()
    for old in list(logger.handlers):
        logger.removeHandler(old)
    fmt = _Formatter(role)
    os.makedirs(os.path.join(root, "log"), exist_ok=True)
    handler: logging.Handler = logging.handlers.WatchedFileHandler(
        os.path.join(root, "log", "queuemgr.log"))
    handler.setFormatter(fmt)
    logger.addHandler(handler)
    if stderr:
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(fmt)
        logger.addHandler(err)
    logger.setLevel(level)
