"""Provider contracts on the hot path: with ``enforce_provider_receipts`` a call must meet
its capability's contract before it runs, and its receipt after (see _providers/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._keys import Spec
from ._providers import Capability, CapabilityMatrix, check_call_contract, check_receipt
from .errors import ProviderContractError


class Contracts:
    """The provider-knowledge part of :class:`~openonce_core.OpenOnce`."""

    matrix: CapabilityMatrix
    provider_capabilities: dict[str, str]
    enforce_provider_receipts: bool
    require_provider_capability_for_receipts: bool

    def capabilities_for(self, tool: str) -> list[Capability]:
        return self.matrix.resolve(tool, self.provider_capabilities.get(tool))

    def _check_call_contract(self, spec: Spec, args: dict[str, Any]) -> None:
        capabilities = self.capabilities_for(spec.tool)
        if not capabilities:
            if self.require_provider_capability_for_receipts:
                raise ProviderContractError(
                    f"{spec.tool}: no provider capability is known, and"
                    " require_provider_capability_for_receipts fails closed"
                )
            return
        problems = [
            problem
            for capability in capabilities
            for problem in check_call_contract(
                capability, args, spec.idempotency_fields, spec.idempotency_key is not None
            )
        ]
        if problems:
            raise ProviderContractError(f"{spec.tool}: " + "; ".join(problems))

    def _checks_receipts(self, required: bool | None = None) -> bool:
        return self.enforce_provider_receipts if required is None else required

    def _receipt_contract_problems(
        self,
        tool: str,
        receipt: Any,
        args: Mapping[str, Any],
        *,
        required: bool | None = None,
        require_capability: bool | None = None,
    ) -> list[str]:
        if not self._checks_receipts(required):
            return []
        capabilities = self.capabilities_for(tool)
        if require_capability is None:
            require_capability = self.require_provider_capability_for_receipts
        if not capabilities:
            return [f"no provider capability is known for {tool}"] if require_capability else []
        return check_receipt(capabilities, receipt, args)
