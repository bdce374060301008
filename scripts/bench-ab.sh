#!/usr/bin/env bash
# Two fencelog binaries (say, before and after a change) side by side:
# each serves on its own port and data directory, and the same
# `fencelog bench` load (50 connections, 100-byte records, 4 s) runs
# against both, for stale rejections and durable appends at pipeline 1 and
# 16. Which side goes first alternates from run to run (and from row to
# row), so neither always meets the warmer machine or the larger data
# directory. Prints throughput and the server's CPU seconds per million
# requests, in all (utime + stime) and user alone, from /proc: the figures
# that hold still on a shared machine.
#
#   scripts/bench-ab.sh [--driver events|threads] OLD_BINARY NEW_BINARY [RUNS]
#
# --driver is the load generator's (`fencelog bench --driver`, default
# events: one event loop; threads: one OS thread per connection). Ports
# 7801 (old) and 7802 (new) on 127.0.0.1; data under a temporary
# directory, removed afterwards. The load generator is NEW_BINARY's bench.
# Two copies of one binary show the script's noise floor.
set -euo pipefail
driver=events
if [ "${1:-}" = --driver ]; then
    driver="$2"
    shift 2
fi
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
    # A row's first side flips from run to run, and from row to row.
    turn=$run
    for pipeline in 1 16; do
        for workload in reject append; do
            if [ $((turn % 2)) -eq 0 ]; then sides="old new"; else sides="new old"; fi
            turn=$((turn + 1))
            for side in $sides; do
                if [ "$side" = old ]; then pid=$old_pid port=7801; else pid=$new_pid port=7802; fi
                before=$(cpu_ticks "$pid")
                before_user=$(cpu_user_ticks "$pid")
                "$new" bench --addr "127.0.0.1:$port" --clients 50 --pipeline "$pipeline" \
                    --workload "$workload" --duration 4 --driver "$driver" --json >"$work/run.json" 2>/dev/null
                after=$(cpu_ticks "$pid")
                after_user=$(cpu_user_ticks "$pid")
                echo "$run $side $pipeline $workload $((after - before)) $((after_user - before_user)) $(tail -n 1 "$work/run.json")" >>"$results"
            done
        done
    done
done
python3 - "$results" "$(getconf CLK_TCK)" "$driver" <<'PY'
import json, statistics, sys
tck = int(sys.argv[2])
rows = []
for line in open(sys.argv[1]):
    run, side, p, w, ticks, user, js = line.split(" ", 6)
    r = json.loads(js)
    per_m = lambda t: int(t) / tck / max(r["requests"], 1) * 1e6
    rows.append((side, int(p), w, r["ops_per_sec"], per_m(ticks), per_m(user)))
    print(f"run {run} {side:3} P{p:>2} {w:6} {r['ops_per_sec']:>10.0f} ops/s  "
          f"{per_m(ticks):6.2f} CPU s/M  {per_m(user):6.2f} user s/M")
print(f"\nmedians, driver {sys.argv[3]}:")
print("           ops/s old → new              CPU s per M old → new     user s per M old → new")
for p in (1, 16):
    for w in ("reject", "append"):
        m = lambda side, i: statistics.median(x[i] for x in rows if x[0] == side and x[1] == p and x[2] == w)
        ratio = lambda i: m('new', i) / m('old', i) if m('old', i) else float('nan')
        print(f"P{p:>2} {w:6} {m('old', 3):>10.0f} → {m('new', 3):>8.0f} ({ratio(3):.2f}x)"
              f"   {m('old', 4):6.2f} → {m('new', 4):6.2f} ({ratio(4):.2f}x)"
              f"   {m('old', 5):6.2f} → {m('new', 5):6.2f} ({ratio(5):.2f}x)")
PY
