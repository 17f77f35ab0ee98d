"""The Celery app, configured from Django settings (the ``CELERY_`` names in base.py)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openonce_site.settings.dev")

app = Celery("openonce")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["reconciler", "notifications"])
