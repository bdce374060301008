#!/usr/bin/env bash
# Two fencelog binaries (say, before and after a change) side by side:
# each serves on its own port and data directory, and the same
# `fencelog bench` load (50 connections, 100-byte records, 4 s) runs
# against one then the other, alternating, for stale rejections and
# durable appends at pipeline 1 and 16. Prints throughput and the server's
# CPU seconds per million requests (utime + stime from /proc), the figure
# that holds still on a shared machine.
#
#   scripts/bench-ab.sh OLD_BINARY NEW_BINARY [RUNS]
#
# Ports 7801 (old) and 7802 (new) on 127.0.0.1; data under a temporary
# directory, removed afterwards. The load generator is NEW_BINARY's bench.
set -euo pipefail
old="$1"
new="$2"
runs="${3:-3}"
work="$(mktemp -d)"
"$old" serve --dir "$work/old" --addr 127.0.0.1:7801 --log-level warn >/dev/null 2>&1 &
old_pid=$!
"$new" serve --dir "$work/new" --addr 127.0.0.1:7802 --log-level warn >/dev/null 2>&1 &
new_pid=$!
trap 'kill $old_pid $new_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 50); do
    if "$new" bench --addr 127.0.0.1:7801 --requests 1 --clients 1 --workload reject >/dev/null 2>&1 &&
        "$new" bench --addr 127.0.0.1:7802 --requests 1 --clients 1 --workload reject >/dev/null 2>&1; then
        break
    fi
    sleep 0.2
done
# shellcheck source=scripts/cpu-ticks.sh
. "$(dirname "$0")/cpu-ticks.sh"
results="$work/results.txt"
for run in $(seq 1 "$runs"); do
    for pipeline in 1 16; do
        for workload in reject append; do
            for side in old new; do
                if [ "$side" = old ]; then pid=$old_pid port=7801; else pid=$new_pid port=7802; fi
                before=$(cpu_ticks "$pid")
                "$new" bench --addr "127.0.0.1:$port" --clients 50 --pipeline "$pipeline" \
                    --workload "$workload" --duration 4 --json >"$work/run.json" 2>/dev/null
                after=$(cpu_ticks "$pid")
                echo "$run $side $pipeline $workload $((after - before)) $(tail -n 1 "$work/run.json")" >>"$results"
            done
        done
    done
done
python3 - "$results" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
tck = int(sys.argv[2])
rows = []
for line in open(sys.argv[1]):
    run, side, p, w, ticks, js = line.split(" ", 5)
    r = json.loads(js)
    cpu_per_m = int(ticks) / tck / max(r["requests"], 1) * 1e6
    rows.append((side, int(p), w, r["ops_per_sec"], cpu_per_m))
    print(f"run {run} {side:3} P{p:>2} {w:6} {r['ops_per_sec']:>10.0f} ops/s  {cpu_per_m:6.2f} CPU s/M")
print("\nmedians:        ops/s old → new            CPU s per M old → new")
for p in (1, 16):
    for w in ("reject", "append"):
        m = lambda side, i: statistics.median(x[i] for x in rows if x[0] == side and x[1] == p and x[2] == w)
        print(f"P{p:>2} {w:6} {m('old', 3):>10.0f} → {m('new', 3):>8.0f} ({m('new', 3) / m('old', 3):.2f}x)"
              f"   {m('old', 4):6.2f} → {m('new', 4):6.2f} ({m('new', 4) / m('old', 4):.2f}x)")
PY
