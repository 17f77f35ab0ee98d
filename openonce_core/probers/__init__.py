"""Reference probers for the built-in provider capabilities, one per honesty tier.

=====================  ===================================  ==============================
capability             prober                               a miss (no match) is
=====================  ===================================  ==============================
``stripe``             :class:`StripeProber`                inconclusive inside the index
                                                            lag, then not-happened
``github_pr``          :class:`GitHubPullRequestProber`     not-happened (primary store)
``email_provider_api`` ``EmailMessageIdProber(authoritative=True)``   not-happened
``email_smtp``         ``EmailMessageIdProber(authoritative=False)``  inconclusive, forever
=====================  ===================================  ==============================

Each prober takes a small client protocol (one read method) so tests and unusual
deployments can bring their own; ``from_api_key`` / ``from_token`` / ``from_imap`` build
standard-library HTTP or IMAP clients. Every prober is read-only and binds its decisive
results to the effect: the provider key, or for GitHub the natural key returned by
``reference_for``.

When the provider cannot be asked, the probe raises instead of answering: a
``ProbeTransientError`` (429, 5xx, timeouts, refused connections; ``retry_after`` from
``Retry-After`` or a rate-limit reset) or a ``ProbeCredentialError`` (401, a permission
403, an untrusted certificate), so the reconciler can back off or mark the prober failing
rather than send the effect to a person. A malformed answer is INCONCLUSIVE ("could not
verify" is not "did not happen"). The HTTP clients share a :class:`RateLimiter` per
provider account (Stripe 18 reads/s, GitHub 1/s by default) that also stops every probe of
that provider while the provider asked us to wait. It is per process unless a shared one
is installed with :func:`set_limiter_factory` (the daemon's, in Redis, keeps N worker
processes at one rate together). The IMAP client opens at most ``max_connections`` (2)
connections per account at once in a process.

The GitHub and email probers also check a receipt a person gives:
``verify(effect, receipt) -> ProbeResult`` (HAPPENED only when the receipt names the
provider object that is this effect's by the probe's own rules, bound to the same provider
reference as a probe result; see each prober).
"""

from __future__ import annotations

from ._http import Limiter, RateLimiter, set_limiter_factory, shared_limiter
from .email import (
    EmailMessageIdProber,
    ImapSentFolder,
    MailStoreReadError,
    SentMailClient,
    message_id_for,
)
from .github import GitHubPullRequestProber, GitHubReadError, GitHubRestClient, PullRequestClient
from .stripe import (
    STRIPE_VERSION,
    StripeProber,
    StripeReadError,
    StripeRestClient,
    StripeSearchClient,
    effect_metadata,
)

__all__ = [
    "STRIPE_VERSION",
    "EmailMessageIdProber",
    "GitHubPullRequestProber",
    "GitHubReadError",
    "GitHubRestClient",
    "ImapSentFolder",
    "Limiter",
    "MailStoreReadError",
    "PullRequestClient",
    "RateLimiter",
    "SentMailClient",
    "StripeProber",
    "StripeReadError",
    "StripeRestClient",
    "StripeSearchClient",
    "effect_metadata",
    "message_id_for",
    "set_limiter_factory",
    "shared_limiter",
]
