"""Tier 2, natural business key: is there a pull request for this owner/repo/head?

``github.create_pr`` effects carry their natural key in their arguments: ``owner``,
``repo`` and ``head`` (a branch of ``owner/repo``, or ``user:branch`` for a fork). GitHub's
pull-request list is its primary store, read straight (no search index), so a miss is a
real "not happened" and the capability may re-arm on it at once.

The read is still checked before it is believed: the list filter is done by GitHub, but
a malformed filter makes GitHub ignore it and list every PR, and wrappers get it wrong.
So every PR must show the head the effect asked for:

* exactly one PR whose ``head.ref`` is the branch and that this effect may have opened:
  HAPPENED, receipt ``{"number", "head", "url"}`` where ``head`` is the effect's own
  ``head`` argument;
* a head branch outlives its PRs, so a PR of the same head is not this effect's merely by
  its head. A PR GitHub says was created (``created_at``, ISO 8601 UTC), or closed
  (``closed_at``), before the effect was recorded (``Effect.created_at``, the ledger's
  clock) less ``CREATED_SKEW`` for the two clocks, predates this effect and is ignored:
  if that leaves no PR, NOT_HAPPENED (the list is GitHub's primary store). A predating PR
  whose head commit is the one this effect pushed is INCONCLUSIVE (its age and its commit
  disagree: a person looks). A PR whose creation time is missing or unreadable cannot be
  tied to this effect by time: INCONCLUSIVE unless its head commit is the one this effect
  pushed (``head_sha``), which ties it as before;
* PRs whose head does not match are ignored as unrelated; if that is all the read
  returned, it is suspicious and the result is INCONCLUSIVE;
* several matching PRs (one closed, one reopened as new...): INCONCLUSIVE;
* the effect knows the commit it pushed (``head_sha`` in its arguments or its execution
  evidence) and the PR's ``head.sha`` is another: INCONCLUSIVE (someone pushed since, or
  it is not our PR; a person looks);
* none: NOT_HAPPENED;
* GitHub could not be asked: the client raises a ``ProbeError``. Rate limits (403 or 429
  with ``retry-after``, ``x-ratelimit-remaining: 0`` until ``x-ratelimit-reset``, or a
  secondary-rate-limit message, which means at least a minute) and 5xx/timeouts are
  ``ProbeTransientError`` and pause every GitHub probe of this token until the reset;
  401 and a permission 403 are ``ProbeCredentialError``; 404 (a repository the token
  cannot see) is a ``GitHubReadError``.

Results are bound to the effect by :meth:`GitHubPullRequestProber.reference_for`,
``"owner/repo:head"``, not by the provider key: GitHub never saw that key.

How the client spends a token's budget, as GitHub's "Best practices for using the REST
API" and "Rate limits for the REST API" ask:

* a token has 5,000 requests an hour; the client asks at ``REQUESTS_PER_SECOND`` (1/s,
  3,600 an hour, with bursts of ``BURST`` so one probe's pages go together), through the
  process's shared limiter for that token, which a daemon shares across its worker
  processes (``_http.set_limiter_factory``: N workers together keep the one rate);
* one request of a token in flight at a time in a process ("make requests serially");
  a request that cannot get its turn within the probe's ``timeout`` is not sent
  (``ProbeTransientError`` with ``sent=False``);
* ``x-ratelimit-remaining`` at or below ``reserve`` (default 100: the last requests of the
  hour are left to the agents that open PRs with the same token) pauses the limiter until
  ``x-ratelimit-reset``; a refusal with ``retry-after`` pauses it that long;
* a secondary limit without ``retry-after`` pauses it a minute, and each one that comes
  again soon after twice as long as the last, up to ``SECONDARY_LIMIT_MAX_WAIT``.

:meth:`GitHubPullRequestProber.verify` checks a receipt a person gives (see there).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Protocol

from .._probe import ProbeOutcome, ProbeResult
from .._records import Effect
from ..errors import ProbeCredentialError, ProbeError, ProbeTransientError
from ._http import (
    USER_AGENT,
    Limiter,
    error_message,
    header,
    read_json,
    retry_after_seconds,
    shared_limiter,
    transport_error,
)

PROVIDER = "github"
# A token has 5,000 requests an hour: 1/s is 3,600, with room for the agents' own requests.
# Shared by every process when the daemon installs its shared limiter; else per process.
REQUESTS_PER_SECOND = 1.0
# One probe's pages (at most max_pages) may go back to back; the hourly total is the rate's.
BURST = 10
# Requests left in the hour at which the client stops until the reset: they are the
# token's other users' (the agents that open the PRs).
RESERVE = 100
# "If the retry-after header is absent ... wait for at least one minute"; if it goes on,
# "wait for an exponentially increasing amount of time" (GitHub's docs). Capped.
SECONDARY_LIMIT_WAIT = 60.0
SECONDARY_LIMIT_MAX_WAIT = 900.0
API_VERSION = "2022-11-28"
# How far GitHub's clock (a PR's created_at) and the ledger's (the effect's created_at) may
# disagree: a PR created up to this long before the effect was recorded may still be its.
CREATED_SKEW = 300.0


class PullRequestClient(Protocol):
    """What :class:`GitHubPullRequestProber` needs from GitHub: one read.

    ``list_pulls`` returns the pull requests of ``owner/repo`` (open and closed) whose
    head is ``head`` (``"user:branch"``), each as GitHub renders it (``number``,
    ``html_url``, ``state``, ``head.ref``, ``head.label``, ``base.repo.full_name``...). It
    must raise on any failure, including a page it could not read.
    """

    def list_pulls(self, owner: str, repo: str, head: str) -> list[dict[str, Any]]: ...


class SinglePullClient(Protocol):
    """What :meth:`GitHubPullRequestProber.verify` needs besides: ``get_pull`` returns PR
    ``number`` of ``owner/repo`` as GitHub renders it, or None when GitHub has none."""

    def get_pull(self, owner: str, repo: str, number: int) -> dict[str, Any] | None: ...


class GitHubReadError(ProbeError):
    """GitHub's pull-request list could not be read; the probe observed nothing."""

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(PROVIDER, detail, status=status)


