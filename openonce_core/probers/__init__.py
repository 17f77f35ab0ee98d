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
standard-library HTTP or IMAP clients. Every prober is read-only, turns any error or
malformed answer into INCONCLUSIVE ("could not verify" is not "did not happen"), and
binds its decisive results to the effect: the provider key, or for GitHub the natural
key returned by ``reference_for``.
"""

from __future__ import annotations

from .email import (
    EmailMessageIdProber,
    ImapSentFolder,
    MailStoreReadError,
    SentMailClient,
    message_id_for,
)
from .github import GitHubPullRequestProber, GitHubReadError, GitHubRestClient, PullRequestClient
from .stripe import (
    StripeProber,
    StripeReadError,
    StripeRestClient,
    StripeSearchClient,
    effect_metadata,
)

__all__ = [
    "EmailMessageIdProber",
    "GitHubPullRequestProber",
    "GitHubReadError",
    "GitHubRestClient",
    "ImapSentFolder",
    "MailStoreReadError",
    "PullRequestClient",
    "SentMailClient",
    "StripeProber",
    "StripeReadError",
    "StripeRestClient",
    "StripeSearchClient",
    "effect_metadata",
    "message_id_for",
]
