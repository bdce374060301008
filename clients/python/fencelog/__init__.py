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
from . import errors
# Every exception, and from_reply: errors.__all__ names them.
from .errors import *  # noqa: F401,F403

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
]
__all__ += errors.__all__
