"""The probers' rate limiter shared by every worker process, kept in Redis.

A provider's limit is the account's (GitHub: 5,000 requests an hour per token), but
``openonce_core.probers._http.RateLimiter`` lives in one process: N Celery worker
processes would each spend the whole budget. :class:`RedisRateLimiter` has the same
methods and keeps the one schedule in Redis, so N workers together stay within the rate,
and a pause one worker learns (``Retry-After``, a rate-limit reset, a secondary limit's
backoff) holds every worker.

* Every decision is one Lua script (atomic in Redis) timed by Redis's own ``TIME``:
  workers whose host clocks disagree still agree on the schedule and on a pause's end.
  Only the wait for a granted slot is slept here, as a duration.
* One hash per provider account (``{prefix}{provider}:{account}``: the account is a
  digest the client gives, never a credential), expiring a day after its last write.
* Redis carries no ledger truth (ARCHITECTURE.md invariant 5): losing it loses no decision.
  While it cannot be reached, each process limits on its own (the in-process
  ``RateLimiter`` at the same rate), with one warning per outage, and asks Redis again
  after ``retry_after`` seconds: probing never blocks on Redis and never fails for it. A
  pause is also kept in the process, so it holds even if Redis restarts without it.

The daemon installs it for every prober client of the process
(``_http.set_limiter_factory``) from ``ReconcilerConfig.ready`` when
``OPENONCE_RATE_LIMIT_REDIS`` names a Redis (by default the Celery broker when that is
Redis; ``off``: each process on its own).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from openonce_core.errors import ProbeTransientError
from openonce_core.probers._http import MAX_PAUSE, RateLimiter, set_limiter_factory

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "openonce:ratelimit:"
# How long a process limits on its own after Redis failed it, before asking Redis again.
RETRY_REDIS_AFTER = 5.0
# A probe must not wait on a Redis that does not answer: one short try, no retries.
REDIS_TIMEOUT = 0.5
KEY_TTL = 86_400

# Redis's clock, in seconds with microseconds. TIME makes a script non-deterministic:
# Redis 5+ replicates a script's writes rather than the script, which allows it.
_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function num(field)
  return tonumber(redis.call('HGET', KEYS[1], field) or '0') or 0
end
local function fmt(x) return string.format('%.6f', x) end
"""

# ARGV: interval, burst, max_wait -> {status, seconds, reason}: "ok" (wait that long, the
# slot is taken), "busy" (the wait would be longer than max_wait; nothing taken) or
# "paused" (seconds of pause left).
_ACQUIRE = (
    _NOW
    + """
local interval, burst, max_wait = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local paused = num('paused_until')
if now < paused then
  return {'paused', fmt(paused - now), redis.call('HGET', KEYS[1], 'reason') or ''}
end
-- GCRA, as RateLimiter: `next` is when the next request is due; a burst runs ahead of it.
local due = math.max(num('next'), now)
local wait = math.max(0, due - (burst - 1) * interval - now)
if wait > max_wait then return {'busy', fmt(wait), ''} end
redis.call('HSET', KEYS[1], 'next', fmt(due + interval))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {'ok', fmt(wait), ''}
"""
)

# ARGV: seconds, reason -> seconds of pause now left. A shorter pause never shortens one.
_PAUSE = (
    _NOW
    + """
local stop = now + tonumber(ARGV[1])
if stop > num('paused_until') then
  redis.call('HSET', KEYS[1], 'paused_until', fmt(stop), 'reason', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return fmt(math.max(0, num('paused_until') - now))
"""
)

_PAUSED_FOR = (
    _NOW
    + """
return fmt(math.max(0, num('paused_until') - now))
"""
)

# ARGV: first, cap, reason -> the pause set. The rule is _http.next_backoff's: double the
# last backoff when this limit came within one more of it after it ended.
_BACKOFF = (
    _NOW
    + """
local first, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local last, last_end = num('backoff'), num('backoff_end')
local wait = math.min(cap, first)
if last > 0 and now < last_end + last then wait = math.min(cap, math.max(first, 2 * last)) end
redis.call('HSET', KEYS[1], 'backoff', fmt(wait), 'backoff_end', fmt(now + wait))
if now + wait > num('paused_until') then
  redis.call('HSET', KEYS[1], 'paused_until', fmt(now + wait), 'reason', ARGV[3])
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return fmt(wait)
"""
)


