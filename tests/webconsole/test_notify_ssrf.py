"""The notifier is no way into the operator's network: it never follows a redirect, sends
only over http(s), refuses this machine's and private networks' addresses unless allowed
(resolving the name once and connecting to the address it checked), keeps to the
allow-list, and never shows a receiver's answer on the effect's page.

Every receiver and every internal service here is a real socket on this machine; the
internal ones count what reaches them.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.urls import reverse
from test_console_views import Agent, client_for, fresh_ledger, html, make_users

from notifications import dispatch, senders
from notifications.config import channels
from notifications.models import Delivery
from tests.support.fake_http import ConnectionCounter, WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "s3cret-for-signing-webhooks"


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


@pytest.fixture
def internal() -> Iterator[WebhookReceiver]:
    """An internal HTTP service (an admin API, a metadata endpoint) that must never be
    reached through the notifier."""
    r = WebhookReceiver()
    r.status, r.reason, r.body = 403, "Forbidden", b"internal admin: token=abc"
    yield r
    r.close()


def hook(url: str, **more: Any) -> dict[str, Any]:
    return {"name": "hook", "kind": "webhook", "url": url, "secret": SECRET, **more}


def configure(*chans: dict[str, Any], **settings: Any) -> Any:
    return override_settings(
        OPENONCE_NOTIFY=json.dumps(list(chans)),
        OPENONCE_CONSOLE_URL="https://console.test",
        **settings,
    )


def announce(agent: Agent, *chans: dict[str, Any], **settings: Any) -> str:
    """An effect starts waiting for approval; one notifier tick tries to tell ``chans``."""
    with configure(*chans, **settings):
        dispatch.tick()
        effect_id = agent.pending()
        dispatch.tick()
    return effect_id


# -- redirects ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_its_target_sees_nothing(
    agent: Agent, users, receiver: WebhookReceiver, internal: WebhookReceiver, status: int
) -> None:
    receiver.status = status
    receiver.headers = {"Location": internal.url + "/admin/users?delete=all"}
    effect_id = announce(agent, hook(receiver.url + "/hook", allow_private=True))

    assert len(receiver.requests) == 1  # the receiver was asked once ...
    assert internal.requests == []  # ... and where it pointed was never asked
    [delivery] = Delivery.objects.all()
    assert delivery.status == "pending" and delivery.last_status == status
    assert "redirect refused, not followed" in delivery.last_error
    assert "127.0.0.1" in delivery.last_error  # the Location's host, for the operator
    assert "/admin" not in delivery.last_error

    page = html(client_for(users["viewer"]).get(reverse("effect", args=[effect_id])))
    assert "redirect refused, not followed" in page
    assert "Forbidden" not in page and "internal admin" not in page  # the target's answer


def test_a_redirect_to_ftp_reaches_no_ftp_server(agent: Agent, receiver: WebhookReceiver):
    ftp = ConnectionCounter()
    try:
        receiver.status = 302
        receiver.headers = {"Location": f"ftp://127.0.0.1:{ftp.port}/etc/passwd"}
        announce(agent, hook(receiver.url + "/hook", allow_private=True))
    finally:
        ftp.close()
    assert ftp.connections == 0
    [delivery] = Delivery.objects.all()
    assert "redirect refused, not followed" in delivery.last_error


def test_the_receivers_answer_never_reaches_the_page(
    agent: Agent, users, receiver: WebhookReceiver
) -> None:
    receiver.status, receiver.reason = 403, "Forbidden by db-admin.internal:5432 for root"
    receiver.body = b"<h1>internal stack trace: password=hunter2</h1>"
    effect_id = announce(agent, hook(receiver.url + "/hook", allow_private=True))

    [delivery] = Delivery.objects.all()
    assert delivery.last_error == "the receiver answered 403 Forbidden"
    page = html(client_for(users["viewer"]).get(reverse("effect", args=[effect_id])))
    assert "the receiver answered 403 Forbidden" in page
    assert "db-admin" not in page and "hunter2" not in page


def test_a_redirect_to_a_malformed_location_is_refused_all_the_same(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    receiver.status = 302
    receiver.headers = {"Location": "http://[::1/admin"}
    announce(agent, hook(receiver.url + "/hook", allow_private=True))
    [delivery] = Delivery.objects.all()
    assert delivery.last_error.endswith("redirect refused, not followed (to nowhere)")


def test_an_answer_that_is_not_http_is_not_quoted(agent: Agent) -> None:
    """A service that is not a web server answers something else; its words stay out."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    import threading

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"-ERR internal redis password is hunter2\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        announce(agent, hook(f"http://127.0.0.1:{port}/hook", allow_private=True))
    finally:
        server.close()
    [delivery] = Delivery.objects.all()
    assert "hunter2" not in delivery.last_error
    assert "not HTTP" in delivery.last_error


