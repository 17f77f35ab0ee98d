"""One set of effect options: ``oo.effect``, LangGraph's ``effect_tool`` and the OpenAI
Agents ``effect_function_tool`` take the keywords ``EffectOptions`` defines, with its
types and defaults, and refuse a bad one with the same error."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from collections.abc import Callable
from typing import Any

import pytest

from openonce_core import ConfigurationError, EffectOptions, InvalidArgumentsError, OpenOnce
from openonce_core._options import EffectKeywords

OPTIONS = {f.name: f for f in dataclasses.fields(EffectOptions)}


def _decorator(name: str) -> Callable[..., Any]:
    """The decorator called like ``oo.effect``: ``(oo, fn, **options)``."""
    if name == "oo.effect":
        return lambda oo, fn=None, **options: oo.effect(fn, **options)
    module, attribute = {
        "effect_tool": ("langgraph", "effect_tool"),
        "effect_function_tool": ("openai_agents", "effect_function_tool"),
    }[name]
    pytest.importorskip({"langgraph": "langgraph", "openai_agents": "agents"}[module])
    found: Callable[..., Any] = getattr(
        importlib.import_module(f"openonce_core.integrations.{module}"), attribute
    )
    return found


def _signatures(name: str) -> list[Callable[..., Any]]:
    """Every overload of a decorator: the signatures type checkers see (the
    implementation takes ``**keywords`` and turns them into EffectOptions at once)."""
    if name == "oo.effect":
        function: Callable[..., Any] = OpenOnce.effect
    else:
        function = _decorator(name)
    overloads = typing.get_overloads(function)
    assert overloads, f"{name} has no typed overloads"
    return overloads


DECORATORS = ["oo.effect", "effect_tool", "effect_function_tool"]


@pytest.mark.parametrize("name", DECORATORS)
def test_every_decorator_takes_the_effect_options_as_declared(name):
    for function in _signatures(name):
        parameters = inspect.signature(function).parameters
        variadic = [p for p in parameters.values() if p.kind is p.VAR_KEYWORD]
        if variadic and variadic[0].annotation == "Unpack[EffectKeywords]":
            continue  # an overload typed with the keywords' TypedDict, checked below
        for option, field in OPTIONS.items():
            assert option in parameters, f"{name} lacks {option}"
            parameter = parameters[option]
            assert parameter.kind is parameter.KEYWORD_ONLY, (name, option)
            assert (parameter.annotation, parameter.default) == (field.type, field.default), (
                f"{name}: {option} differs from EffectOptions"
            )


def test_the_keywords_type_is_the_options_fields():
    annotations = {k: v.__forward_arg__ for k, v in EffectKeywords.__annotations__.items()}
    assert annotations == {name: f.type for name, f in OPTIONS.items()}
    assert not EffectKeywords.__required_keys__


REFUSALS = (ValueError, ConfigurationError, InvalidArgumentsError)


def _refusal(name: str, oo: OpenOnce, options: dict[str, Any]) -> tuple[type, str]:
    def handler(charge: str, amount_cents: int) -> str:
        """Refund a charge."""
        return charge

    with pytest.raises(REFUSALS) as bare:
        _decorator(name)(oo, handler, **options)
    with pytest.raises(REFUSALS) as decorating:
        _decorator(name)(oo, **options)(handler)
    assert (type(bare.value), str(bare.value)) == (
        type(decorating.value),
        str(decorating.value),
    )
    return type(bare.value), str(bare.value)


BAD_OPTIONS = [
    {"max_attempts": 0},
    {"lease_seconds": 0},
    {"wait_seconds": -1},
    {"idempotency_key": ""},
    {"idempotency_key": 7},
    {"idempotency_key": "k", "idempotency_fields": ["charge"]},
    {"idempotency_fields": "charge"},
    {"idempotency_fields": ["order"]},
    {"business_errors": [KeyError("x")]},
    {"secret_fields": ["charge"]},  # no pepper
    {"tool": "bad\x00tool"},
]


@pytest.mark.parametrize("options", BAD_OPTIONS, ids=lambda o: ",".join(o))
@pytest.mark.parametrize("name", DECORATORS[1:])
def test_the_integrations_refuse_a_bad_option_as_oo_effect_does(name, options):
    oo = OpenOnce(":memory:")
    try:
        expected = _refusal("oo.effect", oo, options)
        assert _refusal(name, oo, options) == expected
    finally:
        oo.close()


@pytest.mark.parametrize("name", DECORATORS)
def test_every_decorator_names_a_stray_option_and_the_options_there_are(name):
    def refund(charge: str) -> str:
        """Refund a charge."""
        return charge

    with OpenOnce(":memory:") as oo:
        if name == "effect_function_tool":
            # Its other keywords go to the SDK's function_tool, which refuses them.
            with pytest.raises(TypeError, match="idempotency_feilds"):
                _decorator(name)(oo, refund, idempotency_feilds=["charge"])
            return
        with pytest.raises(TypeError) as stray:
            _decorator(name)(oo, refund, idempotency_feilds=["charge"])
        assert "'idempotency_feilds'" in str(stray.value)
        assert "idempotency_fields" in str(stray.value)  # the options there are
        with pytest.raises(TypeError):
            _decorator(name)(oo, idempotency_feilds=["charge"])


@pytest.mark.parametrize("name", DECORATORS)
def test_every_decorator_accepts_a_literal_key(name):
    oo = OpenOnce(":memory:")
    try:

        def refund(charge: str) -> str:
            """Refund a charge."""
            return charge

        _decorator(name)(oo, refund, tool="payments.refund", idempotency_key="refund-ch_1")
    finally:
        oo.close()


def test_declare_takes_the_options_object():
    ran: list[str] = []
    with OpenOnce(":memory:") as oo:
        shared = EffectOptions(tool="payments.refund", idempotency_key="refund-ch_1")

        def refund(charge: str) -> str:
            ran.append(charge)
            return f"re_{len(ran)}"

        effect = oo.declare(refund, shared)
        assert effect.openonce_tool == "payments.refund"
        assert [effect("ch_1"), effect("ch_1")] == ["re_1", "re_1"]
        assert ran == ["ch_1"]
