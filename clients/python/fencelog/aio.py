"""The asyncio client: :class:`AsyncClient` and its :class:`AsyncLease`.

The same commands, routing and lease rules as :mod:`fencelog.client`, with
``await``: the keeper is a task and ``lost`` an :class:`asyncio.Event`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, Sequence, Tuple, TypeVar

from redis import exceptions as rex
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import _proto as P
from .errors import (
    FencelogConnectionError,
    FencelogError,
    LostError,
    StaleError,
    UncertainError,
)
from ._proto import Addr, Grant, LeaseInfo, Payload, Record, Stat

_DEFAULT: Any = object()
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


class AsyncClient:
    """The asyncio form of :class:`fencelog.Client`: same arguments, same
    commands (each a coroutine), same cluster routing and typed errors.
    Use it from one event loop."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7379,
        password: Optional[str] = None,
        cluster: bool = False,
        *,
        nodes: Optional[Sequence[Addr]] = None,
        socket_timeout: Optional[float] = 10.0,
        connect_timeout: Optional[float] = 2.0,
        protocol: int = 2,
        max_tries: int = 32,
        max_wait: float = 10.0,
    ) -> None:
        self.cluster = cluster
        self.socket_timeout = socket_timeout
        self.max_tries = max_tries
        self.max_wait = max_wait
        self._kwargs: Dict[str, Any] = {
            "password": password,
            "socket_connect_timeout": connect_timeout,
            "protocol": protocol,
        }
        self._nodes: Dict[Addr, _Node] = {}
        self._order: List[Addr] = P.seeds(host, port, nodes)
        self._current: Addr = self._order[0]
        self._cursor = 0

    @property
    def current_node(self) -> Addr:
        """The node commands go to now (cluster mode: the leader, as far as
        the client knows)."""
        return self._current

    def _node(self, addr: Addr) -> _Node:
        node = self._nodes.get(addr)
        if node is None:
            node = self._nodes[addr] = _Node(addr, self._kwargs)
            if addr not in self._order:
                self._order.append(addr)
        return node

    def _rotate(self, failed: Addr) -> None:
        # A cursor over every known node, so that followers naming a dead
        # leader in -MOVED cannot keep the client off the other nodes.
        if self._current != failed:
            return
        for _ in range(len(self._order)):
            self._cursor += 1
            candidate = self._order[self._cursor % len(self._order)]
            if candidate != failed:
                self._current = candidate
                return

    async def execute(
        self,
        *args: Any,
        timeout: Any = _DEFAULT,
        read_only: bool = False,
        deadline: Optional[float] = None,
    ) -> Any:
        """Sends one command and answers its raw reply; see
        :meth:`fencelog.Client.execute`."""
        t = self.socket_timeout if timeout is _DEFAULT else timeout
        backoff = P.Backoff(self.max_tries, self.max_wait, deadline=deadline)
        while True:
            addr = self._current
            node = self._node(addr)
            try:
                conn = await node.checkout(t)
            except rex.AuthenticationError as e:
                raise P.translate(e) from e
            except (rex.ConnectionError, rex.TimeoutError) as e:
                if not self.cluster:
                    raise P.translate(e) from e
                self._rotate(addr)
                await asyncio.sleep(backoff.next_delay(e))
                continue
            try:
                await conn.send_command(*args)
                reply = await conn.read_response()
            except (rex.ConnectionError, rex.TimeoutError) as e:
                await conn.disconnect()
                if not (self.cluster and read_only):
                    raise P.translate(e) from e
                self._rotate(addr)
                await asyncio.sleep(backoff.next_delay(e))
                continue
            except rex.ResponseError as e:
                node.checkin(conn, t)
                kind, target = P.redirect(e) if self.cluster else ("", None)
                if kind == "MOVED" and target is not None:
                    self._node(target)
                    self._current = target
                    backoff.next_delay(e, sleep=False)
                    continue
                if kind:
                    await asyncio.sleep(backoff.next_delay(e))
                    continue
                raise P.translate(e) from e
            except BaseException:
                await conn.disconnect()
                raise
            node.checkin(conn, t)
            return reply

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


