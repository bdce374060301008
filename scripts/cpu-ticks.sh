# Sourced by the benchmark scripts: cpu_ticks PID... prints the CPU time
# (user + system, in clock ticks: `getconf CLK_TCK` per second) the given
# processes have used, from /proc/PID/stat (fields 14 and 15; the split
# after ") " skips the command name, which may hold spaces).
cpu_ticks() {
    local total=0 p
    for p in "$@"; do
        total=$((total + $(stat_ticks "/proc/$p/stat")))
    done
    echo "$total"
}

# stat_ticks FILE prints utime + stime from a /proc stat file (a process's
# or a thread's); nothing if the file is gone.
stat_ticks() {
    local f
    read -ra f <<<"$(sed 's/^.*) //' "$1" 2>/dev/null)" || return 0
    [ "${#f[@]}" -gt 12 ] && echo $((f[11] + f[12]))
}

# cpu_user_ticks PID... prints the user part (utime, field 14) alone.
cpu_user_ticks() {
    local total=0 p f
    for p in "$@"; do
        read -ra f <<<"$(sed 's/^.*) //' "/proc/$p/stat")"
        total=$((total + f[11]))
    done
    echo "$total"
}

# ctx_switches PID... prints the context switches (voluntary and not) the
# given processes' threads have made, from /proc/PID/task/*/status: a
# thread that has ended no longer counts, so take it over long-lived
# threads (a server's own) and read it before and after a run.
ctx_switches() {
    local p
    for p in "$@"; do
        cat /proc/"$p"/task/*/status 2>/dev/null
    done | awk '/^(non)?voluntary_ctxt_switches:/ { n += $2 } END { print n + 0 }'
}

# thread_kind_ticks PID... prints, per kind of thread, the CPU ticks the
# given processes' threads have used, as "KIND TICKS" lines: raft (the
# Raft runtime), wal (the logs' sync and allocator threads), conn (the
# connection threads, the main thread among them), other.
thread_kind_ticks() {
    local p t comm ticks
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            comm=$(cat "$t/comm" 2>/dev/null) || continue
            ticks=$(stat_ticks "$t/stat")
            [ -n "$ticks" ] || continue
            case "$comm" in
            fencelog-raft*) echo "raft $ticks" ;;
            fencelog-wal*) echo "wal $ticks" ;;
            fencelog-gc*) echo "other $ticks" ;;
            *) echo "conn $ticks" ;;
            esac
        done
    done | awk '{ n[$1] += $2 } END { for (k in n) print k, n[k] }' | sort
}

# machine_ticks prints the whole machine's busy CPU time in clock ticks,
# summed over its CPUs, from /proc/stat's first line: user, nice, system,
# irq, softirq and steal (idle and I/O wait left out; guest time is in
# user already). Every process and the kernel's own threads count.
machine_ticks() {
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}
