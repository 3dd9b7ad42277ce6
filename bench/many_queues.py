"""Benchmark: many queues on one host (issue 17).

A root with N queues (`--sizes 50,200,1000`), each with one worker and a trivial `/bin/sh`
script, started with `rq-mgr start`.  Measured in one run, per N:

* *serving*: seconds from launching `rq-mgr start` until every queue answers `ping`
  (and when `rq-mgr start` itself returned);
* *memory*: USS and RSS (psutil `memory_full_info`) of rq-mgr and every process under it,
  in total and per queue process (median);
* *idle CPU*: user + system time of the whole tree over `--idle` seconds with nothing to
  do, as % of one core;
* *one message through each queue*: a `create_message` to every queue, then seconds until
  each one's `done` count is 1 (all N queues working, not only started);
* *stop*: seconds `rq-mgr stop` takes.

`--src DIR` (repeatable) measures another checkout (e.g. a worktree of `main`) on the same
sizes in the same run, so before/after figures share the machine's moment.

    tini -s -- .venv/bin/python bench/many_queues.py --tmpdir DIR [--sizes 50,200,1000]
        [--idle 60] [--src OTHER_CHECKOUT ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, TRIVIAL_SCRIPT, BenchError, add_common_args,  # noqa: E402
                    disk_probe, machine_line, make_queue, new_root, temp_base, write_script)
from jobcost import Manager, tree_cpu  # noqa: E402

from rq import client  # noqa: E402
from rq.errors import ConnectError  # noqa: E402
from rqtest import free_port  # noqa: E402

MiB = 1024 * 1024


def build_root(base: Path, label: str, n: int) -> tuple[Path, list[str]]:
    root = new_root(base, label)
    cfg = root / "config" / "config.json"
    cfg.write_text(cfg.read_text().replace('"port": 3333', f'"port": {free_port()}'))
    script = write_script(root / "bench.sh", TRIVIAL_SCRIPT)
    names = [f"q{i:04d}" for i in range(n)]
    for name in names:
        make_queue(root, name, script, num_workers=1)
    return root, names


def wait_all(root: Path, names: list[str], test, timeout: float, what: str) -> None:
    """Poll every queue in `names` until `test(name)` holds for each (each done once)."""
    pending = list(names)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [n for n in pending if not test(n)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}: {len(pending)} left, "
                             f"e.g. {pending[:3]}")
        time.sleep(0.02)


def pings(root: Path, name: str) -> bool:
    try:
        return client.call_queue(str(root), name, "ping", timeout=5) == ["pong"]
    except (ConnectError, OSError):
        return False


def one_done(root: Path, name: str) -> bool:
    counts = client.call_queue(str(root), name, "num_messages")
    if counts["err"]:
        raise BenchError(f"queue {name}: a message went to err: {counts}")
    return counts["done"] >= 1


def tree_memory(pid: int) -> list[tuple[str, int, int]]:
    """(process title, USS, RSS) of `pid` and every descendant."""
    out = []
    top = psutil.Process(pid)
    for p in [top, *top.children(recursive=True)]:
        try:
            mem = p.memory_full_info()
            out.append((" ".join(p.cmdline())[:60], mem.uss, mem.rss))
        except psutil.Error:
            continue
    return out


def run_size(base: Path, label: str, src: Path, n: int, idle: float) -> dict[str, float]:
    root, names = build_root(base, f"{label}-{n}", n)
    t0 = time.monotonic()
    mgr = Manager(root, src)  # runs `rq-mgr start`, which waits for the ready line
    r: dict[str, float] = {"start_returned": time.monotonic() - t0}
    try:
        wait_all(root, names, lambda q: pings(root, q), 300, "every queue to answer ping")
        r["serving"] = time.monotonic() - t0
        mem = tree_memory(mgr.pid)
        queues = [m for m in mem if m[0].startswith("[rq-que]")]
        if len(queues) != n:
            raise BenchError(f"{len(queues)} queue processes under rq-mgr, expected {n}")
        r["procs"] = len(mem)
        r["uss_total"] = sum(m[1] for m in mem) / MiB
        r["rss_total"] = sum(m[2] for m in mem) / MiB
        r["uss_queue"] = statistics.median(m[1] for m in queues) / MiB
        r["rss_queue"] = statistics.median(m[2] for m in queues) / MiB
        before, t1 = tree_cpu(mgr.pid), time.monotonic()
        time.sleep(idle)  # measuring idleness: nothing to wait for
        after, span = tree_cpu(mgr.pid), time.monotonic() - t1
        r["idle_cpu"] = 100 * sum(t - before.get(p, 0.0) for p, t in after.items()) / span
        t2 = time.monotonic()
        for name in names:
            reply = client.call_queue(str(root), name, "create_message", {"dest": name})
            if reply[0] != "ok":
                raise BenchError(f"queue {name}: {reply!r}")
        wait_all(root, names, lambda q: one_done(root, q), 300, "one message done in each")
        r["one_each"] = time.monotonic() - t2
    finally:
        t3 = time.monotonic()
        mgr.stop()
        r["stop"] = time.monotonic() - t3
    return r


ROWS = (("start_returned", "rq-mgr start returned (s)", "{:.2f}"),
        ("serving", "every queue serving (s)", "{:.2f}"),
        ("procs", "processes in the tree", "{:.0f}"),
        ("uss_total", "USS total (MiB)", "{:.0f}"),
        ("rss_total", "RSS total (MiB)", "{:.0f}"),
        ("uss_queue", "USS per queue process (MiB, median)", "{:.2f}"),
        ("rss_queue", "RSS per queue process (MiB, median)", "{:.2f}"),
        ("idle_cpu", "idle CPU of the tree (% of one core)", "{:.2f}"),
        ("one_each", "one message through each queue (s)", "{:.2f}"),
        ("stop", "rq-mgr stop (s)", "{:.2f}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="50,200,1000", help="numbers of queues, comma-separated")
    ap.add_argument("--idle", type=float, default=60.0, help="seconds of idle CPU measurement")
    ap.add_argument("--src", action="append", default=[], type=Path,
                    help="another checkout to measure on the same sizes (repeatable)")
    ap.add_argument("--only-src", action="store_true", help="measure only the --src checkouts")
    add_common_args(ap)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    systems = [("this", REPO)] + [(f"src{i + 1}", p.resolve()) for i, p in enumerate(args.src)]
    if args.only_src:
        systems = systems[1:]
    print(machine_line())
    print(disk_probe(Path(args.tmpdir)))
    for label, src in systems:
        print(f"{label} = {src}")
    results: dict[tuple[str, int], dict[str, float]] = {}
    with temp_base(args.tmpdir, args.keep) as base:
        for n in sizes:
            for label, src in systems:
                results[(label, n)] = r = run_size(base, label, src, n, args.idle)
                print(f"N={n} {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()),
                      flush=True)
    cols = [(label, n) for n in sizes for label, _ in systems]
    print("\n" + f"{'':<40}" + "".join(f"{f'{lb} N={n}':>14}" for lb, n in cols))
    for key, text, fmt in ROWS:
        print(f"{text:<40}" + "".join(f"{fmt.format(results[c][key]):>14}" for c in cols))
    print(f"(load avg now {', '.join(f'{x:.2f}' for x in os.getloadavg())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
