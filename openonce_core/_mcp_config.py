"""The MCP gateway's configuration (``openonce mcp-proxy --config openonce-mcp.json``): which
upstream MCP servers to connect to, which of their tools are effects and with which options,
and the policy. Read once, checked field by field; an error names the field
(``tools.refund.idempotency_fields[0]``) and says what to write instead.

Two checks: ``parse_config`` checks the file's shape before anything starts;
``GatewayConfig.check_tools`` checks it against the tools the upstreams list (a tool or a
field the upstream does not have), before the gateway answers a single call.

::

    {
      "upstream": {"payments": {"command": "python", "args": ["server.py"], "env": {}}},
      "scope": "orders-agent",
      "tools": {"refund": {"tool": "stripe.refund", "idempotency_fields": ["charge"]}},
      "policy": {"require_approval_for": ["stripe.*"]}
    }
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigurationError

# How a call's scope is chosen when the request's ``_meta`` names none.
SCOPE_SESSION = "session"  # ``{"scope": {"per": "session"}}``: one scope per client session

DEFAULT_TIMEOUT = 60.0


class _FieldError(ConfigurationError):
    """The gateway's configuration is wrong; ``field`` names where (``tools.refund.tool``)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


@dataclass(frozen=True, slots=True)
class Upstream:
    """One upstream MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT


@dataclass(frozen=True, slots=True)
class ToolEffect:
    """An upstream tool whose calls are effects: ``@oo.effect``'s options, as JSON."""

    name: str  # the upstream tool's name, the one the MCP client calls
    tool: str  # the effect's name in the ledger
    idempotency_fields: tuple[str, ...] | None = None
    idempotency_key: str | None = None  # a template of the arguments: "refund-{charge}"
    max_attempts: int | None = None
    secret_fields: tuple[str, ...] = ()
    # Which upstream tool errors (results with isError) mean "the provider said no"
    # (FAILED, replayed): True every one, False none (UNKNOWN), or those whose text
    # contains one of these strings.
    business_errors: bool | tuple[str, ...] = True
    capability: str | None = None  # a provider capability pin (OpenOnce provider_capabilities)
    provider_key_argument: str | None = None  # also pass the provider key as this argument
    timeout_seconds: float | None = None  # the upstream's own, unless set
    lease_seconds: float | None = None
    wait_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    require_approval_for: tuple[str, ...] = ()
    approvers: int = 1
    approval_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    upstreams: tuple[Upstream, ...]
    tools: Mapping[str, ToolEffect] = field(default_factory=dict)
    scope: str | None = None  # a fixed scope id, SCOPE_SESSION, or None (each call names one)
    scope_per_session: bool = False
    meta_scope: bool = True  # a call's ``_meta["openonce/scope"]`` overrides
    policy: Policy = Policy()
    console_url: str = ""
    provider_capabilities: Mapping[str, str] = field(default_factory=dict)
    enforce_provider_receipts: bool = False
    require_provider_capability_for_receipts: bool = False
    max_attempts: int = 3
    lease_seconds: float = 300.0
    wait_seconds: float = 30.0

    def check_tools(self, listed: Mapping[str, Mapping[str, Any]]) -> None:
        """Refuse a configuration that names what the upstreams do not have: ``listed``
        maps every upstream tool's name to its input schema."""
        for name, effect in self.tools.items():
            where = f"tools.{name}"
            if name not in listed:
                known = ", ".join(sorted(listed)) or "none"
                raise _FieldError(
                    where, f"no upstream lists a tool named {name!r} (they list: {known})"
                )
            properties = listed[name].get("properties")
            names = set(properties) if isinstance(properties, Mapping) else set()
            for option in ("idempotency_fields", "secret_fields"):
                for i, arg in enumerate(getattr(effect, option) or ()):
                    if arg not in names:
                        raise _FieldError(
                            f"{where}.{option}[{i}]",
                            f"{arg!r} is not an argument of {name!r} (its input schema has:"
                            f" {', '.join(sorted(names)) or 'none'})",
                        )
            if effect.idempotency_key is not None:
                for arg in template_fields(effect.idempotency_key):
                    if arg not in names:
                        raise _FieldError(
                            f"{where}.idempotency_key",
                            f"{{{arg}}} is not an argument of {name!r}",
                        )


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    """Read and check the configuration file at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _FieldError("", f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    try:
        data = json.loads(text, object_pairs_hook=_JsonObject.read)
    except json.JSONDecodeError as exc:
        raise _FieldError(
            "", f"{os.fspath(path)} is not JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    return parse_config(data)


_TOP = {
    "upstream",
    "tools",
    "scope",
    "policy",
    "console_url",
    "provider_capabilities",
    "enforce_provider_receipts",
    "require_provider_capability_for_receipts",
    "max_attempts",
    "lease_seconds",
    "wait_seconds",
}
_UPSTREAM = {"command", "args", "env", "cwd", "url", "headers", "timeout_seconds"}
_TOOL = {
    "tool",
    "idempotency_fields",
    "idempotency_key",
    "max_attempts",
    "secret_fields",
    "business_errors",
    "capability",
    "provider_key_argument",
    "timeout_seconds",
    "lease_seconds",
    "wait_seconds",
}
_POLICY = {"require_approval_for", "approvers", "approval_ttl"}
_SCOPE = {"per", "meta"}


def parse_config(data: Any) -> GatewayConfig:
    """Check the configuration's shape: every key known, every value of its type."""
    top = _object(data, "", _TOP)
    if "upstream" not in top:
        raise _FieldError("upstream", "required: the MCP server(s) to put OpenOnce in front of")
    upstreams = _upstreams(top["upstream"])
    tools_data = _object(top.get("tools", {}), "tools", None)
    tools: dict[str, ToolEffect] = {}
    owners: dict[str, str] = {}  # ledger name -> the tool that has it
    for name, spec in tools_data.items():
        tools[name] = effect = _tool(name, spec)
        other = owners.setdefault(effect.tool, name)
        if other != name:
            # One ledger name, one key space: a call to one tool would be answered with
            # the other's recorded result and never reach its upstream.
            raise _FieldError(
                f"tools.{name}.tool",
                f"{effect.tool!r} is tools.{other}'s ledger name too; the two tools' calls"
                " would share keys (a call to one answered with the other's result):"
                " give each its own",
            )
    scope, per_session, meta_scope = _scope(top.get("scope"))
    policy_data = _object(top.get("policy", {}), "policy", _POLICY)
    policy = Policy(
        require_approval_for=_names(policy_data.get("require_approval_for", []),
                                    "policy.require_approval_for"),
        approvers=_int(policy_data.get("approvers", 1), "policy.approvers", low=1),
        approval_ttl=_seconds(policy_data.get("approval_ttl"), "policy.approval_ttl"),
    )  # fmt: skip
    capabilities = _object(top.get("provider_capabilities", {}), "provider_capabilities", None)
    pins = {k: _text(v, f"provider_capabilities.{k}") for k, v in capabilities.items()}
    for effect in tools.values():
        if effect.capability is not None:
            pins[effect.tool] = effect.capability
    console_url = top.get("console_url", os.environ.get("OPENONCE_CONSOLE_URL", ""))
    return GatewayConfig(
        upstreams=upstreams,
        tools=tools,
        scope=scope,
        scope_per_session=per_session,
        meta_scope=meta_scope,
        policy=policy,
        console_url=_text(console_url, "console_url", empty=True).rstrip("/"),
        provider_capabilities=pins,
        enforce_provider_receipts=_bool(
            top.get("enforce_provider_receipts", False), "enforce_provider_receipts"
        ),
        require_provider_capability_for_receipts=_bool(
            top.get("require_provider_capability_for_receipts", False),
            "require_provider_capability_for_receipts",
        ),
        max_attempts=_int(top.get("max_attempts", 3), "max_attempts", low=1),
        lease_seconds=_positive(top.get("lease_seconds", 300.0), "lease_seconds"),
        wait_seconds=_seconds(top.get("wait_seconds", 30.0), "wait_seconds") or 0.0,
    )