# -- schemes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example.com/x",
        "file:///etc/passwd",
        "gopher://hooks.example.com/",
        "HTTPS-x://hooks.example.com/",
        "https:///no-host",
        "https://hooks.example.com:99999/x",
        "https://hooks.example.com/a b",
        "https://hooks.example.com/\r\nX-Injected: 1",
        "http://[::1",
        "https://hooks.example.com/caf\u00e9",
    ],
)
def test_only_http_and_https_urls_with_a_host_are_accepted(url: str) -> None:
    with (
        configure(hook(url)),
        pytest.raises(ImproperlyConfigured, match=r"OPENONCE_NOTIFY\[0\]\.url"),
    ):
        channels()


# -- private and loopback destinations ----------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "[::1]",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # the cloud metadata service
        "100.64.0.1",
        "0.0.0.0",
        "[::]",
        "224.0.0.1",
        "[fe80::1]",
        "[fc00::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:169.254.169.254]",
        "[64:ff9b::a9fe:a9fe]",  # NAT64 for 169.254.169.254
        "[2002:7f00:1::]",  # 6to4 for 127.0.0.1
        "2130706433",  # 127.0.0.1 as one decimal number
        "0177.0.0.1",  # ... in octal
        "0x7f.1",
        "127.1",
        "0",
        "192.0.2.1",  # documentation: not a public address
    ],
)
def test_an_address_inside_is_refused_at_configuration(host: str) -> None:
    with (
        configure(hook(f"https://{host}/hook")),
        pytest.raises(ImproperlyConfigured, match="OPENONCE_NOTIFY_ALLOW_PRIVATE"),
    ):
        channels()
    with configure(hook(f"https://{host}/hook"), OPENONCE_NOTIFY_ALLOW_PRIVATE=True):
        assert [c.name for c in channels()] == ["hook"]
    with configure(hook(f"https://{host}/hook", allow_private=True)):
        assert [c.name for c in channels()] == ["hook"]


def test_a_public_address_is_accepted() -> None:
    with configure(
        hook("https://93.184.215.14/hook"), hook("https://[2606:4700::1]/x") | {"name": "v6"}
    ):
        assert [c.name for c in channels()] == ["hook", "v6"]


def test_a_name_that_resolves_inside_is_refused_when_sending(
    agent: Agent, users, receiver: WebhookReceiver
) -> None:
    """localhost is a name: it passes the configuration check and is refused once
    resolved, before anything is sent."""
    effect_id = announce(agent, hook(f"http://localhost:{receiver.port}/hook"))
    assert receiver.requests == []
    [delivery] = Delivery.objects.all()
    assert delivery.last_status is None
    assert "localhost resolves to" in delivery.last_error
    assert "a loopback address" in delivery.last_error
    page = html(client_for(users["viewer"]).get(reverse("effect", args=[effect_id])))
    assert "a loopback address" in page


