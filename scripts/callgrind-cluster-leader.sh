#!/usr/bin/env bash
# The leader's instructions per request through a 3-node group, under
# callgrind: `scripts/callgrind-per-request.sh` for a group. `cluster
# local` runs under valgrind with every node traced (election timeout 5 s,
# so that nodes slowed fifty times keep their leader); once a leader is
# elected its counters are zeroed after a warm-up of 2000 requests,
# REQUESTS requests go to it (`fencelog bench`, 50 connections), and its
# dumped total is divided by REQUESTS. Only the leader's threads count;
# with ROLE=follower, only a follower's (the requests still go to the
# leader).
#
#   [ROLE=follower] scripts/callgrind-cluster-leader.sh BINARY PIPELINE WORKLOAD REQUESTS [PORT]
#
# e.g. scripts/callgrind-cluster-leader.sh target/release/fencelog 16 read 20000
set -euo pipefail
bin="$1" pipeline="$2" workload="$3" requests="$4" port="${5:-7751}"
work="$(mktemp -d)"
valgrind --tool=callgrind --trace-children=yes --instr-atstart=no \
    --callgrind-out-file="$work/cg.%p" \
    "$bin" cluster local --nodes 3 --port "$port" --dir "$work/data" --log-level error \
    -- --cluster-election-timeout-ms 5000 >/dev/null 2>"$work/valgrind.log" &
group=$!
trap 'kill $group 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
leader=""
for _ in $(seq 1 300); do
    leader=$("$bin" cluster status --addr "127.0.0.1:$port" 2>/dev/null |
        awk '$3 == "leader" { print $2 }') || true
    [ -n "$leader" ] && break
    sleep 0.5
done
[ -n "$leader" ] || { echo "no leader elected" >&2; exit 1; }
role="${ROLE:-leader}"
traced="$leader"
if [ "$role" = follower ]; then
    traced=$("$bin" cluster status --addr "$leader" | awk '$3 == "follower" { print $2; exit }')
fi
# The valgrind process that runs the traced node's `serve`.
pid=""
for p in $(pgrep -f -- "--addr $traced "); do
    [ "$(cat "/proc/$p/comm")" != bash ] && pid=$p && break
done
load() {
    "$bin" bench --addr "$leader" --clients 50 --pipeline "$pipeline" --workload "$workload" \
        --timeout 120 --requests "$1" --json
}
callgrind_control --instr=on "$pid" >/dev/null 2>&1
load 2000 >/dev/null
callgrind_control --zero "$pid" >/dev/null 2>&1
load "$requests" >"$work/run.json"
callgrind_control --dump "$pid" >/dev/null 2>&1
sleep 1
last="$(ls -v "$work"/cg."$pid"* | tail -n 1)"
total="$(awk '/^totals:/ { print $2 }' "$last")"
echo "$role P$pipeline $workload: $((total / requests)) instructions per request; $(grep -o '"ops_per_sec":[0-9.]*' "$work/run.json")"
