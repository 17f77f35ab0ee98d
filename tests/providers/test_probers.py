"""The reference probers against fake providers that fail the way real ones do.

Every fault that could turn "could not verify" into "did not happen" is injected: a search
index that lags writes, an outage, a list filter the provider ignored (unrelated PRs),
duplicates, an object stamped for another effect, malformed answers. The end-to-end tests
run a real ``OpenOnce(":memory:")`` effect that timed out after the fake provider
recorded it (or before) through ``Reconciler.run_once`` and check the state the
capability's tier calls for: committed with the receipt, re-armed, or in human review.
"""

from __future__ import annotations

import io
import json
import time
import urllib.error
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from openonce_core import EffectState, OpenOnce, OutcomeUnknownError, current_effect
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._providers import (
    BUILTIN_CAPABILITIES,
    ConformanceScenario,
    assert_conformance,
)
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core.errors import ProbeCredentialError, ProbeTransientError
from openonce_core.probers import (
    EmailMessageIdProber,
    GitHubPullRequestProber,
    GitHubReadError,
    GitHubRestClient,
    ImapSentFolder,
    MailStoreReadError,
    StripeProber,
    StripeReadError,
    StripeRestClient,
    effect_metadata,
    message_id_for,
)

HAPPENED = ProbeOutcome.HAPPENED
NOT_HAPPENED = ProbeOutcome.NOT_HAPPENED
INCONCLUSIVE = ProbeOutcome.INCONCLUSIVE

T0 = 1_750_000_000.0  # when the unit-test effects went UNKNOWN
KEY = "oo_" + "ab" * 20


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_effect(
    tool: str = "stripe.charge",
    args: dict[str, Any] | None = None,
    *,
    provider_key: str = KEY,
    effect_id: str = "eff_1",
    created_at: float = T0,
    updated_at: float | None = None,
) -> Effect:
    return Effect(
        id=effect_id,
        tool=tool,
        idempotency_key="k",
        scope="run-1",
        state=EffectState.UNKNOWN,
        args=args or {},
        args_fingerprint="fp",
        provider_key=provider_key,
        attempt=1,
        created_at=created_at,
        updated_at=updated_at if updated_at is not None else created_at,
    )


class Raising:
    """A client whose every read fails the way an outage does."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def fail(*args: Any) -> Any:
            raise self.exc

        return fail


class Returning:
    """A client (or wrapper) that answers every read with a fixed value, whatever was asked."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def answer(*args: Any) -> Any:
            self.calls.append((name, *args))
            return self.value

        return answer


# -- Stripe -------------------------------------------------------------------------------


class FakeStripe:
    """Dedups creates by Idempotency-Key; its metadata search sees an object only
    ``index_lag`` seconds after it was created, like Stripe's eventually consistent index."""

    def __init__(self, clock: Callable[[], float] = time.time, index_lag: float = 0.0) -> None:
        self.clock = clock
        self.index_lag = index_lag
        self.intents: list[dict[str, Any]] = []
        self.by_idempotency_key: dict[str, dict[str, Any]] = {}
        self.searches = 0

    def create_payment_intent(
        self, *, amount: int, metadata: dict[str, str], idempotency_key: str
    ) -> dict[str, Any]:
        if idempotency_key in self.by_idempotency_key:
            return self.by_idempotency_key[idempotency_key]  # the 24h dedup
        intent = {
            "id": f"pi_{len(self.intents) + 1}",
            "object": "payment_intent",
            "amount": amount,
            "currency": "usd",
            "status": "succeeded",
            "metadata": dict(metadata),
            "created": self.clock(),
        }
        self.intents.append(intent)
        self.by_idempotency_key[idempotency_key] = intent
        return intent

    def search_payment_intents(self, provider_key: str) -> list[dict[str, Any]]:
        self.searches += 1
        visible_before = self.clock() - self.index_lag
        return [
            dict(pi)
            for pi in self.intents
            if pi["created"] <= visible_before
            and pi["metadata"].get("openonce_provider_key") == provider_key
        ]


def intent(
    stripe_id: str = "pi_1", provider_key: str = KEY, effect_id: str | None = "eff_1"
) -> dict[str, Any]:
    metadata = {"openonce_provider_key": provider_key}
    if effect_id is not None:
        metadata["openonce_effect_id"] = effect_id
    return {
        "id": stripe_id,
        "amount": 500,
        "currency": "usd",
        "status": "succeeded",
        "metadata": metadata,
    }


def test_stripe_one_match_is_happened_with_a_receipt_bound_to_the_provider_key():
    prober = StripeProber(Returning([intent()]), clock=Clock())
    result = prober.probe(make_effect())
    assert result.outcome is HAPPENED
    assert result.receipt == {
        "stripe_id": "pi_1",
        "amount": 500,
        "currency": "usd",
        "status": "succeeded",
    }
    assert result.provider_reference == KEY
    assert "pi_1" in result.detail


def test_stripe_searches_by_the_effects_provider_key():
    client = Returning([])
    StripeProber(client, clock=Clock(T0 + 600)).probe(make_effect())
    # A mature search miss is confirmed on the list (created within 300 s of the effect).
    assert client.calls == [
        ("search_payment_intents", KEY),
        ("list_payment_intents", T0 - 300, T0 + 900),
    ]


