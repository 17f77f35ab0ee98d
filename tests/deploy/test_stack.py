"""The stack as deployed, end to end, following the README's production section.

A wheel is built from the checkout and installed with its ``server`` extra and
``deploy/constraints.txt`` into a fresh venv. From a folder outside the checkout (the
checkout is not importable there), with production settings, it runs the commands of
docker-compose.yml — read from the file, with only the listening address and beat's
schedule file moved to this machine's free ports and a temporary folder — against a
fresh Postgres database and an empty Redis database: migrate, collectstatic (the
Dockerfile's step), gunicorn, a Celery worker and beat, and Caddy with deploy/Caddyfile
terminating TLS in front. Chromium (Debian's, via Playwright) then signs in on the styled
page, approves a refund and resolves an UNKNOWN charge; an agent in this process made
both effects with ``openonce_core`` directly and counts its provider's calls.

Docker cannot run here; everything else is the real thing: real sockets, real TLS with
Caddy's local CA (urllib verifies against it), real processes stopped with SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import Browser, Page, expect

from openonce_core import (
    ApprovalPending,
    OpenOnce,
    OutcomeUnknownError,
    require_approval_for,
)
from openonce_core.stores.postgres import PostgresStore
from tests.support.browser import launch, screenshot, sign_in_with
from tests.support.caddy import caddy_version, for_caddy
from tests.support.daemon import create_database, drop_database, pick_redis_db

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "openonce",
    "openonce_core",
    "openonce_site",
    "console",
    "reconciler",
    "notifications",
    "ledger",
)
CADDY = "/usr/bin/caddy"
PASSWORD = "a long and unguessable passphrase"
CONFIRM_TIMEOUT = 30_000  # ms: actions, navigations and expect() on a loaded machine

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def dockerfile_collectstatic() -> list[str]:
    """The command the Dockerfile runs to collect static files."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    match = re.search(r"(django-admin collectstatic[^&\n]*)", text)
    assert match, "the Dockerfile collects static files with django-admin"
    return shlex.split(match.group(1))


def replace_arg(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with the value after ``option`` replaced (and nothing else changed)."""
    index = argv.index(option)
    return [*argv[: index + 1], value, *argv[index + 2 :]]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self, grace: float) -> int | None:
        """SIGTERM to the main process only, as ``docker stop`` does; SIGKILL to the
        group if it is not gone within ``grace``."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        code = self.popen.poll()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        return code


@dataclass
class Stack:
    tmp: Path
    venv: Path
    srv: Path
    wheel: Path
    env: dict[str, str]
    dsn: str
    web_port: int
    https_port: int
    http_port: int
    ca: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(self, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=self.srv, env={**self.env, **env},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    def start(self, name: str, argv: list[str], **env: str) -> Proc:
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                argv, cwd=self.srv, env={**self.env, **env}, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        proc = self.procs[name] = Proc(name, popen, log)
        return proc

    @property
    def url(self) -> str:
        return f"https://localhost:{self.https_port}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def get(
        self, url: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, headers=headers or {})
        context = self.tls() if url.startswith("https:") else None
        opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=context), _NoRedirect()
        )
        try:
            with opener.open(request, timeout=15) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def wait_for(what: str, check: Any, deadline: float, procs: list[Proc]) -> Any:
    """Poll ``check`` until it returns something truthy; fail with the processes' logs
    if one died or the deadline passed."""
    end = time.monotonic() + deadline
    last: Any = None
    while time.monotonic() < end:
        for proc in procs:
            if not proc.alive():
                pytest.fail(
                    f"{proc.name} exited while waiting for {what}:\n{proc.output()[-3000:]}"
                )
        with contextlib.suppress(OSError):
            last = check()
            if last:
                return last
        time.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.output()[-2000:]}" for p in procs)
    pytest.fail(f"timed out waiting for {what} (last: {last!r})\n{logs}")


# -- building and installing ---------------------------------------------------------------


def build_wheel(dist: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dist),
         str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = dist.glob("openonce-*.whl")
    return wheel


