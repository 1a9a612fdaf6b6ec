#!/bin/sh
# slurm-down.sh — stops the one-host Slurm that scripts/slurm-up.sh started: cancels its
# jobs, then ends slurmd, slurmctld and munged by the pids in their pid files (nothing
# else). The state folder stays for its logs.
#   scripts/slurm-down.sh [DIR]   DIR as for slurm-up.sh
set -u

dir=${1:-${DDPD_SLURM_DIR:-/tmp/ddpd-slurm}}
PATH=$PATH:/usr/sbin
[ -f "$dir/slurm.conf" ] || exit 0
export SLURM_CONF="$dir/slurm.conf"
scancel --full --quiet --user="$(id -un)" 2>/dev/null || true

stop() { # pid file, name
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 50 ]; do
        sleep 0.2
        i=$((i + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "slurm-down: $2 (pid $pid) ignored SIGTERM for 10 s; SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
}
stop "$dir/slurmd.pid" slurmd
stop "$dir/slurmctld.pid" slurmctld
stop "$dir/munge/munged.pid" munged
exit 0
