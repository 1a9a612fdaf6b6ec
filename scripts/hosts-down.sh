#!/bin/sh
# hosts-down.sh — removes what scripts/hosts-up.sh made: kills every process still on a
# host (its PID namespace's init, whose end takes every process of the namespace with it,
# then anything left in the network namespace), deletes the namespaces, veths and the
# bridge. Idempotent; safe when nothing is up. Exit 1 when a process could not be ended.
#
#   scripts/hosts-down.sh
set -u
dir=${DDPD_HOSTS_DIR:-/run/ddpd-hosts}
rc=0
for pidf in "$dir"/h*.pid; do
    [ -f "$pidf" ] || continue
    pid=$(cat "$pidf" 2>/dev/null || true)
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -f "$pidf"
done
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^ddpd-h[0-9]*$'); do
    # Anything else in the network namespace (a process started with ip netns exec).
    k=0
    while [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && [ "$k" -lt 300 ]; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do
            kill -KILL "$p" 2>/dev/null
        done
        sleep 0.01
        k=$((k + 1))
    done
    if [ -n "$(ip netns pids "$ns" 2>/dev/null)" ]; then
        echo "hosts-down: processes left in $ns: $(ip netns pids "$ns" | tr '\n' ' ')" >&2
        rc=1
    fi
    ip netns del "$ns" 2>/dev/null || true
done
for veth in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep '^ddpd-v[0-9]*$'); do
    ip link del "$veth" 2>/dev/null || true
done
ip link del ddpd-br0 2>/dev/null || true
exit $rc