def install(venv: Path, wheel: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--constraint",
         str(ROOT / "deploy" / "constraints.txt"), f"{wheel}[server]"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    wheel = build_wheel(tmp / "dist")
    venv = tmp / "venv"
    install(venv, wheel)
    srv = tmp / "srv"  # the deployment's own folder, outside the checkout
    srv.mkdir()
    db_name, dsn = create_database("oo_stack_")
    _, broker = pick_redis_db()
    web_port, https_port, http_port = free_port(), free_port(), free_port()
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENONCE_", "DJANGO_", "PYTHON", "VIRTUAL_ENV"))
    }
    env = {
        **base,
        "PATH": f"{venv / 'bin'}:{base['PATH']}",
        "HOME": str(tmp / "home"),
        "XDG_DATA_HOME": str(tmp / "xdg-data"),
        "XDG_CONFIG_HOME": str(tmp / "xdg-config"),
        # The README's variables, as docker-compose.yml sets them.
        "DJANGO_SETTINGS_MODULE": "openonce_site.settings.production",
        "OPENONCE_DB_HOST": "127.0.0.1",
        "OPENONCE_DB_PORT": "5432",
        "OPENONCE_DB_NAME": db_name,
        "OPENONCE_DB_USER": "root",
        "OPENONCE_DB_PASSWORD": "p/a#s@s:w",  # trust auth ignores it; it must still parse
        "OPENONCE_BROKER_URL": broker,
        "OPENONCE_SECRET_KEY": secrets.token_urlsafe(64),
        "OPENONCE_SECRET_PEPPER": secrets.token_urlsafe(48),
        "OPENONCE_TLS": "proxy",
        "OPENONCE_ALLOWED_HOSTS": "localhost",
        "OPENONCE_STATE_DIR": str(srv),
        "OPENONCE_SWEEP_INTERVAL": "1",
        # The UNKNOWN charge stays UNKNOWN for the operator: no prober, long grace.
        "OPENONCE_GRACE_SECONDS": "3600",
    }
    state = Stack(
        tmp, venv, srv, wheel, env, dsn, web_port, https_port, http_port,
        ca=tmp / "xdg-data" / "caddy" / "pki" / "authorities" / "local" / "root.crt",
    )  # fmt: skip
    try:
        yield state
    finally:
        for proc in reversed(list(state.procs.values())):
            proc.terminate(grace=15)
        drop_database(db_name)


@pytest.fixture(scope="module")
def running(stack: Stack) -> Stack:
    """migrate, collectstatic, accounts, then every long-running service."""
    services = compose()["services"]
    migrate = stack.run(services["migrate"]["command"])
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    assert "Applying console.0001_initial... OK" in migrate.stdout
    collect = stack.run(dockerfile_collectstatic())
    assert collect.returncode == 0, collect.stderr
    assert (stack.srv / "static" / "staticfiles.json").is_file()  # hashed names
    for role in ("approver", "operator"):
        made = stack.run(["django-admin", "create_operator", role, "--role", role,
                          "--password", PASSWORD])  # fmt: skip
        assert made.returncode == 0, made.stderr

    web = stack.start(
        "web", replace_arg(services["web"]["command"], "--bind", f"127.0.0.1:{stack.web_port}")
    )
    worker = stack.start("worker", services["worker"]["command"])
    beat = stack.start(
        "beat",
        replace_arg(services["beat"]["command"], "--schedule", str(stack.tmp / "beat-schedule")),
    )
    proxy_command = services["proxy"]["command"]
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in services["proxy"]["volumes"]
    # Debian's Caddy (2.6.2) spells the buffering directives its own way.
    caddyfile = stack.tmp / "Caddyfile"
    caddyfile.write_text(for_caddy((ROOT / "deploy" / "Caddyfile").read_text(), caddy_version()))
    proxy = stack.start(
        "proxy",
        [CADDY, *replace_arg(proxy_command, "--config", str(caddyfile))[1:]],
        OPENONCE_SITE_ADDRESS=f"localhost:{stack.https_port}",
        OPENONCE_HTTPS_PORT=str(stack.https_port),
        OPENONCE_HTTP_PORT=str(stack.http_port),
        OPENONCE_UPSTREAM=f"127.0.0.1:{stack.web_port}",
    )
    procs = [web, worker, beat, proxy]
    wait_for("Caddy's local CA", lambda: stack.ca.is_file(), 60, procs)

    def health() -> bool:
        status, _, body = stack.get(f"{stack.url}/health/")
        return status == 200 and json.loads(body)["healthy"]

    wait_for("a green /health/ through the proxy", health, 90, procs)
    return stack


# -- the wheel -------------------------------------------------------------------------------


def test_the_wheel_holds_every_module_template_and_static_file(stack: Stack) -> None:
    names = set(zipfile.ZipFile(stack.wheel).namelist())
    expected = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    missing = expected - names
    assert not missing, f"add these packages to pyproject's [tool.setuptools] packages: {missing}"
    templates = {str(p.relative_to(ROOT)) for p in (ROOT / "templates").rglob("*.html")}
    assert {f"openonce_site/{t}" for t in templates} <= names
    static = {str(p.relative_to(ROOT)) for p in (ROOT / "console" / "static").rglob("*.*")}
    assert static and static <= names
    assert not any(n.startswith(("tests/", "examples/", "templates/")) for n in names)


