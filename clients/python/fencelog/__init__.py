"""fencelog for Python: typed commands, leases with a keeper, exact retries
and cluster routing, on redis-py.

>>> from fencelog import Client
>>> client = Client("127.0.0.1", 7379)
>>> with client.lease("jobs", ttl=10) as lease:       # doctest: +SKIP
...     lease.append("jobs", b"step")
"""

from ._proto import Grant, LeaseInfo, Record, Stat
from .aio import AsyncClient, AsyncLease
from .client import Client, Lease
from .errors import (
    AuthError,
    ClusterUnavailableError,
    CommandError,
    FencelogConnectionError,
    FencelogError,
    FencelogTimeoutError,
    HeldError,
    IoError,
    LostError,
    MismatchError,
    StaleError,
    TooBigError,
    TrimmedError,
    UncertainError,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Lease",
    "AsyncClient",
    "AsyncLease",
    "Record",
    "Stat",
    "Grant",
    "LeaseInfo",
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
]