def test_stripe_receipt_keeps_only_json_fields_it_knows():
    odd = {"id": "pi_9", "amount": 12.5, "status": None, "metadata": {"openonce_provider_key": KEY}}
    result = StripeProber(Returning([odd]), clock=Clock()).probe(make_effect())
    assert result.outcome is HAPPENED
    assert result.receipt == {"stripe_id": "pi_9"}


def test_stripe_lagging_index_is_a_young_miss_not_a_miss():
    clock = Clock(T0)
    stripe = FakeStripe(clock, index_lag=300)
    stripe.create_payment_intent(
        amount=500, metadata={"openonce_provider_key": KEY}, idempotency_key=KEY
    )
    clock.now = T0 + 30
    result = StripeProber(stripe, clock=clock).probe(make_effect())
    assert result.outcome is INCONCLUSIVE
    assert "young miss" in result.detail
    assert "30s old" in result.detail
    assert result.observed["age_seconds"] == 30
    clock.now = T0 + 301  # the index caught up: the same probe now finds it
    assert StripeProber(stripe, clock=clock).probe(make_effect()).outcome is HAPPENED


def test_stripe_young_miss_counts_from_the_latest_timestamp():
    # Created a day ago, but the attempt that timed out was 10 seconds ago.
    effect = make_effect(created_at=T0 - 86_000, updated_at=T0 - 10)
    result = StripeProber(FakeStripe(Clock()), clock=Clock()).probe(effect)
    assert result.outcome is INCONCLUSIVE
    assert "young miss" in result.detail


def test_stripe_mature_miss_inside_the_idempotency_window_names_the_backstop():
    prober = StripeProber(FakeStripe(Clock()), clock=Clock(T0 + 600))
    result = prober.probe(make_effect())
    assert result.outcome is NOT_HAPPENED
    assert result.receipt is None
    assert result.provider_reference == KEY
    assert "mature miss" in result.detail
    assert f"Backstop: Stripe deduplicates Idempotency-Key {KEY}" in result.detail
    assert "85800s" in result.detail  # what is left of the 24h window
    assert result.observed["idempotency_backstop"] is True


def test_stripe_mature_miss_past_the_idempotency_window_goes_to_a_person():
    # Past the 24 h window a re-send is a new charge: a miss is not enough to re-arm.
    prober = StripeProber(FakeStripe(Clock()), clock=Clock(T0 + 2 * 86400))
    result = prober.probe(make_effect())
    assert result.outcome is INCONCLUSIVE
    assert "idempotency window" in result.detail
    assert result.observed["idempotency_backstop"] is False


def test_stripe_custom_lag_and_window():
    prober = StripeProber(
        FakeStripe(Clock()), index_lag_seconds=10, idempotency_window_seconds=60, clock=Clock()
    )
    assert prober.probe(make_effect(created_at=T0 - 5)).outcome is INCONCLUSIVE
    past = prober.probe(make_effect(created_at=T0 - 61))
    assert past.outcome is INCONCLUSIVE
    assert "60s idempotency window" in past.detail
    with pytest.raises(ValueError):
        StripeProber(FakeStripe(), index_lag_seconds=-1)


def test_stripe_duplicates_are_inconclusive_and_named():
    found = [intent("pi_1"), intent("pi_2")]
    result = StripeProber(Returning(found), clock=Clock()).probe(make_effect())
    assert result.outcome is INCONCLUSIVE
    assert "possible duplicates" in result.detail
    assert "pi_1, pi_2" in result.detail
    assert result.observed["stripe_ids"] == ["pi_1", "pi_2"]


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("The read operation timed out"),
        urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
        ConnectionResetError("reset by peer"),
    ],
)
def test_stripe_outage_raises_a_transient_probe_error_not_a_result(exc):
    # "Could not ask" is no observation: the reconciler, not the prober, decides what next.
    with pytest.raises(ProbeTransientError) as info:
        StripeProber(Raising(exc), clock=Clock(T0 + 10**6)).probe(make_effect())
    assert info.value.provider == "stripe"
    assert "PaymentIntent search" in str(info.value)


def test_stripe_client_probe_errors_pass_through_and_client_bugs_are_inconclusive():
    refused = ProbeCredentialError("stripe", "HTTP 401: Invalid API Key", status=401)
    with pytest.raises(ProbeCredentialError):
        StripeProber(Raising(refused)).probe(make_effect())
    with pytest.raises(StripeReadError, match="no 'data' list"):
        StripeProber(Raising(StripeReadError("no 'data' list"))).probe(make_effect())
    result = StripeProber(Raising(KeyError("data")), clock=Clock(T0 + 600)).probe(make_effect())
    assert result.outcome is INCONCLUSIVE
    assert "KeyError" in result.detail and result.provider_reference is None


def test_stripe_only_unrelated_objects_is_a_suspicious_read():
    other = intent("pi_7", provider_key="oo_someone_else")
    result = StripeProber(Returning([other]), clock=Clock(T0 + 600)).probe(make_effect())
    assert result.outcome is INCONCLUSIVE
    assert "none stamped with that key" in result.detail
    unstamped = {"id": "pi_8", "amount": 500}  # a wrapper that dropped metadata
    result = StripeProber(Returning([unstamped]), clock=Clock(T0 + 600)).probe(make_effect())
    assert result.outcome is INCONCLUSIVE


