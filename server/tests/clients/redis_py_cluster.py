"""The README's lock workflow through redis-py's RedisCluster, across a
leader change. Run by server/tests/cluster_clients.rs:

    python redis_py_cluster.py HOST:PORT [HOST:PORT ...]

Phase 1 runs against the cluster as it is, then prints `KILL` and waits
for a line on stdin: the test kills the leader (SIGKILL) meanwhile.
Phase 2 goes on with the same RedisCluster object. The last line printed
is a JSON summary the test checks. Every wait is bounded.
"""

import json
import sys
import time

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    ConnectionError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

# What a cluster client meets while the cluster elects a new leader: the
# old leader's socket closes or refuses (ConnectionError), a follower that
# knows no leader yet answers TRYAGAIN (TryAgainError, or ClusterError
# "TTL exhausted" once RedisCluster's own redirections ran out), a write
# in flight answers UNCERTAIN (a ResponseError, retried here only where
# the retry is exact).
TRANSIENT = (ConnectionError, TimeoutError, ClusterDownError, TryAgainError, ClusterError)
DEADLINE_S = 30.0


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def retrying(what, f):
    """f() until it answers, for at most DEADLINE_S: only for calls whose
    retry is harmless (reads, LOG.APPENDAT, renewals, a stale write)."""
    deadline = time.monotonic() + DEADLINE_S
    attempt = 0
    while True:
        attempt += 1
        try:
            return f()
        except TRANSIENT as e:
            why = f"{type(e).__name__}: {e}"
        except ResponseError as e:
            if not str(e).startswith("UNCERTAIN"):
                raise
            why = str(e)
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: no answer within {DEADLINE_S} s, last: {why}")
        log(f"{what}: attempt {attempt}: {why}; again")
        time.sleep(0.1)


def expect_error(what, prefix, f):
    """f() must fail with an error reply starting with `prefix`."""
    try:
        got = f()
    except ResponseError as e:
        if not str(e).startswith(prefix):
            raise SystemExit(f"{what}: expected {prefix}, got {e}")
        return str(e)
    raise SystemExit(f"{what}: expected {prefix}, got {got!r}")


def main():
    nodes = [ClusterNode(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1:])]
    rc = RedisCluster(startup_nodes=nodes, socket_timeout=5, socket_connect_timeout=2)
    cmd = rc.execute_command

    # The client routes by key: our commands' keys come from COMMAND.
    assert rc.determine_slot("LOG.APPEND", "jobs", 1, "x") == rc.keyslot("jobs")
    assert rc.determine_slot("LEASE.ACQUIRE", "jobs", "w", 1000) == rc.keyslot("jobs")
    # For a command whose keys move redis-py asks COMMAND GETKEYS (none of
    # ours does); it answers the same key.
    conn = rc.get_default_node().redis_connection
    keys = rc.commands_parser._get_moveable_keys(conn, "LOG.APPEND", "jobs", 1, "x")
    assert keys in (["jobs"], [b"jobs"]), keys
    primaries = [n.name for n in rc.get_primaries()]
    replicas = [n.name for n in rc.get_replicas()]
    log(f"redis-py {redis.__version__}: primary {primaries}, replicas {replicas}")
    assert len(primaries) == 1 and len(replicas) == len(nodes) - 1, (primaries, replicas)

    # Phase 1: A holds the lease, writes, stalls past its ttl; B takes over.
    ta, ttl = cmd("LEASE.ACQUIRE", "jobs", "worker-a", 500, "FENCE")
    assert ttl == 500, ttl
    assert cmd("LOG.APPEND", "jobs", ta, b"a1") == 0
    time.sleep(0.7)
    tb, _ = cmd("LEASE.ACQUIRE", "jobs", "worker-b", 30000, "FENCE")
    assert tb > ta, (ta, tb)
    assert cmd("LOG.APPEND", "jobs", tb, b"b1") == 1
    stale = expect_error("A's late append", "STALE", lambda: cmd("LOG.APPEND", "jobs", ta, b"a2 late"))
    assert stale == f"STALE token {ta} is below the highest accepted token {tb}", stale
    expect_error("A's renewal", "LOST", lambda: cmd("LEASE.RENEW", "jobs", "worker-a", ta, 500))

    # The test kills the leader now.
    print(f"KILL {primaries[0]}", flush=True)
    line = sys.stdin.readline()
    assert line.strip() == "KILLED", line

    # Phase 2, the same client object. A's token stays stale on the new
    # leader (its stale check is the replicated state).
    expect_error("A's append after the failover", "STALE",
                 lambda: retrying("A's append", lambda: cmd("LOG.APPEND", "jobs", ta, b"a3 later")))
    # B's lease survived the leader change: it renews and writes on.
    assert retrying("B's renewal", lambda: cmd("LEASE.RENEW", "jobs", "worker-b", tb, 30000)) == 30000
    assert retrying("B's append", lambda: cmd("LOG.APPENDAT", "jobs", tb, 2, b"b2")) == 2
    new_primary = [n.name for n in rc.get_primaries()]
    log(f"after the failover: primary {new_primary}")
    assert new_primary != primaries, (primaries, new_primary)
    # B releases; C acquires: tokens keep growing across the leader change.
    assert retrying("B's release", lambda: cmd("LEASE.RELEASE", "jobs", "worker-b", tb)) == 1
    tc, _ = retrying("C's acquire", lambda: cmd("LEASE.ACQUIRE", "jobs", "worker-c", 30000, "FENCE"))
    assert tc > tb, (tb, tc)
    assert retrying("C's append", lambda: cmd("LOG.APPENDAT", "jobs", tc, 3, b"c1")) == 3
    for who, t in (("A", ta), ("B", tb)):
        expect_error(f"{who}'s stale append", "STALE", lambda t=t: cmd("LOG.APPEND", "jobs", t, b"late"))
    info = cmd("LEASE.INFO", "jobs")
    assert info[0] == b"worker-c" and info[1] == tc, info
    records = [
        [off, tok, p.decode()]
        for off, tok, p in retrying("read", lambda: cmd("LOG.READ", "jobs", 0, "COUNT", 100))
    ]
    print(json.dumps({"ta": ta, "tb": tb, "tc": tc, "records": records}), flush=True)
    rc.close()


if __name__ == "__main__":
    main()
