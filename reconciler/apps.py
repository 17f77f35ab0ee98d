from django.apps import AppConfig


class ReconcilerConfig(AppConfig):
    name = "reconciler"
    verbose_name = "OpenOnce reconciler"
