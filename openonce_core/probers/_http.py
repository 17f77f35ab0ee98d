"""What the reference probers' clients share: a per-provider rate limiter and the rules that
turn a provider's HTTP answer into a probe error the reconciler can act on.

A probe error says nothing about the effect (see ``errors.ProbeError``):

* ``ProbeTransientError`` — 429, 5xx, a timeout, a refused or reset connection, an
  unreadable body: ask again later; ``retry_after`` carries what the provider asked for
  (``Retry-After`` in seconds or as an HTTP date, or a rate-limit reset);
* ``ProbeCredentialError`` — 401, a 403 that is not a rate limit, a server certificate we
  cannot trust: nothing will work until a person fixes the configuration;
* ``ProbeError`` — any other refusal (400, 404...): this request could not be answered.

The limiter is shared by every probe of one provider in this process (all threads), so a
backlog drained by one worker process stays under the provider's published limit. It is
per process: with N worker processes, give each ``limit / N``.
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
from typing import Any

from ..errors import ProbeCredentialError, ProbeError, ProbeTransientError

USER_AGENT = "openonce-prober"


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
        """The provider asked us to stop for ``seconds``: every probe of it waits."""
        if not seconds > 0:
            return
        with self._lock:
            until = self._clock() + seconds
            if until > self._paused_until:
                self._paused_until = until
                self._pause_reason = reason

    def paused_for(self) -> float:
        with self._lock:
            return max(0.0, self._paused_until - self._clock())

    def _after_fork(self) -> None:
        # A lock held by another thread at fork() time would never be released here.
        self._lock = threading.Lock()


_shared: dict[tuple[str, float, int], RateLimiter] = {}
_shared_lock = threading.Lock()


def shared_limiter(provider: str, rate: float, burst: int = 1) -> RateLimiter:
    """The process-wide limiter for ``provider`` at this rate: every client built with the
    same provider and rate shares it, so probes in all threads draw from one bucket."""
    with _shared_lock:
        limiter = _shared.get((provider, rate, burst))
        if limiter is None:
            limiter = _shared[(provider, rate, burst)] = RateLimiter(provider, rate, burst)
        return limiter


def _reset_after_fork() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    for limiter in _shared.values():
        limiter._after_fork()


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