class RedisRateLimiter:
    """A token bucket (``rate`` requests per second, ``burst`` at once) and a provider's
    pause, shared through Redis by every process using the same ``key``; the methods and
    their meaning are ``RateLimiter``'s (see the module doc)."""

    def __init__(
        self,
        client: redis.Redis,
        provider: str,
        rate: float,
        burst: int = 1,
        *,
        key: str,
        retry_after: float = RETRY_REDIS_AFTER,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        # The process's own limiter: the rules for bad values, and the fallback.
        self._local = RateLimiter(provider, rate, burst)
        self.provider = provider
        self.rate = float(rate)
        self.burst = burst
        self.key = key
        self._client = client
        self._retry_after = retry_after
        self._sleep = sleep
        self._scripts = {
            name: client.register_script(text)
            for name, text in (
                ("acquire", _ACQUIRE), ("pause", _PAUSE), ("paused_for", _PAUSED_FOR),
                ("backoff", _BACKOFF),
            )
        }  # fmt: skip
        # Monotonic: limit on our own until then. A float read and written whole (no lock,
        # so nothing a fork could leave held); at worst two threads both log the outage.
        self._redis_away_until = 0.0
        _limiters.add(self)

    def __repr__(self) -> str:
        return f"RedisRateLimiter({self.key!r}, rate={self.rate:g}/s, burst={self.burst})"

    def acquire(self, max_wait: float) -> float:
        if self._local.paused_for() > 0:
            return self._local.acquire(max_wait)  # raises: a pause this process knows of
        answer = self._run("acquire", 1.0 / self.rate, self.burst, max(0.0, max_wait), KEY_TTL)
        if answer is None:
            return self._local.acquire(max_wait)
        status, seconds, reason = (_text(part) for part in answer)
        wait = float(seconds)
        if status == "paused":
            raise ProbeTransientError(
                self.provider,
                f"not asked: the provider told us to wait ({reason}); {wait:.1f}s left",
                retry_after=wait,
                sent=False,
            )
        if status == "busy":
            raise ProbeTransientError(
                self.provider,
                f"not asked: the shared limit of {self.rate:g} requests/s (all workers)"
                f" would hold this probe {wait:.1f}s",
                retry_after=wait,
                sent=False,
            )
        if wait > 0:
            self._sleep(wait)
        return wait

    def pause(self, seconds: float, reason: str) -> None:
        if not seconds > 0:
            return
        seconds = min(seconds, MAX_PAUSE)  # inf or a year would hold every worker a day
        self._local.pause(seconds, reason)
        self._run("pause", seconds, reason, KEY_TTL)

    def paused_for(self) -> float:
        shared = self._run("paused_for")
        return max(self._local.paused_for(), float(_text(shared)) if shared is not None else 0)

    def backoff(self, first: float, cap: float, reason: str) -> float:
        answer = self._run("backoff", first, min(cap, MAX_PAUSE), reason, KEY_TTL)
        if answer is None:
            return self._local.backoff(first, cap, reason)
        wait = float(_text(answer))
        self._local.pause(wait, reason)
        return wait

    def _run(self, script: str, *args: Any) -> Any:
        """Run one script on this limiter's key; None while Redis cannot be used."""
        if time.monotonic() < self._redis_away_until:
            return None
        try:
            answer = self._scripts[script](keys=[self.key], args=list(args))
        except redis.RedisError as exc:  # unreachable, timed out, or refused the script
            newly = self._redis_away_until == 0.0
            self._redis_away_until = time.monotonic() + self._retry_after
            if newly:
                log.warning(
                    "rate limiter %s: Redis failed (%s: %s); this process limits %s on its"
                    " own (%g requests/s) until Redis answers again",
                    self.key, type(exc).__name__, exc, self.provider, self.rate,
                )  # fmt: skip
            return None
        if self._redis_away_until:
            log.warning("rate limiter %s: Redis answers again; the limit is shared", self.key)
            self._redis_away_until = 0.0
        return answer

    def _after_fork(self) -> None:
        # The process limiter's lock may have been held by another thread at fork() time;
        # redis-py opens new connections in a child by itself.
        self._local._after_fork()


# Every limiter of the process, so a forked child can reset them (not only the ones
# shared_limiter handed out).
_limiters: weakref.WeakSet[RedisRateLimiter] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for limiter in list(_limiters):
        limiter._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


class RedisLimiterFactory:
    """Builds the :class:`RedisRateLimiter` of (provider, rate, burst, account) on one Redis;
    install it with ``_http.set_limiter_factory``."""

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.url = url
        self.prefix = prefix
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=REDIS_TIMEOUT,
            socket_connect_timeout=REDIS_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )

    def __call__(self, provider: str, rate: float, burst: int, account: str) -> RedisRateLimiter:
        key = f"{self.prefix}{provider}" + (f":{account}" if account else "")
        return RedisRateLimiter(self.client, provider, rate, burst, key=key)


def install(url: str) -> RedisLimiterFactory:
    """Share every prober client's limiter of this process through the Redis at ``url``."""
    factory = RedisLimiterFactory(url)
    set_limiter_factory(factory)
    return factory


def install_from_settings() -> RedisLimiterFactory | None:
    """``OPENONCE_RATE_LIMIT_REDIS``: a ``redis://``, ``rediss://`` or ``unix://`` URL
    installs the shared limiter; ``off`` (or nothing) keeps each process's own."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    url = (getattr(settings, "OPENONCE_RATE_LIMIT_REDIS", "") or "").strip()
    if not url or url.lower() == "off":
        set_limiter_factory(None)
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(
            f"OPENONCE_RATE_LIMIT_REDIS={url!r}: use a redis://, rediss:// or unix:// URL, or off"
        )
    return install(url)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
