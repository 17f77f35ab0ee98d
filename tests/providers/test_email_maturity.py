"""A young miss in an authoritative sent store is asked again when it matures, on every
store, against the fake IMAP server's real TLS socket (tests/support/fake_imap.py): the
reconciler re-probes (UNKNOWN stays UNKNOWN, a ``reprobe`` line saying when) instead of
sending a person a message the store simply has not indexed yet; the prober reads the
reconciler's clock, not this host's; and the age counts from when the effect went UNKNOWN.

Time is the ledger's FakeClock, which is also the fake server's (its index lag)."""

from __future__ import annotations

import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

import openonce_core.probers.email as email_module
from openonce_core import EffectState, OpenOnce, OutcomeUnknownError, Store, current_effect
from openonce_core._probe import MATURITY_MARGIN_SECONDS, ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core.probers import EmailMessageIdProber, message_id_for
from openonce_core.testing import FakeClock
from tests.support.fake_imap import FakeImapServer
from tests.support.tls import LocalPKI, make_pki

S = EffectState
DOMAIN = "mail.example.com"
USER, PASSWORD = "prober@example.com", "app-password"
LAG = 120.0  # the sent store's index lag the prober assumes, and the fake's


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> FakeClock:
    """The ledger's clock; parametrized (indirect) with seconds from this host's clock."""
    offset = getattr(request, "param", None)
    return FakeClock() if offset is None else FakeClock(time.time() + offset)


@pytest.fixture
def oo(store: Store, clock: FakeClock) -> Iterator[OpenOnce]:
    client = OpenOnce(store, retry_delay=0, clock=clock)
    yield client
    client.close()


@pytest.fixture
def imap(pki: LocalPKI, clock: FakeClock) -> Iterator[FakeImapServer]:
    server = FakeImapServer(pki, username=USER, password=PASSWORD, index_lag=LAG, clock=clock.now)
    with server:
        yield server  # type: ignore[misc]


class Mailer:
    """An email tool whose handler hands the message to the provider ("after": the sent
    store files it, indexed LAG seconds later) or not ("before"), then times out."""

    def __init__(self, oo: OpenOnce, imap: FakeImapServer) -> None:
        self.oo, self.calls = oo, 0

        @oo.effect(tool="email.send", idempotency_key=lambda to, mode: to)
        def send(to: str, mode: str) -> dict[str, Any]:
            self.calls += 1
            if mode == "after":
                imap.add_sent(message_id_for(current_effect().provider_key, DOMAIN))
            raise TimeoutError("read timed out")

        self.send = send

    def unknown(self, to: str = "a@b.c", mode: str = "after") -> str:
        with pytest.raises(OutcomeUnknownError) as info:
            self.send(to, mode)
        return info.value.effect_id


@pytest.fixture
def mailer(oo: OpenOnce, imap: FakeImapServer) -> Mailer:
    return Mailer(oo, imap)


def imap_prober(imap: FakeImapServer, pki: LocalPKI) -> EmailMessageIdProber:
    return EmailMessageIdProber.from_imap(
        "localhost", USER, PASSWORD, authoritative=True, domain=DOMAIN, port=imap.port,
        timeout=5.0, ca_file=str(pki.ca_file), index_lag_seconds=LAG,
    )  # fmt: skip


class Wrapper:
    """A prober kept as ``inner`` by a wrapper (the daemon's InstrumentedProber)."""

    def __init__(self, inner: EmailMessageIdProber) -> None:
        self.inner = inner
        self.capability = inner.capability

    def probe(self, effect: Effect) -> ProbeResult:
        return self.inner.probe(effect)


@pytest.fixture
def make_rec(oo: OpenOnce) -> Iterator[Any]:
    made: list[Reconciler] = []

    def make(prober: Any, **options: Any) -> Reconciler:
        options.setdefault("owner", "sweeper-1")
        rec = Reconciler(oo, **options)
        made.append(rec)
        rec.register("email.send", prober, "email_provider_api")
        return rec

    yield make
    for rec in made:
        rec.close()


