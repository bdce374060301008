"""Cluster routing: MOVED against a real 3-node cluster, TRYAGAIN and
CLUSTERDOWN backoff against a scripted server, and a leader killed under a
lease. The leader kill comes last: the session's cluster keeps two nodes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, Cluster, FakeServer, free_port
from fencelog import (
    AsyncClient,
    Client,
    ClusterUnavailableError,
    CommandError,
    Record,
    UncertainError,
)


def follower(cluster: Cluster) -> int:
    leader = cluster.leader()
    return next(p for p in cluster.ports if p != leader)


def moved_from(port: int, name: str) -> CommandError:
    """A plain client's answer from a follower: MOVED (TRYAGAIN while an
    election runs, which a busy machine can cause: asked again, bounded)."""
    plain = Client("127.0.0.1", port)
    try:
        deadline = time.monotonic() + 10
        while True:
            with pytest.raises(CommandError) as e:
                plain.append(name, 1, b"x")
            if e.value.code != "TRYAGAIN" or time.monotonic() > deadline:
                return e.value
            time.sleep(0.1)
    finally:
        plain.close()


def test_moved_is_followed_to_the_leader(cluster: Cluster, name: str) -> None:
    port = follower(cluster)
    moved = moved_from(port, name)
    assert moved.code == "MOVED" and str(cluster.leader()) in str(moved)

    c = Client("127.0.0.1", port, cluster=True)
    assert c.append(name, 1, b"a") == 0
    assert c.current_node == ("127.0.0.1", cluster.leader())
    assert c.append_at(name, 1, 1, b"b") == 1
    assert c.read(name, 0) == [Record(0, 1, b"a"), Record(1, 1, b"b")]
    with c.lease(name + "-l", ttl=0.6) as lease:
        assert not lease.lost.wait(1.5), lease.lost_reason
        assert lease.append(name + "-l", b"kept through renewals") == 0
    c.close()


def test_async_moved_is_followed_to_the_leader(cluster: Cluster, name: str) -> None:
    port = follower(cluster)

    async def main() -> None:
        c = AsyncClient("127.0.0.1", port, cluster=True)
        assert await c.append(name, 1, b"a") == 0
        assert c.current_node == ("127.0.0.1", cluster.leader())
        async with c.lease(name, ttl=5) as lease:
            assert await lease.append(name, b"b") == 1
        assert [r.payload for r in await c.read(name, 0)] == [b"a", b"b"]
        await c.close()

    asyncio.run(main())


def test_tryagain_and_clusterdown_are_retried_with_backoff() -> None:
    answers = [b"-TRYAGAIN election in progress\r\n"] * 3 + [
        b"-CLUSTERDOWN no leader\r\n", b":7\r\n"
    ]
    fake = FakeServer(lambda args: answers.pop(0))
    try:
        c = Client("127.0.0.1", fake.port, cluster=True)
        assert c.fence("s", 7) == 7
        assert len(fake.sent(b"LOG.FENCE")) == 5
    finally:
        fake.close()


def test_an_uncertain_acquire_is_asked_again_and_an_uncertain_append_is_not() -> None:
    # A re-acquire by the owner that holds the lease answers its token
    # again, so an acquire whose leader stepped down is safe to resend; an
    # append is not (it could land twice).
    uncertain = b"-UNCERTAIN the leader stepped down with it in flight\r\n"
    acquires = [uncertain, uncertain, b"*2\r\n:7\r\n:1000\r\n"]

    def answer(args: list) -> bytes:
        if args[0].upper() == b"LEASE.ACQUIRE":
            return acquires.pop(0)
        return uncertain

    fake = FakeServer(answer)
    try:
        c = Client("127.0.0.1", fake.port, cluster=True)
        g = c.acquire("l", "me", 1000)
        assert (g.token, g.ttl_ms) == (7, 1000)
        assert len(fake.sent(b"LEASE.ACQUIRE")) == 3
        with pytest.raises(UncertainError):
            c.append("s", 1, b"x")
        assert len(fake.sent(b"LOG.APPEND")) == 1
    finally:
        fake.close()


def test_retries_are_bounded_in_tries_and_time() -> None:
    fake = FakeServer(lambda args: b"-TRYAGAIN election in progress\r\n")
    try:
        c = Client("127.0.0.1", fake.port, cluster=True, max_tries=6)
        with pytest.raises(ClusterUnavailableError):
            c.fence("s", 7)
        assert len(fake.sent(b"LOG.FENCE")) == 6
        c = Client("127.0.0.1", fake.port, cluster=True, max_wait=0.5)
        started = time.monotonic()
        with pytest.raises(ClusterUnavailableError):
            c.fence("s", 7)
        assert time.monotonic() - started < 1.5
        # Without cluster mode, TRYAGAIN is an answer like any other.
        with pytest.raises(CommandError) as e:
            Client("127.0.0.1", fake.port).fence("s", 7)
        assert e.value.code == "TRYAGAIN"
    finally:
        fake.close()


def test_moved_to_a_dead_node_tries_the_other_nodes() -> None:
    dead = free_port()
    stale = FakeServer(lambda args: b"-MOVED 1 127.0.0.1:%d\r\n" % dead)
    leader = FakeServer(lambda args: b":9\r\n")
    try:
        c = Client("127.0.0.1", stale.port, cluster=True, nodes=[("127.0.0.1", leader.port)])
        assert c.fence("s", 9) == 9
        assert c.current_node == ("127.0.0.1", leader.port)
    finally:
        stale.close()
        leader.close()


def test_paused_worker_example_against_the_cluster(cluster: Cluster) -> None:
    run_example(["--port", str(follower(cluster)), "--cluster"])


def run_example(args: list) -> dict:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "paused_worker.py"), *args],
        capture_output=True, timeout=90,
    )
    assert out.returncode == 0, out.stderr.decode()
    summary = json.loads(out.stdout)
    assert summary["b_token"] > summary["a_token"]
    assert summary["a_late_write"] in ("LostError", "STALE")
    assert summary["a_raw_late_write"].startswith("STALE")
    assert summary["a_lost_no_later_than_first_call"] is True
    takeover = [r for r in summary["records"] if r[0] >= 1]
    assert [r[2] for r in takeover] == ["B: step 1", "B: step 2"]
    assert all(r[1] == summary["b_token"] for r in takeover)
    return summary


def _node_pid(cluster: Cluster, port: int) -> int:
    """The pid of the node serving ``port``: a child of `cluster local`."""
    children = Path(f"/proc/{cluster.proc.pid}/task/{cluster.proc.pid}/children")
    for pid in children.read_text().split():
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if f"127.0.0.1:{port}".encode() in cmd:
            return int(pid)
    raise AssertionError(f"no node process serves port {port}")


def test_a_lease_survives_a_leader_kill(cluster: Cluster, name: str) -> None:
    """The leader dies (SIGKILL) under a live lease: the client finds the
    new leader (refused connections, MOVED to the dead node, TRYAGAIN), the
    keeper keeps the lease, and the next append lands once."""
    c = Client("127.0.0.1", cluster.ports[0], cluster=True,
               nodes=[("127.0.0.1", p) for p in cluster.ports[1:]])
    with c.lease(name, ttl=9) as lease:
        assert lease.append(name, b"before") == 0
        leader = cluster.leader()
        os.kill(_node_pid(cluster, leader), signal.SIGKILL)
        started = time.monotonic()
        assert lease.append(name, b"after") == 1
        took = time.monotonic() - started
        assert c.current_node != ("127.0.0.1", leader)
        assert not lease.lost.is_set(), lease.lost_reason
        info = c.lease_info(name)
        assert info is not None and info.token == lease.token
    assert [r.payload for r in c.read(name, 0)] == [b"before", b"after"]
    print(f"append after the leader kill took {took:.2f} s")
    c.close()
