"""What the sync and asyncio clients share: reply types, reply parsing,
error translation and the cluster retry policy."""

from __future__ import annotations

import os
import random
import re
import socket
import time
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

from redis import exceptions as rex

from .errors import (
    AuthError,
    ClusterUnavailableError,
    CommandError,
    FencelogConnectionError,
    FencelogError,
    FencelogTimeoutError,
    from_reply,
)

Payload = Union[bytes, bytearray, memoryview, str]
Addr = Tuple[str, int]


class Record(NamedTuple):
    """One record of a stream."""

    offset: int
    token: int
    payload: bytes


class Stat(NamedTuple):
    """A stream's durable numbers (``LOG.STAT``)."""

    highest_token: int
    next_offset: int
    start_offset: int
    records: int
    bytes: int


class Grant(NamedTuple):
    """A granted lease (``LEASE.ACQUIRE``): its token and ttl in ms."""

    token: int
    ttl_ms: int


class LeaseInfo(NamedTuple):
    """The live lease on a name (``LEASE.INFO``)."""

    owner: str
    token: int
    remaining_ms: int


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def parse_records(reply: Any) -> List[Record]:
    return [Record(int(r[0]), int(r[1]), bytes(r[2])) for r in reply or []]


def parse_stat(reply: Any) -> Stat:
    if isinstance(reply, dict):
        fields = {_s(k): int(v) for k, v in reply.items()}
    else:
        fields = {_s(reply[i]): int(reply[i + 1]) for i in range(0, len(reply), 2)}
    return Stat(
        fields.get("highest_token", 0),
        fields.get("next_offset", 0),
        fields.get("start_offset", 0),
        fields.get("records", 0),
        fields.get("bytes", 0),
    )


def parse_lease_info(reply: Any) -> Optional[LeaseInfo]:
    if reply is None:
        return None
    return LeaseInfo(_s(reply[0]), int(reply[1]), int(reply[2]))


def read_args(
    stream: Payload, start: int, count: Optional[int], block_ms: Optional[int]
) -> List[Any]:
    args: List[Any] = ["LOG.READ", stream, int(start)]
    if count is not None:
        args += ["COUNT", int(count)]
    if block_ms is not None:
        args += ["BLOCK", int(block_ms)]
    return args


def acquire_args(
    name: Payload, owner: str, ttl_ms: int, fence: bool, wait_ms: Optional[int]
) -> List[Any]:
    args: List[Any] = ["LEASE.ACQUIRE", name, owner, int(ttl_ms)]
    if fence:
        args.append("FENCE")
    if wait_ms is not None:
        args += ["WAIT", int(wait_ms)]
    return args


def call_timeout(socket_timeout: Optional[float], block_ms: Optional[int]) -> Optional[float]:
    """The socket timeout for a call that may wait ``block_ms`` on the server."""
    if socket_timeout is None or block_ms is None:
        return socket_timeout
    if block_ms == 0:
        return None  # BLOCK 0 / WAIT 0: no time limit, as in Redis
    return socket_timeout + block_ms / 1000.0


_OWNER_BAD = re.compile(r"[^\x21-\x7e]")


def default_owner() -> str:
    """``host-pid-random``: printable ASCII without spaces, at most 128 bytes."""
    host = _OWNER_BAD.sub("_", socket.gethostname())[:64] or "host"
    return f"{host}-{os.getpid()}-{random.getrandbits(32):08x}"


def default_margin(ttl: float) -> float:
    """The safety margin a lease keeps below its ttl: a tenth, at least 20 ms,
    never more than a third of the ttl."""
    return min(max(0.1 * ttl, 0.02), ttl / 3.0)


def translate(e: BaseException) -> FencelogError:
    """A redis-py exception as a fencelog exception."""
    if isinstance(e, FencelogError):
        return e
    if isinstance(e, rex.AuthenticationError):
        return AuthError(str(e))
    if isinstance(e, rex.TimeoutError):
        return FencelogTimeoutError(f"no reply in time: {e}")
    if isinstance(e, rex.ConnectionError):
        return FencelogConnectionError(str(e))
    if isinstance(e, rex.MovedError):
        return CommandError(
            f"MOVED {e.slot_id} {e.host}:{e.port} (a cluster node: use cluster=True)",
            code="MOVED",
        )
    if isinstance(e, rex.TryAgainError):
        return CommandError(f"TRYAGAIN {e}", code="TRYAGAIN")
    if isinstance(e, rex.ClusterDownError):
        return CommandError(f"CLUSTERDOWN {e}", code="CLUSTERDOWN")
    if isinstance(e, rex.ResponseError):
        return from_reply(str(e))
    if isinstance(e, rex.RedisError):
        return FencelogError(str(e))
    return FencelogError(repr(e))


class Backoff:
    """Capped exponential backoff with jitter, bounded in tries and time, as
    redis-py's cluster client retries ``TRYAGAIN`` / ``CLUSTERDOWN``."""

    def __init__(
        self,
        max_tries: int,
        max_wait: float,
        base: float = 0.02,
        cap: float = 0.5,
        deadline: Optional[float] = None,
    ) -> None:
        self.tries = 0
        self.max_tries = max_tries
        start = time.monotonic()
        self.deadline = start + max_wait if deadline is None else min(deadline, start + max_wait)
        self.base = base
        self.cap = cap
        self.last: Optional[BaseException] = None

    def next_delay(self, cause: BaseException, sleep: bool = True) -> float:
        """The pause before the next try; raises :class:`ClusterUnavailableError`
        when the tries or the time are used up."""
        self.tries += 1
        self.last = cause
        delay = 0.0
        if sleep:
            delay = min(self.cap, self.base * (2 ** min(self.tries - 1, 16)))
            delay *= random.uniform(0.5, 1.0)
        if self.tries >= self.max_tries or time.monotonic() + delay > self.deadline:
            raise ClusterUnavailableError(
                f"no leader answered after {self.tries} tries: {cause}"
            ) from cause
        return delay


def redirect(e: BaseException) -> Tuple[str, Optional[Addr]]:
    """``("MOVED", (host, port))``, ``("TRYAGAIN", None)``,
    ``("CLUSTERDOWN", None)``, or ``("", None)`` for any other error.

    redis-py 6+ parses these codes into their own exceptions on every
    connection; redis-py 5 only in its cluster client, so the message is
    read too."""
    if isinstance(e, rex.MovedError):
        return "MOVED", (str(e.host), int(e.port))
    if isinstance(e, rex.TryAgainError):
        return "TRYAGAIN", None
    if isinstance(e, rex.ClusterDownError):
        return "CLUSTERDOWN", None
    code, _, rest = str(e).partition(" ")
    if code == "MOVED":
        try:
            _slot, target = rest.split(" ", 1)
            host, port = target.strip().rsplit(":", 1)
            return "MOVED", (host, int(port))
        except ValueError:
            return "", None
    if code in ("TRYAGAIN", "CLUSTERDOWN"):
        return code, None
    return "", None


def seeds(
    host: str, port: int, nodes: Optional[Sequence[Addr]]
) -> List[Addr]:
    out: List[Addr] = [(host, int(port))]
    for h, p in nodes or []:
        if (h, int(p)) not in out:
            out.append((h, int(p)))
    return out
