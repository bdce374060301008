"""The synchronous client: :class:`Client` and its :class:`Lease`."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from redis import exceptions as rex
from redis.backoff import NoBackoff
from redis.connection import Connection
from redis.retry import Retry

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


class _Node:
    """Idle connections to one server, by socket timeout. Thread-safe."""

    def __init__(self, addr: Addr, kwargs: Dict[str, Any]) -> None:
        self.addr = addr
        self._kwargs = kwargs
        self._idle: Dict[Optional[float], List[Connection]] = {}
        self._lock = threading.Lock()

    def checkout(self, timeout: Optional[float]) -> Connection:
        with self._lock:
            idle = self._idle.get(timeout)
            conn = idle.pop() if idle else None
        if conn is not None:
            # An idle connection the server closed meanwhile (a restart)
            # reads as ready: take a new one rather than send into it.
            try:
                if not conn.can_read(0):
                    return conn
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                pass
            conn.disconnect()
        conn = Connection(
            host=self.addr[0],
            port=self.addr[1],
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            **self._kwargs,
        )
        conn.connect()
        return conn

    def checkin(self, conn: Connection, timeout: Optional[float]) -> None:
        with self._lock:
            self._idle.setdefault(timeout, []).append(conn)

    def close(self) -> None:
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.disconnect()


class Client:
    """A fencelog client on redis-py (synchronous, thread-safe).

    ``Client(host, port)`` talks to one server. With ``cluster=True`` it
    talks to a fencelog cluster through any of its nodes (``host:port`` and
    the optional ``nodes``): one Raft group owns every slot, so the client
    keeps one current node, the leader; it follows ``-MOVED slot host:port``
    there, and retries ``-TRYAGAIN`` / ``-CLUSTERDOWN`` and unreachable nodes
    with capped exponential backoff, at most ``max_tries`` times and
    ``max_wait`` seconds. A request whose reply was lost is never resent by
    the client, except reads (in cluster mode); :meth:`Lease.append` retries
    an append exactly once, through ``LOG.APPENDAT``.

    Commands mirror the wire protocol (``docs/COMMANDS.md``): times in
    milliseconds; errors raise the typed exceptions of :mod:`fencelog.errors`.
    """

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
        self._lock = threading.Lock()
        self._nodes: Dict[Addr, _Node] = {}
        self._order: List[Addr] = P.seeds(host, port, nodes)
        self._current: Addr = self._order[0]
        self._cursor = 0

    # -- plumbing -----------------------------------------------------------

    @property
    def current_node(self) -> Addr:
        """The node commands go to now (in cluster mode: the leader, as far
        as the client knows)."""
        return self._current

    def _node(self, addr: Addr) -> _Node:
        with self._lock:
            node = self._nodes.get(addr)
            if node is None:
                node = self._nodes[addr] = _Node(addr, self._kwargs)
                if addr not in self._order:
                    self._order.append(addr)
            return node

    def _rotate(self, failed: Addr) -> None:
        # A cursor over every known node, so that followers naming a dead
        # leader in -MOVED cannot keep the client off the other nodes.
        with self._lock:
            if self._current != failed:
                return
            for _ in range(len(self._order)):
                self._cursor += 1
                candidate = self._order[self._cursor % len(self._order)]
                if candidate != failed:
                    self._current = candidate
                    return

    def execute(
        self,
        *args: Any,
        timeout: Any = _DEFAULT,
        read_only: bool = False,
        deadline: Optional[float] = None,
    ) -> Any:
        """Sends one command and answers its raw reply (cluster routing and
        error translation included). ``read_only`` commands are retried in
        cluster mode when their reply is lost; ``deadline`` (monotonic) bounds
        the cluster retries."""
        t = self.socket_timeout if timeout is _DEFAULT else timeout
        backoff = P.Backoff(self.max_tries, self.max_wait, deadline=deadline)
        while True:
            addr = self._current
            node = self._node(addr)
            try:
                conn = node.checkout(t)
            except rex.AuthenticationError as e:
                raise P.translate(e) from e
            except (rex.ConnectionError, rex.TimeoutError) as e:
                # Nothing was sent: another node (or this one later) is safe.
                if not self.cluster:
                    raise P.translate(e) from e
                self._rotate(addr)
                time.sleep(backoff.next_delay(e))
                continue
            try:
                conn.send_command(*args)
                reply = conn.read_response()
            except (rex.ConnectionError, rex.TimeoutError) as e:
                conn.disconnect()
                if not (self.cluster and read_only):
                    raise P.translate(e) from e
                self._rotate(addr)
                time.sleep(backoff.next_delay(e))
                continue
            except rex.ResponseError as e:
                node.checkin(conn, t)
                kind, target = P.redirect(e) if self.cluster else ("", None)
                if kind == "MOVED" and target is not None:
                    self._node(target)
                    with self._lock:
                        self._current = target
                    backoff.next_delay(e, sleep=False)
                    continue
                if kind:
                    time.sleep(backoff.next_delay(e))
                    continue
                raise P.translate(e) from e
            except BaseException:
                conn.disconnect()
                raise
            node.checkin(conn, t)
            return reply

    def close(self) -> None:
        """Closes every idle connection."""
        with self._lock:
            nodes = list(self._nodes.values())
        for n in nodes:
            n.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- streams ------------------------------------------------------------

    def append(self, stream: Payload, token: int, *payloads: Payload) -> int:
        """``LOG.APPEND``: the payloads as consecutive records; answers the
        first offset. Not idempotent: never resent after a lost reply."""
        return int(self.execute("LOG.APPEND", stream, int(token), *payloads))

    def append_at(
        self, stream: Payload, token: int, expected_offset: int, *payloads: Payload
    ) -> int:
        """``LOG.APPENDAT``: as :meth:`append` if ``expected_offset`` is the
        next offset (else :class:`MismatchError`); an exact retry of one that
        succeeded answers the original offset and writes nothing."""
        return int(
            self.execute("LOG.APPENDAT", stream, int(token), int(expected_offset), *payloads)
        )

    def fence(self, stream: Payload, token: int) -> int:
        """``LOG.FENCE``: raises the stream's highest token; answers it."""
        return int(self.execute("LOG.FENCE", stream, int(token)))

    def read(
        self,
        stream: Payload,
        start: int = 0,
        count: Optional[int] = None,
        block_ms: Optional[int] = None,
    ) -> List[Record]:
        """``LOG.READ``: durable records from ``start`` on (at most ``count``,
        server default 100). At the end of the stream, ``block_ms`` waits up
        to that long for a record (0: without limit)."""
        reply = self.execute(
            *P.read_args(stream, start, count, block_ms),
            timeout=P.call_timeout(self.socket_timeout, block_ms),
            read_only=True,
        )
        return P.parse_records(reply)

    def tail(
        self,
        stream: Payload,
        start: int = 0,
        count: int = 100,
        block_ms: int = 1000,
        stop: Optional[threading.Event] = None,
    ) -> Iterator[Record]:
        """Every record from ``start`` on, then each new one as it lands
        (``LOG.READ … BLOCK``), until ``stop`` is set (checked at least every
        ``block_ms``) or the caller stops iterating."""
        offset = start
        while stop is None or not stop.is_set():
            records = self.read(stream, offset, count=count, block_ms=block_ms)
            for r in records:
                yield r
                offset = r.offset + 1

    def trim(self, stream: Payload, token: int, before: int) -> int:
        """``LOG.TRIM``: records below ``before`` become unreadable; answers
        the new start offset."""
        return int(self.execute("LOG.TRIM", stream, int(token), int(before)))

    def delete(self, stream: Payload, token: int) -> int:
        """``LOG.DELETE``: removes every record (token and offsets survive);
        answers the records removed."""
        return int(self.execute("LOG.DELETE", stream, int(token)))

    def stat(self, stream: Payload) -> Stat:
        """``LOG.STAT``: highest token, next offset, start offset, records,
        bytes."""
        return P.parse_stat(self.execute("LOG.STAT", stream, read_only=True))

    # -- leases -------------------------------------------------------------

    def acquire(
        self,
        name: Payload,
        owner: str,
        ttl_ms: int,
        fence: bool = False,
        wait_ms: Optional[int] = None,
    ) -> Grant:
        """``LEASE.ACQUIRE``: a fresh token if no live lease holds ``name``
        (else :class:`HeldError`, or with ``wait_ms`` wait that long).
        ``fence`` fences the stream ``name`` at the token."""
        reply = self.execute(
            *P.acquire_args(name, owner, ttl_ms, fence, wait_ms),
            timeout=P.call_timeout(self.socket_timeout, wait_ms),
        )
        return Grant(int(reply[0]), int(reply[1]))

    def renew(
        self,
        name: Payload,
        owner: str,
        token: int,
        ttl_ms: int,
        *,
        timeout: Any = _DEFAULT,
        deadline: Optional[float] = None,
    ) -> int:
        """``LEASE.RENEW``: extends the live lease of this owner and token to
        ``ttl_ms`` from now (else :class:`LostError`); answers the ttl."""
        return int(
            self.execute(
                "LEASE.RENEW", name, owner, int(token), int(ttl_ms),
                timeout=timeout, deadline=deadline,
            )
        )

    def release(self, name: Payload, owner: str, token: int) -> bool:
        """``LEASE.RELEASE``: whether this owner and token held it."""
        return int(self.execute("LEASE.RELEASE", name, owner, int(token))) == 1

    def lease_info(self, name: Payload) -> Optional[LeaseInfo]:
        """``LEASE.INFO``: the live lease's owner, token and remaining ms, or
        None."""
        return P.parse_lease_info(self.execute("LEASE.INFO", name, read_only=True))

    def lease(
        self,
        name: str,
        ttl: float = 10.0,
        wait: Optional[float] = None,
        fence: bool = True,
        *,
        owner: Optional[str] = None,
        margin: Optional[float] = None,
    ) -> "Lease":
        """A lease on ``name`` as a context manager::

            with client.lease("jobs", ttl=10) as lease:
                lease.append("jobs", b"step")

        Acquired on entry (``wait`` seconds at most if it is held; ``fence``
        fences the stream ``name`` at the new token), kept alive by a keeper
        thread, released on exit. See :class:`Lease`."""
        return Lease(self, name, ttl, wait, fence, owner, margin)


