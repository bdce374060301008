"""Typed exceptions for fencelog's error replies.

Every error fencelog answers begins with a code (``STALE``, ``MISMATCH``, …)
followed by a sentence with the numbers; :func:`from_reply` turns such a
reply into the matching exception, with the numbers as attributes.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Type

__all__ = [
    "FencelogError",
    "StaleError",
    "MismatchError",
    "TrimmedError",
    "HeldError",
    "LostError",
    "TooBigError",
    "UncertainError",
    "IoError",
    "AuthError",
    "CommandError",
    "FencelogConnectionError",
    "FencelogTimeoutError",
    "ClusterUnavailableError",
    "from_reply",
]


class FencelogError(Exception):
    """Base of every fencelog error.

    ``code`` is the error code the server answered (``"STALE"``, ``"ERR"``,
    …), or a client-side code (``"CONNECTION"``, ``"CLUSTER"``) for errors
    that never reached the server or whose reply was lost.
    """

    code: str = "ERR"

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class StaleError(FencelogError):
    """A write carried a token below the stream's highest token."""

    code = "STALE"

    def __init__(self, message: str, presented: int, highest: int) -> None:
        super().__init__(message)
        self.presented = presented
        self.highest = highest


class MismatchError(FencelogError):
    """``LOG.APPENDAT``'s expected offset was not the stream's next offset."""

    code = "MISMATCH"

    def __init__(self, message: str, expected: int, next: int) -> None:  # noqa: A002
        super().__init__(message)
        self.expected = expected
        self.next = next


class TrimmedError(FencelogError):
    """A read started below the stream's start offset."""

    code = "TRIMMED"

    def __init__(self, message: str, requested: int, start: int) -> None:
        super().__init__(message)
        self.requested = requested
        self.start = start


class HeldError(FencelogError):
    """The lease is held by another owner for ``remaining_ms`` more."""

    code = "HELD"

    def __init__(self, message: str, remaining_ms: int) -> None:
        super().__init__(message)
        self.remaining_ms = remaining_ms


class LostError(FencelogError):
    """The lease is no longer held by this owner and token.

    Raised for the server's ``LOST`` answer, and locally by
    :meth:`fencelog.Lease.append` once the lease's ``lost`` event is set.
    """

    code = "LOST"


class TooBigError(FencelogError):
    """A payload, an entry or a record count over a server limit."""

    code = "TOOBIG"


class UncertainError(FencelogError):
    """The outcome of a write cannot be known (cluster: its leader stepped
    down with it in flight; client: its reply was lost twice)."""

    code = "UNCERTAIN"


class IoError(FencelogError):
    """The server's storage failed: it accepts no writes until restarted."""

    code = "IOERR"


class AuthError(FencelogError):
    """``NOAUTH`` / ``WRONGPASS``: no or a wrong password."""

    code = "NOAUTH"


class CommandError(FencelogError):
    """Any other error reply (``ERR``: arity, syntax, a token of 0, …)."""

    code = "ERR"


class FencelogConnectionError(FencelogError):
    """The connection failed. If the request may have been sent, its outcome
    is unknown: only idempotent commands (``LOG.APPENDAT``, reads, lease
    calls) may be retried safely."""

    code = "CONNECTION"


class FencelogTimeoutError(FencelogConnectionError):
    """No reply within the socket timeout; the outcome is unknown."""

    code = "TIMEOUT"


class ClusterUnavailableError(FencelogError):
    """Cluster mode: no leader answered within the bounded retries
    (``TRYAGAIN``, ``CLUSTERDOWN``, unreachable nodes, too many ``MOVED``)."""

    code = "CLUSTER"


_NUM = re.compile(r"\d+")

_PLAIN: Dict[str, Type[FencelogError]] = {
    "LOST": LostError,
    "TOOBIG": TooBigError,
    "UNCERTAIN": UncertainError,
    "IOERR": IoError,
    "NOAUTH": AuthError,
    "WRONGPASS": AuthError,
}


def _numbers(message: str) -> List[int]:
    return [int(n) for n in _NUM.findall(message)]


def from_reply(message: str) -> FencelogError:
    """The exception for an error reply such as
    ``"STALE token 41 is below the highest accepted token 42"``."""
    code, _, _rest = message.partition(" ")
    nums = _numbers(message)
    if code == "STALE" and len(nums) >= 2:
        return StaleError(message, presented=nums[0], highest=nums[1])
    if code == "MISMATCH" and len(nums) >= 2:
        return MismatchError(message, expected=nums[0], next=nums[1])
    if code == "TRIMMED" and len(nums) >= 2:
        return TrimmedError(message, requested=nums[0], start=nums[1])
    if code == "HELD" and nums:
        return HeldError(message, remaining_ms=nums[-1])
    cls = _PLAIN.get(code)
    if cls is not None:
        err = cls(message)
        err.code = code
        return err
    if code.isupper() and code.isalpha():
        return CommandError(message, code=code)
    return CommandError(message)