class GitHubPullRequestProber:
    """Probes ``github.create_pr`` effects by owner/repo/head (see module doc)."""

    capability = "github_pr"
    provider = PROVIDER  # names this prober in health and metrics

    def __init__(
        self,
        client: PullRequestClient,
        *,
        sha_arg: str = "head_sha",
        created_skew: float = CREATED_SKEW,
    ) -> None:
        # NaN or inf would make every PR of the head "not older than the effect": last
        # week's closed PR would commit a new effect.
        if not (math.isfinite(created_skew) and created_skew >= 0):
            raise ValueError(f"created_skew must be a number of seconds >= 0, not {created_skew!r}")
        self.client = client
        self.sha_arg = sha_arg
        self.created_skew = created_skew

    @classmethod
    def from_token(
        cls,
        token: str,
        *,
        timeout: float = 10.0,
        requests_per_second: float = REQUESTS_PER_SECOND,
        reserve: int = RESERVE,
        base_url: str = "https://api.github.com",
    ) -> GitHubPullRequestProber:
        """A prober reading GitHub's REST API with a token that can read the repository.

        ``requests_per_second`` is what the token's probes may spend: every process's
        together under the daemon's shared limiter, each process's without it. ``reserve``
        requests of the hour are left to the token's other users."""
        return cls(
            GitHubRestClient(
                token, base_url=base_url, timeout=timeout,
                requests_per_second=requests_per_second, reserve=reserve,
            )
        )  # fmt: skip

    def reference_for(self, effect: Effect) -> str:
        """The natural key a decisive result is bound to: ``"owner/repo:head"``."""
        args = effect.args
        return f"{args.get('owner', '')}/{args.get('repo', '')}:{args.get('head', '')}"

    def _pushed_sha(self, effect: Effect) -> str | None:
        """The head commit the effect says it pushed, if it knows it."""
        for source in (effect.args, effect.execution_evidence or {}):
            value = source.get(self.sha_arg)
            if isinstance(value, str) and value.strip():
                return value.strip()
        return None

    def probe(self, effect: Effect) -> ProbeResult:
        key = _natural_key(effect.args)
        if key is None:
            return _inconclusive(
                "cannot probe: the effect's args need string owner, repo and head;"
                f" got {sorted(effect.args)}"
            )
        owner, repo, head = key
        head_owner, _, branch = head.rpartition(":")
        head_owner = head_owner or owner
        label = f"{head_owner}:{branch}"
        where = f"{owner}/{repo} head {label}"
        try:
            pulls = self.client.list_pulls(owner, repo, label)
        except ProbeError:
            raise  # GitHub could not be asked: the reconciler decides when to ask again
        except (TimeoutError, ConnectionError) as exc:
            raise ProbeTransientError(
                PROVIDER, f"reading {where}: {type(exc).__name__}: {exc}"
            ) from exc
        except OSError as exc:
            raise transport_error(PROVIDER, exc, f"reading {where}") from exc
        except Exception as exc:  # a client's own bug: nothing observed, a person looks
            return _inconclusive(
                f"GitHub read for {where} failed: {type(exc).__name__}: {exc}"[:500]
            )
        if not isinstance(pulls, list) or not all(isinstance(p, dict) for p in pulls):
            return _inconclusive(
                f"GitHub returned {type(pulls).__name__} for {where}, not a list of PRs"
            )
        same_head = [p for p in pulls if _is_for(p, owner, repo, head_owner, branch)]
        ignored = len(pulls) - len(same_head)
        pushed = self._pushed_sha(effect)
        # A head branch outlives its PRs: leave out those that predate this effect.
        since = effect.created_at - self.created_skew
        matching: list[dict[str, Any]] = []
        older: list[dict[str, Any]] = []
        for p in same_head:
            created = _created_at(p)
            closed = _created_at(p, "closed_at") if p.get("state") == "closed" else None
            if (created is not None and created < since) or (closed is not None and closed < since):
                older.append(p)
            else:
                matching.append(p)
        observed: dict[str, Any] = {"matches": len(matching), "ignored_unrelated": ignored}
        if older:
            observed["ignored_older"] = [p.get("number") for p in older]
            tied = [p for p in older if pushed is not None and _sha_matches(p, pushed)]
            if tied and not matching:
                tied_numbers = ", ".join(f"#{p.get('number')}" for p in tied)
                return _inconclusive(
                    f"{tied_numbers} of {where} carries the head commit {pushed!r} this effect"
                    " pushed but was created before this effect (GitHub's created_at"
                    f" {tied[0].get('created_at')!r}): its age and its commit disagree,"
                    " a person must decide",
                    observed,
                )
        if len(matching) > 1:
            numbers = [p.get("number") for p in matching]
            observed["numbers"] = [n for n in numbers if type(n) is int]
            return _inconclusive(
                f"{len(matching)} PRs match {where} ({', '.join(f'#{n}' for n in numbers)}):"
                " possible duplicates, a person must decide",
                observed,
            )
        if not same_head and ignored:
            return _inconclusive(
                f"GitHub returned {ignored} PR(s) for {where}, none with that head:"
                " a suspicious read (filter ignored?), not evidence",
                observed,
            )
        reference = self.reference_for(effect)
        if not matching:
            olds = ", ".join(f"#{p.get('number')}" for p in older)
            before = (
                f" created since this effect (ignored {len(older)} older one(s): {olds})"
                if older
                else ""
            )
            return ProbeResult(
                ProbeOutcome.NOT_HAPPENED,
                detail=f"GitHub lists no PR for {where}, open or closed{before}"
                " (authoritative primary-store read)",
                provider_reference=reference,
                observed=observed,
            )
        pull = matching[0]
        number = pull.get("number")
        if type(number) is not int:
            return _inconclusive(f"the PR for {where} has no usable number", observed)
        receipt: dict[str, Any] = {"number": number, "head": head}
        url = pull.get("html_url")
        if isinstance(url, str):
            receipt["url"] = url
        state = pull.get("state")
        if isinstance(state, str):
            observed["state"] = state
        created = _created_at(pull)
        if created is None:
            observed["created_at"] = pull.get("created_at")
            if pushed is None or not _sha_matches(pull, pushed):
                return _inconclusive(
                    f"PR #{number} has head {label} in {owner}/{repo} but no readable"
                    f" created_at ({pull.get('created_at')!r}) and no head commit this effect"
                    " pushed: it cannot be tied to this effect, a person must decide",
                    observed,
                )
        head_info = pull.get("head")
        sha = head_info.get("sha") if isinstance(head_info, dict) else None
        if pushed is not None:
            observed["expected_sha"] = pushed
            observed["head_sha"] = sha
            if not (isinstance(sha, str) and _same_commit(sha, pushed)):
                return _inconclusive(
                    f"PR #{number} has head {label} in {owner}/{repo}, but its head commit is"
                    f" {sha!r}, not {pushed!r} which this effect pushed: someone pushed since,"
                    " or it is not this effect's PR",
                    observed,
                )
        if isinstance(sha, str) and sha:
            receipt["head_sha"] = sha
        unrelated = f"; ignored {ignored} unrelated PR(s)" if ignored else ""
        return ProbeResult(
            ProbeOutcome.HAPPENED,
            receipt=receipt,
            detail=f"PR #{number} ({state or 'state unknown'}) has head {label}"
            f" in {owner}/{repo}{unrelated}",
            provider_reference=reference,
            observed=observed,
        )

    def verify(self, effect: Effect, receipt: dict[str, Any]) -> ProbeResult:
        """Check a receipt a person gives for this effect: does the PR it names exist, and
        is it this effect's by the probe's own rules?

        ``receipt`` names one PR of the effect's ``owner/repo`` by ``number`` (or
        ``pr_number``: an int, or its digits). The PR is read (``get_pull``) and is
        HAPPENED, with the probe's receipt ``{"number", "head", "url", "head_sha"}``, only
        when its head is the effect's, it was not created (or closed) before the effect
        less ``created_skew``, it has a readable ``created_at`` (or carries the commit the
        effect pushed), and its head commit is the one the effect pushed when that is known.
        GitHub has no such PR: NOT_HAPPENED (the receipt names nothing; not proof that the
        effect did not happen). A PR that is not this effect's, or a malformed receipt (not
        looked up): INCONCLUSIVE, the detail says why. Decisive results carry
        :meth:`reference_for`, as probe results do; GitHub that cannot be asked raises a
        ``ProbeError``, as for a probe.
        """
        key = _natural_key(effect.args)
        if key is None:
            return _inconclusive(
                "cannot verify: the effect's args need string owner, repo and head;"
                f" got {sorted(effect.args)}"
            )
        number, problem = _receipt_number(receipt)
        if number is None:
            return _inconclusive(f"cannot verify this receipt: {problem}")
        get_pull = getattr(self.client, "get_pull", None)
        if get_pull is None:
            return _inconclusive(
                f"cannot verify PR #{number}: this prober's client cannot read one PR"
            )
        owner, repo, head = key
        head_owner, _, branch = head.rpartition(":")
        head_owner = head_owner or owner
        label = f"{head_owner}:{branch}"
        reference = self.reference_for(effect)
        pull = get_pull(owner, repo, number)
        observed: dict[str, Any] = {"number": number}
        if pull is None:
            return ProbeResult(
                ProbeOutcome.NOT_HAPPENED,
                detail=f"GitHub has no PR #{number} in {owner}/{repo} (or this token cannot"
                " see it): the receipt names no pull request",
                provider_reference=reference,
                observed=observed,
            )
        if not isinstance(pull, dict) or pull.get("number") != number:
            return _inconclusive(f"GitHub's answer for PR #{number} is not that PR", observed)
        if not _is_for(pull, owner, repo, head_owner, branch):
            pr_head = pull.get("head")
            shown = pr_head.get("label") if isinstance(pr_head, dict) else None
            return _inconclusive(
                f"PR #{number} of {owner}/{repo} has head {shown!r}, not this effect's"
                f" {label!r}: the receipt is not this effect's",
                observed,
            )
        pushed = self._pushed_sha(effect)
        since = effect.created_at - self.created_skew
        created = _created_at(pull)
        closed = _created_at(pull, "closed_at") if pull.get("state") == "closed" else None
        if (created is not None and created < since) or (closed is not None and closed < since):
            return _inconclusive(
                f"PR #{number} of {owner}/{repo} was created (or closed) before this effect"
                f" (GitHub's created_at {pull.get('created_at')!r}, closed_at"
                f" {pull.get('closed_at')!r}): it is an older PR of the same head, not this"
                " effect's",
                observed,
            )
        if created is None and (pushed is None or not _sha_matches(pull, pushed)):
            return _inconclusive(
                f"PR #{number} has no readable created_at ({pull.get('created_at')!r}) and no"
                " head commit this effect pushed: it cannot be tied to this effect",
                observed,
            )
        pr_head = pull.get("head")
        sha = pr_head.get("sha") if isinstance(pr_head, dict) else None
        if pushed is not None and not (isinstance(sha, str) and _same_commit(sha, pushed)):
            return _inconclusive(
                f"PR #{number}'s head commit is {sha!r}, not {pushed!r} which this effect"
                " pushed: someone pushed since, or it is not this effect's PR",
                observed,
            )
        verified: dict[str, Any] = {"number": number, "head": head}
        if isinstance(pull.get("html_url"), str):
            verified["url"] = pull["html_url"]
        if isinstance(sha, str) and sha:
            verified["head_sha"] = sha
        return ProbeResult(
            ProbeOutcome.HAPPENED,
            receipt=verified,
            detail=f"PR #{number} ({pull.get('state') or 'state unknown'}) has head {label}"
            f" in {owner}/{repo} and was created after this effect",
            provider_reference=reference,
            observed=observed,
        )


