#!/usr/bin/env bash
# Two fencelog binaries (say, before and after a change) through fresh
# 3-node groups, side by side: `scripts/cluster-cpu-split.sh` runs once
# per binary per round, which one goes first alternating from round to
# round, and each round's figures are printed with the medians over all
# rounds: appends (or WORKLOAD's requests) per second, the group's CPU
# seconds per million, the leader's and the mean follower's, and the
# group's CPU per request over the same run's single node (what the
# issue's "3×" row compares). On this shared machine a single pair of runs
# spreads by a fifth; compare medians of several rounds, and read the
# instructions (`scripts/callgrind-cluster-leader.sh`) for changes smaller
# than that.
#
#   scripts/cluster-ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [PIPELINE] [SECONDS]
#
# Defaults: 3 rounds, pipeline 16, 5 s per run. WORKLOAD and
# CLUSTER_SERVE_ARGS are passed to cluster-cpu-split.sh (which also names
# the ports and the temporary directories).
set -euo pipefail
old="$1" new="$2"
rounds="${3:-3}"
pipeline="${4:-16}"
secs="${5:-5}"
split="$(dirname "$0")/cluster-cpu-split.sh"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

# run SIDE BINARY: one fresh single node and group; appends a line
# "SIDE rate cpu leader follower ratio" to $out and prints it.
run() {
    local side="$1" bin="$2" report
    report="$(bash "$split" "$bin" "$pipeline" "$secs" 1)"
    awk -v side="$side" '
        function rate(s) { return s ~ /k$/ ? s * 1e3 : s ~ /M$/ ? s * 1e6 : s + 0 }
        $1 == "single" { single = $3 }
        $1 == "cluster" {
            r = rate($2); cpu = $3; leader = $4; f = ($6 + $8) / 2
        }
        END {
            if (single == "" || cpu == "") { print "no figures from cluster-cpu-split.sh" > "/dev/stderr"; exit 1 }
            printf "%s %.0f %.2f %.2f %.2f %.2f\n", side, r, cpu, leader, f, cpu / single
        }' <<<"$report" | tee -a "$out"
}

echo "side rate/s cpu_s_per_M leader follower ratio_to_single"
for i in $(seq 1 "$rounds"); do
    if ((i % 2)); then
        run old "$old"
        run new "$new"
    else
        run new "$new"
        run old "$old"
    fi
done

echo
echo "medians over $rounds rounds (pipeline $pipeline, ${secs} s, ${WORKLOAD:-append}):"
# median SIDE COLUMN FORMAT: the median of one column of one side's rounds.
median() {
    awk -v side="$1" -v c="$2" '$1 == side { print $c }' "$out" | sort -g |
        awk -v f="$3" '{ a[NR] = $1 } END { printf f, (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
for side in old new; do
    echo "$side $(median "$side" 2 %.0f) $(median "$side" 3 %.2f) $(median "$side" 4 %.2f)" \
        "$(median "$side" 5 %.2f) $(median "$side" 6 %.2f)"
done
