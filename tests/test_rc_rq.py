"""bin/rc.rq, the LSB init script (SPEC S23), run with /bin/sh as a real program.

Root is never required: RQUSER is set to the current user, so rc.rq runs rq-mgr directly.
Most cases use a fake rq-mgr that records its arguments, which pins down exactly what rc.rq
delegates; one case uses the real bin/rq-mgr on a freshly installed root.
"""

from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path

import pytest
from rqtest import REPO, write_root

RC_RQ = REPO / "bin" / "rc.rq"
USAGE = "Usage: rc.rq {start|stop|restart|reload|status}\n"
MAIN = {"env": "test", "host": "localhost", "port": 3333, "addr": "127.0.0.1"}

FAKE_MGR = """#!/bin/sh
# Fake rq-mgr: logs its arguments, answers `status` from FAKE_PID, exits FAKE_RC otherwise.
echo "$*" >> "$FAKE_LOG"
if [ "$3" = status ]; then
    if [ -n "${FAKE_PID:-}" ]; then echo "queuemgr: running [pid $FAKE_PID]"; exit 0; fi
    echo "queuemgr: not running"; exit 3
fi
exit "${FAKE_RC:-0}"
"""


def rc_rq(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("RQDIR", "RQMGR", "RQUSER", "RQ_ROOT")}
    base["RQUSER"] = getpass.getuser()
    base.update(env)
    return subprocess.run(["/bin/sh", str(RC_RQ), *args], env=base, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    mgr = tmp_path / "fake-rq-mgr"
    mgr.write_text(FAKE_MGR)
    mgr.chmod(0o755)
    root = write_root(tmp_path / "root", MAIN)
    return {"RQMGR": str(mgr), "RQDIR": str(root), "FAKE_LOG": str(tmp_path / "calls.log")}


def calls(env: dict[str, str]) -> list[str]:
    log = Path(env["FAKE_LOG"])
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("args", [[], ["bogus"], ["force-stop"]])
def test_usage(args: list[str]) -> None:
    res = rc_rq(*args)
    assert res.returncode == 1
    assert res.stdout + res.stderr == USAGE


def test_start_with_missing_rqdir(tmp_path: Path, fake: dict[str, str]) -> None:
    missing = tmp_path / "nowhere"
    res = rc_rq("start", **{**fake, "RQDIR": str(missing)})
    assert res.returncode == 5
    assert res.stdout + res.stderr == f"RQ dir not found: {missing}\n"
    assert calls(fake) == []


def test_start_with_a_dir_that_is_not_an_rq_root(tmp_path: Path, fake: dict[str, str]) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    res = rc_rq("start", **{**fake, "RQDIR": str(plain)})
    assert (res.returncode, res.stdout + res.stderr) == (5, f"RQ dir not found: {plain}\n")


def test_start_runs_rq_mgr_start_with_its_status(fake: dict[str, str]) -> None:
    res = rc_rq("start", **fake, FAKE_RC="0")
    assert res.returncode == 0
    assert calls(fake) == [f"--root {fake['RQDIR']} status", f"--root {fake['RQDIR']} start"]
    res = rc_rq("start", **fake, FAKE_RC="1")
    assert res.returncode == 1


def test_start_when_already_running(fake: dict[str, str]) -> None:
    res = rc_rq("start", **fake, FAKE_PID="4242")
    assert res.returncode == 0
    assert res.stdout == "RQ is already running at pid 4242\n"
    assert calls(fake) == [f"--root {fake['RQDIR']} status"]


def test_status_running_and_not_running(fake: dict[str, str]) -> None:
    res = rc_rq("status", **fake, FAKE_PID="4242")
    assert (res.returncode, res.stdout) == (0, "RQ is running at pid 4242\n")
    res = rc_rq("status", **fake)
    assert (res.returncode, res.stdout) == (3, "RQ is not running\n")


def test_stop_always_exits_0(fake: dict[str, str]) -> None:
    res = rc_rq("stop", **fake, FAKE_RC="1")
    assert res.returncode == 0
    assert calls(fake) == [f"--root {fake['RQDIR']} stop"]


def test_restart_is_stop_then_start(fake: dict[str, str]) -> None:
    res = rc_rq("restart", **fake, FAKE_RC="0")
    assert res.returncode == 0
    root = fake["RQDIR"]
    assert calls(fake) == [f"--root {root} stop", f"--root {root} status", f"--root {root} start"]


def test_reload_passes_the_exit_status(fake: dict[str, str]) -> None:
    assert rc_rq("reload", **fake, FAKE_RC="0").returncode == 0
    assert rc_rq("reload", **fake, FAKE_RC="1").returncode == 1
    assert calls(fake) == [f"--root {fake['RQDIR']} reload"] * 2


def test_rqmgr_defaults_to_rqdir_bin_when_not_on_path(tmp_path: Path,
                                                      fake: dict[str, str]) -> None:
    root = Path(fake["RQDIR"])
    (root / "bin").mkdir()
    (root / "bin" / "rq-mgr").write_text(FAKE_MGR)
    (root / "bin" / "rq-mgr").chmod(0o755)
    env = {k: v for k, v in fake.items() if k != "RQMGR"}
    res = rc_rq("status", **env, FAKE_PID="77", PATH="/usr/bin:/bin")
    assert (res.returncode, res.stdout) == (0, "RQ is running at pid 77\n")


def test_status_with_real_rq_mgr_when_not_running(tmp_path: Path) -> None:
    root = tmp_path / "root"
    install = subprocess.run([str(REPO / "bin" / "rq-install"), "--root", str(root)],
                             capture_output=True, text=True, timeout=60)
    assert install.returncode == 0, install.stderr
    res = rc_rq("status", RQDIR=str(root), RQMGR=str(REPO / "bin" / "rq-mgr"))
    assert (res.returncode, res.stdout) == (3, "RQ is not running\n")