def searches(imap: FakeImapServer) -> int:
    return sum(" UID SEARCH " in f" {c.upper()} " for c in imap.commands)


def moves(oo: OpenOnce, effect_id: str) -> set[str]:
    return {str(j.to_state) for j in oo.journal(effect_id)}


# -- a young miss is asked again when it matures ------------------------------------------


def test_a_young_miss_is_reprobed_then_committed_when_the_store_indexes_it(
    mailer, imap, pki, make_rec, clock
):
    effect_id = mailer.unknown()
    rec = make_rec(imap_prober(imap, pki), grace_seconds=60)
    clock.advance(60)  # a 60 s grace with the store's 120 s index lag
    report = rec.run_once()
    assert report.retried == [effect_id] and report.escalated == []
    assert mailer.oo.get(effect_id).state == S.UNKNOWN
    line = mailer.oo.journal(effect_id)[-1]
    assert (line.action, line.from_state, line.to_state) == ("reprobe", S.UNKNOWN, S.UNKNOWN)
    assert "young miss" in line.reason and "asking again in 70s, at " in line.reason
    clock.advance(69)  # not yet: the store is not asked
    assert rec.run_once().resolved == 0 and searches(imap) == 1
    clock.advance(1)
    report = rec.run_once()
    assert report.committed == [effect_id]
    effect = mailer.oo.get(effect_id)
    assert effect.state == S.COMMITTED
    assert effect.result["message_id"] == message_id_for(effect.provider_key, DOMAIN)
    assert "human_review" not in moves(mailer.oo, effect_id)
    assert mailer.calls == 1


def test_a_young_miss_that_matures_as_a_miss_is_rearmed(mailer, imap, pki, make_rec, clock):
    effect_id = mailer.unknown(mode="before")  # the provider never took it
    rec = make_rec(imap_prober(imap, pki), grace_seconds=60)
    clock.advance(60)
    assert rec.run_once().retried == [effect_id]
    clock.advance(70)
    report = rec.run_once()
    assert report.rearmed == [effect_id]
    assert mailer.oo.get(effect_id).state == S.PLANNED
    assert "authoritative sent store has no message" in mailer.oo.journal(effect_id)[-1].reason
    assert "human_review" not in moves(mailer.oo, effect_id)


# -- the reconciler's clock, not this host's ------------------------------------------------


@pytest.mark.parametrize("clock", [-3600.0], indirect=True)  # this host is an hour ahead
@pytest.mark.parametrize("how", ["direct", "wrapped"])
def test_a_host_clock_ahead_does_not_make_a_young_miss_look_mature(
    mailer, imap, pki, make_rec, clock, how
):
    # By this host's clock the attempt ended an hour ago: a "mature miss" would re-arm an
    # email the provider has already taken, and the agent would send it twice.
    effect_id = mailer.unknown()
    prober = imap_prober(imap, pki)
    rec = make_rec(prober if how == "direct" else Wrapper(prober), grace_seconds=60)
    clock.advance(60)
    report = rec.run_once()
    assert report.retried == [effect_id] and report.rearmed == []
    clock.advance(70)
    assert rec.run_once().committed == [effect_id]
    lines = mailer.oo.journal(effect_id)
    assert not [j for j in lines if (j.from_state, j.to_state) == (S.UNKNOWN, S.PLANNED)]
    assert mailer.calls == 1


@pytest.mark.parametrize("clock", [3600.0], indirect=True)  # this host is an hour behind
@pytest.mark.parametrize("how", ["direct", "wrapped"])
def test_a_host_clock_behind_does_not_make_a_mature_miss_look_young(
    mailer, imap, pki, make_rec, clock, how
):
    effect_id = mailer.unknown(mode="before")
    prober = imap_prober(imap, pki)
    # The capability's grace, 120 s: the store's lag itself. On one clock: exactly mature.
    rec = make_rec(prober if how == "direct" else Wrapper(prober), grace_seconds=None)
    clock.advance(LAG)
    report = rec.run_once()
    assert report.rearmed == [effect_id] and report.escalated == []
    assert mailer.oo.get(effect_id).state == S.PLANNED


