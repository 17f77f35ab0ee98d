from django.apps import AppConfig


class ReconcilerConfig(AppConfig):
    name = "reconciler"
    verbose_name = "OpenOnce reconciler"

    def ready(self) -> None:
        # A provider's rate limit is the account's: with OPENONCE_RATE_LIMIT_REDIS every
        # process's prober clients draw from one limiter in Redis (reconciler.ratelimit),
        # so N workers together keep the rate one would.
        from .ratelimit import install_from_settings

        install_from_settings()
