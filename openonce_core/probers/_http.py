"""What the reference probers' clients share: a per-provider rate limiter and the rules that
turn a provider's HTTP answer into a probe error the reconciler can act on.

A probe error says nothing about the effect (see ``errors.ProbeError``):

* ``ProbeTransientError`` — 429, 5xx, a timeout, a refused or reset connection, an
  unreadable body: ask again later; ``retry_after`` carries what the provider asked for
  (``Retry-After`` in seconds or as an HTTP date, or a rate-limit reset);
* ``ProbeCredentialError`` — 401, a 403 that is not a rate limit, a server certificate we
  cannot trust: nothing will work until a person fixes the configuration;
* ``ProbeError`` — any other refusal (400, 404...): this request could not be answered.

The limiter is shared by every probe of one provider account in this process (all
threads), so a backlog drained by one worker process stays under the provider's published
limit. :class:`RateLimiter` is per process: with N worker processes each would spend the
whole budget. A deployment with several processes installs a limiter they share with
:func:`set_limiter_factory` (the daemon installs ``reconciler.ratelimit``'s Redis one when
``OPENONCE_RATE_LIMIT_REDIS`` is set); :func:`shared_limiter` then builds its limiters with
that factory. Any limiter has :class:`Limiter`'s four methods.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import math
import os
import socket
import ssl
import threading
import time
import urllib.error
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..errors import ProbeCredentialError, ProbeError, ProbeTransientError

USER_AGENT = "openonce-prober"
# The longest a provider may hold its probes. GitHub's rate window is an hour, so no reset
# is further ahead; anything longer (a reset sent in milliseconds, a gateway's year-long
# Retry-After) would leave every probe "not asked", with no journal line and no person,
# for as long as it says: ask again after an hour and let the provider say so again.
MAX_PAUSE = 3600.0


class Limiter(Protocol):
    """What a prober's client needs from a rate limiter (in-process or shared)."""

    provider: str
    rate: float
    burst: int

    def acquire(self, max_wait: float) -> float:
        """Take one request slot, waiting at most ``max_wait`` seconds; returns the wait.
        Raises ``ProbeTransientError(sent=False)`` while paused or when the wait is longer."""
        ...

    def pause(self, seconds: float, reason: str) -> None:
        """Hold every request for ``seconds``, at most ``MAX_PAUSE`` (a longer pause
        already set stays)."""
        ...

    def paused_for(self) -> float:
        """Seconds of pause left (0 when not paused)."""
        ...

    def backoff(self, first: float, cap: float, reason: str) -> float:
        """Pause after a limit the provider gave no wait for: ``first`` seconds, doubled
        (up to ``cap``) each time it comes again soon after the last backoff ended.
        Returns the seconds paused."""
        ...


class RateLimiter:
    """A thread-safe token bucket (``rate`` requests per second, ``burst`` at once) with a
    pause the provider can impose (``Retry-After``, a rate-limit reset).

    ``acquire`` waits for a slot when the wait fits in ``max_wait`` seconds; otherwise, or
    while the provider's pause lasts, it raises ``ProbeTransientError`` without sending
    anything: asking again while rate-limited can get an integration banned.
    """

    def __init__(
        self,
        provider: str,
        rate: float,
        burst: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"{provider}: the request rate must be a positive number, not {rate}")
        if burst < 1:
            raise ValueError(f"{provider}: burst must be at least 1, not {burst}")
        self.provider = provider
        self.rate = float(rate)
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        # GCRA: the theoretical time the next request is due; a burst may run ahead of it.
        self._next = 0.0
        self._paused_until = 0.0
        self._pause_reason = ""
        # The last backoff's length and end, so a limit that comes again soon doubles it.
        self._backoff = 0.0
        self._backoff_end = 0.0

    def __repr__(self) -> str:
        return f"RateLimiter({self.provider!r}, rate={self.rate:g}/s, burst={self.burst})"

    def acquire(self, max_wait: float) -> float:
        """Take one request slot; returns the seconds waited for it."""
        interval = 1.0 / self.rate
        with self._lock:
            now = self._clock()
            if now < self._paused_until:
                left = self._paused_until - now
                raise ProbeTransientError(
                    self.provider,
                    f"not asked: the provider told us to wait ({self._pause_reason});"
                    f" {left:.1f}s left",
                    retry_after=left,
                    sent=False,
                )
            due = max(self._next, now)
            wait = max(0.0, due - (self.burst - 1) * interval - now)
            if wait > max_wait:
                raise ProbeTransientError(
                    self.provider,
                    f"not asked: the client-side limit of {self.rate:g} requests/s"
                    f" would hold this probe {wait:.1f}s",
                    retry_after=wait,
                    sent=False,
                )
            self._next = due + interval
        if wait > 0:
            self._sleep(wait)
        return wait

    def pause(self, seconds: float, reason: str) -> None:
        """The provider asked us to stop for ``seconds`` (at most ``MAX_PAUSE``): every
        probe of it waits."""
        if not seconds > 0:
            return
        seconds = min(seconds, MAX_PAUSE)
        with self._lock:
            until = self._clock() + seconds
            if until > self._paused_until:
                self._paused_until = until
                self._pause_reason = reason

    def paused_for(self) -> float:
        with self._lock:
            return max(0.0, self._paused_until - self._clock())

    def backoff(self, first: float, cap: float, reason: str) -> float:
        with self._lock:
            now = self._clock()
            wait = next_backoff(self._backoff, self._backoff_end, now, first, min(cap, MAX_PAUSE))
            self._backoff, self._backoff_end = wait, now + wait
            if now + wait > self._paused_until:
                self._paused_until = now + wait
                self._pause_reason = reason
            return wait

    def _after_fork(self) -> None:
        # A lock held by another thread at fork() time would never be released here.
        self._lock = threading.Lock()


