#!/bin/sh
# Instance $1 fails (exit code $2, or "kill" = SIGKILL itself) after writing to stderr;
# every other instance sleeps.
if [ "$POPDIST_INSTANCE_INDEX" = "$1" ]; then
    echo "instance $1 is failing on purpose" >&2
    [ "$2" = kill ] && kill -9 $$
    exit "$2"
fi
exec sleep 60