def test_the_venv_runs_the_installed_package_not_the_checkout(stack: Stack) -> None:
    done = stack.run([stack.python, "-c", "import openonce_site, console, openonce_core;"
                      "print(openonce_site.__file__); print(console.__file__)"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    for line in done.stdout.split():
        assert line.startswith(str(stack.venv)) and "site-packages" in line
    wheel = zipfile.ZipFile(stack.wheel)
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith("METADATA"))).decode()
    assert "License-Expression: MIT" in metadata  # PEP 639, hence setuptools>=77


# -- the deployment ------------------------------------------------------------------------


def test_check_deploy_is_clean_with_these_settings(running: Stack) -> None:
    done = running.run(["django-admin", "check", "--deploy", "--fail-level", "WARNING"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_state_lives_in_the_deployments_folder_never_in_site_packages(running: Stack) -> None:
    code = ("from django.conf import settings; import django; django.setup();"
            "print(settings.STATIC_ROOT); print(settings.TEMPLATES[0]['DIRS'][0])")  # fmt: skip
    done = running.run([running.python, "-c", code])
    assert done.returncode == 0, done.stderr
    static_root, templates = done.stdout.split()
    assert static_root == str(running.srv / "static")
    assert templates.startswith(str(running.venv)) and templates.endswith("openonce_site/templates")
    assert not list(running.venv.rglob("*.db"))


def test_the_compose_healthchecks_pass(running: Stack) -> None:
    services = compose()["services"]
    check = services["web"]["healthcheck"]["test"]
    assert check[0] == "CMD"
    done = running.run(
        check[1:], OPENONCE_HEALTHCHECK_URL=f"http://127.0.0.1:{running.web_port}/health/"
    )
    assert done.returncode == 0, done.stderr
    assert "answered 200" in done.stdout
    # The same check against a server that does not know the Host it sends fails.
    refused = running.run(
        check[1:],
        OPENONCE_HEALTHCHECK_URL=f"http://127.0.0.1:{running.web_port}/health/",
        OPENONCE_ALLOWED_HOSTS="console.example",
    )
    assert refused.returncode == 1 and "answered 400" in refused.stderr
    pg = services["postgres"]["healthcheck"]["test"]
    assert pg[:2] == ["CMD", "pg_isready"] and "--host" in pg
    assert running.run(pg[1:]).returncode == 0  # over TCP, against the running server


def test_a_bad_host_gets_a_plain_400_with_no_settings_in_it(running: Stack) -> None:
    status, _, body = running.get(
        f"http://127.0.0.1:{running.web_port}/", headers={"Host": "evil.example"}
    )
    assert status == 400
    text = body.decode()
    assert "DATABASES" not in text and "Traceback" not in text and "redis://" not in text


def test_http_is_redirected_to_https_by_the_proxy(running: Stack) -> None:
    status, headers, _ = running.get(f"http://localhost:{running.http_port}/login/")
    assert status in (301, 308)
    # In compose the ports are 80 and 443, so the target needs none; on the test's free
    # ports Caddy 2.6 still names none, hence only the scheme, host and path are checked.
    assert re.fullmatch(r"https://localhost(:\d+)?/login/", headers["Location"])


def test_security_headers_through_the_proxy(running: Stack) -> None:
    status, headers, _ = running.get(f"{running.url}/login/")
    assert status == 200
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "camera=()" in headers["Permissions-Policy"]
    assert headers["Strict-Transport-Security"].startswith("max-age=31536000")
    assert headers["X-Frame-Options"] == "DENY"
    assert "Secure" in headers["Set-Cookie"] and "csrftoken" in headers["Set-Cookie"]


def test_static_files_are_hashed_compressed_and_typed(running: Stack) -> None:
    status, _, body = running.get(f"{running.url}/login/")
    page = body.decode()
    css = re.search(r'href="(/static/console/console\.[0-9a-f]{12}\.css)"', page)
    js = re.search(r'src="(/static/console/htmx\.min\.[0-9a-f]{12}\.js)"', page)
    assert css and js, "the page links hashed file names"
    for path, kind in ((css.group(1), "text/css"), (js.group(1), "text/javascript")):
        status, headers, content = running.get(f"{running.url}{path}")
        assert status == 200 and headers["Content-Type"].startswith(kind)
        assert content
        # Served by gunicorn itself (WhiteNoise), compressed and cached for good.
        status, headers, _ = running.get(
            f"http://127.0.0.1:{running.web_port}{path}",
            headers={"Accept-Encoding": "gzip", "Host": "localhost", "X-Forwarded-Proto": "https"},
        )
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert "immutable" in headers["Cache-Control"]


# -- a person at the console -----------------------------------------------------------------


class Agent:
    """An agent process on the deployed ledger, with a provider that counts its calls."""

    def __init__(self, dsn: str) -> None:
        self.oo = OpenOnce(
            PostgresStore(dsn, max_size=2), policy=require_approval_for(["stripe.refund"])
        )
        self.calls: dict[str, int] = {"refund": 0, "charge": 0}
        self.refund = self.oo.effect(
            self._refund, tool="stripe.refund", idempotency_key=lambda charge, **_: f"re-{charge}"
        )
        self.charge = self.oo.effect(
            self._charge, tool="stripe.charge", idempotency_key=lambda order, **_: f"ch-{order}"
        )

    def _refund(self, charge: str, amount: int) -> dict[str, Any]:
        self.calls["refund"] += 1
        return {"stripe_id": f"re_{charge}", "amount": amount}

    def _charge(self, order: str, amount: int) -> dict[str, Any]:
        self.calls["charge"] += 1
        raise TimeoutError("read timed out after the request was sent")


@pytest.fixture
def agent(running: Stack) -> Iterator[Agent]:
    agent = Agent(running.dsn)
    yield agent
    agent.oo.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    with launch() as browser:
        yield browser


@pytest.fixture
def page(browser: Browser, running: Stack) -> Iterator[Page]:
    # Caddy's local CA is not in Chromium's store; urllib above verifies against it.
    context = browser.new_context(
        base_url=running.url, ignore_https_errors=True, viewport={"width": 1280, "height": 900}
    )
    context.set_default_timeout(CONFIRM_TIMEOUT)
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"uncaught: {exc}"))
    page.on(
        "console",
        lambda m: (
            problems.append(m.text)
            if m.type == "error" and "Failed to load resource" not in m.text  # favicon.ico
            else None
        ),
    )
    yield page
    context.close()
    assert problems == [], "the browser reported errors (a CSP violation shows up here)"


