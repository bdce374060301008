#!/usr/bin/env bash
# Durable appends, stale-write rejections and linearizable reads
# (`LOG.READ stream 0 COUNT 1`; through the cluster each read first
# confirms leadership with a quorum) through a 3-node cluster on loopback
# against a single node, driven by the same load generator (`fencelog
# bench`) in alternating runs; prints every run and the medians (the ratio
# column is cluster / single node), with the servers' CPU seconds per
# million requests and their threads' context switches per request (both
# summed over every node of the setup), and the whole machine's busy share
# during each run (/proc/stat: every process and the kernel's own threads,
# over both the run and its warmup) with the rate that share would scale to
# with every core busy.
#
#   scripts/bench-cluster.sh [FENCELOG_BINARY] [RUNS] [SECONDS]
#
# Defaults: target/release/fencelog, 3 runs, 5 s per workload. Ports
# 7601 (single node) and 7611-7613 (+10000 for Raft) on 127.0.0.1; data
# under a temporary directory, removed afterwards. CLUSTER_SERVE_ARGS
# holds options for every cluster node's `fencelog serve` (for example
# CLUSTER_SERVE_ARGS="--cluster-election-timeout-ms 500").
set -euo pipefail
bin="${1:-target/release/fencelog}"
runs="${2:-3}"
secs="${3:-5}"
# shellcheck source=scripts/background.sh
. "$(dirname "$0")/background.sh"

"$bin" serve --dir "$work/single" --addr 127.0.0.1:7601 --log-level warn >"$work/single.log" 2>&1 &
pids+=($!)
# shellcheck disable=SC2086 # CLUSTER_SERVE_ARGS is a list of options
"$bin" cluster local --nodes 3 --port 7611 --dir "$work/cluster" --log-level warn \
    -- ${CLUSTER_SERVE_ARGS:-} >"$work/cluster.log" 2>&1 &
pids+=($!)
# Wait for both: the single node answers PING, the cluster has a leader.
for _ in $(seq 1 100); do
    if "$bin" cluster status --addr 127.0.0.1:7611 2>/dev/null | grep -q leader &&
        "$bin" bench --addr 127.0.0.1:7601 --requests 1 --clients 1 --workload append >/dev/null 2>&1; then
        break
    fi
    sleep 0.2
done

# The server processes of each setup, for their CPU time: the single node,
# and the nodes `cluster local` started.
single_pids="${pids[0]}"
cluster_pids="$(pgrep -P "${pids[1]}" | tr '\n' ' ')"
# shellcheck source=scripts/cpu-ticks.sh
. "$(dirname "$0")/cpu-ticks.sh"
tck=$(getconf CLK_TCK)
cpus=$(grep -c '^cpu[0-9]' /proc/stat)

results="$work/results.jsonl"
for run in $(seq 1 "$runs"); do
    for pipeline in 1 16; do
        for workload in append reject read; do
            for target in single:127.0.0.1:7601 cluster:127.0.0.1:7611; do
                name="${target%%:*}"
                addr="${target#*:}"
                if [ "$name" = single ]; then procs=$single_pids; else procs=$cluster_pids; fi
                # shellcheck disable=SC2086 # a list of pids
                before=$(cpu_ticks $procs)
                # shellcheck disable=SC2086
                switches_before=$(ctx_switches $procs)
                machine_before=$(machine_ticks)
                started=$(date +%s.%N)
                # The bench follows the cluster's leader (CLUSTER SLOTS).
                if ! "$bin" bench --addr "$addr" --clients 50 --pipeline "$pipeline" \
                    --workload "$workload" --duration "$secs" --warmup 1 --json \
                    >"$work/run.json" 2>"$work/run.err"; then
                    echo "bench against the $name setup ($addr) failed:" >&2
                    cat "$work/run.err" "$work/single.log" "$work/cluster.log" >&2
                    exit 1
                fi
                busy=$(python3 -c "print(($(machine_ticks) - $machine_before) / $tck / (($(date +%s.%N) - $started) * $cpus))")
                # shellcheck disable=SC2086
                after=$(cpu_ticks $procs)
                # shellcheck disable=SC2086
                switches=$(($(ctx_switches $procs) - switches_before))
                # CPU over the whole run (warmup included) per measured request:
                # an upper bound, the same for both setups.
                sed "s/^{/{\"node\":\"$name\",\"run\":$run,\"server_cpu_s\":$(python3 -c "print(($after - $before) / $tck)"),\"switches\":$switches,\"machine_busy\":$busy,/" \
                    "$work/run.json" >>"$results"
            done
        done
    done
done

python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def cpu_per_m(r):
    # Server CPU seconds (all the setup's processes) per million requests.
    return r["server_cpu_s"] / max(r["requests"], 1) * 1e6
def switches(r):
    # Context switches of the setup's threads per request.
    return r["switches"] / max(r["requests"], 1)
print(f"{'run':>3} {'setup':8} {'workload':8} {'P':>3} {'ops/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'cpu s/M':>8} {'csw/req':>8} {'busy':>6}")
for r in rows:
    l = r["latency_us"]
    print(f"{r['run']:>3} {r['node']:8} {r['workload']:8} {r['pipeline']:>3} {r['ops_per_sec']:>10.0f}"
          f" {l['p50']/1000:>8.2f} {l['p99']/1000:>8.2f} {cpu_per_m(r):>8.1f} {switches(r):>8.2f}"
          f" {r['machine_busy']*100:>5.0f}%")
print("\nmedians (ops/s; server CPU seconds per million requests and context switches per request, warmup included, all nodes):")
print(f"{'workload':8} {'P':>3} {'single':>10} {'3 nodes':>10} {'ratio':>6} {'cpu single':>11} {'cpu 3 nodes':>12}"
      f" {'csw single':>11} {'csw 3 nodes':>12} {'busy single':>12} {'busy 3 nodes':>13} {'3 nodes, every core busy':>25}")
keys = sorted({(r["workload"], r["pipeline"]) for r in rows})
for w, p in keys:
    sel = lambda n: [r for r in rows if r["workload"] == w and r["pipeline"] == p and r["node"] == n]
    m = {n: statistics.median(r["ops_per_sec"] for r in sel(n)) for n in ("single", "cluster")}
    c = {n: statistics.median(cpu_per_m(r) for r in sel(n)) for n in ("single", "cluster")}
    s = {n: statistics.median(switches(r) for r in sel(n)) for n in ("single", "cluster")}
    b = {n: statistics.median(r["machine_busy"] for r in sel(n)) for n in ("single", "cluster")}
    # The group's rate scaled to every core busy at its measured share,
    # as a fraction of the single node's measured rate.
    full = statistics.median(r["ops_per_sec"] / max(r["machine_busy"], 1e-9) for r in sel("cluster"))
    print(f"{w:8} {p:>3} {m['single']:>10.0f} {m['cluster']:>10.0f} {m['cluster']/m['single']:>6.2f}"
          f" {c['single']:>11.1f} {c['cluster']:>12.1f} {s['single']:>11.2f} {s['cluster']:>12.2f}"
          f" {b['single']*100:>11.0f}% {b['cluster']*100:>12.0f}% {full:>12.0f} ({full/m['single']:.2f} of single)")
bad = [r for r in rows if r["unexpected_errors"]]
if bad:
    print(f"\n{len(bad)} runs had unexpected answers: {[r['unexpected_samples'] for r in bad]}")
    sys.exit(1)
PY
