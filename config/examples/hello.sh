#!/bin/sh
# Example queue script (used by scripts/demo): shows what a job sees and how it reports.
# stdout goes to the message's job/stdio.log; status lines go to fd 3 (SPEC S6.2-S6.4).
echo "hello from pid $$, in $(pwd)"
env | grep '^RQ_' | sort
echo "run working" >&3
sleep 1
echo "done said hello" >&3
