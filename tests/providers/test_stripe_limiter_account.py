"""Each Stripe key spends its own budget: the client's shared limiter is named by a digest
of (API base, key, Connect account), so two keys in one process (or, through the daemon's
Redis limiter, in many) do not slow each other down, one key's clients share one bucket,
and the key itself never becomes a limiter's name (names show up in Redis and in logs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openonce_core.probers import RateLimiter, StripeRestClient, set_limiter_factory

KEY_A = "sk_live_" + "a1" * 12
KEY_B = "sk_live_" + "b2" * 12


@pytest.fixture
def accounts() -> Iterator[list[str]]:
    """Every account a shared limiter is built for, as the daemon's factory would see it."""
    seen: list[str] = []

    def factory(provider: str, rate: float, burst: int, account: str) -> RateLimiter:
        seen.append(account)
        return RateLimiter(provider, rate, burst)

    set_limiter_factory(factory)
    try:
        yield seen
    finally:
        set_limiter_factory(None)


def test_two_keys_get_two_limiters_and_one_key_one(accounts):
    a, again, b = StripeRestClient(KEY_A), StripeRestClient(KEY_A), StripeRestClient(KEY_B)
    assert a.limiter is again.limiter
    assert a.limiter is not b.limiter
    assert a.account == again.account != b.account
    assert len(accounts) == 2 and set(accounts) == {a.account, b.account}


def test_the_api_base_and_the_connect_account_are_budgets_of_their_own(accounts):
    plain = StripeRestClient(KEY_A)
    other_base = StripeRestClient(KEY_A, base_url="http://127.0.0.1:9")
    connected = StripeRestClient(KEY_A, stripe_account="acct_123")
    assert len({plain.account, other_base.account, connected.account}) == 3
    assert len({id(plain.limiter), id(other_base.limiter), id(connected.limiter)}) == 3
    # A trailing slash is the same API: the same budget.
    slash = StripeRestClient(KEY_A, base_url="https://api.stripe.com/")
    assert slash.limiter is plain.limiter


def test_the_key_is_never_a_limiters_name(accounts):
    client = StripeRestClient(KEY_A, stripe_account="acct_123")
    for text in [*accounts, client.account, repr(client), repr(client.limiter)]:
        assert KEY_A not in text and KEY_A[8:] not in text, text
    assert client.account.startswith("key-") and len(client.account) == len("key-") + 16


def test_a_limiter_given_is_used_as_given():
    mine = RateLimiter("stripe", 5.0)
    assert StripeRestClient(KEY_A, limiter=mine).limiter is mine
