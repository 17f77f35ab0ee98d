"""The implementation modules are private (a leading underscore); their old names still
import, as the same module objects, with a DeprecationWarning that names the user's line,
for one release."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import openonce_core
from openonce_core._aliases import MOVED, RENAMED

REPO = Path(__file__).resolve().parents[2]
PUBLIC_MODULES = {"errors", "testing"}
PUBLIC_PACKAGES = {"integrations", "probers", "stores", "cli"}


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_old_name_imports_the_private_module_and_warns_at_the_users_line():
    out = run_python(
        f"""
        import importlib, sys, warnings
        import openonce_core
        for name in {sorted(MOVED)!r}:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                old = importlib.import_module("openonce_core." + name)
            new = importlib.import_module("openonce_core._" + name)
            assert old is new, name
            assert [w.category for w in caught] == [DeprecationWarning], (name, caught)
            assert "openonce_core." + name in str(caught[0].message)
        del sys.modules["openonce_core.reconcile"]  # imported again, as if for the first time
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from openonce_core.reconcile import Reconciler  # the line the warning names
        print(Reconciler is openonce_core.Reconciler, caught[0].lineno, caught[0].filename)
        """
    )
    same, line, filename = out.split()
    assert (same, line, filename) == ("True", "15", "<string>")


def test_an_old_name_read_as_an_attribute_and_through_openonce_is_the_same_module():
    out = run_python(
        """
        import warnings
        warnings.simplefilter("error")
        import openonce_core, openonce
        try:
            openonce_core.states
        except DeprecationWarning as w:
            print("attribute:", w)
        warnings.simplefilter("ignore")
        import openonce.probe
        print(openonce.probe is openonce_core._probe is openonce_core.probe)
        """
    )
    first, second = out.strip().splitlines()
    assert first.startswith("attribute: openonce_core.states is an implementation module")
    assert second == "True"


def test_the_old_cli_module_names_import_the_cli_packages_modules_and_warn():
    out = run_python(
        """
        import importlib, warnings
        for old, new in [
            ("openonce_core.cli_providers", "openonce_core.cli._providers"),
            ("openonce_core.cli_test", "openonce_core.cli._test"),
        ]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            assert module is importlib.import_module(new), old
            assert [w.category for w in caught] == [DeprecationWarning], (old, caught)
            print(caught[0].message)
        import openonce_core
        print(openonce_core.cli_test is openonce_core.cli._test)
        """
    )
    providers, test, attribute = out.strip().splitlines()
    assert providers.startswith("openonce_core.cli_providers moved to openonce_core.cli._providers")
    assert test.startswith("openonce_core.cli_test moved to openonce_core.cli._test")
    assert attribute == "True"


def test_the_providers_package_re_exports_what_the_module_did():
    import openonce_core._providers as providers

    assert [getattr(providers, name) for name in providers.__all__]
    assert "CapabilityMatrix" in providers.__all__ and "suggest_capability" in providers.__all__
    assert providers.CapabilityMatrix.__module__ == "openonce_core._providers._matrix"


def test_only_the_public_modules_lack_an_underscore():
    found = {m.name for m in pkgutil.iter_modules(openonce_core.__path__)}
    public = {name for name in found if not name.startswith("_")}
    assert public <= PUBLIC_MODULES | PUBLIC_PACKAGES, public - PUBLIC_MODULES - PUBLIC_PACKAGES
    assert not ((MOVED | set(RENAMED)) & found), "a module is both moved and still there"


def test_nothing_in_the_project_imports_an_old_name():
    # Code only: the docs may name the old modules (they say what moved); the README's
    # examples run under pytest's filter, which makes the warning an error.
    names = "|".join(sorted(MOVED | set(RENAMED)))
    old = re.compile(rf"\bopenonce_core\.({names})\b")
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.toml", "*.yml", "Makefile"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.split()
    allowed = {"openonce_core/__init__.py", "openonce_core/_aliases.py"}
    allowed |= {"tests/core/test_private_modules.py", "tests/core/test_seed_api.py"}
    offenders = [
        f"{path}:{n}: {line.strip()}"
        for path in tracked
        if path not in allowed and (REPO / path).exists()
        for n, line in enumerate((REPO / path).read_text().splitlines(), 1)
        if old.search(line)
    ]
    assert offenders == []
