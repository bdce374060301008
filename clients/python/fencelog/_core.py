"""The decisions the sync and asyncio clients share, written once.

Each decision that involves I/O (a call's routing and retries, a lease's
acquisition, renewal, exact-retry append and release) is a generator of
*steps*: it yields a zero-argument callable for each I/O it needs and is
sent back that call's result (or has its exception thrown in at the
``yield``). :func:`run` drives one synchronously; :func:`run_async` awaits
what each step answers. :class:`fencelog.Client` and
:class:`fencelog.AsyncClient` (and their leases) differ only in how they
wait: threads and ``time.sleep``, or tasks and ``asyncio.sleep``.
"""

from __future__ import annotations

import inspect
import time
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Generator,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

from redis import exceptions as rex

from . import _proto as P
from .errors import (
    FencelogConnectionError,
    FencelogError,
    LostError,
    StaleError,
    UncertainError,
)
from ._proto import Addr, Payload

T = TypeVar("T")
Step = Callable[[], Any]
Steps = Generator[Step, Any, T]

DEFAULT: Any = object()


def run(steps: "Steps[T]") -> T:
    """Drives ``steps`` in this thread: calls each step, sends its result
    back or throws its exception in; answers what the generator returns.

    It is :func:`run_async` over steps that never answer an awaitable: such
    a coroutine never suspends, so it finishes at its first ``send``."""
    driver = run_async(steps)
    try:
        driver.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    driver.close()
    raise RuntimeError("a synchronous client's step answered an awaitable")


async def run_async(steps: "Steps[T]") -> T:
    """As :func:`run`, awaiting what a step answers when it is awaitable."""
    try:
        step = next(steps)
        while True:
            try:
                result = step()
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as e:
                step = steps.throw(e)
            else:
                step = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class ClientCore:
    """Configuration, the known nodes and the routing of one call, for
    :class:`fencelog.Client` and :class:`fencelog.AsyncClient`.

    A subclass names its connection pool (``_node_type``, with
    ``checkout(timeout)`` and ``checkin(conn, timeout)``), how it waits
    (``_sleep``) and how it guards its shared state (``_new_lock``)."""

    _node_type: Callable[[Addr, Dict[str, Any]], Any]
    _sleep: Callable[[float], Any]
    _new_lock: Callable[[], ContextManager[Any]]

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
        self._lock = self._new_lock()
        self._nodes: Dict[Addr, Any] = {}
        self._order: List[Addr] = P.seeds(host, port, nodes)
        self._current: Addr = self._order[0]
        self._cursor = 0

    @property
    def current_node(self) -> Addr:
        """The node commands go to now (in cluster mode: the leader, as far
        as the client knows)."""
        return self._current

    def _node(self, addr: Addr) -> Any:
        with self._lock:
            node = self._nodes.get(addr)
            if node is None:
                node = self._nodes[addr] = self._node_type(addr, self._kwargs)
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

    def _execute_steps(
        self,
        args: Tuple[Any, ...],
        timeout: Any,
        read_only: bool,
        deadline: Optional[float],
    ) -> "Steps[Any]":
        """One command, routed: the raw reply, or a typed exception. What
        cannot have been applied (a refused connection, ``-MOVED``,
        ``-TRYAGAIN``, ``-CLUSTERDOWN``) is retried in cluster mode, and a
        read or a ``LEASE.ACQUIRE`` whose reply was lost (or answered
        ``UNCERTAIN``: an acquire by the owner that holds the lease answers
        its token again); any other write whose reply was lost never."""
        t = self.socket_timeout if timeout is DEFAULT else timeout
        survives_retry = read_only or _is_acquire(args)
        backoff = P.Backoff(self.max_tries, self.max_wait, deadline=deadline)
        while True:
            addr = self._current
            node = self._node(addr)
            try:
                conn = yield lambda: node.checkout(t)
            except rex.AuthenticationError as e:
                raise P.translate(e) from e
            except (rex.ConnectionError, rex.TimeoutError) as e:
                # Nothing was sent: another node (or this one later) is safe.
                if not self.cluster:
                    raise P.translate(e) from e
                self._rotate(addr)
                delay = backoff.next_delay(e)
                yield lambda: self._sleep(delay)
                continue
            try:
                yield lambda: conn.send_command(*args)
                reply = yield lambda: conn.read_response()
            except (rex.ConnectionError, rex.TimeoutError) as e:
                yield conn.disconnect
                if not (self.cluster and survives_retry):
                    raise P.translate(e) from e
                self._rotate(addr)
                delay = backoff.next_delay(e)
                yield lambda: self._sleep(delay)
                continue
            except rex.ResponseError as e:
                node.checkin(conn, t)
                kind, target = P.redirect(e) if self.cluster else ("", None)
                if self.cluster and survives_retry and str(e).startswith("UNCERTAIN"):
                    kind = "UNCERTAIN"
                if kind == "MOVED" and target is not None:
                    self._node(target)
                    with self._lock:
                        self._current = target
                    backoff.next_delay(e, sleep=False)
                    continue
                if kind:
                    delay = backoff.next_delay(e)
                    yield lambda: self._sleep(delay)
                    continue
                raise P.translate(e) from e
            except BaseException:
                yield conn.disconnect
                raise
            node.checkin(conn, t)
            return reply


