#!/usr/bin/env bash
# Where a replicated append's CPU goes, node by node: for each run, a fresh
# single node and then a fresh 3-node `cluster local` take the same load
# (`fencelog bench --workload append`, 50 clients), one after the other;
# prints appends per second, each server's CPU seconds per million appends
# (the leader's, then each follower's, as `cluster status` names them), the
# cores the servers kept busy and the load generator's own CPU (from
# /usr/bin/time), so that a ratio to the single node can be read against
# what the machine had left, the whole machine's busy share (/proc/stat:
# the kernel's own threads, writing the logs back, count too) and the
# rate the machine's CPU per append would allow with every core busy;
# then the leader's and the followers' CPU by kind of thread
# (connections, Raft runtime, logs' threads).
#
#   scripts/cluster-cpu-split.sh [FENCELOG_BINARY] [PIPELINE] [SECONDS] [RUNS]
#
# Defaults: target/release/fencelog, pipeline 16, 5 s, 3 runs; WORKLOAD=read
# (or reject) measures that workload instead of appends; CLUSTER_SERVE_ARGS
# (e.g. "--threads 1") go to every node of the group, not the single node. Ports 7601
# (single node) and 7611-7613 (+10000 for Raft) on 127.0.0.1; data under a
# temporary directory, removed afterwards. Every run starts from empty
# data directories: a group that has run a while is slower on this VM
# (docs/CLUSTER.md, "The Raft log's page cache").
set -euo pipefail
bin="${1:-target/release/fencelog}"
pipeline="${2:-16}"
secs="${3:-5}"
runs="${4:-3}"
workload="${WORKLOAD:-append}"
# shellcheck source=scripts/background.sh
. "$(dirname "$0")/background.sh"
# shellcheck source=scripts/cpu-ticks.sh
. "$(dirname "$0")/cpu-ticks.sh"
# shellcheck source=scripts/local-group.sh
. "$(dirname "$0")/local-group.sh"
tck=$(getconf CLK_TCK)
cpus=$(grep -c '^cpu[0-9]' /proc/stat)

# bench ADDR: runs the load; prints "APPENDS_PER_S REQUESTS LOADGEN_CPU_S
# MACHINE_BUSY_TICKS WALL_S" (the machine's ticks over the whole command,
# against its whole time, as bench-cluster.sh takes them).
bench() {
    local m0 t0
    m0=$(machine_ticks)
    t0=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$work/time" \
        "$bin" bench --addr "$1" --workload "$workload" --pipeline "$pipeline" \
        --duration "$secs" >"$work/bench" 2>&1
    awk -v w="$workload" '$1 == w && $2 ~ /^[0-9]+$/ { print $6, $4 }' "$work/bench" | head -n 1 |
        tr '\n' ' '
    awk '{ printf "%s ", $1 + $2 }' "$work/time"
    echo "$(($(machine_ticks) - m0)) $(python3 -c "print($(date +%s.%N) - $t0)")"
}

# stop PID: ends one setup (its children with it) before the next starts.
stop() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

printf '%-7s %-10s %-12s %-40s %-14s %-22s %-14s %s\n' setup "$workload/s" "CPU s/M" \
    "per node: leader, followers (CPU s/M)" "server cores" "load generator cores" \
    "machine busy" "with every core busy"
for run in $(seq 1 "$runs"); do
    rm -rf "$work/single" "$work/cluster"
    "$bin" serve --dir "$work/single" --addr 127.0.0.1:7601 --log-level warn \
        >"$work/single.log" 2>&1 &
    single=$!
    pids+=("$single")
    for _ in $(seq 1 50); do
        "$bin" bench --addr 127.0.0.1:7601 --requests 1 --clients 1 --workload append \
            >/dev/null 2>&1 && break
        sleep 0.1
    done
    before=$(cpu_ticks "$single")
    read -r rate requests loadgen machine wall <<<"$(bench 127.0.0.1:7601)"
    used=$(($(cpu_ticks "$single") - before))
    stop "$single"
    awk -v r="$rate" -v n="$requests" -v u="$used" -v t="$tck" -v s="$secs" -v l="$loadgen" \
        -v m="$machine" -v c="$cpus" -v w="$wall" \
        'BEGIN { printf "%-7s %-10s %-12.2f %-40s %-14.2f %-22.2f %-14s %.1fk/s\n", "single", r,
                 u / t / n * 1e6, "", u / t / s, l / s, sprintf("%.0f%%", m / t / w / c * 100),
                 c / (m / t / n) / 1e3 }'

    # shellcheck disable=SC2086 # options, split on purpose
    start_group 7611 "$work/cluster" ${CLUSTER_SERVE_ARGS:-}
    # Each node's process, leader first, by the client port it serves.
    order=$(leader_first 7611)
    nodes=()
    for addr in $order; do
        for p in $(pgrep -P "$group"); do
            if tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- "--addr $addr "; then
                nodes+=("$p")
            fi
        done
    done
    declare -A start=()
    for p in "${nodes[@]}"; do start[$p]=$(cpu_ticks "$p"); done
    thread_kind_ticks "${nodes[0]}" >"$work/leader.before"
    thread_kind_ticks "${nodes[@]:1}" >"$work/followers.before"
    read -r rate requests loadgen machine wall <<<"$(bench 127.0.0.1:7611)"
    thread_kind_ticks "${nodes[0]}" >"$work/leader.after"
    thread_kind_ticks "${nodes[@]:1}" >"$work/followers.after"
    per=""
    total=0
    for p in "${nodes[@]}"; do
        used=$(($(cpu_ticks "$p") - start[$p]))
        total=$((total + used))
        per="$per $used"
    done
    stop "$group"
    awk -v r="$rate" -v n="$requests" -v u="$total" -v per="$per" -v t="$tck" -v s="$secs" \
        -v l="$loadgen" -v m="$machine" -v c="$cpus" -v w="$wall" \
        'BEGIN { k = split(per, q, " "); o = "";
                 for (i = 1; i <= k; i++) o = o sprintf("%s%.2f", i > 1 ? " / " : "", q[i] / t / n * 1e6);
                 printf "%-7s %-10s %-12.2f %-40s %-14.2f %-22.2f %-14s %.1fk/s\n", "cluster", r,
                 u / t / n * 1e6, o, u / t / s, l / s, sprintf("%.0f%%", m / t / w / c * 100),
                 c / (m / t / n) / 1e3 }'
    # By kind of thread, CPU s per M (the followers' together).
    for who in leader followers; do
        join "$work/$who.before" "$work/$who.after" |
            awk -v w="$who" -v n="$requests" -v t="$tck" \
                '{ o = o sprintf(" %s %.2f", $1, ($3 - $2) / t / n * 1e6) }
                 END { printf "  %-9s threads, CPU s/M:%s\n", w, o }'
    done
done
