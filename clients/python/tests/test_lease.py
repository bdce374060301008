"""Leases: the keeper, loss, the local refusal, exact retries."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import FakeServer, Proxy, Server
from fencelog import Client, HeldError, LostError, Record, StaleError, UncertainError


def test_keeper_holds_the_lease_across_several_ttls(server: Server, name: str) -> None:
    client = Client("127.0.0.1", server.port)
    with client.lease(name, ttl=0.5) as lease:
        token = lease.token
        assert client.stat(name).highest_token == token  # fenced on acquire
        # Four ttls: without renewals the lease would have expired three times.
        assert not lease.lost.wait(2.0), lease.lost_reason
        info = client.lease_info(name)
        assert info is not None and info.token == token and info.owner == lease.owner
        assert lease.append(name, b"after 5 ttls") == 0
        with pytest.raises(HeldError):
            client.acquire(name, "someone-else", 1000)
    assert lease.lost.is_set() and lease.lost_reason == "released"
    assert client.lease_info(name) is None
    with pytest.raises(LostError):
        lease.append(name, b"after release")
    assert client.read(name, 0) == [Record(0, token, b"after 5 ttls")]
    client.close()


def test_wait_acquires_once_the_holder_releases(server: Server, name: str) -> None:
    a, b = Client("127.0.0.1", server.port), Client("127.0.0.1", server.port)
    first = a.lease(name, ttl=10).acquire()
    acquired = threading.Event()
    result = {}

    def second() -> None:
        with b.lease(name, ttl=10, wait=10) as lease:
            result["token"] = lease.token
            acquired.set()

    t = threading.Thread(target=second)
    t.start()
    assert not acquired.wait(0.3)  # held: the second waits
    first.release()
    assert acquired.wait(10)
    t.join(10)
    assert result["token"] > first.token


def test_loss_is_signalled_when_the_server_stops_answering(own_server: Server, name: str) -> None:
    client = Client("127.0.0.1", own_server.port)
    ttl = 1.0
    lease = client.lease(name, ttl=ttl).acquire()
    try:
        assert lease.append(name, b"before") == 0
        own_server.pause()  # SIGSTOP: no renewal is answered
        paused = time.monotonic()
        try:
            assert lease.lost.wait(ttl + 2), "loss not signalled"
            # At most a ttl after the pause: the last confirmed renewal was
            # sent before it (plus scheduling slack on a busy machine).
            assert lease.lost_at is not None and lease.lost_at - paused <= ttl + 0.5
            assert lease.lost_reason == "not renewed in time"
            with pytest.raises(LostError):
                lease.append(name, b"after loss")
        finally:
            own_server.resume()
        with pytest.raises(LostError):
            lease.append(name, b"after loss, server back")
        assert client.read(name, 0) == [Record(0, lease.token, b"before")]
        assert client.stat(name).next_offset == 1
    finally:
        lease.release()
        client.close()


def test_stale_answer_marks_the_lease_lost(server: Server, name: str) -> None:
    client = Client("127.0.0.1", server.port)
    with client.lease(name, ttl=10) as lease:
        client.fence(name, lease.token + 1000)  # a newer owner elsewhere
        with pytest.raises(StaleError) as e:
            lease.append(name, b"x")
        assert e.value.presented == lease.token
        assert lease.lost.is_set()
        with pytest.raises(LostError):
            lease.append(name, b"y")
    assert client.stat(name).records == 0


@pytest.mark.parametrize("mode", ["reply", "request", "stall"])
def test_append_with_a_lost_reply_lands_exactly_once(
    server: Server, proxy: Proxy, name: str, mode: str
) -> None:
    """The proxy loses the first LOG.APPENDAT's reply (the write happened),
    its request (it did not), or holds the reply back until the client's
    read times out; the lease's one retry lands it exactly once."""
    direct = Client("127.0.0.1", server.port)
    client = Client("127.0.0.1", proxy.port, socket_timeout=1.0 if mode == "stall" else 10.0)
    with client.lease(name, ttl=10) as lease:
        assert lease.append(name, b"first") == 0
        proxy.arm(b"LOG.APPENDAT", mode)
        assert lease.append(name, b"second", b"third") == 1
        assert proxy.fired.is_set()
        assert lease.append(name, b"fourth") == 3
    assert [r.payload for r in direct.read(name, 0)] == [b"first", b"second", b"third", b"fourth"]
    direct.close()
    client.close()


def test_uncertain_append_is_retried_once_with_the_same_offset() -> None:
    calls = []

    def handler(args):
        cmd = args[0].upper()
        if cmd == b"LEASE.ACQUIRE":
            return b"*2\r\n:7\r\n:10000\r\n"
        if cmd == b"LOG.STAT":
            return (b"*10\r\n$13\r\nhighest_token\r\n:7\r\n$11\r\nnext_offset\r\n:3\r\n"
                    b"$12\r\nstart_offset\r\n:0\r\n$7\r\nrecords\r\n:3\r\n$5\r\nbytes\r\n:3\r\n")
        if cmd == b"LOG.APPENDAT":
            calls.append(args)
            if len(calls) == 1:
                return b"-UNCERTAIN the write's leader stepped down\r\n"
            return b":3\r\n"
        if cmd == b"LEASE.RELEASE":
            return b":1\r\n"
        return b":10000\r\n"

    fake = FakeServer(handler)
    try:
        client = Client("127.0.0.1", fake.port)
        with client.lease("jobs", ttl=10) as lease:
            assert lease.append("jobs", b"x") == 3
        assert len(calls) == 2 and calls[0] == calls[1]
        assert calls[0] == [b"LOG.APPENDAT", b"jobs", b"7", b"3", b"x"]
        assert len(fake.sent(b"LOG.STAT")) == 1
    finally:
        fake.close()


def test_reply_lost_twice_is_uncertain() -> None:
    fake = FakeServer(
        lambda args: b"*2\r\n:7\r\n:10000\r\n" if args[0].upper() == b"LEASE.ACQUIRE"
        else b"*2\r\n$11\r\nnext_offset\r\n:0\r\n" if args[0].upper() == b"LOG.STAT"
        else b"-UNCERTAIN still unknown\r\n" if args[0].upper() == b"LOG.APPENDAT"
        else b":1\r\n"
    )
    try:
        client = Client("127.0.0.1", fake.port)
        with client.lease("jobs", ttl=10) as lease:
            with pytest.raises(UncertainError):
                lease.append("jobs", b"x")
        assert len(fake.sent(b"LOG.APPENDAT")) == 2  # exactly one retry
    finally:
        fake.close()
