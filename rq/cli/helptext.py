"""The help texts of `rq` (issue 16 item 4): one line per command for `rq --help`, and for
`rq CMD --help` each flag with a description and an example.  Data only, imported for
`--help` and `rq completion` alone, so the plain commands do not pay for it (issue 15).
Every command of rq.cli.base.COMMAND_MODULES and every flag it registers has an entry
here (tests/test_cli_help.py checks both ways).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

FULL_ID = "http://localhost:3333/q/video/20261126.1402.11.123.4567"
MSG_ID = ("the message's full id, as `rq sendmesg` printed it (S4.2)", f"--msg_id {FULL_ID}")
JSON = ("print one JSON document on stdout instead of text, for jq", "--json")
SEND = {
    "dest": ("the queue: a name, /q/NAME, ROOTq/NAME, or an http(s):// URL (relayed)",
             "--dest video"),
    "src": ("who sent it, kept in the message", "--src backup-cron"),
    "count": ("how many times it has run so far (normally left out)", "--count 0"),
    "max_count": ("resends allowed before it goes to err (default 15)", "--max_count 5"),
    "param1": ("the first parameter: $RQ_PARAM1 of the job", "--param1 /data/a.mov"),
    "param2": ("the second parameter: $RQ_PARAM2", "--param2 720p"),
    "param3": ("the third parameter: $RQ_PARAM3", "--param3 fast"),
    "param4": ("the fourth parameter: $RQ_PARAM4", "--param4 x"),
    "due": ("do not run before this time (epoch seconds)", "--due 1767225600"),
    "force_remote": ("relay even when the URL names this RQ", "--force_remote"),
    "post_run_webhook": ("URL(s) called once it ends (S12.2)",
                         "--post_run_webhook http://example.com/hook"),
    "relay-ok": ("consent to relay to an http(s):// --dest", "--relay-ok"),
}
PATTERN = ("a topic pattern (repeatable, or comma-separated): * one word, # any",
           "--pattern 'video.*'")
CONFIG = {
    "file": ("a JSON file of queue config keys (S3.3); flags override it", "--file video.json"),
    "script": ("the queue script run for each message", "--script /srv/rq/bin/video.sh"),
    "num_workers": ("jobs run at once, 1..128", "--num_workers 4"),
    "exec_prefix": ("what runs the script (default `bash -lc`)", "--exec_prefix 'nice -n 10'"),
    "env_vars": ("extra environment of the jobs, a JSON object",
                 "--env_vars '{\"LANG\": \"C.UTF-8\"}'"),
    "coalesce_params": ("params whose equal values merge queued messages", "--coalesce_params 1"),
    "blocking_params": ("params whose equal values never run at once", "--blocking_params 1,2"),
    "schedule": ("cron entries, a JSON array (S9.1)",
                 "--schedule '[{\"name\": \"nightly\", \"cron\": \"0 3 * * *\"}]'"),
    "timeout": ("seconds a job may run before it is stopped (0: no limit)", "--timeout 600"),
    "kill_grace": ("seconds between SIGTERM and SIGKILL, 0..3600", "--kill_grace 10"),
    "mode": ("script (jobs run here) or pull (consumers reserve, S8)", "--mode pull"),
    "topic": ("a pull queue's topic (default its name)", "--topic video.encode"),
    "lease_timeout": ("seconds a pull lease lasts, 1..86400", "--lease_timeout 300"),
}
BULK_SEARCH = {  # rq requeue / rq purge (issue 16 item 6, docs/guide/bulk.md)
    "search": ("only messages whose FIELD contains VALUE, as GET /search", "--search param1=a.mov"),
    "exact": ("with --search: the field must equal VALUE", "--exact"),
    "dry-run": ("only count them", "--dry-run"),
}

# name -> (one-line description, {flag: (description, example)}, example command line)
COMMANDS: dict[str, tuple[str, Mapping[str, tuple[str, str]], str]] = {
    "sendmesg": ("queue a new message; prints its full id", {
        **SEND,
        "dest": ("the queue: a name, /q/NAME, ROOTq/NAME, or an http(s):// URL (relayed); "
                 "a topic pattern (video.*, reports.#, #) puts one copy in every queue whose "
                 "topic matches, all or nothing, and prints every id", "--dest video"),
        "stdin": ("one message per input line (a JSON object of fields, or param1); "
                  "prints one full id per line", "--stdin < jobs.txt"),
        "url": ("send over HTTP to this RQ web server instead of the local root",
                "--url http://rq.example.com:3333/")},
                 "rq sendmesg --dest video --stdin < jobs.txt"),
    "prepmesg": ("make a message held in prep/ (attach files, then commitmesg)", SEND,
                 "rq prepmesg --dest video --param1 /data/a.mov"),
    "single_que": ("queue a message unless an equal one is already waiting", SEND,
                   "rq single_que --dest reindex"),
    "attachmesg": ("attach a file to a message in prep/", {
        "msg_id": MSG_ID,
        "pathname": ("the file to attach (relative to the current directory)",
                     "--pathname ./a.mov"),
        "name": ("the attachment's name (default the file's name)", "--name input.mov"),
        "local_fs_only": ("fail rather than copy when the file is on another filesystem",
                          "--local_fs_only")},
        f"rq attachmesg --msg_id {FULL_ID} --pathname ./a.mov"),
    "commitmesg": ("queue a message held in prep/", {"msg_id": MSG_ID},
                   f"rq commitmesg --msg_id {FULL_ID}"),
    "statusmesg": ("print a message's status", {"msg_id": MSG_ID, "json": JSON},
                   f"rq statusmesg --msg_id {FULL_ID} --json"),
    "state": ("print a message's state: prep, que, run, done, err or relayed",
              {"msg_id": MSG_ID, "json": JSON}, f"rq state --msg_id {FULL_ID}"),
    "statuscountmesg": ("print how many times a message has run",
                        {"msg_id": MSG_ID, "json": JSON},
                        f"rq statuscountmesg --msg_id {FULL_ID}"),
    "attachstatusmesg": ("list a message's attachments (name, md5, size, path)",
                         {"msg_id": MSG_ID, "json": JSON},
                         f"rq attachstatusmesg --msg_id {FULL_ID} --json"),
    "showmesg": ("print a whole message as JSON", {"msg_id": MSG_ID, "json": JSON},
                 f"rq showmesg --msg_id {FULL_ID} --json | jq .status"),
    "clone": ("queue a copy of a done, err or relayed message; prints its full id",
              {"msg_id": MSG_ID}, f"rq clone --msg_id {FULL_ID}"),
    "deletemesg": ("delete a message in any state but run", {"msg_id": MSG_ID},
                   f"rq deletemesg --msg_id {FULL_ID}"),
    "destroymesg": ("stop a running message's job (SIGTERM, then SIGKILL)", {"msg_id": MSG_ID},
                    f"rq destroymesg --msg_id {FULL_ID}"),
    "runmesg": ("run a queued message next, ignoring its due time", {"msg_id": MSG_ID},
                f"rq runmesg --msg_id {FULL_ID}"),
    "queues": ("list the queues and their status", {"json": JSON},
               "rq queues --json | jq -r '.[] | select(.status != \"UP\") | .name'"),
    "admin": ("pause, resume, down, up or restart a queue", {
        "queue": ("the queue's name", "--queue video"),
        "op": ("pause | resume | down | up | restart", "--op pause")},
        "rq admin --queue video --op pause"),
    "createqueue": ("create a queue from flags or a JSON file, and start it", {
        "name": ("the new queue's name (S3.1)", "--name video"),
        "queue": ("the same as --name, as the other queue commands spell it", "--queue video"),
        **CONFIG},
        "rq createqueue --name video --script /srv/rq/bin/video.sh --num_workers 2"),
    "configqueue": ("change a queue's config (validated, then reloaded)", {
        "queue": ("the queue's name", "--queue video"), **CONFIG},
        "rq configqueue --queue video --num_workers 4"),
    "deletequeue": ("delete a queue (refused while messages run)", {
        "queue": ("the queue's name", "--queue video"),
        "force": ("pause it and wait for its running messages to end, then delete it",
                  "--force"),
        "timeout": ("with --force: seconds to wait for them (default 3600)", "--timeout 600")},
        "rq deletequeue --queue video --force"),
    "fsck": ("check that every message is stored consistently (read-only)", {}, "rq fsck"),
    "analytics": ("run the PySpark job over the event log (docs/guide/analytics.md)", {
        "since": ("first moment counted: epoch or ISO 8601", "--since 2026-11-01"),
        "until": ("moment after the last one counted", "--until 2026-11-26T12:00"),
        "input": ("an event-log tree to read (repeatable; default the root's)",
                  "--input /srv/rq/log/events"),
        "output": ("where the result goes (default the root's)", "--output ./analytics-result"),
        "master": ("the Spark master (default local[2])", "--master spark://host:7077"),
        "conf": ("a Spark setting key=value (repeatable)", "--conf spark.driver.memory=2g"),
        "full": ("recompute from the raw event log, ignoring the compacted days", "--full")},
        "rq analytics --since 2026-11-01"),
    "reserve": ("take a message of a pull queue (S8.2)", {
        "pattern": PATTERN,
        "lease": ("seconds the lease lasts (default the queue's lease_timeout)", "--lease 60"),
        "wait": ("seconds to wait for a message, up to 60", "--wait 30"),
        "consumer": ("a name for this consumer, shown on the dashboard", "--consumer host1"),
        "json": JSON},
        "rq reserve --pattern 'video.*' --wait 30 --json"),
    "report": ("report on a reserved message: run, done, err, resend or dup (S8.3)", {
        "msg_id": MSG_ID,
        "token": ("the lease token printed by reserve", "--token 3f9c0e"),
        "line": ("the line a job would write on fd 3", "--line 'done ok'")},
        f"rq report --msg_id {FULL_ID} --token 3f9c0e --line 'done ok'"),
    "renew": ("extend a lease (S8.3)", {
        "msg_id": MSG_ID,
        "token": ("the lease token printed by reserve", "--token 3f9c0e"),
        "lease": ("the new lease length in seconds", "--lease 120")},
        f"rq renew --msg_id {FULL_ID} --token 3f9c0e --lease 120"),
    "watch": ("print each message event as it happens (S8.8)", {
        "pattern": ("queue-name pattern (repeatable, or comma-separated)", "--pattern video"),
        "since": ("replay the events since this epoch first", "--since 1764158400"),
        "json": ("one JSON object per line instead of text", "--json"),
        "cursor": ("a named cursor: resume where it was acknowledged, acknowledge each event "
                   "once printed (docs/guide/cursors.md)", "--cursor billing")},
        "rq watch --pattern '#'"),
    "cursors": ("list the named event cursors: position, lag, last ack (docs/guide/cursors.md)", {
        "json": ("one JSON document", "--json")},
        "rq cursors"),
    "deletecursor": ("delete a named event cursor (docs/guide/cursors.md)", {
        "cursor": ("the cursor's name", "--cursor billing")},
        "rq deletecursor --cursor billing"),
    "wait": ("block until the messages end; print each status; exit 0 done, 1 err, 2 timeout", {
        "msg_id": ("a message's full id (repeatable: waits for all)", f"--msg_id {FULL_ID}"),
        "timeout": ("give up after this many seconds (exit 2)", "--timeout 600"),
        "url": ("ask this RQ web server instead of the local root",
                "--url http://rq.example.com:3333/")},
        f"rq wait --msg_id {FULL_ID} --timeout 600"),
    "requeue": ("put every err (or done, relayed) message back in que, or those found", {
        "queue": ("the queue's name", "--queue video"),
        "state": ("err (default), done or relayed", "--state err"),
        **BULK_SEARCH},
        "rq requeue --queue video --search status=timeout"),
    "purge": ("delete every done, err and relayed message older than an age", {
        "queue": ("the queue's name", "--queue video"),
        "state": ("which of done, err, relayed, comma-separated (default all three)",
                  "--state done,relayed"),
        "older-than": ("the age of the message's id: 90, 36h, 7d, 2 weeks", "--older-than 7d"),
        **BULK_SEARCH},
        "rq purge --queue video --older-than 7d"),
    "push": ("queue stdin as a new message's body: rq push [QUEUE] (default: the root's "
             "default_queue; docs/guide/shell-queue.md)", {}, "rq push jobs < task.txt"),
    "pop": ("write the oldest body of a pull queue to stdout, then mark it done: rq pop QUEUE "
            "(docs/guide/shell-queue.md)", {
        "wait": ("seconds to wait for a message (default 0; any length)", "--wait 30"),
        "exec": ("run this shell command with the body on stdin instead: exit 0 is done, "
                 "else err", "--exec 'sh handle.sh'"),
        "loop": ("with --exec: keep taking messages (until --wait seconds pass idle)", "--loop"),
        "lease": ("seconds the lease lasts (default the queue's lease_timeout)", "--lease 60"),
        "consumer": ("a name for this consumer, shown on the dashboard", "--consumer host1")},
        "rq pop jobs --exec 'sh handle.sh' --loop"),
    "completion": ("print the bash completion script (see rq completion --help)", {
        "queues": ("print the root's queue names instead (used by the script)", "--queues")},
        "rq completion bash > ~/.local/share/bash-completion/completions/rq"),
}

ROOT_FLAG = ("the RQ root (else $RQ_ROOT, else the nearest directory above holding "
             "config/config.json)", "--root /srv/rq")


def overview() -> str:
    """`rq --help`: S19.2's `Valid commands are:` with a description on each line."""
    width = max(len(name) for name in COMMANDS)
    lines = ["Valid commands are:",
             *(f"  {name:<{width}}  {COMMANDS[name][0]}" for name in sorted(COMMANDS)),
             "",
             "Every command takes --root PATH.  `rq COMMAND --help` shows its flags, each with an",
             "example.  Bash completion: eval \"$(rq completion bash)\"."]
    return "\n".join(lines)


def command_help(name: str) -> str:
    """`rq CMD --help`: what it does, its flags with a description and an example each."""
    summary, flags, example = COMMANDS[name]
    lines = [f"usage: rq {name} [--root PATH]" + (" [FLAGS]" if flags else ""), "",
             f"{summary[0].upper()}{summary[1:]}.", "", "Flags:"]
    for flag, (text, sample) in [*flags.items(), ("root", ROOT_FLAG)]:
        lines += [f"  --{flag}", f"      {text}", f"      e.g. {sample}"]
    lines += ["", "Example:", f"  {example}"]
    return "\n".join(lines)


def help_text(name: str | None) -> str:
    """The help for `rq [NAME] --help`: the command's own, else the overview."""
    return command_help(name) if name in COMMANDS else overview()
