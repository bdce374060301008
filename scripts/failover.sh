#!/usr/bin/env bash
# Failover time of a local 3-node cluster: KILLS times, SIGKILL the leader,
# time until another node acknowledges a write (redis-cli LOG.APPEND, tried
# every 20 ms on each live node), restart the killed node, wait 3 s.
#
#   scripts/failover.sh [FENCELOG_BINARY] [KILLS]
#
# Defaults: target/release/fencelog, 10 kills. Ports 7741-7743 (+10000 for
# Raft) on 127.0.0.1; data under a temporary directory, removed afterwards.
set -euo pipefail
bin="${1:-target/release/fencelog}"
kills="${2:-10}"
work="$(mktemp -d)"
cleanup() {
    pkill -f "cluster local --nodes 3 --port 7741" 2>/dev/null || true
    pkill -f "serve.*--addr 127.0.0.1:774[123]" 2>/dev/null || true
    sleep 0.5
    rm -rf "$work"
}
trap cleanup EXIT
"$bin" cluster local --nodes 3 --port 7741 --dir "$work/c" --log-level warn >"$work/cluster.log" 2>&1 &
leader_of() {
    for p in 7741 7742 7743; do
        l=$("$bin" cluster status --addr "127.0.0.1:$p" 2>/dev/null | awk '$3 == "leader" {print $2}')
        if [ -n "$l" ]; then echo "$l"; return; fi
    done
}
for _ in $(seq 1 100); do [ -n "$(leader_of)" ] && break; sleep 0.2; done
for i in $(seq 1 "$kills"); do
    leader=$(leader_of)
    pid=$(pgrep -f "serve.*--addr $leader( |$)" | head -1)
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline")
    kill -9 "$pid"
    t0=$(date +%s.%N)
    acked=""
    while [ -z "$acked" ]; do
        for p in 7741 7742 7743; do
            [ "127.0.0.1:$p" = "$leader" ] && continue
            r=$(timeout 1 redis-cli -p "$p" LOG.APPEND failover 1 x 2>&1 || true)
            if [[ "$r" =~ ^[0-9]+$ ]]; then acked=$p; break; fi
        done
        [ -z "$acked" ] && sleep 0.02
    done
    t1=$(date +%s.%N)
    echo "kill $i of $leader: a write acknowledged by 127.0.0.1:$acked after $(python3 -c "print(round($t1 - $t0, 3))") s"
    # shellcheck disable=SC2086 # the node's own command line, word for word
    (setsid $cmd >>"$work/restarted.log" 2>&1 &)
    sleep 3
done
