"""`rq completion` (issue 16 item 4): the bash completion script of `rq`, which completes
command names, each command's flags and, after `--dest` or `--queue`, the queue names
of the root (`rq completion --queues`: the names under `queue/` that have a
config.json, found by S1.2 like any command, so `--root` on the line is honoured).

Install once:  rq completion bash > ~/.local/share/bash-completion/completions/rq
or per shell:  eval "$(rq completion bash)"
"""

from __future__ import annotations

import os
import shlex

from rq import protocol
from rq.cli.base import ADMIN_OPS, COMMAND_MODULES, Invocation, command

QUEUE_FLAGS = ("dest", "queue")
FILE_FLAGS = ("root", "file", "pathname", "input", "output")

SCRIPT = r"""# bash completion for rq (issue 16 item 4), made by `rq completion bash`.
_rq_complete() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    # bash splits `--dest=vi` at the `=` (COMP_WORDBREAKS): complete the value all the same
    if [[ $cur == = ]]; then
        cur=
    elif [[ $prev == = ]]; then
        prev=${COMP_WORDS[COMP_CWORD-2]}
    fi
    # S19.1: the command is the first word that is not part of --root
    local i cmd= root=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        if [[ ${COMP_WORDS[i]} == --root ]]; then
            [[ ${COMP_WORDS[i+1]} == = ]] && ((i++))
            root=(--root "${COMP_WORDS[i+1]}")
            ((i++))
        elif [[ -z $cmd ]]; then
            cmd=${COMP_WORDS[i]}
        fi
    done
    case $prev in
        @QUEUE_FLAGS@)
            COMPREPLY=($(compgen -W "$(rq "${root[@]}" completion --queues 2>/dev/null)" \
                -- "$cur"))
            return ;;
        @FILE_FLAGS@)
            COMPREPLY=($(compgen -f -- "$cur"))
            return ;;
        --op)
            COMPREPLY=($(compgen -W "@ADMIN_OPS@" -- "$cur"))
            return ;;
        --mode)
            COMPREPLY=($(compgen -W "script pull" -- "$cur"))
            return ;;
    esac
    if [[ -z $cmd ]]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "--root --help" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "@COMMANDS@" -- "$cur"))
        fi
        return
    fi
    local flags
    case $cmd in
@FLAG_CASES@
        *) flags= ;;
    esac
    COMPREPLY=($(compgen -W "$flags --root --help" -- "$cur"))
}
complete -o default -F _rq_complete rq
"""


def bash_script() -> str:
    """The script, with every command's flags taken from the registry itself."""
    from rq.cli.base import load_command

    cases = []
    for name in sorted(COMMAND_MODULES):
        cmd = load_command(name)
        flags = " ".join(f"--{flag}" for flag in sorted(cmd.flags)) if cmd else ""
        cases.append(f"        {name}) flags={shlex.quote(flags)} ;;")
    return (SCRIPT.replace("@QUEUE_FLAGS@", "|".join(f"--{f}" for f in QUEUE_FLAGS))
            .replace("@FILE_FLAGS@", "|".join(f"--{f}" for f in FILE_FLAGS))
            .replace("@ADMIN_OPS@", " ".join(ADMIN_OPS))
            .replace("@COMMANDS@", " ".join(sorted(COMMAND_MODULES)))
            .replace("@FLAG_CASES@", "\n".join(cases)))


def queue_names(root: str) -> list[str]:
    """The root's queues: valid names under queue/ with a config.json (S3.1, S3.2)."""
    try:
        entries = os.listdir(os.path.join(root, "queue")) if root else []
    except OSError:
        return []
    return sorted(name for name in entries if protocol.valid_queue_name(name)
                  and os.path.exists(os.path.join(root, "queue", name, "config.json")))


@command("completion", "queues")
def completion(inv: Invocation) -> int:
    """`rq completion [bash]` prints the script; `--queues` the queue names, one a line."""
    if "queues" in inv.flags:
        for name in queue_names(inv.root):
            inv.say(name)
        return 0
    inv.out.write(bash_script())
    return 0