class Lease:
    """A held lease: its ``token``, a keeper thread that renews it every
    third of the ttl, and ``lost``, a :class:`threading.Event` set once the
    lease is released, refused (``LOST``), or not confirmed in time.

    "In time": each renewal counts from the moment its request was *sent*
    (the client's monotonic clock), so the server's lease cannot outlive the
    client's belief: the lease is taken as lost at ``sent + ttl - margin``
    unless a later renewal was confirmed before then. :meth:`append` refuses
    locally (:class:`LostError`) once that moment has passed, even if no
    thread has run since (a process pause).
    """

    def __init__(
        self,
        client: Client,
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
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None
        self.lost_at: Optional[float] = None
        self._valid_until = 0.0
        self._last_sent = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []

    # -- life ---------------------------------------------------------------

    def acquire(self) -> "Lease":
        """Acquires the lease and starts the keeper (``with`` does this)."""
        ttl_ms = max(10, int(self.ttl * 1000))
        wait_ms = None if self.wait is None else int(self.wait * 1000)
        sent = time.monotonic()
        grant = self.client.acquire(self.name, self.owner, ttl_ms, self.fence_on_acquire, wait_ms)
        self.token = grant.token
        self._valid_until = sent + grant.ttl_ms / 1000.0 - self.margin
        self._last_sent = sent
        for target in (self._keep, self._watch):
            t = threading.Thread(target=target, name=f"fencelog-lease-{self.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def release(self) -> None:
        """Stops the keeper, releases the lease and sets ``lost``."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.ttl)
        if not self.lost.is_set():
            try:
                self.client.release(self.name, self.owner, self.token)
            except FencelogError:
                pass  # it expires by itself
        self._mark_lost("released")

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- state --------------------------------------------------------------

    def _mark_lost(self, reason: str) -> None:
        with self._lock:
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

    # -- keeper -------------------------------------------------------------

    def _keep(self) -> None:
        period = self.ttl / 3.0
        retry = min(period / 3.0, 0.2)
        ttl_ms = max(10, int(self.ttl * 1000))
        next_at = self._last_sent + period
        while not self._stop.wait(timeout=max(0.0, next_at - time.monotonic())):
            sent = time.monotonic()
            if sent >= self._valid_until:
                # Never renew what the client already counts as lost (a
                # process pause can wake the keeper past the deadline).
                self._mark_lost("not renewed in time")
                return
            try:
                granted = self.client.renew(
                    self.name, self.owner, self.token, ttl_ms,
                    timeout=period, deadline=self._valid_until,
                )
            except LostError:
                self._mark_lost("LOST: the server no longer holds it for this owner and token")
                return
            except FencelogError:
                next_at = time.monotonic() + retry  # the watchdog decides when it is lost
                continue
            with self._lock:
                if self.lost.is_set():
                    return
                self._valid_until = max(self._valid_until, sent + granted / 1000.0 - self.margin)
            next_at = sent + period

    def _watch(self) -> None:
        while not self._stop.wait(timeout=max(0.0, self._valid_until - time.monotonic())):
            if time.monotonic() >= self._valid_until:
                self._mark_lost("not renewed in time")
                return

    # -- writes -------------------------------------------------------------

    def append(self, stream: Payload, *payloads: Payload) -> int:
        """Appends with this lease's token; answers the first offset.

        Reads the stream's next offset (``LOG.STAT``), then appends there
        with ``LOG.APPENDAT``; if the reply is lost (connection error,
        timeout, ``UNCERTAIN``) the same ``LOG.APPENDAT`` is sent once more,
        which answers the original offset if the first one landed. Refused
        locally with :class:`LostError` once ``lost`` is set; a ``STALE``
        answer sets ``lost`` and raises :class:`StaleError`. One append at
        a time per stream (concurrent ones would race for the offset and
        answer ``MISMATCH``)."""
        self.check()
        expected = self.client.stat(stream).next_offset
        self.check()
        try:
            return self._append_at(stream, expected, payloads)
        except (FencelogConnectionError, UncertainError) as first:
            try:
                self.check()
            except LostError as lost:
                raise LostError(
                    f"{lost}; the append to {stream!r} at offset {expected} was sent, "
                    "its reply lost: read the stream to learn whether it landed"
                ) from first
            try:
                return self._append_at(stream, expected, payloads)
            except (FencelogConnectionError, UncertainError) as second:
                raise UncertainError(
                    f"append to {stream!r} at offset {expected}: the reply was lost twice; "
                    f"read the stream to learn whether it landed ({second})"
                ) from first

    def _append_at(self, stream: Payload, expected: int, payloads: Tuple[Payload, ...]) -> int:
        try:
            return self.client.append_at(stream, self.token, expected, *payloads)
        except StaleError:
            self._mark_lost("STALE: a newer token was accepted")
            raise

    def fence(self, stream: Payload) -> int:
        """``LOG.FENCE`` of ``stream`` at this lease's token (refused locally
        once lost)."""
        self.check()
        try:
            return self.client.fence(stream, self.token)
        except StaleError:
            self._mark_lost("STALE: a newer token was accepted")
            raise