def _upstreams(value: Any) -> tuple[Upstream, ...]:
    servers = _object(value, "upstream", None)
    if "command" in servers or "url" in servers:
        servers = {"upstream": servers}  # one server, unnamed
    if not servers:
        raise _FieldError("upstream", "name at least one MCP server")
    found = []
    for name, spec in servers.items():
        where = f"upstream.{name}"
        spec = _object(spec, where, _UPSTREAM)
        if ("command" in spec) == ("url" in spec):
            raise _FieldError(
                where, 'give "command" (a stdio server) or "url" (streamable HTTP), not both'
            )
        if "url" in spec:
            url = _text(spec["url"], f"{where}.url")
            if not url.startswith(("http://", "https://")):
                raise _FieldError(f"{where}.url", f"{url!r} is not an http(s) URL")
            for stdio_only in ("args", "env", "cwd"):
                if stdio_only in spec:
                    raise _FieldError(
                        f"{where}.{stdio_only}", "only a stdio server (command) takes it"
                    )
        elif "headers" in spec:
            raise _FieldError(f"{where}.headers", "only an HTTP server (url) takes headers")
        found.append(
            Upstream(
                name=name,
                command=_text(spec["command"], f"{where}.command") if "command" in spec else None,
                args=_names(spec.get("args", []), f"{where}.args", empty_ok=True),
                env=_strings(spec["env"], f"{where}.env") if "env" in spec else None,
                cwd=_text(spec["cwd"], f"{where}.cwd") if "cwd" in spec else None,
                url=spec.get("url"),
                headers=_strings(spec["headers"], f"{where}.headers")
                if "headers" in spec
                else None,
                timeout_seconds=_positive(
                    spec.get("timeout_seconds", DEFAULT_TIMEOUT), f"{where}.timeout_seconds"
                ),
            )
        )
    return tuple(found)