def test_stripe_unrelated_objects_beside_the_match_are_ignored():
    found = [intent("pi_7", provider_key="oo_someone_else"), intent("pi_1")]
    result = StripeProber(Returning(found), clock=Clock()).probe(make_effect())
    assert result.outcome is HAPPENED
    assert result.receipt is not None and result.receipt["stripe_id"] == "pi_1"
    assert result.observed["ignored_unrelated"] == 1


def test_stripe_object_stamped_for_another_effect_is_wrong_identity():
    stranger = intent("pi_1", effect_id="eff_other")
    result = StripeProber(Returning([stranger]), clock=Clock()).probe(make_effect())
    assert result.outcome is INCONCLUSIVE
    assert "wrong identity" in result.detail
    assert "eff_other" in result.detail


def test_stripe_object_without_an_effect_id_is_accepted_on_the_provider_key():
    result = StripeProber(Returning([intent(effect_id=None)]), clock=Clock()).probe(make_effect())
    assert result.outcome is HAPPENED


@pytest.mark.parametrize(
    "answer", [None, {"data": []}, ["pi_1"], [{"metadata": {"openonce_provider_key": KEY}}]]
)
def test_stripe_malformed_answers_are_inconclusive(answer):
    result = StripeProber(Returning(answer), clock=Clock(T0 + 600)).probe(make_effect())
    assert result.outcome is INCONCLUSIVE


