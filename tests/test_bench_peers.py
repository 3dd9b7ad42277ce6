"""bench/peers.py (issue 15 item 1): its command line and the pure functions
that read /proc and task-spooler's listing and turn trials into the table.
The benchmark itself is not run here (minutes, and peers installed by apt/pip)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest
from rqtest import REPO

sys.path.insert(0, str(REPO / "bench"))
import peerlib  # noqa: E402
from peerlib import Record, Trial  # noqa: E402

PEERS = str(REPO / "bench" / "peers.py")


def test_help_names_every_system_and_flag() -> None:
    out = subprocess.run([sys.executable, PEERS, "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for word in ("--n", "--trials", "--workers", "--systems", "--shell-n", "--venvs", "--tmpdir",
                 "tsp", "celery", "pyrq-simple", "pyrq-fork", "rq-py", "rq-sh", "tini -s"):
        assert word in out.stdout


def test_an_unknown_system_is_one_error_line() -> None:
    out = subprocess.run([sys.executable, PEERS, "--systems", "tsp,nq"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown system(s) nq" in out.stderr
    assert "Traceback" not in out.stderr


TSP_LIST = """\
ID   State      Output               E-Level  Times(r/u/s)   Command [run=1/2]
4    running    /x/ts-out.d                                  /bin/sh -c : > "$1" sh /m/4
5    queued     (file)                                       /bin/sh -c : > "$1" sh /m/5
0    finished   /x/ts-out.a          0        0.00/0.00/0.00 /bin/sh -c : > "$1" sh /m/0
1    finished   /x/ts-out.b          0        0.00/0.00/0.00 /bin/sh -c : > "$1" sh /m/1
2    finished   /x/ts-out.c          1        0.00/0.00/0.00 /bin/sh -c : > "$1" sh /m/2
3    skipped    (no output)                                  /bin/sh -c : > "$1" sh /m/3
"""


@pytest.mark.parametrize("text, expected", [
    (TSP_LIST, {"running": 1, "queued": 1, "finished": 2, "failed": 1, "skipped": 1}),
    ("ID   State      Output               E-Level  Times(r/u/s)   Command [run=0/1]\n", {}),
    ("", {}),
])
def test_tsp_listing_counts_states_and_failures(text: str, expected: dict[str, int]) -> None:
    assert peerlib.parse_tsp_list(text) == expected


def test_proc_stat_busy_ticks_leave_out_idle_and_iowait() -> None:
    text = "cpu  100 5 30 9000 700 2 3 4 50 0\ncpu0 50 2 15 4500 350 1 1 2 25 0\nintr 1\n"
    assert peerlib.parse_proc_stat(text) == 100 + 5 + 30 + 2 + 3 + 4


def test_pid_stat_takes_ppid_and_cpu_past_a_command_with_parentheses() -> None:
    # comm "(a) b)" holds a space and a ')'; fields after it: state ppid ... utime stime
    # cutime cstime are fields 14-17.
    line = "1234 ((a) b)) S 77 1234 1234 0 -1 4194304 100 0 0 0 11 22 33 44 20 0 1 0 5 6 7"
    assert peerlib.parse_pid_stat(line) == (77, 11 + 22 + 33 + 44)


def test_tree_cpu_counts_this_process_and_its_reaped_children() -> None:
    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    before, child_before = peerlib.tree_cpu_seconds(os.getpid()), children_cpu()
    t = time.process_time()
    while time.process_time() - t < 0.1:
        pass
    subprocess.run(["/bin/sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"],
                   check=True, timeout=60)
    child = children_cpu() - child_before
    assert child > 0.05  # the shell loop's own CPU, reaped by this process
    after = peerlib.tree_cpu_seconds(os.getpid())
    assert after - before >= 0.1 + child - 0.04  # /proc counts in 10 ms ticks


def trial(rate: float, cpu: float = 1.0, n: int = 100) -> Trial:
    return Trial(n=n, elapsed=n / rate, enqueued=n / rate / 2, cpu=cpu, tree_cpu=cpu / 2)


def test_result_line_round_trips() -> None:
    t = trial(50.0)
    assert peerlib.parse_result("noise\n" + peerlib.result_line(t) + "\n") == t
    with pytest.raises(peerlib.BenchError):
        peerlib.parse_result("no result here\n")


def test_aggregate_takes_medians_and_the_median_of_per_trial_ratios() -> None:
    records = [Record("tsp", 1, trial(100), trial(1000)),   # ratio 0.1
               Record("tsp", 1, trial(300), trial(500)),    # ratio 0.6
               Record("tsp", 1, trial(200), trial(1000)),   # ratio 0.2
               Record("rq-py", 1, trial(50, cpu=2.0), trial(500))]
    rows = peerlib.aggregate(records)
    assert list(rows) == [("tsp", 1), ("rq-py", 1)]
    tsp = rows[("tsp", 1)]
    assert tsp.rate == pytest.approx(200)
    assert tsp.ratio == pytest.approx(0.2)
    assert tsp.bare_rate == pytest.approx(1000)
    assert tsp.enqueue_rate == pytest.approx(400)
    assert tsp.trials == 3
    assert rows[("rq-py", 1)].cpu_per_1k == pytest.approx(20.0)
    assert rows[("rq-py", 1)].tree_cpu_per_1k == pytest.approx(10.0)


def test_ratio_is_paired_not_a_ratio_of_medians() -> None:
    # Each trial is divided by its own bare loop, measured seconds before it.
    records = [Record("x", 2, trial(100), trial(50)),   # 2.0
               Record("x", 2, trial(200), trial(250)),  # 0.8
               Record("x", 2, trial(300), trial(200))]  # 1.5
    row = peerlib.aggregate(records)[("x", 2)]
    assert row.ratio == pytest.approx(1.5)
    assert row.rate / row.bare_rate == pytest.approx(1.0)  # the ratio of the medians


def test_table_has_a_line_per_measured_system_and_the_bare_loop() -> None:
    records = [Record("tsp", 1, trial(400), trial(1000)),
               Record("tsp", 2, trial(560), trial(2000)),
               Record("rq-py", 1, trial(8.6, cpu=11.8), trial(1000))]
    names = {"tsp": "task-spooler", "celery": "Celery", "rq-py": "RQ program"}
    lines = peerlib.format_table(peerlib.aggregate(records), names, [1, 2])
    assert lines[0].startswith("| system | 1w jobs/s | 1w × bare |")
    assert lines[2] == ("| task-spooler | 400 | 0.40 | 800 | 10.0 | 5.00 "
                        "| 560 | 0.28 | 1,120 | 10.0 | 5.00 |")
    assert lines[3] == "| RQ program | 8.60 | 0.01 | 17.2 | 118 | 59.0 | - | - | - | - | - |"
    assert not any("Celery" in line for line in lines)  # not measured: no line
    assert lines[4].startswith("| bare spawn loop (no queue, not durable) | 1,000 | 1 | - |")
    assert len(lines) == 5