def _tool(name: str, value: Any) -> ToolEffect:
    where = f"tools.{name}"
    spec = _object(value, where, _TOOL)
    fields = spec.get("idempotency_fields")
    key = spec.get("idempotency_key")
    if fields is not None and key is not None:
        raise _FieldError(where, "give idempotency_fields or idempotency_key, not both")
    if key is not None:
        key = _text(key, f"{where}.idempotency_key")
        try:
            template_fields(key)
        except ValueError as exc:
            raise _FieldError(f"{where}.idempotency_key", f"not a template: {exc}") from None
    business = spec.get("business_errors", True)
    if not isinstance(business, bool):
        business = _names(business, f"{where}.business_errors")
    return ToolEffect(
        name=name,
        tool=_text(spec.get("tool", name), f"{where}.tool"),
        idempotency_fields=_names(fields, f"{where}.idempotency_fields")
        if fields is not None
        else None,
        idempotency_key=key,
        max_attempts=_int(spec["max_attempts"], f"{where}.max_attempts", low=1)
        if "max_attempts" in spec
        else None,
        secret_fields=_names(spec.get("secret_fields", []), f"{where}.secret_fields",
                             empty_ok=True),
        business_errors=business,
        capability=_text(spec["capability"], f"{where}.capability")
        if "capability" in spec
        else None,
        provider_key_argument=_text(spec["provider_key_argument"],
                                    f"{where}.provider_key_argument")
        if "provider_key_argument" in spec
        else None,
        timeout_seconds=_positive(spec["timeout_seconds"], f"{where}.timeout_seconds")
        if "timeout_seconds" in spec
        else None,
        lease_seconds=_positive(spec["lease_seconds"], f"{where}.lease_seconds")
        if "lease_seconds" in spec
        else None,
        wait_seconds=_seconds(spec.get("wait_seconds"), f"{where}.wait_seconds"),
    )  # fmt: skip


def _scope(value: Any) -> tuple[str | None, bool, bool]:
    if value is None:
        return None, False, True
    if isinstance(value, str):
        if not value:
            raise _FieldError("scope", 'a scope id is a non-empty string; or {"per": "session"}')
        return value, False, True
    spec = _object(value, "scope", _SCOPE)
    per = spec.get("per")
    if per not in (None, SCOPE_SESSION):
        raise _FieldError("scope.per", f'{per!r}: the only choice is "session"')
    meta = _bool(spec.get("meta", True), "scope.meta")
    return None, per == SCOPE_SESSION, meta


def template_fields(template: str) -> list[str]:
    """The argument names an ``idempotency_key`` template uses (``"refund-{charge}"``);
    ValueError for a template that uses anything else. The empty template uses none."""
    if not template:
        return []
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"{{{name}}}: name an argument, as in {{charge}}")
        names.append(name)
    if not names:
        raise ValueError("name at least one argument, as in refund-{charge}")
    return names


# -- checks of one value -----------------------------------------------------------------


class _JsonObject(dict[str, Any]):
    """A JSON object as the file has it, remembering the keys it gives twice: ``json``
    keeps the last silently, and a tool listed twice would lose the first entry's
    options (its secret_fields, its idempotency fields) without a word."""

    twice: tuple[str, ...] = ()

    @classmethod
    def read(cls, pairs: list[tuple[str, Any]]) -> _JsonObject:
        found = cls(pairs)
        if len(found) < len(pairs):
            seen: set[str] = set()
            twice = []
            for key, _ in pairs:
                if key in seen:
                    twice.append(key)
                seen.add(key)
            found.twice = tuple(twice)
        return found


def _object(value: Any, where: str, keys: set[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _FieldError(where or "$", f"must be a JSON object, not {_kind(value)}")
    for key in getattr(value, "twice", ()):
        raise _FieldError(
            f"{where}.{key}" if where else key,
            "given twice in the same object; JSON keeps only the last, silently: write it once",
        )
    if keys is not None:
        for key in value:
            if key not in keys:
                raise _FieldError(
                    f"{where}.{key}" if where else key,
                    f"unknown key; the keys here are: {', '.join(sorted(keys))}",
                )
    return value


def _text(value: Any, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise _FieldError(where, f"must be a non-empty string, not {_kind(value)}")
    return value


def _names(value: Any, where: str, *, empty_ok: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _FieldError(where, f"must be a list of strings, not {_kind(value)}")
    if not value and not empty_ok and where.endswith("idempotency_fields"):
        raise _FieldError(where, "name at least one argument")
    return tuple(_text(item, f"{where}[{i}]") for i, item in enumerate(value))


def _strings(value: Any, where: str) -> dict[str, str]:
    spec = _object(value, where, None)
    return {k: _text(v, f"{where}.{k}", empty=True) for k, v in spec.items()}


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _FieldError(where, f"must be true or false, not {_kind(value)}")
    return value


def _int(value: Any, where: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _FieldError(where, f"must be a whole number of at least {low}, not {value!r}")
    return value


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _FieldError(where, f"must be a positive number of seconds, not {value!r}")
    return float(value)


def _seconds(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise _FieldError(where, f"must be zero or more seconds, not {value!r}")
    return float(value)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
