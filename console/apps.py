from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "OpenOnce console"

    def ready(self) -> None:
        # Connects the sign-in failure logger (a signal receiver).
        from . import access  # noqa: F401
