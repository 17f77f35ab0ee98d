"""Which of the three failure classes an exception from a handler belongs to.

* ``FAILED``: an ordinary exception — the provider answered no. Cached and replayed.
* ``RETRYABLE``: nothing was sent (connect-phase errors) — safe to run again.
* ``UNKNOWN``: the request may have left the process (read timeouts, lost replies).

Third-party classes are recognised by class name anywhere in the exception's MRO, so
OpenOnce needs none of requests, httpx, urllib3 or aiohttp installed. The most specific
class wins (``requests.ConnectTimeout`` is also a ``ConnectionError``, and retryable).
An explicit ``RetryableEffectError`` / ``UnknownOutcomeError`` always wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from .errors import RetryableEffectError, UnknownOutcomeError


class FailureClass(StrEnum):
    FAILED = "failed"
    RETRYABLE = "retryable"
    UNKNOWN = "unknown"


# Nothing reached the provider: connection never established, or no pooled slot.
DEFAULT_RETRYABLE = frozenset(
    {
        "ConnectionRefusedError",
        "ConnectTimeout",  # requests, httpx
        "ConnectError",  # httpx
        "PoolTimeout",  # httpx: no connection was free, nothing sent
        "ConnectTimeoutError",  # urllib3
        "NewConnectionError",  # urllib3
        "NameResolutionError",  # urllib3
        "ClientConnectorError",  # aiohttp
        "ConnectionTimeoutError",  # aiohttp >= 3.10: connect phase
        "gaierror",  # DNS failure
    }
)

# The request may have been sent: the reply was lost or late.
DEFAULT_UNKNOWN = frozenset(
    {
        "TimeoutError",  # builtins / socket.timeout / asyncio
        "ReadTimeout",  # requests, httpx
        "WriteTimeout",  # httpx: part of the body may have been sent
        "TimeoutException",  # httpx base
        "ReadError",  # httpx
        "WriteError",  # httpx
        "RemoteProtocolError",  # httpx
        "ReadTimeoutError",  # urllib3
        "ProtocolError",  # urllib3
        "ConnectionError",  # requests / builtins: ambiguous, so unknown
        "ConnectionResetError",
        "BrokenPipeError",
        "IncompleteRead",
        "RemoteDisconnected",
        "ServerDisconnectedError",  # aiohttp
        "ServerTimeoutError",  # aiohttp
        "SocketTimeoutError",  # aiohttp >= 3.10: read phase
        "ClientPayloadError",  # aiohttp
        "ClientOSError",  # aiohttp: reset while reading (connect failures are a subclass)
        "ChunkedEncodingError",  # requests: the body was cut off after the request went out
    }
)


class Classifier:
    """Maps an exception to a FailureClass. Extend the name sets to teach it new clients."""

    def __init__(
        self,
        retryable: Iterable[str] = DEFAULT_RETRYABLE,
        unknown: Iterable[str] = DEFAULT_UNKNOWN,
    ) -> None:
        self.retryable = frozenset(retryable)
        self.unknown = frozenset(unknown)

    def classify(self, exc: BaseException) -> FailureClass:
        if isinstance(exc, RetryableEffectError):
            return FailureClass.RETRYABLE
        if isinstance(exc, UnknownOutcomeError):
            return FailureClass.UNKNOWN
        if not isinstance(exc, Exception):
            # Cancelled or interrupted mid-call: the request may be out already.
            return FailureClass.UNKNOWN
        for cls in type(exc).__mro__:
            name = cls.__name__
            if name in self.retryable:
                return FailureClass.RETRYABLE
            if name in self.unknown:
                return FailureClass.UNKNOWN
        return FailureClass.FAILED
