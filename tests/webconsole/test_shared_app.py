"""The shared app (``ledger``): the ledger's read models moved out of the console without
a person losing a permission, the migrations matching the models, and the daemon's
prober wrapper wired by a setting rather than imported by the shared app."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from django.apps import apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.management import create_contenttypes
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from test_console_views import Agent, fresh_ledger

from console import models as console_models
from console.roles import APPROVE, PERMISSIONS
from ledger import clients
from ledger.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("console", "0005_clear_lockout"), ("ledger", None)]  # before the shared app


def migrate(targets: list[tuple[str, str | None]]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def leaf_nodes() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def after_migrate() -> None:
    """What ``manage.py migrate`` does once the migrations ran: content types and the
    models' permissions, created where missing."""
    ContentType.objects.clear_cache()
    for label in ("ledger", "console"):
        config = apps.get_app_config(label)
        create_contenttypes(config, verbosity=0)
        create_permissions(config, verbosity=0)


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Agent]:
    yield from fresh_ledger()  # an empty ledger and the four roles; reset afterwards


@pytest.fixture
def before_shared_app(agent: Agent) -> Iterator[str]:
    """The test database as migrated before the shared app existed, holding an effect
    that waits for approval; migrated to the end again afterwards, whatever happened."""
    waiting = agent.pending()
    migrate(BEFORE)
    yield waiting
    migrate(leaf_nodes())


def test_a_database_from_before_the_shared_app_keeps_its_grants_and_rows(
    before_shared_app: str,
) -> None:
    waiting = before_shared_app
    approve = Permission.objects.get(content_type__app_label="console", codename="approve_effect")
    group = Group.objects.create(name="approvers from before")
    group.permissions.add(approve)
    person = User.objects.create_user("before", password="a long enough passphrase")
    person.groups.add(group)

    migrate(leaf_nodes())
    after_migrate()

    person = User.objects.get(pk=person.pk)  # no cached permissions
    assert person.has_perm(APPROVE)  # "console.approve_effect", as the views check it
    proxy = ContentType.objects.get_for_model(console_models.Effect, for_concrete_model=False)
    assert (proxy.app_label, proxy.model) == ("console", "effect")
    assert approve.content_type == proxy
    # The permissions were found where they were, not made again elsewhere.
    on_console = Permission.objects.filter(content_type=proxy)
    assert sorted(on_console.values_list("codename", flat=True)) == sorted(PERMISSIONS)
    assert not Permission.objects.filter(content_type__app_label="ledger").exists()
    # The ledger's rows were not touched: the read model still finds the effect.
    assert Effect.objects.get(id=waiting).state == "requires_approval"
    assert console_models.Effect.objects.get(id=waiting).tool == "stripe.refund"


def test_the_migrations_match_the_models() -> None:
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert out.getvalue().strip() == "No changes detected"


@pytest.fixture
def probers(settings) -> Iterator[None]:
    clients.reset()
    settings.OPENONCE_PROBERS = "tests.support.probers:PROBERS"
    yield
    clients.reset()


def registered(tool: str = "stripe.charge") -> str:
    (prober,) = clients.get_reconciler().probers[tool]
    return type(prober).__name__


def test_the_project_wires_the_daemons_prober_wrapper(probers) -> None:
    assert registered() == "InstrumentedProber"  # timed and logged for /metrics, health


def test_without_a_wrapper_the_probers_are_registered_as_given(probers, settings) -> None:
    settings.OPENONCE_PROBER_WRAPPER = None
    assert registered() == "ArgsProber"


def test_a_wrapper_that_cannot_be_imported_names_the_setting(probers, settings) -> None:
    settings.OPENONCE_PROBER_WRAPPER = "reconciler.probes.no_such_wrapper"
    with pytest.raises(ImproperlyConfigured, match="OPENONCE_PROBER_WRAPPER='reconciler"):
        clients.get_reconciler()