class GitHubRestClient:
    """:class:`PullRequestClient` over GitHub's REST API, standard library only.

    Follows ``Link: rel="next"`` pages (only on the API's own host, so the token never
    leaves it) and raises rather than return a partial list. Every request waits for the
    token's turn (one in flight per process) and then on ``limiter`` (by default shared by
    every GitHub client of this token: in the process, or in every process of the daemon);
    a rate-limit answer, or a page that left ``reserve`` requests or fewer in the window,
    pauses it until GitHub's reset so no probe asks while limited (see the module doc).
    ``open_url`` is ``urllib.request.urlopen`` unless a test passes a stand-in.
    """

    max_pages = BURST

    def __init__(
        self,
        token: str,
        *,
        base_url: str = "https://api.github.com",
        timeout: float = 10.0,
        requests_per_second: float = REQUESTS_PER_SECOND,
        reserve: int = RESERVE,
        limiter: Limiter | None = None,
        open_url: Callable[..., Any] = urllib.request.urlopen,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not token:
            raise ValueError("a GitHub token is required")
        if reserve < 0:
            raise ValueError(f"reserve must be 0 or more, not {reserve}")
        self._token = token
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.reserve = reserve
        # The budget is the token's at this API: its limiter and its turn are named by a
        # digest of the two (never the token itself: names show up in Redis and logs).
        digest = hashlib.sha256(f"{self.base_url}\n{token}".encode()).hexdigest()[:16]
        self.account = f"token-{digest}"
        self.limiter = limiter or shared_limiter(
            PROVIDER, requests_per_second, BURST, account=self.account
        )
        self._open_url = open_url
        self._clock = clock

    def __repr__(self) -> str:  # never show the token in logs or probe details
        return f"GitHubRestClient(base_url={self.base_url!r})"

    def list_pulls(self, owner: str, repo: str, head: str) -> list[dict[str, Any]]:
        path = f"/repos/{_segment(owner)}/{_segment(repo)}/pulls"
        query = urllib.parse.urlencode({"head": head, "state": "all", "per_page": 100})
        url: str | None = f"{self.base_url}{path}?{query}"
        pulls: list[dict[str, Any]] = []
        for _ in range(self.max_pages):
            if url is None:
                return pulls
            page, url = self._get_page(url)
            pulls.extend(page)
        if url is not None:
            raise GitHubReadError(f"more than {self.max_pages} pages of PRs for head {head}")
        return pulls

    def get_pull(self, owner: str, repo: str, number: int) -> dict[str, Any] | None:
        """PR ``number`` of ``owner/repo``, or None when GitHub answers 404 (no such PR, or
        a repository this token cannot see)."""
        path = f"/repos/{_segment(owner)}/{_segment(repo)}/pulls/{int(number)}"
        try:
            body, _ = self._get(f"{self.base_url}{path}", "reading a pull request")
        except GitHubReadError as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(body, dict):
            raise GitHubReadError("GitHub's pull request is not a JSON object")
        return body

    def _get_page(self, url: str) -> tuple[list[dict[str, Any]], str | None]:
        if not url.startswith(self.base_url + "/"):
            raise GitHubReadError(f"refusing to follow a page link off the API host: {url}")
        body, headers = self._get(url, "listing pull requests")
        if not isinstance(body, list):
            raise GitHubReadError("GitHub's pull-request list is not a JSON list")
        return body, _next_link(header(headers, "Link"))

    def _get(self, url: str, what: str) -> tuple[Any, Any]:
        request = urllib.request.Request(
            url,
            headers={
                "Authorization": f"Bearer {self._token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": USER_AGENT,
            },
        )
        started = time.monotonic()
        with _turn(self.account, self.timeout):
            # The turn's wait comes out of the same budget: a probe waits `timeout` at most.
            left = max(0.0, self.timeout - (time.monotonic() - started))
            self.limiter.acquire(max_wait=left)
            body, headers = read_json(
                PROVIDER, self._open_url, request, timeout=self.timeout, what=what,
                classify=self._classify,
            )  # fmt: skip
        self._spend(headers)
        return body, headers

    def _spend(self, headers: Any) -> None:
        """Stop at ``reserve`` requests left in GitHub's window, until its reset."""
        try:
            remaining = int(header(headers, "x-ratelimit-remaining") or "")
        except ValueError:
            return  # no (readable) header: a GitHub Enterprise without rate limits
        if remaining > self.reserve:
            return
        wait = self._until_reset(headers)
        if wait is not None:
            self.limiter.pause(
                wait,
                f"x-ratelimit-remaining is {remaining} (the last {self.reserve} are left to"
                " the token's other users) until x-ratelimit-reset",
            )

    def _until_reset(self, headers: Any) -> float | None:
        """Seconds until ``x-ratelimit-reset`` (UTC epoch seconds); None if absent or
        unreadable, and "inf" or "nan" is unreadable: a pause must end."""
        reset = header(headers, "x-ratelimit-reset")
        try:
            at = float(reset) if reset is not None else math.nan
        except ValueError:
            return None
        return max(0.0, at - self._clock()) if math.isfinite(at) else None

    def _classify(self, status: int, headers: Any, body: bytes) -> ProbeError:
        """GitHub's rate-limit rules: a 403 is a rate limit only when it says so."""
        message = error_message(body) or f"HTTP {status}"
        detail = f"GitHub answered HTTP {status}: {message}"
        if status in (403, 429):
            wait = retry_after_seconds(header(headers, "retry-after"))
            why = "retry-after"
            if wait is None and header(headers, "x-ratelimit-remaining") == "0":
                wait, why = self._until_reset(headers), "x-ratelimit-reset"
            if wait is None and (status == 429 or "rate limit" in message.lower()):
                # No wait given: a minute, doubled while the limits keep coming.
                wait = self.limiter.backoff(
                    SECONDARY_LIMIT_WAIT, SECONDARY_LIMIT_MAX_WAIT,
                    "GitHub rate limit (secondary rate limit without a header)",
                )  # fmt: skip
                return ProbeTransientError(PROVIDER, detail, status=status, retry_after=wait)
            if wait is not None:
                self.limiter.pause(max(wait, 1.0), f"GitHub rate limit ({why})")
                return ProbeTransientError(PROVIDER, detail, status=status, retry_after=wait)
        if status >= 500:
            wait = retry_after_seconds(header(headers, "retry-after"))
            return ProbeTransientError(PROVIDER, detail, status=status, retry_after=wait)
        if status in (401, 403):
            return ProbeCredentialError(
                PROVIDER, detail + " (check the token and its repository permissions)",
                status=status,
            )  # fmt: skip
        if status == 404:
            detail += " (the repository does not exist or this token cannot see it)"
        return GitHubReadError(detail, status=status)


_turns: dict[str, threading.Lock] = {}
_turns_lock = threading.Lock()


@contextlib.contextmanager
def _turn(account: str, timeout: float) -> Iterator[None]:
    """The token's one request in flight in this process: GitHub asks for serial requests
    (concurrent ones trip its secondary limits). Not had within ``timeout``: not sent."""
    with _turns_lock:
        lock = _turns.setdefault(account, threading.Lock())
    if not lock.acquire(timeout=max(0.0, timeout)):
        raise ProbeTransientError(
            PROVIDER,
            f"not asked: another request of this token was in flight for {timeout:g}s"
            " (GitHub asks for serial requests)",
            retry_after=max(1.0, timeout),
            sent=False,
        )
    try:
        yield
    finally:
        lock.release()


def _forget_turns_after_fork() -> None:
    # A turn held by a thread of the parent would never be released in the child.
    global _turns_lock
    _turns_lock = threading.Lock()
    _turns.clear()


os.register_at_fork(after_in_child=_forget_turns_after_fork)


def _receipt_number(receipt: Any) -> tuple[int | None, str]:
    """The one PR number a receipt names (``number`` or ``pr_number``), or why it names none."""
    if not isinstance(receipt, dict):
        return None, f"a receipt is an object, not {type(receipt).__name__}"
    given = {name: receipt[name] for name in ("number", "pr_number") if name in receipt}
    if not given:
        return None, "it has no PR number (number or pr_number)"
    numbers = set()
    for name, value in given.items():
        if type(value) is int:
            number = value
        elif isinstance(value, str) and re.fullmatch(r"#?[0-9]{1,12}", value.strip()):
            number = int(value.strip().lstrip("#"))
        else:
            return None, f"{name} is {value!r}, not a PR number"
        if number < 1:
            return None, f"{name} is {value!r}, not a PR number"
        numbers.add(number)
    if len(numbers) > 1:
        return None, f"it names two PRs ({given})"
    return numbers.pop(), ""


def _natural_key(args: dict[str, Any]) -> tuple[str, str, str] | None:
    values = [args.get(name) for name in ("owner", "repo", "head")]
    if not all(isinstance(v, str) and v for v in values):
        return None
    owner, repo, head = (str(v) for v in values)
    if not head.rpartition(":")[2]:
        return None
    return owner, repo, head


def _is_for(pull: dict[str, Any], owner: str, repo: str, head_owner: str, branch: str) -> bool:
    """Does this PR show the head we asked for, in the repository we asked about?

    Branch names are case-sensitive, account and repository names are not."""
    head = pull.get("head")
    if not isinstance(head, dict) or head.get("ref") != branch:
        return False
    label = head.get("label")
    if isinstance(label, str):
        label_owner, _, label_branch = label.partition(":")
        if label_owner.lower() != head_owner.lower() or label_branch != branch:
            return False
    base = pull.get("base")
    base_repo = base.get("repo") if isinstance(base, dict) else None
    full_name = base_repo.get("full_name") if isinstance(base_repo, dict) else None
    return not isinstance(full_name, str) or full_name.lower() == f"{owner}/{repo}".lower()


def _created_at(pull: dict[str, Any], field: str = "created_at") -> float | None:
    """GitHub's ``created_at`` (or another of its times: ISO 8601, UTC,
    ``2026-11-25T08:00:00Z``) as epoch seconds, or None when it is missing or unreadable."""
    value = pull.get(field)
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None  # GitHub always says UTC; a naive time is not GitHub's
    return parsed.timestamp()


def _sha_matches(pull: dict[str, Any], pushed: str) -> bool:
    head = pull.get("head")
    sha = head.get("sha") if isinstance(head, dict) else None
    return isinstance(sha, str) and _same_commit(sha, pushed)


def _same_commit(actual: str, expected: str) -> bool:
    """Full SHAs compare whole; an abbreviated one (7+ hex digits) as a prefix."""
    a, e = actual.strip().lower(), expected.strip().lower()
    if len(e) >= 40 or len(a) < len(e):
        return a == e
    return len(e) >= 7 and a.startswith(e)


def _segment(name: str) -> str:
    return urllib.parse.quote(name, safe="")


_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="next"')


def _next_link(link: str | None) -> str | None:
    if not link:
        return None
    match = _NEXT.search(link)
    return match.group(1) if match else None


def _inconclusive(detail: str, observed: dict[str, Any] | None = None) -> ProbeResult:
    return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed or {})