def sign_in(page: Page, username: str) -> None:
    sign_in_with(page, username, PASSWORD)


def test_the_sign_in_page_is_styled(page: Page) -> None:
    page.goto("/login/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=CONFIRM_TIMEOUT)
    body = page.evaluate("getComputedStyle(document.body).backgroundColor")
    card = page.evaluate("getComputedStyle(document.querySelector('.signin')).maxWidth")
    assert (body, card) == ("rgb(246, 247, 249)", "380px")  # console.css, applied
    htmx = page.evaluate("typeof window.htmx")
    assert htmx == "object"  # the script loaded and ran under the CSP
    screenshot(page, "deployed-sign-in.png")


def test_approving_a_refund_and_resolving_an_unknown_on_the_deployed_console(
    page: Page, agent: Agent
) -> None:
    with pytest.raises(ApprovalPending) as pending:
        agent.refund(charge="ch_d1", amount=1200)
    refund_id = pending.value.effect_id
    with pytest.raises(OutcomeUnknownError) as unknown:
        agent.charge(order="o-d1", amount=900)
    charge_id = unknown.value.effect_id
    assert agent.calls == {"refund": 0, "charge": 1}

    sign_in(page, "approver")
    page.goto(f"/effects/{refund_id}/")
    expect(page.locator("#effect > header .state")).to_have_attribute(
        "data-state", "requires_approval", timeout=CONFIRM_TIMEOUT
    )
    form = page.locator("#action-approve")
    form.locator("[name=reason]").fill("customer called; refund is due")
    form.locator("input[name=confirm]").check()
    form.get_by_role("button", name="Approve").click()
    expect(page.locator("#effect > header .state")).to_have_attribute(
        "data-state", "approved", timeout=CONFIRM_TIMEOUT
    )
    screenshot(page, "deployed-refund-approved.png")
    last = agent.oo.journal(refund_id)[-1]
    assert (last.actor, last.reason) == ("operator:approver", "customer called; refund is due")
    # The agent's retry runs the refund now, once.
    receipt = {"stripe_id": "re_ch_d1", "amount": 1200}
    assert agent.refund(charge="ch_d1", amount=1200) == receipt
    assert agent.refund(charge="ch_d1", amount=1200) == receipt
    assert agent.calls["refund"] == 1

    page.get_by_role("button", name="Sign out").click()
    sign_in(page, "operator")
    page.goto(f"/effects/{charge_id}/")
    expect(page.locator("#effect > header .state")).to_have_attribute(
        "data-state", "unknown", timeout=CONFIRM_TIMEOUT
    )
    form = page.locator("#action-resolve-happened")
    form.locator("[name=receipt]").fill('{"stripe_id": "pi_d1"}')
    form.locator("[name=reason]").fill("pi_d1 is in the Stripe dashboard")
    form.locator("input[name=confirm]").check()
    form.get_by_role("button", name="Resolve: it happened").click()
    expect(page.locator("#effect > header .state")).to_have_attribute(
        "data-state", "committed", timeout=CONFIRM_TIMEOUT
    )
    screenshot(page, "deployed-unknown-resolved.png")
    effect = agent.oo.get(charge_id)
    assert (effect.state, effect.result) == ("committed", {"stripe_id": "pi_d1"})
    assert agent.oo.journal(charge_id)[-1].actor == "operator:operator"
    assert agent.charge(order="o-d1", amount=900) == {"stripe_id": "pi_d1"}
    assert agent.calls["charge"] == 1  # replayed, not charged again

    page.goto("/reconciler/")
    expect(page.locator("body")).to_contain_text("healthy", timeout=CONFIRM_TIMEOUT)


def test_sign_in_is_throttled_on_the_deployed_console(running: Stack) -> None:
    """Through the proxy: the address Caddy saw is counted, whatever X-Forwarded-For the
    client sends; after five failures even the right password gets 429."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=running.tls()),
        urllib.request.HTTPCookieProcessor(),
        _NoRedirect(),
    )

    def post(username: str, password: str) -> int:
        with opener.open(f"{running.url}/login/", timeout=15) as r:
            token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', r.read())
        assert token
        data = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)}
        ).encode()
        request = urllib.request.Request(
            f"{running.url}/login/", data=data,
            headers={"Referer": f"{running.url}/login/", "X-Forwarded-For": secrets.token_hex(4)},
        )  # fmt: skip
        try:
            with opener.open(request, timeout=15) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code

    answers = [post("approver", f"wrong password number {n}") for n in range(6)]
    assert answers == [200, 200, 200, 200, 429, 429]
    assert post("approver", PASSWORD) == 429


# -- stopping --------------------------------------------------------------------------------


def test_services_stop_gracefully_on_sigterm(running: Stack) -> None:
    services = compose()["services"]
    assert services["worker"]["stop_signal"] == "SIGTERM"
    grace = {name: services[name].get("stop_grace_period", "10s") for name in ("web", "worker")}
    assert grace == {"web": "35s", "worker": "310s"}
    worker = running.procs["worker"]
    assert worker.terminate(grace=60) == 0, worker.output()[-2000:]
    assert "Warm shutdown" in worker.output() or "warm shutdown" in worker.output().lower()
    web = running.procs["web"]
    assert web.terminate(grace=35) == 0, web.output()[-2000:]
    assert "Shutting down: Master" in web.output()


def test_the_constraints_pin_everything_the_server_extra_installs(stack: Stack) -> None:
    """The image is reproducible only if deploy/constraints.txt pins every package."""
    frozen = stack.run([stack.python, "-m", "pip", "freeze", "--exclude", "openonce"])
    installed = {line.split("==")[0].lower() for line in frozen.stdout.split() if "==" in line}
    pins = {
        line.split("==")[0].lower()
        for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert installed and installed <= pins, f"unpinned: {sorted(installed - pins)}"


def test_the_readme_production_section_gives_the_commands_this_test_runs() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Running it in production") : text.index("## Measuring")]
    lines = " ".join(
        line.split("  #")[0].strip()
        for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)
        for line in block.replace("\\\n", " ").splitlines()
    )
    lines = re.sub(r"\s+", " ", lines)
    services = compose()["services"]
    commands = [services[name]["command"] for name in ("migrate", "web", "worker", "beat", "proxy")]
    commands[-1] = replace_arg(commands[-1], "--config", "deploy/Caddyfile")
    # Compose binds 0.0.0.0 inside its container; on a host the README binds loopback.
    commands[1] = replace_arg(commands[1], "--bind", "127.0.0.1:8000")
    commands += [
        dockerfile_collectstatic(),
        ["django-admin", "check", "--deploy"],
        ["django-admin", "create_operator"],
        services["web"]["healthcheck"]["test"][1:],
        ["pip", "install", "--constraint", "deploy/constraints.txt"],
        ["export", "DJANGO_SETTINGS_MODULE=openonce_site.settings.production"],
        ["export", "OPENONCE_TLS=proxy"],
    ]
    for argv in commands:
        assert " ".join(argv) in lines, f"the README does not give: {' '.join(argv)}"
