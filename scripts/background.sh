# Sourced by the benchmark scripts: `work`, a temporary directory, and
# `pids`, the background processes a script starts (append each one's $!);
# on exit every one of them is killed and waited for, then `work` is
# removed.
work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