def test_an_unbound_prober_on_a_host_1s_behind_asks_again_after_the_margin(
    mailer, imap, pki, make_rec, clock, monkeypatch
):
    # A bare function around the prober: nothing to bind, so it reads this host's
    # time.time(), 1 s behind the ledger's. The margin covers that: asked again, not a person.
    monkeypatch.setattr(email_module, "time", types.SimpleNamespace(time=lambda: clock.now() - 1))
    effect_id = mailer.unknown(mode="before")
    prober = imap_prober(imap, pki)
    rec = make_rec(lambda effect: prober.probe(effect), grace_seconds=None)
    clock.advance(LAG)
    report = rec.run_once()
    assert report.retried == [effect_id] and report.escalated == []
    assert f"asking again in {1 + MATURITY_MARGIN_SECONDS:.0f}s" in (
        mailer.oo.journal(effect_id)[-1].reason
    )
    clock.advance(1 + MATURITY_MARGIN_SECONDS)
    assert rec.run_once().rearmed == [effect_id]


def test_an_unbound_prober_on_a_host_an_hour_behind_waits_the_lag_not_the_hour(
    mailer, imap, pki, make_rec, clock, monkeypatch
):
    # This host's clock was stepped an hour back: the attempt reads as an hour in the
    # future. It cannot be younger than now, so the miss is asked again after the lag
    # and the margin (an hour's wait would outlast every drain and person's patience).
    monkeypatch.setattr(
        email_module, "time", types.SimpleNamespace(time=lambda: clock.now() - 3600)
    )
    effect_id = mailer.unknown(mode="before")
    prober = imap_prober(imap, pki)
    rec = make_rec(lambda effect: prober.probe(effect), grace_seconds=None)
    clock.advance(LAG)  # past the capability's grace: due
    report = rec.run_once()
    assert report.retried == [effect_id] and report.escalated == []
    reason = mailer.oo.journal(effect_id)[-1].reason
    assert f"asking again in {LAG + MATURITY_MARGIN_SECONDS:.0f}s" in reason, reason
    assert "clocks disagree" in reason


# -- age counts from when the effect went UNKNOWN -------------------------------------------


def test_a_failed_probe_does_not_make_a_mature_miss_young_again(mailer, imap, pki, make_rec, clock):
    # The re-probe after a busy server moves the effect (its updated_at); the miss's age
    # still counts from when the effect went UNKNOWN.
    effect_id = mailer.unknown(mode="before")
    rec = make_rec(imap_prober(imap, pki), grace_seconds=60)
    imap.login_refusal = "NO [UNAVAILABLE] Server busy, try again later"
    clock.advance(60)
    assert rec.run_once().retried == [effect_id]
    assert "busy" in mailer.oo.journal(effect_id)[-1].reason
    imap.login_refusal = None
    clock.advance(60)  # 120 s after it went UNKNOWN, 60 s after the failed probe
    report = rec.run_once()
    assert report.rearmed == [effect_id], mailer.oo.journal(effect_id)[-1].reason
    assert mailer.oo.get(effect_id).state == S.PLANNED


def test_a_young_miss_reprobed_twice_still_counts_from_the_first_time(
    mailer, imap, pki, make_rec, clock
):
    # Grace 10 s and a store that needs 120 s: every re-probe moves updated_at, but the
    # wait the prober asks for shrinks to the time left, not a fresh 120 s each time.
    effect_id = mailer.unknown(mode="before")
    rec = make_rec(imap_prober(imap, pki), grace_seconds=10)
    clock.advance(10)
    assert rec.run_once().retried == [effect_id]
    assert "asking again in 120s" in mailer.oo.journal(effect_id)[-1].reason
    clock.advance(120)
    assert rec.run_once().rearmed == [effect_id]
    assert searches(imap) == 2


# -- what never matures is a person's --------------------------------------------------------


