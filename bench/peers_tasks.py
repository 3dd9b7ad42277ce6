"""The job of bench/peers.py for the Python peers, imported by their workers
inside their own virtualenvs (python-rq's `rq worker --path bench`, Celery's
`celery -A peers_tasks`): one /bin/sh process creating the job's marker, the
same argv as every other system (bench/peerlib.py).  A job whose shell fails
raises, so the peer records it as failed.
"""

from __future__ import annotations

import os
import subprocess

from peerlib import job_argv


def run_job(marker: str) -> None:
    subprocess.run(job_argv(marker), check=True)


# Celery's app exists only where Celery is installed (its virtualenv), with the
# private Redis of the run as broker and result backend (PEERS_REDIS_URL).
try:
    import celery
except ImportError:  # python-rq's virtualenv
    app = None
else:
    _url = os.environ.get("PEERS_REDIS_URL", "redis://127.0.0.1:6379/0")
    app = celery.Celery("peers_tasks", broker=_url, backend=_url)
    app.conf.update(task_default_queue="bench", worker_hijack_root_logger=False,
                    broker_connection_retry_on_startup=True)
    celery_run_job = app.task(name="peers.run_job")(run_job)
