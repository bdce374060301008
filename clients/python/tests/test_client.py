"""Typed commands and typed errors against a real server (RESP2 and RESP3)."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import FakeServer, Server, wait_until
from fencelog import (
    AuthError,
    Client,
    CommandError,
    FencelogConnectionError,
    HeldError,
    LostError,
    MismatchError,
    Record,
    StaleError,
    TooBigError,
    TrimmedError,
    UncertainError,
)


def blocked_clients(c: Client) -> int:
    info = c.execute("INFO", "clients").decode()
    return int(info.split("blocked_clients:")[1].split()[0])


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def client(request: pytest.FixtureRequest, server: Server):
    c = Client("127.0.0.1", server.port, protocol=request.param)
    yield c
    c.close()


def test_stream_commands(client: Client, name: str) -> None:
    assert client.stat(name) == (0, 0, 0, 0, 0)
    assert client.append(name, 5, b"a", "b") == 0
    assert client.append_at(name, 5, 2, b"c") == 2
    # An exact retry answers the original offset and writes nothing, even
    # after a newer token was accepted.
    assert client.fence(name, 6) == 6
    assert client.append_at(name, 5, 2, b"c") == 2
    st = client.stat(name)
    assert (st.highest_token, st.next_offset, st.records, st.bytes) == (6, 3, 3, 3)
    assert client.read(name, 0) == [Record(0, 5, b"a"), Record(1, 5, b"b"), Record(2, 5, b"c")]
    assert client.read(name, 1, count=1) == [Record(1, 5, b"b")]
    assert client.read(name, 3) == []
    assert client.trim(name, 6, 2) == 2
    assert client.delete(name, 6) == 1
    st = client.stat(name)
    assert (st.highest_token, st.next_offset, st.start_offset, st.records) == (6, 3, 3, 0)


def test_lease_commands(client: Client, name: str) -> None:
    assert client.lease_info(name) is None
    g = client.acquire(name, "worker-a", 10_000, fence=True)
    assert g.ttl_ms == 10_000 and g.token > 0
    assert client.stat(name).highest_token == g.token
    info = client.lease_info(name)
    assert info is not None and (info.owner, info.token) == ("worker-a", g.token)
    assert 0 < info.remaining_ms <= 10_000
    assert client.renew(name, "worker-a", g.token, 5_000) == 5_000
    assert client.release(name, "worker-a", g.token) is True
    assert client.release(name, "worker-a", g.token) is False
    assert client.lease_info(name) is None


def test_typed_errors(client: Client, name: str) -> None:
    client.append(name, 42, b"x")
    with pytest.raises(StaleError) as e:
        client.append(name, 41, b"late")
    assert (e.value.presented, e.value.highest, e.value.code) == (41, 42, "STALE")
    assert str(e.value) == "STALE token 41 is below the highest accepted token 42"
    with pytest.raises(MismatchError) as m:
        client.append_at(name, 42, 5, b"x")
    assert (m.value.expected, m.value.next) == (5, 1)
    client.append(name, 42, b"y")
    client.trim(name, 42, 2)
    with pytest.raises(TrimmedError) as t:
        client.read(name, 0)
    assert (t.value.requested, t.value.start) == (0, 2)
    g = client.acquire(name + "-l", "worker-a", 10_000)
    with pytest.raises(HeldError) as h:
        client.acquire(name + "-l", "worker-b", 10_000)
    assert 0 < h.value.remaining_ms <= 10_000
    with pytest.raises(LostError):
        client.renew(name + "-l", "worker-a", g.token + 1, 10_000)
    with pytest.raises(TooBigError):
        client.append(name, 42, b"x" * (1024 * 1024 + 1))
    with pytest.raises(CommandError) as z:
        client.append(name, 0, b"x")
    assert z.value.code == "ERR"
    # The connection stays usable after every error.
    assert client.stat(name).next_offset == 2


def test_blocking_read_wakes_on_append(client: Client, server: Server, name: str) -> None:
    got = []
    done = threading.Event()

    def reader() -> None:
        got.extend(client.read(name, 0, block_ms=10_000))
        done.set()

    t = threading.Thread(target=reader)
    started = time.monotonic()
    t.start()
    writer = Client("127.0.0.1", server.port)
    # The read is blocked on the server before the record is written.
    wait_until(lambda: blocked_clients(writer) >= 1, 5, "the read to block")
    assert not done.is_set()
    writer.append(name, 1, b"hello")
    assert done.wait(5), "the blocked read did not wake"
    t.join(5)
    assert got == [Record(0, 1, b"hello")]
    assert time.monotonic() - started < 5
    writer.close()


def test_tail_follows_a_stream(client: Client, server: Server, name: str) -> None:
    writer = Client("127.0.0.1", server.port)
    writer.append(name, 1, b"r0", b"r1")
    stop = threading.Event()
    seen = []

    def follow() -> None:
        for rec in client.tail(name, 0, block_ms=200, stop=stop):
            seen.append(rec)
            if len(seen) == 5:
                stop.set()

    t = threading.Thread(target=follow)
    t.start()
    for i in range(2, 5):
        writer.append(name, 1, b"r%d" % i)
    t.join(10)
    assert not t.is_alive(), "tail did not stop"
    assert [r.payload for r in seen] == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert [r.offset for r in seen] == [0, 1, 2, 3, 4]
    writer.close()


def test_password(tmp_path) -> None:
    s = Server(tmp_path / "data", ["--requirepass", "sesame"])
    try:
        with pytest.raises(AuthError):
            Client("127.0.0.1", s.port).stat("x")
        with pytest.raises(AuthError):
            Client("127.0.0.1", s.port, password="wrong").stat("x")
        c = Client("127.0.0.1", s.port, password="sesame")
        assert c.append("x", 1, b"a") == 0
        c.close()
    finally:
        s.stop()


def test_idle_connections_survive_a_server_restart(own_server: Server, name: str) -> None:
    """A pooled connection the server closed is replaced, not written into:
    a plain append after a restart neither fails nor lands twice."""
    c = Client("127.0.0.1", own_server.port)
    assert c.append(name, 3, b"before") == 0
    own_server.restart()
    assert c.append(name, 3, b"after") == 1
    with pytest.raises(StaleError):
        c.append(name, 2, b"stale after restart")
    assert [r.payload for r in c.read(name, 0)] == [b"before", b"after"]
    c.close()


def test_unreachable_server_is_a_connection_error() -> None:
    from conftest import free_port

    with pytest.raises(FencelogConnectionError):
        Client("127.0.0.1", free_port(), connect_timeout=1).stat("x")


def test_uncertain_is_typed() -> None:
    fake = FakeServer(lambda args: b"-UNCERTAIN the leader stepped down with the write in flight\r\n")
    try:
        with pytest.raises(UncertainError) as e:
            Client("127.0.0.1", fake.port).append_at("s", 1, 0, b"x")
        assert e.value.code == "UNCERTAIN"
    finally:
        fake.close()
