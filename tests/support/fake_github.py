"""A GitHub-like REST API over real HTTP: the pull-request list the GitHub prober reads,
in GitHub's wire format, with its pagination and its rate limits.

* ``GET /repos/{owner}/{repo}/pulls?head=user:branch&state=all&per_page=N&page=P``, paged
  with a ``Link`` header (``rel="next"``, ``rel="last"``); ``page_size`` caps per_page so
  tests can force several pages;
* ``Authorization: Bearer <token>`` checked (401 "Bad credentials"); a token in
  ``forbidden`` gets 403 "Resource not accessible by personal access token";
* the primary limit: ``x-ratelimit-limit/remaining/used/reset/resource`` on every answer;
  once ``primary_limit`` requests are used, 403 with ``x-ratelimit-remaining: 0`` until
  ``reset_at`` (an epoch second);
* secondary limits on cue: ``secondary_limit_next(retry_after=...)`` answers 403 with
  GitHub's "secondary rate limit" message, with or without ``retry-after``;
* ``GET /repos/{owner}/{repo}/pulls/{number}``: one PR, 404 if the repository has none by
  that number;
* ``in_flight`` counts the requests being answered now, ``peak_in_flight`` the most at once
  (GitHub asks for serial requests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from .fake_http import FakeHTTPServer, Fault, Reply, Seen

SECONDARY_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
)


def iso_utc(epoch: float) -> str:
    """An epoch second as GitHub writes times: ``2026-11-25T08:00:00Z``."""
    return datetime.fromtimestamp(int(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeGitHubServer(FakeHTTPServer):
    def __init__(
        self,
        *,
        tokens: tuple[str, ...] = ("ghp_good",),
        primary_limit: int = 5000,
        page_size: int = 100,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(clock=clock)
        self.tokens = set(tokens)
        self.forbidden: set[str] = set()
        self.primary_limit = primary_limit
        self.used = 0
        self.page_size = page_size
        self.wall = wall
        self.reset_at = int(wall()) + 3600
        self.pulls: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._number = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self._request = threading.local()

    def _handle(self, handler: Any) -> None:
        # A request is in flight from its arrival until its reply is ready to send: counted
        # down after the reply was written, the client could already have read it and sent
        # the next request (a second one "in flight" that never overlapped).
        with self.lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self._request.answered = False  # each request is handled on a thread of its own
        try:
            super()._handle(handler)
        finally:
            self.answering(None)

    def answering(self, seen: Any) -> None:
        if not getattr(self._request, "answered", True):
            self._request.answered = True
            with self.lock:
                self.in_flight -= 1

    def add_pull(
        self, owner: str, repo: str, branch: str, *, head_owner: str | None = None,
        sha: str = "a" * 40, state: str = "open", created_at: float | str | None = "now",
        closed_at: float | str | None = "created",
    ) -> dict[str, Any]:  # fmt: skip
        """A PR, stamped like GitHub's: ``created_at`` (epoch seconds, by default ``wall()``
        now; None leaves the field out) and, once closed, ``closed_at`` (by default its
        creation time), both rendered as ISO 8601 UTC."""
        with self.lock:
            self._number += 1
            head_owner = head_owner or owner
            created = self.wall() if created_at == "now" else created_at
            closed = created if closed_at == "created" else closed_at
            pull = {
                "number": self._number,
                "state": state,
                "html_url": f"https://github.com/{owner}/{repo}/pull/{self._number}",
                "head": {"ref": branch, "label": f"{head_owner}:{branch}", "sha": sha},
                "base": {"ref": "main", "repo": {"full_name": f"{owner}/{repo}"}},
            }
            if isinstance(created, (int, float)):
                pull["created_at"] = iso_utc(created)
            if state == "closed" and isinstance(closed, (int, float)):
                pull["closed_at"] = iso_utc(closed)
            self.pulls.setdefault((owner.lower(), repo.lower()), []).append(pull)
            return pull

    def secondary_limit_next(self, *, retry_after: int | None = None, status: int = 403) -> None:
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        with self.lock:
            self.faults.append(Fault(status, headers, {"message": SECONDARY_MESSAGE}))

    def _limit_headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit": str(self.primary_limit),
            "x-ratelimit-remaining": str(max(0, self.primary_limit - self.used)),
            "x-ratelimit-used": str(self.used),
            "x-ratelimit-reset": str(self.reset_at),
            "x-ratelimit-resource": "core",
        }

    def route(self, seen: Seen) -> Reply:
        auth = seen.headers.get("authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        if token not in self.tokens:
            return Reply(401, {"message": "Bad credentials", "status": "401"})
        if self.used >= self.primary_limit and self.wall() < self.reset_at:
            return Reply(
                403,
                {"message": "API rate limit exceeded for user ID 1.", "status": "403"},
                self._limit_headers(),
            )
        self.used += 1
        if token in self.forbidden:
            return Reply(
                403,
                {"message": "Resource not accessible by personal access token", "status": "403"},
                self._limit_headers(),
            )
        parts = seen.path.strip("/").split("/")
        not_found = Reply(404, {"message": "Not Found", "status": "404"}, self._limit_headers())
        if len(parts) not in (4, 5) or parts[0] != "repos" or parts[3] != "pulls":
            return not_found
        key = (parts[1].lower(), parts[2].lower())
        if key not in self.pulls:
            return not_found
        if len(parts) == 5:
            one = [p for p in self.pulls[key] if str(p["number"]) == parts[4]]
            return Reply(200, one[0], self._limit_headers()) if one else not_found
        head = (seen.query.get("head") or [None])[0]
        rows = [p for p in self.pulls[key] if head is None or p["head"]["label"] == head]
        per_page = min(int((seen.query.get("per_page") or ["30"])[0]), self.page_size)
        page = int((seen.query.get("page") or ["1"])[0])
        last = max(1, -(-len(rows) // per_page))
        headers = self._limit_headers()
        if page < last:
            query = {k: v[0] for k, v in seen.query.items()}
            base = f"http://{seen.headers.get('host')}{seen.path}"
            links = [
                f'<{base}?{urlencode({**query, "page": page + 1})}>; rel="next"',
                f'<{base}?{urlencode({**query, "page": last})}>; rel="last"',
            ]
            headers["Link"] = ", ".join(links)
        return Reply(200, rows[(page - 1) * per_page : page * per_page], headers)

    def rate_limited(self, seen: Seen) -> Reply:
        return Reply(403, {"message": SECONDARY_MESSAGE}, {"retry-after": "1"})