class AsyncLease:
    """The asyncio form of :class:`fencelog.Lease`: a keeper task renews
    every third of the ttl; ``lost`` is an :class:`asyncio.Event` set once
    the lease is released, refused (``LOST``) or not confirmed by ``sent +
    ttl - margin`` of its last confirmed renewal."""

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        ttl: float,
        wait: Optional[float],
        fence: bool,
        owner: Optional[str],
        margin: Optional[float],
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.client = client
        self.name = name
        self.ttl = float(ttl)
        self.wait = wait
        self.fence_on_acquire = fence
        self.owner = owner or P.default_owner()
        self.margin = P.default_margin(self.ttl) if margin is None else float(margin)
        if not 0 <= self.margin < self.ttl * 2 / 3:
            raise ValueError("margin must be at least 0 and below two thirds of the ttl")
        self.token: int = 0
        self.lost = asyncio.Event()
        self.lost_reason: Optional[str] = None
        self.lost_at: Optional[float] = None
        self._valid_until = 0.0
        self._last_sent = 0.0
        self._stop = asyncio.Event()
        self._tasks: List["asyncio.Task[None]"] = []

    async def acquire(self) -> "AsyncLease":
        """Acquires the lease and starts the keeper (``async with`` does
        this)."""
        ttl_ms = max(10, int(self.ttl * 1000))
        wait_ms = None if self.wait is None else int(self.wait * 1000)
        sent = time.monotonic()
        grant = await self.client.acquire(
            self.name, self.owner, ttl_ms, self.fence_on_acquire, wait_ms
        )
        self.token = grant.token
        self._valid_until = sent + grant.ttl_ms / 1000.0 - self.margin
        self._last_sent = sent
        self._tasks = [asyncio.ensure_future(self._keep()), asyncio.ensure_future(self._watch())]
        return self

    async def release(self) -> None:
        """Stops the keeper, releases the lease and sets ``lost``."""
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self.lost.is_set():
            try:
                await self.client.release(self.name, self.owner, self.token)
            except FencelogError:
                pass  # it expires by itself
        self._mark_lost("released")

    async def __aenter__(self) -> "AsyncLease":
        return await self.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost_at = time.monotonic()
        self.lost.set()
        self._stop.set()

    def remaining(self) -> float:
        """Seconds the client may still count on the lease (0 once lost)."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._valid_until - time.monotonic())

    def check(self) -> None:
        """Raises :class:`LostError` if the lease is lost or its confirmed
        time has run out (then ``lost`` is set first)."""
        if not self.lost.is_set() and time.monotonic() >= self._valid_until:
            self._mark_lost("not renewed in time")
        if self.lost.is_set():
            raise LostError(f"lease {self.name!r} token {self.token} is lost: {self.lost_reason}")

    async def _keep(self) -> None:
        period = self.ttl / 3.0
        retry = min(period / 3.0, 0.2)
        ttl_ms = max(10, int(self.ttl * 1000))
        next_at = self._last_sent + period
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))
                return
            except asyncio.TimeoutError:
                pass
            sent = time.monotonic()
            if sent >= self._valid_until:
                # Never renew what the client already counts as lost.
                self._mark_lost("not renewed in time")
                return
            try:
                granted = await self.client.renew(
                    self.name, self.owner, self.token, ttl_ms,
                    timeout=period, deadline=self._valid_until,
                )
            except LostError:
                self._mark_lost("LOST: the server no longer holds it for this owner and token")
                return
            except FencelogError:
                next_at = time.monotonic() + retry
                continue
            if self.lost.is_set():
                return
            self._valid_until = max(self._valid_until, sent + granted / 1000.0 - self.margin)
            next_at = sent + period

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
        self.check()
        expected = (await self.client.stat(stream)).next_offset
        self.check()
        try:
            return await self._append_at(stream, expected, payloads)
        except (FencelogConnectionError, UncertainError) as first:
            try:
                self.check()
            except LostError as lost:
                raise LostError(
                    f"{lost}; the append to {stream!r} at offset {expected} was sent, "
                    "its reply lost: read the stream to learn whether it landed"
                ) from first
            try:
                return await self._append_at(stream, expected, payloads)
            except (FencelogConnectionError, UncertainError) as second:
                raise UncertainError(
                    f"append to {stream!r} at offset {expected}: the reply was lost twice; "
                    f"read the stream to learn whether it landed ({second})"
                ) from first

    async def _append_at(
        self, stream: Payload, expected: int, payloads: Tuple[Payload, ...]
    ) -> int:
        try:
            return await self.client.append_at(stream, self.token, expected, *payloads)
        except StaleError:
            self._mark_lost("STALE: a newer token was accepted")
            raise

    async def fence(self, stream: Payload) -> int:
        """``LOG.FENCE`` of ``stream`` at this lease's token (refused locally
        once lost)."""
        self.check()
        try:
            return await self.client.fence(stream, self.token)
        except StaleError:
            self._mark_lost("STALE: a newer token was accepted")
            raise
