"""A provider's "you already did this" is evidence that the call happened, never a business
failure (issue 18, item 2).

* Stripe's ``IdempotencyError`` (HTTP 400, error type ``idempotency_error``) says a request
  with this Idempotency-Key already ran, or is running, at Stripe.
* GitHub's 422 "A pull request already exists for owner:branch." (a validation error whose
  message or code says it already exists) says the pull request is there, perhaps made by
  this very call's earlier attempt.

Both are UNKNOWN (then probed, or sent to a person), also when the tool declared the SDK's
whole error tree a business error. A plain 422 validation error stays FAILED.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import requests
import stripe

from openonce_core import Classifier, FailureClass, OpenOnce, OutcomeUnknownError, current_effect
from tests.core import test_classify_real_sdks as real_sdks
from tests.core.test_classify_real_sdks import (
    ANSWERED,
    Answer,
    caught,
    requests_post,
    stripe_error,
)

# The fake provider, the in-memory ledger and the stripe client pointed at a URL.
oo = real_sdks.oo
provider = real_sdks.provider
stripe_at = real_sdks.stripe_at

FAILED = FailureClass.FAILED
UNKNOWN = FailureClass.UNKNOWN

# What Stripe answers when an Idempotency-Key is reused with other parameters, or while the
# first request with it is still running.
IDEMPOTENCY_400 = Answer(
    400,
    {
        "error": {
            "type": "idempotency_error",
            "message": "Keys for idempotent requests can only be used with the same parameters"
            " they were first used with. Try using a key other than 'order-7' if you meant"
            " to execute a different request.",
        }
    },
    {"Request-Id": "req_test"},
)

PR_EXISTS_422 = Answer(
    422,
    {
        "message": "Validation Failed",
        "errors": [
            {
                "resource": "PullRequest",
                "code": "custom",
                "message": "A pull request already exists for octo:feature.",
            }
        ],
        "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
        "status": "422",
    },
)

# GitHub's documented validation code for a unique value that is taken (a label name...).
ALREADY_EXISTS_CODE_422 = Answer(
    422,
    {
        "message": "Validation Failed",
        "errors": [{"resource": "Label", "code": "already_exists", "field": "name"}],
    },
)

PLAIN_422 = Answer(
    422,
    {
        "message": "Validation Failed",
        "errors": [
            {
                "resource": "PullRequest",
                "code": "custom",
                "message": "No commits between main and feature",
            }
        ],
    },
)


def charge(idempotency_key: str = "order-7") -> Any:
    return stripe.PaymentIntent.create(
        amount=2_500, currency="usd", idempotency_key=idempotency_key
    )


def httpx_create_pr(url: str) -> Any:
    response = httpx.post(
        f"{url}/repos/octo/repo/pulls",
        json={"head": "feature", "base": "main", "title": "t"},
        timeout=ANSWERED,
    )
    return response.raise_for_status()


def requests_create_pr(url: str) -> Any:
    response = requests.post(
        f"{url}/repos/octo/repo/pulls",
        json={"head": "feature", "base": "main", "title": "t"},
        timeout=ANSWERED,
    )
    return response.raise_for_status()


CREATE_PR: dict[str, Callable[[str], Any]] = {
    "httpx": httpx_create_pr,
    "requests": requests_create_pr,
}


# -- Stripe -----------------------------------------------------------------------------------


def test_a_real_stripe_idempotency_error_is_unknown(provider, stripe_at):
    fake = provider(IDEMPOTENCY_400)
    stripe_at(fake.url)
    exc = caught(charge)
    assert type(exc) is stripe.IdempotencyError
    assert exc.http_status == 400
    verdict, why = Classifier().explain(exc)
    assert verdict is UNKNOWN, why
    assert "idempotency" in why.lower()
    assert "Keys for idempotent" not in why  # the reason never carries the message


@pytest.mark.parametrize(
    "business",
    [
        (stripe.StripeError,),
        (stripe.InvalidRequestError, stripe.IdempotencyError),
        ("stripe.StripeError",),
    ],
    ids=["StripeError", "specific", "by-name"],
)
def test_declaring_stripe_errors_business_does_not_make_it_failed(provider, stripe_at, business):
    fake = provider(IDEMPOTENCY_400)
    stripe_at(fake.url)
    exc = caught(charge)
    verdict, why = Classifier(business=business).explain(exc)
    assert verdict is UNKNOWN, why
    assert "declared a business error, but it may have run" in why


def test_an_ordinary_stripe_400_stays_failed(provider, stripe_at):
    fake = provider(stripe_error(400, "invalid_request_error", "parameter_missing"))
    stripe_at(fake.url)
    exc = caught(charge)
    assert type(exc) is stripe.InvalidRequestError
    assert Classifier().explain(exc)[0] is FAILED


@pytest.mark.parametrize("declared", [(), (stripe.StripeError,)], ids=["plain", "business_errors"])
def test_an_effect_parks_a_stripe_idempotency_error_unknown(oo, provider, stripe_at, declared):
    fake = provider(IDEMPOTENCY_400)
    stripe_at(fake.url)
    calls: list[str] = []

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order, business_errors=declared)
    def charge_order(order: str) -> dict[str, str]:
        calls.append(order)
        intent = stripe.PaymentIntent.create(
            amount=2_500, currency="usd", idempotency_key=current_effect().provider_key
        )
        return {"stripe_id": intent.id}

    with pytest.raises(OutcomeUnknownError) as parked:
        charge_order("order-7")
    assert type(parked.value.__cause__) is stripe.IdempotencyError
    assert oo.get(parked.value.effect_id).state == "unknown"
    assert oo.journal(parked.value.effect_id)[-1].to_state == "unknown"
    # Not replayed as "the provider said no", and not run again.
    with pytest.raises(OutcomeUnknownError):
        charge_order("order-7")
    assert calls == ["order-7"]
    assert len(fake.received) == 1


def test_an_effect_with_a_classifier_declaring_invalid_request_errors(provider, stripe_at):
    fake = provider(IDEMPOTENCY_400)
    stripe_at(fake.url)
    classifier = Classifier(business=(stripe.InvalidRequestError, stripe.IdempotencyError))
    with OpenOnce(":memory:", retry_delay=0, classifier=classifier) as ledger:

        @ledger.effect(tool="stripe.charge", idempotency_key=lambda order: order)
        def charge_order(order: str) -> None:
            charge(current_effect().provider_key)

        with pytest.raises(OutcomeUnknownError) as parked:
            charge_order("order-7")
        assert ledger.get(parked.value.effect_id).state == "unknown"


# -- GitHub 422 "already exists" ------------------------------------------------------------


@pytest.mark.parametrize("sdk", sorted(CREATE_PR))
@pytest.mark.parametrize("answer", [PR_EXISTS_422, ALREADY_EXISTS_CODE_422], ids=["pr", "code"])
def test_a_github_422_already_exists_is_unknown(provider, sdk, answer):
    fake = provider(answer)
    exc = caught(lambda: CREATE_PR[sdk](fake.url))
    verdict, why = Classifier().explain(exc)
    assert verdict is UNKNOWN, why
    assert "422" in why and "already exists" in why
    assert "octo:feature" not in why  # the reason never carries the message
    # A declaration of the client's status errors as business errors does not hide it.
    declared = Classifier(business=(type(exc),)).explain(exc)
    assert declared[0] is UNKNOWN, declared[1]


@pytest.mark.parametrize("sdk", sorted(CREATE_PR))
def test_a_plain_github_422_stays_failed(provider, sdk):
    fake = provider(PLAIN_422)
    exc = caught(lambda: CREATE_PR[sdk](fake.url))
    verdict, why = Classifier().explain(exc)
    assert verdict is FAILED, why
    assert " 422" in why


def test_a_422_body_that_is_not_json_stays_failed(provider):
    fake = provider(Answer(422, b"A pull request already exists", {"Content-Type": "text/plain"}))
    exc = caught(lambda: requests_post(fake.url))
    assert Classifier().explain(exc)[0] is FAILED


def test_an_effect_parks_a_github_pr_that_already_exists_unknown(oo, provider):
    fake = provider(PR_EXISTS_422)
    calls: list[str] = []

    @oo.effect(
        tool="github.create_pr",
        idempotency_key=lambda head: head,
        business_errors=(httpx.HTTPStatusError,),
    )
    def create_pr(head: str) -> None:
        calls.append(head)
        httpx_create_pr(fake.url)

    with pytest.raises(OutcomeUnknownError) as parked:
        create_pr("feature")
    assert type(parked.value.__cause__) is httpx.HTTPStatusError
    assert oo.get(parked.value.effect_id).state == "unknown"
    assert calls == ["feature"]