def test_a_bare_smtp_miss_never_matures_and_goes_to_a_person(mailer, imap, pki, make_rec, clock):
    effect_id = mailer.unknown(mode="before")
    prober = EmailMessageIdProber.from_imap(
        "localhost", USER, PASSWORD, authoritative=False, domain=DOMAIN, port=imap.port,
        timeout=5.0, ca_file=str(pki.ca_file), index_lag_seconds=LAG,
    )  # fmt: skip
    rec = Reconciler(mailer.oo, grace_seconds=60, owner="sweeper-1")
    try:
        rec.register("email.send", prober, "email_smtp")
        clock.advance(60)
        assert rec.run_once().escalated == [effect_id]
    finally:
        rec.close()
    assert mailer.oo.get(effect_id).state == S.HUMAN_REVIEW
    assert "bare SMTP" in mailer.oo.journal(effect_id)[-1].reason


# -- the prober on its own -------------------------------------------------------------------


class EmptyStore:
    def find_sent(self, message_id: str) -> list[dict[str, Any]]:
        return []


def email_effect(at: float, **kw: Any) -> Effect:
    return Effect(
        id="eff_mail", tool="email.send", idempotency_key="k", scope=None,
        state=S.UNKNOWN, args={}, args_fingerprint="fp", provider_key="oo_" + "ab" * 20,
        attempt=1, created_at=at, updated_at=kw.pop("updated_at", at), **kw,
    )  # fmt: skip


def test_a_young_miss_says_when_it_matures():
    p = EmailMessageIdProber(EmptyStore(), authoritative=True, domain=DOMAIN, index_lag_seconds=90)
    p.bind_clock(lambda: 1_000.0 + 30)
    result = p.probe(email_effect(1_000.0))
    assert result.outcome is ProbeOutcome.INCONCLUSIVE and "young miss" in result.detail
    assert result.retry_after == pytest.approx(60 + MATURITY_MARGIN_SECONDS)
    p.bind_clock(lambda: 1_000.0 + 90)
    mature = p.probe(email_effect(1_000.0))
    assert mature.outcome is ProbeOutcome.NOT_HAPPENED and mature.retry_after is None


def test_an_explicit_clock_is_not_replaced_by_binding():
    p = EmailMessageIdProber(EmptyStore(), authoritative=True, domain=DOMAIN, clock=lambda: 2e3)
    p.bind_clock(lambda: 1_000.0)  # would say 0 s old: a young miss
    assert p.probe(email_effect(1_000.0)).outcome is ProbeOutcome.NOT_HAPPENED


def test_an_unbound_prober_reads_the_hosts_clock():
    p = EmailMessageIdProber(EmptyStore(), authoritative=True, domain=DOMAIN)
    result = p.probe(email_effect(time.time() - 30))
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert 85 <= (result.retry_after or 0) <= 90 + MATURITY_MARGIN_SECONDS + 1


def test_unknown_since_counts_only_for_the_attempt_it_names():
    p = EmailMessageIdProber(EmptyStore(), authoritative=True, domain=DOMAIN)
    p.bind_clock(lambda: 1_000.0 + 130)
    ours = {"unknown_since": {"attempt": 1, "at": 1_000.0}}
    mature = p.probe(email_effect(1_000.0, updated_at=1_125.0, verification_evidence=ours))
    assert mature.outcome is ProbeOutcome.NOT_HAPPENED
    stale = {"unknown_since": {"attempt": 0, "at": 1_000.0}}
    young = p.probe(email_effect(1_000.0, updated_at=1_125.0, verification_evidence=stale))
    assert young.outcome is ProbeOutcome.INCONCLUSIVE


@pytest.mark.parametrize("field", ["index_lag_seconds", "maturity_margin_seconds"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_lag_or_margin_that_is_not_a_time_is_refused(field, bad):
    # NaN would make every miss look mature at once (age < NaN is never true): a re-send.
    with pytest.raises(ValueError, match=field):
        EmailMessageIdProber(EmptyStore(), authoritative=True, domain=DOMAIN, **{field: bad})
