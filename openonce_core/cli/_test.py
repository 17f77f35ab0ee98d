"""``openonce test FILE``: run a fault-harness suite and print its safety report.

FILE is a Python file with a zero-argument ``run_safety_suite()`` returning an
``openonce_core.testing.SafetyReport``. Exit status: 0 every check passed, 1 a check
failed (or the suite crashed), 2 the file cannot be used as a suite (one line on stderr).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ..testing import SafetyReport

PROG = "openonce test"


class SuiteFileError(Exception):
    """The file is missing, does not import, or has no usable ``run_safety_suite``."""


def load_suite(path: str) -> Callable[[], Any]:
    """Import ``path`` as a module of its own and return its ``run_safety_suite``."""
    if not os.path.isfile(path):
        raise SuiteFileError(f"{path}: no such file")
    name = "openonce_suite_" + "".join(
        ch if ch.isalnum() else "_" for ch in os.path.splitext(os.path.basename(path))[0]
    )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SuiteFileError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it: dataclasses and pickling look the module up by name.
    sys.modules[name] = module
    # Like `python FILE`: the suite can import modules that sit next to it.
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise SuiteFileError(f"{path}: importing it raised {_one_line(exc)}") from exc
    return _suite_function(module, path)


def _suite_function(module: ModuleType, path: str) -> Callable[[], Any]:
    suite = getattr(module, "run_safety_suite", None)
    if suite is None:
        raise SuiteFileError(f"{path}: defines no run_safety_suite() function")
    if not callable(suite):
        raise SuiteFileError(f"{path}: run_safety_suite is not a function")
    try:
        inspect.signature(suite).bind()
    except TypeError:
        raise SuiteFileError(f"{path}: run_safety_suite() must take no arguments") from None
    except ValueError:
        pass  # no signature to inspect (a builtin): calling it will tell
    result: Callable[[], Any] = suite
    return result


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cmd_test(args: argparse.Namespace) -> int:
    try:
        suite = load_suite(args.file)
    except SuiteFileError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        report = suite()
    except Exception as exc:
        # The suite itself crashed: that is a failed run, not a bad file.
        traceback.print_exc()
        print(f"{PROG}: {args.file}: run_safety_suite() raised {_one_line(exc)}", file=sys.stderr)
        return 1
    if not isinstance(report, SafetyReport):
        print(
            f"{PROG}: {args.file}: run_safety_suite() returned {type(report).__name__},"
            " not an openonce_core.testing.SafetyReport",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_text())
    return 0 if report.passed else 1


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a Python file defining run_safety_suite()")
    parser.add_argument("--json", action="store_true", help="print the machine-readable report")
    parser.set_defaults(func=cmd_test)


def add_test_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``test`` to the ``openonce`` command's subparsers (``cli.build_parser``)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "test", help="run a fault-harness suite file and print its safety report"
    )
    _add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run a fault-harness suite and print its safety report."
    )
    _add_arguments(parser)
    return cmd_test(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
