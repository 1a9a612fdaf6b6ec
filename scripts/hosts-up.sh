#!/bin/sh
# hosts-up.sh — N "hosts" on this machine for the multi-host tests (tests/multihost/) and
# benchmarks (bench/allreduce-hosts): each host is a network namespace ddpd-hI with its own
# address 10.77.0.I/24 on one bridge, ddpd-br0 (10.77.0.254/24, the server's side in the
# root namespace), and a "host init" process that holds a PID and mount namespace of its
# own, so that two processes on one host see each other's /proc (the CPU backend's shared
# memory) and two on different hosts do not (their link stays TCP, as between real hosts).
# Idempotent: a host that is already up is kept. Needs root (CAP_NET_ADMIN), ip, unshare,
# nsenter. Run a command on host I with scripts/hosts-run.sh I CMD...; hosts-down.sh
# removes everything this made (also killing every process still on a host).
#
#   scripts/hosts-up.sh N        N in 1..200; prints nothing but errors; exit 0 when up
#
# Environment: DDPD_HOSTS_DIR (pid files, default /run/ddpd-hosts).
set -eu

n=${1:-}
dir=${DDPD_HOSTS_DIR:-/run/ddpd-hosts}
case "$n" in
'' | *[!0-9]*) echo "usage: hosts-up.sh N (1..200)" >&2; exit 2 ;;
esac
if [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then
    echo "hosts-up: N must be in 1..200 (got $n)" >&2
    exit 2
fi
for p in ip unshare nsenter; do
    command -v "$p" >/dev/null 2>&1 || { echo "hosts-up: $p is not installed" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "hosts-up: needs root (network namespaces)" >&2; exit 1; }
mkdir -p "$dir"

br=ddpd-br0
if ! ip link show "$br" >/dev/null 2>&1; then
    ip link add "$br" type bridge
fi
ip addr replace 10.77.0.254/24 dev "$br"
ip link set "$br" up
# Nothing machine-wide is changed: where br_netfilter is loaded and the root namespace's
# FORWARD policy drops (Docker sets it so), bridged frames between hosts meet it; allow
# the bridge there (iptables -I FORWARD -i ddpd-br0 -o ddpd-br0 -j ACCEPT) by hand.

init='import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
    except InterruptedError:
        pass'
i=1
while [ "$i" -le "$n" ]; do
    ns=ddpd-h$i
    veth=ddpd-v$i
    if ! ip netns list | grep -qw "^$ns"; then
        ip netns add "$ns"
    fi
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$br"
    ip link set "$veth" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "10.77.0.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    # The host init: pid 1 of the host's PID namespace, in the host's network namespace.
    pidf=$dir/h$i.pid
    pid=$(cat "$pidf" 2>/dev/null || true)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null || [ "$(ip netns identify "$pid" 2>/dev/null)" != "$ns" ]; then
        # nsenter, not ip netns exec: the host keeps this machine's /sys (with its cgroup
        # mounts, which slurmd needs) instead of a sysfs remounted for the namespace.
        # The init reaps every orphan of the host (a daemon's parent that exits, like
        # slurmd's), as a real init does: a zombie would still look like a process.
        nsenter --net="/run/netns/$ns" unshare --pid --fork --mount-proc --kill-child \
            /usr/bin/python3 -c "$init" ddpd-host-init </dev/null >/dev/null 2>&1 &
        up=$!
        # The init is unshare's child; find it (bounded: 500 x 10 ms).
        pid=
        k=0
        while [ -z "$pid" ] && [ "$k" -lt 500 ]; do
            pid=$(awk '{print $1}' "/proc/$up/task/$up/children" 2>/dev/null)
            if [ -n "$pid" ] && [ "$(ip netns identify "$pid" 2>/dev/null)" != "$ns" ]; then
                pid=
            fi
            [ -n "$pid" ] || sleep 0.01
            k=$((k + 1))
        done
        # Should the pid found be a wrapper, its child is the init.
        if [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = unshare ]; then
            c=$(awk '{print $1}' "/proc/$pid/task/$pid/children" 2>/dev/null)
            [ -n "$c" ] && pid=$c
        fi
        if [ -z "$pid" ]; then
            echo "hosts-up: host $i: the host init did not start" >&2
            exit 1
        fi
        echo "$pid" >"$pidf"
    fi
    i=$((i + 1))
done
# Every host answers (bounded: 200 x 10 ms each).
i=1
while [ "$i" -le "$n" ]; do
    k=0
    until ip netns exec "ddpd-h$i" ip -4 addr show eth0 2>/dev/null | grep -q "10.77.0.$i/"; do
        k=$((k + 1))
        [ "$k" -lt 200 ] || { echo "hosts-up: host $i has no address" >&2; exit 1; }
        sleep 0.01
    done
    i=$((i + 1))
done
