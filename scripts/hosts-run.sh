#!/bin/sh
# hosts-run.sh — runs a command on host I of scripts/hosts-up.sh: in its network, PID and
# mount namespaces (its processes see each other in /proc, and no other host's), in the
# caller's working directory, with the caller's environment.
#
#   scripts/hosts-run.sh I CMD [ARG]...
set -eu
i=${1:-}
[ -n "$i" ] && [ $# -ge 2 ] || { echo "usage: hosts-run.sh I CMD [ARG]..." >&2; exit 2; }
shift
dir=${DDPD_HOSTS_DIR:-/run/ddpd-hosts}
pid=$(cat "$dir/h$i.pid" 2>/dev/null || true)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    echo "hosts-run: host $i is not up (scripts/hosts-up.sh)" >&2
    exit 1
fi
exec nsenter -t "$pid" -n -p -m --wd="$PWD" -- "$@"
