"""S6.1.5 exec failures and the signal dispositions a job starts with."""

from __future__ import annotations

from pathlib import Path

from rqtest import QueueProc, make_queue, write_script


def test_s6_1_5_missing_interpreter_reports_exec_failed(root: Path, tmp_path: Path,
                                                        queues: list[QueueProc]) -> None:
    """A `#!` interpreter that does not exist: `RQ EXEC FAILED - <error>` in
    stdio.log, exit 127, handled by S6.6 rule 1."""
    script = write_script(tmp_path / "bad.sh", "#!/nonexistent/interp\necho hi\n")
    make_queue(root, "x", script=script)
    q = QueueProc(root, "x")
    queues.append(q)
    full = q.call("create_message", {"dest": "x"})[1]
    q.wait_state(full, "err")
    msg = q.message(full)
    assert msg["status"].startswith("err - PROCESS EXITED IMPROPERLY - MOVING TO ERR - "
                                    "Completion was  but exit status was pid ")
    assert msg["status"].endswith(" exit 127")
    log = (root / msg["path"] / "job" / "stdio.log").read_text()
    assert "RQ START" in log
    assert "RQ EXEC FAILED - " in log and "interpreter /nonexistent/interp" in log


def test_job_starts_with_default_signal_dispositions(root: Path, tmp_path: Path,
                                                     queues: list[QueueProc]) -> None:
    """Python ignores SIGPIPE; a job must not inherit that (a pipeline such as
    `yes | head -1` would otherwise spin on EPIPE)."""
    script = write_script(tmp_path / "sig.sh",
                          '#!/bin/sh\nm=$(grep SigIgn /proc/$$/status | tr -d "\\t ")\n'
                          'echo "done $m" >&3\n')
    make_queue(root, "s", script=script)
    q = QueueProc(root, "s")
    queues.append(q)
    full = q.call("create_message", {"dest": "s"})[1]
    q.wait_state(full, "done")
    mask = int(q.message(full)["status"].split("SigIgn:")[1], 16)
    assert not mask & (1 << (13 - 1)), "SIGPIPE ignored"     # SIGPIPE = 13
    assert not mask & (1 << (25 - 1)), "SIGXFSZ ignored"     # SIGXFSZ = 25


def test_s6_1_job_log_exists_when_the_reply_says_run(root: Path, tmp_path: Path,
                                                     queues: list[QueueProc]) -> None:
    """S5.1 + S6.1 step 2: once create_message replies, the message is in run with
    its job/ directory and stdio.log in place, so its log can be followed at once."""
    gate = tmp_path / "gate"
    script = write_script(tmp_path / "hold.sh",
                          f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.05; done\n'
                          'echo "done ok" >&3\n')
    make_queue(root, "h", script=script)
    q = QueueProc(root, "h")
    queues.append(q)
    full = q.call("create_message", {"dest": "h"})[1]
    msg_id = full.rsplit("/", 1)[1]
    assert (root / "queue" / "h" / "run" / msg_id / "job" / "stdio.log").is_file()
    gate.touch()
    q.wait_state(full, "done")