def _is_acquire(args: Tuple[Any, ...]) -> bool:
    if not args:
        return False
    name = args[0]
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).decode("latin-1")
    return isinstance(name, str) and name.upper() == "LEASE.ACQUIRE"


class LeaseCore:
    """A lease's state and the decisions about it, for
    :class:`fencelog.Lease` and :class:`fencelog.AsyncLease`; a subclass
    names its event (``_new_event``) and lock (``_new_lock``) types and
    keeps the lease alive its own way (threads or tasks)."""

    _new_event: Callable[[], Any]
    _new_lock: Callable[[], ContextManager[Any]]

    def __init__(
        self,
        client: Any,
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
        self.lost = self._new_event()
        self.lost_reason: Optional[str] = None
        self.lost_at: Optional[float] = None
        self._valid_until = 0.0
        self._last_sent = 0.0
        self._lock = self._new_lock()
        self._stop = self._new_event()
        # The keeper and the watchdog: threads or tasks.
        self._workers: List[Any] = []

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

    def _ttl_ms(self) -> int:
        return max(10, int(self.ttl * 1000))

    # -- life ---------------------------------------------------------------

    def _acquire_steps(self) -> "Steps[None]":
        wait_ms = None if self.wait is None else int(self.wait * 1000)
        sent = time.monotonic()
        grant = yield lambda: self.client.acquire(
            self.name, self.owner, self._ttl_ms(), self.fence_on_acquire, wait_ms
        )
        self.token = grant.token
        self._valid_until = sent + grant.ttl_ms / 1000.0 - self.margin
        self._last_sent = sent

    def _release_steps(self) -> "Steps[None]":
        if not self.lost.is_set():
            try:
                yield lambda: self.client.release(self.name, self.owner, self.token)
            except FencelogError:
                pass  # it expires by itself
        self._mark_lost("released")

    def _renew_steps(self, period: float, retry: float) -> "Steps[Optional[float]]":
        """One renewal, due now: answers when the next is due, or None once
        the lease is lost (the keeper stops)."""
        sent = time.monotonic()
        if sent >= self._valid_until:
            # Never renew what the client already counts as lost (a
            # process pause can wake the keeper past the deadline).
            self._mark_lost("not renewed in time")
            return None
        try:
            granted = yield lambda: self.client.renew(
                self.name, self.owner, self.token, self._ttl_ms(),
                timeout=period, deadline=self._valid_until,
            )
        except LostError:
            self._mark_lost("LOST: the server no longer holds it for this owner and token")
            return None
        except FencelogError:
            return time.monotonic() + retry  # the watchdog decides when it is lost
        with self._lock:
            if self.lost.is_set():
                return None
            self._valid_until = max(self._valid_until, sent + granted / 1000.0 - self.margin)
        return sent + period

    # -- writes -------------------------------------------------------------

    def _append_steps(self, stream: Payload, payloads: Tuple[Payload, ...]) -> "Steps[int]":
        self.check()
        expected = (yield lambda: self.client.stat(stream)).next_offset
        self.check()
        try:
            return (yield from self._append_at_steps(stream, expected, payloads))
        except (FencelogConnectionError, UncertainError) as first:
            try:
                self.check()
            except LostError as lost:
                raise LostError(
                    f"{lost}; the append to {stream!r} at offset {expected} was sent, "
                    "its reply lost: read the stream to learn whether it landed"
                ) from first
            try:
                return (yield from self._append_at_steps(stream, expected, payloads))
            except (FencelogConnectionError, UncertainError) as second:
                raise UncertainError(
                    f"append to {stream!r} at offset {expected}: the reply was lost twice; "
                    f"read the stream to learn whether it landed ({second})"
                ) from first

    def _append_at_steps(
        self, stream: Payload, expected: int, payloads: Tuple[Payload, ...]
    ) -> "Steps[int]":
        try:
            return (
                yield lambda: self.client.append_at(stream, self.token, expected, *payloads)
            )
        except StaleError:
            self._mark_lost("STALE: a newer token was accepted")
            raise

    def _fence_steps(self, stream: Payload) -> "Steps[int]":
        self.check()
        try:
            return (yield lambda: self.client.fence(stream, self.token))
        except StaleError:
            self._mark_lost("STALE: a newer token was accepted")
            raise
