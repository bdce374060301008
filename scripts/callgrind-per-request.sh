#!/usr/bin/env bash
# The server's instructions per request, all threads, under callgrind:
# the figure that a busy shared machine does not move (CPU seconds do, by
# a tenth or more). `fencelog serve` runs under valgrind; after a warm-up
# of 2000 requests its counters are zeroed, REQUESTS requests are sent by
# the binary's own `fencelog bench` (50 connections), and the dumped
# total is divided by REQUESTS. Callgrind runs the server's threads one at
# a time, so contention (cache lines, locks) does not show: pair it with
# scripts/bench-ab.sh for that.
#
#   scripts/callgrind-per-request.sh BINARY PIPELINE WORKLOAD REQUESTS [DRIVER] [PORT]
#
# e.g. scripts/callgrind-per-request.sh target/release/fencelog 1 reject 20000 threads
set -euo pipefail
bin="$1" pipeline="$2" workload="$3" requests="$4" driver="${5:-events}" port="${6:-7831}"
work="$(mktemp -d)"
valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" --instr-atstart=no \
    "$bin" serve --dir "$work/data" --addr "127.0.0.1:$port" --log-level error >/dev/null 2>"$work/valgrind.log" &
server=$!
trap 'kill $server 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do
    "$bin" bench --addr "127.0.0.1:$port" --requests 1 --clients 1 --workload reject >/dev/null 2>&1 && break
    sleep 0.3
done
load() {
    "$bin" bench --addr "127.0.0.1:$port" --clients 50 --pipeline "$pipeline" --workload "$workload" \
        --driver "$driver" --timeout 120 --requests "$1" --json
}
callgrind_control --instr=on "$server" >/dev/null 2>&1
load 2000 >/dev/null
callgrind_control --zero "$server" >/dev/null 2>&1
load "$requests" >"$work/run.json"
callgrind_control --dump "$server" >/dev/null 2>&1
last="$(ls -v "$work"/cg.* | tail -n 1)"
total="$(awk '/^totals:/ { print $2 }' "$last")"
echo "P$pipeline $workload ($driver): $((total / requests)) instructions per request; $(grep -o '"ops_per_sec":[0-9.]*' "$work/run.json")"
