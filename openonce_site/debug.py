"""What a debug page may show. Django masks settings whose names look secret (KEY, PASS,
TOKEN, ...); a DSN or a broker URL carries its password in a value named DATABASE or
BROKER_URL, so those names are masked too, and so is any value, setting or traceback
variable, that is a URL with a password in it."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.views.debug import SafeExceptionReporterFilter

# Django's own list, plus the names that hold DSNs, broker and cache URLs and the pepper.
HIDDEN = re.compile(
    "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|PEPPER"
    "|DATABASE|DSN|BROKER|BACKEND_URL|CACHE_URL|LOCATION|CONNINFO",
    flags=re.IGNORECASE,
)
# scheme://user:password@host — the password part, wherever it appears in a string.
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^@\s]+)@", re.I)
# libpq key=value strings: password=... up to the next space.
_CONNINFO_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<password>'[^']*'|\S+)", re.I)


def mask_credentials(text: str, substitute: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{substitute}@", text)
    return _CONNINFO_PASSWORD.sub(lambda m: f"{m['head']}{substitute}", text)


def has_credentials(text: str) -> bool:
    if _CONNINFO_PASSWORD.search(text):
        return True
    for match in _URL_PASSWORD.finditer(text):
        try:
            if urlsplit(match.group(0) + "x").password:
                return True
        except ValueError:
            return True  # not even a parseable URL: mask it anyway
    return False


class CredentialMaskingFilter(SafeExceptionReporterFilter):
    hidden_settings = HIDDEN

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str) and has_credentials(cleansed):
            return mask_credentials(cleansed, self.cleansed_substitute)
        return cleansed

    def cleanse_special_types(self, request: Any, value: Any) -> Any:
        # Traceback frames' local variables: a DSN held in a local is masked like a setting.
        value = super().cleanse_special_types(request, value)
        if isinstance(value, str) and has_credentials(value):
            return mask_credentials(value, self.cleansed_substitute)
        if isinstance(value, dict):
            return {k: self.cleanse_setting(k, v) for k, v in value.items()}
        return value
