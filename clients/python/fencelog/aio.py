"""The asyncio client: :class:`AsyncClient` and its :class:`AsyncLease`.

The same commands, routing and lease rules as :mod:`fencelog.client`, with
``await``: the keeper is a task and ``lost`` an :class:`asyncio.Event`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, TypeVar

from redis import exceptions as rex
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import _proto as P
from ._core import DEFAULT as _DEFAULT
from ._core import ClientCore, LeaseCore, run_async
from .errors import LostError
from ._proto import Addr, Grant, LeaseInfo, Payload, Record, Stat

T = TypeVar("T")


class _Node:
    """Idle connections to one server, by socket timeout."""

    def __init__(self, addr: Addr, kwargs: Dict[str, Any]) -> None:
        self.addr = addr
        self._kwargs = kwargs
        self._idle: Dict[Optional[float], List[Connection]] = {}

    async def checkout(self, timeout: Optional[float]) -> Connection:
        idle = self._idle.get(timeout)
        if idle:
            conn = idle.pop()
            # An idle connection the server closed meanwhile (a restart)
            # reads as ready: take a new one rather than send into it.
            ready = getattr(conn, "can_read", None) or conn.can_read_destructive  # redis-py 5: the latter
            try:
                if not await ready():
                    return conn
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                pass
            await conn.disconnect()
        conn = Connection(
            host=self.addr[0],
            port=self.addr[1],
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            **self._kwargs,
        )
        await conn.connect()
        return conn

    def checkin(self, conn: Connection, timeout: Optional[float]) -> None:
        self._idle.setdefault(timeout, []).append(conn)

    async def close(self) -> None:
        conns = [c for idle in self._idle.values() for c in idle]
        self._idle.clear()
        for c in conns:
            await c.disconnect()


class AsyncClient(ClientCore):
    """The asyncio form of :class:`fencelog.Client`: same arguments, same
    commands (each a coroutine), same cluster routing and typed errors.
    Use it from one event loop."""

    _node_type = _Node
    _sleep = staticmethod(asyncio.sleep)
    _new_lock = staticmethod(contextlib.nullcontext)

    async def execute(
        self,
        *args: Any,
        timeout: Any = _DEFAULT,
        read_only: bool = False,
        deadline: Optional[float] = None,
    ) -> Any:
        """Sends one command and answers its raw reply; see
        :meth:`fencelog.Client.execute`."""
        return await run_async(self._execute_steps(args, timeout, read_only, deadline))

    async def close(self) -> None:
        """Closes every idle connection."""
        for n in list(self._nodes.values()):
            await n.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- streams ------------------------------------------------------------

    async def append(self, stream: Payload, token: int, *payloads: Payload) -> int:
        """``LOG.APPEND``; see :meth:`fencelog.Client.append`."""
        return int(await self.execute("LOG.APPEND", stream, int(token), *payloads))

    async def append_at(
        self, stream: Payload, token: int, expected_offset: int, *payloads: Payload
    ) -> int:
        """``LOG.APPENDAT``; see :meth:`fencelog.Client.append_at`."""
        return int(
            await self.execute(
                "LOG.APPENDAT", stream, int(token), int(expected_offset), *payloads
            )
        )

    async def fence(self, stream: Payload, token: int) -> int:
        """``LOG.FENCE``: answers the highest token."""
        return int(await self.execute("LOG.FENCE", stream, int(token)))

    async def read(
        self,
        stream: Payload,
        start: int = 0,
        count: Optional[int] = None,
        block_ms: Optional[int] = None,
    ) -> List[Record]:
        """``LOG.READ``; see :meth:`fencelog.Client.read`."""
        reply = await self.execute(
            *P.read_args(stream, start, count, block_ms),
            timeout=P.call_timeout(self.socket_timeout, block_ms),
            read_only=True,
        )
        return P.parse_records(reply)

    async def tail(
        self,
        stream: Payload,
        start: int = 0,
        count: int = 100,
        block_ms: int = 1000,
        stop: Optional[asyncio.Event] = None,
    ) -> AsyncIterator[Record]:
        """Every record from ``start`` on, then each new one as it lands,
        until ``stop`` is set (checked at least every ``block_ms``) or the
        caller stops iterating."""
        offset = start
        while stop is None or not stop.is_set():
            for r in await self.read(stream, offset, count=count, block_ms=block_ms):
                yield r
                offset = r.offset + 1

    async def trim(self, stream: Payload, token: int, before: int) -> int:
        """``LOG.TRIM``: answers the new start offset."""
        return int(await self.execute("LOG.TRIM", stream, int(token), int(before)))

    async def delete(self, stream: Payload, token: int) -> int:
        """``LOG.DELETE``: answers the records removed."""
        return int(await self.execute("LOG.DELETE", stream, int(token)))

    async def stat(self, stream: Payload) -> Stat:
        """``LOG.STAT``."""
        return P.parse_stat(await self.execute("LOG.STAT", stream, read_only=True))

    # -- leases -------------------------------------------------------------

    async def acquire(
        self,
        name: Payload,
        owner: str,
        ttl_ms: int,
        fence: bool = False,
        wait_ms: Optional[int] = None,
    ) -> Grant:
        """``LEASE.ACQUIRE``; see :meth:`fencelog.Client.acquire`."""
        reply = await self.execute(
            *P.acquire_args(name, owner, ttl_ms, fence, wait_ms),
            timeout=P.call_timeout(self.socket_timeout, wait_ms),
        )
        return Grant(int(reply[0]), int(reply[1]))

    async def renew(
        self,
        name: Payload,
        owner: str,
        token: int,
        ttl_ms: int,
        *,
        timeout: Any = _DEFAULT,
        deadline: Optional[float] = None,
    ) -> int:
        """``LEASE.RENEW``: answers the ttl; :class:`LostError` if not held."""
        return int(
            await self.execute(
                "LEASE.RENEW", name, owner, int(token), int(ttl_ms),
                timeout=timeout, deadline=deadline,
            )
        )

    async def release(self, name: Payload, owner: str, token: int) -> bool:
        """``LEASE.RELEASE``: whether this owner and token held it."""
        return int(await self.execute("LEASE.RELEASE", name, owner, int(token))) == 1

    async def lease_info(self, name: Payload) -> Optional[LeaseInfo]:
        """``LEASE.INFO``: owner, token, remaining ms, or None."""
        return P.parse_lease_info(await self.execute("LEASE.INFO", name, read_only=True))

    def lease(
        self,
        name: str,
        ttl: float = 10.0,
        wait: Optional[float] = None,
        fence: bool = True,
        *,
        owner: Optional[str] = None,
        margin: Optional[float] = None,
    ) -> "AsyncLease":
        """A lease as an async context manager::

            async with client.lease("jobs", ttl=10) as lease:
                await lease.append("jobs", b"step")

        See :class:`AsyncLease`."""
        return AsyncLease(self, name, ttl, wait, fence, owner, margin)


class AsyncLease(LeaseCore):
    """The asyncio form of :class:`fencelog.Lease`: a keeper task renews
    every third of the ttl; ``lost`` is an :class:`asyncio.Event` set once
    the lease is released, refused (``LOST``) or not confirmed by ``sent +
    ttl - margin`` of its last confirmed renewal."""

    _new_event = staticmethod(asyncio.Event)
    _new_lock = staticmethod(contextlib.nullcontext)
    client: AsyncClient

    async def acquire(self) -> "AsyncLease":
        """Acquires the lease and starts the keeper (``async with`` does
        this)."""
        await run_async(self._acquire_steps())
        self._workers = [asyncio.ensure_future(self._keep()), asyncio.ensure_future(self._watch())]
        return self

    async def release(self) -> None:
        """Stops the keeper, releases the lease and sets ``lost``."""
        self._stop.set()
        for t in self._workers:
            t.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await run_async(self._release_steps())

    async def __aenter__(self) -> "AsyncLease":
        return await self.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    async def _keep(self) -> None:
        period = self.ttl / 3.0
        retry = min(period / 3.0, 0.2)
        next_at: Optional[float] = self._last_sent + period
        while next_at is not None and not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))
                return
            except asyncio.TimeoutError:
                pass
            next_at = await run_async(self._renew_steps(period, retry))

    async def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(
                    self._stop.wait(), max(0.0, self._valid_until - time.monotonic())
                )
                return
            except asyncio.TimeoutError:
                pass
            if time.monotonic() >= self._valid_until:
                self._mark_lost("not renewed in time")
                return

    async def guard(self, aw: Awaitable[T]) -> T:
        """Runs ``aw`` as the lease's work: answers its result, or, if the
        lease is lost first, cancels it and raises :class:`LostError` (loss
        as a cancellation of the work in progress)::

            async with client.lease("jobs", ttl=10) as lease:
                await lease.guard(process_jobs(lease))
        """
        self.check()
        work = asyncio.ensure_future(aw)
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            work.cancel()
            raise
        finally:
            lost.cancel()
        if work.done():
            return work.result()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise LostError(
            f"lease {self.name!r} token {self.token} is lost: {self.lost_reason}; its work was cancelled"
        )

    async def append(self, stream: Payload, *payloads: Payload) -> int:
        """Appends with this lease's token, retried exactly once through
        ``LOG.APPENDAT`` if the reply is lost; see
        :meth:`fencelog.Lease.append`. One append at a time per stream."""
        return await run_async(self._append_steps(stream, payloads))

    async def fence(self, stream: Payload) -> int:
        """``LOG.FENCE`` of ``stream`` at this lease's token (refused locally
        once lost)."""
        return await run_async(self._fence_steps(stream))
