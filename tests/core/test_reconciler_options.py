"""The Reconciler's options are written once, in ``ReconcilerOptions``: the constructor,
``build_reconciler``, the ``openonce reconcile`` flags and the site's settings all come
from its fields. Each test below walks every field, so a field added to the options that
one of the four does not take fails here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ledger.clients import reconciler_options
from openonce_core import OpenOnce, Reconciler, ReconcilerOptions
from openonce_core._reconciler_options import flag_name, setting_name
from openonce_core._wiring import build_reconciler
from openonce_core.cli import build_parser
from openonce_core.stores import InMemoryStore
from openonce_site.settings.base import reconciler_settings

FIELDS = dataclasses.fields(ReconcilerOptions)


def changed(option: dataclasses.Field[Any], folder: Path) -> Any:
    """A value of the field's kind that is not its default."""
    kind = option.metadata["kind"]
    if option.name == "conformance_file":
        path = folder / "conformance.json"
        path.write_text(json.dumps({"schema_version": 1, "capabilities": {}}))
        return str(path)
    if kind is bool:
        return True
    if kind is int:
        return option.default + 2
    if kind is float:
        return (option.default or 0.0) + 1.5
    return "tester"


@pytest.fixture
def values(tmp_path: Path) -> dict[str, Any]:
    return {option.name: changed(option, tmp_path) for option in FIELDS}


@pytest.fixture
def oo() -> OpenOnce:
    return OpenOnce(InMemoryStore())


def test_the_reconciler_takes_every_option_as_a_keyword_or_in_options(oo, values):
    by_keyword = Reconciler(oo, **values)
    by_options = Reconciler(oo, options=ReconcilerOptions(**values))
    assert by_keyword.options == by_options.options == ReconcilerOptions(**values)
    assert by_keyword.actor == "reconciler:tester"
    assert by_keyword.probe_timeout == 31.5 and by_keyword.young_reprobes == 22
    assert by_keyword.conformance is not None  # the gate read from conformance_file
    # A keyword overrides the options object it is given with.
    overridden = Reconciler(oo, options=ReconcilerOptions(**values), probe_retries=7)
    assert overridden.options == ReconcilerOptions(**{**values, "probe_retries": 7})


def test_build_reconciler_takes_every_option(oo, values):
    assert build_reconciler(oo, **values).options == ReconcilerOptions(**values)
    options = ReconcilerOptions(**values)
    assert build_reconciler(oo, options=options).options == options


def test_the_reconcile_command_has_a_flag_per_option(values):
    argv = ["reconcile"]
    for option in FIELDS:
        value = values[option.name]
        argv += [flag_name(option)] if value is True else [flag_name(option), str(value)]
    parsed = build_parser().parse_args(argv)
    assert {option.name: getattr(parsed, option.name) for option in FIELDS} == values
    # Unset, each flag has the option's default, but the journal names the command "cli".
    defaults = build_parser().parse_args(["reconcile"])
    assert {option.name: getattr(defaults, option.name) for option in FIELDS} == (
        dataclasses.asdict(ReconcilerOptions(owner="cli"))
    )


def test_the_site_reads_a_setting_per_option(settings, values):
    for option in FIELDS:
        setattr(settings, setting_name(option), values[option.name])
    assert reconciler_options() == ReconcilerOptions(**values)


def test_every_setting_is_read_from_the_environment(monkeypatch, values):
    for option in FIELDS:
        value = values[option.name]
        monkeypatch.setenv(setting_name(option), "true" if value is True else str(value))
    read = reconciler_settings({})
    assert read == {setting_name(option): values[option.name] for option in FIELDS}


def test_the_names_in_use_keep_working():
    settings = {setting_name(option) for option in FIELDS}
    assert {
        "OPENONCE_REQUIRE_PROVIDER_CAPABILITY",
        "OPENONCE_CONFORMANCE_FILE",
        "OPENONCE_REQUIRE_CONFORMANCE",
        "OPENONCE_GRACE_SECONDS",
        "OPENONCE_PROBE_TIMEOUT",
        "OPENONCE_PROBE_RETRIES",
        "OPENONCE_PROBE_RETRY_BACKOFF",
        "OPENONCE_PROBE_TRANSIENT_RETRIES",
        "OPENONCE_PROBE_TRANSIENT_WINDOW",
        "OPENONCE_STALE_CALL_GRACE",
        "OPENONCE_DEAD_OWNER_GRACE",
    } <= settings
    flags = {flag_name(option) for option in FIELDS}
    assert {
        "--require-provider-capability",
        "--conformance-file",
        "--require-conformance",
        "--grace-seconds",
        "--owner",
    } <= flags


def test_a_misspelt_or_mistyped_option_is_refused_with_the_known_names(oo):
    with pytest.raises(TypeError, match=r"unknown Reconciler option\(s\) probe_timout; known: "):
        Reconciler(oo, probe_timout=5)
    with pytest.raises(TypeError, match=r"ReconcilerOptions.probe_retries: expected int, got '3'"):
        ReconcilerOptions(probe_retries="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"unknown Reconciler option\(s\) grace; known: "):
        build_reconciler(oo, grace=5)


def test_a_flag_refuses_a_number_the_setting_would_refuse(capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["reconcile", "--probe-timeout", "0"])
    assert stopped.value.code == 2
    assert "--probe-timeout: '0': give a float above 0" in capsys.readouterr().err
