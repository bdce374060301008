#!/usr/bin/env bash
# A read storm through a 3-node cluster: `LOG.READ` at 50 connections,
# pipeline 16, from redis-benchmark against the leader for SECONDS; the
# leader's commands per second sampled once a second from INFO. Prints the
# first and last ten seconds' rates, sockets left in TIME_WAIT, and the
# leader's term before and after (an unchanged term: no election under the
# storm). redis-benchmark stops at the first error reply, so a run that
# lasts the whole time had none.
#
#   scripts/read-storm.sh [FENCELOG_BINARY] [SECONDS]
#
# Defaults: target/release/fencelog, 60 s. Ports 7711-7713 (+10000 for
# Raft) on 127.0.0.1; data under a temporary directory, removed afterwards.
set -euo pipefail
bin="${1:-target/release/fencelog}"
secs="${2:-60}"
port=7711
# shellcheck source=scripts/background.sh
. "$(dirname "$0")/background.sh"

# shellcheck source=scripts/local-group.sh
. "$(dirname "$0")/local-group.sh"
start_group "$port" "$work/cluster"
leader=$("$bin" cluster status --addr "127.0.0.1:$port" | awk '$3 == "leader" {print $2}')
lport="${leader##*:}"
redis-cli -p "$lport" LOG.APPEND s1 1 hello >/dev/null
term_before=$("$bin" cluster status --addr "$leader" | awk '$3 == "leader" {print $4}')

commands() { redis-cli -p "$lport" INFO stats | awk -F: '/total_commands_processed/ {print $2 + 0}'; }
redis-benchmark -p "$lport" -c 50 -P 16 -n 1000000000 LOG.READ s1 0 >"$work/bench.out" 2>&1 &
bench=$!
pids+=("$bench")
prev=$(commands)
for i in $(seq 1 "$secs"); do
    sleep 1
    if ! kill -0 "$bench" 2>/dev/null; then
        echo "redis-benchmark stopped after $i s (an error reply?):"
        tr '\r' '\n' <"$work/bench.out" | tail -5
        exit 1
    fi
    cur=$(commands)
    echo "$i $((cur - prev))"
    prev=$cur
done >"$work/rates"
kill "$bench"
wait "$bench" 2>/dev/null || true
term_after=$("$bin" cluster status --addr "$leader" | awk '$3 == "leader" {print $4}')
awk -v n="$secs" 'NR <= 10 {a += $2} NR > n - 10 {b += $2} {t += $2}
    END {printf "reads/s: first 10 s %.0f, last 10 s %.0f (ratio %.3f), mean %.0f over %d s\n",
         a / 10, b / 10, b / a, t / NR, NR}' "$work/rates"
echo "TIME_WAIT sockets: $(ss -tan state time-wait | tail -n +2 | wc -l)"
echo "leader $leader, term before $term_before, after ${term_after:-none}"
