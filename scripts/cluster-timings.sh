#!/usr/bin/env bash
# Where a replicated write's time goes, step by step: for each run a fresh
# 3-node `cluster local` takes `fencelog bench --workload append` (50
# clients); each node's `INFO replication` is read before and after, and
# the means over the run are printed: the leader's entry round (proposal
# to answer) and AppendEntries round trip to a follower, every node's Raft
# log sync and apply; with the writes per entry (`CLUSTER INFO`
# raft_proposed_writes over the entry rounds).
#
#   scripts/cluster-timings.sh [FENCELOG_BINARY] [PIPELINE] [SECONDS] [RUNS]
#
# The means divide INFO's totals, which show seconds to the hundredth: use
# runs of a few seconds at least (a 5 s run times thousands of steps).
# Defaults: target/release/fencelog, pipeline 16, 5 s, 3 runs. Ports
# 7621-7623 (+10000 for Raft) on 127.0.0.1; data under a temporary
# directory, removed afterwards.
set -euo pipefail
bin="${1:-target/release/fencelog}"
pipeline="${2:-16}"
secs="${3:-5}"
runs="${4:-3}"
# shellcheck source=scripts/background.sh
. "$(dirname "$0")/background.sh"
# shellcheck source=scripts/local-group.sh
. "$(dirname "$0")/local-group.sh"

# readings PORT: "name value" lines of INFO replication and CLUSTER INFO.
readings() {
    {
        redis-cli -p "$1" INFO replication
        redis-cli -p "$1" CLUSTER INFO
    } | tr -d '\r' | awk -F: 'NF == 2 && $2 ~ /^[0-9.]+$/ { print $1, $2 }' | sort
}

printf '%-4s %-9s %-9s %-8s %-34s %s\n' run "appends/s" "writes/e" node \
    "round / replication (µs, leader)" "log sync / apply (µs)"
for run in $(seq 1 "$runs"); do
    rm -rf "$work/cluster"
    start_group 7621 "$work/cluster"
    order=$(leader_first 7621)
    for addr in $order; do readings "${addr##*:}" >"$work/${addr##*:}.before"; done
    "$bin" bench --addr 127.0.0.1:7621 --workload append --pipeline "$pipeline" \
        --duration "$secs" >"$work/bench" 2>&1
    rate=$(awk '$1 == "append" && $2 ~ /^[0-9]+$/ { print $6; exit }' "$work/bench")
    role=leader
    for addr in $order; do
        port="${addr##*:}"
        readings "$port" >"$work/$port.after"
        join "$work/$port.before" "$work/$port.after" |
            awk -v run="$run" -v rate="$rate" -v role="$role" '
                { d[$1] = $3 - $2 }
                function mean(n, s) {
                    if (d[n] > 0) return sprintf("%.0f", d[s] * 1e6 / d[n])
                    return "-"
                }
                END {
                    we = ""; lead = ""; shown = ""
                    if (role == "leader") {
                        shown = rate
                        if (d["raft_entry_rounds"] > 0)
                            we = sprintf("%.0f", d["raft_proposed_writes"] / d["raft_entry_rounds"])
                        lead = mean("raft_entry_rounds", "raft_entry_round_seconds") " / "
                        lead = lead mean("raft_replications", "raft_replication_seconds")
                    }
                    own = mean("raft_log_syncs", "raft_log_sync_seconds") " / "
                    own = own mean("raft_applies", "raft_apply_seconds")
                    printf "%-4s %-9s %-9s %-8s %-34s %s\n", run, shown, we, role, lead, own
                }'
        role=follower
    done
    kill "$group" 2>/dev/null || true
    wait "$group" 2>/dev/null || true
done