def test_a_name_with_one_inside_address_among_public_ones_is_refused(
    agent: Agent, monkeypatch
) -> None:
    real = socket.getaddrinfo
    answers = {
        "mixed.test": ["93.184.215.14", "10.0.0.7"],
        "mapped.test": ["::ffff:169.254.169.254"],
    }

    def dns(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port))
                for a in answers[host]
            ]  # fmt: skip
        if host == "nowhere.test":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    announce(
        agent,
        hook("https://mixed.test/hook"),
        hook("https://mapped.test/hook", name="mapped"),
        hook("https://nowhere.test/hook", name="nowhere"),
    )
    errors = dict(Delivery.objects.values_list("channel", "last_error"))
    assert "mixed.test resolves to 10.0.0.7, a private address" in errors["hook"]
    assert "a link-local address" in errors["mapped"]
    assert "nowhere.test does not resolve" in errors["nowhere"]
    assert set(Delivery.objects.values_list("status", flat=True)) == {"pending"}


def test_allowing_private_destinations_delivers_to_them(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    announce(agent, hook(f"http://localhost:{receiver.port}/hook", allow_private=True))
    assert len(receiver.requests) == 1
    announce(
        agent,
        hook(f"http://localhost:{receiver.port}/hook", name="all"),
        OPENONCE_NOTIFY_ALLOW_PRIVATE=True,
    )
    assert len(receiver.requests) == 2


def test_allow_private_must_be_true_or_false() -> None:
    with (
        configure(hook("https://hooks.example.com/x", allow_private="yes")),
        pytest.raises(ImproperlyConfigured, match="allow_private"),
    ):
        channels()


def test_the_name_is_resolved_once_and_the_checked_address_is_used(
    agent: Agent, receiver: WebhookReceiver, monkeypatch
) -> None:
    """DNS rebinding: a name that answers a harmless address to the check and an inside
    one to the connection. The sender resolves once and connects to what it checked,
    keeping the name for the Host header."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def dns(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "hooks.rebind.test":
            lookups.append(host)
            if len(lookups) > 1:
                raise socket.gaierror(socket.EAI_NONAME, "a second lookup answers otherwise")
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    announce(agent, hook(f"http://hooks.rebind.test:{receiver.port}/hook", allow_private=True))
    assert lookups == ["hooks.rebind.test"]
    [request] = receiver.requests
    assert request["headers"]["host"] == f"hooks.rebind.test:{receiver.port}"


def test_over_https_the_certificate_is_checked_against_the_urls_name(
    agent: Agent, tmp_path, monkeypatch
) -> None:
    """The connection goes to the checked address, but TLS still names the URL's host:
    a certificate for localhost serves https://localhost; the same server reached under
    another name that resolves to it is refused, nothing sent."""
    import ssl

    from tests.support.tls import make_pki

    pki = make_pki(tmp_path, names=("localhost",))
    receiver = WebhookReceiver()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert_file, pki.key_file)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))  # the client trusts the test CA
    real = socket.getaddrinfo

    def dns(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "other.test" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    try:
        announce(agent, hook(f"https://localhost:{receiver.port}/hook", allow_private=True))
        assert len(receiver.requests) == 1
        [delivery] = Delivery.objects.all()
        assert delivery.status == "sent"
        chan = hook(f"https://other.test:{receiver.port}/hook", name="other", allow_private=True)
        announce(agent, chan)
        assert len(receiver.requests) == 1  # nothing more reached it
        other = Delivery.objects.get(channel="other")
        assert other.status == "pending" and "certificate" in other.last_error
    finally:
        receiver.close()


def test_an_ipv6_receiver_is_reached_when_allowed(agent: Agent) -> None:
    receiver = WebhookReceiver("::1")
    try:
        announce(agent, hook(receiver.url + "/hook", allow_private=True))
    finally:
        receiver.close()
    [request] = receiver.requests
    assert request["headers"]["host"] == f"[::1]:{receiver.port}"


# -- the allow-list -----------------------------------------------------------------------


def test_the_allow_list_refuses_every_other_host() -> None:
    allowed = {"OPENONCE_NOTIFY_ALLOWED_HOSTS": ["hooks.example.com", "*.slack.example"]}
    for url in (
        "https://hooks.example.com/x",
        "https://a.slack.example/x",
        "https://b.a.slack.example/",
    ):
        with configure(hook(url), **allowed):
            assert len(channels()) == 1, url
    for url in (
        "https://evil.example.com/x",
        "https://hooks.example.com.evil.test/x",
        "https://slack.example/x",  # *. names subdomains only
        "https://xslack.example/x",
    ):
        with (
            configure(hook(url), **allowed),
            pytest.raises(ImproperlyConfigured, match="OPENONCE_NOTIFY_ALLOWED_HOSTS"),
        ):
            channels()


def test_an_allowed_host_still_needs_allow_private_to_be_inside(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    chan = hook(f"http://localhost:{receiver.port}/hook")
    announce(agent, chan, OPENONCE_NOTIFY_ALLOWED_HOSTS=["localhost"])
    assert receiver.requests == []
    announce(
        agent,
        chan | {"name": "inside"},
        OPENONCE_NOTIFY_ALLOWED_HOSTS=["localhost"],
        OPENONCE_NOTIFY_ALLOW_PRIVATE=True,
    )
    assert len(receiver.requests) == 1


# -- credentials in a channel URL ---------------------------------------------------------


def test_credentials_in_a_channel_url_are_sent_but_never_shown(
    agent: Agent, users, receiver: WebhookReceiver
) -> None:
    url = receiver.url.replace("http://", "http://ops:pa%3Ass@") + "/hook"
    effect_id = announce(agent, hook(url, allow_private=True))
    [request] = receiver.requests
    assert request["headers"]["authorization"] == "Basic b3BzOnBhOnNz"  # ops:pa:ss
    [delivery] = Delivery.objects.all()
    assert "ops" not in delivery.destination and "pa%3Ass" not in delivery.destination
    page = html(client_for(users["viewer"]).get(reverse("effect", args=[effect_id])))
    assert "pa%3Ass" not in page and "ops:" not in page
    assert f"127.0.0.1:{receiver.port}" in page


def test_a_destination_recorded_with_credentials_before_is_masked_on_the_page(
    agent: Agent, users
) -> None:
    effect_id = agent.pending()
    Delivery.objects.create(
        effect_id=effect_id, journal_seq=1, event="requires_approval", tool="stripe.refund",
        channel="old", kind="webhook", destination="https://ops:hunter2@hooks.example.com/…",
        next_attempt_at=0.0, created_at=0.0,
    )  # fmt: skip
    page = html(client_for(users["viewer"]).get(reverse("effect", args=[effect_id])))
    assert "hunter2" not in page and "ops:" not in page
    assert "https://hooks.example.com/…" in page


# -- a receiver that answers one byte at a time -------------------------------------------


class Dripping:
    """A receiver that reads the request, then sends its answer's headers a byte every
    ``every`` seconds, never finishing: each read of the sender gets a byte in time, so
    only a deadline on the whole attempt stops it."""

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                drip = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 10_000
                for byte in drip:
                    if self.stop.wait(self.every):
                        break
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        break

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(5)


def test_a_receiver_dripping_its_answer_is_cut_off_at_the_attempts_deadline(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a deadline on the whole attempt, a receiver that keeps every read just
    # inside the socket timeout holds the notifier past its claim, and the message goes
    # out twice. The deadline is shortened here; the drip would last ~8 minutes.
    monkeypatch.setattr(senders, "ATTEMPT_SECONDS", 0.5)
    dripping = Dripping()
    try:
        announce(agent, hook(dripping.url + "/hook", allow_private=True))
    finally:
        dripping.close()
    [delivery] = Delivery.objects.all()
    assert delivery.status == "pending" and delivery.last_status is None
    assert "no complete answer within 0.5s" in delivery.last_error
