"""The asyncio client: the main cases of the sync tests, with ``await``.

Each test runs its coroutine with ``asyncio.run`` (no pytest plugin needed).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import Proxy, Server
from fencelog import (
    AsyncClient,
    HeldError,
    LostError,
    MismatchError,
    Record,
    StaleError,
    TrimmedError,
)


@pytest.mark.parametrize("protocol", [2, 3])
def test_commands_and_typed_errors(server: Server, name: str, protocol: int) -> None:
    async def main() -> None:
        c = AsyncClient("127.0.0.1", server.port, protocol=protocol)
        assert await c.append(name, 42, b"a", b"b") == 0
        assert await c.append_at(name, 42, 2, b"c") == 2
        assert await c.append_at(name, 42, 2, b"c") == 2  # exact retry
        assert await c.read(name, 1) == [Record(1, 42, b"b"), Record(2, 42, b"c")]
        assert (await c.stat(name)).next_offset == 3
        with pytest.raises(StaleError) as e:
            await c.append(name, 41, b"late")
        assert (e.value.presented, e.value.highest) == (41, 42)
        with pytest.raises(MismatchError) as m:
            await c.append_at(name, 42, 9, b"x")
        assert (m.value.expected, m.value.next) == (9, 3)
        assert await c.trim(name, 42, 1) == 1
        with pytest.raises(TrimmedError) as t:
            await c.read(name, 0)
        assert (t.value.requested, t.value.start) == (0, 1)
        assert await c.fence(name, 43) == 43
        assert await c.delete(name, 43) == 2
        g = await c.acquire(name + "-l", "worker-a", 10_000)
        with pytest.raises(HeldError):
            await c.acquire(name + "-l", "worker-b", 10_000)
        info = await c.lease_info(name + "-l")
        assert info is not None and info.token == g.token
        assert await c.renew(name + "-l", "worker-a", g.token, 10_000) == 10_000
        with pytest.raises(LostError):
            await c.renew(name + "-l", "worker-a", g.token + 1, 10_000)
        assert await c.release(name + "-l", "worker-a", g.token) is True
        await c.close()

    asyncio.run(main())


def test_tail(server: Server, name: str) -> None:
    async def main() -> None:
        reader = AsyncClient("127.0.0.1", server.port)
        writer = AsyncClient("127.0.0.1", server.port)
        stop = asyncio.Event()
        seen = []

        async def follow() -> None:
            async for rec in reader.tail(name, 0, block_ms=200, stop=stop):
                seen.append(rec.payload)
                if len(seen) == 3:
                    stop.set()

        task = asyncio.ensure_future(follow())
        for i in range(3):
            await writer.append(name, 1, b"r%d" % i)
        await asyncio.wait_for(task, 10)
        assert seen == [b"r0", b"r1", b"r2"]
        await reader.close()
        await writer.close()

    asyncio.run(main())


def test_keeper_holds_the_lease_across_several_ttls(server: Server, name: str) -> None:
    async def main() -> None:
        c = AsyncClient("127.0.0.1", server.port)
        async with c.lease(name, ttl=0.5) as lease:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lease.lost.wait(), 2.0)
            assert await lease.guard(asyncio.sleep(0.01, "done")) == "done"
            info = await c.lease_info(name)
            assert info is not None and info.token == lease.token
            assert await lease.append(name, b"kept") == 0
        assert lease.lost.is_set() and lease.lost_reason == "released"
        assert await c.lease_info(name) is None
        with pytest.raises(LostError):
            await lease.append(name, b"after release")
        await c.close()

    asyncio.run(main())


def test_loss_is_signalled_when_the_server_stops_answering(own_server: Server, name: str) -> None:
    async def main() -> None:
        c = AsyncClient("127.0.0.1", own_server.port)
        ttl = 1.0
        lease = await c.lease(name, ttl=ttl).acquire()
        assert await lease.append(name, b"before") == 0
        own_server.pause()
        paused = time.monotonic()
        try:
            # The work in progress is cancelled when the loss is signalled.
            with pytest.raises(LostError):
                await lease.guard(asyncio.sleep(30))
            assert lease.lost.is_set()
            assert time.monotonic() - paused <= ttl + 1.0
            assert lease.lost_at is not None and lease.lost_at - paused <= ttl + 0.5
            with pytest.raises(LostError):
                await lease.append(name, b"after loss")
        finally:
            own_server.resume()
        await lease.release()
        assert await c.read(name, 0) == [Record(0, lease.token, b"before")]
        await c.close()

    asyncio.run(main())


def test_append_with_a_lost_reply_lands_exactly_once(
    server: Server, proxy: Proxy, name: str
) -> None:
    async def main() -> None:
        c = AsyncClient("127.0.0.1", proxy.port)
        async with c.lease(name, ttl=10) as lease:
            assert await lease.append(name, b"first") == 0
            proxy.arm(b"LOG.APPENDAT", "reply")
            assert await lease.append(name, b"second") == 1
            assert proxy.fired.is_set()
        direct = AsyncClient("127.0.0.1", server.port)
        assert [r.payload for r in await direct.read(name, 0)] == [b"first", b"second"]
        await direct.close()
        await c.close()

    asyncio.run(main())


def test_idle_connections_survive_a_server_restart(own_server: Server, name: str) -> None:
    async def main() -> None:
        c = AsyncClient("127.0.0.1", own_server.port)
        assert await c.append(name, 3, b"before") == 0
        # The loop runs meanwhile, as in an application, so it sees the
        # idle connection's end (a loop blocked throughout could not).
        await asyncio.get_running_loop().run_in_executor(None, own_server.restart)
        assert await c.append(name, 3, b"after") == 1
        assert [r.payload for r in await c.read(name, 0)] == [b"before", b"after"]
        await c.close()

    asyncio.run(main())
