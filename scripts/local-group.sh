# Sourced by the cluster benchmark scripts (after background.sh, with
# `bin` set): a local 3-node group and its nodes.

# start_group PORT DIR [SERVE_OPTION ...]: starts `cluster local --nodes 3`
# on client ports PORT.. with data in DIR, in the background (its pid in
# `group`, and in `pids` for the cleanup), and waits until it has a leader.
start_group() {
    local port="$1" dir="$2"
    shift 2
    "$bin" cluster local --nodes 3 --port "$port" --dir "$dir" --log-level warn -- "$@" \
        >"$dir.log" 2>&1 &
    group=$!
    pids+=("$group")
    for _ in $(seq 1 100); do
        "$bin" cluster status --addr "127.0.0.1:$port" 2>/dev/null | grep -q leader && return 0
        sleep 0.2
    done
    echo "no leader on port $port: $(tail -n 5 "$dir.log")" >&2
    return 1
}

# leader_first PORT: the client addresses of the group's nodes, the leader
# first, as `cluster status` names them.
leader_first() {
    "$bin" cluster status --addr "127.0.0.1:$1" |
        awk '$3 == "leader" { print $2 } $3 == "follower" { f = f " " $2 } END { print f }' |
        tr '\n' ' '
}