class FakeResponse(io.BytesIO):
    def __init__(self, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(json.dumps(body).encode())
        self.headers = headers or {}


class FakeOpener:
    """Stands in for urllib.request.urlopen: records requests, answers from a script."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[Any] = []
        self.timeouts: list[float] = []

    def __call__(self, request: Any, timeout: float) -> Any:
        self.requests.append(request)
        self.timeouts.append(timeout)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def http_error(url: str, code: int, body: Any) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(url, code, "error", {}, io.BytesIO(json.dumps(body).encode()))


def test_stripe_rest_client_searches_metadata_with_the_key():
    opener = FakeOpener(FakeResponse({"object": "search_result", "data": [intent()]}))
    client = StripeRestClient("rk_test_secret", timeout=3.0, open_url=opener)
    assert client.search_payment_intents("oo_it's") == [intent()]
    request = opener.requests[0]
    url = urlsplit(request.full_url)
    assert (url.scheme, url.netloc, url.path) == (
        "https",
        "api.stripe.com",
        "/v1/payment_intents/search",
    )
    assert parse_qs(url.query)["query"] == ["metadata['openonce_provider_key']:'oo_it\\'s'"]
    assert request.get_header("Authorization") == "Bearer rk_test_secret"
    assert opener.timeouts == [3.0]
    assert "rk_test_secret" not in repr(client)


def test_stripe_rest_client_raises_on_http_errors_and_odd_bodies():
    error = http_error(
        "https://api.stripe.com/v1/x", 401, {"error": {"message": "Invalid API Key"}}
    )
    client = StripeRestClient("sk", open_url=FakeOpener(error))
    with pytest.raises(ProbeCredentialError, match="HTTP 401: Invalid API Key") as info:
        client.search_payment_intents(KEY)
    assert info.value.status == 401
    client = StripeRestClient("sk", open_url=FakeOpener(FakeResponse({"error": "?"})))
    with pytest.raises(StripeReadError, match="no 'data' list"):
        client.search_payment_intents(KEY)


def test_stripe_from_api_key_builds_an_http_prober():
    prober = StripeProber.from_api_key("rk_live_x", index_lag_seconds=30)
    assert isinstance(prober.client, StripeRestClient)
    assert prober.index_lag_seconds == 30
    assert prober.capability == StripeProber.capability == "stripe"


# -- GitHub -------------------------------------------------------------------------------


def pull(
    number: int,
    ref: str = "fix-login",
    *,
    head_owner: str = "acme",
    base: str = "acme/api",
    state: str = "open",
    created_at: float | None = None,
) -> dict[str, Any]:
    """A PR as GitHub lists it, created now (after every unit-test effect) unless told."""
    created = time.time() if created_at is None else created_at
    return {
        "number": number,
        "state": state,
        "html_url": f"https://github.com/{base}/pull/{number}",
        "head": {"ref": ref, "label": f"{head_owner}:{ref}"},
        "base": {"repo": {"full_name": base}},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
    }


class FakeGitHub:
    """Filters by head like GitHub does, unless ``ignores_filter`` (a malformed filter makes
    GitHub list every PR of the repository)."""

    def __init__(self, *pulls: dict[str, Any], ignores_filter: bool = False) -> None:
        self.pulls = list(pulls)
        self.ignores_filter = ignores_filter
        self.calls: list[tuple[str, str, str]] = []

    def create_pr(self, owner: str, repo: str, head: str) -> dict[str, Any]:
        created = pull(100 + len(self.pulls), head, head_owner=owner, base=f"{owner}/{repo}")
        self.pulls.append(created)
        return created

    def list_pulls(self, owner: str, repo: str, head: str) -> list[dict[str, Any]]:
        self.calls.append((owner, repo, head))
        in_repo = [p for p in self.pulls if p["base"]["repo"]["full_name"] == f"{owner}/{repo}"]
        if self.ignores_filter:
            return in_repo
        return [p for p in in_repo if p["head"]["label"] == head]


PR_ARGS = {"owner": "acme", "repo": "api", "head": "fix-login", "title": "Fix login"}


def pr_effect(**args: Any) -> Effect:
    return make_effect("github.create_pr", {**PR_ARGS, **args})


def test_github_one_pr_is_happened_with_receipt_bound_to_the_natural_key():
    github = FakeGitHub(pull(42))
    prober = GitHubPullRequestProber(github)
    effect = pr_effect()
    result = prober.probe(effect)
    assert result.outcome is HAPPENED
    assert result.receipt == {
        "number": 42,
        "head": "fix-login",
        "url": "https://github.com/acme/api/pull/42",
    }
    assert prober.reference_for(effect) == "acme/api:fix-login"
    assert result.provider_reference == "acme/api:fix-login"
    assert github.calls == [("acme", "api", "acme:fix-login")]


def test_github_closed_pr_still_happened():
    result = GitHubPullRequestProber(FakeGitHub(pull(42, state="closed"))).probe(pr_effect())
    assert result.outcome is HAPPENED
    assert result.observed["state"] == "closed"
    assert "closed" in result.detail


def test_github_no_pr_is_an_authoritative_not_happened():
    result = GitHubPullRequestProber(FakeGitHub(pull(7, "other-branch"))).probe(pr_effect())
    assert result.outcome is NOT_HAPPENED
    assert result.provider_reference == "acme/api:fix-login"
    assert "authoritative" in result.detail


def test_github_only_unrelated_prs_is_a_suspicious_read():
    github = FakeGitHub(pull(7, "other-branch"), pull(8, "docs"), ignores_filter=True)
    result = GitHubPullRequestProber(github).probe(pr_effect())
    assert result.outcome is INCONCLUSIVE
    assert "suspicious read" in result.detail
    assert result.observed == {"matches": 0, "ignored_unrelated": 2}


def test_github_unrelated_prs_beside_the_match_are_ignored():
    github = FakeGitHub(pull(7, "other-branch"), pull(42), ignores_filter=True)
    result = GitHubPullRequestProber(github).probe(pr_effect())
    assert result.outcome is HAPPENED
    assert result.receipt is not None and result.receipt["number"] == 42
    assert "ignored 1 unrelated" in result.detail


def test_github_duplicate_prs_are_inconclusive():
    github = FakeGitHub(pull(41, state="closed"), pull(42))
    result = GitHubPullRequestProber(github).probe(pr_effect())
    assert result.outcome is INCONCLUSIVE
    assert "#41, #42" in result.detail
    assert result.observed["numbers"] == [41, 42]


@pytest.mark.parametrize(
    "wrong",
    [
        pull(42, head_owner="mallory"),  # same branch name, from someone's fork
        pull(42, base="acme/web"),  # a PR of another repository
        pull(42, "Fix-Login"),  # branch names are case-sensitive
        {"number": 42, "head": "fix-login"},  # head is not an object
    ],
)
def test_github_pr_with_the_wrong_identity_is_not_ours(wrong):
    result = GitHubPullRequestProber(Returning([wrong])).probe(pr_effect())
    assert result.outcome is INCONCLUSIVE
    assert "suspicious read" in result.detail


def test_github_owner_case_does_not_matter():
    result = GitHubPullRequestProber(Returning([pull(42, head_owner="ACME")])).probe(pr_effect())
    assert result.outcome is HAPPENED


def test_github_fork_head_is_searched_and_receipted_as_given():
    github = FakeGitHub(pull(42, head_owner="alice"))
    prober = GitHubPullRequestProber(github)
    effect = pr_effect(head="alice:fix-login")
    result = prober.probe(effect)
    assert github.calls == [("acme", "api", "alice:fix-login")]
    assert result.outcome is HAPPENED
    assert result.receipt is not None and result.receipt["head"] == "alice:fix-login"
    assert result.provider_reference == prober.reference_for(effect) == "acme/api:alice:fix-login"


def test_github_outage_raises_probe_errors_not_results():
    with pytest.raises(ProbeTransientError, match="acme/api head acme:fix-login") as info:
        GitHubPullRequestProber(Raising(TimeoutError("timed out"))).probe(pr_effect())
    assert info.value.provider == "github"
    missing = GitHubReadError("GitHub answered HTTP 404: Not Found", status=404)
    with pytest.raises(GitHubReadError) as raised:
        GitHubPullRequestProber(Raising(missing)).probe(pr_effect())
    assert raised.value.status == 404 and raised.value.provider == "github"
    result = GitHubPullRequestProber(Raising(TypeError("bug"))).probe(pr_effect())
    assert result.outcome is INCONCLUSIVE and "TypeError" in result.detail


@pytest.mark.parametrize("answer", [None, [42], [{"number": "42", "head": {"ref": "fix-login"}}]])
def test_github_malformed_answers_are_inconclusive(answer):
    assert GitHubPullRequestProber(Returning(answer)).probe(pr_effect()).outcome is INCONCLUSIVE


def test_github_effect_without_the_natural_key_is_inconclusive_and_never_raises():
    prober = GitHubPullRequestProber(FakeGitHub())
    effect = make_effect("github.create_pr", {"owner": "acme", "title": "x"})
    result = prober.probe(effect)
    assert result.outcome is INCONCLUSIVE
    assert "owner, repo and head" in result.detail
    assert prober.reference_for(effect) == "acme/:"


def test_github_rest_client_follows_pages_on_the_api_host_only():
    page2 = "https://api.github.com/repositories/1/pulls?head=acme%3Afix-login&page=2"
    opener = FakeOpener(
        FakeResponse([pull(41)], {"Link": f'<{page2}>; rel="next", <{page2}>; rel="last"'}),
        FakeResponse([pull(42)]),
    )
    client = GitHubRestClient("ghp_secret", open_url=opener)
    assert [p["number"] for p in client.list_pulls("acme", "api", "acme:fix-login")] == [41, 42]
    first = opener.requests[0]
    assert first.full_url == (
        "https://api.github.com/repos/acme/api/pulls?head=acme%3Afix-login&state=all&per_page=100"
    )
    assert first.get_header("Authorization") == "Bearer ghp_secret"
    assert opener.requests[1].full_url == page2
    assert "ghp_secret" not in repr(client)

    off_host = FakeResponse([], {"Link": '<https://evil.example/steal>; rel="next"'})
    client = GitHubRestClient("ghp_secret", open_url=FakeOpener(off_host))
    with pytest.raises(GitHubReadError, match="off the API host"):
        client.list_pulls("acme", "api", "acme:fix-login")


def test_github_rest_client_refuses_partial_and_failed_reads():
    endless = [
        FakeResponse([], {"Link": '<https://api.github.com/x?page=2>; rel="next"'})
        for _ in range(GitHubRestClient.max_pages)
    ]
    client = GitHubRestClient("t", open_url=FakeOpener(*endless))
    with pytest.raises(GitHubReadError, match="more than 10 pages"):
        client.list_pulls("acme", "api", "acme:fix-login")
    not_found = http_error("https://api.github.com/repos/acme/api/pulls", 404, {})
    client = GitHubRestClient("t", open_url=FakeOpener(not_found))
    with pytest.raises(GitHubReadError, match="HTTP 404"):
        client.list_pulls("acme", "api", "acme:fix-login")
    client = GitHubRestClient("t", open_url=FakeOpener(FakeResponse({"message": "?"})))
    with pytest.raises(GitHubReadError, match="not a JSON list"):
        client.list_pulls("acme", "api", "acme:fix-login")


def test_github_from_token_builds_an_http_prober():
    prober = GitHubPullRequestProber.from_token("ghp_x")
    assert isinstance(prober.client, GitHubRestClient)
    assert prober.capability == "github_pr"


# -- email --------------------------------------------------------------------------------

DOMAIN = "mail.example.com"
MID = f"<{KEY}@{DOMAIN}>"


class FakeSentStore:
    """Exact Message-ID lookup; ``substring`` mimics IMAP's HEADER search (a substring
    match, so a longer Message-ID containing ours also comes back)."""

    def __init__(self, *messages: dict[str, Any], substring: bool = False) -> None:
        self.messages = list(messages)
        self.substring = substring
        self.searched: list[str] = []

    def send(self, message_id: str) -> None:
        self.messages.append({"message_id": message_id, "id": f"m{len(self.messages) + 1}"})

    def find_sent(self, message_id: str) -> list[dict[str, Any]]:
        self.searched.append(message_id)
        needle = message_id.strip("<>")
        if self.substring:
            return [m for m in self.messages if needle in m["message_id"]]
        return [m for m in self.messages if m["message_id"] == message_id]


def email_prober(client: Any, authoritative: bool, **kw: Any) -> EmailMessageIdProber:
    kw.setdefault("clock", Clock(T0 + 600))
    return EmailMessageIdProber(client, authoritative=authoritative, domain=DOMAIN, **kw)


def test_message_id_for_is_deterministic_and_refuses_what_cannot_be_a_message_id():
    assert message_id_for(KEY, DOMAIN) == MID
    for bad in ("", "a b.com", "x@y.com", "<y.com>"):
        with pytest.raises(ValueError):
            message_id_for(KEY, bad)
    with pytest.raises(ValueError):
        EmailMessageIdProber(FakeSentStore(), authoritative=True, domain="not a domain")


@pytest.mark.parametrize("authoritative", [True, False])
def test_email_found_is_happened_with_the_message_id(authoritative):
    store = FakeSentStore({"message_id": MID, "id": "m1"})
    result = email_prober(store, authoritative).probe(make_effect("email.send"))
    assert store.searched == [MID]
    assert result.outcome is HAPPENED
    assert result.receipt == {"message_id": MID, "store_id": "m1"}
    assert result.provider_reference == KEY


def test_email_several_copies_of_one_message_id_are_one_message():
    copies = [{"message_id": MID, "id": "sent"}, {"message_id": f"  <{KEY}@MAIL.example.com>"}]
    result = email_prober(Returning(copies), True).probe(make_effect("email.send"))
    assert result.outcome is HAPPENED
    assert result.observed["copies"] == 2


def test_email_authoritative_miss_is_not_happened():
    prober = email_prober(FakeSentStore(), True)
    result = prober.probe(make_effect("email.send"))
    assert prober.capability == "email_provider_api"
    assert result.outcome is NOT_HAPPENED
    assert result.provider_reference == KEY
    assert MID in result.detail


def test_email_smtp_miss_proves_nothing_forever():
    prober = email_prober(FakeSentStore(), False, clock=Clock(T0 + 365 * 86400))
    result = prober.probe(make_effect("email.send"))
    assert prober.capability == "email_smtp"
    assert result.outcome is INCONCLUSIVE
    assert "bare SMTP: a missing sent copy proves nothing" in result.detail


def test_email_young_miss_in_an_authoritative_store_waits_for_the_index():
    prober = email_prober(FakeSentStore(), True, clock=Clock(T0 + 30))
    result = prober.probe(make_effect("email.send"))
    assert result.outcome is INCONCLUSIVE
    assert "young miss" in result.detail


@pytest.mark.parametrize("authoritative", [True, False])
def test_email_outage_raises_a_transient_probe_error(authoritative):
    prober = email_prober(Raising(ConnectionResetError("imap went away")), authoritative)
    with pytest.raises(ProbeTransientError, match="ConnectionResetError: imap went away"):
        prober.probe(make_effect("email.send"))


def test_email_only_other_message_ids_is_a_suspicious_read_even_when_authoritative():
    longer = {"message_id": f"<x{KEY}@{DOMAIN}>"}
    result = email_prober(FakeSentStore(longer, substring=True), True).probe(
        make_effect("email.send")
    )
    assert result.outcome is INCONCLUSIVE
    assert "other Message-IDs" in result.detail


@pytest.mark.parametrize("answer", [None, "m1", [MID], [{"id": "m1"}]])
def test_email_malformed_answers_are_never_a_miss(answer):
    result = email_prober(Returning(answer), True).probe(make_effect("email.send"))
    assert result.outcome is INCONCLUSIVE


class FakeImap:
    """The slice of imaplib.IMAP4 the sent-folder client uses, with a substring search."""

    def __init__(self, *message_ids: str) -> None:
        self.message_ids = list(message_ids)
        self.selected: tuple[str, bool] | None = None
        self.logged_out = False

    def select(self, mailbox: str, readonly: bool = False) -> tuple[str, list[bytes]]:
        self.selected = (mailbox, readonly)
        return "OK", [str(len(self.message_ids)).encode()]

    def uid(self, command: str, *args: str) -> tuple[str, list[Any]]:
        if command == "SEARCH":
            needle = args[-1].strip('"').strip("<>")
            hits = [str(i + 1) for i, m in enumerate(self.message_ids) if needle in m]
            return "OK", [" ".join(hits).encode()]
        uid = int(args[0])
        header = f"Message-ID: {self.message_ids[uid - 1]}\r\n\r\n".encode()
        return "OK", [
            (f"{uid} (UID {uid} BODY[HEADER.FIELDS (MESSAGE-ID)] {{n}}".encode(), header),
            b")",
        ]

    def logout(self) -> tuple[str, list[bytes]]:
        self.logged_out = True
        return "BYE", []


def test_imap_sent_folder_reads_read_only_and_verifies_whole_message_ids():
    conn = FakeImap(MID, f"<x{KEY}@{DOMAIN}>", "<other@example.com>")
    folder = ImapSentFolder(lambda: conn, mailbox="[Gmail]/Sent Mail")
    found = folder.find_sent(MID)
    assert conn.selected == ('"[Gmail]/Sent Mail"', True)
    assert conn.logged_out
    assert [m["message_id"] for m in found] == [MID, f"<x{KEY}@{DOMAIN}>"]
    result = email_prober(folder, False).probe(make_effect("email.send"))
    assert result.outcome is HAPPENED
    assert result.receipt == {"message_id": MID, "store_id": "1"}


def test_imap_sent_folder_miss_and_failures():
    folder = ImapSentFolder(lambda: FakeImap("<other@example.com>"))
    assert folder.find_sent(MID) == []
    assert email_prober(folder, False).probe(make_effect("email.send")).outcome is INCONCLUSIVE

    class NoMailbox(FakeImap):
        def select(self, mailbox: str, readonly: bool = False) -> tuple[str, list[bytes]]:
            return "NO", [b"no such mailbox"]

    broken = NoMailbox()
    with pytest.raises(MailStoreReadError, match="cannot open mailbox"):
        email_prober(ImapSentFolder(lambda: broken), True).probe(make_effect("email.send"))
    assert broken.logged_out


def test_email_from_imap_builds_a_lazy_sent_folder_client():
    prober = EmailMessageIdProber.from_imap(
        "imap.example.com", "me", "pw", authoritative=False, domain=DOMAIN, mailbox="Sent Items"
    )
    assert isinstance(prober.client, ImapSentFolder)
    assert prober.client.mailbox == "Sent Items"
    assert prober.capability == "email_smtp"
    assert prober.domain == DOMAIN


# -- every prober passes its capability's conformance plan --------------------------------

CAPABILITIES = {c.name: c for c in BUILTIN_CAPABILITIES}


def scenario_results(
    probe: Callable[[Any, Clock], ProbeResult], found: Any, ambiguous: Any
) -> dict[ConformanceScenario, ProbeResult]:
    return {
        ConformanceScenario.HAPPENED: probe(Returning(found), Clock(T0 + 600)),
        ConformanceScenario.YOUNG_MISS: probe(Returning([]), Clock(T0 + 5)),
        ConformanceScenario.MATURE_MISS: probe(Returning([]), Clock(T0 + 600)),
        ConformanceScenario.AMBIGUOUS: probe(Returning(ambiguous), Clock(T0 + 600)),
    }


def test_stripe_prober_conforms():
    results = scenario_results(
        lambda client, clock: StripeProber(client, clock=clock).probe(make_effect()),
        [intent()],
        [intent("pi_1"), intent("pi_2")],
    )
    assert_conformance(CAPABILITIES[StripeProber.capability], results)


def test_github_prober_conforms():
    results = scenario_results(
        lambda client, clock: GitHubPullRequestProber(client).probe(pr_effect()),
        [pull(42)],
        [pull(41), pull(42)],
    )
    del results[ConformanceScenario.YOUNG_MISS]  # grace 0: the read is never stale
    assert_conformance(CAPABILITIES["github_pr"], results, source_args=PR_ARGS)


@pytest.mark.parametrize("authoritative", [True, False])
def test_email_prober_conforms(authoritative):
    def probe(client: Any, clock: Clock) -> ProbeResult:
        return email_prober(client, authoritative, clock=clock).probe(make_effect("email.send"))

    results = scenario_results(probe, [{"message_id": MID}], [{"message_id": "<x@y.z>"}])
    capability = email_prober(FakeSentStore(), authoritative).capability
    assert_conformance(CAPABILITIES[capability], results)


# -- end to end: a timed-out effect through the reconciler --------------------------------


@pytest.fixture
def oo() -> Iterator[OpenOnce]:
    ledger = OpenOnce(":memory:")
    yield ledger
    ledger.close()


def reconcile(oo: OpenOnce, tool: str, prober: Any, capability: str | None = None) -> Any:
    rec = Reconciler(oo, grace_seconds=0)
    try:
        rec.register(tool, prober, capability=capability)
        return rec.run_once()
    finally:
        rec.close()


def timed_out(call: Callable[[], Any]) -> str:
    """Run a call whose handler times out; return the id of the effect left UNKNOWN."""
    with pytest.raises(OutcomeUnknownError) as info:
        call()
    return info.value.effect_id


def last_reason(oo: OpenOnce, effect_id: str) -> str:
    return oo.journal(effect_id)[-1].reason


def stripe_charge(oo: OpenOnce, stripe: FakeStripe, timeouts: list[str]) -> Callable[..., Any]:
    """A handler per the stripe contract; ``timeouts`` scripts each attempt: "after" the
    provider recorded the charge, "before" it (the request was lost), or "" (no timeout)."""

    @oo.effect(tool="stripe.charge", idempotency_fields=["amount_cents"])
    def charge(amount_cents: int) -> dict[str, Any]:
        ctx = current_effect()
        mode = timeouts.pop(0)
        if mode == "before":
            raise TimeoutError("read timed out")
        created = stripe.create_payment_intent(
            amount=amount_cents, metadata=effect_metadata(ctx), idempotency_key=ctx.provider_key
        )
        if mode == "after":
            raise TimeoutError("read timed out")
        return {"stripe_id": created["id"]}

    return charge


def test_e2e_stripe_charge_that_happened_commits_with_the_receipt(oo):
    stripe = FakeStripe()
    charge = stripe_charge(oo, stripe, ["after"])
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: charge(amount_cents=500))
        report = reconcile(oo, "stripe.charge", StripeProber(stripe))
        assert report.committed == [effect_id]
        effect = oo.get(effect_id)
        assert effect.state is EffectState.COMMITTED
        assert effect.result == {
            "stripe_id": "pi_1",
            "amount": 500,
            "currency": "usd",
            "status": "succeeded",
        }
        assert effect.verification_status == "confirmed"
        assert charge(amount_cents=500)["stripe_id"] == "pi_1"  # replayed, not re-run
    assert len(stripe.intents) == 1


def test_e2e_stripe_mature_miss_rearms_and_the_key_backstop_prevents_a_double_charge(oo):
    # The charge went through, but the search index lags far past index_lag_seconds: the
    # miss is wrong. Re-arming is still safe because the retry carries the same key.
    stripe = FakeStripe(index_lag=10**6)
    script = ["after", ""]
    charge = stripe_charge(oo, stripe, script)
    prober = StripeProber(stripe, clock=lambda: time.time() + 600)
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: charge(amount_cents=500))
        report = reconcile(oo, "stripe.charge", prober)
        assert report.rearmed == [effect_id]
        assert oo.get(effect_id).state is EffectState.PLANNED
        assert "Backstop" in last_reason(oo, effect_id)
        assert charge(amount_cents=500) == {"stripe_id": "pi_1"}
    assert script == []  # the handler ran again...
    assert len(stripe.intents) == 1  # ...and Stripe answered it with the first charge
    assert oo.get(effect_id).state is EffectState.COMMITTED


def test_e2e_stripe_young_miss_is_probed_again_not_sent_to_a_person(oo):
    stripe = FakeStripe()
    charge = stripe_charge(oo, stripe, ["before"])
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: charge(amount_cents=500))
    reconcile(oo, "stripe.charge", StripeProber(stripe))  # grace overridden to 0 < lag
    assert oo.get(effect_id).state is EffectState.UNKNOWN
    assert "young miss" in last_reason(oo, effect_id)
    assert oo.journal(effect_id)[-1].action == "reprobe"


def test_e2e_stripe_outage_is_journaled_as_a_probe_error(oo):
    charge = stripe_charge(oo, FakeStripe(), ["after"])
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: charge(amount_cents=500))
    reconcile(oo, "stripe.charge", StripeProber(Raising(TimeoutError("stripe down"))))
    assert "ProbeTransientError" in last_reason(oo, effect_id)
    assert "stripe down" in last_reason(oo, effect_id)


def test_e2e_stripe_outage_waits_for_a_reprobe_instead_of_a_person(oo):
    charge = stripe_charge(oo, FakeStripe(), ["after"])
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: charge(amount_cents=500))
    report = reconcile(oo, "stripe.charge", StripeProber(Raising(TimeoutError("stripe down"))))
    assert report.escalated == []
    assert oo.get(effect_id).state is EffectState.UNKNOWN
    assert "stripe down" in last_reason(oo, effect_id)


def github_create_pr(oo: OpenOnce, github: FakeGitHub, record: bool) -> Callable[..., Any]:
    @oo.effect(tool="github.create_pr", idempotency_fields=["owner", "repo", "head"])
    def create_pr(owner: str, repo: str, head: str, title: str) -> dict[str, Any]:
        if record:
            github.create_pr(owner, repo, head)
        raise TimeoutError("read timed out")

    return create_pr


def test_e2e_github_pr_that_happened_commits_with_the_receipt(oo):
    github = FakeGitHub(pull(7, "other-branch"))
    create_pr = github_create_pr(oo, github, record=True)
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: create_pr(**PR_ARGS))
    reconcile(oo, "github.create_pr", GitHubPullRequestProber(github))
    effect = oo.get(effect_id)
    assert effect.state is EffectState.COMMITTED
    assert effect.result == {
        "number": 101,
        "head": "fix-login",
        "url": "https://github.com/acme/api/pull/101",
    }


def test_e2e_github_miss_rearms(oo):
    github = FakeGitHub()
    create_pr = github_create_pr(oo, github, record=False)
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: create_pr(**PR_ARGS))
    report = reconcile(oo, "github.create_pr", GitHubPullRequestProber(github))
    assert report.rearmed == [effect_id]
    assert oo.get(effect_id).state is EffectState.PLANNED


def test_e2e_github_unrelated_prs_go_to_a_person(oo):
    github = FakeGitHub(pull(7, "other-branch"), ignores_filter=True)
    create_pr = github_create_pr(oo, github, record=False)
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: create_pr(**PR_ARGS))
    reconcile(oo, "github.create_pr", GitHubPullRequestProber(github))
    assert oo.get(effect_id).state is EffectState.HUMAN_REVIEW
    assert "suspicious read" in last_reason(oo, effect_id)


def email_send(oo: OpenOnce, store: FakeSentStore, record: bool) -> Callable[..., Any]:
    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    def send(to: str, subject: str) -> dict[str, Any]:
        if record:
            store.send(message_id_for(current_effect().provider_key, DOMAIN))
        raise TimeoutError("read timed out")

    return send


@pytest.mark.parametrize("authoritative", [True, False])
def test_e2e_email_that_was_sent_commits_with_the_message_id(oo, authoritative):
    store = FakeSentStore()
    send = email_send(oo, store, record=True)
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: send(to="a@b.c", subject="hi"))
    prober = EmailMessageIdProber(store, authoritative=authoritative, domain=DOMAIN)
    reconcile(oo, "email.send", prober, prober.capability)
    effect = oo.get(effect_id)
    assert effect.state is EffectState.COMMITTED
    assert effect.result == {
        "message_id": message_id_for(effect.provider_key, DOMAIN),
        "store_id": "m1",
    }


def test_e2e_email_provider_api_miss_rearms(oo):
    send = email_send(oo, FakeSentStore(), record=False)
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: send(to="a@b.c", subject="hi"))
    prober = email_prober(FakeSentStore(), True, clock=lambda: time.time() + 600)
    reconcile(oo, "email.send", prober, "email_provider_api")
    assert oo.get(effect_id).state is EffectState.PLANNED


def test_e2e_email_smtp_miss_goes_to_a_person(oo):
    send = email_send(oo, FakeSentStore(), record=False)
    with oo.scope("run-1"):
        effect_id = timed_out(lambda: send(to="a@b.c", subject="hi"))
    prober = email_prober(FakeSentStore(), False, clock=lambda: time.time() + 600)
    reconcile(oo, "email.send", prober, "email_smtp")
    assert oo.get(effect_id).state is EffectState.HUMAN_REVIEW
    assert "bare SMTP" in last_reason(oo, effect_id)