def next_backoff(last: float, last_end: float, now: float, first: float, cap: float) -> float:
    """The next backoff: double the last one if this limit came within one more of it after
    it ended (the provider is still unhappy), else start again at ``first``."""
    if last > 0 and now < last_end + last:
        return min(cap, max(first, 2 * last))
    return min(cap, first)


# Builds the limiter for (provider, rate, burst, account); None: the in-process RateLimiter.
LimiterFactory = Callable[[str, float, int, str], Limiter]

_shared: dict[tuple[str, str, float, int], Limiter] = {}
_shared_lock = threading.Lock()
_factory: LimiterFactory | None = None


def set_limiter_factory(factory: LimiterFactory | None) -> None:
    """Have :func:`shared_limiter` build its limiters with ``factory(provider, rate, burst,
    account)`` (one shared by all worker processes), or again in-process with None.
    Limiters handed out before are forgotten: clients built afterwards get new ones."""
    global _factory
    with _shared_lock:
        _factory = factory
        _shared.clear()


def shared_limiter(provider: str, rate: float, burst: int = 1, account: str = "") -> Limiter:
    """The process-wide limiter for ``provider`` (and ``account``, one credential's budget,
    never the credential itself) at this rate: every client built with the same values
    shares it, so probes in all threads draw from one bucket; with a factory installed
    (:func:`set_limiter_factory`), every process does."""
    key = (provider, account, rate, burst)
    with _shared_lock:
        limiter = _shared.get(key)
        if limiter is None:
            if _factory is None:
                limiter = RateLimiter(provider, rate, burst)
            else:
                limiter = _factory(provider, rate, burst, account)
            _shared[key] = limiter
        return limiter


def _reset_after_fork() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    for limiter in _shared.values():
        after_fork = getattr(limiter, "_after_fork", None)
        if after_fork is not None:
            after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


# -- reading an answer ----------------------------------------------------------------------


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None if absent
    or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def header(headers: Mapping[str, str] | Any, name: str) -> str | None:
    """A header by name, case-blind, from ``http.client.HTTPMessage`` or a plain dict."""
    if headers is None:
        return None
    get = getattr(headers, "get", None)
    if get is None:
        return None
    value = get(name)
    if value is None and isinstance(headers, Mapping):
        lowered = name.lower()
        value = next((v for k, v in headers.items() if str(k).lower() == lowered), None)
    return None if value is None else str(value)


def error_message(body: bytes) -> str:
    """The provider's own error text (``{"error": {"message": ...}}`` for Stripe,
    ``{"message": ...}`` for GitHub), or the start of the body."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:200].decode("utf-8", "replace").strip()
    if isinstance(doc, dict):
        inner = doc.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])[:200]
        if isinstance(doc.get("message"), str):
            return str(doc["message"])[:200]
    return ""


def transport_error(provider: str, exc: BaseException, what: str) -> ProbeError:
    """A request that got no HTTP answer: timeouts and connection failures are transient,
    a server certificate we cannot verify is a configuration a person must fix."""
    reason: BaseException | str = exc
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        reason = exc.reason
    if isinstance(reason, ssl.SSLCertVerificationError):
        return ProbeCredentialError(
            provider,
            f"{what}: the server's TLS certificate is not trusted ({reason.verify_message});"
            " fix the host name or give the CA that signed it",
        )
    if isinstance(reason, TimeoutError | socket.timeout):
        return ProbeTransientError(provider, f"{what}: timed out")
    name = type(reason).__name__ if isinstance(reason, BaseException) else "URLError"
    return ProbeTransientError(provider, f"{what}: {name}: {reason}"[:300])


def read_json(
    provider: str,
    open_url: Callable[..., Any],
    request: Any,
    *,
    timeout: float,
    what: str,
    classify: Callable[[int, Any, bytes], ProbeError],
) -> tuple[Any, Any]:
    """Send ``request``; returns (decoded JSON body, response headers) or raises the probe
    error ``classify(status, headers, body)`` picks for an HTTP error status."""
    try:
        with open_url(request, timeout=timeout) as response:
            raw = response.read()
            headers = response.headers
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read() or b""
        except Exception:  # the error body is a courtesy; its status is the answer
            body = b""
        raise classify(exc.code, exc.headers, body) from exc
    except (OSError, http.client.HTTPException) as exc:  # URLError, TimeoutError, resets
        raise transport_error(provider, exc, what) from exc
    try:
        return json.loads(raw), headers
    except (ValueError, UnicodeDecodeError) as exc:
        # A cut-off or garbled body (a proxy, a deploy) is no answer: ask again later.
        raise ProbeTransientError(provider, f"{what}: the answer is not JSON") from exc
