"""The synchronous client: :class:`Client` and its :class:`Lease`."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, List, Optional

from redis import exceptions as rex
from redis.backoff import NoBackoff
from redis.connection import Connection
from redis.retry import Retry

from . import _proto as P
from ._core import DEFAULT as _DEFAULT
from ._core import ClientCore, LeaseCore, run
from ._proto import Addr, Grant, LeaseInfo, Payload, Record, Stat


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


class Client(ClientCore):
    """A fencelog client on redis-py (synchronous, thread-safe).

    ``Client(host, port)`` talks to one server. With ``cluster=True`` it
    talks to a fencelog cluster through any of its nodes (``host:port`` and
    the optional ``nodes``): one Raft group owns every slot, so the client
    keeps one current node, the leader; it follows ``-MOVED slot host:port``
    there, and retries ``-TRYAGAIN`` / ``-CLUSTERDOWN`` and unreachable nodes
    with capped exponential backoff, at most ``max_tries`` times and
    ``max_wait`` seconds. A request whose reply was lost is never resent by
    the client, except reads and ``LEASE.ACQUIRE`` (in cluster mode; an
    acquire by the owner that holds the lease answers its token again, and
    an acquire that met ``UNCERTAIN`` is resent too); :meth:`Lease.append` retries
    an append exactly once, through ``LOG.APPENDAT``.

    Commands mirror the wire protocol (``docs/COMMANDS.md``): times in
    milliseconds; errors raise the typed exceptions of :mod:`fencelog.errors`.
    """

    _node_type = _Node
    _sleep = staticmethod(time.sleep)
    _new_lock = staticmethod(threading.Lock)

    # -- plumbing -----------------------------------------------------------

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
        return run(self._execute_steps(args, timeout, read_only, deadline))

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


class Lease(LeaseCore):
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

    _new_event = staticmethod(threading.Event)
    _new_lock = staticmethod(threading.Lock)
    client: Client

    # -- life ---------------------------------------------------------------

    def acquire(self) -> "Lease":
        """Acquires the lease and starts the keeper (``with`` does this)."""
        run(self._acquire_steps())
        for target in (self._keep, self._watch):
            t = threading.Thread(target=target, name=f"fencelog-lease-{self.name}", daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def release(self) -> None:
        """Stops the keeper, releases the lease and sets ``lost``."""
        self._stop.set()
        for t in self._workers:
            t.join(timeout=self.ttl)
        run(self._release_steps())

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- keeper -------------------------------------------------------------

    def _keep(self) -> None:
        period = self.ttl / 3.0
        retry = min(period / 3.0, 0.2)
        next_at: Optional[float] = self._last_sent + period
        while next_at is not None and not self._stop.wait(
            timeout=max(0.0, next_at - time.monotonic())
        ):
            next_at = run(self._renew_steps(period, retry))

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
        return run(self._append_steps(stream, payloads))

    def fence(self, stream: Payload) -> int:
        """``LOG.FENCE`` of ``stream`` at this lease's token (refused locally
        once lost)."""
        return run(self._fence_steps(stream))
